//! Authentication at the external edge: one axum layer in front of every
//! API a process serves to clients (HTTP API and UI, `/ingest`, push.v1,
//! gRPC push, OTLP, Arrow Flight and Flight SQL, Connect), so that HTTP,
//! Connect and gRPC are checked by the same code.
//!
//! ```text
//!  request ─► Authorization (Bearer | Basic) ─► credential of the tenants file ─► 401 if none
//!          ─► scope of the path (write: /ingest, push, OTLP; read: the rest) ─► 403 if not allowed
//!          ─► X-Scope-OrgID: must be one of the credential's tenants (403), or
//!             absent: the credential's first ─► header set to that tenant ─► handler
//! ```
//!
//! The handlers keep reading the tenant from `X-Scope-OrgID`
//! ([`fathom_api::tenant_from_headers`]): after this layer the header is
//! always one the credential allows. `/ready`, `/health` and `/metrics` are
//! outside the layer. The tenants file is re-read every `reload_interval`;
//! a file that does not parse keeps the last good one in force, says why in
//! the log and sets `fathom_auth_tenants_file_ok` to 0.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use fathom_api::TENANT_HEADER;
use fathom_api::auth::{AuthError, Credential, Scope, Tenants, TenantsConfig};
pub use fathom_api::auth::{hash_pbkdf2, hash_sha256};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::Error;

/// Who made a request, for handlers that want more than the tenant header.
#[derive(Clone, Debug)]
pub struct Authenticated {
    pub credential: Arc<Credential>,
    pub tenant: fathom_model::TenantId,
}

#[derive(Clone, Default)]
struct Metrics {
    refused: Family<Vec<(String, String)>, Counter>,
    reloads: Family<Vec<(String, String)>, Counter>,
    file_ok: Gauge,
}

/// The tenants file in force and the layer's metrics. Cheap to clone.
#[derive(Clone)]
pub struct Auth {
    tenants: Tenants,
    metrics: Metrics,
}

impl Auth {
    /// Reads the tenants file (a mistake stops the start: the message names
    /// it) and re-reads it every `reload_interval` in the background.
    pub fn load(
        path: &Path,
        reload_interval: Duration,
        registry: &mut Registry,
    ) -> Result<Auth, Error> {
        let text = std::fs::read(path).map_err(|source| Error::Io {
            what: format!("reading the tenants file {}", path.display()),
            source,
        })?;
        let cfg = parse(&text).map_err(|e| Error::Tenants(format!("{}: {e}", path.display())))?;
        let metrics = Metrics::default();
        let r = registry.sub_registry_with_prefix("fathom_auth");
        r.register(
            "refused",
            "Requests refused by authentication, by reason (unauthenticated, permission_denied)",
            metrics.refused.clone(),
        );
        r.register(
            "tenants_file_reloads",
            "Reloads of a changed tenants file, by outcome (ok, error)",
            metrics.reloads.clone(),
        );
        r.register(
            "tenants_file_ok",
            "1 when the tenants file last read parsed; 0 when it did not (the last good one stays in force)",
            metrics.file_ok.clone(),
        );
        metrics.file_ok.set(1);
        tracing::info!(
            file = %path.display(),
            credentials = cfg.credentials(),
            reload_interval = %humantime_secs(reload_interval),
            "loaded the tenants file"
        );
        let auth = Auth {
            tenants: Tenants::new(cfg),
            metrics,
        };
        tokio::spawn(auth.clone().reload_loop(
            path.to_owned(),
            text,
            reload_interval.max(Duration::from_millis(100)),
        ));
        Ok(auth)
    }

    /// The tenants in force (for per-tenant limits).
    pub fn tenants(&self) -> Tenants {
        self.tenants.clone()
    }

    async fn reload_loop(self, path: PathBuf, mut last: Vec<u8>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let text = match tokio::fs::read(&path).await {
                Ok(t) => t,
                Err(e) => {
                    if !last.is_empty() {
                        self.failed(&path, &format!("cannot read it: {e}"));
                        last.clear();
                    }
                    continue;
                }
            };
            if text == last {
                continue;
            }
            last.clone_from(&text);
            match parse(&text) {
                Ok(cfg) => {
                    let n = cfg.credentials();
                    self.tenants.replace(cfg);
                    self.metrics.file_ok.set(1);
                    self.count_reload("ok");
                    tracing::info!(file = %path.display(), credentials = n, "reloaded the tenants file");
                }
                Err(e) => self.failed(&path, &e.to_string()),
            }
        }
    }

    fn failed(&self, path: &Path, why: &str) {
        self.metrics.file_ok.set(0);
        self.count_reload("error");
        tracing::error!(
            file = %path.display(),
            error = why,
            "the tenants file is broken; the last good one stays in force"
        );
    }

    fn count_reload(&self, outcome: &str) {
        self.metrics
            .reloads
            .get_or_create(&vec![("outcome".to_owned(), outcome.to_owned())])
            .inc();
    }

    /// `app` behind this layer.
    pub fn layer(&self, app: axum::Router) -> axum::Router {
        app.layer(axum::middleware::from_fn_with_state(
            self.clone(),
            authenticate,
        ))
    }
}

fn humantime_secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn parse(text: &[u8]) -> Result<TenantsConfig, String> {
    let text = std::str::from_utf8(text).map_err(|_| "the file is not UTF-8".to_owned())?;
    TenantsConfig::parse(text).map_err(|e| e.to_string())
}

/// The scope a path needs: the write APIs, else read.
pub fn scope_of(method: &axum::http::Method, path: &str) -> Scope {
    // Debug info uploads and deletions change what the tenant's profiles
    // show: writes; listing and reading it are reads.
    let debuginfo_change = path.starts_with("/api/v1/debuginfo")
        && !matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD);
    let write = debuginfo_change
        || path == "/ingest"
        || path == fathom_distributor::PUSH_V1_PATH
        || path == "/v1development/profiles"
        || path.starts_with("/fathom.push.v1.")
        || path.starts_with("/opentelemetry.proto.collector.profiles.");
    if write { Scope::Write } else { Scope::Read }
}

async fn authenticate(State(auth): State<Auth>, mut req: Request, next: Next) -> Response {
    let cfg = auth.tenants.current();
    let grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    let scope = scope_of(req.method(), req.uri().path());
    let cred = match cfg.authenticate(
        req.headers()
            .get(header::AUTHORIZATION)
            .map(HeaderValue::as_bytes),
    ) {
        Ok(c) => c,
        Err(e) => return auth.refuse(e, grpc),
    };
    let wanted = match req.headers().get(TENANT_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(t)) => Some(t.trim().to_owned()),
        Some(Err(_)) => {
            return auth.refuse(
                AuthError::PermissionDenied("X-Scope-OrgID is not valid ASCII".into()),
                grpc,
            );
        }
    };
    let tenant = match TenantsConfig::authorize(&cred, scope, wanted.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(credential = %cred.name, error = %e, "request refused");
            return auth.refuse(e, grpc);
        }
    };
    match HeaderValue::from_str(tenant.as_str()) {
        Ok(v) => {
            req.headers_mut().insert(TENANT_HEADER, v);
        }
        // Tenant ids are validated ASCII; unreachable in practice.
        Err(_) => {
            return auth.refuse(
                AuthError::PermissionDenied("tenant id is not a header value".into()),
                grpc,
            );
        }
    }
    let limits = cfg.limits(&tenant);
    req.extensions_mut().insert(Authenticated {
        credential: cred,
        tenant,
    });
    fathom_api::auth::with_request_limits(limits, next.run(req)).await
}

impl Auth {
    fn refuse(&self, e: AuthError, grpc: bool) -> Response {
        let (reason, code, status) = match &e {
            AuthError::Unauthenticated(_) => (
                "unauthenticated",
                tonic::Code::Unauthenticated,
                StatusCode::UNAUTHORIZED,
            ),
            AuthError::PermissionDenied(_) => (
                "permission_denied",
                tonic::Code::PermissionDenied,
                StatusCode::FORBIDDEN,
            ),
        };
        self.metrics
            .refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
        let msg = e.to_string();
        if grpc {
            return tonic::Status::new(code, msg).into_http::<Body>();
        }
        // The API's error shape and Connect's (`code`, `message`) at once.
        let body = serde_json::json!({ "error": msg, "code": reason, "message": msg });
        let mut r = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response();
        if status == StatusCode::UNAUTHORIZED {
            // Browsers ask for a user and password (the UI with auth on).
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"fathom\", charset=\"UTF-8\""),
            );
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    #[test]
    fn write_paths() {
        for p in [
            "/ingest",
            "/push.v1.PusherService/Push",
            "/v1development/profiles",
            "/fathom.push.v1.PushService/Push",
            "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
        ] {
            assert_eq!(scope_of(&Method::POST, p), Scope::Write, "{p}");
        }
        let id = "/api/v1/debuginfo/0123456789abcdef";
        assert_eq!(scope_of(&Method::PUT, id), Scope::Write);
        assert_eq!(scope_of(&Method::DELETE, id), Scope::Write);
        assert_eq!(scope_of(&Method::GET, id), Scope::Read);
        assert_eq!(scope_of(&Method::HEAD, id), Scope::Read);
        assert_eq!(scope_of(&Method::GET, "/api/v1/debuginfo"), Scope::Read);
        for p in [
            "/api/v1/query",
            "/",
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            "/arrow.flight.protocol.FlightService/Handshake",
            "/arrow.flight.protocol.FlightService/DoGet",
        ] {
            assert_eq!(scope_of(&Method::POST, p), Scope::Read, "{p}");
        }
    }
}
