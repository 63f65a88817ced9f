//! `fathom.push.v1.PushService/Push`: the native push API (raw pprof bytes
//! with labels), a thin adapter over [`Distributor::ingest`]. All or
//! nothing: one bad profile refuses the whole request.

use bytes::Bytes;
use fathom_api::{ApiError, tenant_from_metadata};
use fathom_model::{Id, Labels};
use fathom_proto::push::push_service_server::{PushService, PushServiceServer};
use fathom_proto::push::{PushRequest, PushResponse};
use prost::Message;
use tonic::{Request, Response, Status};

use crate::{Distributor, Format, Idempotence, IngestRequest, Payload};

/// The gRPC push service.
#[derive(Clone)]
pub struct PushServer {
    d: Distributor,
}

impl PushServer {
    pub fn new(d: Distributor) -> PushServiceServer<Self> {
        let max = d.limits.max_body_bytes;
        PushServiceServer::new(PushServer { d })
            .max_decoding_message_size(max)
            .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
    }
}

/// The request's profiles as payloads.
fn payloads(req: PushRequest) -> Result<Vec<Payload>, ApiError> {
    req.profiles
        .into_iter()
        .enumerate()
        .map(|(i, raw)| {
            // `__name__` (the Pyroscope convention for the profile name,
            // e.g. `process_cpu` or `block`) names the profile type; it is
            // not a series label.
            let name_hint = raw
                .labels
                .iter()
                .find(|l| l.name == "__name__")
                .map(|l| l.value.clone());
            let labels = Labels::from_pairs(
                raw.labels
                    .iter()
                    .filter(|l| l.name != "__name__")
                    .map(|l| (l.name.clone(), l.value.clone())),
            )
            .map_err(|e| ApiError::bad_request(format!("profile {i}: labels: {e}")))?;
            let idempotence = if raw.profile_id.is_empty() {
                Idempotence::Content(vec!["push".to_owned()])
            } else {
                Idempotence::Key(Id::from_slice(&raw.profile_id).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "profile {i}: profile_id must be 16 bytes, got {}",
                        raw.profile_id.len()
                    ))
                })?)
            };
            Ok(Payload {
                labels,
                name_hint,
                idempotence,
                context: format!("profile {i}"),
                ..Payload::new(Format::Pprof, Bytes::from(raw.pprof))
            })
        })
        .collect()
}

impl PushServer {
    async fn push_inner(&self, req: Request<PushRequest>) -> Result<PushResponse, ApiError> {
        let tenant = tenant_from_metadata(req.metadata())?;
        let req = req.into_inner();
        let received_bytes = req.encoded_len();
        let a = self
            .d
            .ingest(IngestRequest {
                tenant,
                received_bytes,
                payloads: payloads(req)?,
            })
            .await?;
        Ok(PushResponse {
            profiles: a.profiles as u64,
            samples: a.samples as u64,
        })
    }
}

#[tonic::async_trait]
impl PushService for PushServer {
    async fn push(&self, req: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let r = self.push_inner(req).await;
        self.d.count_request("grpc", r.is_ok());
        Ok(Response::new(r?))
    }
}
