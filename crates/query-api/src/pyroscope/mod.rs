//! Grafana's Pyroscope data source: Pyroscope's public query API
//! (`querier.v1.QuerierService` over Connect, proto or JSON) and the
//! `/pyroscope/render` and `/pyroscope/render-diff` endpoints (flamebearer
//! JSON) that Grafana's Profiles Drilldown calls (`docs/grafana.md`).
//!
//! ```text
//!  Connect POST /querier.v1.QuerierService/<Method>   GET /pyroscope/render[-diff]
//!        │ decode (proto | JSON, gzip), tenant              │ query params
//!        └──────────────┬───────────────────────────────────┘
//!                       ▼
//!   Pyroscope → Fathom: times in ms, profile_typeID + {label selector},
//!   the reserved labels (__profile_type__, __name__, …) of the profile type
//!                       ▼
//!   the engine of Fathom's own HTTP API: Querier::{series, profile_types,
//!   merge, range_counting}, render::{folded_for_display, flamegraph}
//!                       ▼
//!   Fathom → Pyroscope: flattened levels, series, pprof, flamebearer
//! ```
//!
//! One engine behind both APIs: for the same selection and range the
//! answers equal those of `/api/v1/…` (a flame graph is the same tree,
//! flattened). Span profiles, stack trace and profile id selectors,
//! exemplars, heatmaps and the tree/dot formats are not implemented: a
//! request that asks for them is refused with `unimplemented`, never
//! answered as if it had not.

mod levels;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fathom_api::{ApiError, now_nanos, parse_time, tenant_from_headers};
use fathom_block::SeriesRow;
use fathom_model::{Labels, Matcher, ProfileType, Selector, TenantId};
use fathom_proto::pyroscope::google::v1 as google;
use fathom_proto::pyroscope::querier::v1 as querier;
use fathom_proto::pyroscope::types::v1 as types;
use serde_json::json;

pub(crate) use self::levels::{Levels, flamebearer, levels};
use crate::http::{DEFAULT_MAX_NODES, Range, check_max_nodes, check_range};
use fathom_api::connect::{ConnectError, decode, respond, timeout};
use fathom_querier::{Merged, Querier};
use fathom_querier::{flamegraph, folded_for_display};

const SERVICE: &str = "/querier.v1.QuerierService";

/// The largest request body, compressed or not. Query requests are a few
/// hundred bytes (a selector is at most 16 KiB).
const MAX_REQUEST_BYTES: usize = 1 << 20;

/// The most matchers a metadata request may carry (each is a lookup).
const MAX_MATCHERS: usize = 64;

/// The most group-by labels of a series request.
const MAX_GROUP_BY: usize = 32;

/// Labels every Pyroscope series has, derived from its profile type.
const RESERVED: [&str; 6] = [
    "__name__",
    "__period_type__",
    "__period_unit__",
    "__profile_type__",
    "__type__",
    "__unit__",
];

/// The routes, to be merged into the querier's router.
pub(crate) fn router(q: Querier) -> axum::Router {
    let r = rpc(axum::Router::new(), "ProfileTypes", profile_types);
    let r = rpc(r, "LabelNames", label_names);
    let r = rpc(r, "LabelValues", label_values);
    let r = rpc(r, "Series", series);
    let r = rpc(r, "SelectMergeStacktraces", select_merge_stacktraces);
    let r = rpc(r, "SelectMergeProfile", select_merge_profile);
    let r = rpc(r, "SelectSeries", select_series);
    let r = rpc(r, "Diff", diff);
    let r = rpc(r, "GetProfileStats", profile_stats);
    r.route("/pyroscope/render", get(render))
        .route("/pyroscope/render-diff", get(render_diff))
        .with_state(q)
}

/// Adds `POST {SERVICE}/{method}`, served by `f` through [`unary`]; the
/// request message's type name names it in errors.
fn rpc<Req, Resp, F, Fut>(r: axum::Router<Querier>, method: &str, f: F) -> axum::Router<Querier>
where
    Req: prost::Message + Default + serde::de::DeserializeOwned + Send + 'static,
    Resp: prost::Message + serde::Serialize + Send + 'static,
    F: FnOnce(Querier, TenantId, Req) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Resp, ConnectError>> + Send,
{
    let what = std::any::type_name::<Req>()
        .rsplit("::")
        .next()
        .unwrap_or("request");
    r.route(
        &format!("{SERVICE}/{method}"),
        post(move |State(q): State<Querier>, h: HeaderMap, b: Body| unary(q, h, b, what, f)),
    )
}

/// One unary Connect call: decode, tenant, deadline, handler, encode.
async fn unary<Req, Resp, F, Fut>(
    q: Querier,
    h: HeaderMap,
    body: Body,
    what: &'static str,
    f: F,
) -> Response
where
    Req: prost::Message + Default + serde::de::DeserializeOwned,
    Resp: prost::Message + serde::Serialize,
    F: FnOnce(Querier, TenantId, Req) -> Fut,
    Fut: Future<Output = Result<Resp, ConnectError>>,
{
    let call = async {
        let (req, codec) = decode::<Req>(&h, body, MAX_REQUEST_BYTES, what).await?;
        let tenant = tenant_from_headers(&h)?;
        let deadline = timeout(&h)?;
        let fut = f(q, tenant, req);
        let resp = match deadline {
            None => fut.await?,
            Some(d) => tokio::time::timeout(d, fut).await.map_err(|_| {
                ConnectError::new(
                    tonic::Code::DeadlineExceeded,
                    format!("the call took longer than its Connect-Timeout-Ms of {d:?}"),
                )
            })??,
        };
        Ok::<_, ConnectError>(respond(codec, &resp))
    };
    match call.await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Unix milliseconds to nanoseconds; `name` says which in errors.
fn ms_to_nanos(ms: i64, name: &str) -> Result<i64, ApiError> {
    ms.checked_mul(1_000_000)
        .ok_or_else(|| ApiError::bad_request(format!("{name} {ms} ms is out of range")))
}

/// A request's `[start, end]` (unix ms). Zero means "not given", as in
/// Pyroscope: `end` is then now and `start` an hour before `end`, the
/// defaults of Fathom's HTTP API.
fn range_ms(q: &Querier, start: i64, end: i64) -> Result<Range, ApiError> {
    let end = if end == 0 {
        now_nanos()
    } else {
        ms_to_nanos(end, "end")?
    };
    let start = if start == 0 {
        end.saturating_sub(3600 * 1_000_000_000)
    } else {
        ms_to_nanos(start, "start")?
    };
    check_range(q, start, end, "start", "end")
}

/// The value of reserved label `name` for a series of type `pt`.
fn reserved(pt: &ProfileType, name: &str) -> Option<String> {
    Some(match name {
        "__name__" => pt.name.clone(),
        "__profile_type__" => pt.to_string(),
        "__type__" => pt.sample_type.clone(),
        "__unit__" => pt.sample_unit.clone(),
        "__period_type__" => pt.period_type.clone(),
        "__period_unit__" => pt.period_unit.clone(),
        _ => return None,
    })
}

/// A Pyroscope label selector: the part the engine evaluates (profile type
/// and series labels) and the matchers on reserved labels.
struct PSelector {
    labels: Selector,
    reserved: Vec<Matcher>,
}

impl PSelector {
    /// Parses `{k="v", …}` (a leading profile type is allowed); an empty
    /// string selects everything. `what` names the field in errors.
    fn parse(s: &str, what: &str) -> Result<Self, ApiError> {
        let sel = if s.trim().is_empty() {
            Selector::default()
        } else {
            Selector::parse(s).map_err(|e| ApiError::bad_request(format!("{what}: {e}")))?
        };
        let (reserved, matchers) = sel
            .matchers
            .into_iter()
            .partition(|m| RESERVED.contains(&m.name.as_str()));
        Ok(PSelector {
            labels: Selector {
                profile_type: sel.profile_type,
                matchers,
            },
            reserved,
        })
    }

    /// Whether a series of type `pt` passes the reserved-label matchers.
    fn reserved_match(&self, pt: &ProfileType) -> bool {
        self.reserved
            .iter()
            .all(|m| m.matches(&reserved(pt, &m.name).unwrap_or_default()))
    }
}

/// The series matching any of `matchers` (all series when there are none)
/// with data in `r`, by series id.
async fn matching_series(
    q: &Querier,
    t: &TenantId,
    matchers: &[String],
    r: &Range,
) -> Result<Vec<SeriesRow>, ApiError> {
    if matchers.len() > MAX_MATCHERS {
        return Err(ApiError::bad_request(format!(
            "{} matchers; the limit is {MAX_MATCHERS}",
            matchers.len()
        )));
    }
    if matchers.is_empty() {
        return Ok(q.series(t, None, r.start, r.end).await?);
    }
    let mut out = BTreeMap::new();
    for (i, m) in matchers.iter().enumerate() {
        let sel = PSelector::parse(m, &format!("matchers[{i}]"))?;
        for s in q.series(t, Some(&sel.labels), r.start, r.end).await? {
            if sel.reserved_match(&s.profile_type) {
                out.entry(s.series_id).or_insert(s);
            }
        }
    }
    Ok(out.into_values().collect())
}

/// A series' labels as Pyroscope shows them: its own plus the reserved ones.
fn pyroscope_labels(s: &SeriesRow) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = s
        .labels
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    for name in RESERVED {
        if let Some(v) = reserved(&s.profile_type, name) {
            m.insert(name.to_owned(), v);
        }
    }
    m
}

fn label_pairs<'a>(it: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<types::LabelPair> {
    it.into_iter()
        .map(|(k, v)| types::LabelPair {
            name: k.to_owned(),
            value: v.to_owned(),
        })
        .collect()
}

async fn profile_types(
    q: Querier,
    t: TenantId,
    req: querier::ProfileTypesRequest,
) -> Result<querier::ProfileTypesResponse, ConnectError> {
    let r = range_ms(&q, req.start, req.end)?;
    let ids = q.profile_types(&t, r.start, r.end).await?;
    let mut profile_types = Vec::with_capacity(ids.len());
    for id in ids {
        let pt: ProfileType = id
            .parse()
            .map_err(|e| ConnectError::internal(format!("stored profile type: {e}")))?;
        profile_types.push(types::ProfileType {
            id,
            name: pt.name,
            sample_type: pt.sample_type,
            sample_unit: pt.sample_unit,
            period_type: pt.period_type,
            period_unit: pt.period_unit,
        });
    }
    Ok(querier::ProfileTypesResponse { profile_types })
}

async fn label_names(
    q: Querier,
    t: TenantId,
    req: types::LabelNamesRequest,
) -> Result<types::LabelNamesResponse, ConnectError> {
    let r = range_ms(&q, req.start, req.end)?;
    let series = matching_series(&q, &t, &req.matchers, &r).await?;
    let names: BTreeSet<String> = series
        .iter()
        .flat_map(|s| pyroscope_labels(s).into_keys())
        .collect();
    Ok(types::LabelNamesResponse {
        names: names.into_iter().collect(),
    })
}

async fn label_values(
    q: Querier,
    t: TenantId,
    req: types::LabelValuesRequest,
) -> Result<types::LabelValuesResponse, ConnectError> {
    if req.name.is_empty() {
        return Err(ConnectError::invalid(
            "name (the label whose values to list) is required",
        ));
    }
    let r = range_ms(&q, req.start, req.end)?;
    let series = matching_series(&q, &t, &req.matchers, &r).await?;
    let values: BTreeSet<String> = series
        .iter()
        .filter_map(|s| {
            reserved(&s.profile_type, &req.name)
                .or_else(|| s.labels.get(&req.name).map(str::to_owned))
        })
        .filter(|v| !v.is_empty())
        .collect();
    Ok(types::LabelValuesResponse {
        names: values.into_iter().collect(),
    })
}

async fn series(
    q: Querier,
    t: TenantId,
    req: querier::SeriesRequest,
) -> Result<querier::SeriesResponse, ConnectError> {
    let r = range_ms(&q, req.start, req.end)?;
    let rows = matching_series(&q, &t, &req.matchers, &r).await?;
    let mut sets: BTreeSet<Vec<(String, String)>> = BTreeSet::new();
    for s in &rows {
        let mut l = pyroscope_labels(s);
        if !req.label_names.is_empty() {
            l.retain(|k, _| req.label_names.contains(k));
        }
        sets.insert(l.into_iter().collect());
    }
    Ok(querier::SeriesResponse {
        labels_set: sets
            .into_iter()
            .map(|l| types::Labels {
                labels: label_pairs(l.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            })
            .collect(),
    })
}

/// What a select request names: a profile type, the engine's selector,
/// and whether the reserved-label matchers leave anything to select.
struct Selection {
    profile_type: ProfileType,
    sel: Selector,
    none: bool,
    range: Range,
}

fn selection(
    q: &Querier,
    profile_type_id: &str,
    label_selector: &str,
    start: i64,
    end: i64,
) -> Result<Selection, ApiError> {
    if profile_type_id.is_empty() {
        return Err(ApiError::bad_request(
            "profile_typeID is required, e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        ));
    }
    let pt: ProfileType = profile_type_id
        .parse()
        .map_err(|e| ApiError::bad_request(format!("profile_typeID: {e}")))?;
    let ps = PSelector::parse(label_selector, "label_selector")?;
    if ps.labels.profile_type.is_some() {
        return Err(ApiError::bad_request(
            "label_selector must be label matchers only, e.g. {service_name=\"app\"}: the profile type goes in profile_typeID",
        ));
    }
    let none = !ps.reserved_match(&pt);
    Ok(Selection {
        sel: Selector {
            profile_type: Some(pt.clone()),
            matchers: ps.labels.matchers,
        },
        profile_type: pt,
        none,
        range: range_ms(q, start, end)?,
    })
}

/// The node limit of a request: absent or 0 is the HTTP API's default.
fn request_max_nodes(q: &Querier, n: Option<i64>) -> Result<usize, ApiError> {
    match n {
        None | Some(0) => Ok(DEFAULT_MAX_NODES),
        Some(n) => check_max_nodes(q, n),
    }
}

/// Refuses what Fathom does not implement rather than ignoring it.
fn refuse_unsupported(
    stack_trace_selector: Option<&types::StackTraceSelector>,
    profile_ids: &[String],
    trace_ids: &[String],
    spans: &[String],
) -> Result<(), ConnectError> {
    if let Some(s) = stack_trace_selector
        && (!s.call_site.is_empty() || s.go_pgo.is_some())
    {
        return Err(ConnectError::unimplemented(
            "stack_trace_selector (call site and Go PGO filters) is not supported yet",
        ));
    }
    if !profile_ids.is_empty() {
        return Err(ConnectError::unimplemented(
            "profile_id_selector is not supported yet",
        ));
    }
    if !trace_ids.is_empty() || !spans.is_empty() {
        return Err(ConnectError::unimplemented(
            "span profiles (span_selector, trace_id_selector) are not supported yet",
        ));
    }
    Ok(())
}

/// The merge of a selection (empty when its reserved matchers exclude it).
async fn merge(q: &Querier, t: &TenantId, s: &Selection) -> Result<Merged, ApiError> {
    if s.none {
        return Ok(Merged {
            profile_type: s.profile_type.clone(),
            samples: Vec::new(),
            symbols: Default::default(),
            profiles: 0,
            period: 0,
            start: s.range.start,
            end: s.range.end,
        });
    }
    Ok(q.merge(t, &s.sel, s.range.start, s.range.end).await?)
}

/// The flame graph of Fathom's HTTP API for these merges (one for a
/// profile, left and right for a diff), flattened; CPU work, so off the
/// I/O runtime.
async fn flame_levels<const N: usize>(
    merged: [Merged; N],
    max_nodes: usize,
) -> Result<Levels, ApiError> {
    tokio::task::spawn_blocking(move || {
        let cols: [(&[(fathom_model::Id, i64)], &fathom_model::Symbols); N] =
            std::array::from_fn(|i| (&merged[i].samples[..], &merged[i].symbols));
        let rows = folded_for_display(cols);
        levels(&flamegraph(&rows, max_nodes))
    })
    .await
    .map_err(|e| ApiError::internal(format!("building the flame graph: {e}")))
}

fn flame_graph_message(l: Levels) -> querier::FlameGraph {
    querier::FlameGraph {
        names: l.names,
        levels: l
            .levels
            .into_iter()
            .map(|values| querier::Level { values })
            .collect(),
        total: l.total,
        max_self: l.max_self,
    }
}

/// The stacks a pprof answer keeps: the request's `max_nodes`, absent or 0
/// the configured maximum (as `/api/v1/query?format=pprof`).
fn pprof_max_stacks(q: &Querier, n: Option<i64>) -> Result<usize, ApiError> {
    match n {
        None | Some(0) => Ok(q.config().max_flame_nodes),
        Some(n) => check_max_nodes(q, n),
    }
}

/// The merge as Pyroscope's `google.v1.Profile` (pprof's wire format),
/// with at most `max_stacks` stacks (the smallest summed into one `other`
/// frame).
fn pprof_message(m: &Merged, max_stacks: usize) -> Result<google::Profile, ConnectError> {
    use prost::Message;
    let cut = fathom_querier::bound_samples(&m.samples, &m.symbols, max_stacks);
    let (samples, symbols) = match &cut {
        Some((s, y, _)) => (&s[..], y),
        None => (&m.samples[..], &m.symbols),
    };
    let p = fathom_pprof::to_pprof(
        &m.profile_type,
        samples,
        symbols,
        m.start,
        m.end - m.start,
        m.period,
    );
    google::Profile::decode(p.encode_to_vec().as_slice())
        .map_err(|e| ConnectError::internal(format!("re-reading the pprof: {e}")))
}

async fn select_merge_stacktraces(
    q: Querier,
    t: TenantId,
    req: querier::SelectMergeStacktracesRequest,
) -> Result<querier::SelectMergeStacktracesResponse, ConnectError> {
    refuse_unsupported(
        req.stack_trace_selector.as_ref(),
        &req.profile_id_selector,
        &req.trace_id_selector,
        &req.span_selector,
    )?;
    if req.r#async.as_ref().is_some_and(|a| {
        !a.request_id.is_empty() || a.r#type == querier::AsyncQueryType::Force as i32
    }) {
        return Err(ConnectError::unimplemented(
            "async queries are not supported",
        ));
    }
    let format = querier::ProfileFormat::try_from(req.format).map_err(|_| {
        ConnectError::invalid(format!("format {} is not a ProfileFormat", req.format))
    })?;
    let s = selection(
        &q,
        &req.profile_type_id,
        &req.label_selector,
        req.start,
        req.end,
    )?;
    let nodes = request_max_nodes(&q, req.max_nodes)?;
    match format {
        querier::ProfileFormat::Unspecified | querier::ProfileFormat::Flamegraph => {
            let m = merge(&q, &t, &s).await?;
            let l = flame_levels([m], nodes).await?;
            Ok(querier::SelectMergeStacktracesResponse {
                flamegraph: Some(flame_graph_message(l)),
                ..Default::default()
            })
        }
        querier::ProfileFormat::Pprof => {
            let max = pprof_max_stacks(&q, req.max_nodes)?;
            let m = merge(&q, &t, &s).await?;
            Ok(querier::SelectMergeStacktracesResponse {
                pprof: Some(querier::PprofProfile {
                    profile: Some(pprof_message(&m, max)?),
                }),
                ..Default::default()
            })
        }
        querier::ProfileFormat::Tree | querier::ProfileFormat::Dot => {
            Err(ConnectError::unimplemented(format!(
                "format {} is not supported: use PROFILE_FORMAT_FLAMEGRAPH or PROFILE_FORMAT_PPROF",
                format.as_str_name()
            )))
        }
    }
}

async fn select_merge_profile(
    q: Querier,
    t: TenantId,
    req: querier::SelectMergeProfileRequest,
) -> Result<google::Profile, ConnectError> {
    refuse_unsupported(
        req.stack_trace_selector.as_ref(),
        &req.profile_id_selector,
        &req.trace_id_selector,
        &[],
    )?;
    let s = selection(
        &q,
        &req.profile_type_id,
        &req.label_selector,
        req.start,
        req.end,
    )?;
    let max = pprof_max_stacks(&q, req.max_nodes)?;
    let m = merge(&q, &t, &s).await?;
    pprof_message(&m, max)
}

/// A series request's step in nanoseconds: `step` seconds, or (0) the HTTP
/// API's default of range/240, at least 1 s.
fn step_nanos(q: &Querier, step_secs: f64, r: &Range) -> Result<i64, ApiError> {
    let span = (r.end - r.start).max(1);
    let step = if step_secs == 0.0 {
        (span / 240).max(1_000_000_000)
    } else if step_secs.is_finite() && step_secs > 0.0 && step_secs * 1e9 < i64::MAX as f64 {
        ((step_secs * 1e9) as i64).max(1)
    } else {
        return Err(ApiError::bad_request(format!(
            "step {step_secs} must be a positive number of seconds"
        )));
    };
    if span / step > q.max_points() {
        return Err(ApiError::bad_request(format!(
            "step is too small: {} points per series; the limit is {}",
            span / step,
            q.max_points()
        )));
    }
    Ok(step)
}

/// A series' points: (unix ms, value).
type Points = Vec<(i64, f64)>;

/// What [`series_points`] computes.
struct SeriesQuery<'a> {
    selection: &'a Selection,
    step: i64,
    group_by: &'a [String],
    average: bool,
    limit: Option<usize>,
}

/// The points of a series request through the engine's range query:
/// per group (all series summed into one when `group_by` is empty, as in
/// Pyroscope), per step, the sum of the profiles' values, or their average
/// per profile.
async fn series_points(
    q: &Querier,
    t: &TenantId,
    sq: SeriesQuery<'_>,
) -> Result<Vec<(Labels, Points)>, ApiError> {
    let s = sq.selection;
    if sq.group_by.len() > MAX_GROUP_BY {
        return Err(ApiError::bad_request(format!(
            "{} group_by labels; the limit is {MAX_GROUP_BY}",
            sq.group_by.len()
        )));
    }
    if s.none {
        return Ok(Vec::new());
    }
    let (virt, real): (Vec<String>, Vec<String>) = sq
        .group_by
        .iter()
        .cloned()
        .partition(|g| RESERVED.contains(&g.as_str()));
    let raw = q
        .range_counting(
            t,
            &s.sel,
            s.range.start,
            s.range.end,
            sq.step,
            real.clone(),
            sq.average,
        )
        .await?;
    // (sum, profiles) per group and timestamp.
    let mut groups: BTreeMap<Labels, BTreeMap<i64, (i64, i64)>> = BTreeMap::new();
    for rs in raw {
        let labels = if real.is_empty() {
            Labels::new()
        } else {
            rs.labels
        };
        let g = groups.entry(labels).or_default();
        for (i, (ts, v)) in rs.points.iter().enumerate() {
            let p = g.entry(*ts).or_default();
            p.0 = p.0.saturating_add(*v);
            p.1 += rs.profiles.get(i).copied().unwrap_or(0);
        }
    }
    let mut out: Vec<(Labels, Points, f64)> = groups
        .into_iter()
        .map(|(mut labels, pts)| {
            for g in &virt {
                if let Some(v) = reserved(&s.profile_type, g) {
                    labels.insert(g, &v);
                }
            }
            let points: Vec<(i64, f64)> = pts
                .into_iter()
                .map(|(ts, (sum, n))| {
                    let v = if sq.average && n > 0 {
                        sum as f64 / n as f64
                    } else {
                        sum as f64
                    };
                    (ts, v)
                })
                .collect();
            let total = points.iter().map(|p| p.1).sum();
            (labels, points, total)
        })
        .collect();
    if let Some(n) = sq.limit
        && out.len() > n
    {
        out.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        out.truncate(n);
        out.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ok(out.into_iter().map(|(l, p, _)| (l, p)).collect())
}

fn aggregation_is_average(a: Option<i32>) -> Result<bool, ApiError> {
    match a.map(types::TimeSeriesAggregationType::try_from) {
        None | Some(Ok(types::TimeSeriesAggregationType::Sum)) => Ok(false),
        Some(Ok(types::TimeSeriesAggregationType::Average)) => Ok(true),
        Some(Err(_)) => Err(ApiError::bad_request(format!(
            "aggregation {} is not a TimeSeriesAggregationType",
            a.unwrap_or_default()
        ))),
    }
}

async fn select_series(
    q: Querier,
    t: TenantId,
    req: querier::SelectSeriesRequest,
) -> Result<querier::SelectSeriesResponse, ConnectError> {
    refuse_unsupported(req.stack_trace_selector.as_ref(), &[], &[], &[])?;
    let s = selection(
        &q,
        &req.profile_type_id,
        &req.label_selector,
        req.start,
        req.end,
    )?;
    let step = step_nanos(&q, req.step, &s.range)?;
    let limit = match req.limit {
        None | Some(0) => None,
        Some(n) => Some(
            usize::try_from(n)
                .map_err(|_| ConnectError::invalid(format!("limit {n} must not be negative")))?,
        ),
    };
    let points = series_points(
        &q,
        &t,
        SeriesQuery {
            selection: &s,
            step,
            group_by: &req.group_by,
            average: aggregation_is_average(req.aggregation)?,
            limit,
        },
    )
    .await?;
    Ok(querier::SelectSeriesResponse {
        series: points
            .into_iter()
            .map(|(labels, pts)| types::Series {
                labels: label_pairs(labels.iter()),
                points: pts
                    .into_iter()
                    .map(|(timestamp, value)| types::Point {
                        value,
                        timestamp,
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect(),
    })
}

async fn diff(
    q: Querier,
    t: TenantId,
    req: querier::DiffRequest,
) -> Result<querier::DiffResponse, ConnectError> {
    let side = |r: Option<&querier::SelectMergeStacktracesRequest>, name: &str| {
        let r = r.ok_or_else(|| ConnectError::invalid(format!("{name} is required")))?;
        refuse_unsupported(
            r.stack_trace_selector.as_ref(),
            &r.profile_id_selector,
            &r.trace_id_selector,
            &r.span_selector,
        )?;
        let s = selection(&q, &r.profile_type_id, &r.label_selector, r.start, r.end)
            .map_err(|e| ConnectError::from(ApiError::bad_request(format!("{name}: {e}"))))?;
        Ok::<_, ConnectError>((s, r.max_nodes))
    };
    let (l, nodes) = side(req.left.as_ref(), "left")?;
    let (r, _) = side(req.right.as_ref(), "right")?;
    if l.profile_type != r.profile_type {
        return Err(ConnectError::invalid(
            "left and right must name the same profile type",
        ));
    }
    let nodes = request_max_nodes(&q, nodes)?;
    let (lm, rm) = tokio::try_join!(merge(&q, &t, &l), merge(&q, &t, &r))?;
    let lv = flame_levels([lm, rm], nodes).await?;
    Ok(querier::DiffResponse {
        flamegraph: Some(querier::FlameGraphDiff {
            left_ticks: lv.ticks[0],
            right_ticks: lv.ticks[1],
            names: lv.names,
            levels: lv
                .levels
                .into_iter()
                .map(|values| querier::Level { values })
                .collect(),
            total: lv.total,
            max_self: lv.max_self,
        }),
    })
}

/// Whether the tenant has data at all, and its oldest and newest profile
/// times: from the heads and the block index (block metadata only).
async fn profile_stats(
    q: Querier,
    t: TenantId,
    _req: types::GetProfileStatsRequest,
) -> Result<types::GetProfileStatsResponse, ConnectError> {
    let span = q.time_span(&t).await?;
    Ok(if let Some((oldest, newest)) = span {
        types::GetProfileStatsResponse {
            data_ingested: true,
            oldest_profile_time: oldest / 1_000_000,
            newest_profile_time: newest / 1_000_000,
        }
    } else {
        types::GetProfileStatsResponse::default()
    })
}

// ---- /pyroscope/render and /pyroscope/render-diff ----

type Params = Query<Vec<(String, String)>>;

fn param<'a>(p: &'a [(String, String)], name: &str) -> Option<&'a str> {
    p.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A render time: `now`, `now-<duration>`, RFC 3339, or a unix timestamp
/// in seconds, milliseconds or nanoseconds (told apart by size).
fn render_time(s: &str, now: i64, name: &str) -> Result<i64, ApiError> {
    if let Ok(n) = s.trim().parse::<i64>() {
        let scaled = match n.unsigned_abs() {
            0..100_000_000_000 => n.checked_mul(1_000_000_000),
            100_000_000_000..100_000_000_000_000 => n.checked_mul(1_000_000),
            _ => Some(n),
        };
        return scaled.ok_or_else(|| ApiError::bad_request(format!("{name} {n} is out of range")));
    }
    parse_time(s, now).map_err(|e| ApiError::bad_request(format!("{name}: {e}")))
}

/// The selection of a render query (`<profile type>{…}`) over `from..until`.
fn render_selection(
    q: &Querier,
    p: &[(String, String)],
    query: &str,
    from: &str,
    until: &str,
) -> Result<Selection, ApiError> {
    let text = param(p, query)
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{query} is required, e.g. {query}=process_cpu:cpu:nanoseconds:cpu:nanoseconds{{service_name=\"app\"}}"
            ))
        })?;
    let ps = PSelector::parse(text, query)?;
    let pt = ps.labels.profile_type.clone().ok_or_else(|| {
        ApiError::bad_request(format!(
            "{query} must start with a profile type, e.g. process_cpu:cpu:nanoseconds:cpu:nanoseconds{{service_name=\"app\"}}"
        ))
    })?;
    let now = now_nanos();
    let end = match param(p, until) {
        Some(u) if !u.is_empty() => render_time(u, now, until)?,
        _ => now,
    };
    let start = match param(p, from) {
        Some(f) if !f.is_empty() => render_time(f, now, from)?,
        _ => end.saturating_sub(3600 * 1_000_000_000),
    };
    Ok(Selection {
        none: !ps.reserved_match(&pt),
        profile_type: pt,
        sel: ps.labels,
        range: check_range(q, start, end, from, until)?,
    })
}

/// `max-nodes` or `maxNodes`; absent or 0 is the default.
fn render_max_nodes(q: &Querier, p: &[(String, String)]) -> Result<usize, ApiError> {
    match param(p, "maxNodes").or_else(|| param(p, "max-nodes")) {
        None | Some("") => Ok(DEFAULT_MAX_NODES),
        Some(s) => {
            let n: i64 = s.parse().map_err(|_| {
                ApiError::bad_request(format!("max-nodes {s:?} is not a positive integer"))
            })?;
            request_max_nodes(q, Some(n))
        }
    }
}

/// The timeline step Pyroscope's render picks: about 1,500 points over the
/// range, at least 15 s, rounded to a familiar interval. Seconds.
fn render_step_secs(r: &Range) -> i64 {
    let raw = (r.end - r.start) / 1500 / 1_000_000; // ms
    const STEPS: [(i64, i64); 14] = [
        (17_500, 15),
        (25_000, 20),
        (45_000, 30),
        (90_000, 60),
        (210_000, 120),
        (450_000, 300),
        (750_000, 600),
        (1_050_000, 900),
        (1_500_000, 1200),
        (2_700_000, 1800),
        (5_400_000, 3600),
        (9_000_000, 7200),
        (16_200_000, 10_800),
        (32_400_000, 21_600),
    ];
    STEPS
        .iter()
        .find(|(upto, _)| raw <= *upto)
        .map_or(43_200, |(_, s)| *s)
}

/// A flamebearer timeline: `startTime` (unix s, snapped to the step) and
/// one sample per step to the end of the range.
fn timeline(points: &[(i64, f64)], r: &Range, step_secs: i64) -> serde_json::Value {
    let step_ms = step_secs * 1000;
    let start_ms = (r.start / 1_000_000).div_euclid(step_ms) * step_ms;
    let end_ms = (r.end / 1_000_000).div_euclid(step_ms) * step_ms;
    let n = usize::try_from((end_ms - start_ms) / step_ms).unwrap_or(0);
    let mut samples = vec![0u64; n];
    for (ts, v) in points {
        let i = (ts - start_ms).div_euclid(step_ms);
        if let Some(slot) = usize::try_from(i).ok().and_then(|i| samples.get_mut(i)) {
            *slot = slot.saturating_add(*v as u64);
        }
    }
    json!({
        "startTime": start_ms / 1000,
        "samples": samples,
        "durationDelta": step_secs,
        "watermarks": null,
    })
}

async fn render(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Json<serde_json::Value>, ApiError> {
    let t = tenant_from_headers(&h)?;
    match param(&p, "format") {
        None | Some("") | Some("json") => {}
        Some(f) => {
            return Err(ApiError::bad_request(format!(
                "format {f:?} is not supported: use json (flamebearer)"
            )));
        }
    }
    let s = render_selection(&q, &p, "query", "from", "until")?;
    let nodes = render_max_nodes(&q, &p)?;
    let group_by: Vec<String> = p
        .iter()
        .filter(|(k, v)| k == "groupBy" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    let average = match param(&p, "aggregation") {
        None | Some("") | Some("sum") => false,
        Some("avg") => true,
        Some(a) => {
            return Err(ApiError::bad_request(format!(
                "aggregation {a:?} is not one of sum, avg"
            )));
        }
    };
    let step = render_step_secs(&s.range);
    let (m, series) = tokio::try_join!(
        merge(&q, &t, &s),
        series_points(
            &q,
            &t,
            SeriesQuery {
                selection: &s,
                step: step * 1_000_000_000,
                group_by: &group_by,
                average,
                limit: None,
            },
        )
    )?;
    let l = flame_levels([m], nodes).await?;
    let main = match series.as_slice() {
        [(_, pts)] => timeline(pts, &s.range, step),
        _ => timeline(&[], &s.range, step),
    };
    let groups = if group_by.is_empty() {
        serde_json::Value::Null
    } else {
        let mut g = serde_json::Map::new();
        for (labels, pts) in &series {
            let key = labels.get(&group_by[0]).unwrap_or("*").to_owned();
            g.insert(key, timeline(pts, &s.range, step));
        }
        serde_json::Value::Object(g)
    };
    Ok(Json(flamebearer(&l, &s.profile_type, main, groups)))
}

async fn render_diff(
    State(q): State<Querier>,
    h: HeaderMap,
    Query(p): Params,
) -> Result<Json<serde_json::Value>, ApiError> {
    let t = tenant_from_headers(&h)?;
    let l = render_selection(&q, &p, "leftQuery", "leftFrom", "leftUntil")?;
    let r = render_selection(&q, &p, "rightQuery", "rightFrom", "rightUntil")?;
    if l.profile_type != r.profile_type {
        return Err(ApiError::bad_request(
            "leftQuery and rightQuery must name the same profile type",
        ));
    }
    let nodes = render_max_nodes(&q, &p)?;
    let (lm, rm) = tokio::try_join!(merge(&q, &t, &l), merge(&q, &t, &r))?;
    let lv = flame_levels([lm, rm], nodes).await?;
    Ok(Json(flamebearer(
        &lv,
        &l.profile_type,
        serde_json::Value::Null,
        serde_json::Value::Null,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_labels_select_by_profile_type() {
        let cpu: ProfileType = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
            .parse()
            .unwrap();
        let mem: ProfileType = "memory:inuse_space:bytes:space:bytes".parse().unwrap();
        let s = PSelector::parse(
            r#"{__profile_type__="process_cpu:cpu:nanoseconds:cpu:nanoseconds", service_name="a"}"#,
            "m",
        )
        .unwrap();
        assert!(s.reserved_match(&cpu));
        assert!(!s.reserved_match(&mem));
        assert_eq!(s.labels.matchers.len(), 1);
        assert_eq!(s.labels.matchers[0].name, "service_name");
        let s = PSelector::parse(r#"{__name__=~"mem.*"}"#, "m").unwrap();
        assert!(s.reserved_match(&mem) && !s.reserved_match(&cpu));
        // Grafana's empty selector.
        let s = PSelector::parse("{}", "m").unwrap();
        assert!(s.labels.matchers.is_empty() && s.reserved.is_empty());
        assert!(PSelector::parse("", "m").is_ok());
        let e = PSelector::parse("{service_name=}", "label_selector")
            .err()
            .unwrap();
        assert!(e.to_string().starts_with("label_selector: "), "{e}");
    }

    #[test]
    fn render_times_by_size_and_form() {
        let now = 1_700_000_000_000_000_000;
        assert_eq!(render_time("1700000000", now, "from").unwrap(), now);
        assert_eq!(render_time("1700000000000", now, "from").unwrap(), now);
        assert_eq!(
            render_time("1700000000000000000", now, "from").unwrap(),
            now
        );
        assert_eq!(
            render_time("now-1h", now, "from").unwrap(),
            now - 3_600_000_000_000
        );
        assert!(
            render_time("tomorrow", now, "from")
                .unwrap_err()
                .to_string()
                .contains("from")
        );
    }

    #[test]
    fn timeline_backfills_every_step() {
        let r = Range {
            start: 1_000_000_000_000,
            end: 1_000_000_000_000 + 60_000_000_000,
        };
        // 15 s steps from 990 s (the start, snapped) to 1050 s: four.
        let t = timeline(&[(1_000_000, 5.0), (1_040_000, 7.0)], &r, 15);
        assert_eq!(t["startTime"], 990);
        assert_eq!(t["durationDelta"], 15);
        assert_eq!(t["samples"], json!([5, 0, 0, 7]));
    }

    #[test]
    fn render_steps_follow_pyroscope() {
        let r = |secs: i64| Range {
            start: 0,
            end: secs * 1_000_000_000,
        };
        assert_eq!(render_step_secs(&r(3600)), 15);
        assert_eq!(render_step_secs(&r(24 * 3600)), 60);
        assert_eq!(render_step_secs(&r(7 * 24 * 3600)), 300);
        assert_eq!(render_step_secs(&r(31 * 24 * 3600)), 1800);
    }
}
