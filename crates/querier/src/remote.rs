//! Recent data from ingesters in other processes, over Arrow Flight: the
//! querier's [`HeadSource`] in a cluster. Each live ingester answers a
//! head-read ticket (`{"kind": "head", "start": …, "end": …}`) with its
//! series and profiles in the first message's app metadata and its sample
//! rows as Arrow batches, all from one snapshot of its heads.
//!
//! Every series is on `replication_factor` ingesters and every
//! acknowledged write on a quorum of them, so a read that misses at most
//! `replication_factor - quorum` ingesters still sees every acknowledged
//! profile (the planner counts each profile id once); missing more is an
//! error, never a silently partial answer.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow_flight::Ticket;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use bytes::Bytes;
use fathom_api::cluster::{Channels, IngesterAddr, Ingesters, quorum};
use fathom_model::{Id, IngestBatch, Symbols, TenantId};
use futures::{StreamExt, TryStreamExt};
use prost::Message;

use fathom_api::ticket::HeadTicket;

use crate::flight::HeadMeta;
use crate::{HeadData, HeadSource, QueryError};

/// [`HeadSource`] over the live ingesters' Flight services.
pub struct FlightHeads {
    ingesters: Arc<dyn Ingesters>,
    replication_factor: usize,
    channels: Channels,
}

impl FlightHeads {
    pub fn new(
        ingesters: Arc<dyn Ingesters>,
        replication_factor: usize,
        timeout: Duration,
        secret: fathom_api::secret::ClusterSecret,
    ) -> Self {
        FlightHeads {
            ingesters,
            replication_factor: replication_factor.max(1),
            channels: Channels::new(timeout, secret),
        }
    }

    /// One ticket to one ingester: the first message's app metadata and
    /// the batches.
    #[tracing::instrument(
        name = "head_read",
        skip_all,
        fields(ingester = %to.id, %tenant, kind = ticket.kind(), batches, rows, otel.kind = "client")
    )]
    async fn fetch(
        &self,
        to: &IngesterAddr,
        tenant: &TenantId,
        ticket: &HeadTicket,
    ) -> Result<(Bytes, Vec<RecordBatch>), String> {
        let ch = self.channels.get(&to.addr)?;
        let mut client = FlightServiceClient::new(ch).max_decoding_message_size(512 << 20);
        let body = serde_json::to_vec(ticket).map_err(|e| e.to_string())?;
        let mut req = tonic::Request::new(Ticket {
            ticket: body.into(),
        });
        req.metadata_mut().insert(
            "x-scope-orgid",
            tenant
                .as_str()
                .parse()
                .map_err(|_| "tenant is not a valid header value".to_owned())?,
        );
        fathom_api::trace_context::inject(&mut req);
        let stream = client
            .do_get(req)
            .await
            .map_err(|s| format!("{} ({}): {}", to.id, to.addr, s.message()))?
            .into_inner();
        let mut dec = FlightDataDecoder::new(stream.map_err(FlightError::from));
        let mut meta = None;
        let mut batches = Vec::new();
        while let Some(d) = dec.next().await {
            let d = d.map_err(|e| format!("{} ({}): {e}", to.id, to.addr))?;
            match d.payload {
                DecodedPayload::Schema(_) => meta = Some(d.inner.app_metadata.clone()),
                DecodedPayload::RecordBatch(b) => batches.push(b),
                DecodedPayload::None => {}
            }
        }
        let meta = meta.ok_or_else(|| format!("{}: no schema message", to.id))?;
        let span = tracing::Span::current();
        span.record("batches", batches.len() as i64);
        span.record(
            "rows",
            batches.iter().map(RecordBatch::num_rows).sum::<usize>() as i64,
        );
        Ok((meta, batches))
    }

    /// Sends `ticket` to every live ingester; tolerates as many failures as
    /// replication allows.
    async fn all(
        &self,
        tenant: &TenantId,
        ticket: &HeadTicket,
    ) -> Result<Vec<(Bytes, Vec<RecordBatch>)>, QueryError> {
        let live = self
            .ingesters
            .ingesters()
            .await
            .map_err(|e| QueryError::Head(format!("reading the ingester ring: {e}")))?;
        let results =
            futures::future::join_all(live.iter().map(|m| self.fetch(m, tenant, ticket))).await;
        let mut ok = Vec::new();
        let mut errors = Vec::new();
        for r in results {
            match r {
                Ok(x) => ok.push(x),
                Err(e) => errors.push(e),
            }
        }
        let tolerated = self.replication_factor - quorum(self.replication_factor);
        if errors.len() > tolerated {
            return Err(QueryError::Head(format!(
                "{} of {} ingesters could not be read (at most {tolerated} may be): {}",
                errors.len(),
                live.len(),
                errors.join("; ")
            )));
        }
        for e in &errors {
            tracing::warn!(error = %e, "ingester head read failed; replicas cover it");
        }
        Ok(ok)
    }
}

#[async_trait::async_trait]
impl HeadSource for FlightHeads {
    async fn snapshot(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<HeadData>, QueryError> {
        let got = self.all(tenant, &HeadTicket::Head { start, end }).await?;
        got.into_iter()
            .map(|(meta, samples)| {
                let m: HeadMeta = serde_json::from_slice(&meta)
                    .map_err(|e| QueryError::Head(format!("head read metadata: {e}")))?;
                Ok(HeadData {
                    series: m.series,
                    profiles: m.profiles,
                    samples,
                })
            })
            .collect()
    }

    async fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Result<Symbols, QueryError> {
        let ticket = HeadTicket::HeadSymbols {
            stacks: stacks.iter().map(Id::to_hex).collect(),
        };
        let mut out = Symbols::default();
        for (meta, _) in self.all(tenant, &ticket).await? {
            let req = fathom_proto::ingester::WriteRequest::decode(meta)
                .map_err(|e| QueryError::Head(format!("head symbols: {e}")))?;
            let b = IngestBatch::try_from(req)
                .map_err(|e| QueryError::Head(format!("head symbols: {e}")))?;
            out.merge(&b.symbols);
        }
        Ok(out)
    }
}
