//! The debug info HTTP API (`docs/api.md`): upload, exists, list, delete,
//! scoped to the request's tenant.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use fathom_api::{ApiError, tenant_from_headers};
use fathom_model::TenantId;

use crate::Symbolizer;
use crate::store::{Owner, Source, StoreError, check_build_id};

/// Bytes of a refused upload read (and dropped) before answering.
const DRAIN_BEFORE_REFUSING: usize = 1 << 20;

/// The debug info routes, to be merged into a querier's router.
pub fn router(s: Symbolizer) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/debuginfo", get(list))
        .route(
            "/api/v1/debuginfo/{build_id}",
            get(exists).put(upload).delete(delete),
        )
        // The size limit is checked by the handler, with a message.
        .layer(DefaultBodyLimit::disable())
        .with_state(s)
}

async fn upload(
    State(s): State<Symbolizer>,
    Path(build_id): Path<String>,
    Query(p): Query<HashMap<String, String>>,
    req: Request,
) -> Result<Response, ApiError> {
    let limit = s.store().max_size();
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let refused = target(req.headers(), &build_id).and_then(|ok| match declared {
        Some(n) if n > limit => Err(StoreError::TooLarge { size: n, limit }.into()),
        _ => Ok(ok),
    });
    let (tenant, build_id) = match refused {
        Ok(ok) => ok,
        Err(e) => {
            // Read a small body before answering, so that the client sees
            // the answer rather than a reset connection.
            let _ = axum::body::to_bytes(req.into_body(), DRAIN_BEFORE_REFUSING).await;
            return Err(e);
        }
    };
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    let body = axum::body::to_bytes(req.into_body(), limit_usize)
        .await
        .map_err(|_| {
            ApiError::TooLarge(format!(
                "the file is larger than the limit of {limit} bytes (--debuginfo-max-size)"
            ))
        })?;
    let name = p.get("name").map(String::as_str).unwrap_or("");
    let meta = s
        .store()
        .put(
            &Owner::Tenant(tenant.clone()),
            Some(&build_id),
            name,
            Source::Upload,
            body,
        )
        .await?;
    s.forget(&tenant, &meta.build_id);
    tracing::info!(tenant = %tenant, build_id = %meta.build_id, size = meta.size, kind = ?meta.kind, "debug info uploaded");
    Ok((StatusCode::CREATED, Json(meta)).into_response())
}

/// The request's tenant and checked build id.
fn target(headers: &axum::http::HeaderMap, build_id: &str) -> Result<(TenantId, String), ApiError> {
    Ok((tenant_from_headers(headers)?, check_build_id(build_id)?))
}

fn not_uploaded(build_id: &str) -> ApiError {
    ApiError::NotFound(format!("no debug info uploaded for build id {build_id}"))
}

async fn exists(
    State(s): State<Symbolizer>,
    Path(build_id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let (tenant, build_id) = target(&headers, &build_id)?;
    match s.store().meta(&Owner::Tenant(tenant), &build_id).await? {
        Some(m) => Ok(Json(m).into_response()),
        None => Err(not_uploaded(&build_id)),
    }
}

async fn list(
    State(s): State<Symbolizer>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = tenant_from_headers(&headers)?;
    let files = s.store().list(&Owner::Tenant(tenant)).await?;
    Ok(Json(serde_json::json!({ "files": files })).into_response())
}

async fn delete(
    State(s): State<Symbolizer>,
    Path(build_id): Path<String>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let (tenant, build_id) = target(&headers, &build_id)?;
    let owner = Owner::Tenant(tenant.clone());
    if !s.store().delete(&owner, &build_id).await? {
        return Err(not_uploaded(&build_id));
    }
    s.forget(&tenant, &build_id);
    Ok(StatusCode::NO_CONTENT.into_response())
}
