//! Domain types of the metastore and the Raft type configuration.

use std::io::Cursor;

use fathom_block::BlockMeta;
use serde::{Deserialize, Serialize};

/// The role a registered member plays in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    Distributor,
    Ingester,
    Querier,
    Compactor,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Distributor => "distributor",
            Role::Ingester => "ingester",
            Role::Querier => "querier",
            Role::Compactor => "compactor",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A process of another role, registered in the metastore.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Unique instance name.
    pub id: String,
    pub role: Role,
    /// `host:port` where the member serves its role's API.
    pub addr: String,
    /// Unix milliseconds of its latest registration, stamped by the leader
    /// (whatever the client sends is ignored).
    pub registered_at_ms: i64,
    /// It left on purpose (`Leave`; an ingester does after flushing its
    /// heads) and has not registered since. A member that is neither live
    /// nor left is down: killed, crashed or cut off.
    #[serde(default)]
    pub left: bool,
}

/// How a registered member stands in the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// Registered and heartbeating, not left.
    Live,
    /// Left on purpose (or forgotten) and not registered since.
    Left,
    /// Neither: killed, crashed or cut off.
    Down,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Live => "live",
            MemberState::Left => "left",
            MemberState::Down => "down",
        }
    }
}

impl Member {
    /// Its state, given whether the metastore lists it as live.
    pub fn state(&self, live: bool) -> MemberState {
        if live {
            MemberState::Live
        } else if self.left {
            MemberState::Left
        } else {
            MemberState::Down
        }
    }

    /// A member to register; the leader stamps `registered_at_ms`.
    pub fn new(id: impl Into<String>, role: Role, addr: impl Into<String>) -> Self {
        Member {
            id: id.into(),
            role,
            addr: addr.into(),
            registered_at_ms: 0,
            left: false,
        }
    }
}

/// A block removed from the index whose files are still to be deleted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDeletion {
    pub block: BlockMeta,
    /// Unix milliseconds (leader clock) when the block left the index.
    pub removed_at_ms: i64,
}

/// One entry of the replicated log: a command and the proposing leader's
/// clock, so that applying it is deterministic on every node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Request {
    pub(crate) now_ms: i64,
    pub(crate) cmd: Command,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Command {
    Register {
        member: Member,
    },
    /// Marks a registered member as left.
    Leave {
        id: String,
    },
    AddBlock {
        block: BlockMeta,
    },
    /// Adds `add` and moves `remove` to pending deletion, as one step.
    ReplaceBlocks {
        tenant: String,
        add: Vec<BlockMeta>,
        remove: Vec<String>,
    },
    /// Forgets pending deletions whose files are gone.
    Purge {
        tenant: String,
        ids: Vec<String>,
    },
    AcquireLease {
        job: String,
        owner: String,
        ttl_ms: u64,
    },
    ReleaseLease {
        job: String,
        owner: String,
    },
}

/// What applying a [`Request`] produced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Response {
    Done,
    Lease {
        granted: bool,
    },
    /// The command was refused as a whole (nothing changed).
    Rejected(String),
}

openraft::declare_raft_types!(
    /// Openraft types of the metastore group.
    pub(crate) TypeConfig:
        D = Request,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub(crate) type NodeId = u64;
pub(crate) type LogId = openraft::LogId<NodeId>;
pub(crate) type Vote = openraft::Vote<NodeId>;
pub(crate) type Entry = openraft::Entry<TypeConfig>;
pub(crate) type StorageError = openraft::StorageError<NodeId>;
pub(crate) type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub(crate) type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub(crate) type Raft = openraft::Raft<TypeConfig>;
