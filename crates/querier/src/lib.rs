//! The querier: answers merge, range, diff and metadata queries over the
//! ingesters' heads (recent data) and the blocks in object storage (older
//! data), executing with DataFusion, and serves them over HTTP (Fathom's
//! API, and Pyroscope's query API for Grafana: [`pyroscope`]).
//!
//! ```text
//!  selector, [start, end]
//!        │
//!        ▼
//!  plan: heads' snapshots ──┐   block index (never a bucket LIST)
//!        series matching ◄──┴── series/profiles of each block (cached)
//!        drop replica copies by profile id
//!        │
//!        ▼
//!  DataFusion (dedicated runtime): union of head batches and block
//!  samples.parquet (read through the foyer block file cache,
//!  [`CachedStore`]), filtered by series, time and duplicate profiles,
//!  grouped by stack (merge) or by series and step (range); a merge reads
//!  the whole days and hours of compacted blocks from their rollup.parquet
//!  and raw samples only for the edges (`fathom_block::Cover`)
//!        │
//!        ▼
//!  resolve stack ids with head and block symbol tables → render
//!  (folded, top, flame graph, pprof, diff)
//! ```
//!
//! Every merge, range and diff query runs on the query runtime under its
//! own memory pool (the query memory limit, metered in
//! `fathom_querier_query_memory_bytes`) and the query timeout, and is
//! stopped when its caller goes away.
//!
//! Invariants: every answer is scoped to one tenant; a profile id is counted
//! once whatever number of heads and blocks hold it (replicas, a head being
//! flushed, or a block written twice after a crash).

mod cache;
mod changes;
mod engine;
mod executor;
mod flight;
mod http;
mod pyroscope;
mod remote;
mod render;
#[cfg(test)]
mod rollup_tests;
mod sql;

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use fathom_block::{BlockIndex, BlockMeta, ProfileRow, SeriesRow};
use fathom_model::{Id, Symbols, TenantId};
use object_store::ObjectStore;
use parking_lot::Mutex;

pub use cache::{CacheConfig, CacheError, CachedStore};
pub use changes::{
    ALPHA, Change, Direction, Functions, MAX_OBSERVATION_ROWS, MIN_OBSERVATIONS, Observation,
    Window, benjamini_hochberg, mann_whitney, rank,
};
pub use engine::{Merged, RangeSeries};
pub use executor::Executor;
pub use flight::{FathomFlight, flight_service};
pub use http::router;
pub use remote::FlightHeads;
pub use render::{
    FlameNode, OTHER, TopRow, flamegraph, folded, folded_for_display, folded_text, frame_name, top,
};
pub use sql::{CATALOG, SCHEMA, SqlConfig, SqlError, SqlQuery, TABLES, table_schema};

/// Errors while answering a query.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    BadRequest(String),
    #[error("reading a block: {0}")]
    Block(#[from] fathom_block::Error),
    #[error("query execution: {0}")]
    DataFusion(#[from] datafusion::error::DataFusionError),
    #[error("reading recent data: {0}")]
    Head(String),
    /// The block index (metastore) could not list blocks: the query would
    /// silently miss data, so it fails as unavailable instead.
    #[error("listing blocks: {0}")]
    Index(String),
    #[error("query task failed: {0}")]
    Task(String),
    /// Over the query memory limit (tenant's or flag's).
    #[error("{0}")]
    ResourcesExhausted(String),
    /// Past the query timeout (tenant's or flag's); the work was stopped.
    #[error("{0}")]
    Timeout(String),
}

impl From<fathom_block::IndexError> for QueryError {
    fn from(e: fathom_block::IndexError) -> Self {
        QueryError::Index(e.0)
    }
}

impl From<QueryError> for fathom_api::ApiError {
    fn from(e: QueryError) -> Self {
        match e {
            QueryError::BadRequest(m) => fathom_api::ApiError::BadRequest(m),
            // Per-tenant query limits (429, as the API's other limits).
            QueryError::ResourcesExhausted(m) | QueryError::Timeout(m) => {
                fathom_api::ApiError::RateLimited(m)
            }
            QueryError::Head(m) => fathom_api::ApiError::Unavailable(m),
            QueryError::Index(m) => {
                fathom_api::ApiError::Unavailable(format!("listing blocks: {m}"))
            }
            e => fathom_api::ApiError::internal(e),
        }
    }
}

/// One ingester's recent data for a tenant and time range.
#[derive(Clone, Default)]
pub struct HeadData {
    pub series: Vec<SeriesRow>,
    pub profiles: Vec<ProfileRow>,
    /// Rows in `fathom_block::samples_schema()`.
    pub samples: Vec<RecordBatch>,
}

/// Where recent (not yet flushed) data comes from: the in-process ingester
/// in single-process mode, the ingesters over Arrow Flight in a cluster.
#[async_trait::async_trait]
pub trait HeadSource: Send + Sync + 'static {
    /// Every head's data of `tenant` in `[start, end]` (nanoseconds).
    async fn snapshot(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<HeadData>, QueryError>;

    /// The symbols `stacks` need, from the heads.
    async fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Result<Symbols, QueryError>;
}

/// Symbolizes, at query time, the locations that arrived as (mapping with
/// a build id, address) only: the server's symbolizer (`fathom-symbols`).
/// It changes locations in place (keeping their ids: the table is the
/// query's own) and returns within its own bounded wait.
#[async_trait::async_trait]
pub trait SymbolResolver: Send + Sync + 'static {
    async fn symbolize(&self, tenant: &TenantId, symbols: &mut Symbols);
}

/// Querier settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Longest accepted query range.
    pub max_range_nanos: i64,
    /// Most points per series in a range query.
    pub max_points: i64,
    /// Most flame graph nodes a client may ask for.
    pub max_flame_nodes: usize,
    /// Blocks whose series, profiles and symbols stay cached in memory.
    pub block_cache_entries: usize,
    /// SQL (Flight SQL) limits.
    pub sql: SqlConfig,
    /// Merges read the middle of a range from compacted blocks' rollups
    /// (stack totals per hour and day) instead of raw samples. Off only to
    /// compare the two (benchmarks, tests).
    pub use_rollups: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_range_nanos: 31 * 24 * 3600 * 1_000_000_000,
            max_points: 11_000,
            max_flame_nodes: 65_536,
            block_cache_entries: 256,
            sql: SqlConfig::default(),
            use_rollups: true,
        }
    }
}

/// What a block contributes to planning.
pub(crate) struct BlockInfo {
    pub(crate) series: Vec<SeriesRow>,
    pub(crate) profiles: Vec<ProfileRow>,
}

/// A small LRU keyed by block id.
pub(crate) struct Lru<T> {
    cap: usize,
    tick: u64,
    map: HashMap<String, (Arc<T>, u64)>,
}

impl<T> Lru<T> {
    fn new(cap: usize) -> Self {
        Lru {
            cap: cap.max(1),
            tick: 0,
            map: HashMap::new(),
        }
    }

    pub(crate) fn get(&mut self, k: &str) -> Option<Arc<T>> {
        self.tick += 1;
        let t = self.tick;
        self.map.get_mut(k).map(|(v, used)| {
            *used = t;
            v.clone()
        })
    }

    pub(crate) fn put(&mut self, k: String, v: Arc<T>) {
        self.tick += 1;
        if self.map.len() >= self.cap
            && !self.map.contains_key(&k)
            && let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
        {
            self.map.remove(&oldest);
        }
        self.map.insert(k, (v, self.tick));
    }
}

/// The querier; cheap to clone.
#[derive(Clone)]
pub struct Querier {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) cfg: Config,
    pub(crate) head: Arc<dyn HeadSource>,
    pub(crate) index: Arc<dyn BlockIndex>,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) exec: Executor,
    pub(crate) block_info: Mutex<Lru<BlockInfo>>,
    pub(crate) block_symbols: Mutex<Lru<Symbols>>,
    pub(crate) metrics: engine::Metrics,
    pub(crate) symbolizer: std::sync::OnceLock<Arc<dyn SymbolResolver>>,
}

impl Querier {
    pub fn new(
        cfg: Config,
        head: Arc<dyn HeadSource>,
        index: Arc<dyn BlockIndex>,
        store: Arc<dyn ObjectStore>,
        exec: Executor,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Self, QueryError> {
        let metrics = engine::Metrics::register(registry);
        Ok(Querier {
            inner: Arc::new(Inner {
                block_info: Mutex::new(Lru::new(cfg.block_cache_entries)),
                block_symbols: Mutex::new(Lru::new(cfg.block_cache_entries)),
                cfg,
                head,
                index,
                store,
                exec,
                metrics,
                symbolizer: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Symbolizes address-only frames of every answer from now on (once;
    /// later calls are ignored).
    pub fn set_symbolizer(&self, s: Arc<dyn SymbolResolver>) {
        let _ = self.inner.symbolizer.set(s);
    }

    /// Runs the symbolizer, if there is one, over a query's symbols.
    pub(crate) async fn symbolize(&self, tenant: &TenantId, symbols: &mut Symbols) {
        if let Some(s) = self.inner.symbolizer.get() {
            s.symbolize(tenant, symbols).await;
        }
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Longest query range for the request's tenant: its tenants-file
    /// limit, else the flag.
    pub fn max_range_nanos(&self) -> i64 {
        fathom_api::auth::request_limits()
            .and_then(|l| l.max_query_range)
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .unwrap_or(self.inner.cfg.max_range_nanos)
    }

    /// Most points per series for the request's tenant.
    pub fn max_points(&self) -> i64 {
        fathom_api::auth::request_limits()
            .and_then(|l| l.max_query_points)
            .unwrap_or(self.inner.cfg.max_points)
    }

    /// Blocks of `tenant` overlapping `[start, end]`.
    pub async fn blocks(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<BlockMeta>, QueryError> {
        self.inner
            .index
            .blocks(tenant.as_str(), start, end)
            .await
            .map_err(QueryError::from)
    }
}

/// A querier over no heads, `index` and an empty in-memory bucket, for
/// unit tests.
#[cfg(test)]
pub(crate) fn test_querier(index: Arc<dyn BlockIndex>) -> Querier {
    test_querier_on(
        Config::default(),
        index,
        Arc::new(object_store::memory::InMemory::new()),
    )
}

/// A querier over no heads, `index` and `store`, for unit tests.
#[cfg(test)]
pub(crate) fn test_querier_on(
    cfg: Config,
    index: Arc<dyn BlockIndex>,
    store: Arc<dyn ObjectStore>,
) -> Querier {
    struct NoHeads;

    #[async_trait::async_trait]
    impl HeadSource for NoHeads {
        async fn snapshot(
            &self,
            _tenant: &TenantId,
            _start: i64,
            _end: i64,
        ) -> Result<Vec<HeadData>, QueryError> {
            Ok(Vec::new())
        }
        async fn symbols(&self, _tenant: &TenantId, _stacks: &[Id]) -> Result<Symbols, QueryError> {
            Ok(Symbols::default())
        }
    }

    Querier::new(
        cfg,
        Arc::new(NoHeads),
        index,
        store,
        executor::Executor::new(1).unwrap(),
        &mut prometheus_client::registry::Registry::default(),
    )
    .unwrap()
}

#[cfg(test)]
mod index_tests {
    use super::*;
    use fathom_block::IndexError;

    /// An index that cannot answer, like an unreachable metastore.
    struct Down;

    #[async_trait::async_trait]
    impl BlockIndex for Down {
        async fn add(&self, _meta: BlockMeta) -> Result<(), IndexError> {
            Err(IndexError("metastore unreachable".into()))
        }
        async fn blocks(&self, _t: &str, _s: i64, _e: i64) -> Result<Vec<BlockMeta>, IndexError> {
            Err(IndexError("metastore unreachable".into()))
        }
        async fn all(&self) -> Result<Vec<BlockMeta>, IndexError> {
            Err(IndexError("metastore unreachable".into()))
        }
        async fn remove(&self, _t: &str, _ids: &[String]) -> Result<(), IndexError> {
            Err(IndexError("metastore unreachable".into()))
        }
    }

    /// The request's tenant's limits (set by the server's authentication
    /// layer) override the flags; outside a request the flags apply.
    #[tokio::test]
    async fn tenant_query_limits_override_the_flags() {
        let q = test_querier(Arc::new(Down));
        let day = std::time::Duration::from_secs(86_400);
        let limits = fathom_api::auth::TenantLimits {
            max_query_range: Some(day),
            max_query_points: Some(100),
            query_memory: Some(1 << 20),
            query_timeout: Some(std::time::Duration::from_secs(2)),
            ..Default::default()
        };
        let (range, points, sql) = fathom_api::auth::with_request_limits(limits, async {
            (q.max_range_nanos(), q.max_points(), q.sql_config())
        })
        .await;
        assert_eq!(range, day.as_nanos() as i64);
        assert_eq!(points, 100);
        assert_eq!(sql.memory_limit, 1 << 20);
        assert_eq!(sql.timeout, std::time::Duration::from_secs(2));
        let d = Config::default();
        assert_eq!(q.max_range_nanos(), d.max_range_nanos);
        assert_eq!(q.max_points(), d.max_points);
        assert_eq!(q.sql_config().memory_limit, d.sql.memory_limit);
        // A too-long range is refused with the tenant's limit.
        let refused = fathom_api::auth::with_request_limits(
            fathom_api::auth::TenantLimits {
                max_query_range: Some(day),
                ..Default::default()
            },
            async {
                crate::http::check_range(&q, 0, 2 * day.as_nanos() as i64, "start", "end").is_err()
            },
        )
        .await;
        assert!(refused);
    }

    #[tokio::test]
    async fn an_unreachable_index_fails_queries_as_unavailable() {
        let q = test_querier(Arc::new(Down));
        let t = TenantId::new("t1").unwrap();
        let err = q.series(&t, None, 0, 1000).await.unwrap_err();
        assert!(
            matches!(&err, QueryError::Index(m) if m.contains("unreachable")),
            "{err}"
        );
        let api = fathom_api::ApiError::from(err);
        assert!(matches!(api, fathom_api::ApiError::Unavailable(_)), "{api}");
        assert!(matches!(
            q.blocks(&t, 0, 1000).await,
            Err(QueryError::Index(_))
        ));
    }
}
