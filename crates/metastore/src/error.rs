use std::path::PathBuf;

/// Why a metastore node could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid metastore configuration: {0}")]
    Config(String),
    #[error("metastore data at {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("metastore snapshot {path} is unreadable: {reason}")]
    Snapshot { path: PathBuf, reason: String },
    #[error("metastore cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("metastore raft: {0}")]
    Raft(Box<openraft::error::Fatal<u64>>),
    #[error("metastore raft configuration: {0}")]
    RaftConfig(Box<openraft::ConfigError>),
}

impl From<openraft::error::Fatal<u64>> for Error {
    fn from(e: openraft::error::Fatal<u64>) -> Self {
        Error::Raft(Box::new(e))
    }
}

impl From<openraft::ConfigError> for Error {
    fn from(e: openraft::ConfigError) -> Self {
        Error::RaftConfig(Box::new(e))
    }
}

/// What a [`crate::MetastoreClient`] call can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetastoreError {
    #[error("no metastore address configured")]
    NoAddress,
    #[error("invalid metastore address {addr:?}: {reason}")]
    Address { addr: String, reason: String },
    /// No leader answered before the client's deadline.
    #[error(
        "metastore unavailable: no leader answered within {deadline:?} ({attempts} attempts over {addrs}); last error: {last}"
    )]
    Unavailable {
        deadline: std::time::Duration,
        attempts: u32,
        addrs: String,
        last: String,
    },
    /// The request was valid but refused by the state (for example, a
    /// replacement of blocks that are no longer in the index). Nothing
    /// changed.
    #[error("metastore refused the request: {0}")]
    Rejected(String),
    #[error("invalid metastore request: {0}")]
    InvalidArgument(String),
    #[error("not found in the metastore: {0}")]
    NotFound(String),
    #[error("metastore call failed ({code:?}): {message}")]
    Rpc { code: tonic::Code, message: String },
    #[error("metastore sent an invalid reply: {0}")]
    InvalidReply(String),
}

impl From<MetastoreError> for fathom_block::IndexError {
    fn from(e: MetastoreError) -> Self {
        fathom_block::IndexError::new(e)
    }
}
