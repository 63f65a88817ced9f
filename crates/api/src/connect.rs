//! The Connect protocol's unary conventions (connectrpc.com/docs/protocol),
//! for the Pyroscope APIs Fathom serves over Connect: which codec a request
//! uses, how its body is compressed, and errors in Connect's JSON shape
//! (`{"code": "invalid_argument", "message": "..."}`) with the HTTP status
//! Connect assigns to the code. The code of an [`ApiError`] is its gRPC
//! code, so the same mistake gets the same code over Connect and gRPC.

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};

use crate::ApiError;

/// The message encoding of a unary Connect request (and of its answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// `application/proto`
    Proto,
    /// `application/json` (the canonical protobuf JSON mapping)
    Json,
}

impl Codec {
    pub fn content_type(self) -> &'static str {
        match self {
            Codec::Proto => "application/proto",
            Codec::Json => "application/json",
        }
    }
}

/// A Connect error: a code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: tonic::Code,
    pub message: String,
    /// The HTTP status when Connect prescribes another than the code's
    /// (415 for an unsupported content type).
    pub http_status: Option<StatusCode>,
}

impl ConnectError {
    pub fn new(code: tonic::Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
            http_status: None,
        }
    }
}

impl From<ApiError> for ConnectError {
    fn from(e: ApiError) -> Self {
        if e.status().is_server_error() {
            tracing::error!(error = %e, "request failed");
        }
        ConnectError::new(e.grpc_code(), e.to_string())
    }
}

/// Connect's name of a code (`invalid_argument`, ...).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "ok",
        Cancelled => "canceled",
        Unknown => "unknown",
        InvalidArgument => "invalid_argument",
        DeadlineExceeded => "deadline_exceeded",
        NotFound => "not_found",
        AlreadyExists => "already_exists",
        PermissionDenied => "permission_denied",
        ResourceExhausted => "resource_exhausted",
        FailedPrecondition => "failed_precondition",
        Aborted => "aborted",
        OutOfRange => "out_of_range",
        Unimplemented => "unimplemented",
        Internal => "internal",
        Unavailable => "unavailable",
        DataLoss => "data_loss",
        Unauthenticated => "unauthenticated",
    }
}

/// The HTTP status Connect assigns to a code.
pub fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code::*;
    match code {
        Ok => StatusCode::OK,
        Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Unknown | Internal | DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        InvalidArgument | FailedPrecondition | OutOfRange => StatusCode::BAD_REQUEST,
        DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        NotFound => StatusCode::NOT_FOUND,
        AlreadyExists | Aborted => StatusCode::CONFLICT,
        PermissionDenied => StatusCode::FORBIDDEN,
        ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Unauthenticated => StatusCode::UNAUTHORIZED,
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "code": code_name(self.code),
            "message": self.message,
        });
        let status = self.http_status.unwrap_or_else(|| http_status(self.code));
        let mut r = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if status == StatusCode::UNSUPPORTED_MEDIA_TYPE {
            r.headers_mut().insert(
                http::HeaderName::from_static("accept-post"),
                http::HeaderValue::from_static("application/proto, application/json"),
            );
        }
        r
    }
}

/// The codec of a unary Connect request, from its `Content-Type`. Anything
/// else (streaming `application/connect+*`, gRPC-Web, a missing type) is
/// refused with 415 and a message that says what to send.
pub fn request_codec(h: &HeaderMap) -> Result<Codec, ConnectError> {
    let ct = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/proto" | "application/protobuf" | "application/x-protobuf" => Ok(Codec::Proto),
        "application/json" => Ok(Codec::Json),
        _ => {
            let shown = if ct.is_empty() {
                "no Content-Type".to_owned()
            } else {
                format!("Content-Type {ct:?}")
            };
            Err(ConnectError {
                http_status: Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                ..ConnectError::new(
                    tonic::Code::InvalidArgument,
                    format!(
                        "{shown} is not supported: send a unary Connect request as \
                         application/proto or application/json (or gRPC as application/grpc)"
                    ),
                )
            })
        }
    }
}

/// Whether the body is gzip'd: `Content-Encoding` (Connect's unary form)
/// or `Connect-Content-Encoding` (its streaming form, accepted too).
/// `identity` or none is plain; another encoding is `unimplemented`, as
/// Connect specifies.
pub fn request_is_gzip(h: &HeaderMap) -> Result<bool, ConnectError> {
    let mut gzip = false;
    for name in [
        header::CONTENT_ENCODING.as_str(),
        "connect-content-encoding",
    ] {
        for v in h.get_all(name) {
            let v = v.to_str().unwrap_or("?").trim().to_ascii_lowercase();
            match v.as_str() {
                "gzip" => gzip = true,
                "identity" | "" => {}
                other => {
                    return Err(ConnectError::new(
                        tonic::Code::Unimplemented,
                        format!("{name} {other:?} is not supported: use gzip or identity"),
                    ));
                }
            }
        }
    }
    Ok(gzip)
}

/// Checks `Connect-Protocol-Version` when present (it is optional).
pub fn check_protocol_version(h: &HeaderMap) -> Result<(), ConnectError> {
    match h.get("connect-protocol-version") {
        None => Ok(()),
        Some(v) if v.as_bytes() == b"1" => Ok(()),
        Some(v) => Err(ConnectError::new(
            tonic::Code::InvalidArgument,
            format!(
                "Connect-Protocol-Version {:?} is not supported: use 1",
                String::from_utf8_lossy(v.as_bytes())
            ),
        )),
    }
}

/// Whether a request is gRPC (`application/grpc`, `application/grpc+proto`).
pub fn is_grpc(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE).is_some_and(|v| {
        v.as_bytes().starts_with(b"application/grpc")
            && !v.as_bytes().starts_with(b"application/grpc-web")
    })
}

/// A successful unary answer.
pub fn ok_response(codec: Codec, body: Vec<u8>) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, codec.content_type())],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_statuses() {
        assert_eq!(code_name(tonic::Code::InvalidArgument), "invalid_argument");
        assert_eq!(
            http_status(tonic::Code::InvalidArgument),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            http_status(tonic::Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let c: ConnectError = ApiError::TooLarge("x".into()).into();
        assert_eq!(c.code, tonic::Code::InvalidArgument);
    }

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        assert!(request_codec(&h).is_err());
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(request_codec(&h).unwrap(), Codec::Json);
        h.insert(header::CONTENT_TYPE, "application/proto".parse().unwrap());
        assert_eq!(request_codec(&h).unwrap(), Codec::Proto);
        h.insert(
            header::CONTENT_TYPE,
            "application/connect+proto".parse().unwrap(),
        );
        let r = request_codec(&h).unwrap_err().into_response();
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(r.headers().contains_key("accept-post"));
        h.insert(
            header::CONTENT_TYPE,
            "application/grpc+proto".parse().unwrap(),
        );
        assert!(is_grpc(&h));
        h.insert(
            header::CONTENT_TYPE,
            "application/grpc-web".parse().unwrap(),
        );
        assert!(!is_grpc(&h));
    }

    #[test]
    fn encodings() {
        let mut h = HeaderMap::new();
        assert!(!request_is_gzip(&h).unwrap());
        h.insert(header::CONTENT_ENCODING, "gzip".parse().unwrap());
        assert!(request_is_gzip(&h).unwrap());
        let mut h = HeaderMap::new();
        h.insert("connect-content-encoding", "br".parse().unwrap());
        assert_eq!(
            request_is_gzip(&h).unwrap_err().code,
            tonic::Code::Unimplemented
        );
    }
}
