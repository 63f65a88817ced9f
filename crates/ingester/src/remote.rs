//! The client of the ingesters' head reads: recent data from ingesters in
//! other processes, over Arrow Flight (the querier's head source in a
//! cluster). Each live ingester answers a [`HeadTicket`] with a
//! [`HeadSnapshot`] (series and profiles in the first message's app
//! metadata, sample rows as Arrow batches, all from one snapshot of its
//! heads) or with the [`HeadSymbols`] of the stacks named.
//!
//! Every series is on `replication_factor` ingesters and every
//! acknowledged write on a quorum of them, so a read that misses at most
//! `replication_factor - quorum` ingesters still sees every acknowledged
//! profile (the querier counts each profile id once); missing more is an
//! error ([`ReadError::Quorum`]), never a silently partial answer. An
//! ingester that is down ([`Ingesters::down`]: killed or cut off, its
//! heads not flushed) is missed as surely as one whose read fails, so it
//! counts against the same allowance.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow_flight::Ticket;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use bytes::Bytes;
use fathom_api::cluster::{
    ChannelError, Channels, IngesterAddr, Ingesters, MembershipError, quorum,
};
use fathom_model::{Id, Symbols, TenantId};
use fathom_proto::ingester::HeadSymbols;
use futures::{StreamExt, TryStreamExt};
use prost::Message;

use crate::HeadSnapshot;
use fathom_api::ticket::HeadTicket;

/// Why a head read failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The live ingesters could not be listed.
    #[error("reading the ingester ring: {0}")]
    Membership(#[from] MembershipError),
    #[error("ingester {ingester}: {source}")]
    Channel {
        ingester: String,
        #[source]
        source: ChannelError,
    },
    #[error("encoding a head-read ticket: {0}")]
    Ticket(#[source] serde_json::Error),
    #[error("tenant {tenant} is not a valid header value")]
    Tenant {
        tenant: TenantId,
        #[source]
        source: tonic::metadata::errors::InvalidMetadataValue,
    },
    /// The ingester answered the call with an error status.
    #[error("ingester {ingester} ({addr}): {}", source.message())]
    Call {
        ingester: String,
        addr: String,
        #[source]
        source: tonic::Status,
    },
    /// The answer's stream broke or could not be decoded.
    #[error("ingester {ingester} ({addr}): {source}")]
    Stream {
        ingester: String,
        addr: String,
        #[source]
        source: FlightError,
    },
    #[error("ingester {ingester}: the head read answer has no schema message")]
    NoSchema { ingester: String },
    #[error("ingester {ingester}: head read metadata: {source}")]
    Metadata {
        ingester: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("ingester {ingester}: head symbols: {source}")]
    Symbols {
        ingester: String,
        #[source]
        source: fathom_proto::ConvertError,
    },
    /// More ingesters failed or are down than replication tolerates.
    #[error(
        "{failed} of {live} live ingesters could not be read{} (at most {tolerated} may be missed): {}",
        down_clause(down),
        errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    Quorum {
        failed: usize,
        live: usize,
        /// Registered ingesters neither live nor left after a flush.
        down: Vec<String>,
        tolerated: usize,
        errors: Vec<ReadError>,
    },
}

/// What [`ReadError::Quorum`] says of the ingesters that are down, if any.
fn down_clause(down: &[String]) -> String {
    match down.len() {
        0 => String::new(),
        1 => format!(" and 1 is down with heads not flushed ({})", down[0]),
        n => format!(
            " and {n} are down with heads not flushed ({})",
            down.join(", ")
        ),
    }
}

/// Every head read error is the ingesters' (or the ring's) state, never
/// the client's request: retryable (503 / `UNAVAILABLE`).
impl From<ReadError> for fathom_api::ApiError {
    fn from(e: ReadError) -> Self {
        fathom_api::ApiError::Unavailable(format!("reading recent data: {e}"))
    }
}

/// The head reads of the live ingesters' Flight services.
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

    /// Every live ingester's head data of `tenant` in `[start, end]`
    /// (nanoseconds), one snapshot per ingester that answered.
    pub async fn snapshot(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<HeadSnapshot>, ReadError> {
        let got = self.all(tenant, &HeadTicket::Head { start, end }).await?;
        got.into_iter()
            .map(|(to, meta, samples)| {
                let mut s: HeadSnapshot =
                    serde_json::from_slice(&meta).map_err(|source| ReadError::Metadata {
                        ingester: to.id.clone(),
                        source,
                    })?;
                s.samples = samples;
                Ok(s)
            })
            .collect()
    }

    /// The symbols `stacks` of `tenant` need, from every live ingester's
    /// heads.
    pub async fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Result<Symbols, ReadError> {
        let ticket = HeadTicket::HeadSymbols {
            stacks: stacks.iter().map(Id::to_hex).collect(),
        };
        let mut out = Symbols::default();
        for (to, meta, _) in self.all(tenant, &ticket).await? {
            let symbols = HeadSymbols::decode(meta)
                .map_err(fathom_proto::ConvertError::from)
                .and_then(Symbols::try_from)
                .map_err(|source| ReadError::Symbols {
                    ingester: to.id.clone(),
                    source,
                })?;
            out.merge(&symbols);
        }
        Ok(out)
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
    ) -> Result<(Bytes, Vec<RecordBatch>), ReadError> {
        let ch = self
            .channels
            .get(&to.addr)
            .map_err(|source| ReadError::Channel {
                ingester: to.id.clone(),
                source,
            })?;
        let mut client = FlightServiceClient::new(ch).max_decoding_message_size(512 << 20);
        let body = serde_json::to_vec(ticket).map_err(ReadError::Ticket)?;
        let mut req = tonic::Request::new(Ticket {
            ticket: body.into(),
        });
        req.metadata_mut().insert(
            fathom_api::TENANT_HEADER,
            tenant
                .as_str()
                .parse()
                .map_err(|source| ReadError::Tenant {
                    tenant: tenant.clone(),
                    source,
                })?,
        );
        fathom_api::trace_context::inject(&mut req);
        let stream = client
            .do_get(req)
            .await
            .map_err(|source| ReadError::Call {
                ingester: to.id.clone(),
                addr: to.addr.clone(),
                source,
            })?
            .into_inner();
        let mut dec = FlightDataDecoder::new(stream.map_err(FlightError::from));
        let mut meta = None;
        let mut batches = Vec::new();
        while let Some(d) = dec.next().await {
            let d = d.map_err(|source| ReadError::Stream {
                ingester: to.id.clone(),
                addr: to.addr.clone(),
                source,
            })?;
            match d.payload {
                DecodedPayload::Schema(_) => meta = Some(d.inner.app_metadata.clone()),
                DecodedPayload::RecordBatch(b) => batches.push(b),
                DecodedPayload::None => {}
            }
        }
        let meta = meta.ok_or_else(|| ReadError::NoSchema {
            ingester: to.id.clone(),
        })?;
        let span = tracing::Span::current();
        span.record("batches", batches.len() as i64);
        span.record(
            "rows",
            batches.iter().map(RecordBatch::num_rows).sum::<usize>() as i64,
        );
        Ok((meta, batches))
    }

    /// Sends `ticket` to every live ingester; tolerates as many missed
    /// replicas (failed reads and ingesters down) as replication allows.
    async fn all(
        &self,
        tenant: &TenantId,
        ticket: &HeadTicket,
    ) -> Result<Vec<(IngesterAddr, Bytes, Vec<RecordBatch>)>, ReadError> {
        let live = self.ingesters.ingesters().await?;
        let down = self.ingesters.down().await;
        let tolerated = self.replication_factor - quorum(self.replication_factor);
        if down.len() > tolerated {
            // Missed already, whatever the live ones answer: none is asked.
            return Err(ReadError::Quorum {
                failed: 0,
                live: live.len(),
                down,
                tolerated,
                errors: Vec::new(),
            });
        }
        let results =
            futures::future::join_all(live.iter().map(|m| self.fetch(m, tenant, ticket))).await;
        let mut ok = Vec::new();
        let mut errors = Vec::new();
        for (to, r) in live.iter().zip(results) {
            match r {
                Ok((meta, batches)) => ok.push((to.clone(), meta, batches)),
                Err(e) => errors.push(e),
            }
        }
        if errors.len() + down.len() > tolerated {
            return Err(ReadError::Quorum {
                failed: errors.len(),
                live: live.len(),
                down,
                tolerated,
                errors,
            });
        }
        for e in &errors {
            tracing::warn!(error = %e, "ingester head read failed; replicas cover it");
        }
        Ok(ok)
    }
}
