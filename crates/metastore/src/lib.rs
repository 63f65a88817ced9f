//! Fathom's metastore: a small Raft group ([openraft] 0.9, storage v2)
//! that holds what the cluster must agree on and must not lose:
//! membership of the other roles, the index of blocks per tenant and time
//! range (queriers never list the bucket), and compaction job leases.
//!
//! ```text
//!  ingesters, queriers,        MetastoreClient ──gRPC──► any node ──UNAVAILABLE + leader addr──┐
//!  compactors, distributors    (finds and caches                                              │
//!                               the leader)      ◄────────────── leader ◄─────────────────────┘
//!                                                                  │ Raft (AppendEntries, Vote,
//!                                                                  │ InstallSnapshot over gRPC)
//!                                                  ┌───────────────┼───────────────┐
//!                                               node 1          node 2          node 3
//!                                    data dir:  raft.log  snapshot/snapshot.json
//! ```
//!
//! # What is replicated
//!
//! The state machine is a pure function of
//! the log: the proposing leader stamps its wall clock (`now_ms`) into every
//! log entry, so applying an entry reads no clock and every node reaches the
//! same state.
//!
//! - **Members** (`id`, [`Role`], `addr`, `registered_at_ms`): written by
//!   `register` only.
//! - **Blocks** ([`fathom_block::BlockMeta`]) by tenant and id. `add_block`
//!   is idempotent (and does not resurrect a block that was replaced since).
//!   `replace_blocks(tenant, add, remove)` is **one** log entry: either every
//!   block of `remove` is in the index, and then they all move to the
//!   pending-deletion list (with the leader's time) while `add` appears, or
//!   the entry is refused as a whole (`FAILED_PRECONDITION`,
//!   [`MetastoreError::Rejected`]). A reader sees the sources or the result,
//!   never both or neither. Retrying a replacement that was already applied
//!   succeeds without change, so a compactor that lost the reply can retry.
//! - **Pending deletions**: removed blocks with `removed_at_ms`; a compactor
//!   deletes their files after a delay and then `purge`s them.
//! - **Leases** (`job` → owner, expiry): `acquire_lease` is granted when
//!   the job is free, expired, or held by the same owner (which renews it),
//!   judged at the leader's `now_ms` in the entry; `release_lease` by the
//!   owner frees it. Leader clocks should be NTP-synchronized: a new leader
//!   whose clock is ahead shortens leases by the skew.
//!
//! # What is leader-local: heartbeats
//!
//! Heartbeats do not go through the log. A member heartbeats every few
//! seconds, and replicating each one would cost an fsync on a quorum per
//! heartbeat for information that is worthless a timeout later. The leader
//! keeps `member id → last heartbeat` in memory, after confirming its
//! leadership with a quorum (so a deposed leader cannot keep members alive).
//! A member is live when its last heartbeat (or registration) is younger
//! than `heartbeat_timeout` (15 s by default). A new leader knows no
//! heartbeats, so it counts **every registered member as live for one
//! timeout** after it takes over (the heartbeat map is reset whenever this
//! node starts leading in a new term); a member that is really gone drops
//! out one timeout later. The cost: after a leader change, a dead member
//! can stay in the ring up to one extra timeout — the same bound as without
//! a leader change. Registrations are replicated; members are never deleted,
//! only not live (`members` returns live ones, `all_members` every one). A
//! member that stops on purpose calls `Leave` (replicated): it is no longer
//! live, heartbeat or not, and [`Member::left`] says so until it registers
//! again. An ingester leaves only once its heads are flushed, so one that
//! is neither live nor left may hold acknowledged writes (the queriers
//! count it as a missed replica).
//!
//! # Reads and writes
//!
//! Both services (client API and Raft) answer only calls that carry the
//! cluster secret ([`MetastoreConfig::secret`], see
//! [`fathom_api::secret`]); others get `UNAUTHENTICATED`. `Blocks` answers
//! for one tenant per call; `Tenants` lists the tenants that have blocks.
//!
//! Every client call is served by the leader. A follower does not forward:
//! it answers `UNAVAILABLE` with a message naming the leader and its address
//! in the [`LEADER_METADATA`] entry; [`MetastoreClient`] follows it, caches
//! the leader, retries unavailability with backoff (25 ms doubling to 1 s)
//! and fails with [`MetastoreError::Unavailable`] after its deadline (15 s by
//! default). Writes return once the entry is committed and applied. Reads
//! are linearizable (`ensure_linearizable`: the leader confirms its
//! leadership with a quorum and waits until its state machine caught up).
//! Bad input (invalid tenant, empty or oversized names, more than 10 000
//! items, inverted time ranges, zero or > 24 h lease TTL) is refused with
//! `INVALID_ARGUMENT` and a message that names the problem.
//!
//! # On disk
//!
//! ```text
//! <data_dir>/raft.log                 "FTHMLOG1", then records: len u32 LE | crc32 u32 LE | JSON
//!                                     (entries, votes, truncations, purges, committed id)
//! <data_dir>/snapshot/snapshot.json   {"meta": openraft SnapshotMeta, "state": the state machine}
//! ```
//!
//! Appends and votes are fsynced before openraft is told they are durable.
//! Truncation and purge are records too; when dead records outnumber live
//! entries the log is rewritten to a temp file, fsynced and renamed. The
//! state machine lives in memory; a snapshot is built every
//! `snapshot_every` entries (temp file, fsync, rename), after which openraft
//! purges the log up to it. A restarted node loads the snapshot and replays
//! the log after it, then rejoins with its state.
//!
//! # Bootstrap
//!
//! Every node gets the full peer list. On a first start (no vote, no log),
//! the node with the lowest id waits two maximum election timeouts for an
//! existing leader to reach it, then calls `initialize` with every peer;
//! the others wait to be contacted. A one-node group (what `fathom all`
//! uses) initializes at once. Membership changes after bootstrap (adding or
//! replacing nodes) are not supported yet.
//!
//! # Failure modes
//!
//! - Leader crash: a follower is elected after an election timeout (1–2 s by
//!   default); in-flight writes fail with `UNAVAILABLE` and the client
//!   retries them on the new leader. Writes are idempotent or refused
//!   consistently, so a retry of an applied write is safe.
//! - Minority partition or loss of quorum: no writes and no reads (clients
//!   get `UNAVAILABLE` until their deadline); nothing stale is served. Callers
//!   must treat this as "unknown" (the querier fails the query with 503, the
//!   ingester keeps the WAL segment and retries the index update).
//! - Crash during an append: the torn record at the end of `raft.log` fails
//!   its length or checksum check on open and the file is truncated before it
//!   (logged with offset and cause); those entries were never acknowledged.
//!   A corrupt record in the middle also ends the log there: the node then
//!   re-fetches what it lost from the leader (a one-node group loses that
//!   tail).
//! - Lost data directory on one node: it restarts empty and is brought up to
//!   date by the leader (log or snapshot). Re-creating it on the lowest-id
//!   node is safe as long as the rest of the group has a leader within the
//!   bootstrap wait.
//! - Snapshot file unreadable: the node refuses to start with an error that
//!   names the file.
//!
//! [openraft]: https://docs.rs/openraft/0.9.25

mod client;
mod convert;
mod error;
mod log_store;
mod network;
mod node;
mod service;
mod sm_store;
mod state;
mod types;

#[allow(unreachable_pub, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/fathom.metastore.v1.rs"));
}

pub use client::{ClientOptions, Heartbeat, MetastoreClient, spawn_heartbeat};
pub use error::{Error, MetastoreError};
pub use node::{MetastoreConfig, MetastoreNode};
pub use service::LEADER_METADATA;
pub use types::{Member, MemberState, PendingDeletion, Role};
