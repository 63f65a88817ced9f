//! The cluster secret: what the internal services (an ingester's writes and
//! head reads, the metastore's client API and Raft) ask of a caller before
//! they answer.
//!
//! ```text
//!  distributor ─┐                         ┌─► ingester: Write, Flight head reads
//!  querier     ─┼─ x-fathom-cluster-secret ┤
//!  ingester …  ─┘   (every internal call)  └─► metastore: Metastore, Raft
//! ```
//!
//! Every member is started with the same secret. Clients send it in the
//! [`CLUSTER_SECRET_HEADER`] entry of every internal call ([`ClusterSecret`]
//! is a tonic [`Interceptor`]); servers refuse a call without it, or with
//! another one, with `UNAUTHENTICATED` before the call is decoded
//! ([`require_cluster_secret`]). The comparison takes the same time
//! wherever the first difference is. With no secret ([`ClusterSecret::none`],
//! a trusted network) nothing is sent and nothing is checked.
//!
//! The secret is not encryption: on an untrusted network, put the internal
//! traffic in a private network or a mesh that encrypts it.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;

/// The gRPC metadata entry (HTTP header) that carries the cluster secret.
pub const CLUSTER_SECRET_HEADER: &str = "x-fathom-cluster-secret";

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// Longest secret accepted, in bytes.
pub const MAX_SECRET_LEN: usize = 1024;

/// A cluster secret (or none, on a trusted network); cheap to clone.
#[derive(Clone, Default)]
pub struct ClusterSecret(Option<Arc<Inner>>);

struct Inner {
    bytes: Vec<u8>,
    header: AsciiMetadataValue,
}

impl std::fmt::Debug for ClusterSecret {
    /// Never shows the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(_) => f.write_str("ClusterSecret(<set>)"),
            None => f.write_str("ClusterSecret(<none>)"),
        }
    }
}

/// Why a secret was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error(
        "the cluster secret is {0} bytes long; it must have at least {MIN_SECRET_LEN} (e.g. `openssl rand -hex 32`)"
    )]
    TooShort(usize),
    #[error("the cluster secret is {0} bytes long; at most {MAX_SECRET_LEN} are accepted")]
    TooLong(usize),
    #[error(
        "the cluster secret must be printable ASCII without spaces (e.g. `openssl rand -hex 32`)"
    )]
    NotPrintable,
}

impl ClusterSecret {
    /// No secret: calls carry none and servers check none.
    pub fn none() -> Self {
        ClusterSecret(None)
    }

    /// A secret: printable ASCII without spaces, 16 to 1024 bytes. Leading
    /// and trailing white space (a newline at the end of a file) is
    /// dropped.
    pub fn new(secret: &str) -> Result<Self, SecretError> {
        let s = secret.trim();
        if s.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort(s.len()));
        }
        if s.len() > MAX_SECRET_LEN {
            return Err(SecretError::TooLong(s.len()));
        }
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SecretError::NotPrintable);
        }
        let mut header: AsciiMetadataValue =
            MetadataValue::try_from(s).map_err(|_| SecretError::NotPrintable)?;
        header.set_sensitive(true);
        Ok(ClusterSecret(Some(Arc::new(Inner {
            bytes: s.as_bytes().to_vec(),
            header,
        }))))
    }

    /// A random secret, for a process whose internal services only its own
    /// parts call (`fathom all`'s metastore).
    pub fn random() -> Self {
        let s = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        Self::new(&s).expect("two uuids make a valid secret")
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Whether `presented` (a header's bytes) is the secret; always true
    /// without a secret. Takes the same time wherever the bytes differ.
    pub fn accepts(&self, presented: Option<&[u8]>) -> bool {
        let Some(inner) = &self.0 else {
            return true;
        };
        let Some(p) = presented else {
            return false;
        };
        constant_time_eq(&inner.bytes, p)
    }

    /// Adds the secret to an outgoing request's metadata (nothing without
    /// a secret).
    pub fn attach<T>(&self, req: &mut tonic::Request<T>) {
        if let Some(inner) = &self.0 {
            req.metadata_mut()
                .insert(CLUSTER_SECRET_HEADER, inner.header.clone());
        }
    }
}

/// Compares two byte strings in a time that depends on their lengths only.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Interceptor for ClusterSecret {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.attach(&mut req);
        Ok(req)
    }
}

/// A server-side interceptor: refuses a call without the secret (or with
/// another one) with `UNAUTHENTICATED`, like [`require_cluster_secret`],
/// for services served by a tonic server of their own.
#[derive(Clone, Debug)]
pub struct RequireSecret(pub ClusterSecret);

impl Interceptor for RequireSecret {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let presented = req
            .metadata()
            .get(CLUSTER_SECRET_HEADER)
            .map(|v| v.as_bytes());
        if self.0.accepts(presented) {
            Ok(req)
        } else {
            Err(refusal(presented.is_some(), "grpc"))
        }
    }
}

/// The status of a refused call (and its log line).
fn refusal(presented: bool, path: &str) -> tonic::Status {
    let why = if presented {
        "the cluster secret of this call is wrong"
    } else {
        "this internal service needs the cluster secret (x-fathom-cluster-secret); \
         start the caller with the cluster's --cluster-secret"
    };
    tracing::warn!(
        path,
        secret = if presented { "wrong" } else { "missing" },
        "refused an internal call"
    );
    tonic::Status::unauthenticated(why)
}

/// A gRPC channel whose every call carries the cluster secret.
pub type SecretChannel =
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, ClusterSecret>;

/// Axum middleware in front of internal services: without the secret (or
/// with another one) the call is refused with `UNAUTHENTICATED` (a gRPC
/// status; HTTP 401 for a request that is not gRPC) and never reaches the
/// service. Mount with
/// `axum::middleware::from_fn_with_state(secret, require_cluster_secret)`.
pub async fn require_cluster_secret(
    State(secret): State<ClusterSecret>,
    req: Request,
    next: Next,
) -> Response {
    let presented = req
        .headers()
        .get(CLUSTER_SECRET_HEADER)
        .map(|v| v.as_bytes());
    if secret.accepts(presented) {
        return next.run(req).await;
    }
    let status = refusal(presented.is_some(), req.uri().path());
    let grpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        status.into_http::<axum::body::Body>()
    } else {
        (
            http::StatusCode::UNAUTHORIZED,
            format!("{}\n", status.message()),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_short_long_and_unprintable_secrets() {
        assert_eq!(
            ClusterSecret::new("short").unwrap_err(),
            SecretError::TooShort(5)
        );
        assert_eq!(
            ClusterSecret::new(&"x".repeat(2000)).unwrap_err(),
            SecretError::TooLong(2000)
        );
        assert_eq!(
            ClusterSecret::new("0123456789 abcdefgh").unwrap_err(),
            SecretError::NotPrintable
        );
        assert_eq!(
            ClusterSecret::new("0123456789abcdéfgh").unwrap_err(),
            SecretError::NotPrintable
        );
    }

    #[test]
    fn accepts_only_the_same_secret() {
        let s = ClusterSecret::new("0123456789abcdef\n").unwrap();
        assert!(s.accepts(Some(b"0123456789abcdef")));
        assert!(!s.accepts(Some(b"0123456789abcdeF")));
        assert!(!s.accepts(Some(b"0123456789abcde")));
        assert!(!s.accepts(Some(b"")));
        assert!(!s.accepts(None));
        assert!(ClusterSecret::none().accepts(None));
        let (a, b) = (ClusterSecret::random(), ClusterSecret::random());
        assert!(a.is_set());
        assert!(
            !a.accepts(Some(b.0.as_ref().unwrap().bytes.as_slice())),
            "two random secrets differ"
        );
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let s = ClusterSecret::new("0123456789abcdef").unwrap();
        assert!(!format!("{s:?}").contains("0123"));
    }

    #[test]
    fn attaches_the_header_to_requests() {
        let mut req = tonic::Request::new(());
        ClusterSecret::new("0123456789abcdef")
            .unwrap()
            .attach(&mut req);
        assert_eq!(
            req.metadata().get(CLUSTER_SECRET_HEADER).unwrap(),
            "0123456789abcdef"
        );
        let mut req = tonic::Request::new(());
        ClusterSecret::none().attach(&mut req);
        assert!(req.metadata().get(CLUSTER_SECRET_HEADER).is_none());
    }
}
