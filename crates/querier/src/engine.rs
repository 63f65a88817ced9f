//! Planning and DataFusion execution.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use tracing::Instrument;

use arrow::array::{Array, AsArray, FixedSizeBinaryArray, RecordBatch};
use arrow::datatypes::Int64Type;
use datafusion::common::ScalarValue;
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::functions_aggregate::expr_fn::{count_distinct, sum};
use datafusion::prelude::*;
use fathom_block::{BlockMeta, SeriesRow, columns, files, samples_schema};
use fathom_model::{Id, Labels, ProfileType, Selector, Symbols, TenantId};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::{BlockInfo, HeadSnapshot, Querier, QueryError};

pub(crate) const STORE_URL: &str = "fathom://store";

#[derive(Clone)]
pub(crate) struct Metrics {
    pub(crate) queries: Counter,
    pub(crate) duration: Histogram,
    pub(crate) cache_hits: Counter,
    pub(crate) cache_misses: Counter,
    pub(crate) rows: Counter,
    pub(crate) sql_sources: Counter,
    pub(crate) rollup_reads: Counter,
    pub(crate) sql_rollup_scans: Counter,
    /// Bytes reserved by the DataFusion operators of running queries.
    pub(crate) memory: Gauge,
    pub(crate) cancelled: Counter,
    pub(crate) timed_out: Counter,
    pub(crate) over_memory: Counter,
    /// Queries whose stacks left the heads between plan and lookup.
    pub(crate) late_symbols: Counter,
}

impl Metrics {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Metrics {
            queries: Counter::default(),
            duration: Histogram::new([
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            rows: Counter::default(),
            sql_sources: Counter::default(),
            rollup_reads: Counter::default(),
            sql_rollup_scans: Counter::default(),
            memory: Gauge::default(),
            cancelled: Counter::default(),
            timed_out: Counter::default(),
            over_memory: Counter::default(),
            late_symbols: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("fathom_querier");
        r.register("queries", "Queries executed", m.queries.clone());
        r.register(
            "query_duration_seconds",
            "Time to execute a query",
            m.duration.clone(),
        );
        r.register(
            "block_cache_hits",
            "Block metadata and symbol cache hits",
            m.cache_hits.clone(),
        );
        r.register(
            "block_cache_misses",
            "Block metadata and symbol cache misses",
            m.cache_misses.clone(),
        );
        r.register(
            "late_symbol_lookups",
            "Queries whose stacks a head cut took into a block between planning and symbol lookup (found there by listing the index again)",
            m.late_symbols.clone(),
        );
        r.register("result_rows", "Rows produced by DataFusion", m.rows.clone());
        r.register(
            "sql_scanned_sources",
            "Heads and blocks read by SQL scans of profiles and samples (after time and label pushdown)",
            m.sql_sources.clone(),
        );
        r.register(
            "rollup_reads",
            "Blocks whose whole hours or days a merge read from rollup.parquet instead of raw samples",
            m.rollup_reads.clone(),
        );
        r.register(
            "sql_rollup_scans",
            "SQL scans of profiles that only sum values, answered from totals per series and stack (rollups for whole buckets)",
            m.sql_rollup_scans.clone(),
        );
        r.register(
            "query_memory_bytes",
            "Bytes reserved by the operators of running merge, range and diff queries (under each query's memory limit)",
            m.memory.clone(),
        );
        r.register(
            "queries_cancelled",
            "Queries stopped because their client went away",
            m.cancelled.clone(),
        );
        r.register(
            "queries_timed_out",
            "Queries stopped at their timeout",
            m.timed_out.clone(),
        );
        r.register(
            "queries_over_memory",
            "Queries refused for needing more than their memory limit",
            m.over_memory.clone(),
        );
        m
    }
}

/// A query's memory pool: a greedy pool of the query's limit that also
/// counts its reservations into `fathom_querier_query_memory_bytes`, so
/// that the gauge shows what running queries hold (and that a cancelled
/// query gives it back).
#[derive(Debug)]
struct MeteredPool {
    inner: GreedyMemoryPool,
    gauge: Gauge,
}

impl std::fmt::Display for MeteredPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "metered({})", self.inner)
    }
}

fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl MemoryPool for MeteredPool {
    fn name(&self) -> &str {
        "fathom_query"
    }
    fn register(&self, c: &MemoryConsumer) {
        self.inner.register(c)
    }
    fn unregister(&self, c: &MemoryConsumer) {
        self.inner.unregister(c)
    }
    fn grow(&self, r: &MemoryReservation, additional: usize) {
        self.inner.grow(r, additional);
        self.gauge.inc_by(as_i64(additional));
    }
    fn shrink(&self, r: &MemoryReservation, shrink: usize) {
        self.inner.shrink(r, shrink);
        self.gauge.dec_by(as_i64(shrink));
    }
    fn try_grow(&self, r: &MemoryReservation, additional: usize) -> datafusion::error::Result<()> {
        self.inner.try_grow(r, additional)?;
        self.gauge.inc_by(as_i64(additional));
        Ok(())
    }
    fn reserved(&self) -> usize {
        self.inner.reserved()
    }
    fn memory_limit(&self) -> MemoryLimit {
        self.inner.memory_limit()
    }
}

/// Stops the query task when the request that waits for it goes away
/// (a client that disconnects drops the request's future).
struct AbortOnDrop {
    handle: tokio::task::AbortHandle,
    done: bool,
    cancelled: Counter,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.done {
            self.handle.abort();
            self.cancelled.inc();
        }
    }
}

/// A merged profile: the total value per stack.
pub struct Merged {
    pub profile_type: ProfileType,
    pub samples: Vec<(Id, i64)>,
    pub symbols: Symbols,
    pub profiles: usize,
    pub period: i64,
    pub start: i64,
    pub end: i64,
}

impl Merged {
    pub fn total(&self) -> i64 {
        self.samples.iter().map(|s| s.1).sum()
    }
}

/// One series of a range query: labels and (unix ms, value) points.
pub struct RangeSeries {
    pub labels: Labels,
    pub points: Vec<(i64, i64)>,
    /// The distinct profiles behind each point (same order as `points`)
    /// when counted ([`Querier::range_counting`]), else empty.
    pub profiles: Vec<i64>,
}

enum SourceKind {
    Head(Vec<RecordBatch>),
    Block(Box<BlockMeta>),
}

struct Source {
    kind: SourceKind,
    series: Vec<Id>,
    exclude: Vec<Id>,
}

/// The rows a summable frame gives ([`Querier::summable_frame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `(stack_id, value)`: a merge.
    Stacks,
    /// `(series_id, stack_id, value)`: SQL sums.
    SeriesStacks,
    /// `(series_id, time_nanos, value)` where `time_nanos` is a sample's
    /// time or a rollup bucket's start that lies in the same step cell
    /// (`start + k * step`) as all of its bucket: a range query.
    Steps { step: i64 },
}

pub(crate) struct Plan {
    pub(crate) series: HashMap<Id, SeriesRow>,
    sources: Vec<Source>,
    pub(crate) profiles: usize,
    period: i64,
    /// The range planned, for the blocks a head was cut into since
    /// ([`Querier::resolve_late`]).
    start: i64,
    end: i64,
}

fn id_lit(id: &Id) -> Expr {
    lit(ScalarValue::FixedSizeBinary(16, Some(id.0.to_vec())))
}

fn time_ok(t: i64, start: i64, end: i64) -> bool {
    t >= start && t <= end
}

/// For each inclusive span, whether it overlaps no other span.
fn alone_spans(spans: &[(i64, i64)]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_unstable_by_key(|&i| spans[i].0);
    let mut out = vec![false; spans.len()];
    let mut max_before = i64::MIN;
    for (k, &i) in order.iter().enumerate() {
        let (min, max) = spans[i];
        let before = k > 0 && max_before >= min;
        let after = order.get(k + 1).is_some_and(|&j| spans[j].0 <= max);
        out[i] = !before && !after;
        if k == 0 || max > max_before {
            max_before = max;
        }
    }
    out
}

impl Plan {
    /// Heads and blocks the plan reads.
    pub(crate) fn source_count(&self) -> usize {
        self.sources.len()
    }
}

impl Querier {
    #[tracing::instrument(name = "block_index_read", skip_all, fields(block = %meta.id, cached, series, profiles))]
    async fn block_info(&self, meta: &BlockMeta) -> Result<Arc<BlockInfo>, QueryError> {
        let inner = &self.inner;
        let span = tracing::Span::current();
        if let Some(b) = inner.block_info.lock().get(&meta.id) {
            inner.metrics.cache_hits.inc();
            span.record("cached", true);
            return Ok(b);
        }
        span.record("cached", false);
        inner.metrics.cache_misses.inc();
        let series = fathom_block::read_series(inner.store.as_ref(), meta).await?;
        let profiles = fathom_block::read_profiles(inner.store.as_ref(), meta).await?;
        span.record("series", series.len() as i64);
        span.record("profiles", profiles.len() as i64);
        let info = Arc::new(BlockInfo { series, profiles });
        inner.block_info.lock().put(meta.id.clone(), info.clone());
        Ok(info)
    }

    #[tracing::instrument(name = "block_symbols_read", skip_all, fields(block = %meta.id, cached))]
    async fn block_symbols(&self, meta: &BlockMeta) -> Result<Arc<Symbols>, QueryError> {
        let inner = &self.inner;
        if let Some(b) = inner.block_symbols.lock().get(&meta.id) {
            inner.metrics.cache_hits.inc();
            tracing::Span::current().record("cached", true);
            return Ok(b);
        }
        tracing::Span::current().record("cached", false);
        inner.metrics.cache_misses.inc();
        let s = Arc::new(fathom_block::read_symbols(inner.store.as_ref(), meta).await?);
        inner.block_symbols.lock().put(meta.id.clone(), s.clone());
        Ok(s)
    }

    /// Heads first, then the index: a profile that moves from a head into a
    /// block in between is then seen twice (and deduplicated), never zero times.
    #[tracing::instrument(name = "query_plan", skip_all, fields(%tenant, start, end, heads, blocks, profiles))]
    pub(crate) async fn plan(
        &self,
        tenant: &TenantId,
        sel: &Selector,
        start: i64,
        end: i64,
    ) -> Result<Plan, QueryError> {
        let heads = self.inner.head.snapshot(tenant, start, end).await?;
        let blocks = self.inner.index.blocks(tenant.as_str(), start, end).await?;
        let span = tracing::Span::current();
        span.record("heads", heads.len() as i64);
        span.record("blocks", blocks.len() as i64);
        let mut plan = Plan {
            series: HashMap::new(),
            sources: Vec::new(),
            profiles: 0,
            period: 0,
            start,
            end,
        };
        // Copies of a profile sit in sources whose time spans overlap (the
        // profile id covers its time): a source that overlaps no other one
        // holds no copy of another's profiles, and skips the id set (a
        // month of compacted blocks is millions of profiles).
        let mut spans: Vec<(i64, i64)> = heads
            .iter()
            .map(|h| {
                let min = h.profiles.iter().map(|p| p.time_nanos).min();
                let max = h.profiles.iter().map(|p| p.time_nanos).max();
                (min.unwrap_or(i64::MAX), max.unwrap_or(i64::MIN))
            })
            .collect();
        spans.extend(blocks.iter().map(|b| (b.min_time_nanos, b.max_time_nanos)));
        let alone = alone_spans(&spans);
        let mut alone = alone.into_iter();
        let mut seen: HashSet<Id> = HashSet::new();
        let mut add = |plan: &mut Plan,
                       kind: SourceKind,
                       series: &[SeriesRow],
                       profiles: &[fathom_block::ProfileRow],
                       alone: bool| {
            let mut matched: HashSet<Id> = HashSet::new();
            for s in series {
                if s.min_time_nanos <= end
                    && s.max_time_nanos >= start
                    && sel.matches(&s.profile_type, &s.labels)
                {
                    matched.insert(s.series_id);
                    plan.series.entry(s.series_id).or_insert_with(|| s.clone());
                }
            }
            if matched.is_empty() {
                return;
            }
            let mut exclude = Vec::new();
            let mut any = false;
            for p in profiles {
                if !matched.contains(&p.series_id) || !time_ok(p.time_nanos, start, end) {
                    continue;
                }
                if alone || seen.insert(p.profile_id) {
                    any = true;
                    plan.profiles += 1;
                    plan.period = plan.period.max(p.period);
                } else {
                    exclude.push(p.profile_id);
                }
            }
            if any {
                plan.sources.push(Source {
                    kind,
                    series: matched.into_iter().collect(),
                    exclude,
                });
            }
        };
        for h in heads {
            let HeadSnapshot {
                series,
                profiles,
                samples,
            } = h;
            let a = alone.next().unwrap_or(false);
            add(&mut plan, SourceKind::Head(samples), &series, &profiles, a);
        }
        for b in blocks {
            let info = self.block_info(&b).await?;
            let a = alone.next().unwrap_or(false);
            add(
                &mut plan,
                SourceKind::Block(Box::new(b)),
                &info.series,
                &info.profiles,
                a,
            );
        }
        span.record("profiles", plan.profiles as i64);
        Ok(plan)
    }

    /// A DataFusion session for one query, under the query's memory pool.
    fn session(&self) -> Result<SessionContext, QueryError> {
        let config = SessionConfig::new()
            .with_target_partitions(2)
            .with_batch_size(self.sql_config().batch_rows.max(1))
            .set_bool("datafusion.execution.parquet.pushdown_filters", true);
        Ok(SessionContext::new_with_config_rt(
            config,
            self.query_runtime()?,
        ))
    }

    /// A DataFrame over every source of the plan, filtered to the plan's
    /// series, the time range and each source's unique profiles.
    pub(crate) async fn frame(
        &self,
        plan: &Plan,
        start: i64,
        end: i64,
    ) -> Result<Option<(SessionContext, DataFrame)>, QueryError> {
        let ctx = self.session()?;
        let schema = samples_schema();
        let mut out: Option<DataFrame> = None;
        for src in &plan.sources {
            let df = match &src.kind {
                SourceKind::Head(b) => {
                    if b.is_empty() {
                        continue;
                    }
                    ctx.read_batches(b.clone())?
                }
                SourceKind::Block(m) => {
                    let path = format!(
                        "{STORE_URL}/{}",
                        fathom_block::block_file(&m.tenant, &m.id, files::SAMPLES)
                    );
                    ctx.read_parquet(path, ParquetReadOptions::default().schema(&schema))
                        .await?
                }
            };
            let mut pred = col(columns::TIME_NANOS)
                .gt_eq(lit(start))
                .and(col(columns::TIME_NANOS).lt_eq(lit(end)));
            pred = pred.and(
                col(columns::SERIES_ID).in_list(src.series.iter().map(id_lit).collect(), false),
            );
            if !src.exclude.is_empty() {
                pred = pred.and(
                    col(columns::PROFILE_ID)
                        .in_list(src.exclude.iter().map(id_lit).collect(), true),
                );
            }
            let df = df.filter(pred)?;
            out = Some(match out {
                None => df,
                Some(acc) => acc.union(df)?,
            });
        }
        Ok(out.map(|df| (ctx, df)))
    }

    /// `(stack_id, value)` rows whose sum per stack is the merge of the
    /// plan: each block with rollups and no replica copies to skip gives
    /// the totals of its whole buckets inside `[start, end]` (days, then
    /// hours) and its raw samples for the rest; every other source its raw
    /// samples.
    pub(crate) async fn merge_frame(
        &self,
        plan: &Plan,
        start: i64,
        end: i64,
    ) -> Result<Option<(SessionContext, DataFrame)>, QueryError> {
        self.summable_frame(plan, start, end, Shape::Stacks).await
    }

    /// `(series_id, stack_id, value)`, or `(stack_id, value)` unless
    /// `per_series`: the value totals per series and stack (or per stack)
    /// of the plan in `[start, end]`, read as [`Querier::merge_frame`]
    /// reads (rollups for whole buckets): what SQL sums of `profiles` read
    /// ([`crate::totals`]).
    pub(crate) async fn totals_frame(
        &self,
        plan: &Plan,
        start: i64,
        end: i64,
        per_series: bool,
    ) -> Result<Option<(SessionContext, DataFrame)>, QueryError> {
        let (shape, keys) = if per_series {
            (
                Shape::SeriesStacks,
                vec![col(columns::SERIES_ID), col(columns::STACK_ID)],
            )
        } else {
            (Shape::Stacks, vec![col(columns::STACK_ID)])
        };
        let Some((ctx, df)) = self.summable_frame(plan, start, end, shape).await? else {
            return Ok(None);
        };
        let df = df.aggregate(keys, vec![sum(col(columns::VALUE)).alias("value")])?;
        Ok(Some((ctx, df)))
    }

    /// Rows whose sums per stack, per (series, stack) or per (series, step)
    /// are those of the plan (`shape`); whole rollup buckets where a block
    /// has them and the plan allows, raw samples elsewhere.
    async fn summable_frame(
        &self,
        plan: &Plan,
        start: i64,
        end: i64,
        shape: Shape,
    ) -> Result<Option<(SessionContext, DataFrame)>, QueryError> {
        let ctx = self.session()?;
        let schema = samples_schema();
        let rollup_schema = fathom_block::rollup_schema();
        let mut out: Option<DataFrame> = None;
        // `time` is the column that places a row in time: `time_nanos` of a
        // sample, `bucket_start_nanos` of a rollup row.
        let mut push = |df: DataFrame, time: &str| -> Result<(), QueryError> {
            let df = match shape {
                Shape::Stacks => df.select(vec![col(columns::STACK_ID), col(columns::VALUE)])?,
                Shape::SeriesStacks => df.select(vec![
                    col(columns::SERIES_ID),
                    col(columns::STACK_ID),
                    col(columns::VALUE),
                ])?,
                Shape::Steps { .. } => df.select(vec![
                    col(columns::SERIES_ID),
                    col(time).alias("time_nanos"),
                    col(columns::VALUE),
                ])?,
            };
            out = Some(match out.take() {
                None => df,
                Some(acc) => acc.union(df)?,
            });
            Ok(())
        };
        // A range query's step cells are `start + k * step`; a rollup
        // bucket `[b, b + w)` answers for its rows only inside one cell.
        let same_cell = |b: Expr, w: i64| -> Option<Expr> {
            match shape {
                Shape::Steps { step } => Some(
                    ((b.clone() - lit(start)) / lit(step))
                        .eq((b + lit(w - 1) - lit(start)) / lit(step)),
                ),
                _ => None,
            }
        };
        for src in &plan.sources {
            let series_in =
                col(columns::SERIES_ID).in_list(src.series.iter().map(id_lit).collect(), false);
            let raw_time = |a: i64, b: i64| {
                col(columns::TIME_NANOS)
                    .gt_eq(lit(a))
                    .and(col(columns::TIME_NANOS).lt_eq(lit(b)))
            };
            match &src.kind {
                SourceKind::Head(b) => {
                    if b.is_empty() {
                        continue;
                    }
                    let mut pred = raw_time(start, end).and(series_in);
                    if !src.exclude.is_empty() {
                        pred = pred.and(
                            col(columns::PROFILE_ID)
                                .in_list(src.exclude.iter().map(id_lit).collect(), true),
                        );
                    }
                    push(
                        ctx.read_batches(b.clone())?.filter(pred)?,
                        columns::TIME_NANOS,
                    )?;
                }
                SourceKind::Block(m) => {
                    // Rollup widths a step can use: at most the step.
                    let widths: Vec<i64> = m
                        .rollup_widths_nanos
                        .iter()
                        .copied()
                        .filter(|w| match shape {
                            Shape::Steps { step } => *w <= step,
                            _ => true,
                        })
                        .collect();
                    let cover = if self.inner.cfg.use_rollups && src.exclude.is_empty() {
                        fathom_block::Cover::plan(start, end, &widths)
                    } else {
                        fathom_block::Cover {
                            rollups: Vec::new(),
                            raw: vec![(start, end)],
                        }
                    };
                    if !cover.rollups.is_empty() {
                        self.inner.metrics.rollup_reads.inc();
                        let path = format!(
                            "{STORE_URL}/{}",
                            fathom_block::block_file(&m.tenant, &m.id, files::ROLLUP)
                        );
                        let buckets = cover
                            .rollups
                            .iter()
                            .map(|&(w, from, to)| {
                                let mut e = col(columns::BUCKET_WIDTH_NANOS)
                                    .eq(lit(w))
                                    .and(col(columns::BUCKET_START_NANOS).gt_eq(lit(from)))
                                    .and(col(columns::BUCKET_START_NANOS).lt(lit(to)));
                                if let Some(c) = same_cell(col(columns::BUCKET_START_NANOS), w) {
                                    e = e.and(c);
                                }
                                e
                            })
                            .reduce(Expr::or);
                        if let Some(buckets) = buckets {
                            let df = ctx
                                .read_parquet(
                                    path,
                                    ParquetReadOptions::default().schema(&rollup_schema),
                                )
                                .await?
                                .filter(series_in.clone().and(buckets))?;
                            push(df, columns::BUCKET_START_NANOS)?;
                        }
                    }
                    // Raw: what the rollups leave, and, for a range query,
                    // the buckets that cross a step cell's edge.
                    let mut parts: Vec<Expr> =
                        cover.raw.iter().map(|&(a, b)| raw_time(a, b)).collect();
                    for &(w, from, to) in &cover.rollups {
                        let bucket = col(columns::TIME_NANOS) - (col(columns::TIME_NANOS) % lit(w));
                        if let Some(c) = same_cell(bucket, w) {
                            parts.push(
                                col(columns::TIME_NANOS)
                                    .gt_eq(lit(from))
                                    .and(col(columns::TIME_NANOS).lt(lit(to)))
                                    .and(Expr::Not(Box::new(c))),
                            );
                        }
                    }
                    let Some(times) = parts.into_iter().reduce(Expr::or) else {
                        continue;
                    };
                    let path = format!(
                        "{STORE_URL}/{}",
                        fathom_block::block_file(&m.tenant, &m.id, files::SAMPLES)
                    );
                    let mut pred = times.and(series_in);
                    if !src.exclude.is_empty() {
                        pred = pred.and(
                            col(columns::PROFILE_ID)
                                .in_list(src.exclude.iter().map(id_lit).collect(), true),
                        );
                    }
                    let df = ctx
                        .read_parquet(path, ParquetReadOptions::default().schema(&schema))
                        .await?
                        .filter(pred)?;
                    push(df, columns::TIME_NANOS)?;
                }
            }
        }
        Ok(out.map(|df| (ctx, df)))
    }

    /// A runtime for one query: its own memory pool of the query memory
    /// limit (the tenant's, else the flag), metered.
    pub(crate) fn query_runtime(&self) -> Result<Arc<RuntimeEnv>, QueryError> {
        let limit = self.sql_config().memory_limit;
        let pool = MeteredPool {
            inner: GreedyMemoryPool::new(limit),
            gauge: self.inner.metrics.memory.clone(),
        };
        let rt = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(pool))
            .build_arc()?;
        let url = ObjectStoreUrl::parse(STORE_URL)?;
        rt.register_object_store(url.as_ref(), self.inner.store.clone());
        Ok(rt)
    }

    /// Runs a query on the query runtime under the request's limits: its
    /// memory pool ([`Querier::query_runtime`]), its timeout, and
    /// cancellation when the caller goes away.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = Result<T, QueryError>> + Send + 'static,
    ) -> Result<T, QueryError> {
        let timer = std::time::Instant::now();
        self.inner.metrics.queries.inc();
        let cfg = self.sql_config();
        let f = f.instrument(tracing::info_span!("query_execute"));
        // The tenant's limits follow the query onto the query runtime.
        let task = match fathom_api::auth::request_limits() {
            Some(l) => self
                .inner
                .exec
                .spawn_handle(fathom_api::auth::with_request_limits(l, f)),
            None => self.inner.exec.spawn_handle(f),
        };
        let mut guard = AbortOnDrop {
            handle: task.abort_handle(),
            done: false,
            cancelled: self.inner.metrics.cancelled.clone(),
        };
        let r = tokio::time::timeout(cfg.timeout, task).await;
        guard.done = true;
        let r = match r {
            Err(_) => {
                guard.handle.abort();
                self.inner.metrics.timed_out.inc();
                return Err(QueryError::Timeout(format!(
                    "the query ran past its timeout of {} (query timeout) and was cancelled; narrow its time range or selector",
                    humantime::format_duration(cfg.timeout)
                )));
            }
            Ok(r) => r.map_err(|e| QueryError::Task(e.to_string()))?,
        };
        let r = r.map_err(|e| match e {
            QueryError::DataFusion(e)
                if matches!(
                    e.find_root(),
                    datafusion::error::DataFusionError::ResourcesExhausted(_)
                ) =>
            {
                self.inner.metrics.over_memory.inc();
                QueryError::ResourcesExhausted(format!(
                    "the query needs more memory than its limit of {} (query memory limit); narrow its time range or selector: {e}",
                    bytesize::ByteSize(cfg.memory_limit as u64)
                ))
            }
            e => e,
        });
        self.inner
            .metrics
            .duration
            .observe(timer.elapsed().as_secs_f64());
        r
    }

    /// Merges every profile of the selector's series in `[start, end]`.
    pub async fn merge(
        &self,
        tenant: &TenantId,
        sel: &Selector,
        start: i64,
        end: i64,
    ) -> Result<Merged, QueryError> {
        let Some(pt) = sel.profile_type.clone() else {
            return Err(QueryError::BadRequest(
                "the query needs a profile type, e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"app\"}".into(),
            ));
        };
        let this = self.clone();
        let tenant2 = tenant.clone();
        let sel = sel.clone();
        self.run(async move {
            let plan = this.plan(&tenant2, &sel, start, end).await?;
            let mut samples = Vec::new();
            if let Some((_ctx, df)) = this.merge_frame(&plan, start, end).await? {
                let batches = df
                    .aggregate(
                        vec![col(columns::STACK_ID)],
                        vec![sum(col(columns::VALUE)).alias("value")],
                    )?
                    .collect()
                    .await?;
                for b in &batches {
                    this.inner.metrics.rows.inc_by(b.num_rows() as u64);
                    let ids = b
                        .column(0)
                        .as_any()
                        .downcast_ref::<FixedSizeBinaryArray>()
                        .ok_or_else(|| QueryError::Task("stack_id column type".into()))?;
                    let vals = b.column(1).as_primitive::<Int64Type>();
                    for i in 0..b.num_rows() {
                        if vals.is_null(i) {
                            continue;
                        }
                        if let Some(id) = Id::from_slice(ids.value(i)) {
                            samples.push((id, vals.value(i)));
                        }
                    }
                }
            }
            samples.sort_unstable_by_key(|s| s.0);
            let stacks: Vec<Id> = samples.iter().map(|s| s.0).collect();
            let symbols = this.resolve(&tenant2, &plan, &stacks).await?;
            Ok(Merged {
                profile_type: pt,
                samples,
                symbols,
                profiles: plan.profiles,
                period: plan.period,
                start,
                end,
            })
        })
        .await
    }

    pub(crate) async fn resolve(
        &self,
        tenant: &TenantId,
        plan: &Plan,
        stacks: &[Id],
    ) -> Result<Symbols, QueryError> {
        let mut out = Symbols::default();
        if stacks.is_empty() {
            return Ok(out);
        }
        if plan
            .sources
            .iter()
            .any(|s| matches!(s.kind, SourceKind::Head(_)))
        {
            out = self.inner.head.symbols(tenant, stacks).await?;
        }
        for src in &plan.sources {
            if out.stacks.len() == stacks.len() {
                break;
            }
            if let SourceKind::Block(m) = &src.kind {
                let missing: Vec<&Id> = stacks
                    .iter()
                    .filter(|s| !out.stacks.contains_key(s))
                    .collect();
                let syms = self.block_symbols(m).await?;
                out.merge(&syms.subset(missing));
            }
        }
        if out.stacks.len() < stacks.len() {
            let missing: Vec<Id> = stacks
                .iter()
                .filter(|s| !out.stacks.contains_key(s))
                .copied()
                .collect();
            self.resolve_late(tenant, plan, &missing, &mut out).await?;
        }
        self.symbolize(tenant, &mut out).await;
        Ok(out)
    }

    /// Finds the stacks `missing` from the heads and the planned blocks in
    /// the blocks the index lists now: a head cut and stored between the
    /// plan and the symbol lookup has taken its symbols into a block that
    /// the plan either does not name or left out (its profiles were read
    /// from the head). A stack found nowhere stays missing.
    async fn resolve_late(
        &self,
        tenant: &TenantId,
        plan: &Plan,
        missing: &[Id],
        out: &mut Symbols,
    ) -> Result<(), QueryError> {
        let blocks = self
            .inner
            .index
            .blocks(tenant.as_str(), plan.start, plan.end)
            .await?;
        let mut left: Vec<&Id> = missing.iter().collect();
        for b in &blocks {
            if left.is_empty() {
                break;
            }
            let syms = self.block_symbols(b).await?;
            let found = syms.subset(left.iter().copied());
            left.retain(|id| !found.stacks.contains_key(*id));
            out.merge(&found);
        }
        self.inner.metrics.late_symbols.inc();
        tracing::debug!(
            %tenant,
            stacks = missing.len(),
            unresolved = left.len(),
            "stacks left the heads after the plan; looked up in the blocks listed now"
        );
        Ok(())
    }

    /// Every symbol the plan's sources hold: the heads' stacks in range and
    /// the blocks' whole tables.
    pub(crate) async fn all_symbols(
        &self,
        tenant: &TenantId,
        plan: &Plan,
    ) -> Result<Symbols, QueryError> {
        let mut head_stacks: HashSet<Id> = HashSet::new();
        let mut out = Symbols::default();
        for src in &plan.sources {
            match &src.kind {
                SourceKind::Head(batches) => {
                    for b in batches {
                        if let Some(ids) = b
                            .column_by_name(columns::STACK_ID)
                            .and_then(|c| c.as_any().downcast_ref::<FixedSizeBinaryArray>())
                        {
                            head_stacks.extend(
                                (0..ids.len()).filter_map(|i| Id::from_slice(ids.value(i))),
                            );
                        }
                    }
                }
                SourceKind::Block(m) => out.merge(&*self.block_symbols(m).await?),
            }
        }
        if !head_stacks.is_empty() {
            let ids: Vec<Id> = head_stacks.into_iter().collect();
            out.merge(&self.inner.head.symbols(tenant, &ids).await?);
            let missing: Vec<Id> = ids
                .into_iter()
                .filter(|id| !out.stacks.contains_key(id))
                .collect();
            if !missing.is_empty() {
                self.resolve_late(tenant, plan, &missing, &mut out).await?;
            }
        }
        self.symbolize(tenant, &mut out).await;
        Ok(out)
    }

    /// Sums values per series and step; `group_by` names the labels that
    /// split the result (all labels when empty).
    pub async fn range(
        &self,
        tenant: &TenantId,
        sel: &Selector,
        start: i64,
        end: i64,
        step: i64,
        group_by: Vec<String>,
    ) -> Result<Vec<RangeSeries>, QueryError> {
        self.range_counting(tenant, sel, start, end, step, group_by, false)
            .await
    }

    /// As [`Querier::range`], and with `count_profiles` also the number of
    /// distinct profiles behind each point ([`RangeSeries::profiles`]), for
    /// per-profile averages.
    #[allow(clippy::too_many_arguments)]
    pub async fn range_counting(
        &self,
        tenant: &TenantId,
        sel: &Selector,
        start: i64,
        end: i64,
        step: i64,
        group_by: Vec<String>,
        count_profiles: bool,
    ) -> Result<Vec<RangeSeries>, QueryError> {
        if sel.profile_type.is_none() {
            return Err(QueryError::BadRequest(
                "query_range needs a profile type in the selector".into(),
            ));
        }
        let this = self.clone();
        let tenant = tenant.clone();
        let sel = sel.clone();
        self.run(async move {
            let plan = this.plan(&tenant, &sel, start, end).await?;
            // (value, profiles) per labels and point.
            let mut acc: BTreeMap<Labels, BTreeMap<i64, (i64, i64)>> = BTreeMap::new();
            if step <= 0 {
                return Err(QueryError::BadRequest(format!(
                    "step {step} must be positive"
                )));
            }
            // Profile counts need raw rows; sums per step take whole
            // rollup buckets that lie inside one step.
            let frame = if count_profiles {
                this.frame(&plan, start, end).await?
            } else {
                this.summable_frame(&plan, start, end, Shape::Steps { step })
                    .await?
            };
            if let Some((_ctx, df)) = frame {
                let bucket = ((col(columns::TIME_NANOS) - lit(start)) / lit(step)).alias("bucket");
                let mut aggs = vec![sum(col(columns::VALUE)).alias("value")];
                if count_profiles {
                    aggs.push(count_distinct(col(columns::PROFILE_ID)).alias("profiles"));
                }
                let batches = df
                    .aggregate(vec![col(columns::SERIES_ID), bucket], aggs)?
                    .collect()
                    .await?;
                for b in &batches {
                    let ids = b
                        .column(0)
                        .as_any()
                        .downcast_ref::<FixedSizeBinaryArray>()
                        .ok_or_else(|| QueryError::Task("series_id column type".into()))?;
                    let buckets = b.column(1).as_primitive::<Int64Type>();
                    let vals = b.column(2).as_primitive::<Int64Type>();
                    let counts = count_profiles.then(|| b.column(3).as_primitive::<Int64Type>());
                    for i in 0..b.num_rows() {
                        let Some(sid) = Id::from_slice(ids.value(i)) else {
                            continue;
                        };
                        let Some(s) = plan.series.get(&sid) else {
                            continue;
                        };
                        let labels = if group_by.is_empty() {
                            s.labels.clone()
                        } else {
                            s.labels.keep(&group_by)
                        };
                        let t_ms = (start + buckets.value(i) * step) / 1_000_000;
                        let p = acc.entry(labels).or_default().entry(t_ms).or_default();
                        p.0 += vals.value(i);
                        p.1 += counts.map_or(0, |c| c.value(i));
                    }
                }
            }
            Ok(acc
                .into_iter()
                .map(|(labels, pts)| RangeSeries {
                    labels,
                    profiles: if count_profiles {
                        pts.values().map(|p| p.1).collect()
                    } else {
                        Vec::new()
                    },
                    points: pts.into_iter().map(|(t, p)| (t, p.0)).collect(),
                })
                .collect())
        })
        .await
    }

    /// Every series matching `sel` (any profile type when it names none)
    /// with data in `[start, end]`.
    pub async fn series(
        &self,
        tenant: &TenantId,
        sel: Option<&Selector>,
        start: i64,
        end: i64,
    ) -> Result<Vec<SeriesRow>, QueryError> {
        let all = Selector::default();
        let sel = sel.unwrap_or(&all);
        let mut out: BTreeMap<Id, SeriesRow> = BTreeMap::new();
        let mut take = |rows: &[SeriesRow]| {
            for s in rows {
                if s.min_time_nanos <= end
                    && s.max_time_nanos >= start
                    && sel.matches(&s.profile_type, &s.labels)
                {
                    out.entry(s.series_id).or_insert_with(|| s.clone());
                }
            }
        };
        for h in self.inner.head.snapshot(tenant, start, end).await? {
            take(&h.series);
        }
        for b in self.inner.index.blocks(tenant.as_str(), start, end).await? {
            let info = self.block_info(&b).await?;
            take(&info.series);
        }
        Ok(out.into_values().collect())
    }

    /// Distinct profile types with data in `[start, end]`.
    pub async fn profile_types(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<String>, QueryError> {
        let s = self.series(tenant, None, start, end).await?;
        let set: BTreeSet<String> = s.iter().map(|s| s.profile_type.to_string()).collect();
        Ok(set.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeadSource;
    use fathom_block::BlockIndex;
    use object_store::ObjectStore;

    #[test]
    fn id_literal_carries_the_16_id_bytes() {
        let id = Id::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        match id_lit(&id) {
            Expr::Literal(ScalarValue::FixedSizeBinary(16, Some(b)), _) => assert_eq!(b, id.0),
            other => panic!("not a 16-byte literal: {other:?}"),
        }
    }

    /// The in-process ingester, cut and stored into a block at a chosen
    /// point of a query: right after the head snapshot (so the plan finds
    /// the block too, and reads the profiles from the head), or just
    /// before the symbols are looked up (the plan names no block).
    struct CutDuring {
        ingester: Arc<fathom_ingester::Ingester>,
        after_snapshot: bool,
    }

    #[async_trait::async_trait]
    impl HeadSource for CutDuring {
        async fn snapshot(
            &self,
            tenant: &TenantId,
            start: i64,
            end: i64,
        ) -> Result<Vec<HeadSnapshot>, QueryError> {
            let s = self.ingester.snapshot(tenant, start, end);
            if self.after_snapshot {
                self.ingester.flush(None).await.unwrap();
            }
            Ok(vec![s])
        }

        async fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Result<Symbols, QueryError> {
            if !self.after_snapshot {
                self.ingester.flush(None).await.unwrap();
            }
            Ok(self.ingester.symbols(tenant, stacks))
        }
    }

    /// A head cut into a block while a query runs takes its symbols with
    /// it: the query still names every stack (from the block), where it
    /// used to find none and show one nameless stack.
    #[tokio::test]
    async fn a_head_cut_during_a_query_leaves_every_stack_named() {
        let pprof = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/testdata/pprof/google+pprof/internal/driver/testdata/cppbench.cpu_no_samples_type"
        ))
        .expect("the corpus (shared/testdata)");
        let p = fathom_pprof::decode(&pprof, &fathom_pprof::Limits::default()).unwrap();
        let n = fathom_pprof::normalize(&p, &Default::default()).unwrap();
        let want: HashSet<Id> = n
            .profiles
            .iter()
            .flat_map(|p| p.samples.iter().map(|s| s.stack))
            .collect();
        assert!(want.len() > 10, "the profile has many stacks");
        let pt = n.profiles[0].profile_type.clone();
        let t = n.profiles[0].time_nanos;
        let tenant = TenantId::new("t").unwrap();
        for after_snapshot in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
            let index = Arc::new(fathom_block::MemoryIndex::default());
            let mut registry = Registry::default();
            let ingester = fathom_ingester::Ingester::open(
                fathom_ingester::Config {
                    data_dir: dir.path().to_owned(),
                    name: "ingester".into(),
                    flush_interval: std::time::Duration::from_secs(3600),
                    max_head_bytes: 1 << 30,
                    max_head_memory: 1 << 30,
                },
                store.clone(),
                index.clone(),
                &mut registry,
            )
            .unwrap();
            ingester
                .write(fathom_model::IngestBatch {
                    tenant: tenant.clone(),
                    profiles: n.profiles.clone(),
                    symbols: n.symbols.clone(),
                })
                .await
                .unwrap();
            let q = Querier::new(
                crate::Config::default(),
                Arc::new(CutDuring {
                    ingester: ingester.clone(),
                    after_snapshot,
                }),
                index.clone(),
                store,
                crate::executor::Executor::new(1).unwrap(),
                &mut registry,
            )
            .unwrap();
            let sel = Selector {
                profile_type: Some(pt.clone()),
                matchers: Vec::new(),
            };
            let m = q.merge(&tenant, &sel, t - 1_000, t + 1_000).await.unwrap();
            let got: HashSet<Id> = m.samples.iter().map(|s| s.0).collect();
            assert_eq!(got, want, "after_snapshot={after_snapshot}: the samples");
            let named: HashSet<Id> = got
                .iter()
                .filter(|id| m.symbols.stacks.contains_key(*id))
                .copied()
                .collect();
            assert_eq!(
                named.len(),
                want.len(),
                "after_snapshot={after_snapshot}: stacks named"
            );
            assert_eq!(
                index.blocks("t", i64::MIN, i64::MAX).await.unwrap().len(),
                1,
                "the head was cut into a block during the query"
            );
            assert_eq!(q.inner.metrics.late_symbols.get(), 1);
        }
    }
}
