//! The Connect protocol's unary calls (<https://connectrpc.com/docs/protocol>)
//! as far as Grafana's Pyroscope data source and other Connect clients use
//! them: `POST /<package>.<Service>/<Method>` with the message in the body
//! as `application/proto` or `application/json` (the protobuf JSON
//! mapping), optionally gzip'd (`Content-Encoding: gzip`), answered with
//! `200` and the response message in the same codec, or with an error as
//! `{"code": "invalid_argument", "message": "..."}` and the HTTP status
//! Connect assigns to that code.

use std::io::Read;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fathom_api::ApiError;

use crate::QueryError;

/// The largest request body, compressed or not. Query requests are a few
/// hundred bytes (a selector is at most 16 KiB).
pub(crate) const MAX_REQUEST_BYTES: usize = 1 << 20;

/// How the messages of one call are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Codec {
    Proto,
    Json,
}

impl Codec {
    fn content_type(self) -> &'static str {
        match self {
            Codec::Proto => "application/proto",
            Codec::Json => "application/json",
        }
    }
}

/// Connect's error codes that Fathom answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unimplemented,
    Internal,
    Unavailable,
    DeadlineExceeded,
}

impl Code {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DeadlineExceeded => "deadline_exceeded",
        }
    }

    /// The HTTP status the Connect protocol gives the code.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

/// A failed call, answered in Connect's error shape.
#[derive(Debug)]
pub(crate) struct ConnectError {
    pub(crate) code: Code,
    pub(crate) message: String,
    /// Overrides the code's HTTP status (415 for an unsupported content
    /// type, as the protocol asks).
    status: Option<StatusCode>,
}

impl ConnectError {
    pub(crate) fn new(code: Code, message: impl std::fmt::Display) -> Self {
        ConnectError {
            code,
            message: message.to_string(),
            status: None,
        }
    }

    pub(crate) fn invalid(message: impl std::fmt::Display) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub(crate) fn unimplemented(message: impl std::fmt::Display) -> Self {
        Self::new(Code::Unimplemented, message)
    }
}

impl From<ApiError> for ConnectError {
    fn from(e: ApiError) -> Self {
        let code = match &e {
            ApiError::BadRequest(_) => Code::InvalidArgument,
            ApiError::TooLarge(_) | ApiError::RateLimited(_) => Code::ResourceExhausted,
            ApiError::NotFound(_) => Code::NotFound,
            ApiError::Unavailable(_) => Code::Unavailable,
            ApiError::Internal(_) => Code::Internal,
        };
        ConnectError::new(code, e)
    }
}

impl From<QueryError> for ConnectError {
    fn from(e: QueryError) -> Self {
        ApiError::from(e).into()
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let status = self.status.unwrap_or(self.code.status());
        if status.is_server_error() {
            tracing::error!(code = self.code.as_str(), error = %self.message, "connect call failed");
        }
        let body = serde_json::json!({ "code": self.code.as_str(), "message": self.message });
        (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body.to_string(),
        )
            .into_response()
    }
}

/// The codec a request's `Content-Type` names.
fn codec(h: &HeaderMap) -> Result<Codec, ConnectError> {
    let ct = h
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    match essence.to_ascii_lowercase().as_str() {
        "application/proto" | "application/protobuf" => Ok(Codec::Proto),
        "application/json" => Ok(Codec::Json),
        _ => Err(ConnectError {
            code: Code::Unimplemented,
            message: format!(
                "content type {ct:?} is not supported: send application/proto or application/json (Connect unary)"
            ),
            status: Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
        }),
    }
}

/// The call's deadline from `Connect-Timeout-Ms`, if any.
pub(crate) fn timeout(h: &HeaderMap) -> Result<Option<Duration>, ConnectError> {
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

/// Reads, decompresses and decodes a unary request of message type `T`
/// (`what` names it in errors).
pub(crate) async fn decode<T>(
    h: &HeaderMap,
    body: Body,
    what: &str,
) -> Result<(T, Codec), ConnectError>
where
    T: prost::Message + Default + serde::de::DeserializeOwned,
{
    if let Some(v) = h.get("connect-protocol-version")
        && v.as_bytes() != b"1"
    {
        return Err(ConnectError::invalid(format!(
            "Connect-Protocol-Version {v:?} is not supported: use 1"
        )));
    }
    let codec = codec(h)?;
    let bytes = axum::body::to_bytes(body, MAX_REQUEST_BYTES)
        .await
        .map_err(|_| {
            ConnectError::new(
                Code::ResourceExhausted,
                format!("the request body is over {MAX_REQUEST_BYTES} bytes, or could not be read"),
            )
        })?;
    let bytes = match h
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("identity") => bytes.to_vec(),
        Some("gzip") => gunzip(&bytes)?,
        Some(other) => {
            return Err(ConnectError::unimplemented(format!(
                "Content-Encoding {other:?} is not supported: use gzip or identity"
            )));
        }
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

/// Gunzips at most [`MAX_REQUEST_BYTES`].
fn gunzip(b: &[u8]) -> Result<Vec<u8>, ConnectError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .take(MAX_REQUEST_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ConnectError::invalid(format!("the gzip'd body does not decompress: {e}")))?;
    if out.len() > MAX_REQUEST_BYTES {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("the request body decompresses to over {MAX_REQUEST_BYTES} bytes"),
        ));
    }
    Ok(out)
}

/// A successful answer in the request's codec.
pub(crate) fn respond<T>(codec: Codec, msg: &T) -> Response
where
    T: prost::Message + serde::Serialize,
{
    let body = match codec {
        Codec::Proto => msg.encode_to_vec(),
        Codec::Json => match serde_json::to_vec(msg) {
            Ok(b) => b,
            Err(e) => {
                return ConnectError::new(Code::Internal, format!("encoding the answer: {e}"))
                    .into_response();
            }
        },
    };
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(codec.content_type()),
        )],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_proto::pyroscope::types::v1::LabelNamesRequest;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[tokio::test]
    async fn decodes_proto_json_and_gzip() {
        use prost::Message;
        let req = LabelNamesRequest {
            matchers: vec!["{service_name=\"a\"}".into()],
            start: 1,
            end: 2,
        };
        let h = headers(&[("content-type", "application/proto")]);
        let (got, c) = decode::<LabelNamesRequest>(&h, Body::from(req.encode_to_vec()), "x")
            .await
            .unwrap();
        assert_eq!((got, c), (req.clone(), Codec::Proto));

        // JSON: int64 as strings or numbers, camelCase or proto names.
        let h = headers(&[("content-type", "application/json; charset=utf-8")]);
        let body = r#"{"matchers":["{service_name=\"a\"}"],"start":"1","end":2,"future":true}"#;
        let (got, c) = decode::<LabelNamesRequest>(&h, Body::from(body), "x")
            .await
            .unwrap();
        assert_eq!((got, c), (req.clone(), Codec::Json));

        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &req.encode_to_vec()).unwrap();
        let h = headers(&[
            ("content-type", "application/proto"),
            ("content-encoding", "gzip"),
        ]);
        let (got, _) = decode::<LabelNamesRequest>(&h, Body::from(gz.finish().unwrap()), "x")
            .await
            .unwrap();
        assert_eq!(got, req);
    }

    #[tokio::test]
    async fn refusals_name_the_problem() {
        let h = headers(&[("content-type", "text/plain")]);
        let e = decode::<LabelNamesRequest>(&h, Body::from("x"), "LabelNamesRequest")
            .await
            .unwrap_err();
        assert_eq!(
            e.into_response().status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );

        let h = headers(&[("content-type", "application/proto")]);
        let e = decode::<LabelNamesRequest>(
            &h,
            Body::from(vec![0xff, 0xff, 0xff]),
            "LabelNamesRequest",
        )
        .await
        .unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("LabelNamesRequest"), "{}", e.message);

        let h = headers(&[("content-type", "application/json")]);
        let e = decode::<LabelNamesRequest>(
            &h,
            Body::from(r#"{"start": "soon"}"#),
            "LabelNamesRequest",
        )
        .await
        .unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);

        // A gzip bomb stops at the limit.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut gz, &vec![0u8; 4 * MAX_REQUEST_BYTES]).unwrap();
        let h = headers(&[
            ("content-type", "application/proto"),
            ("content-encoding", "gzip"),
        ]);
        let e = decode::<LabelNamesRequest>(&h, Body::from(gz.finish().unwrap()), "x")
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::ResourceExhausted);

        let h = headers(&[
            ("content-type", "application/proto"),
            ("content-encoding", "br"),
        ]);
        let e = decode::<LabelNamesRequest>(&h, Body::from("x"), "x")
            .await
            .unwrap_err();
        assert_eq!(e.code, Code::Unimplemented);
    }

    #[tokio::test]
    async fn errors_have_connects_shape_and_status() {
        let r = ConnectError::from(ApiError::bad_request("start is after end")).into_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let b = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["code"], "invalid_argument");
        assert_eq!(v["message"], "start is after end");
        let r = ConnectError::from(ApiError::Unavailable("down".into())).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
