//! OpenTelemetry profiles: `POST /v1development/profiles` (OTLP/HTTP,
//! protobuf or JSON, gzip'd or not) and gRPC
//! `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export`.
//! Both are thin adapters over the ingest service: one payload of
//! [`Format::Otlp`] (decoding, conversion and the mapping to Fathom's
//! model live in `fathom-otlp`; each resource's attributes become the
//! series labels of its profiles).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fathom_api::{ApiError, tenant_from_headers, tenant_from_metadata};
use fathom_model::TenantId;
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;

use crate::{Distributor, Encoding, Format, Idempotence, IngestRequest, Payload};

/// The OTLP/HTTP path for profiles.
pub(crate) const HTTP_PATH: &str = "/v1development/profiles";
const SERVICE: &str = "opentelemetry.proto.collector.profiles.v1development.ProfilesService";
const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// One export request as an [`IngestRequest`]: one payload, ids derived
/// from its bytes (a retried request is stored once). An empty protobuf
/// body is a valid, empty request and stores nothing.
fn ingest_request(
    tenant: TenantId,
    body: Bytes,
    received_bytes: usize,
    encoding: fathom_otlp::Encoding,
    gzip: bool,
) -> IngestRequest {
    let payloads = if body.is_empty() && encoding == fathom_otlp::Encoding::Protobuf {
        Vec::new()
    } else {
        let mut p = Payload::new(Format::Otlp(encoding), body);
        p.encoding = if gzip {
            Encoding::Gzip
        } else {
            Encoding::Identity
        };
        p.idempotence = Idempotence::Content(vec!["otlp".to_owned()]);
        vec![p]
    };
    IngestRequest {
        tenant,
        received_bytes,
        payloads,
    }
}

/// `POST /v1development/profiles`.
pub(crate) async fn export_http(
    State(d): State<Distributor>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    let r = export_http_inner(&d, &headers, req).await;
    d.count_request("otlp_http", r.is_ok());
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn export_http_inner(
    d: &Distributor,
    headers: &HeaderMap,
    req: Request,
) -> Result<Response, Response> {
    let tenant = tenant_from_headers(headers).map_err(IntoResponse::into_response)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let encoding = match mime.as_str() {
        "application/x-protobuf" | "application/protobuf" => fathom_otlp::Encoding::Protobuf,
        "application/json" => fathom_otlp::Encoding::Json,
        _ => {
            let msg = format!(
                "Content-Type {ct:?} is not an OTLP encoding: send application/x-protobuf \
                 (or application/protobuf) or application/json"
            );
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                axum::Json(serde_json::json!({ "error": msg })),
            )
                .into_response());
        }
    };
    let raw = axum::body::to_bytes(req.into_body(), d.limits.max_body_bytes)
        .await
        .map_err(|_| {
            ApiError::TooLarge(format!(
                "request body is larger than the limit of {} bytes",
                d.limits.max_body_bytes
            ))
            .into_response()
        })?;
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
    {
        None => false,
        Some(v) if v == "gzip" => true,
        Some(v) if v.is_empty() || v == "identity" => false,
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "Content-Encoding {v:?} is not supported; use gzip or none"
            ))
            .into_response());
        }
    };
    let received = raw.len();
    d.ingest(ingest_request(tenant, raw, received, encoding, gzip))
        .await
        .map_err(IntoResponse::into_response)?;
    // An empty ExportProfilesServiceResponse: everything was accepted.
    Ok(match encoding {
        fathom_otlp::Encoding::Protobuf => (
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            fathom_otlp::wire::ExportProfilesServiceResponse::default().encode_to_vec(),
        )
            .into_response(),
        fathom_otlp::Encoding::Json => {
            ([(header::CONTENT_TYPE, "application/json")], "{}").into_response()
        }
    })
}

/// The gRPC `ProfilesService`, written by hand so that `Export` sees the
/// request bytes (the field layout is read from them).
#[derive(Clone)]
pub struct OtlpProfilesServer {
    d: Distributor,
}

impl OtlpProfilesServer {
    pub fn new(d: Distributor) -> Self {
        OtlpProfilesServer { d }
    }
}

impl tonic::server::NamedService for OtlpProfilesServer {
    const NAME: &'static str = SERVICE;
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

impl tower::Service<http::Request<tonic::body::Body>> for OtlpProfilesServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() != EXPORT_PATH {
            let status = tonic::Status::unimplemented(format!(
                "{} is not a method of {SERVICE}; it has Export",
                req.uri().path()
            ));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let d = self.d.clone();
        Box::pin(async move {
            let max = d.limits.max_body_bytes;
            let mut grpc = tonic::server::Grpc::new(RawCodec)
                .accept_compressed(CompressionEncoding::Gzip)
                .max_decoding_message_size(max);
            Ok(grpc.unary(Export(d), req).await)
        })
    }
}

struct Export(Distributor);

impl tonic::server::UnaryService<Bytes> for Export {
    type Response = fathom_otlp::wire::ExportProfilesServiceResponse;
    type Future = BoxFuture<Result<tonic::Response<Self::Response>, tonic::Status>>;

    fn call(&mut self, req: tonic::Request<Bytes>) -> Self::Future {
        let d = self.0.clone();
        Box::pin(async move {
            let r = async {
                let tenant = tenant_from_metadata(req.metadata())?;
                let body = req.into_inner();
                let received = body.len();
                d.ingest(ingest_request(
                    tenant,
                    body,
                    received,
                    fathom_otlp::Encoding::Protobuf,
                    false,
                ))
                .await
            }
            .await;
            d.count_request("otlp_grpc", r.is_ok());
            r?;
            Ok(tonic::Response::new(
                fathom_otlp::wire::ExportProfilesServiceResponse::default(),
            ))
        })
    }
}

/// Passes the request message through as bytes; encodes the response
/// with prost.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = fathom_otlp::wire::ExportProfilesServiceResponse;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = fathom_otlp::wire::ExportProfilesServiceResponse;
    type Error = tonic::Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        item.encode(dst)
            .map_err(|e| tonic::Status::internal(format!("encoding the response: {e}")))
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
