//! The HTTP query API (`docs/api.md`).

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fathom_api::{ApiError, now_nanos, parse_time, tenant_from_headers};
use fathom_model::{Selector, TenantId};
use serde_json::json;

use fathom_querier::Querier;
use fathom_querier::{flamegraph, folded, folded_for_display, folded_text, top};

type Params = Query<HashMap<String, String>>;

/// The query routes (Fathom's and Pyroscope's, [`crate::pyroscope`]), to be
/// merged into the server's router.
pub fn router(q: Querier) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/profile_types", get(profile_types))
        .route("/api/v1/labels", get(labels))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/series", get(series))
        .route("/api/v1/query_range", get(query_range))
        .route("/api/v1/query", get(query))
        .route("/api/v1/diff", get(diff))
        .route("/api/v1/changes", get(changes))
        .with_state(q.clone())
        .merge(crate::pyroscope::router(q))
}

pub(crate) struct Range {
    pub(crate) start: i64,
    pub(crate) end: i64,
}

pub(crate) fn range(
    q: &Querier,
    p: &HashMap<String, String>,
    s: &str,
    e: &str,
) -> Result<Range, ApiError> {
    let now = now_nanos();
    let end = match p.get(e) {
        Some(v) => {
            parse_time(v, now).map_err(|err| ApiError::bad_request(format!("{e}: {err}")))?
        }
        None => now,
    };
    let start = match p.get(s) {
        Some(v) => {
            parse_time(v, now).map_err(|err| ApiError::bad_request(format!("{s}: {err}")))?
        }
        None => end.saturating_sub(3600 * 1_000_000_000),
    };
    check_range(q, start, end, s, e)
}

/// The latest time a query may name: 2200-01-01T00:00:00Z, in unix
/// nanoseconds. With times in `[0, MAX_TIME_NANOS]`, differences, sums and
/// step arithmetic of query ranges cannot overflow an `i64`.
pub(crate) const MAX_TIME_NANOS: i64 = 7_258_118_400 * 1_000_000_000;

/// `[start, end]` (unix nanoseconds) if both are between 1970 and
/// [`MAX_TIME_NANOS`], ordered, and within the longest query range; `s` and
/// `e` name the bounds in errors.
pub(crate) fn check_range(
    q: &Querier,
    start: i64,
    end: i64,
    s: &str,
    e: &str,
) -> Result<Range, ApiError> {
    for (name, t) in [(s, start), (e, end)] {
        if !(0..=MAX_TIME_NANOS).contains(&t) {
            return Err(ApiError::bad_request(format!(
                "{name} is {t} ns since 1970; a query's times must lie between \
                 1970-01-01 and 2200-01-01"
            )));
        }
    }
    if start > end {
        return Err(ApiError::bad_request(format!("{s} is after {e}")));
    }
    if end.saturating_sub(start) > q.max_range_nanos() {
        return Err(ApiError::bad_request(format!(
            "the range {s}..{e} is longer than the limit of {} hours",
            q.max_range_nanos() / 3_600_000_000_000
        )));
    }
    Ok(Range { start, end })
}

pub(crate) fn selector(
    p: &HashMap<String, String>,
    name: &str,
    required: bool,
) -> Result<Option<Selector>, ApiError> {
    match p.get(name) {
        Some(s) if !s.trim().is_empty() => Selector::parse(s)
            .map(Some)
            .map_err(|e| ApiError::bad_request(format!("{name}: {e}"))),
        _ if required => Err(ApiError::bad_request(format!(
            "the {name} parameter is required, e.g. {name}=process_cpu:cpu:nanoseconds:cpu:nanoseconds{{service_name=\"app\"}}"
        ))),
        _ => Ok(None),
    }
}

fn tenant(h: &HeaderMap) -> Result<TenantId, ApiError> {
    tenant_from_headers(h)
}

async fn profile_types(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Json<serde_json::Value>, ApiError> {
    let t = tenant(&h)?;
    let r = range(&q, &p, "start", "end")?;
    let types = q.profile_types(&t, r.start, r.end).await?;
    Ok(Json(json!({ "profile_types": types })))
}

/// The series a metadata request names: tenant, `start`/`end` and an
/// optional `query` selector.
async fn matching_series(
    q: &Querier,
    h: &HeaderMap,
    p: &HashMap<String, String>,
) -> Result<Vec<fathom_block::SeriesRow>, ApiError> {
    let t = tenant(h)?;
    let r = range(q, p, "start", "end")?;
    let sel = selector(p, "query", false)?;
    Ok(q.series(&t, sel.as_ref(), r.start, r.end).await?)
}

/// A label set as a JSON object.
pub(crate) fn labels_json(l: &fathom_model::Labels) -> serde_json::Map<String, serde_json::Value> {
    l.iter().map(|(k, v)| (k.to_owned(), json!(v))).collect()
}

/// Sorted distinct values.
fn distinct<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = it.collect();
    v.sort_unstable();
    v.dedup();
    v
}

async fn labels(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Json<serde_json::Value>, ApiError> {
    let series = matching_series(&q, &h, &p).await?;
    let names = distinct(series.iter().flat_map(|s| s.labels.iter().map(|(k, _)| k)));
    Ok(Json(json!({ "labels": names })))
}

async fn label_values(
    State(q): State<Querier>,
    h: HeaderMap,
    Path(name): Path<String>,
    Query(p): Params,
) -> Result<Json<serde_json::Value>, ApiError> {
    let series = matching_series(&q, &h, &p).await?;
    let values = distinct(series.iter().filter_map(|s| s.labels.get(&name)));
    Ok(Json(json!({ "values": values })))
}

async fn series(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Json<serde_json::Value>, ApiError> {
    let series = matching_series(&q, &h, &p).await?;
    let out: Vec<serde_json::Value> = series
        .iter()
        .map(|s| {
            let mut m = labels_json(&s.labels);
            m.insert("__profile_type__".into(), json!(s.profile_type.to_string()));
            serde_json::Value::Object(m)
        })
        .collect();
    Ok(Json(json!({ "series": out })))
}

async fn query_range(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Json<serde_json::Value>, ApiError> {
    let t = tenant(&h)?;
    let (sel, r, step, group_by) = range_params(&q, &p)?;
    let series = q.range(&t, &sel, r.start, r.end, step, group_by).await?;
    let out: Vec<serde_json::Value> = series
        .iter()
        .map(|s| json!({ "labels": labels_json(&s.labels), "points": s.points }))
        .collect();
    Ok(Json(json!({ "series": out })))
}

/// The parameters of a range query: selector, range, step and group_by.
pub(crate) fn range_params(
    q: &Querier,
    p: &HashMap<String, String>,
) -> Result<(Selector, Range, i64, Vec<String>), ApiError> {
    let r = range(q, p, "start", "end")?;
    let sel = selector(p, "query", true)?.unwrap_or_default();
    let span = (r.end - r.start).max(1);
    let step = match p.get("step") {
        Some(s) => parse_step(s)?,
        None => (span / 240).max(1_000_000_000),
    };
    if span / step > q.max_points() {
        return Err(ApiError::bad_request(format!(
            "step is too small: {} points per series; the limit is {}",
            span / step,
            q.max_points()
        )));
    }
    let group_by: Vec<String> = p
        .get("group_by")
        .map(|g| {
            g.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    Ok((sel, r, step, group_by))
}

/// A step: a duration (`10s`, `1m`) or a number of seconds.
pub(crate) fn parse_step(s: &str) -> Result<i64, ApiError> {
    let nanos = if let Ok(secs) = s.parse::<f64>() {
        (secs * 1e9) as i64
    } else {
        humantime::parse_duration(s)
            .map_err(|e| ApiError::bad_request(format!("step {s:?}: {e}")))?
            .as_nanos()
            .min(i64::MAX as u128) as i64
    };
    if nanos <= 0 {
        return Err(ApiError::bad_request(format!(
            "step {s:?} must be positive"
        )));
    }
    Ok(nanos)
}

/// Flame graph nodes kept when a request does not say.
pub(crate) const DEFAULT_MAX_NODES: usize = 8192;

fn max_nodes(q: &Querier, p: &HashMap<String, String>) -> Result<usize, ApiError> {
    match p.get("max_nodes") {
        None => Ok(DEFAULT_MAX_NODES),
        Some(s) => {
            let n: i64 = s.parse().map_err(|_| {
                ApiError::bad_request(format!("max_nodes {s:?} is not a positive integer"))
            })?;
            check_max_nodes(q, n)
        }
    }
}

/// Lines (folded), rows (top) or stacks (pprof) kept when a request does
/// not say: the configured maximum (`max_flame_nodes`).
fn max_rows(q: &Querier, p: &HashMap<String, String>) -> Result<usize, ApiError> {
    match p.get("max_nodes") {
        None => Ok(q.config().max_flame_nodes),
        Some(_) => max_nodes(q, p),
    }
}

/// The header that says how many lines, rows or stacks a bounded output
/// merged into its `other` entry.
const TRUNCATED: &str = "x-fathom-truncated";

/// `r` with the [`TRUNCATED`] header when `cut` > 0.
fn mark_truncated(mut r: Response, cut: usize) -> Response {
    if cut > 0 {
        r.headers_mut()
            .insert(TRUNCATED, HeaderValue::from(cut as u64));
    }
    r
}

/// `n` as a node count if it is between 1 and the configured maximum.
pub(crate) fn check_max_nodes(q: &Querier, n: i64) -> Result<usize, ApiError> {
    let max = q.config().max_flame_nodes;
    match usize::try_from(n) {
        Ok(n) if n >= 1 && n <= max => Ok(n),
        _ => Err(ApiError::bad_request(format!(
            "max_nodes must be between 1 and {max}"
        ))),
    }
}

fn text(body: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

async fn query(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Response, ApiError> {
    let t = tenant(&h)?;
    let r = range(&q, &p, "start", "end")?;
    let sel = selector(&p, "query", true)?.unwrap_or_default();
    let format = p.get("format").map(String::as_str).unwrap_or("flamegraph");
    if !matches!(format, "folded" | "top" | "flamegraph" | "pprof") {
        return Err(ApiError::bad_request(format!(
            "format {format:?} is not one of folded, top, flamegraph, pprof"
        )));
    }
    let nodes = max_nodes(&q, &p)?;
    let bound = max_rows(&q, &p)?;
    let m = q.merge(&t, &sel, r.start, r.end).await?;
    if format == "pprof" {
        let cut = fathom_querier::bound_samples(&m.samples, &m.symbols, bound);
        let (samples, symbols, cut) = match &cut {
            Some((s, y, n)) => (&s[..], y, *n),
            None => (&m.samples[..], &m.symbols, 0),
        };
        let body = fathom_pprof::encode(
            &m.profile_type,
            samples,
            symbols,
            m.start,
            m.end - m.start,
            m.period,
        );
        return Ok(mark_truncated(
            (
                [
                    (
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/vnd.google.protobuf+gzip"),
                    ),
                    (
                        header::CONTENT_DISPOSITION,
                        HeaderValue::from_static("attachment; filename=\"profile.pb.gz\""),
                    ),
                ],
                body,
            )
                .into_response(),
            cut,
        ));
    }
    let cols = [(&m.samples[..], &m.symbols)];
    let rows = if format == "folded" {
        folded(cols)
    } else {
        folded_for_display(cols)
    };
    Ok(match format {
        "folded" => {
            let (rows, cut) = fathom_querier::bound_folded(rows, bound);
            mark_truncated(text(folded_text(&rows)), cut)
        }
        "top" => {
            let total: i64 = rows.iter().map(|r| r.1[0]).sum();
            let mut t = top(&rows);
            let cut = t.len().saturating_sub(bound);
            t.truncate(bound);
            mark_truncated(
                Json(json!({
                    "unit": m.profile_type.sample_unit,
                    "total": total,
                    "profiles": m.profiles,
                    "truncated": cut,
                    "rows": t.iter().map(|r| json!({"name": r.name, "flat": r.flat[0], "cum": r.cum[0]})).collect::<Vec<_>>(),
                }))
                .into_response(),
                cut,
            )
        }
        _ => Json(flamegraph(&rows, nodes).to_json()).into_response(),
    })
}

/// The two sides of a diff: (selector, range) for left and right.
#[allow(clippy::type_complexity)]
pub(crate) fn diff_params(
    q: &Querier,
    p: &HashMap<String, String>,
) -> Result<((Selector, Range), (Selector, Range)), ApiError> {
    let lr = range(q, p, "left_start", "left_end")?;
    let rr = range(q, p, "right_start", "right_end")?;
    let ls = selector(p, "left", true)?.unwrap_or_default();
    let rs = selector(p, "right", true)?.unwrap_or_default();
    if ls.profile_type != rs.profile_type {
        return Err(ApiError::bad_request(
            "left and right must name the same profile type",
        ));
    }
    Ok(((ls, lr), (rs, rr)))
}

async fn diff(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Response, ApiError> {
    let t = tenant(&h)?;
    let ((ls, lr), (rs, rr)) = diff_params(&q, &p)?;
    let format = p.get("format").map(String::as_str).unwrap_or("flamegraph");
    if !matches!(format, "folded" | "top" | "flamegraph") {
        return Err(ApiError::bad_request(format!(
            "format {format:?} is not one of folded, top, flamegraph"
        )));
    }
    let nodes = max_nodes(&q, &p)?;
    let bound = max_rows(&q, &p)?;
    let (l, r) = tokio::try_join!(
        q.merge(&t, &ls, lr.start, lr.end),
        q.merge(&t, &rs, rr.start, rr.end)
    )?;
    let cols = [(&l.samples[..], &l.symbols), (&r.samples[..], &r.symbols)];
    let rows = if format == "folded" {
        folded(cols)
    } else {
        folded_for_display(cols)
    };
    Ok(match format {
        "folded" => {
            let (rows, cut) = fathom_querier::bound_folded(rows, bound);
            mark_truncated(text(folded_text(&rows)), cut)
        }
        "top" => {
            let mut t = top(&rows);
            let cut = t.len().saturating_sub(bound);
            t.truncate(bound);
            mark_truncated(
                Json(json!({
                    "unit": l.profile_type.sample_unit,
                    "left_total": l.total(),
                    "right_total": r.total(),
                    "truncated": cut,
                    "rows": t.iter().map(|r| json!({
                        "name": r.name,
                        "left_flat": r.flat[0], "left_cum": r.cum[0],
                        "right_flat": r.flat[1], "right_cum": r.cum[1],
                    })).collect::<Vec<_>>(),
                }))
                .into_response(),
                cut,
            )
        }
        _ => Json(flamegraph(&rows, nodes).to_json()).into_response(),
    })
}

/// A bounded positive integer parameter.
fn int_param(
    p: &HashMap<String, String>,
    name: &str,
    default: usize,
    min: usize,
    max: usize,
) -> Result<usize, ApiError> {
    let Some(s) = p.get(name) else {
        return Ok(default);
    };
    match s.parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(ApiError::bad_request(format!(
            "{name} {s:?} must be an integer between {min} and {max}"
        ))),
    }
}

/// What changed between two selections: functions ranked by the change of
/// their share of the total, with a rank-test significance per function.
async fn changes(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Response, ApiError> {
    use fathom_querier::{ALPHA, Direction, Functions, rank};
    let t = tenant(&h)?;
    let ((ls, lr), (rs, rr)) = diff_params(&q, &p)?;
    let limit = int_param(&p, "limit", 100, 1, 10_000)?;
    let samples = int_param(&p, "samples", 100, 3, 1000)?;
    let dir = match p.get("direction") {
        None => Direction::Slower,
        Some(d) => Direction::parse(d).ok_or_else(|| {
            ApiError::bad_request(format!("direction {d:?} is not one of slower, faster, any"))
        })?,
    };
    let (l, r) = tokio::try_join!(
        q.observations(&t, &ls, lr.start, lr.end, samples),
        q.observations(&t, &rs, rr.start, rr.end, samples)
    )?;
    // Naming and ranking are CPU work: off the I/O runtime.
    let (l, r, a, b, ranked) = tokio::task::spawn_blocking(move || {
        let mut fns = Functions::default();
        let a = l.named(&mut fns);
        let b = r.named(&mut fns);
        let ranked = rank(&fns, &a, &b, dir);
        (l, r, a, b, ranked)
    })
    .await
    .map_err(|e| ApiError::internal(format!("ranking changes: {e}")))?;
    let side = |w: &fathom_querier::Window, o: &[fathom_querier::Observation]| {
        json!({
            "total": o.iter().map(|x| x.total).sum::<i64>(),
            "profiles": w.profiles,
            "observations": o.len(),
            "bucketed": w.bucketed,
        })
    };
    let unit = ls
        .profile_type
        .as_ref()
        .map(|pt| pt.sample_unit.clone())
        .unwrap_or_default();
    Ok(Json(json!({
        "unit": unit,
        "alpha": ALPHA,
        "left": side(&l, &a),
        "right": side(&r, &b),
        "functions": ranked.len(),
        "significant": ranked.iter().filter(|c| c.significant).count(),
        "changes": &ranked[..ranked.len().min(limit)],
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn querier() -> Querier {
        fathom_querier::test_querier(Arc::new(fathom_block::MemoryIndex::default()))
    }

    fn params(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A range longer than the request's tenant's limit (set by the
    /// server's authentication layer) is refused; the flag's applies
    /// outside a request.
    #[tokio::test]
    async fn a_too_long_range_is_refused_with_the_tenants_limit() {
        let q = querier();
        let day = std::time::Duration::from_secs(86_400);
        let two_days = 2 * day.as_nanos() as i64;
        let refused = fathom_api::auth::with_request_limits(
            fathom_api::auth::TenantLimits {
                max_query_range: Some(day),
                ..Default::default()
            },
            async { check_range(&q, 0, two_days, "start", "end").is_err() },
        )
        .await;
        assert!(refused);
        assert!(check_range(&q, 0, two_days, "start", "end").is_ok());
    }

    /// Negative, huge and extreme times are refused with 400 naming the
    /// bound; nothing overflows on the way (a debug build would panic).
    #[test]
    fn extreme_times_are_refused_not_overflowed() {
        let q = querier();
        let refused = |kv: &[(&str, &str)], want: &str| {
            let e = range(&q, &params(kv), "start", "end").err();
            let e = e.unwrap_or_else(|| panic!("{kv:?} was accepted"));
            assert_eq!(
                e.status(),
                axum::http::StatusCode::BAD_REQUEST,
                "{kv:?}: {e}"
            );
            assert!(e.to_string().contains(want), "{kv:?}: {e}");
        };
        let min_ms = (i64::MIN / 1_000_000).to_string();
        let max_ms = (i64::MAX / 1_000_000).to_string();
        // The default start (end minus an hour) of the smallest end.
        refused(&[("end", &min_ms)], "start is");
        refused(&[("start", &min_ms), ("end", &max_ms)], "start is");
        refused(&[("start", "-1"), ("end", "1000")], "start is");
        refused(&[("start", "0"), ("end", &max_ms)], "end is");
        refused(&[("start", "now-1000000y")], "start is");
        refused(
            &[("start", "1900-01-01T00:00:00Z"), ("end", "now")],
            "start is",
        );
        refused(&[("start", "2250-01-01T00:00:00Z")], "start is");
        refused(&[("start", "9223372036854775807")], "out of range");
        // The longest range is enforced between valid times.
        refused(&[("start", "0"), ("end", "now")], "longer than the limit");
        // Bounds themselves are fine.
        let r = range(
            &q,
            &params(&[("start", "0"), ("end", "1000")]),
            "start",
            "end",
        )
        .unwrap();
        assert_eq!((r.start, r.end), (0, 1_000_000_000));
    }

    #[test]
    fn steps_and_points_are_bounded() {
        let q = querier();
        let p = |step: &str| {
            params(&[
                ("query", "process_cpu:cpu:nanoseconds:cpu:nanoseconds{}"),
                ("start", "1700000000000"),
                ("end", "1700086400000"),
                ("step", step),
            ])
        };
        for step in ["0.000000001", "1e-300", "0", "-5", "NaN", "-inf"] {
            let e = range_params(&q, &p(step)).err().unwrap();
            assert_eq!(
                e.status(),
                axum::http::StatusCode::BAD_REQUEST,
                "{step}: {e}"
            );
        }
        // A huge step is one point, not an overflow.
        for step in ["1e300", "inf", "1000000y"] {
            let (_, _, s, _) = range_params(&q, &p(step)).unwrap();
            assert!(s > 0, "{step}");
        }
        let (_, r, s, _) = range_params(&q, &p("60")).unwrap();
        assert!((r.end - r.start) / s <= q.config().max_points);
    }
}
