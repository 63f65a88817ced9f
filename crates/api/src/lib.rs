//! What every Fathom API edge shares, so that a client sees the same status
//! and message for the same mistake on HTTP and gRPC:
//!
//! - [`ApiError`]: one error type for request handling, with one mapping to
//!   an HTTP status (and a JSON body `{"error": "…"}`) and one to a gRPC code;
//! - [`tenant_from_headers`]: the tenant from `X-Scope-OrgID`, validated;
//! - [`parse_time`]: unix milliseconds, RFC 3339 or `now[-duration]`;
//! - [`connect`]: the Connect protocol's codecs, compression and error shape;
//! - [`metrics`]: the latency histograms of the write path's stages;
//! - [`secret`]: the cluster secret that internal calls carry and internal
//!   services require.

pub mod auth;
pub mod cluster;
pub mod connect;
pub mod metrics;
pub mod ring;
pub mod secret;
pub mod ticket;
pub mod trace_context;

use axum::Json;
use axum::response::{IntoResponse, Response};
use fathom_model::TenantId;
use http::{HeaderMap, StatusCode};

/// The tenant header (Cortex/Pyroscope convention).
pub const TENANT_HEADER: &str = "x-scope-orgid";

/// A request failure, classified by who must act.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is wrong; retrying it unchanged fails again (400).
    #[error("{0}")]
    BadRequest(String),
    /// The body or a part of it is over a limit (413).
    #[error("{0}")]
    TooLarge(String),
    /// A per-tenant limit was hit (429).
    #[error("{0}")]
    RateLimited(String),
    /// A per-tenant rate was exceeded; the client may retry after
    /// `retry_after_secs` (429 with `Retry-After`).
    #[error("{message}")]
    Throttled {
        message: String,
        retry_after_secs: u64,
    },
    /// Not found (404).
    #[error("{0}")]
    NotFound(String),
    /// The request asks for something this interface never allows, e.g.
    /// a write through the read-only SQL interface (403).
    #[error("{0}")]
    Forbidden(String),
    /// The request ran past its deadline and was stopped (504).
    #[error("{0}")]
    Timeout(String),
    /// The service cannot take the request now; retry later (503).
    #[error("{0}")]
    Unavailable(String),
    /// A bug or an unexpected failure of a dependency (500).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn bad_request(msg: impl std::fmt::Display) -> Self {
        ApiError::BadRequest(msg.to_string())
    }

    pub fn internal(msg: impl std::fmt::Display) -> Self {
        ApiError::Internal(msg.to_string())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RateLimited(_) | ApiError::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            ApiError::BadRequest(_) => tonic::Code::InvalidArgument,
            ApiError::TooLarge(_) => tonic::Code::InvalidArgument,
            ApiError::RateLimited(_) | ApiError::Throttled { .. } => tonic::Code::ResourceExhausted,
            ApiError::NotFound(_) => tonic::Code::NotFound,
            ApiError::Forbidden(_) => tonic::Code::PermissionDenied,
            ApiError::Timeout(_) => tonic::Code::DeadlineExceeded,
            ApiError::Unavailable(_) => tonic::Code::Unavailable,
            ApiError::Internal(_) => tonic::Code::Internal,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing_error(&self);
        }
        let retry_after = match &self {
            ApiError::Throttled {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        };
        let mut r = (
            status,
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response();
        let retry_after = match retry_after {
            Some(s) => Some(http::HeaderValue::from(s)),
            // Every other 503 is worth retrying too: say when.
            None if status == StatusCode::SERVICE_UNAVAILABLE => {
                Some(http::HeaderValue::from_static("1"))
            }
            None => None,
        };
        if let Some(v) = retry_after {
            r.headers_mut().insert(http::header::RETRY_AFTER, v);
        }
        r
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let mut s = tonic::Status::new(e.grpc_code(), e.to_string());
        if let ApiError::Throttled {
            retry_after_secs, ..
        } = e
        {
            s.metadata_mut()
                .insert("retry-after", retry_after_secs.into());
        }
        s
    }
}

fn tracing_error(e: &ApiError) {
    tracing::error!(error = %e, "request failed");
}

/// The tenant of a request: `X-Scope-OrgID`, or `anonymous` when absent.
pub fn tenant_from_headers(h: &HeaderMap) -> Result<TenantId, ApiError> {
    tenant(
        h.get(TENANT_HEADER).map(|v| v.to_str().ok()),
        "X-Scope-OrgID",
    )
}

/// The tenant of a gRPC call, from the `x-scope-orgid` metadata.
pub fn tenant_from_metadata(m: &tonic::metadata::MetadataMap) -> Result<TenantId, ApiError> {
    tenant(
        m.get(TENANT_HEADER).map(|v| v.to_str().ok()),
        "x-scope-orgid",
    )
}

/// `header`: absent, not ASCII (`Some(None)`), or a value to validate.
fn tenant(header: Option<Option<&str>>, name: &str) -> Result<TenantId, ApiError> {
    match header {
        None => Ok(TenantId::anonymous()),
        Some(None) => Err(ApiError::bad_request(format!("{name} is not valid ASCII"))),
        Some(Some(s)) => {
            TenantId::new(s).map_err(|e| ApiError::bad_request(format!("{name}: {e}")))
        }
    }
}

/// Parses a point in time as unix nanoseconds: an integer of unix
/// milliseconds, an RFC 3339 timestamp, `now`, or `now-<duration>` (e.g.
/// `now-1h`). `now_nanos` is the reference for `now`.
pub fn parse_time(s: &str, now_nanos: i64) -> Result<i64, ApiError> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return ms
            .checked_mul(1_000_000)
            .ok_or_else(|| ApiError::bad_request(format!("time {s:?} is out of range")));
    }
    if s == "now" {
        return Ok(now_nanos);
    }
    if let Some(d) = s.strip_prefix("now-") {
        let d = humantime::parse_duration(d)
            .map_err(|e| ApiError::bad_request(format!("time {s:?}: {e}")))?;
        return Ok(now_nanos.saturating_sub(d.as_nanos().min(i64::MAX as u128) as i64));
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "time {s:?} is neither unix milliseconds, RFC 3339 nor now[-duration]"
            ))
        })
}

/// Unix nanoseconds now.
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        let now = 10_000_000_000_000;
        assert_eq!(parse_time("1500", now).unwrap(), 1_500_000_000);
        assert_eq!(parse_time("now", now).unwrap(), now);
        assert_eq!(parse_time("now-1s", now).unwrap(), now - 1_000_000_000);
        assert_eq!(
            parse_time("1970-01-01T00:00:01Z", now).unwrap(),
            1_000_000_000
        );
        assert!(parse_time("yesterday", now).is_err());
        assert!(parse_time("99999999999999999", now).is_err());
    }

    #[test]
    fn tenants() {
        let mut h = HeaderMap::new();
        assert_eq!(tenant_from_headers(&h).unwrap().as_str(), "anonymous");
        h.insert(TENANT_HEADER, "team-1".parse().unwrap());
        assert_eq!(tenant_from_headers(&h).unwrap().as_str(), "team-1");
        h.insert(TENANT_HEADER, "../etc".parse().unwrap());
        let e = tenant_from_headers(&h).unwrap_err();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert!(e.to_string().contains("X-Scope-OrgID"));
    }
}
