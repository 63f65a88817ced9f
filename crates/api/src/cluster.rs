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

/// The live ingesters, as the distributor's ring and the querier's head
/// reads see them.
#[async_trait::async_trait]
pub trait Ingesters: Send + Sync + 'static {
    /// Every live ingester; an error when membership cannot be read.
    async fn ingesters(&self) -> Result<Vec<IngesterAddr>, String>;
}

/// A fixed set of ingesters.
#[derive(Clone, Debug, Default)]
pub struct StaticIngesters(pub Vec<IngesterAddr>);

#[async_trait::async_trait]
impl Ingesters for StaticIngesters {
    async fn ingesters(&self) -> Result<Vec<IngesterAddr>, String> {
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
    pub fn get(&self, addr: &str) -> Result<SecretChannel, String> {
        self.raw(addr)
            .map(|ch| SecretChannel::new(ch, self.secret.clone()))
    }

    fn raw(&self, addr: &str) -> Result<tonic::transport::Channel, String> {
        if let Some(c) = self.channels.lock().get(addr) {
            return Ok(c.clone());
        }
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("address {addr}: {e}"))?
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
    fn quorum_is_a_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(5), 3);
    }
}
