//! `fathom.metastore.v1.Metastore`: the client API, served by the leader.
//!
//! A follower does not forward: it answers `UNAVAILABLE` with the leader's
//! address in the [`LEADER_METADATA`] entry and in the message, and the
//! client retries there. Redirecting keeps followers free of client traffic
//! and every read and write on one code path (the leader's).

use std::collections::HashSet;
use std::time::Instant;

use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use tonic::{Request, Response, Status};

use crate::convert::{check_block, check_items, check_name, check_tenant, role};
use crate::node::NodeInner;
use crate::proto;
use crate::proto::metastore_server::Metastore;
use crate::state::State;
use crate::types::{Command, Member, Request as RaftRequest, Response as RaftResponse};

/// gRPC metadata entry naming the leader's `host:port` in a redirect.
pub const LEADER_METADATA: &str = "x-fathom-metastore-leader";

/// Longest lease accepted.
const MAX_LEASE_TTL_MS: u64 = 24 * 3600 * 1000;

pub(crate) struct MetastoreService {
    pub(crate) inner: std::sync::Arc<NodeInner>,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

type Reply<T> = Result<Response<T>, Status>;

impl MetastoreService {
    fn not_leader(&self, hint: Option<(u64, String)>) -> Status {
        let me = self.inner.id;
        match hint.or_else(|| self.inner.leader()) {
            Some((id, addr)) if id != me => {
                let mut s = Status::unavailable(format!(
                    "metastore node {me} is not the leader; the leader is node {id} at {addr}"
                ));
                if let Ok(v) = addr.parse() {
                    s.metadata_mut().insert(LEADER_METADATA, v);
                }
                s
            }
            _ => Status::unavailable(format!(
                "metastore node {me} is not the leader and knows of none (election in progress)"
            )),
        }
    }

    fn forward_hint(
        &self,
        f: &openraft::error::ForwardToLeader<u64, openraft::BasicNode>,
    ) -> Status {
        let hint = f
            .leader_id
            .zip(f.leader_node.as_ref())
            .map(|(id, n)| (id, n.addr.clone()));
        self.not_leader(hint)
    }

    fn stopped(&self, e: impl std::fmt::Display) -> Status {
        Status::unavailable(format!("metastore node {} stopped: {e}", self.inner.id))
    }

    /// Proposes `cmd` with the leader's clock and waits until it is applied.
    async fn write(&self, cmd: Command) -> Result<RaftResponse, Status> {
        if !self.inner.is_leader() {
            return Err(self.not_leader(None));
        }
        let req = RaftRequest {
            now_ms: now_ms(),
            cmd,
        };
        match self.inner.raft.client_write(req).await {
            Ok(r) => match r.data {
                RaftResponse::Rejected(m) => Err(Status::failed_precondition(m)),
                other => Ok(other),
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(self.forward_hint(&f))
            }
            Err(RaftError::APIError(e)) => Err(Status::internal(e.to_string())),
            Err(RaftError::Fatal(f)) => Err(self.stopped(f)),
        }
    }

    /// Confirms leadership with a quorum (a linearizable read point).
    async fn confirm_leader(&self, wait_applied: bool) -> Result<u64, Status> {
        if !self.inner.is_leader() {
            return Err(self.not_leader(None));
        }
        let term = self.inner.term();
        let raft = &self.inner.raft;
        let res = tokio::time::timeout(self.inner.read_timeout, async {
            if wait_applied {
                raft.ensure_linearizable().await.map(|_| ())
            } else {
                raft.get_read_log_id().await.map(|_| ())
            }
        })
        .await;
        match res {
            Ok(Ok(())) => Ok(term),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                Err(self.forward_hint(&f))
            }
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e)))) => {
                Err(Status::unavailable(format!(
                    "metastore leader {} cannot reach a quorum: {e}",
                    self.inner.id
                )))
            }
            Ok(Err(RaftError::Fatal(f))) => Err(self.stopped(f)),
            Err(_) => Err(Status::unavailable(format!(
                "metastore leader {} could not confirm its leadership within {:?}",
                self.inner.id, self.inner.read_timeout
            ))),
        }
    }

    /// Whether member `id` is registered (a linearizable read).
    async fn is_registered(&self, id: &str) -> Result<bool, Status> {
        self.read(|s| s.members.contains_key(id)).await
    }

    /// A linearizable read of the state.
    async fn read<T>(&self, f: impl FnOnce(&State) -> T) -> Result<T, Status> {
        self.confirm_leader(true).await?;
        Ok(f(&self.inner.applied.read().state))
    }
}

#[tonic::async_trait]
impl Metastore for MetastoreService {
    async fn register(&self, req: Request<proto::RegisterRequest>) -> Reply<proto::Empty> {
        let m = req
            .into_inner()
            .member
            .ok_or_else(|| Status::invalid_argument("register: member is missing"))?;
        let member = Member::try_from(m).map_err(Status::invalid_argument)?;
        check_name("member id", &member.id)?;
        check_name("member address", &member.addr)?;
        let id = member.id.clone();
        self.write(Command::Register { member }).await?;
        self.inner.live.seen(self.inner.term(), &id, Instant::now());
        Ok(Response::new(proto::Empty {}))
    }

    async fn heartbeat(&self, req: Request<proto::HeartbeatRequest>) -> Reply<proto::Empty> {
        let id = req.into_inner().id;
        check_name("member id", &id)?;
        let term = self.confirm_leader(false).await?;
        // A member marked left that still heartbeats (forgotten while cut
        // off, or just before it came back) is told to register again,
        // which its heartbeat loop does: it is never out of the ring while
        // running.
        match self.inner.applied.read().state.members.get(&id) {
            None => {
                return Err(Status::not_found(format!(
                    "member {id:?} is not registered; register it first"
                )));
            }
            Some(m) if m.left => {
                return Err(Status::not_found(format!(
                    "member {id:?} has left the ring; register it again"
                )));
            }
            Some(_) => {}
        }
        self.inner.live.seen(term, &id, Instant::now());
        Ok(Response::new(proto::Empty {}))
    }

    async fn leave(&self, req: Request<proto::LeaveRequest>) -> Reply<proto::Empty> {
        let id = req.into_inner().id;
        check_name("member id", &id)?;
        if !self.is_registered(&id).await? {
            return Err(Status::not_found(format!(
                "member {id:?} is not registered"
            )));
        }
        self.write(Command::Leave { id }).await?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn members(&self, req: Request<proto::MembersRequest>) -> Reply<proto::MembersReply> {
        let req = req.into_inner();
        let want = req
            .role
            .map(role)
            .transpose()
            .map_err(Status::invalid_argument)?;
        let term = self.confirm_leader(true).await?;
        let live = self.inner.live.view(term, Instant::now());
        let members = self
            .inner
            .applied
            .read()
            .state
            .members
            .values()
            .filter(|m| want.is_none_or(|r| m.role == r))
            .filter(|m| req.include_dead || (!m.left && live(&m.id)))
            .map(proto::Member::from)
            .collect();
        Ok(Response::new(proto::MembersReply { members }))
    }

    async fn add_block(&self, req: Request<proto::AddBlockRequest>) -> Reply<proto::Empty> {
        let block: fathom_block::BlockMeta = req
            .into_inner()
            .block
            .ok_or_else(|| Status::invalid_argument("add_block: block is missing"))?
            .into();
        check_block(&block)?;
        self.write(Command::AddBlock { block }).await?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn blocks(&self, req: Request<proto::BlocksRequest>) -> Reply<proto::BlocksReply> {
        let req = req.into_inner();
        let Some(t) = req.tenant else {
            return Err(Status::invalid_argument(
                "blocks: the tenant is missing; a call lists one tenant's blocks \
                 (Tenants lists the tenants)",
            ));
        };
        check_tenant(&t)?;
        if req.start_nanos > req.end_nanos {
            return Err(Status::invalid_argument(format!(
                "start {} is after end {}",
                req.start_nanos, req.end_nanos
            )));
        }
        let blocks = self
            .read(|s| s.blocks(&t, req.start_nanos, req.end_nanos))
            .await?;
        Ok(Response::new(proto::BlocksReply {
            blocks: blocks.iter().map(proto::BlockMeta::from).collect(),
        }))
    }

    async fn tenants(&self, _req: Request<proto::Empty>) -> Reply<proto::TenantsReply> {
        let tenants = self.read(State::tenants).await?;
        Ok(Response::new(proto::TenantsReply { tenants }))
    }

    async fn replace_blocks(
        &self,
        req: Request<proto::ReplaceBlocksRequest>,
    ) -> Reply<proto::Empty> {
        let req = req.into_inner();
        check_tenant(&req.tenant)?;
        check_items("blocks to add", req.add.len())?;
        check_items("blocks to remove", req.remove.len())?;
        let add: Vec<fathom_block::BlockMeta> = req.add.into_iter().map(Into::into).collect();
        let mut ids = HashSet::new();
        for b in &add {
            check_block(b)?;
            if b.tenant != req.tenant {
                return Err(Status::invalid_argument(format!(
                    "block {} belongs to tenant {}, not {}",
                    b.id, b.tenant, req.tenant
                )));
            }
            if !ids.insert(b.id.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "block {} is added twice",
                    b.id
                )));
            }
        }
        for id in &req.remove {
            check_name("block id", id)?;
            if ids.contains(id.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "block {id} is both added and removed"
                )));
            }
        }
        if add.is_empty() && req.remove.is_empty() {
            return Ok(Response::new(proto::Empty {}));
        }
        self.write(Command::ReplaceBlocks {
            tenant: req.tenant,
            add,
            remove: req.remove,
        })
        .await?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn pending_deletions(
        &self,
        _req: Request<proto::Empty>,
    ) -> Reply<proto::PendingDeletionsReply> {
        let pending = self.read(State::pending_deletions).await?;
        Ok(Response::new(proto::PendingDeletionsReply {
            blocks: pending.iter().map(proto::PendingDeletion::from).collect(),
        }))
    }

    async fn purge(&self, req: Request<proto::PurgeRequest>) -> Reply<proto::Empty> {
        let req = req.into_inner();
        check_tenant(&req.tenant)?;
        check_items("block ids", req.ids.len())?;
        for id in &req.ids {
            check_name("block id", id)?;
        }
        if !req.ids.is_empty() {
            self.write(Command::Purge {
                tenant: req.tenant,
                ids: req.ids,
            })
            .await?;
        }
        Ok(Response::new(proto::Empty {}))
    }

    async fn acquire_lease(
        &self,
        req: Request<proto::AcquireLeaseRequest>,
    ) -> Reply<proto::AcquireLeaseReply> {
        let req = req.into_inner();
        check_name("job", &req.job)?;
        check_name("owner", &req.owner)?;
        if req.ttl_ms == 0 || req.ttl_ms > MAX_LEASE_TTL_MS {
            return Err(Status::invalid_argument(format!(
                "lease ttl {} ms is outside 1..={MAX_LEASE_TTL_MS} ms",
                req.ttl_ms
            )));
        }
        let granted = match self
            .write(Command::AcquireLease {
                job: req.job,
                owner: req.owner,
                ttl_ms: req.ttl_ms,
            })
            .await?
        {
            RaftResponse::Lease { granted } => granted,
            other => {
                return Err(Status::internal(format!(
                    "lease command produced {other:?}"
                )));
            }
        };
        Ok(Response::new(proto::AcquireLeaseReply { granted }))
    }

    async fn release_lease(&self, req: Request<proto::ReleaseLeaseRequest>) -> Reply<proto::Empty> {
        let req = req.into_inner();
        check_name("job", &req.job)?;
        check_name("owner", &req.owner)?;
        self.write(Command::ReleaseLease {
            job: req.job,
            owner: req.owner,
        })
        .await?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn leader(&self, _req: Request<proto::Empty>) -> Reply<proto::LeaderReply> {
        let l = self.inner.leader();
        Ok(Response::new(proto::LeaderReply {
            id: l.as_ref().map(|l| l.0),
            addr: l.map(|l| l.1),
        }))
    }
}
