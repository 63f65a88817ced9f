//! What the roles of a cluster need to know about each other, independent
//! of where it comes from (the metastore in a cluster, a fixed list in
//! tests and in `fathom all`).

use crate::secret::{ClusterSecret, SecretChannel};

/// One ingester as the others address it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IngesterAddr {
    /// Unique instance name (stable across restarts of the same ingester).
    pub id: String,
    /// gRPC address, `host:port`.
    pub addr: String,
}

/// Why the live ingesters could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// No listing has succeeded yet (the metastore is starting or
    /// unreachable); `source` is the last listing's failure.
    #[error("no ingester list from the metastore yet: {source}")]
    NotListed {
        #[source]
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },
}

/// The ring cannot be read now: retry later (503 / `UNAVAILABLE`).
impl From<MembershipError> for crate::ApiError {
    fn from(e: MembershipError) -> Self {
        crate::ApiError::Unavailable(format!("reading the ingester ring: {e}"))
    }
}

/// A channel to an ingester could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("address {addr}: {source}")]
    Address {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// The live ingesters, as the distributor's ring and the querier's head
/// reads see them.
#[async_trait::async_trait]
pub trait Ingesters: Send + Sync + 'static {
    /// Every live ingester; an error when membership cannot be read.
    async fn ingesters(&self) -> Result<Vec<IngesterAddr>, MembershipError>;

    /// The ids of the ingesters that are down: registered, neither live
    /// nor gone on purpose (an ingester leaves the cluster only after
    /// flushing its heads), so killed, crashed or cut off. Their heads may
    /// hold acknowledged writes: a head read counts each as a replica it
    /// could not read. None by default (a fixed set has no such state).
    async fn down(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A fixed set of ingesters.
#[derive(Clone, Debug, Default)]
pub struct StaticIngesters(pub Vec<IngesterAddr>);

#[async_trait::async_trait]
impl Ingesters for StaticIngesters {
    async fn ingesters(&self) -> Result<Vec<IngesterAddr>, MembershipError> {
        Ok(self.0.clone())
    }
}

/// Lazily connected gRPC channels, one per `host:port`, each call bounded
/// by `timeout` and carrying the cluster secret.
pub struct Channels {
    channels: parking_lot::Mutex<std::collections::HashMap<String, tonic::transport::Channel>>,
    timeout: std::time::Duration,
    secret: ClusterSecret,
}

impl Channels {
    pub fn new(timeout: std::time::Duration, secret: ClusterSecret) -> Self {
        Channels {
            channels: parking_lot::Mutex::new(std::collections::HashMap::new()),
            timeout,
            secret,
        }
    }

    /// The channel to `addr`, created on first use.
    pub fn get(&self, addr: &str) -> Result<SecretChannel, ChannelError> {
        self.raw(addr)
            .map(|ch| SecretChannel::new(ch, self.secret.clone()))
    }

    fn raw(&self, addr: &str) -> Result<tonic::transport::Channel, ChannelError> {
        if let Some(c) = self.channels.lock().get(addr) {
            return Ok(c.clone());
        }
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|source| ChannelError::Address {
                addr: addr.to_owned(),
                source,
            })?
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .connect_lazy();
        self.channels.lock().insert(addr.to_owned(), ch.clone());
        Ok(ch)
    }
}

/// Writes a quorum of `replication_factor` replicas must acknowledge.
pub fn quorum(replication_factor: usize) -> usize {
    replication_factor / 2 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_and_channel_errors_keep_their_source() {
        let e = MembershipError::NotListed {
            source: std::sync::Arc::new(std::io::Error::other("no leader")),
        };
        assert!(std::error::Error::source(&e).is_some());
        assert!(e.to_string().contains("no leader"), "{e}");
        let api = crate::ApiError::from(e);
        assert_eq!(api.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.grpc_code(), tonic::Code::Unavailable);

        let ch = Channels::new(std::time::Duration::from_secs(1), ClusterSecret::random());
        let e = ch.get("not a host:port/\\x").unwrap_err();
        assert!(std::error::Error::source(&e).is_some());
        assert!(e.to_string().starts_with("address "), "{e}");
    }

    #[test]
    fn quorum_is_a_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(5), 3);
    }
}
