//! The distributor: the front door for writes. Stateless.
//!
//! ```text
//! POST /ingest (Pyroscope convention)        ──┐ adapters: protocol → tenant,
//! gRPC fathom.push.v1.PushService/Push       ──┤ labels, payloads (format + bytes)
//! push.v1.PusherService/Push (Connect, gRPC) ──┤
//! OTLP profiles (HTTP and gRPC)              ──┘
//!     ─► Distributor::ingest (the ingest service, [`ingest`]): bounded gunzip,
//!        decode + normalize on the blocking pool (pprof, folded, JFR,
//!        speedscope, OTLP), idempotence seeds, metrics
//!     ─► accept: limits ─► IngestBatch ─► IngesterWriter ─► ack
//! ```
//!
//! Every protocol is a thin adapter over [`Distributor::ingest`], so limits
//! and error messages are the same whatever the protocol; a new format is
//! a [`Format`] variant and one decoder arm (see [`ingest`]).
//!
//! Invariants: a request is accepted whole or refused whole (4xx with a
//! message that names the problem); nothing of a refused request reaches an
//! ingester. Every allocation driven by a request is bounded by [`Limits`]:
//! the body size before reading it, the decompressed size while inflating,
//! the sample count while decoding.
//!
//! The [`IngesterWriter`] decides where a batch goes: the in-process
//! ingester in `fathom all`, replicated ingesters in a cluster.

mod acked;
mod http;
mod inflight;
pub mod ingest;
mod otlp;
mod push;
mod push_v1;
mod rate;
pub mod ring;

use std::sync::Arc;

use fathom_api::ApiError;
use fathom_api::auth::Tenants;
use fathom_model::{Id, IdHasher, IngestBatch, Labels, TenantId};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub use http::router;
pub use inflight::{Inflight, InflightConfig};
pub use ingest::{
    Accepted, DecodeContext, Encoding, FoldedParams, Format, Idempotence, IngestRequest, JfrParams,
    Payload, decode_payloads,
};
pub use otlp::OtlpProfilesServer;
pub use push::PushServer;
pub use push_v1::{PUSH_V1_PATH, push_v1_payloads};

/// Per-request limits; every refusal names the limit it hit.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest request body, as sent (compressed or not).
    pub max_body_bytes: usize,
    /// Largest body after decompression.
    pub max_decompressed_bytes: usize,
    /// Most labels in one series (after sample labels are added).
    pub max_labels: usize,
    pub max_label_name_len: usize,
    pub max_label_value_len: usize,
    /// Most samples in one profile.
    pub max_samples: usize,
    /// Most profiles in one write (gRPC push profiles, push.v1 samples;
    /// also bounds push.v1 series).
    pub max_profiles_per_push: usize,
    /// Whether a pprof write leaves out the stacks its ingesters' heads
    /// hold ([`IngesterWriter::held_stacks`]); off, every write carries
    /// all of its stacks (as before record format 5). Not a limit, but
    /// read where the limits are.
    pub leave_out_held_stacks: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 << 20,
            max_decompressed_bytes: 64 << 20,
            max_labels: 32,
            max_label_name_len: 128,
            max_label_value_len: 1024,
            max_samples: 500_000,
            max_profiles_per_push: 10_000,
            leave_out_held_stacks: true,
        }
    }
}

/// An error from the other side of a write seam, kept as a value of its
/// own type (`downcast_ref` reads it): the in-process ingester's
/// `fathom_ingester::Error`, or a replica's [`ring::ReplicaError`].
pub type Source = Box<dyn std::error::Error + Send + Sync>;

/// Why a write to the ingesters failed. Every variant but
/// [`WriteError::Limit`] is retryable (503); each keeps what caused it as
/// its source.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The ingester ring could not be read.
    #[error("reading the ingester ring: {0}")]
    Ring(#[source] fathom_api::cluster::MembershipError),
    /// Fewer live ingesters than a write needs.
    #[error("{live} live ingesters, a write needs {need} of {rf} replicas; retry later")]
    NoQuorum { live: usize, need: usize, rf: usize },
    /// Fewer replicas than a quorum took one group of the batch: each
    /// failed replica's error.
    #[error(
        "{} of {targets} replicas failed (a write needs {need} of {rf}): {}",
        errors.len(),
        join(errors, "; ")
    )]
    Replicas {
        targets: usize,
        need: usize,
        rf: usize,
        errors: Vec<ring::ReplicaError>,
    },
    /// Groups of the batch that were not acknowledged, each group's error.
    #[error("not acknowledged, retry: {}", join(.0, " | "))]
    Groups(Vec<WriteError>),
    /// The in-process ingester failed (its `fathom_ingester::Error`).
    #[error("ingester: {0}")]
    Ingester(#[source] Source),
    /// An ingester refused the write by a per-tenant limit (`limit`, such
    /// as `max_series`): the client's limit, not retryable as is (429).
    /// The message is the ingester's, which names the tenant, the limit
    /// and its count (not which ingester said it, nor its address).
    #[error("{}", limit_message(source))]
    Limit {
        limit: &'static str,
        #[source]
        source: Source,
    },
    /// The batch left out stacks (built against what the ingesters held,
    /// [`IngesterWriter::held_stacks`]) that a replica's head no longer
    /// holds: the request is decoded again and written whole.
    #[error("{source}")]
    LeftOut {
        #[source]
        source: Source,
    },
}

/// What a client is told of a tenant's limit: the refusing ingester's
/// own words ([`ring::ReplicaError::answer`] for a replica's).
fn limit_message(source: &Source) -> String {
    source
        .downcast_ref::<ring::ReplicaError>()
        .map_or_else(|| source.to_string(), ring::ReplicaError::answer)
}

/// The messages of `errors`, joined by `sep`.
fn join<E: std::fmt::Display>(errors: &[E], sep: &str) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(sep)
}

/// The one mapping of a failed write to the client's status: a tenant's
/// limit is 429, anything else the ingesters' state (503, retry).
impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Limit { .. } => ApiError::RateLimited(e.to_string()),
            e => ApiError::Unavailable(e.to_string()),
        }
    }
}

/// Where accepted batches go.
#[async_trait::async_trait]
pub trait IngesterWriter: Send + Sync + 'static {
    /// Returns once the batch is durable (acknowledged).
    async fn write(&self, batch: IngestBatch) -> Result<(), WriteError>;

    /// The stacks that the ingesters `tenant`'s next write goes to hold,
    /// when they can take a batch that leaves them out: the in-process
    /// ingester's head ([`fathom_model::Symbols::relies_on`]), or in a
    /// cluster the stacks every replica acknowledged under its current
    /// head. A write that a replica refuses for it fails with
    /// [`WriteError::LeftOut`] and is built again whole. `None` (the
    /// default) builds batches with every stack.
    fn held_stacks(&self, _tenant: &TenantId) -> Option<Arc<dyn fathom_model::HeldStacks>> {
        None
    }
}

#[derive(Clone, Default)]
pub(crate) struct Metrics {
    pub(crate) requests: Family<Vec<(String, String)>, Counter>,
    pub(crate) bytes: Counter,
    pub(crate) decoded_bytes: Counter,
    pub(crate) profiles: Counter,
    pub(crate) samples: Counter,
    /// Requests refused by a per-tenant limit, by tenant and limit.
    pub(crate) refused: Family<Vec<(String, String)>, Counter>,
    /// Writes built again whole after a replica no longer held a stack
    /// they left out.
    pub(crate) resent_whole: Counter,
    /// A request's decode and normalize, on the blocking pool.
    pub(crate) decode_seconds: fathom_api::metrics::Seconds,
    /// A decoded batch's write, until the ingesters acknowledged it.
    pub(crate) write_seconds: fathom_api::metrics::Seconds,
}

/// The distributor; cheap to clone.
#[derive(Clone)]
pub struct Distributor {
    pub(crate) limits: Arc<Limits>,
    pub(crate) writer: Arc<dyn IngesterWriter>,
    pub(crate) metrics: Metrics,
    /// Per-tenant limits from the tenants file, if any.
    pub(crate) tenants: Option<Tenants>,
    pub(crate) rates: Arc<rate::Buckets>,
}

impl Distributor {
    pub fn new(limits: Limits, writer: Arc<dyn IngesterWriter>, registry: &mut Registry) -> Self {
        let metrics = Metrics::default();
        let r = registry.sub_registry_with_prefix("fathom_distributor");
        r.register(
            "requests",
            "Write requests by protocol and outcome",
            metrics.requests.clone(),
        );
        r.register(
            "received_bytes",
            "Request bytes received, as sent",
            metrics.bytes.clone(),
        );
        r.register(
            "decompressed_bytes",
            "Profile bytes decoded, after decompression",
            metrics.decoded_bytes.clone(),
        );
        r.register("profiles", "Profiles accepted", metrics.profiles.clone());
        r.register("samples", "Samples accepted", metrics.samples.clone());
        r.register(
            "tenant_refused",
            "Write requests refused by a per-tenant limit, by tenant (with a tenants file; \"*\" without) and limit",
            metrics.refused.clone(),
        );
        r.register(
            "writes_resent_whole",
            "Writes that left out stacks an ingester's head had acknowledged, decoded again and written whole because a head was cut or restarted meanwhile",
            metrics.resent_whole.clone(),
        );
        r.register(
            "decode_seconds",
            "Seconds to decode and normalize the profiles of a write request",
            metrics.decode_seconds.histogram(),
        );
        r.register(
            "write_seconds",
            "Seconds from a decoded write to its acknowledgement by the ingesters (in one process, the WAL's; in a cluster, a quorum's)",
            metrics.write_seconds.histogram(),
        );
        Distributor {
            limits: Arc::new(limits),
            writer,
            metrics,
            tenants: None,
            rates: Arc::new(rate::Buckets::default()),
        }
    }

    /// Applies the per-tenant limits of a tenants file (they override the
    /// flags for the tenants and fields they name; reloads apply at once).
    pub fn with_tenants(mut self, tenants: Option<Tenants>) -> Self {
        self.tenants = tenants;
        self
    }

    /// The limits for `tenant`: the flags, overridden by the tenants file.
    pub(crate) fn limits_for(&self, tenant: &TenantId) -> (Limits, fathom_api::auth::TenantLimits) {
        let mut l = (*self.limits).clone();
        let Some(t) = &self.tenants else {
            return (l, Default::default());
        };
        let o = t.limits(tenant);
        if let Some(v) = o.max_labels {
            l.max_labels = v;
        }
        if let Some(v) = o.max_samples_per_profile {
            l.max_samples = v;
        }
        (l, o)
    }

    /// Whether `bytes` more of `tenant` fit its ingestion rate now (without
    /// taking them).
    pub(crate) fn check_rate(&self, tenant: &TenantId, bytes: u64) -> Result<(), ApiError> {
        let (_, o) = self.limits_for(tenant);
        match o.ingestion_rate {
            Some(rate) => {
                let burst = o
                    .ingestion_burst
                    .unwrap_or_else(|| rate.max(self.limits.max_body_bytes as u64));
                self.rates.check(tenant, bytes, rate, burst)
            }
            None => Ok(()),
        }
    }

    /// Counts a refusal by a limit (`rate`, `size`, `labels`, `samples`).
    pub(crate) fn refused(&self, tenant: &TenantId, limit: &str) {
        let tenant = if self.tenants.is_some() {
            tenant.as_str()
        } else {
            "*"
        };
        self.metrics
            .refused
            .get_or_create(&vec![
                ("tenant".to_owned(), tenant.to_owned()),
                ("limit".to_owned(), limit.to_owned()),
            ])
            .inc();
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn count(&self, protocol: &str, outcome: &str) {
        self.metrics
            .requests
            .get_or_create(&vec![
                ("protocol".to_owned(), protocol.to_owned()),
                ("outcome".to_owned(), outcome.to_owned()),
            ])
            .inc();
    }

    /// Checks every profile's labels and sample count, fills a missing
    /// time with `now`, and writes the batch.
    pub async fn accept(
        &self,
        batch: IngestBatch,
        now_nanos: i64,
    ) -> Result<(usize, usize), ApiError> {
        self.accept_or_left_out(batch, now_nanos)
            .await
            .map_err(|e| match e {
                Refused::Api(e) => e,
                Refused::LeftOut(e) => e.into(),
            })
    }

    /// [`Distributor::accept`], telling a batch that left out stacks a
    /// replica no longer holds ([`WriteError::LeftOut`]) apart.
    #[tracing::instrument(
        name = "distributor_accept",
        skip_all,
        fields(tenant = %batch.tenant, profiles = batch.profiles.len() as i64, samples = tracing::field::Empty)
    )]
    pub(crate) async fn accept_or_left_out(
        &self,
        mut batch: IngestBatch,
        now_nanos: i64,
    ) -> Result<(usize, usize), Refused> {
        let (l, _) = self.limits_for(&batch.tenant);
        for p in &mut batch.profiles {
            if let Err(e) =
                p.labels
                    .check_limits(l.max_labels, l.max_label_name_len, l.max_label_value_len)
            {
                self.refused(&batch.tenant, "labels");
                return Err(ApiError::bad_request(format!("series {}: {e}", p.labels)).into());
            }
            if p.samples.len() > l.max_samples {
                self.refused(&batch.tenant, "samples");
                return Err(ApiError::TooLarge(format!(
                    "a profile has {} samples; the limit is {}",
                    p.samples.len(),
                    l.max_samples
                ))
                .into());
            }
            if p.time_nanos == 0 {
                p.time_nanos = now_nanos;
            }
        }
        let profiles = batch.profiles.len();
        let samples = batch.sample_count();
        tracing::Span::current().record("samples", samples as i64);
        if profiles == 0 {
            return Ok((0, 0));
        }
        let tenant = batch.tenant.clone();
        let start = std::time::Instant::now();
        let written = self.writer.write(batch).await;
        self.metrics.write_seconds.since(start);
        if let Err(e) = written {
            if let WriteError::Limit { limit, .. } = &e {
                self.refused(&tenant, limit);
            }
            if let WriteError::LeftOut { .. } = e {
                return Err(Refused::LeftOut(e));
            }
            return Err(Refused::Api(e.into()));
        }
        self.metrics.profiles.inc_by(profiles as u64);
        self.metrics.samples.inc_by(samples as u64);
        Ok((profiles, samples))
    }
}

/// Why [`Distributor::accept_or_left_out`] did not write a batch.
pub(crate) enum Refused {
    Api(ApiError),
    /// [`WriteError::LeftOut`]: worth building again whole.
    LeftOut(WriteError),
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Refused::Api(e)
    }
}

/// The profile-id seed of a request: a hash of everything that makes it
/// this request, so a retried request maps to the same profile ids and is
/// stored once.
pub(crate) fn request_seed(tenant: &TenantId, parts: &[&str], labels: &Labels, body: &[u8]) -> Id {
    let mut h = IdHasher::new("request");
    h.str(tenant.as_str());
    for p in parts {
        h.str(p);
    }
    for (k, v) in labels.iter() {
        h.str(k).str(v);
    }
    h.finish_with_bytes(body)
}
