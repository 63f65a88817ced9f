//! The agent's own metrics, registered under `fathom_agent_` in a registry
//! passed in, and the `/metrics`, `/health`, `/ready` endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub(crate) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StackLabels {
    pub(crate) stack: String,
    pub(crate) error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabel {
    pub(crate) result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ScrapeLabels {
    pub(crate) job: String,
    pub(crate) profile: String,
    pub(crate) result: String,
}

/// Every metric the agent exports.
#[derive(Debug)]
pub(crate) struct Metrics {
    // Kernel side (copied from the BPF per-CPU counters).
    pub(crate) bpf_events: Counter,
    pub(crate) bpf_idle: Counter,
    pub(crate) bpf_excluded: Counter,
    pub(crate) samples_lost: Family<ReasonLabel, Counter>,
    pub(crate) stack_errors: Family<StackLabels, Counter>,
    pub(crate) exec_events_lost: Counter,
    pub(crate) attached_cpus: Gauge,
    pub(crate) user_stacks_tables: Counter,
    pub(crate) user_stacks_truncated: Counter,
    pub(crate) offcpu_events: Counter,
    // Unwind tables.
    pub(crate) unwind_tables: Gauge,
    pub(crate) unwind_table_rows: Gauge,
    pub(crate) unwind_table_budget_rows: Gauge,
    pub(crate) unwind_tables_rejected: Family<ReasonLabel, Counter>,
    // User space.
    pub(crate) samples: Counter,
    pub(crate) exec_events: Counter,
    pub(crate) samples_dropped_by_relabel: Counter,
    pub(crate) samples_without_stack: Counter,
    pub(crate) frames_outside_mappings: Counter,
    pub(crate) maps_read_failures: Counter,
    pub(crate) processes_discovered: Counter,
    pub(crate) processes: Gauge,
    pub(crate) symbolizer_objects: Gauge,
    pub(crate) symbolizer_cached_addresses: Gauge,
    pub(crate) unsymbolized_locations: Counter,
    pub(crate) profiles_built: Counter,
    pub(crate) collect_seconds: Histogram,
    // Shipping.
    pub(crate) push_requests: Family<ResultLabel, Counter>,
    pub(crate) pushed_profiles: Counter,
    pub(crate) dropped_batches: Counter,
    pub(crate) dropped_profiles: Counter,
    pub(crate) dropped_bytes: Counter,
    pub(crate) queue_bytes: Gauge,
    pub(crate) push_seconds: Histogram,
    // Pull mode.
    pub(crate) scrapes: Family<ScrapeLabels, Counter>,
}

impl Metrics {
    /// Registers every metric under `fathom_agent_` in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let m = Metrics {
            bpf_events: Counter::default(),
            bpf_idle: Counter::default(),
            bpf_excluded: Counter::default(),
            samples_lost: Family::default(),
            stack_errors: Family::default(),
            exec_events_lost: Counter::default(),
            attached_cpus: Gauge::default(),
            user_stacks_tables: Counter::default(),
            user_stacks_truncated: Counter::default(),
            offcpu_events: Counter::default(),
            unwind_tables: Gauge::default(),
            unwind_table_rows: Gauge::default(),
            unwind_table_budget_rows: Gauge::default(),
            unwind_tables_rejected: Family::default(),
            samples: Counter::default(),
            exec_events: Counter::default(),
            samples_dropped_by_relabel: Counter::default(),
            samples_without_stack: Counter::default(),
            frames_outside_mappings: Counter::default(),
            maps_read_failures: Counter::default(),
            processes_discovered: Counter::default(),
            processes: Gauge::default(),
            symbolizer_objects: Gauge::default(),
            symbolizer_cached_addresses: Gauge::default(),
            unsymbolized_locations: Counter::default(),
            profiles_built: Counter::default(),
            collect_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            push_requests: Family::default(),
            pushed_profiles: Counter::default(),
            dropped_batches: Counter::default(),
            dropped_profiles: Counter::default(),
            dropped_bytes: Counter::default(),
            queue_bytes: Gauge::default(),
            push_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            scrapes: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("fathom_agent");
        r.register(
            "bpf_events",
            "CPU-clock perf events that fired on any CPU (including idle and excluded ones)",
            m.bpf_events.clone(),
        );
        r.register(
            "user_stacks_unwound_with_tables",
            "User stacks the BPF program walked with unwind tables (.eh_frame) instead of frame pointers",
            m.user_stacks_tables.clone(),
        );
        r.register(
            "user_stacks_truncated",
            "User stacks walked with unwind tables that could not be walked to their outermost frame (marked [truncated])",
            m.user_stacks_truncated.clone(),
        );
        r.register(
            "offcpu_events",
            "Off-CPU events (a task back on a CPU after at least --off-cpu-threshold away) recorded",
            m.offcpu_events.clone(),
        );
        r.register(
            "unwind_tables",
            "Binaries whose unwind table is loaded in the kernel",
            m.unwind_tables.clone(),
        );
        r.register(
            "unwind_table_rows",
            "Unwind table rows in use (12 bytes each)",
            m.unwind_table_rows.clone(),
        );
        r.register(
            "unwind_table_budget_rows",
            "Unwind table rows the budget allows (--unwind-table-budget / 12 bytes)",
            m.unwind_table_budget_rows.clone(),
        );
        r.register(
            "unwind_tables_rejected",
            "Binaries left without an unwind table, by reason (budget: did not fit; no_table: no usable CFI or unreadable)",
            m.unwind_tables_rejected.clone(),
        );
        r.register(
            "bpf_idle",
            "Perf events that hit the idle task, not recorded",
            m.bpf_idle.clone(),
        );
        r.register(
            "bpf_excluded",
            "Perf events of excluded processes (the agent itself with --exclude-self, relabel drops)",
            m.bpf_excluded.clone(),
        );
        r.register(
            "samples_lost",
            "Samples lost, by reason: ringbuf_full (kernel), parse_error (user space)",
            m.samples_lost.clone(),
        );
        r.register(
            "stack_errors",
            "Stack captures that failed (error=capture_failed) or came back empty (error=empty), by stack (kernel, user)",
            m.stack_errors.clone(),
        );
        r.register(
            "exec_events_lost",
            "exec notifications lost because the ring buffer was full",
            m.exec_events_lost.clone(),
        );
        r.register(
            "attached_cpus",
            "CPUs with an attached sampler",
            m.attached_cpus.clone(),
        );
        r.register(
            "samples",
            "Samples received from the kernel",
            m.samples.clone(),
        );
        r.register(
            "exec_events",
            "exec notifications received",
            m.exec_events.clone(),
        );
        r.register(
            "samples_dropped_by_relabel",
            "Samples of processes that relabeling dropped (before the kernel skips them)",
            m.samples_dropped_by_relabel.clone(),
        );
        r.register(
            "samples_without_stack",
            "Samples with neither a kernel nor a user frame",
            m.samples_without_stack.clone(),
        );
        r.register(
            "frames_outside_mappings",
            "User frames outside every mapping of their process (kept as [unknown])",
            m.frames_outside_mappings.clone(),
        );
        r.register(
            "maps_read_failures",
            "Reads of /proc/<pid>/maps that failed (the process had exited)",
            m.maps_read_failures.clone(),
        );
        r.register(
            "processes_discovered",
            "Processes seen for the first time",
            m.processes_discovered.clone(),
        );
        r.register("processes", "Processes tracked", m.processes.clone());
        r.register(
            "symbolizer_objects",
            "Code objects (binaries, JIT maps, kernel) held by the symbolizer",
            m.symbolizer_objects.clone(),
        );
        r.register(
            "symbolizer_cached_addresses",
            "Symbolized addresses held in caches",
            m.symbolizer_cached_addresses.clone(),
        );
        r.register(
            "unsymbolized_locations",
            "Locations shipped without a function name (kept as mapping + address)",
            m.unsymbolized_locations.clone(),
        );
        r.register(
            "profiles_built",
            "CPU profiles built",
            m.profiles_built.clone(),
        );
        r.register_with_unit(
            "collect",
            "Time to symbolize and encode one push interval's profiles",
            prometheus_client::registry::Unit::Seconds,
            m.collect_seconds.clone(),
        );
        r.register(
            "push_requests",
            "Push requests by result: ok, retry (transient error), rejected (refused, dropped)",
            m.push_requests.clone(),
        );
        r.register(
            "pushed_profiles",
            "Profiles acknowledged by the remote",
            m.pushed_profiles.clone(),
        );
        r.register(
            "dropped_batches",
            "Push batches dropped (buffer over budget, or refused by the remote)",
            m.dropped_batches.clone(),
        );
        r.register(
            "dropped_profiles",
            "Profiles in dropped batches",
            m.dropped_profiles.clone(),
        );
        r.register_with_unit(
            "dropped",
            "Bytes of dropped batches",
            prometheus_client::registry::Unit::Bytes,
            m.dropped_bytes.clone(),
        );
        r.register_with_unit(
            "queue",
            "Bytes of profiles waiting to be pushed",
            prometheus_client::registry::Unit::Bytes,
            m.queue_bytes.clone(),
        );
        r.register_with_unit(
            "push",
            "Duration of push requests",
            prometheus_client::registry::Unit::Seconds,
            m.push_seconds.clone(),
        );
        r.register(
            "scrapes",
            "pprof scrapes by job, profile and result (ok, error)",
            m.scrapes.clone(),
        );
        m
    }

    pub(crate) fn lost(&self, reason: &str) -> Counter {
        self.samples_lost
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .clone()
    }

    pub(crate) fn stack_error(&self, stack: &str, error: &str) -> Counter {
        self.stack_errors
            .get_or_create(&StackLabels {
                stack: stack.into(),
                error: error.into(),
            })
            .clone()
    }

    pub(crate) fn push_result(&self, result: &str) -> Counter {
        self.push_requests
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .clone()
    }

    pub(crate) fn scrape(&self, job: &str, profile: &str, result: &str) -> Counter {
        self.scrapes
            .get_or_create(&ScrapeLabels {
                job: job.into(),
                profile: profile.into(),
                result: result.into(),
            })
            .clone()
    }
}

#[derive(Clone)]
struct HttpState {
    registry: Arc<Registry>,
    ready: Arc<AtomicBool>,
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "encoding metrics failed".to_owned(),
        ),
    }
}

async fn ready(State(s): State<HttpState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// The HTTP router for `/metrics`, `/health`, `/ready`.
pub(crate) fn router(registry: Arc<Registry>, ready_flag: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .with_state(HttpState {
            registry,
            ready: ready_flag,
        })
}

/// Binds `addr` and serves until `shutdown` turns true.
pub(crate) async fn serve(
    addr: SocketAddr,
    router: Router,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving agent metrics");
    Ok(tokio::spawn(async move {
        let stop = async move {
            while !*shutdown.borrow() {
                if shutdown.changed().await.is_err() {
                    break;
                }
            }
        };
        if let Err(error) = axum::serve(listener, router)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::warn!(%error, "metrics server stopped");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_metrics() {
        let mut reg = Registry::default();
        let m = Metrics::new(&mut reg);
        m.samples.inc_by(5);
        m.lost("ringbuf_full").inc();
        let ready_flag = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::watch::channel(false);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let h = serve(addr, router(Arc::new(reg), ready_flag.clone()), rx)
            .await
            .unwrap();
        let c = reqwest::Client::new();
        let body = c
            .get(format!("http://{addr}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(body.contains("fathom_agent_samples_total 5"), "{body}");
        assert!(
            body.contains("fathom_agent_samples_lost_total{reason=\"ringbuf_full\"} 1"),
            "{body}"
        );
        let r = c.get(format!("http://{addr}/ready")).send().await.unwrap();
        assert_eq!(r.status(), 503);
        ready_flag.store(true, Ordering::Relaxed);
        let r = c.get(format!("http://{addr}/ready")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        tx.send(true).unwrap();
        h.await.unwrap();
    }
}
