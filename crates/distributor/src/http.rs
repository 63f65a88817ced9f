//! `POST /ingest`: the ingest convention that Pyroscope clients use.
//!
//! `name=<service>[.<kind>]{k=v,…}`, `from`/`until` (unix seconds),
//! `format=pprof|folded|jfr|speedscope` (default folded, as in Pyroscope),
//! and for folded `units`, `sampleRate`, `aggregationType` (`sampleRate`
//! for jfr and speedscope too). The body is raw or gzip'd
//! (`Content-Encoding: gzip` or the gzip magic), or `multipart/form-data`
//! with the profile in a `profile` part (the Go SDK's form); JFR's form has
//! a `jfr` part (the recording) and an optional `labels` part (a
//! `LabelsSnapshot`, Pyroscope's Java agent's form).
//!
//! Also mounts the other HTTP write routes: push.v1 (Connect and gRPC) and
//! OTLP/HTTP (`POST /v1development/profiles`).

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Query, Request, State};
use axum::http::{HeaderMap, header};
use axum::routing::post;
use fathom_api::{ApiError, tenant_from_headers};
use fathom_model::{Labels, SERVICE_NAME, TenantId, valid_label_name};
use serde_json::json;

use crate::{
    Accepted, Distributor, Encoding, FoldedParams, Format, Idempotence, IngestRequest, JfrParams,
    Payload,
};

/// The write routes, to be merged into the server's router: `/ingest` and
/// Pyroscope's `push.v1.PusherService/Push` (Connect and gRPC on one path).
pub fn router(d: Distributor) -> axum::Router {
    let limit = d.limits.max_body_bytes;
    let push_v1 = axum::Router::new()
        .route(crate::PUSH_V1_PATH, post(crate::push_v1::handle))
        .with_state(crate::push_v1::PushV1::new(d.clone()));
    axum::Router::new()
        .route("/ingest", post(ingest))
        .route(crate::otlp::HTTP_PATH, post(crate::otlp::export_http))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(d.clone())
        .merge(push_v1)
        .layer(axum::middleware::from_fn_with_state(d, over_rate_early))
}

/// Refuses a write whose tenant is over its ingestion rate before its body
/// is read (by its `Content-Length`), so that a tenant flooding far above
/// its rate costs little more than its request headers. Writes that fit go
/// on and take their bytes in [`Distributor::ingest`].
async fn over_rate_early(
    State(d): State<Distributor>,
    req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let len = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let (Some(len), Some(_)) = (len, &d.tenants)
        && !fathom_api::connect::is_grpc(req.headers())
        && let Ok(tenant) = tenant_from_headers(req.headers())
        && let Err(e) = d.check_rate(&tenant, len)
    {
        d.refused(&tenant, "rate");
        // push.v1 over Connect answers in Connect's error shape.
        if req.uri().path() == crate::PUSH_V1_PATH {
            return fathom_api::connect::ConnectError::from(e).into_response();
        }
        return e.into_response();
    }
    next.run(req).await
}

/// Kinds that Pyroscope clients append to the application name.
const KINDS: &[&str] = &[
    "cpu",
    "itimer",
    "wall",
    "alloc_objects",
    "alloc_space",
    "inuse_objects",
    "inuse_space",
    "goroutines",
    "mutex_count",
    "mutex_duration",
    "block_count",
    "block_duration",
    "exceptions",
    "lock_count",
    "lock_duration",
];

/// An application name: service, optional kind suffix, labels.
#[derive(Debug, PartialEq)]
pub(crate) struct AppName {
    pub(crate) service: String,
    pub(crate) kind: Option<String>,
    pub(crate) labels: Labels,
}

/// Parses `service[.kind]{k=v, k2="v 2"}`.
pub(crate) fn parse_app_name(s: &str) -> Result<AppName, ApiError> {
    let s = s.trim();
    let (head, body) = match s.find('{') {
        Some(i) => {
            let rest = &s[i + 1..];
            let body = rest.strip_suffix('}').ok_or_else(|| {
                ApiError::bad_request(format!("name {s:?}: missing closing '}}'"))
            })?;
            (&s[..i], Some(body))
        }
        None => (s, None),
    };
    if head.is_empty() {
        return Err(ApiError::bad_request("name: the application name is empty"));
    }
    let (service, kind) = match head.rsplit_once('.') {
        Some((svc, k)) if KINDS.contains(&k) && !svc.is_empty() => (svc, Some(k.to_owned())),
        _ => (head, None),
    };
    let mut pairs: Vec<(String, String)> = vec![(SERVICE_NAME.to_owned(), service.to_owned())];
    if let Some(body) = body {
        for part in split_top(body) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (k, v) = part.split_once('=').ok_or_else(|| {
                ApiError::bad_request(format!("name: label {part:?} is not key=value"))
            })?;
            let k = k.trim();
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|x| x.strip_suffix('"'))
                .unwrap_or(v);
            if !valid_label_name(k) {
                return Err(ApiError::bad_request(format!(
                    "name: label name {k:?} is not valid: use [a-zA-Z_][a-zA-Z0-9_.]*"
                )));
            }
            if k == "__name__" || k == SERVICE_NAME {
                continue;
            }
            pairs.push((k.to_owned(), v.to_owned()));
        }
    }
    let labels =
        Labels::from_pairs(pairs).map_err(|e| ApiError::bad_request(format!("name: {e}")))?;
    Ok(AppName {
        service: service.to_owned(),
        kind,
        labels,
    })
}

/// Splits on commas outside double quotes.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// A Pyroscope time: unix seconds (milliseconds or nanoseconds when the
/// number is too large to be seconds), as nanoseconds.
fn pyroscope_time(name: &str, s: &str) -> Result<i64, ApiError> {
    let v: i64 = s.trim().parse().map_err(|_| {
        ApiError::bad_request(format!("{name} {s:?} is not a unix time in seconds"))
    })?;
    let nanos = if v < 0 {
        return Err(ApiError::bad_request(format!("{name} {s:?} is negative")));
    } else if v < 100_000_000_000 {
        v.checked_mul(1_000_000_000)
    } else if v < 100_000_000_000_000 {
        v.checked_mul(1_000_000)
    } else {
        Some(v)
    };
    nanos.ok_or_else(|| ApiError::bad_request(format!("{name} {s:?} is out of range")))
}

async fn ingest(
    State(d): State<Distributor>,
    Query(p): Query<HashMap<String, String>>,
    headers: HeaderMap,
    req: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    let r = ingest_inner(&d, &p, &headers, req).await;
    d.count_request("http", r.is_ok());
    let a = r?;
    Ok(Json(
        json!({ "profiles": a.profiles, "samples": a.samples }),
    ))
}

/// The parts of a request body: the profile, and for JFR its labels part.
struct Body {
    profile: Bytes,
    labels: Option<Bytes>,
    /// Bytes received (all parts read).
    received: usize,
}

/// Reads the body: raw, or `multipart/form-data` with the profile in the
/// part named `part` (`profile`, or `jfr` with an optional `labels` part).
async fn read_body(
    d: &Distributor,
    headers: &HeaderMap,
    req: Request,
    part: &str,
) -> Result<Body, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.starts_with("multipart/form-data") {
        let mut mp = Multipart::from_request(req, &())
            .await
            .map_err(|e| ApiError::bad_request(format!("multipart body: {e}")))?;
        let (mut profile, mut labels, mut received) = (None, None, 0usize);
        while let Some(field) = mp
            .next_field()
            .await
            .map_err(|e| ApiError::bad_request(format!("multipart body: {e}")))?
        {
            let name = field.name().unwrap_or("").to_owned();
            let is_labels = part == "jfr" && name == "labels";
            if name != part && !is_labels {
                continue;
            }
            let bytes = field
                .bytes()
                .await
                .map_err(|e| ApiError::bad_request(format!("multipart part '{name}': {e}")))?;
            received += bytes.len();
            if is_labels {
                labels = Some(bytes);
            } else {
                profile = Some(bytes);
            }
        }
        let profile = profile
            .ok_or_else(|| ApiError::bad_request(format!("multipart body has no '{part}' part")))?;
        if profile.is_empty() {
            return Err(ApiError::bad_request(format!("the '{part}' part is empty")));
        }
        return Ok(Body {
            profile,
            labels,
            received,
        });
    }
    let profile = axum::body::to_bytes(req.into_body(), d.limits.max_body_bytes)
        .await
        .map_err(|_| {
            ApiError::TooLarge(format!(
                "request body is larger than the limit of {} bytes",
                d.limits.max_body_bytes
            ))
        })?;
    Ok(Body {
        received: profile.len(),
        profile,
        labels: None,
    })
}

/// The query parameters and body of `/ingest` as an [`IngestRequest`].
async fn ingest_inner(
    d: &Distributor,
    p: &HashMap<String, String>,
    headers: &HeaderMap,
    req: Request,
) -> Result<Accepted, ApiError> {
    let tenant: TenantId = tenant_from_headers(headers)?;
    let name = p.get("name").ok_or_else(|| {
        ApiError::bad_request("the name parameter is required, e.g. name=myapp.cpu{env=prod}")
    })?;
    let app = parse_app_name(name)?;
    let format_name = p.get("format").map(String::as_str).unwrap_or("folded");
    let format = match format_name {
        "pprof" => Format::Pprof,
        "folded" => Format::Folded(folded_params(p)?),
        "jfr" => Format::Jfr(JfrParams {
            sample_rate: sample_rate(p)?,
            labels: None,
        }),
        "speedscope" => Format::Speedscope {
            sample_rate: sample_rate(p)?,
        },
        other => {
            return Err(ApiError::bad_request(format!(
                "format {other:?} is not supported; use pprof, folded, jfr or speedscope"
            )));
        }
    };
    let from = p
        .get("from")
        .map(|s| pyroscope_time("from", s))
        .transpose()?;
    let until = p
        .get("until")
        .map(|s| pyroscope_time("until", s))
        .transpose()?;
    if let (Some(f), Some(u)) = (from, until)
        && u < f
    {
        return Err(ApiError::bad_request("until is before from"));
    }
    let duration = match (from, until) {
        (Some(f), Some(u)) => Some(u - f),
        _ => None,
    };
    let gz_header = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let part = if matches!(format, Format::Jfr(_)) {
        "jfr"
    } else {
        "profile"
    };
    let body = read_body(d, headers, req, part).await?;
    if body.profile.is_empty() {
        return Err(ApiError::bad_request("request body is empty"));
    }
    let format = match format {
        Format::Jfr(j) => Format::Jfr(JfrParams {
            labels: body.labels,
            ..j
        }),
        f => f,
    };
    let parts = [
        name.as_str(),
        format_name,
        p.get("from").map(String::as_str).unwrap_or(""),
        p.get("until").map(String::as_str).unwrap_or(""),
        p.get("sampleRate").map(String::as_str).unwrap_or(""),
    ];
    let payload = Payload {
        format,
        encoding: if gz_header {
            Encoding::Gzip
        } else {
            Encoding::Identity
        },
        labels: app.labels,
        name_hint: app.kind,
        time_nanos: from,
        duration_nanos: duration,
        idempotence: Idempotence::Content(parts.iter().map(|s| s.to_string()).collect()),
        context: String::new(),
        body: body.profile,
    };
    d.ingest(IngestRequest {
        tenant,
        received_bytes: body.received,
        payloads: vec![payload],
    })
    .await
}

/// `sampleRate` (folded, JFR and speedscope).
fn sample_rate(p: &HashMap<String, String>) -> Result<Option<u32>, ApiError> {
    p.get("sampleRate")
        .map(|s| {
            s.parse::<u32>().ok().filter(|v| *v > 0).ok_or_else(|| {
                ApiError::bad_request(format!("sampleRate {s:?} is not a positive integer"))
            })
        })
        .transpose()
}

/// `units`, `sampleRate` and `aggregationType` of folded text.
fn folded_params(p: &HashMap<String, String>) -> Result<FoldedParams, ApiError> {
    let sample_rate = sample_rate(p)?;
    let aggregation = match p.get("aggregationType").map(String::as_str) {
        None | Some("sum") | Some("") => fathom_pprof::Aggregation::Sum,
        Some("average") | Some("avg") => fathom_pprof::Aggregation::Average,
        Some(o) => {
            return Err(ApiError::bad_request(format!(
                "aggregationType {o:?} is not sum or average"
            )));
        }
    };
    Ok(FoldedParams {
        units: p.get("units").cloned(),
        sample_rate,
        aggregation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_names() {
        let a = parse_app_name("myapp.cpu{env=prod, region=\"us-east, 1\"}").unwrap();
        assert_eq!(a.service, "myapp");
        assert_eq!(a.kind.as_deref(), Some("cpu"));
        assert_eq!(a.labels.get("region"), Some("us-east, 1"));
        assert_eq!(a.labels.get("service_name"), Some("myapp"));
        let b = parse_app_name("my.app").unwrap();
        assert_eq!((b.service.as_str(), b.kind), ("my.app", None));
        assert!(parse_app_name("x{a}").is_err());
        assert!(parse_app_name("x{a=b").is_err());
        assert!(parse_app_name("{a=b}").is_err());
        assert!(parse_app_name("x{1a=b}").is_err());
    }

    #[test]
    fn times() {
        assert_eq!(pyroscope_time("from", "10").unwrap(), 10_000_000_000);
        assert_eq!(
            pyroscope_time("from", "1700000000000").unwrap(),
            1_700_000_000_000_000_000
        );
        assert!(pyroscope_time("from", "-1").is_err());
        assert!(pyroscope_time("from", "abc").is_err());
    }
}
