//! A metastore node: storage, Raft, the gRPC services and the background
//! tasks (bootstrap, metrics, leadership tracking).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, ServerState, SnapshotPolicy};
use parking_lot::{Mutex, RwLock};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;

use fathom_api::secret::{ClusterSecret, RequireSecret};
use tonic::service::interceptor::InterceptedService;

use crate::Error;
use crate::log_store::LogStore;
use crate::network::{MAX_RAFT_MESSAGE_BYTES, Network, RaftService};
use crate::proto::metastore_server::MetastoreServer;
use crate::proto::raft_server::RaftServer;
use crate::service::MetastoreService;
use crate::sm_store::{Applied, StateMachineStore};
use crate::types::{NodeId, Raft};

/// How to run one metastore node.
#[derive(Clone, Debug)]
pub struct MetastoreConfig {
    /// This node's id; must appear in `peers`. Ids are stable for the life
    /// of the data directory.
    pub node_id: u64,
    /// Where [`MetastoreNode::start`] serves the Raft and client gRPC
    /// services (when `serve` is true).
    pub listen: SocketAddr,
    /// `host:port` other nodes and clients reach this node at. When `peers`
    /// is empty, the group is this node alone at this address.
    pub advertise: String,
    /// Raft log, vote and snapshots live here.
    pub data_dir: PathBuf,
    /// Every node of the group, this one included: `(id, host:port)`.
    pub peers: Vec<(u64, String)>,
    /// A member whose last heartbeat is older than this is not live.
    pub heartbeat_timeout: Duration,
    /// Raft election timeout range: a follower that hears nothing from a
    /// leader for a random time in this range starts an election.
    pub election_timeout: (Duration, Duration),
    /// How often the Raft leader heartbeats followers; well below the
    /// election timeout.
    pub raft_heartbeat_interval: Duration,
    /// Build a snapshot (and allow purging the log) after this many entries.
    pub snapshot_every: u64,
    /// Serve the services on `listen`. When false, mount
    /// [`MetastoreNode::routes`] on the process's own gRPC server at
    /// `advertise`.
    pub serve: bool,
    /// Both services (client API and Raft) refuse calls without this
    /// secret, and this node's Raft calls to its peers carry it.
    pub secret: ClusterSecret,
}

impl Default for MetastoreConfig {
    fn default() -> Self {
        MetastoreConfig {
            node_id: 1,
            listen: SocketAddr::from(([0, 0, 0, 0], 9095)),
            advertise: "127.0.0.1:9095".into(),
            data_dir: PathBuf::from("data/metastore"),
            peers: Vec::new(),
            heartbeat_timeout: Duration::from_secs(15),
            election_timeout: (Duration::from_millis(1000), Duration::from_millis(2000)),
            raft_heartbeat_interval: Duration::from_millis(250),
            snapshot_every: 5000,
            serve: true,
            secret: ClusterSecret::none(),
        }
    }
}

impl MetastoreConfig {
    /// A one-node group (what `fathom all` runs).
    pub fn single(data_dir: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        MetastoreConfig {
            listen,
            advertise: listen.to_string(),
            data_dir: data_dir.into(),
            ..MetastoreConfig::default()
        }
    }

    /// Parses a peer list `id=host:port,id=host:port`.
    pub fn parse_peers(s: &str) -> Result<Vec<(u64, String)>, Error> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (id, addr) = p.split_once('=').ok_or_else(|| {
                    Error::Config(format!("peer {p:?} is not of the form id=host:port"))
                })?;
                let id = id.trim().parse::<u64>().map_err(|e| {
                    Error::Config(format!("peer {p:?}: id {id:?} is not a number: {e}"))
                })?;
                Ok((id, addr.trim().to_owned()))
            })
            .collect()
    }

    fn peer_map(&self) -> Result<BTreeMap<NodeId, BasicNode>, Error> {
        let peers = if self.peers.is_empty() {
            vec![(self.node_id, self.advertise.clone())]
        } else {
            self.peers.clone()
        };
        let mut map = BTreeMap::new();
        for (id, addr) in peers {
            if addr.is_empty() {
                return Err(Error::Config(format!("peer {id} has an empty address")));
            }
            if map.insert(id, BasicNode::new(addr)).is_some() {
                return Err(Error::Config(format!("peer id {id} appears twice")));
            }
        }
        if !map.contains_key(&self.node_id) {
            return Err(Error::Config(format!(
                "node id {} is not in the peer list ({})",
                self.node_id,
                map.keys()
                    .map(|k| k.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if !matches!(map.len(), 1 | 3 | 5) {
            tracing::warn!(
                nodes = map.len(),
                "metastore group size is not 1, 3 or 5; an even size tolerates no more failures than the odd size below it"
            );
        }
        let (min, max) = self.election_timeout;
        if min.is_zero() || min >= max || self.raft_heartbeat_interval >= min {
            return Err(Error::Config(format!(
                "need 0 < raft heartbeat interval ({:?}) < election timeout min ({min:?}) < max ({max:?})",
                self.raft_heartbeat_interval
            )));
        }
        if self.heartbeat_timeout.is_zero() {
            return Err(Error::Config("heartbeat timeout must be positive".into()));
        }
        Ok(map)
    }
}

/// Last heartbeats, kept on the leader only (see the crate documentation).
pub(crate) struct Liveness {
    timeout: Duration,
    inner: Mutex<LiveInner>,
}

#[derive(Default)]
struct LiveInner {
    /// The term in which this node last led; heartbeats of other terms are
    /// forgotten.
    term: Option<u64>,
    leader_since: Option<Instant>,
    last_seen: HashMap<String, Instant>,
}

impl Liveness {
    fn new(timeout: Duration) -> Self {
        Liveness {
            timeout,
            inner: Mutex::new(LiveInner::default()),
        }
    }

    /// Starts a new leadership view when `term` differs from the last one:
    /// every registered member counts as live for one timeout.
    fn sync(inner: &mut LiveInner, term: u64, now: Instant) {
        if inner.term != Some(term) {
            inner.term = Some(term);
            inner.leader_since = Some(now);
            inner.last_seen.clear();
        }
    }

    pub(crate) fn seen(&self, term: u64, id: &str, now: Instant) {
        let mut g = self.inner.lock();
        Self::sync(&mut g, term, now);
        g.last_seen.insert(id.to_owned(), now);
    }

    /// A liveness test as of `now`, for a leader in `term`.
    pub(crate) fn view(&self, term: u64, now: Instant) -> impl Fn(&str) -> bool + '_ {
        let (grace, seen) = {
            let mut g = self.inner.lock();
            Self::sync(&mut g, term, now);
            let grace = g
                .leader_since
                .is_some_and(|s| now.duration_since(s) < self.timeout);
            (grace, g.last_seen.clone())
        };
        move |id: &str| {
            grace
                || seen
                    .get(id)
                    .is_some_and(|t| now.duration_since(*t) < self.timeout)
        }
    }

    fn forget(&self) {
        *self.inner.lock() = LiveInner::default();
    }
}

#[derive(Clone, Default)]
struct Metrics {
    term: Gauge,
    is_leader: Gauge,
    leader_changes: Counter,
    last_log_index: Gauge,
    applied_index: Gauge,
    members_registered: Gauge,
    members_live: Gauge,
    blocks: Gauge,
    pending_deletions: Gauge,
    leases: Gauge,
}

/// What the services and background tasks share.
pub(crate) struct NodeInner {
    pub(crate) id: NodeId,
    pub(crate) raft: Raft,
    pub(crate) applied: Arc<RwLock<Applied>>,
    pub(crate) live: Liveness,
    /// How long a read may wait for the leader to confirm its leadership.
    pub(crate) read_timeout: Duration,
    metrics: Metrics,
}

impl NodeInner {
    pub(crate) fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    pub(crate) fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    pub(crate) fn leader(&self) -> Option<(u64, String)> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let id = m.current_leader?;
        let node = m.membership_config.membership().get_node(&id)?;
        Some((id, node.addr.clone()))
    }
}

/// A running metastore node; see the crate documentation.
pub struct MetastoreNode {
    addr: String,
    inner: Arc<NodeInner>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    server: Option<JoinHandle<()>>,
    stopped: bool,
    secret: ClusterSecret,
}

/// The server's connections, with TCP_NODELAY: without it an answer's
/// last small frame (the gRPC trailers) waited for the client's delayed
/// ACK, 40 ms on many metastore calls (every query plans with one).
fn incoming(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

impl MetastoreNode {
    /// Opens the data directory, starts Raft and (when `cfg.serve`) the
    /// gRPC server on `cfg.listen`. On a first start, the lowest id of the
    /// peer list initializes the group once it has seen no existing leader.
    pub async fn start(mut cfg: MetastoreConfig) -> Result<MetastoreNode, Error> {
        let listener = if cfg.serve {
            let l = tokio::net::TcpListener::bind(cfg.listen)
                .await
                .map_err(|source| Error::Bind {
                    addr: cfg.listen,
                    source,
                })?;
            // A lone node on an ephemeral port (`fathom all`'s in-process
            // metastore) advertises the port it got.
            if cfg.peers.is_empty() && cfg.listen.port() == 0 {
                let local = l.local_addr().map_err(|source| Error::Bind {
                    addr: cfg.listen,
                    source,
                })?;
                cfg.listen = local;
                cfg.advertise = local.to_string();
            }
            Some(l)
        } else {
            None
        };
        let peers = cfg.peer_map()?;
        let io = |path: &std::path::Path| {
            let path = path.to_owned();
            move |source| Error::Io { path, source }
        };
        let snap_dir = cfg.data_dir.join("snapshot");
        std::fs::create_dir_all(&snap_dir).map_err(io(&snap_dir))?;
        let log_path = cfg.data_dir.join("raft.log");
        let (log, report) = LogStore::open(&log_path).map_err(io(&log_path))?;
        let sm = StateMachineStore::open(&snap_dir)?;
        let applied = sm.applied();
        tracing::info!(
            node_id = cfg.node_id,
            data_dir = %cfg.data_dir.display(),
            log_records = report.records,
            truncated_bytes = report.truncated_bytes,
            snapshot_index = ?applied.read().last_applied.map(|l| l.index),
            "opened metastore storage"
        );

        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        let raft_cfg = openraft::Config {
            cluster_name: "fathom-metastore".into(),
            heartbeat_interval: ms(cfg.raft_heartbeat_interval),
            election_timeout_min: ms(cfg.election_timeout.0),
            election_timeout_max: ms(cfg.election_timeout.1),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_every.max(1)),
            max_in_snapshot_log_to_keep: cfg.snapshot_every.clamp(1, 1000),
            install_snapshot_timeout: 10_000,
            ..Default::default()
        }
        .validate()?;
        let raft = Raft::new(
            cfg.node_id,
            Arc::new(raft_cfg),
            Network {
                id: cfg.node_id,
                secret: cfg.secret.clone(),
            },
            log,
            sm,
        )
        .await?;

        let inner = Arc::new(NodeInner {
            id: cfg.node_id,
            raft,
            applied,
            live: Liveness::new(cfg.heartbeat_timeout),
            read_timeout: cfg.election_timeout.1 * 2,
            metrics: Metrics::default(),
        });
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut node = MetastoreNode {
            addr: cfg.advertise.clone(),
            inner: inner.clone(),
            stop,
            tasks: Vec::new(),
            server: None,
            stopped: false,
            secret: cfg.secret.clone(),
        };
        if let Some(listener) = listener {
            let routes = node.routes();
            let mut stop_rx = stop_rx.clone();
            let listen = cfg.listen;
            node.server = Some(tokio::spawn(async move {
                let incoming = incoming(listener);
                let res = tonic::transport::Server::builder()
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = stop_rx.wait_for(|s| *s).await;
                    })
                    .await;
                if let Err(e) = res {
                    tracing::error!(%listen, error = %e, "metastore grpc server failed");
                }
            }));
        }
        node.tasks.push(tokio::spawn(bootstrap(
            inner.clone(),
            peers,
            cfg.election_timeout.1 * 2,
            stop_rx.clone(),
        )));
        node.tasks
            .push(tokio::spawn(watch_metrics(inner.clone(), stop_rx)));
        Ok(node)
    }

    /// The Raft and client gRPC services, to mount next to other services
    /// on one port (when `serve` is false). Both refuse calls without the
    /// cluster secret ([`MetastoreConfig::secret`]).
    pub fn routes(&self) -> tonic::service::Routes {
        let check = RequireSecret(self.secret.clone());
        tonic::service::Routes::new(InterceptedService::new(
            RaftServer::new(RaftService {
                raft: self.inner.raft.clone(),
            })
            .max_decoding_message_size(MAX_RAFT_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RAFT_MESSAGE_BYTES),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            MetastoreServer::new(MetastoreService {
                inner: self.inner.clone(),
            }),
            check,
        ))
    }

    pub fn node_id(&self) -> u64 {
        self.inner.id
    }

    /// The address this node advertises (with `serve` and port 0 for a
    /// lone node: the port it bound).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether this node is the leader now (as far as it knows).
    pub fn is_leader(&self) -> bool {
        self.inner.is_leader()
    }

    /// The current leader's id and address, when one is known.
    pub fn leader(&self) -> Option<(u64, String)> {
        self.inner.leader()
    }

    /// Raft term, for tests and diagnostics.
    pub fn term(&self) -> u64 {
        self.inner.term()
    }

    /// Index of the last entry applied to this node's state machine.
    pub fn applied_index(&self) -> Option<u64> {
        self.inner.applied.read().last_applied.map(|l| l.index)
    }

    /// Every block in this node's state machine (which may lag the
    /// leader's), for tests and diagnostics. Clients use
    /// [`crate::MetastoreClient`].
    pub fn local_blocks(&self) -> Vec<fathom_block::BlockMeta> {
        self.inner.applied.read().state.all_blocks()
    }

    /// Registers the node's metrics under `fathom_metastore_*`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        let m = &self.inner.metrics;
        let r = registry.sub_registry_with_prefix("fathom_metastore");
        r.register("raft_term", "Current Raft term", m.term.clone());
        r.register(
            "is_leader",
            "1 when this node is the Raft leader",
            m.is_leader.clone(),
        );
        r.register(
            "leader_changes",
            "Times this node saw a different leader",
            m.leader_changes.clone(),
        );
        r.register(
            "last_log_index",
            "Index of the last entry in this node's Raft log",
            m.last_log_index.clone(),
        );
        r.register(
            "applied_index",
            "Index of the last entry applied to this node's state machine",
            m.applied_index.clone(),
        );
        r.register(
            "members_registered",
            "Registered members of every role",
            m.members_registered.clone(),
        );
        r.register(
            "members_live",
            "Members with a recent heartbeat (known on the leader only; 0 on followers)",
            m.members_live.clone(),
        );
        r.register("blocks", "Blocks in the index", m.blocks.clone());
        r.register(
            "pending_deletions",
            "Removed blocks whose files await deletion",
            m.pending_deletions.clone(),
        );
        r.register("leases", "Compaction job leases held", m.leases.clone());
    }

    /// Stops serving, stops Raft and waits for the background tasks.
    pub async fn shutdown(mut self) {
        self.stopped = true;
        let _ = self.stop.send(true);
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "metastore raft did not shut down cleanly");
        }
        if let Some(server) = self.server.take() {
            let abort = server.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), server)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        self.inner.live.forget();
        tracing::info!(node_id = self.inner.id, "metastore node stopped");
    }
}

impl Drop for MetastoreNode {
    /// Dropping without [`MetastoreNode::shutdown`] still stops Raft (in
    /// the background) so that no orphaned node keeps voting.
    fn drop(&mut self) {
        if !self.stopped
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let raft = self.inner.raft.clone();
            rt.spawn(async move {
                let _ = raft.shutdown().await;
            });
        }
        let _ = self.stop.send(true);
        for t in &self.tasks {
            t.abort();
        }
        if let Some(s) = &self.server {
            s.abort();
        }
    }
}

/// On a first start, the lowest node id creates the group, but only after
/// waiting long enough for an existing leader to reach it (so a node whose
/// data directory was lost rejoins instead of forking a new group).
async fn bootstrap(
    inner: Arc<NodeInner>,
    peers: BTreeMap<NodeId, BasicNode>,
    wait: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    if peers.keys().next() != Some(&inner.id) {
        return;
    }
    match inner.raft.is_initialized().await {
        Ok(false) => {}
        _ => return,
    }
    if peers.len() > 1 {
        let waiter = inner.raft.wait(Some(wait));
        tokio::select! {
            _ = waiter.metrics(
                |m| m.current_leader.is_some() || m.last_log_index.is_some(),
                "existing leader",
            ) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        if !matches!(inner.raft.is_initialized().await, Ok(false)) {
            return;
        }
    }
    let n = peers.len();
    match inner.raft.initialize(peers).await {
        Ok(()) => tracing::info!(node_id = inner.id, nodes = n, "initialized metastore group"),
        Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
            tracing::debug!(error = %e, "metastore group already initialized")
        }
        Err(e) => tracing::error!(error = %e, "initializing the metastore group failed"),
    }
}

async fn watch_metrics(inner: Arc<NodeInner>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut rx = inner.raft.metrics();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_leader = None;
    let m = inner.metrics.clone();
    loop {
        tokio::select! {
            r = rx.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let (leader, term, last_log, applied, is_leader) = {
            let rm = rx.borrow_and_update();
            (
                rm.current_leader,
                rm.current_term,
                rm.last_log_index,
                rm.last_applied.map(|l| l.index),
                rm.state == ServerState::Leader,
            )
        };
        if leader.is_some() && leader != last_leader {
            m.leader_changes.inc();
            tracing::info!(node_id = inner.id, leader = ?leader, term, "metastore leader changed");
        }
        last_leader = leader;
        let gauge = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        gauge(&m.term, term);
        gauge(&m.is_leader, u64::from(is_leader));
        gauge(&m.last_log_index, last_log.unwrap_or(0));
        gauge(&m.applied_index, applied.unwrap_or(0));
        let now = Instant::now();
        let live = is_leader.then(|| inner.live.view(term, now));
        let a = inner.applied.read();
        let s = &a.state;
        gauge(&m.members_registered, s.members.len() as u64);
        let n_live = live.map_or(0, |f| s.members.keys().filter(|id| f(id)).count());
        gauge(&m.members_live, n_live as u64);
        gauge(&m.blocks, s.block_count() as u64);
        gauge(&m.pending_deletions, s.pending_count() as u64);
        gauge(&m.leases, s.leases.len() as u64);
    }
}

#[cfg(test)]
mod incoming_tests {
    use tokio_stream::StreamExt;

    /// Accepted connections send small frames at once (the trailers of an
    /// answer do not wait for the client's ACK).
    #[tokio::test]
    async fn accepted_connections_do_not_wait_for_acks() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let mut incoming = super::incoming(l);
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accepted = incoming.next().await.unwrap().unwrap();
        assert!(accepted.nodelay().unwrap());
    }
}
