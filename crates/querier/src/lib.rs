//! The querier's engine: answers merge, range, diff, metadata and SQL
//! queries over the ingesters' heads (recent data) and the blocks in object
//! storage (older data), executing with DataFusion, and renders the answers
//! (folded, top, flame graph).
//!
//! The crate holds no protocol: its edges (the HTTP query API, Pyroscope's
//! query API over Connect, Arrow Flight and Flight SQL) are
//! `fathom-query-api`, which calls only this crate's public API; recent
//! data comes in through [`HeadSource`] (the ingester crate's in-process
//! [`fathom_ingester::Ingester`] or its Flight client
//! [`fathom_ingester::FlightHeads`], adapted in `heads.rs`), blocks through
//! `fathom_block`. Errors leave as [`QueryError`] / [`SqlError`], mapped to
//! HTTP and gRPC by `fathom_api::ApiError`.
//!
//! ```text
//!  fathom-query-api: HTTP /api/v1, Connect (Pyroscope), Flight, Flight SQL
//!        │ Querier::{merge, range, series, profile_types, sql_*}
//!        ▼
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
//! Query work runs on the query runtime ([`Executor`]); the object-store,
//! metastore and ingester calls it makes are sent back to the I/O runtime
//! (`io`). SQL sums of `profiles` read rollups like a merge (`totals`);
//! range queries use rollup buckets that fit inside one step.
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
mod heads;
mod io;
mod render;
#[cfg(test)]
mod rollup_tests;
mod sql;
#[cfg(any(test, feature = "test-util"))]
pub mod test_util;
mod totals;

use std::collections::HashMap;
use std::sync::Arc;

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
pub use render::{
    Bounded, FlameNode, OTHER, Row, TopRow, bound_folded, bound_samples, flamegraph, folded,
    folded_for_display, folded_text, frame_name, top,
};
pub use sql::{
    CATALOG, SCHEMA, SqlConfig, SqlError, SqlQuery, TABLES, labels_type, stack_type, table_schema,
};

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
    Head(#[from] fathom_ingester::ReadError),
    /// The block index (metastore) could not list blocks: the query would
    /// silently miss data, so it fails as unavailable instead.
    #[error("listing blocks: {0}")]
    Index(#[from] fathom_block::IndexError),
    #[error("query task failed: {0}")]
    Task(String),
    /// Over the query memory limit (tenant's or flag's).
    #[error("{0}")]
    ResourcesExhausted(String),
    /// Past the query timeout (tenant's or flag's); the work was stopped.
    #[error("{0}")]
    Timeout(String),
}

impl From<QueryError> for fathom_api::ApiError {
    fn from(e: QueryError) -> Self {
        match e {
            QueryError::BadRequest(m) => fathom_api::ApiError::BadRequest(m),
            // Per-tenant query limits (429, as the API's other limits).
            QueryError::ResourcesExhausted(m) | QueryError::Timeout(m) => {
                fathom_api::ApiError::RateLimited(m)
            }
            QueryError::Head(e) => e.into(),
            e @ QueryError::Index(_) => fathom_api::ApiError::Unavailable(e.to_string()),
            e => fathom_api::ApiError::internal(e),
        }
    }
}

/// Connect answers take the same mapping (through [`fathom_api::ApiError`]).
impl From<QueryError> for fathom_api::connect::ConnectError {
    fn from(e: QueryError) -> Self {
        fathom_api::ApiError::from(e).into()
    }
}

/// One ingester's recent data for a tenant and time range: the
/// ingester's own snapshot type, the same in process and over Flight.
pub use fathom_ingester::HeadSnapshot;

/// Where recent (not yet flushed) data comes from: the in-process ingester
/// in single-process mode, the ingesters over Arrow Flight in a cluster
/// (`fathom_ingester::FlightHeads`); both implementations are in
/// `heads.rs`.
#[async_trait::async_trait]
pub trait HeadSource: Send + Sync + 'static {
    /// Every head's data of `tenant` in `[start, end]` (nanoseconds).
    async fn snapshot(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<HeadSnapshot>, QueryError>;

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
    /// Bytes the running queries' operators hold now (the
    /// `fathom_querier_query_memory_bytes` gauge).
    pub fn query_memory_bytes(&self) -> i64 {
        self.inner.metrics.memory.get()
    }

    /// Queries stopped because their caller went away, since start.
    pub fn queries_cancelled(&self) -> u64 {
        self.inner.metrics.cancelled.get()
    }

    pub fn new(
        cfg: Config,
        head: Arc<dyn HeadSource>,
        index: Arc<dyn BlockIndex>,
        store: Arc<dyn ObjectStore>,
        exec: Executor,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Self, QueryError> {
        let metrics = engine::Metrics::register(registry);
        // Queries run on `exec`; their I/O goes back to the runtime that
        // builds the querier, the I/O one ([`io`]).
        let (head, index, store) = match tokio::runtime::Handle::try_current() {
            Ok(io) => (
                Arc::new(io::IoHeads::new(head, io.clone())) as Arc<dyn HeadSource>,
                Arc::new(io::IoIndex::new(index, io.clone())) as Arc<dyn BlockIndex>,
                Arc::new(io::IoStore::new(store, io)) as Arc<dyn ObjectStore>,
            ),
            Err(_) => (head, index, store),
        };
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

    /// The oldest and newest profile times of `tenant` (nanoseconds), from
    /// the heads and the block index (metadata only); `None` when it has
    /// no data.
    pub async fn time_span(&self, tenant: &TenantId) -> Result<Option<(i64, i64)>, QueryError> {
        let heads = self.inner.head.snapshot(tenant, i64::MIN, i64::MAX).await?;
        let blocks = self.blocks(tenant, i64::MIN, i64::MAX).await?;
        Ok(heads
            .iter()
            .flat_map(|h| {
                h.series
                    .iter()
                    .map(|s| (s.min_time_nanos, s.max_time_nanos))
            })
            .chain(blocks.iter().map(|b| (b.min_time_nanos, b.max_time_nanos)))
            .reduce(|(lo, hi), (l, h)| (lo.min(l), hi.max(h))))
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
/// unit tests (of this crate and of the edges, `fathom-query-api`).
pub fn test_querier(index: Arc<dyn BlockIndex>) -> Querier {
    test_querier_on(
        Config::default(),
        index,
        Arc::new(object_store::memory::InMemory::new()),
    )
}

/// A querier over no heads, `index` and `store`, for unit tests.
pub fn test_querier_on(
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
        ) -> Result<Vec<HeadSnapshot>, QueryError> {
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
            Err(IndexError::new("metastore unreachable"))
        }
        async fn blocks(&self, _t: &str, _s: i64, _e: i64) -> Result<Vec<BlockMeta>, IndexError> {
            Err(IndexError::new("metastore unreachable"))
        }
        async fn all(&self) -> Result<Vec<BlockMeta>, IndexError> {
            Err(IndexError::new("metastore unreachable"))
        }
        async fn remove(&self, _t: &str, _ids: &[String]) -> Result<(), IndexError> {
            Err(IndexError::new("metastore unreachable"))
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
    }

    /// Query, head-read and SQL errors reach clients through the API's one
    /// mapping, with the same status on HTTP and gRPC.
    #[test]
    fn errors_map_to_one_status() {
        use fathom_api::ApiError;
        use tonic::Code;
        type Make = fn(String) -> SqlError;
        let sql: [(Make, u16, Code); 7] = [
            (SqlError::Invalid, 400, Code::InvalidArgument),
            (SqlError::ReadOnly, 403, Code::PermissionDenied),
            (SqlError::NotFound, 404, Code::NotFound),
            (SqlError::ResourcesExhausted, 429, Code::ResourceExhausted),
            (SqlError::Timeout, 504, Code::DeadlineExceeded),
            (SqlError::Unavailable, 503, Code::Unavailable),
            (SqlError::Internal, 500, Code::Internal),
        ];
        for (make, http, code) in sql {
            let api = ApiError::from(make("why".into()));
            assert_eq!(api.status().as_u16(), http, "{api}");
            assert_eq!(api.grpc_code(), code, "{api}");
            let status = tonic::Status::from(ApiError::from(make("why".into())));
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), "why");
        }

        // A head read that misses more ingesters than replication allows:
        // 503, naming each failure, the failures kept as values.
        let membership = fathom_api::cluster::MembershipError::NotListed {
            source: Arc::new(std::io::Error::other("no leader")),
        };
        let read = fathom_ingester::ReadError::Quorum {
            failed: 2,
            live: 3,
            down: Vec::new(),
            tolerated: 1,
            errors: vec![
                fathom_ingester::ReadError::NoSchema {
                    ingester: "i1".into(),
                },
                fathom_ingester::ReadError::from(membership),
            ],
        };
        let q = QueryError::from(read);
        assert!(std::error::Error::source(&q).is_some());
        let api = ApiError::from(q);
        assert_eq!(api.status().as_u16(), 503);
        assert_eq!(api.grpc_code(), Code::Unavailable);
        let m = api.to_string();
        assert!(
            m.contains("2 of 3 live ingesters could not be read (at most 1 may be missed)"),
            "{m}"
        );
        assert!(m.contains("i1") && m.contains("no leader"), "{m}");
    }

    #[tokio::test]
    async fn an_unreachable_index_fails_queries_as_unavailable() {
        let q = test_querier(Arc::new(Down));
        let t = TenantId::new("t1").unwrap();
        let err = q.series(&t, None, 0, 1000).await.unwrap_err();
        assert!(
            matches!(&err, QueryError::Index(m) if m.to_string().contains("unreachable")),
            "{err}"
        );
        // The index's error is kept as the source, not a string.
        let index = std::error::Error::source(&err).expect("the index error");
        assert!(std::error::Error::source(index).is_some(), "{index}");
        let api = fathom_api::ApiError::from(err);
        assert!(matches!(api, fathom_api::ApiError::Unavailable(_)), "{api}");
        assert!(matches!(
            q.blocks(&t, 0, 1000).await,
            Err(QueryError::Index(_))
        ));
    }
}
