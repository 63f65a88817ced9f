//! SQL sums answered from rollups (`docs/sql.md`, "Sums from rollups").
//!
//! A query that only *sums* `value` of `profiles` over a time range, such
//! as per-function totals
//!
//! ```sql
//! SELECT leaf, sum(value) FROM profiles
//! WHERE service_name = 'api' AND time >= … AND time < …
//! GROUP BY leaf
//! ```
//!
//! does not need one row per (profile, stack): any set of rows whose values
//! add up to the same totals per (series, stack) gives the same answer.
//! [`TotalsRule`] recognises that shape in the optimized logical plan and
//! swaps the scan for one that reads what an HTTP merge reads (whole hours
//! and days from compacted blocks' `rollup.parquet`, raw samples for the
//! edges and the heads, replica copies dropped) and sums it per (series,
//! stack), or per stack when the query reads no column of the series
//! (equalities on the service, type and labels are enforced by the scan's
//! selector), before the rows are mapped to names. Sums are of integers, so the
//! answer is exactly the one over raw rows.
//!
//! The rule applies only when all of these hold, and otherwise leaves the
//! plan alone:
//! - every aggregate is `sum(value)` (no `DISTINCT`, `FILTER` or `ORDER BY`);
//! - the group keys and the other predicates do not read `time` or
//!   `profile_id` (per-profile and per-time questions need raw rows);
//! - every predicate on `time` is `time <op> <timestamp literal>` with
//!   `=`, `<`, `<=`, `>`, `>=`, or `time BETWEEN a AND b`: the scan then
//!   enforces the range exactly, to the nanosecond.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::common::tree_node::Transformed;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    Aggregate, BinaryExpr, Expr, Filter, LogicalPlan, Operator, Projection, TableScan,
    TableScanBuilder,
};
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

use crate::sql::{Kind, Pushed, SERIES_COLUMNS, Table, Totals};

/// The optimizer rule; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct TotalsRule;

impl OptimizerRule for TotalsRule {
    fn name(&self) -> &str {
        "fathom_sums_from_rollups"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Aggregate(agg) = &plan else {
            return Ok(Transformed::no(plan));
        };
        match rewrite_aggregate(agg) {
            Some(p) => Ok(Transformed::yes(p)),
            None => Ok(Transformed::no(plan)),
        }
    }
}

/// Whether `e` reads a column named `name`.
fn reads(e: &Expr, name: &str) -> bool {
    e.column_refs().iter().any(|c| c.name == name)
}

/// The `value` column.
fn is_value_column(e: &Expr) -> bool {
    matches!(e, Expr::Column(c) if c.name == "value")
}

/// Whether `e` is `sum(value)` and nothing more.
fn is_plain_sum_of_value(e: &Expr) -> bool {
    let e = match e {
        Expr::Alias(a) => a.expr.as_ref(),
        e => e,
    };
    let Expr::AggregateFunction(f) = e else {
        return false;
    };
    f.func.name().eq_ignore_ascii_case("sum")
        && f.params.args.len() == 1
        && is_value_column(&f.params.args[0])
        && !f.params.distinct
        && f.params.filter.is_none()
        && f.params.order_by.is_empty()
}

/// The `time` column, itself or cast to another nanosecond timestamp type
/// (a time-zone change keeps the instant).
fn is_time_column(e: &Expr) -> bool {
    match e {
        Expr::Column(c) => c.name == "time",
        Expr::Cast(c) => {
            matches!(
                c.field.data_type(),
                arrow::datatypes::DataType::Timestamp(arrow::datatypes::TimeUnit::Nanosecond, _)
            ) && is_time_column(&c.expr)
        }
        _ => false,
    }
}

fn is_time_literal(e: &Expr) -> bool {
    matches!(e, Expr::Literal(v, _) if crate::sql::literal_nanos(v).is_some())
}

/// Whether `e` is a bound on `time` that [`Pushed`] turns into the exact
/// same nanosecond range.
fn is_exact_time_bound(e: &Expr) -> bool {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            matches!(
                op,
                Operator::Eq | Operator::Lt | Operator::LtEq | Operator::Gt | Operator::GtEq
            ) && ((is_time_column(left) && is_time_literal(right))
                || (is_time_literal(left) && is_time_column(right)))
        }
        Expr::Between(b) => {
            !b.negated
                && is_time_column(&b.expr)
                && is_time_literal(&b.low)
                && is_time_literal(&b.high)
        }
        _ => false,
    }
}

/// The profiles table of a scan, if that is what it reads.
fn profiles_table(scan: &TableScan) -> Option<Table> {
    let provider = source_as_provider(&scan.source).ok()?;
    let t = provider.as_ref().downcast_ref::<Table>()?;
    (t.kind == Kind::Profiles && t.totals.is_none()).then(|| t.clone())
}

/// The aggregate over a sums-only scan, or `None` to leave it.
fn rewrite_aggregate(agg: &Aggregate) -> Option<LogicalPlan> {
    if agg.aggr_expr.is_empty() || !agg.aggr_expr.iter().all(is_plain_sum_of_value) {
        return None;
    }
    if agg
        .group_expr
        .iter()
        .any(|e| reads(e, "time") || reads(e, "profile_id"))
    {
        return None;
    }
    // Aggregate → [Projection of columns] → [Filter] → TableScan.
    let mut input = agg.input.as_ref();
    let projection = match input {
        LogicalPlan::Projection(p) => {
            if !p.expr.iter().all(|e| matches!(e, Expr::Column(_))) {
                return None;
            }
            input = p.input.as_ref();
            Some(p)
        }
        _ => None,
    };
    let (predicate, scan) = match input {
        LogicalPlan::Filter(f) => match f.input.as_ref() {
            LogicalPlan::TableScan(s) => (Some(&f.predicate), s),
            _ => return None,
        },
        LogicalPlan::TableScan(s) => (None, s),
        _ => return None,
    };
    if scan.fetch.is_some() {
        return None;
    }
    let table = profiles_table(scan)?;
    if let Some(p) = projection
        && p.expr
            .iter()
            .any(|e| reads(e, "time") || reads(e, "profile_id"))
    {
        return None;
    }
    // Split the predicate: exact time bounds go into the scan's range.
    let mut time_bounds: Vec<Expr> = Vec::new();
    let mut rest: Vec<Expr> = Vec::new();
    for c in predicate.map(split_conjunction).unwrap_or_default() {
        if reads(c, "profile_id") {
            return None;
        }
        if reads(c, "time") {
            if !is_exact_time_bound(c) {
                return None;
            }
            time_bounds.push(c.clone());
        } else {
            rest.push(c.clone());
        }
    }
    // The scan's pushed filters are a copy of the predicate (inexact
    // pushdown); a time bound among them that is not in the predicate
    // would be lost.
    if scan
        .filters
        .iter()
        .any(|f| reads(f, "time") && !time_bounds.contains(f))
    {
        return None;
    }
    let pushed = Pushed::from_filters(&time_bounds);
    let schema = table.schema.clone();
    let dropped = |i: &usize| {
        let n = schema.field(*i).name();
        n != "time" && n != "profile_id"
    };
    let columns: Vec<usize> = match &scan.projection {
        Some(p) => p.iter().copied().filter(dropped).collect(),
        None => (0..schema.fields().len()).filter(dropped).collect(),
    };
    let per_series = columns
        .iter()
        .any(|i| SERIES_COLUMNS.contains(&schema.field(*i).name().as_str()));
    let totals = Table {
        totals: Some(Totals {
            start: pushed.start,
            end: pushed.end,
            per_series,
        }),
        ..table
    };
    let filters: Vec<Expr> = scan
        .filters
        .iter()
        .filter(|f| !reads(f, "time"))
        .cloned()
        .collect();
    let new_scan = TableScanBuilder::new(
        scan.table_name.clone(),
        provider_as_source(Arc::new(totals)),
    )
    .with_projection(Some(columns))
    .with_filters(filters)
    .build()
    .ok()?;
    let mut plan = LogicalPlan::TableScan(new_scan);
    if let Some(pred) = conjunction(rest) {
        plan = LogicalPlan::Filter(Filter::try_new(pred, Arc::new(plan)).ok()?);
    }
    if let Some(p) = projection {
        plan = LogicalPlan::Projection(Projection::try_new(p.expr.clone(), Arc::new(plan)).ok()?);
    }
    let out = Aggregate::try_new(
        Arc::new(plan),
        agg.group_expr.clone(),
        agg.aggr_expr.clone(),
    )
    .ok()?;
    // The answer's columns are unchanged.
    if out.schema.fields() != agg.schema.fields() {
        return None;
    }
    Some(LogicalPlan::Aggregate(out))
}
