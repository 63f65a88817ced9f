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

mod http;
pub mod ingest;
mod otlp;
mod push;
mod push_v1;
pub mod ring;

use std::sync::Arc;

use fathom_api::ApiError;
use fathom_model::{Id, IdHasher, IngestBatch, Labels, TenantId};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub use http::router;
pub use ingest::{
    Accepted, DecodeContext, Encoding, FoldedParams, Format, Idempotence, IngestRequest, JfrParams,
    Payload,
};
pub use otlp::OtlpProfilesServer;
pub use push::PushServer;
pub use push_v1::PUSH_V1_PATH;

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
        }
    }
}

/// Why a write to the ingesters failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Not enough replicas acknowledged; the client should retry.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Unavailable(m) => ApiError::Unavailable(m),
            WriteError::Internal(m) => ApiError::Internal(m),
        }
    }
}

/// Where accepted batches go.
#[async_trait::async_trait]
pub trait IngesterWriter: Send + Sync + 'static {
    /// Returns once the batch is durable (acknowledged).
    async fn write(&self, batch: IngestBatch) -> Result<(), WriteError>;
}

#[derive(Clone, Default)]
pub(crate) struct Metrics {
    pub(crate) requests: Family<Vec<(String, String)>, Counter>,
    pub(crate) bytes: Counter,
    pub(crate) decoded_bytes: Counter,
    pub(crate) profiles: Counter,
    pub(crate) samples: Counter,
}

/// The distributor; cheap to clone.
#[derive(Clone)]
pub struct Distributor {
    pub(crate) limits: Arc<Limits>,
    pub(crate) writer: Arc<dyn IngesterWriter>,
    pub(crate) metrics: Metrics,
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
        Distributor {
            limits: Arc::new(limits),
            writer,
            metrics,
        }
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
    #[tracing::instrument(
        name = "distributor_accept",
        skip_all,
        fields(tenant = %batch.tenant, profiles = batch.profiles.len() as i64, samples = tracing::field::Empty)
    )]
    pub async fn accept(
        &self,
        mut batch: IngestBatch,
        now_nanos: i64,
    ) -> Result<(usize, usize), ApiError> {
        let l = &self.limits;
        for p in &mut batch.profiles {
            p.labels
                .check_limits(l.max_labels, l.max_label_name_len, l.max_label_value_len)
                .map_err(|e| ApiError::bad_request(format!("series {}: {e}", p.labels)))?;
            if p.samples.len() > l.max_samples {
                return Err(ApiError::TooLarge(format!(
                    "a profile has {} samples; the limit is {}",
                    p.samples.len(),
                    l.max_samples
                )));
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
        self.writer.write(batch).await?;
        self.metrics.profiles.inc_by(profiles as u64);
        self.metrics.samples.inc_by(samples as u64);
        Ok((profiles, samples))
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
    h.bytes(body);
    h.finish()
}
