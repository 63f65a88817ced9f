//! Server-side symbols in a querier process: the debug info store in the
//! blocks' object store, the debuginfod client, the symbolizer the querier
//! runs over every answer, and the debug info HTTP API.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fathom_compactor::{BlockSymbolizer, Compactor};
use fathom_model::{Symbols, TenantId};
use fathom_querier::{Querier, SymbolResolver};
use fathom_symbols::{DebugInfoStore, Debuginfod, DebuginfodConfig, Symbolizer, SymbolizerConfig};
use object_store::ObjectStore;
use prometheus_client::registry::Registry;

/// Settings of server-side symbolization.
#[derive(Clone, Debug)]
pub struct SymbolsConfig {
    /// Largest debug info file accepted (upload or debuginfod).
    pub max_file_bytes: u64,
    /// Longest time a query waits for symbols.
    pub wait: Duration,
    /// How long a build id found nowhere is not looked for again.
    pub missing_ttl: Duration,
    /// debuginfod servers (none: nothing is fetched).
    pub debuginfod_urls: Vec<String>,
    pub debuginfod_timeout: Duration,
    pub debuginfod_concurrency: usize,
}

impl Default for SymbolsConfig {
    fn default() -> Self {
        SymbolsConfig {
            max_file_bytes: 1 << 30,
            wait: Duration::from_secs(2),
            missing_ttl: Duration::from_secs(300),
            debuginfod_urls: Vec::new(),
            debuginfod_timeout: Duration::from_secs(30),
            debuginfod_concurrency: 4,
        }
    }
}

/// The symbolizer as the querier's and the compactor's hook.
struct Resolver(Symbolizer);

/// The least time a compaction waits for symbols. Nobody waits on a
/// compaction, and what it leaves unresolved stays an address in the
/// block, symbolized again by every query that reads it: a loaded machine
/// parsing a large debug file must not make it give up after a query's
/// `--symbolize-wait`. Far inside a compaction lease (10 minutes).
const COMPACTION_SYMBOLIZE_WAIT: Duration = Duration::from_secs(60);

#[async_trait::async_trait]
impl SymbolResolver for Resolver {
    async fn symbolize(&self, tenant: &TenantId, symbols: &mut Symbols) {
        self.0.symbolize(tenant, symbols).await;
    }
}

#[async_trait::async_trait]
impl BlockSymbolizer for Resolver {
    async fn symbolize(&self, tenant: &TenantId, symbols: &mut Symbols) {
        let wait = COMPACTION_SYMBOLIZE_WAIT.max(self.0.wait());
        self.0.symbolize_within(tenant, symbols, wait).await;
    }
}

/// The symbolizer of one process: debug info from the blocks' object store
/// and debuginfod, local copies under `<data dir>/debuginfo-cache`.
fn symbolizer(
    cfg: &SymbolsConfig,
    store: Arc<dyn ObjectStore>,
    data_dir: &Path,
    registry: &mut Registry,
) -> Symbolizer {
    let debuginfod = Debuginfod::new(
        DebuginfodConfig {
            urls: cfg.debuginfod_urls.clone(),
            timeout: cfg.debuginfod_timeout,
            concurrency: cfg.debuginfod_concurrency,
            max_size: cfg.max_file_bytes,
        },
        registry,
    );
    let mut sc = SymbolizerConfig::new(data_dir.join("debuginfo-cache"));
    sc.wait = cfg.wait;
    sc.missing_ttl = cfg.missing_ttl;
    Symbolizer::new(
        sc,
        DebugInfoStore::new(store, cfg.max_file_bytes),
        debuginfod,
        registry,
    )
}

/// Gives `querier` (and, in the same process, `compactor`) a symbolizer
/// and returns the debug info routes.
pub(crate) fn app(
    cfg: &SymbolsConfig,
    store: Arc<dyn ObjectStore>,
    data_dir: &Path,
    querier: &Querier,
    compactor: Option<&Compactor>,
    registry: &mut Registry,
) -> axum::Router {
    let symbolizer = symbolizer(cfg, store, data_dir, registry);
    let resolver = Arc::new(Resolver(symbolizer.clone()));
    querier.set_symbolizer(resolver.clone());
    if let Some(c) = compactor {
        c.set_symbolizer(resolver);
    }
    fathom_symbols::router(symbolizer)
}

/// Gives a compactor process's `compactor` a symbolizer, so that the
/// blocks it writes carry the functions of address-only frames whose debug
/// info is known (uploaded through a querier, or from debuginfod).
pub fn symbolize_compactions(
    cfg: &SymbolsConfig,
    store: Arc<dyn ObjectStore>,
    data_dir: &Path,
    compactor: &Compactor,
    registry: &mut Registry,
) {
    let symbolizer = symbolizer(cfg, store, data_dir, registry);
    compactor.set_symbolizer(Arc::new(Resolver(symbolizer)));
}
