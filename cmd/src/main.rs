//! `fathom`: one binary for every role. `fathom all` runs every role
//! (distributor, ingester, querier, a one-node metastore, the compactor) in
//! one process with embedded defaults and needs no flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use fathom_server::{AllConfig, ObjectStoreConfig, StoreKind};

mod alloc;
mod cluster;
mod debuginfo;
mod import;
mod members;

#[global_allocator]
static GLOBAL: alloc::RoleAllocator = alloc::RoleAllocator;

#[derive(Parser)]
#[command(name = "fathom", version, about = "Fathom continuous profiling")]
struct Cli {
    /// Log format.
    #[arg(long, env = "FATHOM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// OTLP/gRPC endpoint (e.g. `http://collector:4317`) to export this
    /// process's traces to, as `service.name` `fathom-<role>`. Unset: the
    /// standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, then
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; none of them: no tracing export at all.
    /// Not used by `fathom agent`.
    #[arg(long, env = "FATHOM_OTLP_TRACES_ENDPOINT", global = true)]
    otlp_traces_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Every role in one process: distributor, ingester, querier, a
    /// one-node metastore and the compactor (local filesystem object store
    /// under the data directory, replication factor 1).
    All(AllArgs),
    /// The eBPF profiling agent (needs root): profiles every process on
    /// this host and pushes to --remote.
    Agent(fathom_agent::AgentArgs),
    /// A node of the Raft metastore group (membership, block index,
    /// compaction leases).
    Metastore(cluster::MetastoreArgs),
    /// Accepts writes from distributors into its WAL and head; cuts blocks.
    Ingester(cluster::IngesterArgs),
    /// Stateless write front: validates and replicates to the ingesters.
    Distributor(cluster::DistributorArgs),
    /// Answers queries (HTTP, Flight, Flight SQL) over ingesters and blocks.
    Querier(cluster::QuerierArgs),
    /// Merges blocks, applies retention, deletes replaced blocks.
    Compactor(cluster::CompactorArgs),
    /// Uploads, lists and deletes debug info on a Fathom server (a
    /// client: talks to --url).
    Debuginfo(debuginfo::DebuginfoArgs),
    /// Reads a secret (a token or password) on stdin and prints the hash to
    /// put in the tenants file.
    HashSecret(HashSecretArgs),
    /// Writes blocks straight into the object store (backfill): a directory
    /// of pprof/JFR files, or a generated history (--synthetic).
    Import(import::ImportArgs),
    /// Lists the cluster's members (live, left or down) from the
    /// metastore, and forgets one that is gone for good (a client: talks
    /// to --metastore).
    Members(members::MembersArgs),
}

#[derive(Args)]
struct HashSecretArgs {
    /// PBKDF2-SHA256, salted (for passwords people choose), instead of
    /// SHA-256 (for random tokens; Bearer tokens must be SHA-256).
    #[arg(long)]
    pbkdf2: bool,
    /// PBKDF2 iterations: the cost of each first login of a user (later
    /// requests are cached).
    #[arg(long, default_value_t = 100_000)]
    iterations: u32,
}

/// Prints the hash of the secret on stdin (its trailing newline removed).
fn hash_secret(a: &HashSecretArgs) -> anyhow::Result<()> {
    let mut secret = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut secret)
        .context("reading the secret on stdin")?;
    let secret = secret.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        anyhow::bail!("no secret on stdin: e.g. printf %s \"$TOKEN\" | fathom hash-secret");
    }
    let h = if a.pbkdf2 {
        fathom_server::auth::hash_pbkdf2(secret, a.iterations)
    } else {
        fathom_server::auth::hash_sha256(secret)
    };
    println!("{h}");
    Ok(())
}

/// A size such as `64MiB`, `512KB` or `1048576`.
fn parse_size(s: &str) -> Result<usize, String> {
    s.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64() as usize)
        .map_err(|e| format!("{s:?} is not a size like 64MiB: {e}"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{s:?} is not a duration like 10s: {e}"))
}

#[derive(Clone, Copy, ValueEnum)]
enum StoreArg {
    Filesystem,
    S3,
}

/// Where blocks live.
#[derive(Args, Clone)]
struct StoreArgs {
    /// Object store for blocks: `filesystem` (<data-dir>/store) or `s3`.
    #[arg(long, env = "FATHOM_OBJECT_STORE", value_enum, default_value_t = StoreArg::Filesystem)]
    object_store: StoreArg,
    /// S3 endpoint URL (for S3-compatible servers); AWS when unset.
    #[arg(long, env = "FATHOM_S3_ENDPOINT")]
    s3_endpoint: Option<String>,
    /// S3 bucket.
    #[arg(long, env = "FATHOM_S3_BUCKET")]
    s3_bucket: Option<String>,
    /// S3 region.
    #[arg(long, env = "FATHOM_S3_REGION", default_value = "us-east-1")]
    s3_region: String,
    /// S3 access key id (else the AWS_* environment).
    #[arg(long, env = "FATHOM_S3_ACCESS_KEY_ID")]
    s3_access_key_id: Option<String>,
    /// S3 secret access key (else the AWS_* environment).
    #[arg(long, env = "FATHOM_S3_SECRET_ACCESS_KEY", hide_env_values = true)]
    s3_secret_access_key: Option<String>,
    /// Allow an http:// S3 endpoint.
    #[arg(long, env = "FATHOM_S3_ALLOW_HTTP")]
    s3_allow_http: bool,
    /// Directory of the filesystem store (default <data-dir>/store).
    #[arg(long, env = "FATHOM_STORE_PATH")]
    store_path: Option<PathBuf>,
}

impl StoreArgs {
    fn config(&self) -> ObjectStoreConfig {
        ObjectStoreConfig {
            kind: match self.object_store {
                StoreArg::Filesystem => StoreKind::Filesystem,
                StoreArg::S3 => StoreKind::S3,
            },
            s3_endpoint: self.s3_endpoint.clone(),
            s3_bucket: self.s3_bucket.clone(),
            s3_region: self.s3_region.clone(),
            s3_access_key_id: self.s3_access_key_id.clone(),
            s3_secret_access_key: self.s3_secret_access_key.clone(),
            s3_allow_http: self.s3_allow_http,
            fs_path: self.store_path.clone(),
        }
    }
}

/// What the write path accepts.
#[derive(Args, Clone)]
struct LimitArgs {
    /// Largest request body, as sent (413 above).
    #[arg(long, env = "FATHOM_MAX_BODY_SIZE", default_value = "16MiB", value_parser = parse_size)]
    max_body_size: usize,
    /// Largest request body after decompression (413 above).
    #[arg(long, env = "FATHOM_MAX_DECOMPRESSED_SIZE", default_value = "64MiB", value_parser = parse_size)]
    max_decompressed_size: usize,
    /// Most labels per series, sample labels included.
    #[arg(long, env = "FATHOM_MAX_LABELS", default_value_t = 32)]
    max_labels: usize,
    /// Longest label name, in bytes.
    #[arg(long, env = "FATHOM_MAX_LABEL_NAME_LENGTH", default_value_t = 128)]
    max_label_name_length: usize,
    /// Longest label value, in bytes.
    #[arg(long, env = "FATHOM_MAX_LABEL_VALUE_LENGTH", default_value_t = 1024)]
    max_label_value_length: usize,
    /// Most samples in one profile.
    #[arg(
        long,
        env = "FATHOM_MAX_SAMPLES_PER_PROFILE",
        default_value_t = 500_000
    )]
    max_samples_per_profile: usize,
    /// Leave out of each pprof write the stacks its ingesters' heads
    /// already hold (record format 5); `false` sends every stack.
    #[arg(
        long,
        env = "FATHOM_LEAVE_OUT_HELD_STACKS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    leave_out_held_stacks: bool,
}

impl LimitArgs {
    fn limits(&self) -> fathom_server::Limits {
        fathom_server::Limits {
            max_body_bytes: self.max_body_size,
            max_decompressed_bytes: self.max_decompressed_size,
            max_labels: self.max_labels,
            max_label_name_len: self.max_label_name_length,
            max_label_value_len: self.max_label_value_length,
            max_samples: self.max_samples_per_profile,
            leave_out_held_stacks: self.leave_out_held_stacks,
            ..Default::default()
        }
    }
}

/// Authentication and per-tenant limits.
#[derive(Args, Clone)]
pub(crate) struct TenantsArgs {
    /// YAML file of credentials (Bearer tokens, Basic users, stored hashed)
    /// and per-tenant limits; see docs/security.md. Set: every API except
    /// /ready, /health and /metrics needs a credential, which decides the
    /// tenant. Unset: authentication off, every client may read and write
    /// every tenant (a laptop, or behind a trusted proxy).
    #[arg(long, env = "FATHOM_TENANTS_FILE")]
    tenants_file: Option<PathBuf>,
    /// How often the tenants file is checked for changes (a changed file
    /// applies without a restart; a broken one keeps the last good one).
    #[arg(long, env = "FATHOM_TENANTS_RELOAD_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    tenants_reload_interval: Duration,
}

impl TenantsArgs {
    pub(crate) fn config(&self) -> fathom_server::TenantsFileConfig {
        fathom_server::TenantsFileConfig {
            path: self.tenants_file.clone(),
            reload_interval: self.tenants_reload_interval,
        }
    }
}

/// How much write traffic a distributor works on at once.
#[derive(Args, Clone)]
pub(crate) struct InflightArgs {
    /// Write requests worked on at once; more are refused with 503 and
    /// `Retry-After` (gRPC: UNAVAILABLE). Each may use up to
    /// --max-decompressed-size while it is decoded.
    #[arg(long, env = "FATHOM_MAX_INFLIGHT_WRITES", default_value_t = 32)]
    max_inflight_writes: usize,
    /// Request bodies (as sent) worked on at once; a request without
    /// Content-Length counts as --max-body-size. More are refused like
    /// above.
    #[arg(long, env = "FATHOM_MAX_INFLIGHT_WRITE_BYTES", default_value = "256MiB", value_parser = parse_size)]
    max_inflight_write_bytes: usize,
}

impl InflightArgs {
    pub(crate) fn config(&self) -> fathom_server::InflightConfig {
        fathom_server::InflightConfig {
            max_requests: self.max_inflight_writes,
            max_bytes: self.max_inflight_write_bytes,
        }
    }
}

/// What the read path allows.
#[derive(Args, Clone)]
struct QueryArgs {
    /// Longest query range.
    #[arg(long, env = "FATHOM_MAX_QUERY_RANGE", default_value = "31d", value_parser = parse_duration)]
    max_query_range: Duration,
    /// Threads of the query runtime (DataFusion).
    #[arg(long, env = "FATHOM_QUERY_THREADS", default_value_t = 2)]
    query_threads: usize,
    /// Memory one SQL query may use for aggregations, sorts and joins.
    #[arg(long, env = "FATHOM_SQL_MEMORY_LIMIT", default_value = "1GiB", value_parser = parse_size)]
    sql_memory_limit: usize,
    /// Wall time one SQL query may take.
    #[arg(long, env = "FATHOM_SQL_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    sql_timeout: Duration,
}

impl QueryArgs {
    fn config(&self) -> fathom_server::QuerierConfig {
        fathom_server::QuerierConfig {
            max_range_nanos: self.max_query_range.as_nanos().min(i64::MAX as u128) as i64,
            sql: fathom_server::SqlConfig {
                memory_limit: self.sql_memory_limit,
                timeout: self.sql_timeout,
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

/// How an ingester cuts blocks.
#[derive(Args, Clone)]
struct HeadArgs {
    /// Cut the in-memory head into a block at least this often.
    #[arg(long, env = "FATHOM_FLUSH_INTERVAL", default_value = "30m", value_parser = parse_duration)]
    flush_interval: Duration,
    /// Cut a block earlier when the head holds this much (estimated).
    #[arg(long, env = "FATHOM_MAX_HEAD_SIZE", default_value = "512MiB", value_parser = parse_size)]
    max_head_size: usize,
    /// Memory cap of the heads, those being flushed included (estimated).
    /// At the cap (blocks cannot be stored, e.g. while the object store is
    /// down) writes are refused with a retryable 503 / UNAVAILABLE instead
    /// of growing memory; what was acknowledged stays in the WAL and the
    /// heads. Keep it above --max-head-size.
    #[arg(long, env = "FATHOM_MAX_HEAD_MEMORY", default_value = "2GiB", value_parser = parse_size)]
    max_head_memory: usize,
    /// How long shutdown may spend flushing; the WAL keeps what is left.
    #[arg(long, env = "FATHOM_SHUTDOWN_FLUSH_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    shutdown_flush_timeout: Duration,
}

/// The queriers' cache of block files (memory, then disk).
#[derive(Args, Clone)]
struct CacheArgs {
    /// Memory for cached block files (0 disables the cache).
    #[arg(long, env = "FATHOM_CACHE_MEMORY", default_value = "256MiB", value_parser = parse_size)]
    cache_memory: usize,
    /// Disk for cached block files under --cache-dir (0: memory only).
    #[arg(long, env = "FATHOM_CACHE_DISK", default_value = "2GiB", value_parser = parse_size)]
    cache_disk: usize,
    /// Directory of the disk cache (default <data-dir>/cache).
    #[arg(long, env = "FATHOM_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Larger block files are read uncached.
    #[arg(long, env = "FATHOM_CACHE_MAX_OBJECT", default_value = "64MiB", value_parser = parse_size)]
    cache_max_object: usize,
}

impl CacheArgs {
    fn config(&self, data_dir: &std::path::Path) -> fathom_server::CacheConfig {
        fathom_server::CacheConfig {
            memory_bytes: self.cache_memory,
            disk_bytes: self.cache_disk,
            dir: self
                .cache_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("cache")),
            max_object_bytes: self.cache_max_object as u64,
        }
    }
}

/// Server-side symbolization of address-only frames (`docs/symbols.md`).
#[derive(Args, Clone)]
pub(crate) struct SymbolArgs {
    /// Largest debug info file accepted, uploaded or from debuginfod (413
    /// above).
    #[arg(long, env = "FATHOM_DEBUGINFO_MAX_SIZE", default_value = "1GiB", value_parser = parse_size)]
    debuginfo_max_size: usize,
    /// Longest time a query waits for symbols; what is not resolved by
    /// then shows as binary+offset and is ready for the next query.
    #[arg(long, env = "FATHOM_SYMBOLIZE_WAIT", default_value = "2s", value_parser = parse_duration)]
    symbolize_wait: Duration,
    /// How long a build id found nowhere (no upload, no debuginfod) is not
    /// looked for again.
    #[arg(long, env = "FATHOM_DEBUGINFO_MISSING_TTL", default_value = "5m", value_parser = parse_duration)]
    debuginfo_missing_ttl: Duration,
    /// debuginfod servers to fetch unknown build ids from, separated by
    /// spaces (or repeat the flag). Unset: `DEBUGINFOD_URLS`; neither:
    /// nothing is fetched.
    #[arg(long, env = "FATHOM_DEBUGINFOD_URLS")]
    debuginfod_urls: Vec<String>,
    /// Longest time one debuginfod request may take.
    #[arg(long, env = "FATHOM_DEBUGINFOD_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    debuginfod_timeout: Duration,
    /// Most debuginfod fetches at once.
    #[arg(long, env = "FATHOM_DEBUGINFOD_CONCURRENCY", default_value_t = 4)]
    debuginfod_concurrency: usize,
}

impl SymbolArgs {
    pub(crate) fn config(&self) -> fathom_server::SymbolsConfig {
        let mut urls: Vec<String> = self
            .debuginfod_urls
            .iter()
            .flat_map(|u| fathom_symbols::DebuginfodConfig::urls_from_env_value(u))
            .collect();
        if urls.is_empty()
            && let Ok(v) = std::env::var("DEBUGINFOD_URLS")
        {
            urls = fathom_symbols::DebuginfodConfig::urls_from_env_value(&v);
        }
        fathom_server::SymbolsConfig {
            max_file_bytes: self.debuginfo_max_size as u64,
            wait: self.symbolize_wait,
            missing_ttl: self.debuginfo_missing_ttl,
            debuginfod_urls: urls,
            debuginfod_timeout: self.debuginfod_timeout,
            debuginfod_concurrency: self.debuginfod_concurrency,
        }
    }
}

#[derive(Args)]
struct AllArgs {
    /// Address for HTTP and gRPC (one port, HTTP/1.1 and h2c).
    #[arg(long, env = "FATHOM_LISTEN", default_value = "0.0.0.0:7400")]
    listen: SocketAddr,
    /// Where the WAL (and, with the filesystem store, the blocks) live.
    #[arg(long, env = "FATHOM_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    head: HeadArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    inflight: InflightArgs,
    #[command(flatten)]
    query: QueryArgs,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    compaction: cluster::CompactionArgs,
    #[command(flatten)]
    tenants: TenantsArgs,
    #[command(flatten)]
    symbols: SymbolArgs,
}

impl AllArgs {
    fn config(self) -> AllConfig {
        AllConfig {
            cache: self.cache.config(&self.data_dir),
            symbols: self.symbols.config(),
            compaction: self.compaction.config(format!("all@{}", self.listen)),
            listen: self.listen,
            store: self.store.config(),
            data_dir: self.data_dir,
            flush_interval: self.head.flush_interval,
            max_head_bytes: self.head.max_head_size,
            max_head_memory: self.head.max_head_memory,
            shutdown_flush_timeout: self.head.shutdown_flush_timeout,
            limits: self.limits.limits(),
            inflight: self.inflight.config(),
            querier: self.query.config(),
            query_threads: self.query.query_threads,
            tenants: self.tenants.config(),
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutdown requested");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Agent(_)) {
        alloc::use_mimalloc();
    }
    let json = matches!(cli.log_format, LogFormat::Json);
    let role = match &cli.command {
        Command::HashSecret(a) => return hash_secret(a),
        Command::Agent(args) => {
            fathom_agent::init_logging(json);
            return fathom_agent::run_until_signal(args.clone())
                .await
                .context("fathom agent");
        }
        Command::Debuginfo(_) => "debuginfo",
        Command::Import(_) => "import",
        Command::Members(_) => "members",
        Command::All(_) => "all",
        Command::Metastore(_) => "metastore",
        Command::Ingester(_) => "ingester",
        Command::Distributor(_) => "distributor",
        Command::Querier(_) => "querier",
        Command::Compactor(_) => "compactor",
    };
    let otlp = fathom_server::telemetry::OtlpConfig::from_flag_or_env(
        cli.otlp_traces_endpoint.clone(),
        format!("fathom-{role}"),
    );
    let telemetry = fathom_server::telemetry::init(json, fathom_agent::DEFAULT_LOG_FILTER, otlp)
        .context("starting trace export")?;
    let result = run(cli.command).await;
    // Flush the queued spans (blocking, bounded in time).
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    result
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::All(a) => {
            let cfg = a.config();
            tracing::info!(
                listen = %cfg.listen,
                data_dir = %cfg.data_dir.display(),
                store = %cfg.store.describe(&cfg.data_dir),
                "starting fathom all"
            );
            fathom_server::run_all(cfg, shutdown_signal())
                .await
                .context("fathom all")?;
        }
        Command::Agent(args) => fathom_agent::run_until_signal(args)
            .await
            .context("fathom agent")?,
        Command::Metastore(a) => cluster::metastore(a, shutdown_signal()).await?,
        Command::Ingester(a) => cluster::ingester(a, shutdown_signal()).await?,
        Command::Distributor(a) => cluster::distributor(a, shutdown_signal()).await?,
        Command::Querier(a) => cluster::querier(a, shutdown_signal()).await?,
        Command::Compactor(a) => cluster::compactor(a, shutdown_signal()).await?,
        Command::HashSecret(a) => hash_secret(&a)?,
        Command::Debuginfo(a) => debuginfo::run(a).await?,
        Command::Import(a) => import::run(a).await?,
        Command::Members(a) => members::run(a).await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// clap checks a command's definition only when it is parsed: this
    /// checks every subcommand's (a flag both global and required, a
    /// duplicate name, …) before a user meets the panic.
    #[test]
    fn every_command_line_definition_is_valid() {
        Cli::command().debug_assert();
        let members = Cli::try_parse_from([
            "fathom",
            "members",
            "forget",
            "ingester-1",
            "--metastore",
            "127.0.0.1:9101,127.0.0.1:9102",
        ])
        .unwrap();
        assert!(matches!(members.command, Command::Members(_)));
        let missing = Cli::try_parse_from(["fathom", "members", "list"])
            .err()
            .unwrap();
        assert!(missing.to_string().contains("--metastore"), "{missing}");
    }
}
