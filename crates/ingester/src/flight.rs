//! The ingester's read API: an Arrow Flight service that answers the
//! queriers' head reads ([`HeadTicket`] in `DoGet`; every other Flight call
//! is `UNIMPLEMENTED`). Its client is [`crate::FlightHeads`]; both sides
//! speak in [`HeadSnapshot`] and [`HeadSymbols`].
//!
//! ```text
//! DoGet {"kind":"head","start":…,"end":…}
//!   ──► schema message: samples_schema(), app metadata = HeadSnapshot (JSON: series, profiles)
//!   ──► record batches: the snapshot's sample rows
//! DoGet {"kind":"head_symbols","stacks":["<32 hex>", …]}
//!   ──► schema message: empty schema, app metadata = HeadSymbols (protobuf)
//! ```
//!
//! The tenant comes from the `x-scope-orgid` call header; the server's
//! cluster-secret layer keeps everyone but the cluster's own processes out.

use std::pin::Pin;
use std::sync::Arc;

use arrow::datatypes::Schema;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use fathom_api::ApiError;
use fathom_model::TenantId;
use fathom_proto::ingester::HeadSymbols;
use futures::{Stream, TryStreamExt};
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use crate::{HeadSnapshot, Ingester};
use fathom_api::ticket::HeadTicket;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The head-read Flight service of `ingester`.
pub fn flight_service(ingester: Arc<Ingester>) -> FlightServiceServer<HeadFlight> {
    FlightServiceServer::new(HeadFlight(ingester)).max_decoding_message_size(16 << 20)
}

/// See [`flight_service`].
pub struct HeadFlight(Arc<Ingester>);

fn unimplemented<T>() -> Result<T, Status> {
    Err(Status::unimplemented(
        "an ingester's Flight service answers head reads only: send queries and SQL to a querier",
    ))
}

impl HeadFlight {
    /// Answers a head-read ticket.
    fn do_get_head(
        &self,
        tenant: &TenantId,
        ticket: HeadTicket,
    ) -> Result<BoxStream<FlightData>, Status> {
        match ticket {
            HeadTicket::Head { start, end } => {
                let HeadSnapshot {
                    series,
                    profiles,
                    samples,
                } = self.0.snapshot(tenant, start, end);
                let meta = serde_json::to_vec(&HeadSnapshot {
                    series,
                    profiles,
                    samples: Vec::new(),
                })
                .map_err(|e| Status::from(ApiError::internal(e)))?;
                Ok(Box::pin(
                    FlightDataEncoderBuilder::new()
                        .with_schema(fathom_block::samples_schema())
                        .with_metadata(meta.into())
                        .build(futures::stream::iter(samples.into_iter().map(Ok)))
                        .map_err(Status::from),
                ))
            }
            HeadTicket::HeadSymbols { stacks } => {
                let ids = HeadTicket::stack_ids(&stacks)?;
                let symbols = self.0.symbols(tenant, &ids);
                let meta = HeadSymbols::from(&symbols).encode_to_vec();
                Ok(Box::pin(
                    FlightDataEncoderBuilder::new()
                        .with_schema(Arc::new(Schema::empty()))
                        .with_metadata(meta.into())
                        .build(futures::stream::empty())
                        .map_err(Status::from),
                ))
            }
        }
    }
}

#[tonic::async_trait]
impl FlightService for HeadFlight {
    type HandshakeStream = BoxStream<HandshakeResponse>;
    type ListFlightsStream = BoxStream<FlightInfo>;
    type DoGetStream = BoxStream<FlightData>;
    type DoPutStream = BoxStream<PutResult>;
    type DoExchangeStream = BoxStream<FlightData>;
    type DoActionStream = BoxStream<arrow_flight::Result>;
    type ListActionsStream = BoxStream<ActionType>;

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let tenant = fathom_api::tenant_from_metadata(request.metadata()).map_err(Status::from)?;
        let Some(ticket) = HeadTicket::decode(&request.get_ref().ticket) else {
            return Err(Status::from(ApiError::bad_request(
                "an ingester's Flight service takes head-read tickets only \
                 ({\"kind\":\"head\",…} or {\"kind\":\"head_symbols\",…})",
            )));
        };
        Ok(Response::new(self.do_get_head(&tenant, ticket)?))
    }

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        unimplemented()
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        unimplemented()
    }

    async fn get_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        unimplemented()
    }

    async fn poll_flight_info(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        unimplemented()
    }

    async fn get_schema(
        &self,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        unimplemented()
    }

    async fn do_put(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        unimplemented()
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        unimplemented()
    }

    async fn do_action(
        &self,
        _request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        unimplemented()
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        unimplemented()
    }
}

#[cfg(test)]
mod tests {
    use fathom_model::{Function, Line, Location, Mapping, Stack, Symbols};
    use fathom_proto::ConvertError;

    use super::*;

    #[test]
    fn head_symbols_round_trip_with_their_ids() {
        let mut s = Symbols::default();
        let m = s.add_mapping(Mapping {
            memory_start: 0x1000,
            memory_limit: 0x2000,
            file_offset: 0,
            filename: "/bin/app".into(),
            build_id: "abc".into(),
        });
        let f = s.add_function(Function {
            name: "main".into(),
            system_name: "main".into(),
            filename: "main.go".into(),
            start_line: 3,
        });
        let l = s.add_location(Location {
            mapping: m,
            address: 0x1234,
            lines: vec![Line {
                function: f,
                line: 7,
            }],
        });
        let st = s.add_stack(Stack {
            locations: vec![l, l],
        });
        let bytes = HeadSymbols::from(&s).encode_to_vec();
        let back = Symbols::try_from(HeadSymbols::decode(&bytes[..]).unwrap()).unwrap();
        assert_eq!(back.stacks[&st].locations, vec![l, l]);
        assert_eq!(back.locations[&l].lines[0].function, f);
        assert_eq!(back.functions[&f].name, "main");
        assert_eq!(back.mappings[&m].build_id, "abc");

        // A stack whose location bytes are not whole ids is refused.
        let mut bad = HeadSymbols::from(&s);
        bad.stacks[0].locations.pop();
        let e = Symbols::try_from(bad).unwrap_err();
        assert!(matches!(e, ConvertError::IdLength { .. }), "{e}");
    }
}
