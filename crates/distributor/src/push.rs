//! `fathom.push.v1.PushService/Push`: the native push API (raw pprof bytes
//! with labels). All or nothing: one bad profile refuses the whole request.

use fathom_api::{ApiError, now_nanos, tenant_from_metadata};
use fathom_model::{Id, IngestBatch, Labels, Symbols};
use fathom_proto::push::push_service_server::{PushService, PushServiceServer};
use fathom_proto::push::{PushRequest, PushResponse};
use tonic::{Request, Response, Status};

use crate::{Distributor, request_seed};

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

impl PushServer {
    async fn push_inner(&self, req: Request<PushRequest>) -> Result<PushResponse, ApiError> {
        let tenant = tenant_from_metadata(req.metadata())?;
        let req = req.into_inner();
        let d = &self.d;
        if req.profiles.len() > d.limits.max_profiles_per_push {
            return Err(ApiError::TooLarge(format!(
                "push has {} profiles; the limit is {}",
                req.profiles.len(),
                d.limits.max_profiles_per_push
            )));
        }
        let limits = d.limits.clone();
        let t2 = tenant.clone();
        let (profiles, symbols) = tokio::task::spawn_blocking(move || {
            let plimits = fathom_pprof::Limits {
                max_decompressed_bytes: limits.max_decompressed_bytes,
                max_samples: limits.max_samples,
                ..Default::default()
            };
            let mut profiles = Vec::new();
            let mut symbols = Symbols::default();
            for (i, raw) in req.profiles.iter().enumerate() {
                // `__name__` (the Pyroscope convention for the profile
                // name, e.g. `process_cpu` or `block`) names the profile
                // type; it is not a series label.
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
                let seed = if raw.profile_id.is_empty() {
                    request_seed(&t2, &["push"], &labels, &raw.pprof)
                } else {
                    Id::from_slice(&raw.profile_id).ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "profile {i}: profile_id must be 16 bytes, got {}",
                            raw.profile_id.len()
                        ))
                    })?
                };
                if raw.pprof.is_empty() {
                    return Err(ApiError::bad_request(format!(
                        "profile {i}: pprof is empty"
                    )));
                }
                let prof = fathom_pprof::decode(&raw.pprof, &plimits).map_err(|e| {
                    ApiError::bad_request(format!("profile {i}: invalid pprof: {e}"))
                })?;
                let n = fathom_pprof::normalize(
                    &prof,
                    &fathom_pprof::NormalizeOptions {
                        labels,
                        name_hint,
                        time_nanos_override: None,
                        duration_nanos_override: None,
                        profile_id_seed: seed,
                        ..Default::default()
                    },
                )
                .map_err(|e| ApiError::bad_request(format!("profile {i}: invalid pprof: {e}")))?;
                profiles.extend(n.profiles);
                symbols.merge(&n.symbols);
            }
            Ok::<_, ApiError>((profiles, symbols))
        })
        .await
        .map_err(|e| ApiError::internal(format!("decode task failed: {e}")))??;
        let (p, s) = d
            .accept(
                IngestBatch {
                    tenant,
                    profiles,
                    symbols,
                },
                now_nanos(),
            )
            .await?;
        Ok(PushResponse {
            profiles: p as u64,
            samples: s as u64,
        })
    }
}

#[tonic::async_trait]
impl PushService for PushServer {
    async fn push(&self, req: Request<PushRequest>) -> Result<Response<PushResponse>, Status> {
        let r = self.push_inner(req).await;
        self.d.count("grpc", if r.is_ok() { "ok" } else { "error" });
        Ok(Response::new(r?))
    }
}
