//! The cluster roles, one per process: flags, wiring to the metastore, and
//! the one-port server every role shares with `fathom all`.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fathom_api::secret::ClusterSecret;
use fathom_metastore::{
    ClientOptions, Member, MetastoreClient, MetastoreConfig, MetastoreNode, Role,
};
use fathom_server::{
    DistributorConfig, IngesterConfig, MetastoreJobs, QuerierRoleConfig, ReadyGate, RingView,
};
use prometheus_client::registry::Registry;

use crate::{
    CacheArgs, HeadArgs, InflightArgs, LimitArgs, QueryArgs, StoreArgs, TenantsArgs, parse_duration,
};

/// The cluster secret, on every role.
#[derive(Args, Clone)]
pub(crate) struct SecretArgs {
    /// Secret shared by the cluster's members (16 to 1024 printable ASCII
    /// characters, e.g. `openssl rand -hex 32`). Every internal call
    /// carries it, and the internal services (an ingester's writes and
    /// head reads, the metastore's API and Raft) refuse calls without it
    /// with UNAUTHENTICATED. Prefer the environment variable or
    /// --cluster-secret-file: a flag's value shows in `ps`. Required when
    /// --listen is not a loopback address, unless --insecure-trusted-network.
    #[arg(
        long,
        env = "FATHOM_CLUSTER_SECRET",
        hide_env_values = true,
        conflicts_with = "cluster_secret_file"
    )]
    cluster_secret: Option<String>,
    /// A file holding the cluster secret (surrounding white space ignored),
    /// e.g. a mounted Kubernetes Secret.
    #[arg(long, env = "FATHOM_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// Run without a cluster secret on a non-loopback address: anyone who
    /// reaches this port can then call the internal services (write to an
    /// ingester, read its heads, change the metastore, join the ring). Only
    /// for a network that nothing but the cluster reaches.
    #[arg(long, env = "FATHOM_INSECURE_TRUSTED_NETWORK")]
    insecure_trusted_network: bool,
}

impl SecretArgs {
    /// The secret, or none where that is allowed: on a loopback `listen`
    /// or with --insecure-trusted-network.
    pub(crate) fn secret(&self, listen: SocketAddr) -> anyhow::Result<ClusterSecret> {
        if let Some(secret) = self.given()? {
            return Ok(secret);
        }
        if listen.ip().is_loopback() {
            tracing::info!(
                %listen,
                "no cluster secret: internal services answer any caller on this loopback address"
            );
        } else if self.insecure_trusted_network {
            tracing::warn!(
                %listen,
                "no cluster secret (--insecure-trusted-network): anyone who reaches this port \
                 can call the internal services"
            );
        } else {
            anyhow::bail!(
                "refusing to listen on {listen} without a cluster secret: anyone who reaches \
                 it could write to ingesters, read their heads and change the metastore. \
                 Give every role the same --cluster-secret (or FATHOM_CLUSTER_SECRET, or \
                 --cluster-secret-file; e.g. `openssl rand -hex 32`), listen on a loopback \
                 address, or pass --insecure-trusted-network if only the cluster can reach \
                 this network"
            );
        }
        Ok(ClusterSecret::none())
    }

    /// The secret the flags or the environment give, if any.
    pub(crate) fn given(&self) -> anyhow::Result<Option<ClusterSecret>> {
        let raw = match (&self.cluster_secret, &self.cluster_secret_file) {
            (Some(s), _) => s.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("reading the cluster secret file {}", path.display()))?,
            (None, None) => return Ok(None),
        };
        ClusterSecret::new(&raw)
            .context("--cluster-secret")
            .map(Some)
    }
}

/// What every role but the metastore has.
#[derive(Args, Clone)]
pub(crate) struct NodeArgs {
    /// Address for HTTP and gRPC (one port).
    #[arg(long, env = "FATHOM_LISTEN", default_value = "0.0.0.0:7400")]
    listen: SocketAddr,
    /// `host:port` the other roles reach this one at (default: --listen).
    #[arg(long, env = "FATHOM_ADVERTISE")]
    advertise: Option<String>,
    /// Metastore nodes, `host:port,host:port,…`.
    #[arg(long, env = "FATHOM_METASTORE", value_delimiter = ',', required = true)]
    metastore: Vec<String>,
    /// Unique, stable instance name (default: <role>-<advertise>).
    #[arg(long, env = "FATHOM_NAME")]
    name: Option<String>,
    /// How often this process heartbeats the metastore.
    #[arg(long, env = "FATHOM_HEARTBEAT_INTERVAL", default_value = "3s", value_parser = parse_duration)]
    heartbeat_interval: Duration,
    #[command(flatten)]
    secret: SecretArgs,
}

impl NodeArgs {
    fn advertise(&self) -> String {
        self.advertise.clone().unwrap_or_else(|| {
            if self.listen.ip().is_unspecified() {
                let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "127.0.0.1".into());
                format!("{host}:{}", self.listen.port())
            } else {
                self.listen.to_string()
            }
        })
    }

    fn name(&self, role: Role) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", role.as_str(), self.advertise()))
    }

    /// The cluster secret (checked once, at start).
    fn secret(&self) -> anyhow::Result<ClusterSecret> {
        self.secret.secret(self.listen)
    }

    fn client(&self, secret: &ClusterSecret) -> anyhow::Result<MetastoreClient> {
        MetastoreClient::with_options(
            self.metastore.clone(),
            ClientOptions {
                secret: secret.clone(),
                ..ClientOptions::default()
            },
        )
        .context("metastore addresses")
    }

    /// Serves `app` as `role` until `shutdown`, registered in the metastore
    /// and heartbeating meanwhile. Ready once registered and, with
    /// `wait.ring`, once the ring holds a quorum of ingesters.
    async fn serve(
        &self,
        client: &MetastoreClient,
        role: Role,
        registry: Registry,
        app: axum::Router,
        wait: Wait,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let hb = fathom_metastore::spawn_heartbeat(
            client.clone(),
            Member::new(self.name(role), role, self.advertise()),
            self.heartbeat_interval,
        );
        tracing::info!(name = %self.name(role), role = role.as_str(), "started");
        let ui = if role.as_str() == "querier" {
            "open it in a browser for the UI; "
        } else {
            ""
        };
        let about = format!(
            "{ui}{} of the cluster whose metastore is {}",
            role.as_str(),
            self.metastore.join(",")
        );
        let registered = hb.registered();
        let gate = match wait.ring {
            None => ReadyGate {
                what: "registered with the metastore".into(),
                until: Box::pin(registered),
            },
            Some((ring, n)) => ReadyGate {
                what: format!(
                    "registered with the metastore and {n} live ingesters are known (a quorum)"
                ),
                until: Box::pin(async move {
                    registered.await;
                    ring.wait_for(n).await;
                }),
            },
        };
        let r = fathom_server::serve(
            self.listen,
            registry,
            app,
            wait.ingester,
            Some(gate),
            &about,
            shutdown,
        )
        .await;
        hb.abort();
        // An ingester whose heads are all in blocks leaves the ring at
        // once: the distributors stop writing to it, and the queriers do
        // not count it as down (a killed one's heads may hold writes no
        // other ingester has, so reads count it as a missed replica).
        if role == Role::Ingester && matches!(r, Ok(fathom_server::Stopped::Flushed)) {
            let id = self.name(role);
            match tokio::time::timeout(Duration::from_secs(5), client.leave(&id)).await {
                Ok(Ok(())) => tracing::info!(member = %id, "left the ring: heads flushed"),
                Ok(Err(e)) => {
                    tracing::warn!(member = %id, error = %e, "leaving the ring failed: queriers count this ingester as down until it is back")
                }
                Err(_) => tracing::warn!(
                    member = %id,
                    "leaving the ring took over 5 s: queriers count this ingester as down until it is back"
                ),
            }
        }
        r.map(|_| ())
            .with_context(|| format!("serving the {}", role.as_str()))
    }

    /// The live ingesters, listed in the background about once a second.
    fn ring(&self, client: &MetastoreClient) -> Arc<RingView> {
        RingView::spawn(
            client.clone(),
            self.heartbeat_interval.min(Duration::from_secs(1)),
        )
    }
}

/// What a role waits for and hands over besides its routes.
#[derive(Default)]
struct Wait {
    /// The ingester to flush at shutdown, within the duration.
    ingester: Option<(Arc<fathom_ingester::Ingester>, Duration)>,
    /// Ready only once the ring holds this many ingesters.
    ring: Option<(Arc<RingView>, usize)>,
}

#[derive(Args)]
pub(crate) struct MetastoreArgs {
    /// Address for the Raft and client gRPC services (and /metrics).
    #[arg(long, env = "FATHOM_LISTEN", default_value = "0.0.0.0:9095")]
    listen: SocketAddr,
    /// `host:port` the other nodes and clients reach this one at.
    #[arg(long, env = "FATHOM_ADVERTISE")]
    advertise: Option<String>,
    /// Raft log, vote and snapshots.
    #[arg(long, env = "FATHOM_DATA_DIR", default_value = "./data/metastore")]
    data_dir: PathBuf,
    /// This node's id in --peers.
    #[arg(long, env = "FATHOM_NODE_ID", default_value_t = 1)]
    node_id: u64,
    /// Every node of the group: `1=host:port,2=host:port,3=host:port`
    /// (empty: a group of this node alone).
    #[arg(long, env = "FATHOM_PEERS", default_value = "")]
    peers: String,
    /// A member that has not heartbeated for this long leaves the ring.
    #[arg(long, env = "FATHOM_MEMBER_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    member_timeout: Duration,
    #[command(flatten)]
    secret: SecretArgs,
}

pub(crate) async fn metastore(
    a: MetastoreArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let secret = a.secret.secret(a.listen)?;
    let advertise = a.advertise.clone().unwrap_or_else(|| a.listen.to_string());
    let peers = if a.peers.trim().is_empty() {
        Vec::new()
    } else {
        MetastoreConfig::parse_peers(&a.peers).context("--peers")?
    };
    let cfg = MetastoreConfig {
        node_id: a.node_id,
        listen: a.listen,
        advertise,
        data_dir: a.data_dir.clone(),
        peers,
        heartbeat_timeout: a.member_timeout,
        serve: false,
        secret,
        ..Default::default()
    };
    let node = MetastoreNode::start(cfg)
        .await
        .context("starting the metastore node")?;
    let mut registry = Registry::default();
    node.register_metrics(&mut registry);
    let app = node.routes().into_axum_router();
    tracing::info!(node = node.node_id(), "metastore node started");
    let about = format!(
        "metastore node {}, Raft data in {}",
        node.node_id(),
        a.data_dir.display()
    );
    fathom_server::serve(a.listen, registry, app, None, None, &about, shutdown)
        .await
        .context("serving the metastore")?;
    node.shutdown().await;
    Ok(())
}

#[derive(Args)]
pub(crate) struct IngesterArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// The WAL lives here.
    #[arg(long, env = "FATHOM_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    head: HeadArgs,
    // An ingester uses the tenants file only for the per-tenant max_series.
    #[command(flatten)]
    tenants: TenantsArgs,
    /// How long a head cut waits for the blocks of the ingesters that come
    /// first for some of its series (the other replicas of those series):
    /// it stores what their blocks do not hold, and only that. 0 stores
    /// every head whole, as each replica did before.
    #[arg(long, env = "FATHOM_PEER_CUT_WAIT", default_value = "10s", value_parser = parse_duration)]
    peer_cut_wait: Duration,
}

pub(crate) async fn ingester(
    a: IngesterArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let secret = a.node.secret()?;
    let client = a.node.client(&secret)?;
    let store = a.store.config().build(&a.data_dir)?;
    let mut registry = Registry::default();
    let (app, ingester) = fathom_server::ingester_app(
        &IngesterConfig {
            name: a.node.name(Role::Ingester),
            data_dir: a.data_dir.clone(),
            flush_interval: a.head.flush_interval,
            max_head_bytes: a.head.max_head_size,
            max_head_memory: a.head.max_head_memory,
            secret,
            tenants: a.tenants.config(),
        },
        store,
        Arc::new(client.clone()),
        &mut registry,
    )?;
    ingester.set_peers(a.node.ring(&client), a.peer_cut_wait);
    // Joins the ring only now that the WAL is replayed (Ingester::open).
    a.node
        .serve(
            &client,
            Role::Ingester,
            registry,
            app,
            Wait {
                ingester: Some((ingester, a.head.shutdown_flush_timeout)),
                ring: None,
            },
            shutdown,
        )
        .await
}

#[derive(Args)]
pub(crate) struct DistributorArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Ingesters per series; writes need a majority of them.
    #[arg(long, env = "FATHOM_REPLICATION_FACTOR", default_value_t = 3)]
    replication_factor: usize,
    /// Time an ingester has to acknowledge a write.
    #[arg(long, env = "FATHOM_WRITE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    write_timeout: Duration,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    tenants: TenantsArgs,
    #[command(flatten)]
    inflight: InflightArgs,
}

pub(crate) async fn distributor(
    a: DistributorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let secret = a.node.secret()?;
    let client = a.node.client(&secret)?;
    let ring = a.node.ring(&client);
    let mut registry = Registry::default();
    let app = fathom_server::distributor_app(
        &DistributorConfig {
            limits: a.limits.limits(),
            replication_factor: a.replication_factor,
            write_timeout: a.write_timeout,
            tenants: a.tenants.config(),
            secret,
            inflight: a.inflight.config(),
        },
        ring.clone(),
        &mut registry,
    )?;
    let wait = Wait {
        ingester: None,
        ring: Some((ring, fathom_api::cluster::quorum(a.replication_factor))),
    };
    a.node
        .serve(&client, Role::Distributor, registry, app, wait, shutdown)
        .await
}

#[derive(Args)]
pub(crate) struct QuerierArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Cache and scratch space.
    #[arg(long, env = "FATHOM_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    /// The ingesters' replication factor (how many may be unreachable).
    #[arg(long, env = "FATHOM_REPLICATION_FACTOR", default_value_t = 3)]
    replication_factor: usize,
    /// Time an ingester has to answer a head read.
    #[arg(long, env = "FATHOM_HEAD_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    head_timeout: Duration,
    #[command(flatten)]
    query: QueryArgs,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    tenants: TenantsArgs,
    #[command(flatten)]
    symbols: crate::SymbolArgs,
}

pub(crate) async fn querier(
    a: QuerierArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let secret = a.node.secret()?;
    let client = a.node.client(&secret)?;
    let store = a.store.config().build(&a.data_dir)?;
    let mut registry = Registry::default();
    let ring = a.node.ring(&client);
    let app = fathom_server::querier_app(
        &QuerierRoleConfig {
            querier: a.query.config(),
            replication_factor: a.replication_factor,
            query_threads: a.query.query_threads,
            head_timeout: a.head_timeout,
            cache: a.cache.config(&a.data_dir),
            tenants: a.tenants.config(),
            secret,
            symbols: a.symbols.config(),
        },
        ring.clone(),
        Arc::new(client.clone()),
        store,
        &mut registry,
    )
    .await?;
    // Ready once a quorum of ingesters is known: any quorum holds every
    // acknowledged write, so the first query already sees them all.
    let wait = Wait {
        ingester: None,
        ring: Some((ring, fathom_api::cluster::quorum(a.replication_factor))),
    };
    a.node
        .serve(&client, Role::Querier, registry, app, wait, shutdown)
        .await
}

/// `tenant=duration,tenant=duration`.
fn parse_tenant_retention(s: &str) -> Result<HashMap<String, Duration>, String> {
    let mut out = HashMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (t, d) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not tenant=duration"))?;
        out.insert(t.trim().to_owned(), parse_duration(d.trim())?);
    }
    Ok(out)
}

/// How blocks are compacted, kept and deleted (compactor and `fathom all`).
#[derive(Args, Clone)]
pub(crate) struct CompactionArgs {
    /// Time between compaction rounds.
    #[arg(long, env = "FATHOM_COMPACTION_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    compaction_interval: Duration,
    /// Window of level-1 blocks (level 2: a day). While a window grows,
    /// its blocks are merged a few at a time; once closed and quiet for a
    /// twelfth of its length (5m for an hour, 2h for a day), into one.
    #[arg(long, env = "FATHOM_COMPACTION_WINDOW", default_value = "1h", value_parser = parse_duration)]
    compaction_window: Duration,
    /// How long a window's newest level-0 block waits before the window's
    /// level-0 blocks are merged (a cut's blocks, one per replica that
    /// stored a part, then merge in one job). 0 merges at once.
    #[arg(long, env = "FATHOM_COMPACTION_SETTLE", default_value = "5s", value_parser = parse_duration)]
    compaction_settle: Duration,
    /// Time replaced blocks' files stay before deletion.
    #[arg(long, env = "FATHOM_DELETE_DELAY", default_value = "15m", value_parser = parse_duration)]
    delete_delay: Duration,
    /// Retention for every tenant (unset: keep forever).
    #[arg(long, env = "FATHOM_RETENTION", value_parser = parse_duration)]
    retention: Option<Duration>,
    /// Per-tenant retention, `tenant=30d,other=7d`.
    #[arg(long, env = "FATHOM_TENANT_RETENTION", default_value = "", value_parser = parse_tenant_retention)]
    tenant_retention: HashMap<String, Duration>,
}

impl CompactionArgs {
    pub(crate) fn config(&self, name: String) -> fathom_compactor::Config {
        fathom_compactor::Config {
            name,
            windows: vec![self.compaction_window, Duration::from_secs(24 * 3600)],
            retention: self.retention,
            tenant_retention: self.tenant_retention.clone(),
            delete_delay: self.delete_delay,
            interval: self.compaction_interval,
            settle: self.compaction_settle,
            ..Default::default()
        }
    }
}

#[derive(Args)]
pub(crate) struct CompactorArgs {
    #[command(flatten)]
    node: NodeArgs,
    #[arg(long, env = "FATHOM_DATA_DIR", default_value = "./data")]
    data_dir: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    compaction: CompactionArgs,
    /// Per-tenant retention comes from its `retention` limits (the
    /// credentials are not used: the compactor serves no API).
    #[command(flatten)]
    tenants: TenantsArgs,
    /// Compacted blocks carry the functions of address-only frames whose
    /// debug info is known (local copies under <data dir>/debuginfo-cache).
    #[command(flatten)]
    symbols: crate::SymbolArgs,
}

pub(crate) async fn compactor(
    a: CompactorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let client = a.node.client(&a.node.secret()?)?;
    let store = a.store.config().build(&a.data_dir)?;
    let mut registry = Registry::default();
    let tenants = match &a.tenants.tenants_file {
        Some(p) => Some(
            fathom_server::Auth::load(p, a.tenants.tenants_reload_interval, &mut registry)?
                .tenants(),
        ),
        None => None,
    };
    let c = fathom_compactor::Compactor::new(
        fathom_server::compaction_config(
            &a.compaction.config(a.node.name(Role::Compactor)),
            tenants.as_ref(),
        ),
        store.clone(),
        Arc::new(MetastoreJobs(client.clone())),
        &mut registry,
    );
    fathom_server::symbolize_compactions(
        &a.symbols.config(),
        store,
        &a.data_dir,
        &c,
        &mut registry,
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(c.run(stop_rx));
    let r = a
        .node
        .serve(
            &client,
            Role::Compactor,
            registry,
            axum::Router::new(),
            Wait::default(),
            shutdown,
        )
        .await;
    let _ = stop_tx.send(true);
    let _ = task.await;
    r
}
