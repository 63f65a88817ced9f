//! The process's logs and, when an OTLP endpoint is configured, its traces.
//!
//! ```text
//!  tracing spans/events ──┬─► fmt layer (RUST_LOG, or the default filter) ──► stdout
//!                         └─► OpenTelemetry layer (Fathom's own info spans) ──► batch
//!                             processor (bounded queue, own thread) ──► OTLP gRPC
//! ```
//!
//! Without an endpoint there is no OpenTelemetry layer, no propagator and
//! no exporter: nothing is exported and trace context is neither read nor
//! sent. With one, every span of Fathom's crates at `info` is exported
//! whatever `RUST_LOG` says (dependencies' spans never are: an exporter that
//! traced its own gRPC calls would feed itself); spans beyond the queue
//! (2048) are dropped rather than held; a failing receiver is logged once at
//! `warn` until an export succeeds again; [`Telemetry::shutdown`] flushes
//! what is queued.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData,
};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Spans waiting for export beyond this are dropped.
pub const MAX_QUEUED_SPANS: usize = 2048;
/// How often queued spans are sent (sooner when a batch fills).
pub const EXPORT_INTERVAL: Duration = Duration::from_secs(2);
/// Time one export may take, and the shutdown flush.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where traces go.
#[derive(Clone, Debug)]
pub struct OtlpConfig {
    /// OTLP/gRPC endpoint, e.g. `http://collector:4317`.
    pub endpoint: String,
    /// `service.name` of this process's spans, e.g. `fathom-ingester`.
    pub service_name: String,
}

impl OtlpConfig {
    /// The endpoint from a flag, else `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
    /// else `OTEL_EXPORTER_OTLP_ENDPOINT` (empty values count as unset).
    pub fn from_flag_or_env(flag: Option<String>, service_name: String) -> Option<OtlpConfig> {
        let env = |k: &str| std::env::var(k).ok();
        pick_endpoint([
            flag,
            env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            env("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ])
        .map(|endpoint| OtlpConfig {
            endpoint,
            service_name,
        })
    }
}

/// The first set, non-empty endpoint, in order of precedence.
fn pick_endpoint(candidates: [Option<String>; 3]) -> Option<String> {
    candidates
        .into_iter()
        .flatten()
        .map(|e| e.trim().to_owned())
        .find(|e| !e.is_empty())
}

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP trace exporter for {endpoint}")]
    Exporter {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Keeps the exporter; [`Telemetry::shutdown`] flushes it.
#[must_use = "dropping it does not flush the queued spans: call shutdown"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is queued (bounded by [`EXPORT_TIMEOUT`]) and stops the
    /// exporter. Blocks: call it from a blocking context or at the end.
    pub fn shutdown(self) {
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown_with_timeout(EXPORT_TIMEOUT)
        {
            tracing::warn!(error = %e, "flushing traces at shutdown failed");
        }
    }
}

/// Installs the process's logger (`RUST_LOG` when set and valid, else
/// `default_filter`; text or JSON lines) and, with `otlp`, the trace
/// exporter and the W3C trace-context propagator. Must run inside the
/// tokio runtime (the exporter's channel lives there).
pub fn init(
    json: bool,
    default_filter: &str,
    otlp: Option<OtlpConfig>,
) -> Result<Telemetry, TelemetryError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let fmt = tracing_subscriber::fmt::layer().with_ansi(ansi);
    let fmt = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let Some(otlp) = otlp else {
        tracing_subscriber::registry().with(fmt).init();
        return Ok(Telemetry { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(otlp.endpoint.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|source| TelemetryError::Exporter {
            endpoint: otlp.endpoint.clone(),
            source,
        })?;
    let processor = BatchSpanProcessor::builder(WarnOnce::new(exporter, otlp.endpoint.clone()))
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(MAX_QUEUED_SPANS)
                .with_max_export_batch_size(512)
                .with_scheduled_delay(EXPORT_INTERVAL)
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            opentelemetry_sdk::Resource::builder_empty()
                .with_service_name(otlp.service_name.clone())
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let tracer = provider.tracer("fathom");
    // Fathom's own spans only, at info, whatever RUST_LOG says.
    let spans =
        tracing_subscriber::filter::Targets::new().with_target("fathom", tracing::Level::INFO);
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(spans);
    tracing_subscriber::registry().with(fmt).with(otel).init();
    tracing::info!(
        endpoint = %otlp.endpoint,
        service = %otlp.service_name,
        "exporting traces over OTLP"
    );
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// An exporter that logs the first failure of a run of failures at `warn`
/// (and the recovery at `info`), never one line per batch or span.
#[derive(Debug)]
struct WarnOnce<E> {
    inner: E,
    endpoint: String,
    failing: AtomicBool,
}

impl<E> WarnOnce<E> {
    fn new(inner: E, endpoint: String) -> Self {
        WarnOnce {
            inner,
            endpoint,
            failing: AtomicBool::new(false),
        }
    }

    /// Logs a failure after a success (or the first), and a success after
    /// a failure; returns whether it logged.
    fn note(&self, r: &OTelSdkResult, spans: usize) -> bool {
        match r {
            Err(e) => {
                let first = !self.failing.swap(true, Ordering::Relaxed);
                if first {
                    tracing::warn!(
                        endpoint = %self.endpoint,
                        error = %e,
                        spans,
                        "exporting traces failed; dropping spans until the receiver answers \
                         (logged once until then)"
                    );
                }
                first
            }
            Ok(()) => {
                let recovered = self.failing.swap(false, Ordering::Relaxed);
                if recovered {
                    tracing::info!(endpoint = %self.endpoint, "exporting traces again");
                }
                recovered
            }
        }
    }
}

impl<E: opentelemetry_sdk::trace::SpanExporter> opentelemetry_sdk::trace::SpanExporter
    for WarnOnce<E>
{
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let r = self.inner.export(batch).await;
        self.note(&r, n);
        r
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource)
    }
}

/// Every request's span (but for probes and scrapes), a child of the
/// caller's span when the request carries a W3C `traceparent` (a
/// distributor's write, a querier's head read, or a client's own trace).
pub(crate) async fn trace_request(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument;
    let path = req.uri().path();
    if matches!(path, "/ready" | "/health" | "/metrics") {
        return next.run(req).await;
    }
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    // gRPC paths name the method; HTTP ones get the verb in front.
    let name = if grpc {
        path.to_owned()
    } else {
        format!("{} {path}", req.method())
    };
    let span = tracing::info_span!(
        "request",
        otel.name = %name,
        otel.kind = "server",
        http.request.method = %req.method(),
        url.path = %path,
        rpc.system = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    if grpc {
        span.record("rpc.system", "grpc");
    }
    fathom_api::trace_context::set_parent_from(&span, req.headers());
    let resp = next.run(req).instrument(span.clone()).await;
    span.record("http.response.status_code", resp.status().as_u16());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_precedence_flag_then_traces_env_then_env() {
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(
            pick_endpoint([
                s("http://flag:4317"),
                s("http://t:4317"),
                s("http://e:4317")
            ]),
            s("http://flag:4317")
        );
        assert_eq!(
            pick_endpoint([None, s("http://t:4317"), s("http://e:4317")]),
            s("http://t:4317")
        );
        // Empty counts as unset: compose passes `${FATHOM_OTLP_ENDPOINT:-}`.
        assert_eq!(
            pick_endpoint([s(""), s(" "), s("http://e:4317")]),
            s("http://e:4317")
        );
        assert_eq!(pick_endpoint([None, s(""), None]), None);
    }

    #[test]
    fn export_failures_are_logged_once_per_outage() {
        let w = WarnOnce::new((), "http://x:4317".into());
        let fail = || -> OTelSdkResult {
            Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                "refused".into(),
            ))
        };
        assert!(!w.note(&Ok(()), 1), "a success after successes is quiet");
        assert!(w.note(&fail(), 1), "the first failure is logged");
        for _ in 0..100 {
            assert!(!w.note(&fail(), 1), "later failures are not");
        }
        assert!(w.note(&Ok(()), 1), "the recovery is logged");
        assert!(w.note(&fail(), 1), "the next outage is logged again");
    }
}
