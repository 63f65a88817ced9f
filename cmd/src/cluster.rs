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
use fathom_metastore::{Member, MetastoreClient, MetastoreConfig, MetastoreNode, Role};
use fathom_server::{
    DistributorConfig, IngesterConfig, MetastoreIngesters, MetastoreJobs, QuerierRoleConfig,
};
use prometheus_client::registry::Registry;

use crate::{CacheArgs, HeadArgs, LimitArgs, QueryArgs, StoreArgs, parse_duration};

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

    fn client(&self) -> anyhow::Result<MetastoreClient> {
        MetastoreClient::new(self.metastore.clone()).context("metastore addresses")
    }

    /// Serves `app` as `role` until `shutdown`, registered in the metastore
    /// and heartbeating meanwhile.
    async fn serve(
        &self,
        client: &MetastoreClient,
        role: Role,
        registry: Registry,
        app: axum::Router,
        ingester: Option<(Arc<fathom_ingester::Ingester>, Duration)>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let hb = fathom_metastore::spawn_heartbeat(
            client.clone(),
            Member::new(self.name(role), role, self.advertise()),
            self.heartbeat_interval,
        );
        tracing::info!(name = %self.name(role), role = role.as_str(), "started");
        let (ingester, flush) = match ingester {
            Some((i, t)) => (Some(i), t),
            None => (None, Duration::ZERO),
        };
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
        let r = fathom_server::serve(
            self.listen,
            registry,
            app,
            ingester,
            flush,
            &about,
            shutdown,
        )
        .await;
        hb.abort();
        r.with_context(|| format!("serving the {}", role.as_str()))
    }
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
}

pub(crate) async fn metastore(
    a: MetastoreArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
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
    fathom_server::serve(
        a.listen,
        registry,
        app,
        None,
        Duration::ZERO,
        &about,
        shutdown,
    )
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
}

pub(crate) async fn ingester(
    a: IngesterArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let client = a.node.client()?;
    let store = a.store.config().build(&a.data_dir)?;
    let mut registry = Registry::default();
    let (app, ingester) = fathom_server::ingester_app(
        &IngesterConfig {
            name: a.node.name(Role::Ingester),
            data_dir: a.data_dir.clone(),
            flush_interval: a.head.flush_interval,
            max_head_bytes: a.head.max_head_size,
        },
        store,
        Arc::new(client.clone()),
        &mut registry,
    )?;
    // Joins the ring only now that the WAL is replayed (Ingester::open).
    a.node
        .serve(
            &client,
            Role::Ingester,
            registry,
            app,
            Some((ingester, a.head.shutdown_flush_timeout)),
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
}

pub(crate) async fn distributor(
    a: DistributorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let client = a.node.client()?;
    let mut registry = Registry::default();
    let app = fathom_server::distributor_app(
        &DistributorConfig {
            limits: a.limits.limits(),
            replication_factor: a.replication_factor,
            write_timeout: a.write_timeout,
        },
        Arc::new(MetastoreIngesters(client.clone())),
        &mut registry,
    );
    a.node
        .serve(&client, Role::Distributor, registry, app, None, shutdown)
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
}

pub(crate) async fn querier(
    a: QuerierArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let client = a.node.client()?;
    let store = a.store.config().build(&a.data_dir)?;
    let mut registry = Registry::default();
    let app = fathom_server::querier_app(
        &QuerierRoleConfig {
            querier: a.query.config(),
            replication_factor: a.replication_factor,
            query_threads: a.query.query_threads,
            head_timeout: a.head_timeout,
            cache: a.cache.config(&a.data_dir),
        },
        Arc::new(MetastoreIngesters(client.clone())),
        Arc::new(client.clone()),
        store,
        &mut registry,
    )
    .await?;
    a.node
        .serve(&client, Role::Querier, registry, app, None, shutdown)
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
    /// Window of level-1 blocks (level 2: a day).
    #[arg(long, env = "FATHOM_COMPACTION_WINDOW", default_value = "1h", value_parser = parse_duration)]
    compaction_window: Duration,
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
}

pub(crate) async fn compactor(
    a: CompactorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let client = a.node.client()?;
    let store = a.store.config().build(&a.data_dir)?;
    let mut registry = Registry::default();
    let c = fathom_compactor::Compactor::new(
        a.compaction.config(a.node.name(Role::Compactor)),
        store,
        Arc::new(MetastoreJobs(client.clone())),
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
            None,
            shutdown,
        )
        .await;
    let _ = stop_tx.send(true);
    let _ = task.await;
    r
}
