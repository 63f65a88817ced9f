//! [`MetastoreClient`]: finds the leader, follows redirects, retries with
//! bounded backoff until a deadline.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fathom_api::secret::{ClusterSecret, SecretChannel};
use fathom_block::{BlockIndex, BlockMeta, IndexError};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::MetastoreError;
use crate::network::endpoint;
use crate::proto;
use crate::proto::metastore_client::MetastoreClient as Grpc;
use crate::service::LEADER_METADATA;
use crate::types::{Member, PendingDeletion, Role};

/// How long calls may take and how they retry.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// A call that has found no leader after this long fails with
    /// [`MetastoreError::Unavailable`].
    pub deadline: Duration,
    /// Time allowed for one attempt against one node.
    pub attempt_timeout: Duration,
    /// Pause between attempts grows from 25 ms up to this.
    pub max_backoff: Duration,
    /// Sent with every call (the metastore refuses calls without it).
    pub secret: ClusterSecret,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: Duration::from_secs(15),
            attempt_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(1),
            secret: ClusterSecret::none(),
        }
    }
}

/// A client of the metastore group; cheap to clone (clones share the
/// connections and the cached leader).
#[derive(Clone)]
pub struct MetastoreClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// Configured addresses (`host:port`).
    addrs: Vec<String>,
    opts: ClientOptions,
    leader: Mutex<Option<String>>,
    next: AtomicUsize,
    channels: Mutex<HashMap<String, Channel>>,
}

fn normalize(addr: &str) -> String {
    addr.trim()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

impl MetastoreClient {
    /// A client of the metastore nodes at `addrs` (`host:port`, any subset
    /// of the group; one reachable node is enough to find the leader).
    pub fn new<I, S>(addrs: I) -> Result<Self, MetastoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::with_options(addrs, ClientOptions::default())
    }

    pub fn with_options<I, S>(addrs: I, opts: ClientOptions) -> Result<Self, MetastoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut list = Vec::new();
        for a in addrs {
            let a = normalize(a.as_ref());
            if a.is_empty() {
                continue;
            }
            endpoint(&a).map_err(|reason| MetastoreError::Address {
                addr: a.clone(),
                reason,
            })?;
            if !list.contains(&a) {
                list.push(a);
            }
        }
        if list.is_empty() {
            return Err(MetastoreError::NoAddress);
        }
        Ok(MetastoreClient {
            inner: Arc::new(Inner {
                addrs: list,
                opts,
                leader: Mutex::new(None),
                next: AtomicUsize::new(0),
                channels: Mutex::new(HashMap::new()),
            }),
        })
    }

    fn channel(&self, addr: &str) -> Result<Channel, MetastoreError> {
        let mut ch = self.inner.channels.lock();
        if let Some(c) = ch.get(addr) {
            return Ok(c.clone());
        }
        // Leader hints can name nodes outside the configured list; the
        // group has at most a handful of nodes, so this stays small.
        if ch.len() >= 64 {
            ch.clear();
        }
        let c = endpoint(addr)
            .map_err(|reason| MetastoreError::Address {
                addr: addr.to_owned(),
                reason,
            })?
            .connect_lazy();
        ch.insert(addr.to_owned(), c.clone());
        Ok(c)
    }

    fn target(&self) -> String {
        if let Some(l) = self.inner.leader.lock().clone() {
            return l;
        }
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed);
        self.inner.addrs[i % self.inner.addrs.len()].clone()
    }

    /// Calls `f` on the leader, following redirects and retrying
    /// unavailability until the deadline.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T, MetastoreError>
    where
        F: Fn(Grpc<SecretChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_any(f, true).await
    }

    /// Like [`Self::call`]; `leader_only` says whether a success proves
    /// that the node answering is the leader (every call but `leader`).
    async fn call_any<T, F, Fut>(&self, f: F, leader_only: bool) -> Result<T, MetastoreError>
    where
        F: Fn(Grpc<SecretChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let opts = &self.inner.opts;
        let deadline = Instant::now() + opts.deadline;
        let mut backoff = Duration::from_millis(25);
        let mut attempts = 0u32;
        let mut redirects = 0u32;
        let last;
        loop {
            attempts += 1;
            let addr = self.target();
            let client = Grpc::with_interceptor(self.channel(&addr)?, opts.secret.clone())
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20);
            let left = deadline.saturating_duration_since(Instant::now());
            let err = match tokio::time::timeout(opts.attempt_timeout.min(left), f(client)).await {
                Ok(Ok(resp)) => {
                    if leader_only {
                        *self.inner.leader.lock() = Some(addr);
                    }
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) => status,
                Err(_) => tonic::Status::deadline_exceeded(format!(
                    "no answer from {addr} within {:?}",
                    opts.attempt_timeout.min(left)
                )),
            };
            use tonic::Code;
            match err.code() {
                Code::InvalidArgument | Code::OutOfRange => {
                    return Err(MetastoreError::InvalidArgument(err.message().to_owned()));
                }
                Code::FailedPrecondition => {
                    return Err(MetastoreError::Rejected(err.message().to_owned()));
                }
                Code::NotFound => return Err(MetastoreError::NotFound(err.message().to_owned())),
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::Aborted
                | Code::ResourceExhausted => {}
                code => {
                    return Err(MetastoreError::Rpc {
                        code,
                        message: err.message().to_owned(),
                    });
                }
            }
            let hint = err
                .metadata()
                .get(LEADER_METADATA)
                .and_then(|v| v.to_str().ok())
                .map(normalize)
                .filter(|h| !h.is_empty() && *h != addr && endpoint(h).is_ok());
            let msg = format!("{addr}: {:?}: {}", err.code(), err.message());
            tracing::debug!(error = %msg, leader_hint = ?hint, "metastore call failed; retrying");
            *self.inner.leader.lock() = hint.clone();
            if Instant::now() >= deadline {
                last = msg;
                break;
            }
            // Follow a fresh redirect at once, but not forever: two nodes
            // with stale views must not bounce a call back and forth.
            if hint.is_some() && redirects < 3 {
                redirects += 1;
                continue;
            }
            redirects = 0;
            if Instant::now() + backoff >= deadline {
                last = msg;
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(opts.max_backoff);
        }
        Err(MetastoreError::Unavailable {
            deadline: opts.deadline,
            attempts,
            addrs: self.inner.addrs.join(","),
            last,
        })
    }

    /// Registers (or re-registers) a member; it counts as live from now.
    pub async fn register(&self, member: Member) -> Result<(), MetastoreError> {
        let m = proto::Member::from(&member);
        self.call(|mut c| {
            let member = Some(m.clone());
            async move { c.register(proto::RegisterRequest { member }).await }
        })
        .await?;
        Ok(())
    }

    /// Reports that member `id` is alive. Fails with
    /// [`MetastoreError::NotFound`] when it is not registered.
    pub async fn heartbeat(&self, id: &str) -> Result<(), MetastoreError> {
        self.call(|mut c| {
            let id = id.to_owned();
            async move { c.heartbeat(proto::HeartbeatRequest { id }).await }
        })
        .await?;
        Ok(())
    }

    /// Marks member `id` as gone on purpose: it is no longer listed as
    /// live, and [`Member::left`] says so until it registers again. Fails
    /// with [`MetastoreError::NotFound`] when it is not registered.
    pub async fn leave(&self, id: &str) -> Result<(), MetastoreError> {
        self.call(|mut c| {
            let id = id.to_owned();
            async move { c.leave(proto::LeaveRequest { id }).await }
        })
        .await?;
        Ok(())
    }

    async fn members_inner(
        &self,
        role: Option<Role>,
        include_dead: bool,
    ) -> Result<Vec<Member>, MetastoreError> {
        let r = self
            .call(|mut c| async move {
                c.members(proto::MembersRequest {
                    role: role.map(|r| proto::Role::from(r) as i32),
                    include_dead,
                })
                .await
            })
            .await?;
        r.members
            .into_iter()
            .map(Member::try_from)
            .collect::<Result<_, _>>()
            .map_err(MetastoreError::InvalidReply)
    }

    /// Live members (of `role`, or of every role): registered, heartbeating
    /// and not left.
    pub async fn members(&self, role: Option<Role>) -> Result<Vec<Member>, MetastoreError> {
        self.members_inner(role, false).await
    }

    /// Every registered member, live, down or left.
    pub async fn all_members(&self, role: Option<Role>) -> Result<Vec<Member>, MetastoreError> {
        self.members_inner(role, true).await
    }

    pub async fn add_block(&self, block: BlockMeta) -> Result<(), MetastoreError> {
        let b = proto::BlockMeta::from(&block);
        self.call(|mut c| {
            let block = Some(b.clone());
            async move { c.add_block(proto::AddBlockRequest { block }).await }
        })
        .await?;
        Ok(())
    }

    async fn blocks_inner(
        &self,
        req: proto::BlocksRequest,
    ) -> Result<Vec<BlockMeta>, MetastoreError> {
        let r = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.blocks(req).await }
            })
            .await?;
        Ok(r.blocks.into_iter().map(BlockMeta::from).collect())
    }

    /// Blocks of `tenant` that may hold data in `[start, end]` (ns).
    pub async fn blocks(
        &self,
        tenant: &str,
        start: i64,
        end: i64,
    ) -> Result<Vec<BlockMeta>, MetastoreError> {
        self.blocks_inner(proto::BlocksRequest {
            tenant: Some(tenant.to_owned()),
            start_nanos: start,
            end_nanos: end,
        })
        .await
    }

    /// The tenants that have blocks.
    pub async fn tenants(&self) -> Result<Vec<String>, MetastoreError> {
        let r = self
            .call(|mut c| async move { c.tenants(proto::Empty {}).await })
            .await?;
        Ok(r.tenants)
    }

    /// Every tenant's blocks, one call per tenant (the compactor's view).
    pub async fn all_blocks(&self) -> Result<Vec<BlockMeta>, MetastoreError> {
        let mut out = Vec::new();
        for t in self.tenants().await? {
            out.extend(self.blocks(&t, i64::MIN, i64::MAX).await?);
        }
        Ok(out)
    }

    /// Adds `add` and moves `remove` to pending deletion in one step. Fails
    /// with [`MetastoreError::Rejected`] (changing nothing) when a block of
    /// `remove` is not in the index; succeeds again when retried after it
    /// was applied.
    pub async fn replace_blocks(
        &self,
        tenant: &str,
        add: Vec<BlockMeta>,
        remove: Vec<String>,
    ) -> Result<(), MetastoreError> {
        let req = proto::ReplaceBlocksRequest {
            tenant: tenant.to_owned(),
            add: add.iter().map(proto::BlockMeta::from).collect(),
            remove,
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.replace_blocks(req).await }
        })
        .await?;
        Ok(())
    }

    /// Removed blocks whose files are to be deleted, with the removal time
    /// (unix ms, leader clock).
    pub async fn pending_deletions(&self) -> Result<Vec<(BlockMeta, i64)>, MetastoreError> {
        let r = self
            .call(|mut c| async move { c.pending_deletions(proto::Empty {}).await })
            .await?;
        r.blocks
            .into_iter()
            .map(|p| PendingDeletion::try_from(p).map(|p| (p.block, p.removed_at_ms)))
            .collect::<Result<_, _>>()
            .map_err(MetastoreError::InvalidReply)
    }

    /// Forgets pending deletions whose files are gone.
    pub async fn purge(&self, tenant: &str, ids: Vec<String>) -> Result<(), MetastoreError> {
        let req = proto::PurgeRequest {
            tenant: tenant.to_owned(),
            ids,
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.purge(req).await }
        })
        .await?;
        Ok(())
    }

    /// Takes or renews the lease on `job` for `ttl`: granted when free,
    /// expired, or already held by `owner`.
    pub async fn acquire_lease(
        &self,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, MetastoreError> {
        let req = proto::AcquireLeaseRequest {
            job: job.to_owned(),
            owner: owner.to_owned(),
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        };
        let r = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.acquire_lease(req).await }
            })
            .await?;
        Ok(r.granted)
    }

    /// Gives up the lease on `job` if `owner` holds it.
    pub async fn release_lease(&self, job: &str, owner: &str) -> Result<(), MetastoreError> {
        let req = proto::ReleaseLeaseRequest {
            job: job.to_owned(),
            owner: owner.to_owned(),
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.release_lease(req).await }
        })
        .await?;
        Ok(())
    }

    /// The leader's address, as some node of the group knows it.
    pub async fn leader(&self) -> Result<Option<String>, MetastoreError> {
        let r = self
            .call_any(
                |mut c| async move { c.leader(proto::Empty {}).await },
                false,
            )
            .await?;
        Ok(r.addr)
    }
}

/// A member's registration and heartbeats, running in the background.
pub struct Heartbeat {
    task: JoinHandle<()>,
    registered: tokio::sync::watch::Receiver<bool>,
}

impl Heartbeat {
    /// Completes once the member has been registered (at once if it is).
    pub fn registered(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut r = self.registered.clone();
        async move {
            let _ = r.wait_for(|r| *r).await;
        }
    }

    /// Stops heartbeating (the member leaves the live set one timeout
    /// later).
    pub fn abort(&self) {
        self.task.abort();
    }
}

/// Registers `member`, then heartbeats every `interval` forever,
/// re-registering whenever the metastore does not know the member. Errors
/// are logged and retried; [`Heartbeat::abort`] stops it.
pub fn spawn_heartbeat(client: MetastoreClient, member: Member, interval: Duration) -> Heartbeat {
    let (tx, registered) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let mut registered = false;
        loop {
            let res = if registered {
                client.heartbeat(&member.id).await
            } else {
                client.register(member.clone()).await
            };
            match res {
                Ok(()) => {
                    if !registered {
                        tracing::info!(member = %member.id, role = %member.role, "registered with the metastore");
                        tx.send_replace(true);
                    }
                    registered = true;
                }
                Err(MetastoreError::NotFound(_)) => {
                    registered = false;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(member = %member.id, error = %e, "metastore heartbeat failed");
                }
            }
            tokio::time::sleep(interval).await;
        }
    });
    Heartbeat { task, registered }
}

#[async_trait::async_trait]
impl BlockIndex for MetastoreClient {
    async fn add(&self, meta: BlockMeta) -> Result<(), IndexError> {
        Ok(self.add_block(meta).await?)
    }

    async fn blocks(
        &self,
        tenant: &str,
        start: i64,
        end: i64,
    ) -> Result<Vec<BlockMeta>, IndexError> {
        Ok(MetastoreClient::blocks(self, tenant, start, end).await?)
    }

    async fn all(&self) -> Result<Vec<BlockMeta>, IndexError> {
        Ok(self.all_blocks().await?)
    }

    /// Moves the blocks to pending deletion.
    async fn remove(&self, tenant: &str, ids: &[String]) -> Result<(), IndexError> {
        Ok(self
            .replace_blocks(tenant, Vec::new(), ids.to_vec())
            .await?)
    }
}
