//! W3C trace context (`traceparent`, `tracestate`) across the roles: a
//! client call injects the current span's context into its gRPC metadata,
//! a server extracts it from the request headers and makes it the parent of
//! the request's span, so that one ingest or one query is one trace across
//! processes.
//!
//! Both go through OpenTelemetry's global propagator, which the process sets
//! only when it exports traces: without an OTLP endpoint nothing is injected
//! and nothing is extracted (the calls cost a lookup and return).

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value),
        ) else {
            return;
        };
        self.0.insert(k, v);
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Adds the current span's trace context to an outgoing gRPC request.
pub fn inject<T>(req: &mut tonic::Request<T>) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MetadataInjector(req.metadata_mut()))
    });
}

/// Makes the trace context of incoming request headers (HTTP or gRPC) the
/// parent of `span`; headers without one leave `span` a root.
pub fn set_parent_from(span: &tracing::Span, headers: &http::HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let cx =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    // Fails only without an OpenTelemetry layer, when there is nothing to
    // export to anyway.
    let _ = span.set_parent(cx);
}
