//! The Connect protocol's unary conventions (connectrpc.com/docs/protocol),
//! for the Pyroscope APIs Fathom serves over Connect: which codec a request
//! uses, how its body is compressed, and errors in Connect's JSON shape
//! (`{"code": "invalid_argument", "message": "..."}`) with the HTTP status
//! Connect assigns to the code. The code of an [`ApiError`] is its gRPC
//! code, so the same mistake gets the same code over Connect and gRPC.
//!
//! Two kinds of caller: the push services, which hand the body to the
//! ingest service (it owns the bounded gunzip of profiles) and use the
//! header checks one by one, and small unary calls (the querier's), which
//! use [`decode`] and [`respond`] for the whole round trip.

use std::io::Read;
use std::time::Duration;

use axum::body::Body;
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
    /// Seconds after which a throttled client may retry (`Retry-After`).
    pub retry_after_secs: Option<u64>,
}

impl ConnectError {
    pub fn new(code: tonic::Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
            http_status: None,
            retry_after_secs: None,
        }
    }

    /// `invalid_argument`: the request is wrong.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::InvalidArgument, message)
    }

    /// `unimplemented`: the request asks for something Fathom does not do.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::Unimplemented, message)
    }

    /// `internal`: Fathom's fault (logged when answered).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::Internal, message)
    }
}

impl From<ApiError> for ConnectError {
    fn from(e: ApiError) -> Self {
        let retry_after_secs = match &e {
            ApiError::Throttled {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        };
        ConnectError {
            retry_after_secs,
            ..ConnectError::new(e.grpc_code(), e.to_string())
        }
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
        if status.is_server_error() {
            tracing::error!(code = code_name(self.code), error = %self.message, "Connect call failed");
        }
        let mut r = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if let Some(s) = self.retry_after_secs {
            r.headers_mut()
                .insert(header::RETRY_AFTER, http::HeaderValue::from(s));
        }
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

/// The call's deadline from `Connect-Timeout-Ms`, if any.
pub fn timeout(h: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
    let Some(v) = h.get("connect-timeout-ms") else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| {
            ConnectError::invalid(format!(
                "Connect-Timeout-Ms {v:?} is not a positive integer of at most 10 digits"
            ))
        })
}

/// Reads, decompresses and decodes a small unary request of message type
/// `T` (`what` names it in errors), of at most `max_bytes` before and after
/// decompression.
pub async fn decode<T>(
    h: &HeaderMap,
    body: Body,
    max_bytes: usize,
    what: &str,
) -> Result<(T, Codec), ConnectError>
where
    T: prost::Message + Default + serde::de::DeserializeOwned,
{
    check_protocol_version(h)?;
    let codec = request_codec(h)?;
    let gzip = request_is_gzip(h)?;
    let too_large = || {
        ConnectError::new(
            tonic::Code::ResourceExhausted,
            format!("the {what} is over {max_bytes} bytes"),
        )
    };
    let bytes = axum::body::to_bytes(body, max_bytes)
        .await
        .map_err(|_| too_large())?;
    let bytes = if gzip {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .take(max_bytes as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| {
                ConnectError::invalid(format!("the gzip'd {what} does not decompress: {e}"))
            })?;
        if out.len() > max_bytes {
            return Err(too_large());
        }
        out
    } else {
        bytes.to_vec()
    };
    let msg = match codec {
        Codec::Proto => T::decode(bytes.as_slice()).map_err(|e| {
            ConnectError::invalid(format!("the body is not a valid {what} in protobuf: {e}"))
        })?,
        Codec::Json => serde_json::from_slice(&bytes).map_err(|e| {
            ConnectError::invalid(format!("the body is not a valid {what} in JSON: {e}"))
        })?,
    };
    Ok((msg, codec))
}

/// A successful answer carrying `msg` in the request's codec.
pub fn respond<T>(codec: Codec, msg: &T) -> Response
where
    T: prost::Message + serde::Serialize,
{
    let body = match codec {
        Codec::Proto => msg.encode_to_vec(),
        Codec::Json => match serde_json::to_vec(msg) {
            Ok(b) => b,
            Err(e) => {
                return ConnectError::internal(format!("encoding the answer: {e}")).into_response();
            }
        },
    };
    ok_response(codec, body)
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

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    /// A small message to decode: a `google.protobuf.Duration`-shaped
    /// one would do, but the tests need serde too, so a local one.
    #[derive(Clone, PartialEq, prost::Message, serde::Deserialize)]
    struct Probe {
        #[prost(string, repeated, tag = "1")]
        #[serde(default)]
        matchers: Vec<String>,
        #[prost(int64, tag = "2")]
        #[serde(default, deserialize_with = "int64")]
        start: i64,
    }

    /// protobuf JSON's int64: a number or a decimal string.
    fn int64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        use serde::Deserialize;
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum N {
            N(i64),
            S(String),
        }
        match N::deserialize(d)? {
            N::N(n) => Ok(n),
            N::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }

    const MAX: usize = 1 << 16;

    #[tokio::test]
    async fn decodes_proto_json_and_gzip() {
        use prost::Message;
        let req = Probe {
            matchers: vec!["{service_name=\"a\"}".into()],
            start: 1,
        };
        let h = headers(&[("content-type", "application/proto")]);
        let (got, c) = decode::<Probe>(&h, Body::from(req.encode_to_vec()), MAX, "x")
            .await
            .unwrap();
        assert_eq!((got, c), (req.clone(), Codec::Proto));

        let h = headers(&[("content-type", "application/json; charset=utf-8")]);
        let body = r#"{"matchers":["{service_name=\"a\"}"],"start":"1","future":true}"#;
        let (got, c) = decode::<Probe>(&h, Body::from(body), MAX, "x")
            .await
            .unwrap();
        assert_eq!((got, c), (req.clone(), Codec::Json));

        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &req.encode_to_vec()).unwrap();
        let h = headers(&[
            ("content-type", "application/proto"),
            ("content-encoding", "gzip"),
        ]);
        let (got, _) = decode::<Probe>(&h, Body::from(gz.finish().unwrap()), MAX, "x")
            .await
            .unwrap();
        assert_eq!(got, req);
    }

    #[tokio::test]
    async fn decode_refusals_name_the_problem() {
        let h = headers(&[("content-type", "text/plain")]);
        let e = decode::<Probe>(&h, Body::from("x"), MAX, "Probe")
            .await
            .unwrap_err();
        assert_eq!(
            e.into_response().status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );

        let h = headers(&[("content-type", "application/proto")]);
        let e = decode::<Probe>(&h, Body::from(vec![0xff, 0xff, 0xff]), MAX, "Probe")
            .await
            .unwrap_err();
        assert_eq!(e.code, tonic::Code::InvalidArgument);
        assert!(e.message.contains("Probe"), "{}", e.message);

        let h = headers(&[("content-type", "application/json")]);
        let e = decode::<Probe>(&h, Body::from(r#"{"start": "soon"}"#), MAX, "Probe")
            .await
            .unwrap_err();
        assert_eq!(e.code, tonic::Code::InvalidArgument);

        // Over the limit as sent, and a gzip bomb that stops at the limit.
        let h = headers(&[("content-type", "application/proto")]);
        let e = decode::<Probe>(&h, Body::from(vec![0u8; MAX + 1]), MAX, "Probe")
            .await
            .unwrap_err();
        assert_eq!(e.code, tonic::Code::ResourceExhausted);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut gz, &vec![0u8; 4 * MAX]).unwrap();
        let h = headers(&[
            ("content-type", "application/proto"),
            ("content-encoding", "gzip"),
        ]);
        let e = decode::<Probe>(&h, Body::from(gz.finish().unwrap()), MAX, "x")
            .await
            .unwrap_err();
        assert_eq!(e.code, tonic::Code::ResourceExhausted);

        let h = headers(&[
            ("content-type", "application/proto"),
            ("connect-protocol-version", "2"),
        ]);
        let e = decode::<Probe>(&h, Body::from(""), MAX, "x")
            .await
            .unwrap_err();
        assert_eq!(e.code, tonic::Code::InvalidArgument);
    }

    #[tokio::test]
    async fn errors_have_connects_shape_and_status() {
        let r = ConnectError::from(ApiError::bad_request("start is after end")).into_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let b = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["code"], "invalid_argument");
        assert_eq!(v["message"], "start is after end");
        let r = ConnectError::from(ApiError::Throttled {
            message: "over the rate".into(),
            retry_after_secs: 3,
        })
        .into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        let r = ConnectError::from(ApiError::Unavailable("down".into())).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn timeouts() {
        assert_eq!(timeout(&HeaderMap::new()).unwrap(), None);
        let h = headers(&[("connect-timeout-ms", "1500")]);
        assert_eq!(timeout(&h).unwrap(), Some(Duration::from_millis(1500)));
        for bad in ["-1", "1e3", "", "12345678901"] {
            let mut h = HeaderMap::new();
            h.insert("connect-timeout-ms", bad.parse().unwrap());
            assert_eq!(
                timeout(&h).unwrap_err().code,
                tonic::Code::InvalidArgument,
                "{bad}"
            );
        }
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
