//! `POST /ingest?format=jfr`: Java Flight Recorder bodies, as the Pyroscope
//! Java agent sends them, into normalized profiles (`fathom-jfr` does the
//! decoding).
//!
//! The body is the recording, raw or gzip'd, or `multipart/form-data` with
//! a `jfr` part (the recording, raw or gzip'd) and an optional `labels`
//! part (a `LabelsSnapshot` protobuf, raw or gzip'd). Two functions, so
//! they can move to any ingest service as they are: [`read_body`] (HTTP
//! specifics) and [`normalize`] (bytes to profiles, on the blocking pool).

use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{HeaderMap, header};
use fathom_api::ApiError;
use fathom_model::{Id, Labels};

use crate::http::gunzip_bounded;

/// The most bytes a decompressed `labels` part may have (real ones have a
/// few KiB; decoded protobuf maps take up to ~15× their encoded size).
pub(crate) const MAX_LABELS_BYTES: usize = 4 << 20;

/// The parts of a JFR request, decompressed.
pub(crate) struct JfrBody {
    pub(crate) jfr: Vec<u8>,
    pub(crate) labels: Option<Vec<u8>>,
}

fn inflate(part: &str, b: &[u8], gzip: bool, limit: usize) -> Result<Vec<u8>, ApiError> {
    if gzip || b.starts_with(&[0x1f, 0x8b]) {
        gunzip_bounded(b, limit).map_err(|e| match e {
            ApiError::TooLarge(m) => ApiError::TooLarge(format!("{part}: {m}")),
            ApiError::BadRequest(m) => ApiError::bad_request(format!("{part}: {m}")),
            e => e,
        })
    } else {
        Ok(b.to_vec())
    }
}

fn bounded(b: Vec<u8>, limit: usize) -> Result<Vec<u8>, ApiError> {
    if b.len() > limit {
        return Err(ApiError::TooLarge(format!(
            "the recording is larger than the limit of {limit} bytes"
        )));
    }
    Ok(b)
}

/// Reads a JFR request body: raw (gzip by `Content-Encoding` or magic) or
/// multipart with `jfr` and optional `labels` parts. Every part is
/// bounded: the body by `max_body`, each decompressed part by
/// `max_decompressed`.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    req: Request,
    max_body: usize,
    max_decompressed: usize,
) -> Result<(JfrBody, usize), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let gz_header = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    if ct.starts_with("multipart/form-data") {
        let mut mp = Multipart::from_request(req, &())
            .await
            .map_err(|e| ApiError::bad_request(format!("multipart body: {e}")))?;
        let (mut jfr, mut labels): (Option<Bytes>, Option<Bytes>) = (None, None);
        let mut received = 0usize;
        while let Some(field) = mp
            .next_field()
            .await
            .map_err(|e| ApiError::bad_request(format!("multipart body: {e}")))?
        {
            let name = field.name().unwrap_or("").to_owned();
            if name != "jfr" && name != "labels" {
                continue;
            }
            let bytes = field
                .bytes()
                .await
                .map_err(|e| ApiError::bad_request(format!("multipart part '{name}': {e}")))?;
            received += bytes.len();
            if name == "jfr" {
                jfr = Some(bytes);
            } else {
                labels = Some(bytes);
            }
        }
        let jfr = jfr.ok_or_else(|| {
            ApiError::bad_request("multipart body has no 'jfr' part (the recording)")
        })?;
        if jfr.is_empty() {
            return Err(ApiError::bad_request("the 'jfr' part is empty"));
        }
        let body = JfrBody {
            jfr: bounded(
                inflate("the 'jfr' part", &jfr, false, max_decompressed)?,
                max_decompressed,
            )?,
            labels: labels
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let limit = MAX_LABELS_BYTES.min(max_decompressed);
                    let out = inflate("the 'labels' part", &l, false, limit)?;
                    if out.len() > limit {
                        return Err(ApiError::TooLarge(format!(
                            "the 'labels' part is larger than the limit of {limit} bytes"
                        )));
                    }
                    Ok(out)
                })
                .transpose()?,
        };
        return Ok((body, received));
    }
    let raw = axum::body::to_bytes(req.into_body(), max_body)
        .await
        .map_err(|_| {
            ApiError::TooLarge(format!(
                "request body is larger than the limit of {max_body} bytes"
            ))
        })?;
    if raw.is_empty() {
        return Err(ApiError::bad_request("request body is empty"));
    }
    let body = JfrBody {
        jfr: bounded(
            inflate("body", &raw, gz_header, max_decompressed)?,
            max_decompressed,
        )?,
        labels: None,
    };
    Ok((body, raw.len()))
}

/// What [`normalize`] needs besides the bytes.
pub(crate) struct JfrRequest {
    pub(crate) labels: Labels,
    pub(crate) sample_rate: Option<u32>,
    pub(crate) time_nanos: Option<i64>,
    pub(crate) duration_nanos: Option<i64>,
    pub(crate) seed: Id,
    pub(crate) limits: fathom_pprof::Limits,
}

/// Decodes a JFR request into normalized profiles (CPU-bound: call it on
/// the blocking pool). Bad input is a 400 naming the problem; more
/// samples, functions or locations than the limits a 413.
pub(crate) fn normalize(
    body: &JfrBody,
    r: JfrRequest,
) -> Result<fathom_pprof::Normalized, ApiError> {
    let opts = fathom_jfr::JfrOptions {
        labels: r.labels,
        sample_rate: r.sample_rate.unwrap_or(fathom_pprof::DEFAULT_SAMPLE_RATE),
        time_nanos_override: r.time_nanos,
        duration_nanos_override: r.duration_nanos,
        profile_id_seed: r.seed,
        ..Default::default()
    };
    fathom_jfr::decode(&body.jfr, body.labels.as_deref(), &opts, &r.limits).map_err(|e| match e {
        fathom_jfr::JfrError::TooMany { .. } => ApiError::TooLarge(format!("invalid JFR: {e}")),
        fathom_jfr::JfrError::Labels(_) => {
            ApiError::bad_request(format!("invalid labels part: {e}"))
        }
        e => ApiError::bad_request(format!("invalid JFR: {e}")),
    })
}
