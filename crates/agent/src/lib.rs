//! The Fathom agent: zero-instrumentation CPU profiling of every process on a
//! host with eBPF, plus scraping of pprof endpoints, shipped to Fathom over
//! the gRPC push API.
//!
//! ```text
//!  kernel                         sampler thread                                 async runtime
//! ┌──────────────────────┐ ring  ┌──────────────────────────────────────┐ batches ┌──────────────────┐ gRPC Push
//! │ perf_event CPU clock │ ────► │ collector: processes, normalized     │ ──────► │ queue (bytes     │ ─────────► remote
//! │ per CPU, 19 Hz:      │ buffer│ stacks, relabeling; every interval:  │         │ budget) → sender │  (tenant, token)
//! │ pid, tid, comm,      │       │ symbolize (ELF/DWARF, kallsyms, JIT) │         └──────────────────┘
//! │ kernel + user stack  │       │ → one pprof per label set            │                ▲
//! └──────────────────────┘       └──────────────────────────────────────┘                │
//!                                 scrapers: /debug/pprof/* of static targets ─────────────┘
//! ```
//!
//! Invariants and failure modes:
//! - Nothing is dropped silently: samples lost in the kernel (ring buffer
//!   full), failed or empty stack captures, unparsable records, batches
//!   dropped over the memory budget or refused by the remote are all counted
//!   in `fathom_agent_*` metrics.
//! - The BPF program is loaded before [`run`] reports success; a host that
//!   cannot load it (no BTF, no privileges, verifier refusal) makes [`run`]
//!   fail with the reason, unless CPU profiling is switched off.
//! - Memory is bounded: the push buffer by `--max-buffer`, the symbolizer by
//!   evicting code and addresses unused for a few intervals, the process
//!   table by forgetting exited processes after their last interval.
//! - Unwinding uses frame pointers only (see docs/agent.md).

mod bpf;
mod collector;
mod dwarf;
mod elf;
#[cfg(test)]
mod live_tests;
mod mem;
mod metrics;
mod pprof;
mod procfs;
mod python;
mod relabel;
mod sampler;
mod scrape;
mod ship;
mod symbolize;
mod symtab;
mod unwind;
mod upload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use prometheus_client::registry::Registry;

pub use bpf::BpfError;
pub use relabel::{RelabelError, Relabeler};
pub use scrape::ScrapeConfigError;
pub use ship::ShipError;

/// An error with its sources, `: `-joined, for log fields (the error types
/// here keep causes as sources rather than in their own message).
/// What both binaries (`fathom` and `fathom-agent`) log when `RUST_LOG` is
/// not set: Fathom's own lines at `info`, every dependency at `warn` (Raft's
/// vote changes, cache builders and HTTP internals stay quiet).
pub const DEFAULT_LOG_FILTER: &str = "warn,fathom=info";

/// Installs the process's logger: `RUST_LOG` when set (and valid), else
/// [`DEFAULT_LOG_FILTER`]; lines as text, or as JSON objects with `json`.
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // Colours only on a terminal: a file or journald gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
}

pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// How long shutdown waits for queued profiles to be pushed.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);

/// Flags of `fathom agent`.
#[derive(Clone, Debug, clap::Args)]
pub struct AgentArgs {
    /// Fathom's gRPC push endpoint (the distributor, or `fathom all`), as an
    /// http:// or https:// URL.
    #[arg(
        long,
        env = "FATHOM_AGENT_REMOTE",
        default_value = "http://127.0.0.1:7400"
    )]
    pub remote: String,

    /// Tenant sent as the X-Scope-OrgID header. Unset: no header (the
    /// remote's default tenant).
    #[arg(long, env = "FATHOM_AGENT_TENANT")]
    pub tenant: Option<String>,

    /// Bearer token sent as `Authorization: Bearer <token>`.
    #[arg(long, env = "FATHOM_AGENT_BEARER_TOKEN", hide_env_values = true)]
    pub bearer_token: Option<String>,

    /// File holding the bearer token (read once at start); wins over
    /// --bearer-token.
    #[arg(long, env = "FATHOM_AGENT_BEARER_TOKEN_FILE")]
    pub bearer_token_file: Option<PathBuf>,

    /// CPU samples per second on each CPU. 19 (the default) keeps overhead
    /// negligible and avoids lockstep with 10 ms / 100 Hz timers; higher
    /// rates give finer profiles at proportionally higher cost (1-1000).
    #[arg(long, env = "FATHOM_AGENT_SAMPLING_HZ", default_value_t = 19,
          value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub sampling_hz: u64,

    /// How often profiles are built and pushed: one profile per process (per
    /// label set after relabeling) per interval (e.g. 10s, 1m).
    #[arg(long, env = "FATHOM_AGENT_PUSH_INTERVAL", default_value = "10s",
          value_parser = parse_interval)]
    pub push_interval: Duration,

    /// Timeout of one push request (e.g. 30s).
    #[arg(long, env = "FATHOM_AGENT_PUSH_TIMEOUT", default_value = "30s",
          value_parser = humantime::parse_duration)]
    pub push_timeout: Duration,

    /// Memory budget for profiles waiting to be pushed while the remote is
    /// slow or down (e.g. 16MiB). Beyond it the oldest batches are dropped
    /// and counted in fathom_agent_dropped_*.
    #[arg(long, env = "FATHOM_AGENT_MAX_BUFFER", default_value = "16MiB")]
    pub max_buffer: bytesize::ByteSize,

    /// Value of the `node` label. Default: this host's name.
    #[arg(long, env = "FATHOM_AGENT_NODE")]
    pub node: Option<String>,

    /// YAML file with Prometheus-style `relabel_configs` applied to every
    /// process's labels (keep, drop, replace, labelmap, labeldrop, labelkeep,
    /// lowercase, uppercase). Dropped processes are not sampled at all.
    #[arg(long, env = "FATHOM_AGENT_RELABEL_CONFIG")]
    pub relabel_config: Option<PathBuf>,

    /// Binaries larger than this are symbolized from their ELF symbol tables
    /// only, without DWARF (no inlined frames or line numbers): parsing the
    /// DWARF of a huge debug build costs more memory and time than the agent
    /// should use. 0 turns DWARF off.
    #[arg(
        long,
        env = "FATHOM_AGENT_DWARF_MAX_FILE_SIZE",
        default_value = "16MiB"
    )]
    pub dwarf_max_file_size: bytesize::ByteSize,

    /// Where native frames are symbolized. `local` (the default): here,
    /// from the binaries' symbols and DWARF, so any Fathom server shows
    /// names, even without debug info uploaded. `server`: frames of
    /// binaries with a GNU build id are sent as build id + address and the
    /// server symbolizes them from uploaded or debuginfod debug info (the
    /// way to profile stripped binaries; costs the agent less, see
    /// docs/symbols.md). Kernel and JIT frames are always named here.
    #[arg(long, env = "FATHOM_AGENT_SYMBOLIZE", value_enum, default_value_t = SymbolizeMode::Local)]
    pub symbolize: SymbolizeMode,

    /// With `--symbolize=server`: upload the binaries found mapped on this
    /// host that carry symbols (DWARF, `.symtab`, Go `.gopclntab`) and
    /// whose build id the server lacks, once per build id per run, one at a
    /// time, at most `--upload-debuginfo-rate` bytes per second.
    #[arg(long, env = "FATHOM_AGENT_UPLOAD_DEBUGINFO")]
    pub upload_debuginfo: bool,

    /// Bandwidth of `--upload-debuginfo`, per second.
    #[arg(
        long,
        env = "FATHOM_AGENT_UPLOAD_DEBUGINFO_RATE",
        default_value = "1MiB"
    )]
    pub upload_debuginfo_rate: bytesize::ByteSize,

    /// Binaries larger than this are not uploaded.
    #[arg(
        long,
        env = "FATHOM_AGENT_UPLOAD_DEBUGINFO_MAX_SIZE",
        default_value = "256MiB"
    )]
    pub upload_debuginfo_max_size: bytesize::ByteSize,
    /// Kernel memory for the unwind tables built from binaries' .eh_frame
    /// and .debug_frame (12 bytes a row), which walk stacks of code built
    /// without frame pointers. A binary whose table does not fit is unwound
    /// with frame pointers. 0 turns table unwinding off.
    #[arg(
        long,
        env = "FATHOM_AGENT_UNWIND_TABLE_BUDGET",
        default_value = "32MiB"
    )]
    pub unwind_table_budget: bytesize::ByteSize,

    /// Record off-CPU time (a second profile type, `off_cpu`): every time
    /// a thread was off its CPU (blocked, sleeping, preempted) for at least
    /// this long, with the stack where it left. Off when not given.
    #[arg(long, env = "FATHOM_AGENT_OFF_CPU_THRESHOLD", value_parser = parse_threshold)]
    pub off_cpu_threshold: Option<Duration>,

    /// Do not profile the agent's own process (it is profiled like any other
    /// by default).
    #[arg(long, env = "FATHOM_AGENT_EXCLUDE_SELF")]
    pub exclude_self: bool,

    /// Turn eBPF CPU profiling off (for example to only scrape pprof
    /// endpoints without privileges).
    #[arg(long, env = "FATHOM_AGENT_NO_CPU_PROFILING")]
    pub no_cpu_profiling: bool,

    /// YAML file of pprof endpoints to scrape (pull mode); see docs/agent.md.
    #[arg(long, env = "FATHOM_AGENT_SCRAPE_CONFIG")]
    pub scrape_config: Option<PathBuf>,

    /// Address of the agent's own /metrics, /health and /ready.
    #[arg(
        long,
        env = "FATHOM_AGENT_METRICS_LISTEN",
        default_value = "127.0.0.1:7401"
    )]
    pub metrics_listen: SocketAddr,
}

/// Where the agent's native frames are symbolized (`--symbolize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SymbolizeMode {
    Local,
    Server,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) {
        return Err("must be at least 1s".into());
    }
    Ok(d)
}

fn parse_threshold(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_micros(10) {
        return Err(
            "must be at least 10us (shorter thresholds cost a record per context switch)".into(),
        );
    }
    Ok(d)
}

impl Default for AgentArgs {
    fn default() -> Self {
        AgentArgs {
            remote: "http://127.0.0.1:7400".into(),
            tenant: None,
            bearer_token: None,
            bearer_token_file: None,
            sampling_hz: 19,
            push_interval: Duration::from_secs(10),
            push_timeout: Duration::from_secs(30),
            max_buffer: bytesize::ByteSize::mib(16),
            node: None,
            relabel_config: None,
            dwarf_max_file_size: bytesize::ByteSize::b(symbolize::DEFAULT_DWARF_MAX),
            symbolize: SymbolizeMode::Local,
            upload_debuginfo: false,
            upload_debuginfo_rate: bytesize::ByteSize::mib(1),
            upload_debuginfo_max_size: bytesize::ByteSize::mib(256),
            unwind_table_budget: bytesize::ByteSize::b(unwind::DEFAULT_BUDGET),
            off_cpu_threshold: None,
            exclude_self: false,
            no_cpu_profiling: false,
            scrape_config: None,
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 7401)),
        }
    }
}

/// Runs the agent until `shutdown` turns true, with its own metrics registry.
pub async fn run(
    args: AgentArgs,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    run_with_registry(args, Registry::default(), shutdown).await
}

/// Runs the agent until SIGINT or SIGTERM: what `fathom agent` and
/// `fathom-agent` run.
pub async fn run_until_signal(args: AgentArgs) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = tx.send(true);
    });
    run(args, rx).await
}

/// Runs the agent, registering its metrics (`fathom_agent_*`) in `registry`
/// and serving that registry on `--metrics-listen`.
pub async fn run_with_registry(
    args: AgentArgs,
    mut registry: Registry,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    mem::limit_arenas();
    let metrics = Arc::new(metrics::Metrics::new(&mut registry));

    // Everything that can be wrong with the configuration fails here, before
    // anything starts.
    let relabeler = match &args.relabel_config {
        Some(p) => {
            let r = Relabeler::from_file(p)?;
            tracing::info!(path = %p.display(), rules = r.len(), "relabeling");
            r
        }
        None => Relabeler::default(),
    };
    let targets = match &args.scrape_config {
        Some(p) => scrape::read_config(p)?,
        None => Vec::new(),
    };
    if args.no_cpu_profiling && targets.is_empty() {
        anyhow::bail!("nothing to do: --no-cpu-profiling and no --scrape-config");
    }
    let bearer_token = match &args.bearer_token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|source| ShipError::TokenFile {
                    path: p.display().to_string(),
                    source,
                })?
                .trim()
                .to_owned(),
        ),
        None => args.bearer_token.clone(),
    };
    if args.upload_debuginfo {
        if args.symbolize != SymbolizeMode::Server {
            anyhow::bail!("--upload-debuginfo needs --symbolize=server");
        }
        upload::start(upload::UploadConfig {
            remote: args.remote.clone(),
            tenant: args.tenant.clone(),
            bearer_token: bearer_token.clone(),
            rate: args.upload_debuginfo_rate.as_u64(),
            max_size: args.upload_debuginfo_max_size.as_u64(),
        })?;
    }
    let sender = ship::Sender::new(ship::ShipConfig {
        remote: args.remote.clone(),
        tenant: args.tenant.clone(),
        bearer_token,
        timeout: args.push_timeout,
        min_backoff: Duration::from_millis(500),
        max_backoff: Duration::from_secs(30),
    })?;
    let budget = usize::try_from(args.max_buffer.as_u64()).unwrap_or(usize::MAX);
    let queue = ship::Queue::new(budget, metrics.clone());
    let (flush_deadline_tx, flush_deadline_rx) = tokio::sync::watch::channel(None::<Instant>);
    let sender_task = tokio::spawn(sender.run(queue.clone(), metrics.clone(), flush_deadline_rx));

    let ready = Arc::new(AtomicBool::new(false));
    let (http_stop_tx, http_stop_rx) = tokio::sync::watch::channel(false);
    let http = metrics::serve(
        args.metrics_listen,
        metrics::router(Arc::new(registry), ready.clone()),
        http_stop_rx,
    )
    .await
    .with_context(|| format!("binding --metrics-listen {}", args.metrics_listen))?;

    let node = args.node.clone().unwrap_or_else(procfs::hostname);
    symbolize::set_server_mode(args.symbolize == SymbolizeMode::Server);
    let sampler = if args.no_cpu_profiling {
        None
    } else {
        let cfg = sampler::SamplerConfig {
            bpf: bpf::BpfConfig {
                sampling_hz: args.sampling_hz,
                exclude_pid: args.exclude_self.then(std::process::id),
                unwind_budget: args.unwind_table_budget.as_u64(),
                offcpu_min_ns: args
                    .off_cpu_threshold
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            },
            collector: collector::CollectorConfig {
                node: node.clone(),
                period_ns: 1_000_000_000 / args.sampling_hz.max(1),
                relabeler,
                dwarf_max_file_size: args.dwarf_max_file_size.as_u64(),
            },
            push_interval: args.push_interval,
        };
        let started = sampler::start(cfg, queue.clone(), metrics.clone(), shutdown.clone());
        match started {
            Ok(h) => Some(h),
            Err(e) => {
                let _ = http_stop_tx.send(true);
                queue.close();
                return Err(e).context("starting the eBPF CPU profiler");
            }
        }
    };

    let client = reqwest::Client::builder()
        .user_agent(concat!("fathom-agent/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("building the scrape HTTP client")?;
    let mut scrapers = Vec::new();
    for t in targets {
        tracing::info!(job = %t.job, url = %t.url, interval = ?t.interval, "scraping");
        scrapers.push(tokio::spawn(scrape::run_target(
            t,
            client.clone(),
            queue.clone(),
            metrics.clone(),
            shutdown.clone(),
        )));
    }

    ready.store(true, Ordering::Relaxed);
    tracing::info!(remote = %args.remote, node, "agent running");
    while !*shutdown.borrow() {
        if shutdown.changed().await.is_err() {
            break;
        }
    }

    tracing::info!("agent shutting down");
    ready.store(false, Ordering::Relaxed);
    for s in scrapers {
        let _ = s.await;
    }
    if let Some(h) = sampler {
        // The thread pushes its last interval before it exits.
        let _ = tokio::task::spawn_blocking(move || h.join()).await;
    }
    let _ = flush_deadline_tx.send(Some(Instant::now() + SHUTDOWN_FLUSH));
    queue.close();
    if tokio::time::timeout(SHUTDOWN_FLUSH + Duration::from_secs(1), sender_task)
        .await
        .is_err()
    {
        tracing::warn!(bytes = queue.bytes(), "push queue not drained at shutdown");
    }
    let _ = http_stop_tx.send(true);
    let _ = http.await;
    Ok(())
}
