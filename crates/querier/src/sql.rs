//! SQL over profiles (`docs/sql.md`): the tables a tenant sees, as
//! DataFusion table providers over the same heads and blocks as every other
//! query, with time-range and label predicates pushed down into planning (a
//! one-hour query reads the heads and the blocks of that hour, nothing
//! else), and a few functions that make stacks pleasant to query.
//!
//! Every table is built for one tenant per query: the SQL text cannot name
//! another tenant's rows, whatever it says. Statements other than queries
//! are refused; each query runs under its own memory pool and deadline.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, FixedSizeBinaryBuilder,
    Int32Array, Int64Array, ListArray, ListBuilder, MapBuilder, RecordBatch, StringArray,
    StringBuilder, TimestampNanosecondArray,
};
use arrow::datatypes::{DataType, Field, Fields, Int64Type, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::datasource::MemTable;
use datafusion::execution::TaskContext;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Operator, TableProviderFilterPushDown, TableType, Volatility,
    create_udf,
};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{ExecutionPlan, SendableRecordBatchStream};
use datafusion::prelude::*;
use datafusion::sql::sqlparser::ast::Statement;
use fathom_block::columns;
use fathom_model::{Id, Labels, MatchOp, Matcher, ProfileType, Selector, Symbols, TenantId};
use futures::{StreamExt, TryStreamExt};
use parking_lot::Mutex;

use crate::engine::{Plan, STORE_URL};
use crate::{Querier, QueryError};

/// The catalog and schema the tables live in.
pub const CATALOG: &str = "fathom";
pub const SCHEMA: &str = "public";

/// The tables every tenant sees, in `fathom.public`.
pub const TABLES: [&str; 5] = ["profiles", "samples", "series", "stacks", "functions"];

/// SQL settings.
#[derive(Clone, Debug)]
pub struct SqlConfig {
    /// Memory one query may reserve for its operators (aggregations, sorts,
    /// joins); past it the query fails with a resources-exhausted error.
    pub memory_limit: usize,
    /// Wall time a query may take, planning and streaming included.
    pub timeout: Duration,
    /// Prepared statements kept per process (oldest closed first).
    pub max_prepared: usize,
    /// Rows per batch between the engine's operators (DataFusion's batch
    /// size): the unit in which a query's memory is reserved and released.
    pub batch_rows: usize,
}

impl Default for SqlConfig {
    fn default() -> Self {
        SqlConfig {
            memory_limit: 1 << 30,
            timeout: Duration::from_secs(60),
            max_prepared: 1024,
            batch_rows: 8192,
        }
    }
}

fn utc_nanos() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()))
}

fn id_field(name: &str) -> Field {
    Field::new(name, DataType::FixedSizeBinary(16), false)
}

/// `List<Utf8>` with a nullable item named `item`, the type the stack
/// functions take.
pub fn stack_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)))
}

pub fn labels_type() -> DataType {
    DataType::Map(
        Arc::new(Field::new(
            "entries",
            DataType::Struct(Fields::from(vec![
                Field::new("keys", DataType::Utf8, false),
                Field::new("values", DataType::Utf8, true),
            ])),
            false,
        )),
        false,
    )
}

/// The schema of a table, `None` for an unknown name.
pub fn table_schema(name: &str) -> Option<SchemaRef> {
    let fields = match name {
        "profiles" => vec![
            Field::new("time", utc_nanos(), false),
            Field::new("profile_type", DataType::Utf8, false),
            Field::new("service_name", DataType::Utf8, true),
            Field::new("labels", labels_type(), false),
            Field::new("stack", stack_type(), false),
            Field::new("leaf", DataType::Utf8, false),
            Field::new("value", DataType::Int64, false),
            id_field("profile_id"),
            id_field("series_id"),
            id_field("stack_id"),
        ],
        "samples" => vec![
            Field::new("time", utc_nanos(), false),
            id_field("series_id"),
            id_field("profile_id"),
            id_field("stack_id"),
            Field::new("value", DataType::Int64, false),
        ],
        "series" => vec![
            id_field("series_id"),
            Field::new("profile_type", DataType::Utf8, false),
            Field::new("service_name", DataType::Utf8, true),
            Field::new("labels", labels_type(), false),
            Field::new("first_time", utc_nanos(), false),
            Field::new("last_time", utc_nanos(), false),
        ],
        "stacks" => vec![
            id_field("stack_id"),
            Field::new("stack", stack_type(), false),
            Field::new("leaf", DataType::Utf8, false),
            Field::new("depth", DataType::Int32, false),
        ],
        "functions" => vec![
            id_field("function_id"),
            Field::new("name", DataType::Utf8, false),
            Field::new("display_name", DataType::Utf8, false),
            Field::new("system_name", DataType::Utf8, false),
            Field::new("filename", DataType::Utf8, false),
            Field::new("start_line", DataType::Int64, false),
        ],
        _ => return None,
    };
    Some(Arc::new(Schema::new(fields)))
}

fn external(e: QueryError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// What the predicates of a scan say about time and series.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Pushed {
    pub(crate) start: i64,
    pub(crate) end: i64,
    pub(crate) sel: Selector,
}

impl Default for Pushed {
    fn default() -> Self {
        Pushed {
            start: i64::MIN,
            end: i64::MAX,
            sel: Selector::default(),
        }
    }
}

/// A literal as nanoseconds, if it is a timestamp or an integer.
pub(crate) fn literal_nanos(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::TimestampNanosecond(Some(n), _) => Some(*n),
        ScalarValue::TimestampMicrosecond(Some(n), _) => n.checked_mul(1_000),
        ScalarValue::TimestampMillisecond(Some(n), _) => n.checked_mul(1_000_000),
        ScalarValue::TimestampSecond(Some(n), _) => n.checked_mul(1_000_000_000),
        ScalarValue::Int64(Some(n)) => Some(*n),
        _ => None,
    }
}

fn literal_str(e: &Expr) -> Option<&str> {
    match e {
        Expr::Literal(ScalarValue::Utf8(Some(s)), _)
        | Expr::Literal(ScalarValue::Utf8View(Some(s)), _)
        | Expr::Literal(ScalarValue::LargeUtf8(Some(s)), _) => Some(s),
        _ => None,
    }
}

/// The column an expression reads, looking through casts.
fn column_name(e: &Expr) -> Option<&str> {
    match e {
        Expr::Column(c) => Some(c.name.as_str()),
        Expr::Cast(c) => column_name(&c.expr),
        Expr::TryCast(c) => column_name(&c.expr),
        _ => None,
    }
}

/// `labels['name']`, planned as `get_field(labels, 'name')`.
fn label_access(e: &Expr) -> Option<&str> {
    let Expr::ScalarFunction(f) = e else {
        return None;
    };
    if f.func.name() != "get_field" || f.args.len() != 2 {
        return None;
    }
    if column_name(&f.args[0]) != Some("labels") {
        return None;
    }
    literal_str(&f.args[1])
}

/// `<expr> = '<string>'` (either way round): the expression and the string.
fn equals_string(e: &Expr) -> Option<(&Expr, &str)> {
    let Expr::BinaryExpr(BinaryExpr {
        left,
        op: Operator::Eq,
        right,
    }) = e
    else {
        return None;
    };
    match (literal_str(left), literal_str(right)) {
        (None, Some(s)) => Some((left.as_ref(), s)),
        (Some(s), None) => Some((right.as_ref(), s)),
        _ => None,
    }
}

/// `profile_type = '…'`: the profile type it names, if it parses back to
/// the same text (the column shows the parsed type's text).
fn profile_type_equality(e: &Expr) -> Option<&str> {
    let (c, s) = equals_string(e)?;
    if !matches!(c, Expr::Column(col) if col.name == "profile_type") {
        return None;
    }
    s.parse::<ProfileType>()
        .is_ok_and(|pt| pt.to_string() == s)
        .then_some(s)
}

/// Whether `f` is an equality the scan's selector enforces exactly, so
/// that DataFusion need not apply it again: `service_name = 'x'`,
/// `labels['k'] = 'x'` (a non-empty value: a selector's `k=""` also
/// matches series without `k`, SQL's does not) or `profile_type = 'x'`
/// (unless another profile type predicate of the scan names a different
/// one: the selector holds only one).
fn exact_selection(f: &Expr, all: &[&Expr]) -> bool {
    if let Some(pt) = profile_type_equality(f) {
        return all.iter().all(|o| {
            !o.column_refs().iter().any(|c| c.name == "profile_type")
                || profile_type_equality(o) == Some(pt)
        });
    }
    let Some((c, value)) = equals_string(f).filter(|(_, s)| !s.is_empty()) else {
        return false;
    };
    let label = match c {
        Expr::Column(col) if col.name == "service_name" => "service_name",
        c => match label_access(c) {
            Some(l) => l,
            None => return false,
        },
    };
    // Only when the selector takes it (a valid label name).
    Matcher::new(label, MatchOp::Eq, value).is_ok()
}

fn literal(e: &Expr) -> Option<&ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v),
        _ => None,
    }
}

impl Pushed {
    /// Folds every predicate this planner understands into a time range and
    /// a selector. The predicates stay applied by DataFusion as well, so one
    /// that is not understood only costs reading more.
    pub(crate) fn from_filters(filters: &[Expr]) -> Pushed {
        let mut p = Pushed::default();
        for f in filters {
            p.add(f);
        }
        p
    }

    fn add(&mut self, e: &Expr) {
        match e {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                if *op == Operator::And {
                    self.add(left);
                    self.add(right);
                    return;
                }
                // Normalise to `column op literal`.
                let (c, op, v) = match (left.as_ref(), right.as_ref()) {
                    (c, v) if literal(v).is_some() => (c, *op, v),
                    (v, c) if literal(v).is_some() => match op.swap() {
                        Some(op) => (c, op, v),
                        None => return,
                    },
                    _ => return,
                };
                self.compare(c, op, v);
            }
            Expr::Between(b) if !b.negated => {
                let ge = Expr::BinaryExpr(BinaryExpr::new(
                    b.expr.clone(),
                    Operator::GtEq,
                    b.low.clone(),
                ));
                let le = Expr::BinaryExpr(BinaryExpr::new(
                    b.expr.clone(),
                    Operator::LtEq,
                    b.high.clone(),
                ));
                self.add(&ge);
                self.add(&le);
            }
            _ => {}
        }
    }

    fn compare(&mut self, c: &Expr, op: Operator, v: &Expr) {
        let Some(value) = literal(v) else { return };
        if let Some(label) = label_access(c) {
            if op == Operator::Eq
                && let Some(s) = literal_str(v)
                && let Ok(m) = Matcher::new(label, MatchOp::Eq, s)
            {
                self.sel.matchers.push(m);
            }
            return;
        }
        match (column_name(c), op) {
            (Some("time" | "first_time" | "last_time"), _) => {
                let Some(n) = literal_nanos(value) else {
                    return;
                };
                match op {
                    Operator::Eq => {
                        self.start = self.start.max(n);
                        self.end = self.end.min(n);
                    }
                    Operator::Gt => self.start = self.start.max(n.saturating_add(1)),
                    Operator::GtEq => self.start = self.start.max(n),
                    Operator::Lt => self.end = self.end.min(n.saturating_sub(1)),
                    Operator::LtEq => self.end = self.end.min(n),
                    _ => {}
                }
            }
            (Some("service_name"), Operator::Eq) => {
                if let Some(s) = literal_str(v)
                    && let Ok(m) = Matcher::new("service_name", MatchOp::Eq, s)
                {
                    self.sel.matchers.push(m);
                }
            }
            (Some("profile_type"), Operator::Eq) => {
                if let Some(s) = literal_str(v)
                    && let Ok(pt) = s.parse::<ProfileType>()
                {
                    self.sel.profile_type = Some(pt);
                }
            }
            _ => {}
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Profiles,
    Samples,
    Series,
    Stacks,
    Functions,
}

/// One table of one tenant.
#[derive(Clone)]
pub(crate) struct Table {
    pub(crate) q: Querier,
    pub(crate) tenant: TenantId,
    pub(crate) kind: Kind,
    pub(crate) schema: SchemaRef,
    /// Set by [`crate::totals::TotalsRule`] on a `profiles` scan whose
    /// rows are only summed; its rows are then value totals read from
    /// rollups where whole buckets allow, with no time or profile id.
    pub(crate) totals: Option<Totals>,
}

/// What a sums-only scan of `profiles` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Totals {
    /// The exact time range, inclusive nanoseconds.
    pub(crate) start: i64,
    pub(crate) end: i64,
    /// Totals per (series, stack) when the query reads a column of the
    /// series (its id, type, service or labels); per stack otherwise,
    /// which is what a flame graph merge sums.
    pub(crate) per_series: bool,
}

/// The `profiles` columns that come from a row's series.
pub(crate) const SERIES_COLUMNS: [&str; 4] =
    ["series_id", "profile_type", "service_name", "labels"];

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} of tenant {}", self.kind, self.tenant.as_str())
    }
}

#[async_trait::async_trait]
impl TableProvider for Table {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
        // Equalities that the plan's selector enforces exactly are Exact for
        // the tables of rows (DataFusion then neither applies them again
        // nor reads their columns); everything else is Inexact: DataFusion
        // applies it again above the scan.
        let rows = matches!(self.kind, Kind::Profiles | Kind::Samples);
        Ok(filters
            .iter()
            .map(|f| {
                if rows && exact_selection(f, filters) {
                    TableProviderFilterPushDown::Exact
                } else {
                    TableProviderFilterPushDown::Inexact
                }
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        let pushed = Pushed::from_filters(filters);
        let projected = match projection {
            Some(p) => Arc::new(self.schema.project(p)?),
            None => self.schema.clone(),
        };
        let cols: Vec<String> = projected
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        match self.kind {
            Kind::Profiles | Kind::Samples => {
                let q = &self.q;
                let (start, end) = self
                    .totals
                    .map_or((pushed.start, pushed.end), |t| (t.start, t.end));
                let plan = q
                    .plan(&self.tenant, &pushed.sel, start, end)
                    .await
                    .map_err(external)?;
                q.inner
                    .metrics
                    .sql_sources
                    .inc_by(plan.source_count() as u64);
                let frame = if let Some(t) = self.totals {
                    q.inner.metrics.sql_rollup_scans.inc();
                    q.totals_frame(&plan, start, end, t.per_series).await
                } else {
                    q.frame(&plan, start, end).await
                };
                let Some((_ctx, df)) = frame.map_err(external)? else {
                    return Ok(Arc::new(EmptyExec::new(projected)));
                };
                let inner = df.create_physical_plan().await?;
                let mapper = Arc::new(Mapper::new(
                    q.clone(),
                    self.tenant.clone(),
                    Arc::new(plan),
                    projected.clone(),
                    cols,
                ));
                let n = inner.properties().output_partitioning().partition_count();
                let parts: Vec<Arc<dyn PartitionStream>> = (0..n)
                    .map(|partition| {
                        Arc::new(Part {
                            inner: inner.clone(),
                            partition,
                            mapper: mapper.clone(),
                        }) as Arc<dyn PartitionStream>
                    })
                    .collect();
                Ok(Arc::new(StreamingTableExec::try_new(
                    projected, parts, None, None, false, limit,
                )?))
            }
            Kind::Series | Kind::Stacks | Kind::Functions => {
                let batch = self.small_table(&pushed).await.map_err(external)?;
                let mem = MemTable::try_new(self.schema.clone(), vec![vec![batch]])?;
                mem.scan(_state, projection, &[], limit).await
            }
        }
    }
}

impl Table {
    /// The tables that are built whole: series, stacks, functions.
    async fn small_table(&self, pushed: &Pushed) -> Result<RecordBatch, QueryError> {
        let q = &self.q;
        match self.kind {
            Kind::Series => {
                let rows = q
                    .series(&self.tenant, Some(&pushed.sel), pushed.start, pushed.end)
                    .await?;
                let mut ids = FixedSizeBinaryBuilder::new(16);
                let mut pt = StringBuilder::new();
                let mut svc = StringBuilder::new();
                let mut labels = labels_builder();
                let (mut first, mut last) = (Vec::new(), Vec::new());
                for s in &rows {
                    ids.append_value(s.series_id.0).map_err(arrow_err)?;
                    pt.append_value(s.profile_type.to_string());
                    svc.append_option(s.labels.get("service_name"));
                    append_labels(&mut labels, &s.labels)?;
                    first.push(s.min_time_nanos);
                    last.push(s.max_time_nanos);
                }
                let cols: Vec<ArrayRef> = vec![
                    Arc::new(ids.finish()),
                    Arc::new(pt.finish()),
                    Arc::new(svc.finish()),
                    Arc::new(labels.finish()),
                    Arc::new(TimestampNanosecondArray::from(first).with_timezone("UTC")),
                    Arc::new(TimestampNanosecondArray::from(last).with_timezone("UTC")),
                ];
                RecordBatch::try_new(self.schema.clone(), cols).map_err(arrow_err)
            }
            Kind::Stacks | Kind::Functions => {
                let plan = q
                    .plan(&self.tenant, &pushed.sel, pushed.start, pushed.end)
                    .await?;
                let symbols = q.all_symbols(&self.tenant, &plan).await?;
                if self.kind == Kind::Stacks {
                    stacks_batch(&self.schema, &symbols)
                } else {
                    functions_batch(&self.schema, &symbols)
                }
            }
            Kind::Profiles | Kind::Samples => Err(QueryError::Task("not a small table".into())),
        }
    }
}

fn arrow_err(e: arrow::error::ArrowError) -> QueryError {
    QueryError::DataFusion(e.into())
}

fn labels_builder() -> MapBuilder<StringBuilder, StringBuilder> {
    MapBuilder::new(None, StringBuilder::new(), StringBuilder::new())
}

fn append_labels(
    b: &mut MapBuilder<StringBuilder, StringBuilder>,
    labels: &Labels,
) -> Result<(), QueryError> {
    for (k, v) in labels.iter() {
        b.keys().append_value(k);
        b.values().append_value(v);
    }
    b.append(true).map_err(arrow_err)
}

/// Frames of a stack as the API shows them (root first, display names).
fn display_frames(symbols: &Symbols, stack: &Id) -> Vec<String> {
    symbols.frames_by(stack, fathom_pprof::display_name)
}

fn stacks_batch(schema: &SchemaRef, symbols: &Symbols) -> Result<RecordBatch, QueryError> {
    let mut ids: Vec<&Id> = symbols.stacks.keys().collect();
    ids.sort_unstable();
    let mut idb = FixedSizeBinaryBuilder::new(16);
    let mut stack = ListBuilder::new(StringBuilder::new());
    let mut leaf = StringBuilder::new();
    let mut depth = Vec::with_capacity(ids.len());
    for id in ids {
        let frames = display_frames(symbols, id);
        idb.append_value(id.0).map_err(arrow_err)?;
        for f in &frames {
            stack.values().append_value(f);
        }
        stack.append(true);
        leaf.append_value(frames.last().map(String::as_str).unwrap_or(""));
        depth.push(i32::try_from(frames.len()).unwrap_or(i32::MAX));
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(idb.finish()),
        Arc::new(stack.finish()),
        Arc::new(leaf.finish()),
        Arc::new(Int32Array::from(depth)),
    ];
    RecordBatch::try_new(schema.clone(), cols).map_err(arrow_err)
}

fn functions_batch(schema: &SchemaRef, symbols: &Symbols) -> Result<RecordBatch, QueryError> {
    let mut fns: Vec<_> = symbols.functions.iter().collect();
    fns.sort_unstable_by_key(|(id, _)| **id);
    let mut idb = FixedSizeBinaryBuilder::new(16);
    let (mut name, mut display, mut system, mut file) = (
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
    );
    let mut line = Vec::with_capacity(fns.len());
    for (id, f) in fns {
        idb.append_value(id.0).map_err(arrow_err)?;
        name.append_value(&f.name);
        display.append_value(fathom_pprof::display_name(f));
        system.append_value(&f.system_name);
        file.append_value(&f.filename);
        line.push(f.start_line);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(idb.finish()),
        Arc::new(name.finish()),
        Arc::new(display.finish()),
        Arc::new(system.finish()),
        Arc::new(file.finish()),
        Arc::new(Int64Array::from(line)),
    ];
    RecordBatch::try_new(schema.clone(), cols).map_err(arrow_err)
}

/// One partition of a samples/profiles scan: the deduplicated samples of
/// the plan, mapped to the table's columns batch by batch.
#[derive(Debug)]
struct Part {
    inner: Arc<dyn ExecutionPlan>,
    partition: usize,
    mapper: Arc<Mapper>,
}

impl PartitionStream for Part {
    fn schema(&self) -> &SchemaRef {
        &self.mapper.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = self.mapper.schema.clone();
        let input = match self.inner.execute(self.partition, ctx) {
            Ok(s) => s,
            Err(e) => {
                return Box::pin(RecordBatchStreamAdapter::new(
                    schema,
                    futures::stream::once(async move { Err(e) }),
                ));
            }
        };
        let m = self.mapper.clone();
        let out = input.and_then(move |b| {
            let m = m.clone();
            async move { m.map(b).await }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, out))
    }
}

/// What a profile row needs of its series, computed once per series.
struct SeriesCols {
    profile_type: String,
    service_name: Option<String>,
    labels: Labels,
}

/// What a profile row needs of its stack, computed once per stack.
struct StackCols {
    frames: Vec<String>,
}

/// Turns batches of `fathom_block::samples_schema()` into table rows.
struct Mapper {
    q: Querier,
    tenant: TenantId,
    plan: Arc<Plan>,
    schema: SchemaRef,
    cols: Vec<String>,
    series: HashMap<Id, SeriesCols>,
    stacks: Mutex<HashMap<Id, Arc<StackCols>>>,
}

impl std::fmt::Debug for Mapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapper({:?})", self.cols)
    }
}

impl Mapper {
    fn new(
        q: Querier,
        tenant: TenantId,
        plan: Arc<Plan>,
        schema: SchemaRef,
        cols: Vec<String>,
    ) -> Self {
        let series = plan
            .series
            .iter()
            .map(|(id, s)| {
                (
                    *id,
                    SeriesCols {
                        profile_type: s.profile_type.to_string(),
                        service_name: s.labels.get("service_name").map(str::to_owned),
                        labels: s.labels.clone(),
                    },
                )
            })
            .collect();
        Mapper {
            q,
            tenant,
            plan,
            schema,
            cols,
            series,
            stacks: Mutex::new(HashMap::new()),
        }
    }

    fn needs_stacks(&self) -> bool {
        self.cols.iter().any(|c| c == "stack" || c == "leaf")
    }

    async fn map(&self, b: RecordBatch) -> datafusion::error::Result<RecordBatch> {
        let col = |name: &str| -> datafusion::error::Result<&ArrayRef> {
            b.column_by_name(name)
                .ok_or_else(|| DataFusionError::Internal(format!("samples batch without {name}")))
        };
        let ids = |name: &str| -> datafusion::error::Result<&FixedSizeBinaryArray> {
            col(name)?
                .as_any()
                .downcast_ref::<FixedSizeBinaryArray>()
                .ok_or_else(|| DataFusionError::Internal(format!("{name} is not an id column")))
        };
        let n = b.num_rows();
        // A sums-only scan that reads no series column has no series ids.
        let series_ids = if self
            .cols
            .iter()
            .any(|c| SERIES_COLUMNS.contains(&c.as_str()))
        {
            Some(ids(columns::SERIES_ID)?)
        } else {
            None
        };
        let stack_ids = ids(columns::STACK_ID)?;
        let stacks: Vec<Arc<StackCols>> = if self.needs_stacks() {
            self.resolve(stack_ids).await?
        } else {
            Vec::new()
        };
        let series_of = |i: usize| -> Option<&SeriesCols> {
            Id::from_slice(series_ids?.value(i)).and_then(|id| self.series.get(&id))
        };
        let mut out: Vec<ArrayRef> = Vec::with_capacity(self.cols.len());
        for c in &self.cols {
            let a: ArrayRef = match c.as_str() {
                "time" => {
                    let t = col(columns::TIME_NANOS)?.as_primitive::<Int64Type>();
                    Arc::new(
                        TimestampNanosecondArray::new(t.values().clone(), None)
                            .with_timezone("UTC"),
                    )
                }
                "value" | "series_id" | "profile_id" | "stack_id" => col(c)?.clone(),
                "profile_type" => {
                    let mut s = StringBuilder::with_capacity(n, n * 32);
                    for i in 0..n {
                        s.append_value(series_of(i).map_or("", |x| x.profile_type.as_str()));
                    }
                    Arc::new(s.finish())
                }
                "service_name" => {
                    let mut s = StringBuilder::with_capacity(n, n * 16);
                    for i in 0..n {
                        s.append_option(series_of(i).and_then(|x| x.service_name.as_deref()));
                    }
                    Arc::new(s.finish())
                }
                "labels" => {
                    let mut m = labels_builder();
                    let empty = Labels::default();
                    for i in 0..n {
                        append_labels(&mut m, series_of(i).map_or(&empty, |x| &x.labels))
                            .map_err(external)?;
                    }
                    Arc::new(m.finish())
                }
                "stack" => {
                    let mut l = ListBuilder::new(StringBuilder::new());
                    for s in &stacks {
                        for f in &s.frames {
                            l.values().append_value(f);
                        }
                        l.append(true);
                    }
                    Arc::new(l.finish())
                }
                "leaf" => {
                    let mut s = StringBuilder::with_capacity(n, n * 24);
                    for st in &stacks {
                        s.append_value(st.frames.last().map_or("", String::as_str));
                    }
                    Arc::new(s.finish())
                }
                other => {
                    return Err(DataFusionError::Internal(format!("unknown column {other}")));
                }
            };
            out.push(a);
        }
        Ok(RecordBatch::try_new_with_options(
            self.schema.clone(),
            out,
            &arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
        )?)
    }

    /// The frames of every row's stack, resolving the ones not seen yet.
    async fn resolve(
        &self,
        stack_ids: &FixedSizeBinaryArray,
    ) -> datafusion::error::Result<Vec<Arc<StackCols>>> {
        let row_ids: Vec<Id> = (0..stack_ids.len())
            .map(|i| Id::from_slice(stack_ids.value(i)).unwrap_or(Id::ZERO))
            .collect();
        let missing: Vec<Id> = {
            let known = self.stacks.lock();
            let set: HashSet<Id> = row_ids
                .iter()
                .filter(|id| !known.contains_key(id))
                .copied()
                .collect();
            set.into_iter().collect()
        };
        if !missing.is_empty() {
            let symbols = self
                .q
                .resolve(&self.tenant, &self.plan, &missing)
                .await
                .map_err(external)?;
            let mut known = self.stacks.lock();
            for id in missing {
                known.insert(
                    id,
                    Arc::new(StackCols {
                        frames: display_frames(&symbols, &id),
                    }),
                );
            }
        }
        let known = self.stacks.lock();
        Ok(row_ids
            .iter()
            .map(|id| {
                known
                    .get(id)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(StackCols { frames: Vec::new() }))
            })
            .collect())
    }
}

fn list_arg(a: &ArrayRef, fname: &str) -> datafusion::error::Result<ListArray> {
    a.as_list_opt::<i32>().cloned().ok_or_else(|| {
        DataFusionError::Plan(format!("{fname} takes a stack (a list of frame names)"))
    })
}

/// Applies `f` to each row's frames.
fn per_stack<T>(
    args: &[ColumnarValue],
    fname: &str,
    mut f: impl FnMut(Option<&StringArray>, usize) -> T,
) -> datafusion::error::Result<Vec<T>> {
    let arrays = ColumnarValue::values_to_arrays(args)?;
    let list = list_arg(&arrays[0], fname)?;
    let mut out = Vec::with_capacity(list.len());
    for i in 0..list.len() {
        if list.is_null(i) {
            out.push(f(None, i));
            continue;
        }
        let v = list.value(i);
        let s = v.as_string_opt::<i32>();
        out.push(f(s, i));
    }
    Ok(out)
}

/// The SQL functions of `docs/sql.md`.
fn register_functions(ctx: &SessionContext) {
    let st = stack_type();
    ctx.register_udf(create_udf(
        "leaf_frame",
        vec![st.clone()],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let v = per_stack(args, "leaf_frame", |s, _| {
                s.and_then(|s| (!s.is_empty()).then(|| s.value(s.len() - 1).to_owned()))
            })?;
            Ok(ColumnarValue::Array(Arc::new(StringArray::from(v))))
        }),
    ));
    ctx.register_udf(create_udf(
        "root_frame",
        vec![st.clone()],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let v = per_stack(args, "root_frame", |s, _| {
                s.and_then(|s| (!s.is_empty()).then(|| s.value(0).to_owned()))
            })?;
            Ok(ColumnarValue::Array(Arc::new(StringArray::from(v))))
        }),
    ));
    ctx.register_udf(create_udf(
        "folded",
        vec![st.clone()],
        DataType::Utf8,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let v = per_stack(args, "folded", |s, _| {
                s.map(|s| {
                    s.iter()
                        .map(|f| f.unwrap_or("?"))
                        .collect::<Vec<_>>()
                        .join(";")
                })
            })?;
            Ok(ColumnarValue::Array(Arc::new(StringArray::from(v))))
        }),
    ));
    ctx.register_udf(create_udf(
        "stack_contains",
        vec![st, DataType::Utf8],
        DataType::Boolean,
        Volatility::Immutable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let names = arrays[1].as_string_opt::<i32>().cloned().ok_or_else(|| {
                DataFusionError::Plan("stack_contains takes a function name".into())
            })?;
            let v = per_stack(args, "stack_contains", |s, i| {
                if names.is_null(i) {
                    return None;
                }
                let want = names.value(i);
                s.map(|s| s.iter().any(|f| f == Some(want)))
            })?;
            Ok(ColumnarValue::Array(Arc::new(BooleanArray::from(v))))
        }),
    ));
}

/// A planned, read-only query and the session it runs in.
#[derive(Clone)]
pub struct SqlQuery {
    pub(crate) df: DataFrame,
}

impl SqlQuery {
    pub fn schema(&self) -> SchemaRef {
        Arc::new(self.df.schema().as_arrow().clone())
    }
}

/// Why SQL was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    ReadOnly(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    ResourcesExhausted(String),
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl SqlError {
    pub(crate) fn from_datafusion(e: DataFusionError, cfg: &SqlConfig) -> SqlError {
        let text = e.to_string();
        match e.find_root() {
            DataFusionError::ResourcesExhausted(m) => SqlError::ResourcesExhausted(format!(
                "the query needs more memory than its limit of {} (sql memory limit): {m}",
                bytesize::ByteSize(cfg.memory_limit as u64)
            )),
            DataFusionError::SQL(..)
            | DataFusionError::Plan(_)
            | DataFusionError::SchemaError(..)
            | DataFusionError::NotImplemented(_)
            | DataFusionError::Configuration(_) => SqlError::Invalid(text),
            DataFusionError::External(inner) => match inner.downcast_ref::<QueryError>() {
                Some(QueryError::BadRequest(m)) => SqlError::Invalid(m.clone()),
                Some(e @ QueryError::Head(_)) => SqlError::Unavailable(e.to_string()),
                Some(QueryError::Index(m)) => SqlError::Unavailable(format!("listing blocks: {m}")),
                _ => SqlError::Internal(text),
            },
            DataFusionError::ArrowError(..) | DataFusionError::Execution(_) => {
                SqlError::Invalid(text)
            }
            _ => SqlError::Internal(text),
        }
    }
}

/// SQL errors take the API's one mapping to HTTP status and gRPC code.
impl From<SqlError> for fathom_api::ApiError {
    fn from(e: SqlError) -> Self {
        use fathom_api::ApiError;
        match e {
            SqlError::Invalid(m) => ApiError::BadRequest(m),
            SqlError::ReadOnly(m) => ApiError::Forbidden(m),
            SqlError::NotFound(m) => ApiError::NotFound(m),
            SqlError::ResourcesExhausted(m) => ApiError::RateLimited(m),
            SqlError::Timeout(m) => ApiError::Timeout(m),
            SqlError::Unavailable(m) => ApiError::Unavailable(m),
            SqlError::Internal(m) => ApiError::Internal(m),
        }
    }
}

/// The statement kinds a read-only interface accepts.
fn check_read_only(sql: &str) -> Result<(), SqlError> {
    let dialect = datafusion::sql::sqlparser::dialect::GenericDialect {};
    let stmts = datafusion::sql::sqlparser::parser::Parser::parse_sql(&dialect, sql)
        .map_err(|e| SqlError::Invalid(format!("SQL syntax: {e}")))?;
    if stmts.len() != 1 {
        return Err(SqlError::Invalid(format!(
            "expected one SQL statement, found {}",
            stmts.len()
        )));
    }
    match &stmts[0] {
        Statement::Query(_) | Statement::Explain { .. } => Ok(()),
        other => {
            let text = other.to_string();
            let verb: String = text
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ");
            Err(SqlError::ReadOnly(format!(
                "Fathom's SQL is read-only: only queries (SELECT, WITH, EXPLAIN) run here, not {verb}"
            )))
        }
    }
}

impl Querier {
    /// The SQL limits, with the request's tenant's overrides (tenants file).
    pub fn sql_config(&self) -> SqlConfig {
        let mut c = self.inner.cfg.sql.clone();
        if let Some(l) = fathom_api::auth::request_limits() {
            if let Some(m) = l.query_memory {
                c.memory_limit = m;
            }
            if let Some(t) = l.query_timeout {
                c.timeout = t;
            }
        }
        c
    }

    /// A session whose catalog holds `tenant`'s tables and nothing else,
    /// with its own memory pool.
    pub fn sql_session(&self, tenant: &TenantId) -> Result<SessionContext, SqlError> {
        let cfg = self.sql_config();
        let rt = RuntimeEnvBuilder::new()
            .with_memory_limit(cfg.memory_limit, 1.0)
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .build_arc()
            .map_err(|e| SqlError::Internal(e.to_string()))?;
        let url =
            ObjectStoreUrl::parse(STORE_URL).map_err(|e| SqlError::Internal(e.to_string()))?;
        rt.register_object_store(url.as_ref(), self.inner.store.clone());
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG, SCHEMA)
            .with_create_default_catalog_and_schema(true)
            .with_information_schema(true)
            .with_target_partitions(2)
            .with_batch_size(cfg.batch_rows.max(1))
            .set_bool("datafusion.execution.parquet.pushdown_filters", true);
        let ctx = SessionContext::new_with_config_rt(config, rt);
        for (name, kind) in [
            ("profiles", Kind::Profiles),
            ("samples", Kind::Samples),
            ("series", Kind::Series),
            ("stacks", Kind::Stacks),
            ("functions", Kind::Functions),
        ] {
            let schema = table_schema(name).ok_or_else(|| SqlError::Internal(name.into()))?;
            ctx.register_table(
                name,
                Arc::new(Table {
                    q: self.clone(),
                    tenant: tenant.clone(),
                    kind,
                    schema,
                    totals: None,
                }),
            )
            .map_err(|e| SqlError::Internal(e.to_string()))?;
        }
        register_functions(&ctx);
        ctx.add_optimizer_rule(Arc::new(crate::totals::TotalsRule));
        Ok(ctx)
    }

    /// Plans `sql` for `tenant`, binding `params` to `$1`, `$2`, …; refuses
    /// anything but a query.
    pub async fn sql_plan(
        &self,
        tenant: &TenantId,
        sql: &str,
        params: Option<Vec<ScalarValue>>,
    ) -> Result<SqlQuery, SqlError> {
        check_read_only(sql)?;
        let cfg = self.sql_config().clone();
        let ctx = self.sql_session(tenant)?;
        let opts = datafusion::execution::context::SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let this = self.clone();
        let sql = sql.to_owned();
        let fut = async move {
            let df = ctx
                .sql_with_options(&sql, opts)
                .await
                .map_err(|e| SqlError::from_datafusion(e, &cfg))?;
            let df = match params {
                None => df,
                Some(values) => {
                    let types = df
                        .logical_plan()
                        .get_parameter_types()
                        .map_err(|e| SqlError::from_datafusion(e, &cfg))?;
                    let mut cast = Vec::with_capacity(values.len());
                    for (i, v) in values.into_iter().enumerate() {
                        let want = types.get(&format!("${}", i + 1)).cloned().flatten();
                        cast.push(match want {
                            Some(t) if v.data_type() != t => v.cast_to(&t).map_err(|e| {
                                SqlError::Invalid(format!("parameter ${}: {e}", i + 1))
                            })?,
                            _ => v,
                        });
                    }
                    df.with_param_values(cast)
                        .map_err(|e| SqlError::from_datafusion(e, &cfg))?
                }
            };
            Ok::<_, SqlError>(SqlQuery { df })
        };
        let cfg = self.sql_config().clone();
        match tokio::time::timeout(cfg.timeout, this.inner.exec.run(fut)).await {
            Err(_) => Err(timeout_error(&cfg)),
            Ok(Err(e)) => Err(SqlError::Internal(e.to_string())),
            Ok(Ok(r)) => r,
        }
    }

    /// The types of `sql`'s parameters (`$1`, `$2`, …) in order.
    pub async fn sql_parameters(
        &self,
        tenant: &TenantId,
        sql: &str,
    ) -> Result<(SchemaRef, SchemaRef), SqlError> {
        let q = self.sql_plan(tenant, sql, None).await?;
        let types =
            q.df.logical_plan()
                .get_parameter_types()
                .map_err(|e| SqlError::from_datafusion(e, &self.sql_config()))?;
        let mut names: Vec<(usize, String, Option<DataType>)> = types
            .into_iter()
            .filter_map(|(k, t)| {
                k.strip_prefix('$')
                    .and_then(|n| n.parse::<usize>().ok())
                    .map(|n| (n, k, t))
            })
            .collect();
        names.sort_by_key(|x| x.0);
        let fields: Vec<Field> = names
            .into_iter()
            .map(|(_, k, t)| Field::new(k, t.unwrap_or(DataType::Utf8), true))
            .collect();
        Ok((q.schema(), Arc::new(Schema::new(fields))))
    }

    /// Runs a planned query on the query runtime; batches arrive on the
    /// returned channel, and the query stops at its deadline or when the
    /// receiver is dropped.
    pub fn sql_execute(
        &self,
        q: SqlQuery,
    ) -> tokio::sync::mpsc::Receiver<Result<RecordBatch, SqlError>> {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let cfg = self.sql_config().clone();
        let metrics = self.inner.metrics.clone();
        let exec = self.inner.exec.clone();
        let fut = async move {
            let timer = std::time::Instant::now();
            metrics.queries.inc();
            let deadline = tokio::time::Instant::now() + cfg.timeout;
            let run = async {
                let mut stream =
                    q.df.execute_stream()
                        .await
                        .map_err(|e| SqlError::from_datafusion(e, &cfg))?;
                while let Some(b) = stream.next().await {
                    let b = b.map_err(|e| SqlError::from_datafusion(e, &cfg))?;
                    metrics.rows.inc_by(b.num_rows() as u64);
                    if tx.send(Ok(b)).await.is_err() {
                        return Ok(());
                    }
                }
                Ok::<(), SqlError>(())
            };
            let r = match tokio::time::timeout_at(deadline, run).await {
                Err(_) => Err(timeout_error(&cfg)),
                Ok(r) => r,
            };
            if let Err(e) = r {
                let _ = tx.send(Err(e)).await;
            }
            metrics.duration.observe(timer.elapsed().as_secs_f64());
        };
        exec.spawn(fut);
        rx
    }

    /// Runs `sql` and collects the result (tests, benchmarks, small answers).
    pub async fn sql_collect(
        &self,
        tenant: &TenantId,
        sql: &str,
    ) -> Result<Vec<RecordBatch>, SqlError> {
        let q = self.sql_plan(tenant, sql, None).await?;
        let mut rx = self.sql_execute(q);
        let mut out = Vec::new();
        while let Some(b) = rx.recv().await {
            out.push(b?);
        }
        Ok(out)
    }
}

fn timeout_error(cfg: &SqlConfig) -> SqlError {
    SqlError::Timeout(format!(
        "the query ran past its timeout of {} (sql timeout) and was cancelled",
        humantime::format_duration(cfg.timeout)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table that takes every predicate as [`Table`] does, and has no rows.
    #[derive(Debug)]
    struct Probe(SchemaRef);

    #[async_trait::async_trait]
    impl TableProvider for Probe {
        fn schema(&self) -> SchemaRef {
            self.0.clone()
        }
        fn table_type(&self) -> TableType {
            TableType::Base
        }
        fn supports_filters_pushdown(
            &self,
            filters: &[&Expr],
        ) -> datafusion::error::Result<Vec<TableProviderFilterPushDown>> {
            Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
        }
        async fn scan(
            &self,
            _state: &dyn Session,
            projection: Option<&Vec<usize>>,
            _filters: &[Expr],
            _limit: Option<usize>,
        ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
            let schema = match projection {
                Some(p) => Arc::new(self.0.project(p)?),
                None => self.0.clone(),
            };
            Ok(Arc::new(EmptyExec::new(schema)))
        }
    }

    /// The predicates a scan of `profiles` receives for `sql_where`, after
    /// DataFusion's type coercion, simplification and filter pushdown.
    async fn filters(sql_where: &str) -> Vec<Expr> {
        use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
        use datafusion::logical_expr::LogicalPlan;
        let ctx = SessionContext::new();
        let schema = table_schema("profiles").unwrap();
        ctx.register_table("profiles", Arc::new(Probe(schema)))
            .unwrap();
        let plan = ctx
            .sql(&format!("SELECT * FROM profiles WHERE {sql_where}"))
            .await
            .unwrap()
            .into_optimized_plan()
            .unwrap();
        let mut out = Vec::new();
        plan.apply(|p| {
            if let LogicalPlan::TableScan(t) = p {
                out.extend(t.filters.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        out
    }

    #[tokio::test]
    async fn time_and_labels_are_pushed_down() {
        let p = Pushed::from_filters(
            &filters(
                "time >= TIMESTAMP '2024-01-01T00:00:00Z' AND time < TIMESTAMP '2024-01-01T01:00:00Z' \
                 AND service_name = 'api' AND profile_type = 'process_cpu:cpu:nanoseconds:cpu:nanoseconds' \
                 AND labels['env'] = 'prod' AND value > 3",
            )
            .await,
        );
        let t0 = 1_704_067_200_000_000_000i64;
        assert_eq!(p.start, t0);
        assert_eq!(p.end, t0 + 3_600_000_000_000 - 1);
        assert_eq!(
            p.sel
                .profile_type
                .as_ref()
                .map(|t| t.to_string())
                .as_deref(),
            Some("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
        );
        let mut names: Vec<(&str, &str)> = p
            .sel
            .matchers
            .iter()
            .map(|m| (m.name.as_str(), m.value.as_str()))
            .collect();
        names.sort();
        assert_eq!(names, vec![("env", "prod"), ("service_name", "api")]);

        let p = Pushed::from_filters(
            &filters("time BETWEEN TIMESTAMP '2024-01-01T00:00:00Z' AND TIMESTAMP '2024-01-01T00:00:10Z'")
                .await,
        );
        assert_eq!((p.start, p.end), (t0, t0 + 10_000_000_000));

        let now = fathom_api::now_nanos();
        let p = Pushed::from_filters(&filters("time > now() - INTERVAL '1 hour'").await);
        assert!(
            (p.start - (now - 3_600_000_000_000)).abs() < 60_000_000_000,
            "now() - 1h is folded to a literal and pushed: {}",
            p.start
        );
        assert_eq!(p.end, i64::MAX);
    }

    /// The equalities a selector enforces exactly are Exact; anything it
    /// would widen or cannot hold is Inexact.
    #[tokio::test]
    async fn only_selector_equalities_are_exact() {
        let pt = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
        let exact = |sql_where: String| async move {
            let fs = filters(&sql_where).await;
            let refs: Vec<&Expr> = fs.iter().collect();
            fs.iter()
                .map(|f| (f.to_string(), exact_selection(f, &refs)))
                .collect::<Vec<_>>()
        };
        let got = exact(format!(
            "service_name = 'api' AND labels['env'] = 'prod' AND profile_type = '{pt}' \
             AND value > 3 AND time > TIMESTAMP '2024-01-01T00:00:00Z'"
        ))
        .await;
        assert_eq!(got.len(), 5, "{got:?}");
        let mut exact_ones: Vec<&str> = got.iter().filter(|g| g.1).map(|g| g.0.as_str()).collect();
        exact_ones.sort();
        assert_eq!(
            exact_ones,
            vec![
                "get_field(profiles.labels, Utf8(\"env\")) = Utf8(\"prod\")",
                "profiles.profile_type = Utf8(\"process_cpu:cpu:nanoseconds:cpu:nanoseconds\")",
                "profiles.service_name = Utf8(\"api\")",
            ],
            "{got:?}"
        );
        for w in [
            // `k=""` of a selector matches series without `k`.
            "labels['env'] = ''".to_owned(),
            "service_name = ''".to_owned(),
            "service_name LIKE 'a%'".to_owned(),
            "service_name <> 'api'".to_owned(),
            // Not a profile type's own text.
            "profile_type = 'cpu'".to_owned(),
            format!("profile_type = '{pt}' AND profile_type LIKE 'mem%'"),
        ] {
            let got = exact(w.clone()).await;
            assert!(!got.is_empty(), "{w}");
            assert!(got.iter().all(|g| !g.1), "{w}: {got:?}");
        }
        // Two profile types (DataFusion folds the SQL to `false`; a
        // selector holds one, so neither equality is exact).
        use datafusion::prelude::{col, lit};
        let a = col("profile_type").eq(lit(pt));
        let b = col("profile_type").eq(lit("memory:alloc_space:bytes:space:bytes"));
        assert!(exact_selection(&a, &[&a]));
        assert!(!exact_selection(&a, &[&a, &b]));
        assert!(!exact_selection(&b, &[&a, &b]));
    }

    #[tokio::test]
    async fn predicates_that_are_not_understood_push_nothing() {
        let p = Pushed::from_filters(
            &filters("time <> TIMESTAMP '2024-01-01T00:00:00Z' OR service_name = 'x'").await,
        );
        assert_eq!(p, Pushed::default());
        let p = Pushed::from_filters(&filters("service_name LIKE 'a%'").await);
        assert_eq!(p, Pushed::default());
    }

    #[test]
    fn statements_other_than_queries_are_refused() {
        for sql in [
            "CREATE TABLE t (a INT)",
            "INSERT INTO profiles VALUES (1)",
            "DROP TABLE profiles",
            "SET datafusion.execution.batch_size = 1",
            "DELETE FROM samples",
        ] {
            match check_read_only(sql) {
                Err(SqlError::ReadOnly(m)) => assert!(m.contains("read-only"), "{m}"),
                other => panic!("{sql}: {other:?}"),
            }
        }
        assert!(check_read_only("SELECT 1").is_ok());
        assert!(matches!(
            check_read_only("SELECT 1; SELECT 2"),
            Err(SqlError::Invalid(_))
        ));
        assert!(matches!(
            check_read_only("SELEC nothing"),
            Err(SqlError::Invalid(_))
        ));
    }
}
