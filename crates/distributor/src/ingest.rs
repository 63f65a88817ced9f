//! The ingest service: the one path from payload bytes to an acknowledged
//! write, whatever the protocol.
//!
//! ```text
//!  adapter (POST /ingest, gRPC fathom.push.v1, push.v1 Connect/gRPC, OTLP HTTP/gRPC)
//!     │  tenant, received bytes, payloads [{format, body, labels, hints, idempotence}]
//!     ▼
//!  Distributor::ingest ── count limit ──► blocking pool: per payload
//!        gunzip (bounded by what is left of the request's decompressed budget)
//!        ─► seed (idempotence) ─► decode + normalize by format ─► Normalized
//!     ─► one IngestBatch ─► accept (label/sample limits, time) ─► IngesterWriter ─► Accepted
//! ```
//!
//! An adapter only parses its protocol (URL parameters, protobuf or JSON
//! envelopes, headers) into an [`IngestRequest`]; everything that depends on
//! the payload's bytes happens here, so limits and error messages are the
//! same on every protocol.
//!
//! # Adding a format
//!
//! Add a variant to [`Format`] (with whatever parameters the format takes)
//! and an arm to `decode` below that turns the decompressed body into a
//! [`Normalized`]. The decoder runs on the blocking pool, gets
//! [`DecodeContext`] (series labels, name hint, time overrides, the profile
//! id seed, size limits) and must honour it: put `ctx.labels` on every
//! profile, derive profile ids from `ctx.seed`, never allocate past
//! `ctx.limits`. Errors are [`ApiError`]s (400 for bad input, 413 for a
//! limit); the service prefixes them with the payload's
//! [`Payload::context`].
//!
//! A format whose payload carries its own series labels per profile (JFR
//! label sets, OTLP resource attributes) keeps them: every profile gets
//! its own labels merged with `ctx.labels` (which win).

use bytes::Bytes;
use fathom_api::{ApiError, now_nanos};
use fathom_model::{Id, IdHasher, IngestBatch, Labels, Symbols, TenantId};
use fathom_pprof::Normalized;

use crate::Distributor;

/// How a payload's bytes are encoded.
#[derive(Clone, Debug)]
pub enum Format {
    /// pprof protobuf, or any legacy format `go tool pprof` reads.
    Pprof,
    /// Folded stacks (`a;b;c 42` lines), with Pyroscope's `/ingest`
    /// parameters.
    Folded(FoldedParams),
    /// A Java Flight Recorder recording (`fathom-jfr`), as the Pyroscope
    /// Java agent sends it.
    Jfr(JfrParams),
    /// speedscope JSON (sampled and evented profiles).
    Speedscope {
        /// Samples per second for unit `none` (default 100).
        sample_rate: Option<u32>,
    },
    /// An OTLP `ExportProfilesServiceRequest` (`fathom-otlp`), protobuf or
    /// JSON. Its resource attributes are per-profile series labels.
    Otlp(fathom_otlp::Encoding),
}

impl Format {
    /// The name used in messages and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Format::Pprof => "pprof",
            Format::Folded(_) => "folded",
            Format::Jfr(_) => "jfr",
            Format::Speedscope { .. } => "speedscope",
            Format::Otlp(_) => "otlp",
        }
    }
}

/// The parameters of a JFR payload.
#[derive(Clone, Debug, Default)]
pub struct JfrParams {
    /// Samples per second of CPU and wall sampling (default 100).
    pub sample_rate: Option<u32>,
    /// The `labels` part: a `LabelsSnapshot` protobuf, raw or gzip'd,
    /// whose label sets become per-profile series labels.
    pub labels: Option<Bytes>,
}

/// The most bytes a decompressed JFR `labels` part may have (real ones
/// have a few KiB; decoded protobuf maps take up to ~15× their encoded
/// size).
pub const MAX_JFR_LABELS_BYTES: usize = 4 << 20;

/// The parameters of folded text (see `docs/ingest-formats.md`).
#[derive(Clone, Debug, Default)]
pub struct FoldedParams {
    /// `units` of Pyroscope's `/ingest` (`samples`, `objects`, `bytes`, …).
    pub units: Option<String>,
    /// Samples per second of CPU and wall profiles (default 100).
    pub sample_rate: Option<u32>,
    pub aggregation: fathom_pprof::Aggregation,
}

/// How a payload's body is compressed. gzip is also recognized by its
/// magic bytes whatever this says, so `Identity` means "not declared".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    #[default]
    Identity,
    Gzip,
}

/// How a payload's profile ids are derived. The same ids are stored once
/// (the ingester ignores a profile id it has, queries count an id once), so
/// this decides what a retry is.
#[derive(Clone, Debug)]
pub enum Idempotence {
    /// A key the client chose (Pyroscope's sample `ID`, the native push's
    /// `profile_id`): a retry with the same key and labels is stored once.
    Key(Id),
    /// Derived from the content: the tenant, these strings (the request's
    /// parameters), the payload's labels and its decompressed bytes.
    Content(Vec<String>),
}

/// One profile to ingest.
#[derive(Clone, Debug)]
pub struct Payload {
    pub format: Format,
    /// The body as received (after any transport-level decompression of the
    /// request that carried it).
    pub body: Bytes,
    pub encoding: Encoding,
    /// Series labels of every profile decoded from this payload,
    /// `service_name` included.
    pub labels: Labels,
    /// A Pyroscope-style profile name (`__name__`, or the `.cpu` suffix of
    /// `/ingest`'s name) for when the sample types do not decide it.
    pub name_hint: Option<String>,
    /// Overrides of the profile's start time and duration (nanoseconds).
    pub time_nanos: Option<i64>,
    pub duration_nanos: Option<i64>,
    pub idempotence: Idempotence,
    /// Names this payload in error messages (`series 2 sample 0`); empty
    /// for a request with one payload.
    pub context: String,
}

impl Payload {
    /// A payload with no labels, hints or overrides, and a content-derived
    /// id seed.
    pub fn new(format: Format, body: Bytes) -> Self {
        Payload {
            format,
            body,
            encoding: Encoding::Identity,
            labels: Labels::new(),
            name_hint: None,
            time_nanos: None,
            duration_nanos: None,
            idempotence: Idempotence::Content(Vec::new()),
            context: String::new(),
        }
    }
}

/// A write: every payload is stored, or none.
#[derive(Clone, Debug)]
pub struct IngestRequest {
    pub tenant: TenantId,
    /// Bytes received on the wire for this request (metrics).
    pub received_bytes: usize,
    pub payloads: Vec<Payload>,
}

/// What a write stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    pub profiles: usize,
    pub samples: usize,
}

/// What a decoder gets besides the body.
#[derive(Clone, Debug)]
pub struct DecodeContext {
    pub labels: Labels,
    pub name_hint: Option<String>,
    pub time_nanos: Option<i64>,
    pub duration_nanos: Option<i64>,
    /// Seeds the profile ids (`NormalizeOptions::profile_id_seed`).
    pub seed: Id,
    pub limits: fathom_pprof::Limits,
    /// Most profiles and series labels one payload may produce (formats
    /// that carry many profiles, such as OTLP).
    pub max_profiles: usize,
    pub max_labels: usize,
    /// The stacks the ingesters this write goes to hold
    /// ([`IngesterWriter::held_stacks`](crate::IngesterWriter::held_stacks)):
    /// the pprof and OTLP normalizers leave them out of the batch.
    pub held: Option<std::sync::Arc<dyn fathom_model::HeldStacks>>,
}

impl Distributor {
    /// Decodes every payload on the blocking pool and writes them as one
    /// batch; returns once the write is durable. All or nothing: the first
    /// bad payload refuses the request (its [`Payload::context`] in the
    /// message) and nothing is written.
    ///
    /// Bounds: at most `max_profiles_per_push` payloads; the decompressed
    /// bodies of all payloads together at most `max_decompressed_bytes`;
    /// then the per-profile label and sample limits of [`Distributor::accept`].
    pub async fn ingest(&self, req: IngestRequest) -> Result<Accepted, ApiError> {
        let IngestRequest {
            tenant,
            received_bytes,
            payloads,
        } = req;
        self.metrics.bytes.inc_by(received_bytes as u64);
        let (limits, overrides) = self.limits_for(&tenant);
        if let Some(max) = overrides.max_profile_size
            && received_bytes > max
        {
            self.refused(&tenant, "size");
            return Err(ApiError::TooLarge(format!(
                "the request has {received_bytes} bytes; tenant {tenant}'s limit (max_profile_size) is {max}"
            )));
        }
        if let Some(rate) = overrides.ingestion_rate {
            let burst = overrides
                .ingestion_burst
                .unwrap_or_else(|| rate.max(self.limits.max_body_bytes as u64));
            if let Err(e) = self.rates.take(&tenant, received_bytes as u64, rate, burst) {
                self.refused(&tenant, "rate");
                return Err(e);
            }
        }
        let l = &limits;
        if payloads.len() > l.max_profiles_per_push {
            return Err(ApiError::TooLarge(format!(
                "the request has {} profiles; the limit is {}",
                payloads.len(),
                l.max_profiles_per_push
            )));
        }
        if payloads.is_empty() {
            return Ok(Accepted::default());
        }
        let held = if limits.leave_out_held_stacks {
            self.writer.held_stacks(&tenant)
        } else {
            None
        };
        // A batch that leaves out what the ingesters held may meet a head
        // cut since: then it is decoded again, whole (the payloads are
        // reference-counted bytes; the same time and profile ids, so the
        // replicas that took the first one skip it).
        let again = held.as_ref().map(|_| (payloads.clone(), limits.clone()));
        let now = now_nanos();
        let batch = self.decode(&tenant, payloads, limits, held).await?;
        let (profiles, samples) = match self.accept_or_left_out(batch, now).await {
            Ok(n) => n,
            Err(crate::Refused::LeftOut(why)) if let Some((payloads, limits)) = again => {
                self.metrics.resent_whole.inc();
                tracing::debug!(%tenant, reason = %why, "a write left out stacks a head no longer holds; writing it whole");
                let batch = self.decode(&tenant, payloads, limits, None).await?;
                self.accept(batch, now).await?
            }
            Err(crate::Refused::LeftOut(e)) => return Err(e.into()),
            Err(crate::Refused::Api(e)) => return Err(e),
        };
        Ok(Accepted { profiles, samples })
    }

    /// Decodes `payloads` into one batch on the blocking pool, leaving out
    /// the stacks `held` says the ingesters hold.
    async fn decode(
        &self,
        tenant: &TenantId,
        payloads: Vec<Payload>,
        limits: crate::Limits,
        held: Option<std::sync::Arc<dyn fathom_model::HeldStacks>>,
    ) -> Result<IngestBatch, ApiError> {
        let metrics = self.metrics.clone();
        let t = tenant.clone();
        let (profiles, symbols) = tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            let decoded = decode_all(&t, payloads, &limits, &metrics, held);
            metrics.decode_seconds.since(start);
            decoded
        })
        .await
        .map_err(|e| ApiError::internal(format!("decode task failed: {e}")))??;
        Ok(IngestBatch {
            tenant: tenant.clone(),
            profiles,
            symbols,
        })
    }

    /// Counts a request of `protocol` as ok or error (adapters call it
    /// once per request, whether it failed in the adapter or here).
    pub fn count_request(&self, protocol: &str, ok: bool) {
        self.count(protocol, if ok { "ok" } else { "error" });
    }

    /// Inflates a gzip'd request body (a transport encoding such as
    /// Connect's `Content-Encoding: gzip`), never past
    /// `max_decompressed_bytes`.
    pub fn gunzip_request(&self, body: &[u8]) -> Result<Vec<u8>, ApiError> {
        gunzip_bounded(body, self.limits.max_decompressed_bytes)
    }
}

/// Decodes every payload of a request (what [`Distributor::ingest`] does
/// before the limits of [`Distributor::accept`]), synchronously: for
/// tests and fuzzing. Never panics, whatever the payloads hold.
pub fn decode_payloads(
    tenant: &TenantId,
    payloads: Vec<Payload>,
    limits: &crate::Limits,
) -> Result<(Vec<fathom_model::Profile>, Symbols), ApiError> {
    decode_all(tenant, payloads, limits, &crate::Metrics::default(), None)
}

fn decode_all(
    t: &TenantId,
    payloads: Vec<Payload>,
    limits: &crate::Limits,
    metrics: &crate::Metrics,
    held: Option<std::sync::Arc<dyn fathom_model::HeldStacks>>,
) -> Result<(Vec<fathom_model::Profile>, Symbols), ApiError> {
    let mut budget = limits.max_decompressed_bytes;
    let mut profiles = Vec::new();
    let mut symbols = Symbols::default();
    let single = payloads.len() == 1;
    for p in payloads {
        let n = decode_payload(t, p, limits, &mut budget, single, metrics, held.clone())?;
        profiles.extend(n.profiles);
        symbols.merge_owned(n.symbols);
    }
    Ok((profiles, symbols))
}

/// Prefixes a message with the payload's context, if any.
fn with_context(context: &str, e: ApiError) -> ApiError {
    if context.is_empty() {
        return e;
    }
    match e {
        ApiError::BadRequest(m) => ApiError::BadRequest(format!("{context}: {m}")),
        ApiError::TooLarge(m) => ApiError::TooLarge(format!("{context}: {m}")),
        other => other,
    }
}

fn decode_payload(
    tenant: &TenantId,
    p: Payload,
    limits: &crate::Limits,
    budget: &mut usize,
    single: bool,
    metrics: &crate::Metrics,
    held: Option<std::sync::Arc<dyn fathom_model::HeldStacks>>,
) -> Result<Normalized, ApiError> {
    let ctx_name = p.context.clone();
    let r = (|| {
        if p.body.is_empty() {
            return Err(ApiError::bad_request("the profile is empty (zero bytes)"));
        }
        let gz = p.encoding == Encoding::Gzip || p.body.starts_with(&[0x1f, 0x8b]);
        let body: Bytes = if gz {
            Bytes::from(gunzip_bounded(&p.body, *budget).map_err(|e| match e {
                ApiError::TooLarge(_) if !single => ApiError::TooLarge(format!(
                    "the request's profiles decompress to more than the limit of {} bytes",
                    limits.max_decompressed_bytes
                )),
                e => e,
            })?)
        } else if p.body.len() > *budget {
            return Err(ApiError::TooLarge(format!(
                "the request's profiles are larger than the limit of {} bytes",
                limits.max_decompressed_bytes
            )));
        } else {
            p.body.clone()
        };
        *budget -= body.len();
        metrics.decoded_bytes.inc_by(body.len() as u64);
        // A JFR labels part is inflated under the same budget (and its own
        // bound), and is part of what makes the payload this payload.
        let mut extra = None;
        let format = match p.format {
            Format::Jfr(mut j) => {
                if let Some(l) = j.labels.take().filter(|l| !l.is_empty()) {
                    let limit = MAX_JFR_LABELS_BYTES.min(*budget);
                    let out = if l.starts_with(&[0x1f, 0x8b]) {
                        gunzip_bounded(&l, limit).map_err(|e| match e {
                            ApiError::TooLarge(_) => ApiError::TooLarge(format!(
                                "the 'labels' part is larger than the limit of {limit} bytes"
                            )),
                            ApiError::BadRequest(m) => {
                                ApiError::BadRequest(format!("the 'labels' part: {m}"))
                            }
                            e => e,
                        })?
                    } else if l.len() > limit {
                        return Err(ApiError::TooLarge(format!(
                            "the 'labels' part is larger than the limit of {limit} bytes"
                        )));
                    } else {
                        l.to_vec()
                    };
                    *budget -= out.len();
                    metrics.decoded_bytes.inc_by(out.len() as u64);
                    extra = Some(format!("{:x}", xxhash_rust::xxh3::xxh3_128(&out)));
                    j.labels = Some(Bytes::from(out));
                }
                Format::Jfr(j)
            }
            f => f,
        };
        let seed = match &p.idempotence {
            Idempotence::Key(id) => *id,
            Idempotence::Content(parts) => {
                let mut parts: Vec<&str> = parts.iter().map(String::as_str).collect();
                parts.extend(extra.as_deref());
                crate::request_seed(tenant, &parts, &p.labels, &body)
            }
        };
        let ctx = DecodeContext {
            labels: p.labels,
            name_hint: p.name_hint,
            time_nanos: p.time_nanos,
            duration_nanos: p.duration_nanos,
            seed,
            limits: fathom_pprof::Limits {
                max_decompressed_bytes: limits.max_decompressed_bytes,
                max_samples: limits.max_samples,
                ..Default::default()
            },
            max_profiles: limits.max_profiles_per_push,
            max_labels: limits.max_labels,
            held,
        };
        decode(&format, &body, ctx)
    })();
    r.map_err(|e| with_context(&ctx_name, e))
}

/// The decoders: one arm per [`Format`].
fn decode(format: &Format, body: &[u8], ctx: DecodeContext) -> Result<Normalized, ApiError> {
    match format {
        Format::Pprof => {
            use fathom_pprof::{DecodeError, DecodeNormalizeError};
            let opts = fathom_pprof::NormalizeOptions {
                labels: ctx.labels,
                name_hint: ctx.name_hint,
                time_nanos_override: ctx.time_nanos,
                duration_nanos_override: ctx.duration_nanos,
                profile_id_seed: ctx.seed,
                held: ctx.held,
                ..Default::default()
            };
            fathom_pprof::decode_and_normalize(body, &ctx.limits, &opts).map_err(|e| match e {
                DecodeNormalizeError::Decode(
                    DecodeError::TooLarge { .. }
                    | DecodeError::DecodedTooLarge { .. }
                    | DecodeError::LimitExceeded { .. },
                ) => ApiError::TooLarge(format!("invalid pprof: {e}")),
                e => ApiError::bad_request(format!("invalid pprof: {e}")),
            })
        }
        Format::Folded(f) => fathom_pprof::parse_folded(
            body,
            &fathom_pprof::FoldedOptions {
                labels: ctx.labels,
                name_hint: ctx.name_hint,
                units: f.units.clone(),
                sample_rate: f.sample_rate,
                aggregation: f.aggregation,
                time_nanos: ctx.time_nanos.unwrap_or(0),
                duration_nanos: ctx.duration_nanos.unwrap_or(0),
                profile_id_seed: ctx.seed,
            },
            &ctx.limits,
        )
        .map_err(|e| ApiError::bad_request(format!("invalid folded profile: {e}"))),
        Format::Jfr(j) => {
            let opts = fathom_jfr::JfrOptions {
                labels: ctx.labels,
                sample_rate: j.sample_rate.unwrap_or(fathom_pprof::DEFAULT_SAMPLE_RATE),
                time_nanos_override: ctx.time_nanos,
                duration_nanos_override: ctx.duration_nanos,
                profile_id_seed: ctx.seed,
                ..Default::default()
            };
            // The label sets of the labels part become series labels of
            // the profiles they split into (the payload's labels win).
            fathom_jfr::decode(body, j.labels.as_deref(), &opts, &ctx.limits).map_err(|e| match e {
                fathom_jfr::JfrError::TooMany { .. } => {
                    ApiError::TooLarge(format!("invalid JFR: {e}"))
                }
                fathom_jfr::JfrError::Labels(_) => {
                    ApiError::bad_request(format!("invalid labels part: {e}"))
                }
                e => ApiError::bad_request(format!("invalid JFR: {e}")),
            })
        }
        Format::Speedscope { sample_rate } => fathom_pprof::parse_speedscope(
            body,
            &fathom_pprof::SpeedscopeOptions {
                labels: ctx.labels,
                sample_rate: *sample_rate,
                time_nanos: ctx.time_nanos.unwrap_or(0),
                duration_nanos: ctx.duration_nanos.unwrap_or(0),
                profile_id_seed: ctx.seed,
            },
            &ctx.limits,
        )
        .map_err(|e| match e {
            fathom_pprof::SpeedscopeError::LimitExceeded { .. } => {
                ApiError::TooLarge(format!("invalid speedscope profile: {e}"))
            }
            e => ApiError::bad_request(format!("invalid speedscope profile: {e}")),
        }),
        Format::Otlp(encoding) => {
            let limits = fathom_otlp::Limits {
                max_samples: ctx.limits.max_samples,
                max_profiles: ctx.max_profiles,
                max_labels: ctx.max_labels,
                ..Default::default()
            };
            let otlp_error = |e: fathom_otlp::Error| match e {
                fathom_otlp::Error::TooLarge(m) => ApiError::TooLarge(m),
                e => ApiError::bad_request(e),
            };
            let req = fathom_otlp::Request::decode(body, *encoding, &limits).map_err(otlp_error)?;
            tracing::debug!(layout = req.layout.describe(), "otlp request decoded");
            // Each profile keeps its resource's labels; the payload's
            // labels are added to all of them (and win).
            let opts = fathom_otlp::ConvertOptions {
                seed: ctx.seed,
                labels: ctx.labels,
                held: ctx.held,
            };
            req.convert_with(&opts, &limits).map_err(otlp_error)
        }
    }
}

/// Inflates gzip (all members) with a hard bound on the output: a gzip
/// bomb stops once `limit + 1` bytes came out.
pub(crate) fn gunzip_bounded(b: &[u8], limit: usize) -> Result<Vec<u8>, ApiError> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut d = flate2::read::MultiGzDecoder::new(b).take(limit as u64 + 1);
    d.read_to_end(&mut out)
        .map_err(|e| ApiError::bad_request(format!("body is not valid gzip: {e}")))?;
    if out.len() > limit {
        return Err(ApiError::TooLarge(format!(
            "decompressed body is larger than the limit of {limit} bytes"
        )));
    }
    Ok(out)
}

/// A profile id seed from a client's key (Pyroscope's sample `ID`): the
/// tenant and the protocol are part of it, so keys never collide across
/// tenants or with content-derived seeds.
pub fn key_seed(tenant: &TenantId, protocol: &str, key: &str) -> Id {
    let mut h = IdHasher::new("client-key");
    h.str(tenant.as_str()).str(protocol).str(key);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Arc;

    use parking_lot::Mutex;

    use crate::{IngesterWriter, Limits, WriteError};

    #[derive(Default)]
    struct Recorder(Mutex<Vec<IngestBatch>>);

    #[async_trait::async_trait]
    impl IngesterWriter for Recorder {
        async fn write(&self, batch: IngestBatch) -> Result<(), WriteError> {
            self.0.lock().push(batch);
            Ok(())
        }
    }

    fn distributor(limits: Limits) -> (Distributor, Arc<Recorder>) {
        let rec = Arc::new(Recorder::default());
        let mut reg = prometheus_client::registry::Registry::default();
        (Distributor::new(limits, rec.clone(), &mut reg), rec)
    }

    fn gz(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    fn folded(body: &str, svc: &str) -> Payload {
        let mut p = Payload::new(
            Format::Folded(FoldedParams::default()),
            Bytes::from(body.to_owned()),
        );
        p.labels = Labels::from_pairs([("service_name", svc)]).unwrap();
        p.name_hint = Some("cpu".into());
        p
    }

    fn request(payloads: Vec<Payload>) -> IngestRequest {
        IngestRequest {
            tenant: TenantId::new("t").unwrap(),
            received_bytes: 0,
            payloads,
        }
    }

    #[tokio::test]
    async fn payloads_are_written_as_one_batch() {
        let (d, rec) = distributor(Limits::default());
        let mut b = folded("main;b 2\n", "b");
        b.encoding = Encoding::Gzip;
        b.body = Bytes::from(gz(b"main;b 2\n"));
        let a = d
            .ingest(request(vec![folded("main;a 1\nmain 3\n", "a"), b]))
            .await
            .unwrap();
        assert_eq!(
            a,
            Accepted {
                profiles: 2,
                samples: 3
            }
        );
        let batches = rec.0.lock();
        assert_eq!(batches.len(), 1);
        let svcs: Vec<_> = batches[0]
            .profiles
            .iter()
            .map(|p| p.labels.get("service_name").unwrap().to_owned())
            .collect();
        assert_eq!(svcs, ["a", "b"]);
        assert!(batches[0].profiles.iter().all(|p| p.time_nanos > 0));
    }

    #[tokio::test]
    async fn one_bad_payload_refuses_all_and_is_named() {
        let (d, rec) = distributor(Limits::default());
        let mut bad = Payload::new(Format::Pprof, Bytes::from_static(b"not a profile"));
        bad.context = "series 1 sample 0".into();
        let e = d
            .ingest(request(vec![folded("main 1\n", "a"), bad]))
            .await
            .unwrap_err();
        assert!(matches!(e, ApiError::BadRequest(_)), "{e}");
        assert!(
            e.to_string()
                .starts_with("series 1 sample 0: invalid pprof"),
            "{e}"
        );
        assert!(rec.0.lock().is_empty());
    }

    #[tokio::test]
    async fn keys_make_retries_idempotent() {
        let (d, rec) = distributor(Limits::default());
        let t = TenantId::new("t").unwrap();
        let keyed = |body: &str| {
            let mut p = folded(body, "a");
            p.idempotence = Idempotence::Key(key_seed(&t, "push.v1", "uuid-1"));
            p
        };
        d.ingest(request(vec![keyed("main 1\n")])).await.unwrap();
        d.ingest(request(vec![keyed("main 1\n")])).await.unwrap();
        let mut other = folded("main 1\n", "a");
        other.idempotence = Idempotence::Key(key_seed(&t, "push.v1", "uuid-2"));
        d.ingest(request(vec![other])).await.unwrap();
        let ids: Vec<Id> = rec.0.lock().iter().map(|b| b.profiles[0].id).collect();
        assert_eq!(ids[0], ids[1]);
        assert_ne!(ids[0], ids[2]);
        // Content-derived seeds: the same bytes give the same ids.
        d.ingest(request(vec![folded("main 2\n", "a")]))
            .await
            .unwrap();
        d.ingest(request(vec![folded("main 2\n", "a")]))
            .await
            .unwrap();
        let b = rec.0.lock();
        assert_eq!(b[3].profiles[0].id, b[4].profiles[0].id);
        assert_ne!(b[3].profiles[0].id, b[0].profiles[0].id);
    }

    #[tokio::test]
    async fn the_decompressed_budget_is_for_the_whole_request() {
        let (d, rec) = distributor(Limits {
            max_decompressed_bytes: 1000,
            ..Limits::default()
        });
        let line = format!("{}f 1\n", "f;".repeat(200));
        let mut p = folded(&line, "a");
        p.body = Bytes::from(gz(line.as_bytes()));
        // One fits, three do not.
        d.ingest(request(vec![p.clone()])).await.unwrap();
        let e = d
            .ingest(request(vec![p.clone(), p.clone(), p]))
            .await
            .unwrap_err();
        assert!(matches!(e, ApiError::TooLarge(_)), "{e}");
        assert!(e.to_string().contains("limit of 1000 bytes"), "{e}");
        assert_eq!(rec.0.lock().len(), 1);
    }

    #[tokio::test]
    async fn too_many_payloads_and_gzip_bombs_are_refused() {
        let (d, _) = distributor(Limits {
            max_profiles_per_push: 2,
            max_decompressed_bytes: 1 << 16,
            ..Limits::default()
        });
        let e = d
            .ingest(request(vec![folded("a 1\n", "a"); 3]))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("3 profiles; the limit is 2"), "{e}");
        let mut bomb = Payload::new(Format::Pprof, Bytes::from(gz(&vec![0u8; 1 << 20])));
        bomb.context = "series 0 sample 0".into();
        let e = d.ingest(request(vec![bomb])).await.unwrap_err();
        assert!(matches!(e, ApiError::TooLarge(_)), "{e}");
        let e = d
            .ingest(request(vec![Payload::new(Format::Pprof, Bytes::new())]))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("empty"), "{e}");
    }

    /// An OTLP/JSON request with one CPU sample per resource.
    fn otlp_json(services: &[&str]) -> String {
        let resources: Vec<String> = services
            .iter()
            .map(|svc| {
                format!(
                    r#"{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"{svc}"}}}}]}},
                    "scopeProfiles":[{{"profiles":[{{"sampleType":{{"typeStrindex":1,"unitStrindex":2}},
                    "samples":[{{"stackIndex":1,"values":["5"]}}]}}]}}]}}"#
                )
            })
            .collect();
        format!(
            r#"{{"resourceProfiles":[{}],"dictionary":{{"stringTable":["","cpu","nanoseconds","f"],
            "functionTable":[{{}},{{"nameStrindex":3}}],"locationTable":[{{}},{{"lines":[{{"functionIndex":1}}]}}],
            "stackTable":[{{}},{{"locationIndices":[1]}}]}}}}"#,
            resources.join(",")
        )
    }

    #[tokio::test]
    async fn otlp_resources_keep_their_labels_merged_with_the_payloads() {
        let (d, rec) = distributor(Limits::default());
        let mut p = Payload::new(
            Format::Otlp(fathom_otlp::Encoding::Json),
            Bytes::from(otlp_json(&["a", "b"])),
        );
        p.labels = Labels::from_pairs([("env", "prod")]).unwrap();
        let a = d.ingest(request(vec![p])).await.unwrap();
        assert_eq!(a.profiles, 2);
        let batches = rec.0.lock();
        let mut got: Vec<(String, String)> = batches[0]
            .profiles
            .iter()
            .map(|p| {
                (
                    p.labels.get("service_name").unwrap().to_owned(),
                    p.labels.get("env").unwrap_or("").to_owned(),
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [("a".into(), "prod".into()), ("b".into(), "prod".into())]
        );
    }

    #[tokio::test]
    async fn otlp_jfr_and_speedscope_errors_have_the_services_shape() {
        let (d, rec) = distributor(Limits {
            max_decompressed_bytes: 1 << 16,
            ..Limits::default()
        });
        let one = |format: Format, body: &[u8]| {
            let mut p = Payload::new(format, Bytes::copy_from_slice(body));
            p.context = "payload 0".into();
            request(vec![p])
        };
        let e = d
            .ingest(one(
                Format::Otlp(fathom_otlp::Encoding::Json),
                b"{\"resourceProfiles\": [",
            ))
            .await
            .unwrap_err();
        assert!(matches!(e, ApiError::BadRequest(_)), "{e}");
        assert!(
            e.to_string().starts_with("payload 0: not a valid OTLP"),
            "{e}"
        );
        let e = d
            .ingest(one(Format::Jfr(JfrParams::default()), b"not a recording"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not a JFR recording"), "{e}");
        // A gzip bomb as the JFR labels part stops at the budget.
        let mut bomb = Payload::new(
            Format::Jfr(JfrParams {
                sample_rate: None,
                labels: Some(Bytes::from(gz(&vec![0u8; 1 << 20]))),
            }),
            Bytes::from_static(b"FLR\0"),
        );
        bomb.context = "payload 0".into();
        let e = d.ingest(request(vec![bomb])).await.unwrap_err();
        assert!(matches!(e, ApiError::TooLarge(_)), "{e}");
        assert!(e.to_string().contains("'labels' part"), "{e}");
        let e = d
            .ingest(one(Format::Speedscope { sample_rate: None }, b"{}"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("invalid speedscope profile"), "{e}");
        assert!(rec.0.lock().is_empty());
        // A good speedscope file goes through.
        let ok = br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"a"}]},"profiles":[{"type":"sampled","name":"p","unit":"none","samples":[[0]],"weights":[2]}]}"#;
        let mut p = Payload::new(
            Format::Speedscope { sample_rate: None },
            Bytes::from_static(ok),
        );
        p.labels = Labels::from_pairs([("service_name", "s")]).unwrap();
        let a = d.ingest(request(vec![p])).await.unwrap();
        assert_eq!(a.profiles, 1);
    }

    #[test]
    fn gzip_bomb_is_refused() {
        let gz = gz(&vec![0u8; 1 << 20]);
        let err = gunzip_bounded(&gz, 1000).unwrap_err();
        assert!(matches!(err, ApiError::TooLarge(_)), "{err}");
        assert_eq!(gunzip_bounded(&gz, 1 << 20).unwrap().len(), 1 << 20);
        assert!(gunzip_bounded(b"\x1f\x8bjunk", 100).is_err());
    }
}
