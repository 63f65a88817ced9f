//! Wires Fathom's roles into a process. `fathom all` runs the distributor,
//! the ingester, the querier, a one-node metastore and the compactor here,
//! connected through the same traits they use across the network in a
//! cluster ([`IngesterWriter`] for writes, `fathom_querier::HeadSource` for recent data,
//! [`BlockIndex`] for blocks): single-process mode is the same code, wired
//! locally, with replication factor 1.
//!
//! ```text
//!            one port (HTTP/1.1 + h2c): /ingest, /api/v1/*, gRPC Push, Arrow Flight (SQL), /metrics, /ready
//!                 │                         │
//!            distributor ── LocalWriter ──► ingester ── blocks ──► object store ◄── compactor
//!                                             ▲    │ register            ▲              │ jobs, leases
//!            querier ──── HeadSource ─────────┘    ▼                     │              ▼
//!               └──── blocks ──────────────► one-node metastore (Raft, own loopback port)
//!               └──── block files through the foyer cache ───────────────┘
//! ```
//!
//! With a tenants file, one layer ([`auth`]) in front of the roles' routes
//! authenticates every request (HTTP, Connect, gRPC, Flight alike) and
//! fixes its tenant; `/ready`, `/health` and `/metrics` stay outside it.
//!
//! Start-up: open the object store, start the metastore (an empty one is
//! filled from one bucket listing: data directories from before the
//! metastore), replay the WAL, bind, then report ready. Shutdown
//! (SIGTERM/SIGINT): stop accepting, drain requests, flush the heads to
//! blocks (bounded in time; what does not make it stays in the WAL) and
//! register them — the metastore listens on its own loopback port so that
//! it outlives the public one — then stop the compactor and the metastore.

pub mod auth;
mod cluster;
mod explain;
mod roles;
mod store;
mod symbols;
pub mod telemetry;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use fathom_block::BlockIndex;
use fathom_distributor::{Distributor, IngesterWriter, OtlpProfilesServer, PushServer, WriteError};
use fathom_ingester::Ingester;
use fathom_metastore::{MetastoreClient, MetastoreConfig, MetastoreNode};
use fathom_model::{IngestBatch, TenantId};
use fathom_querier::{CachedStore, Executor, Querier, QueryError};
use prometheus_client::registry::Registry;

pub use auth::Auth;
pub use cluster::{MetastoreJobs, RingView};
pub use roles::{
    DistributorConfig, IngesterConfig, QuerierRoleConfig, distributor_app, ingester_app,
    querier_app,
};
pub use store::{ObjectStoreConfig, StoreKind};
pub use symbols::{SymbolsConfig, symbolize_compactions};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("object store: {0}")]
    Store(#[source] object_store::Error),
    #[error("--s3-bucket is required with --object-store s3")]
    S3Bucket,
    #[error("listing blocks at start-up: {0}")]
    Blocks(#[from] fathom_block::Error),
    #[error("opening the ingester: {0}")]
    Ingester(#[from] fathom_ingester::Error),
    #[error(transparent)]
    Cache(#[from] fathom_querier::CacheError),
    #[error("metastore: {0}")]
    Metastore(#[source] fathom_metastore::Error),
    #[error("metastore: {0}")]
    MetastoreClient(#[source] fathom_metastore::MetastoreError),
    #[error("starting the querier: {0}")]
    Querier(#[from] QueryError),
    #[error("tenants file {0}")]
    Tenants(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// Everything `fathom all` needs.
#[derive(Clone, Debug)]
pub struct AllConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub store: ObjectStoreConfig,
    pub flush_interval: Duration,
    pub max_head_bytes: usize,
    /// Writes are refused (retryable 503) while the heads hold this much.
    pub max_head_memory: usize,
    pub shutdown_flush_timeout: Duration,
    pub limits: Limits,
    /// Write requests worked on at once.
    pub inflight: InflightConfig,
    pub querier: fathom_querier::Config,
    pub query_threads: usize,
    pub compaction: fathom_compactor::Config,
    pub cache: fathom_querier::CacheConfig,
    pub symbols: SymbolsConfig,
    pub tenants: TenantsFileConfig,
}

/// The tenants file (credentials and per-tenant limits), if any.
#[derive(Clone, Debug, Default)]
pub struct TenantsFileConfig {
    /// `None`: authentication off, every client may use every tenant.
    pub path: Option<PathBuf>,
    /// How often the file is checked for changes.
    pub reload_interval: Duration,
}

impl TenantsFileConfig {
    /// Loads the file (and starts reloading it), or says at start that
    /// authentication is off.
    pub fn load(&self, registry: &mut Registry) -> Result<Option<Auth>, Error> {
        match &self.path {
            Some(p) => {
                let a = Auth::load(p, self.reload_interval, registry)?;
                tracing::info!(
                    "authentication on: every API but /ready, /health and /metrics needs a \
                     credential of the tenants file"
                );
                Ok(Some(a))
            }
            None => {
                tracing::warn!(
                    "authentication off (no --tenants-file): every client may read and write \
                     every tenant; fine on a laptop or behind a trusted proxy"
                );
                Ok(None)
            }
        }
    }
}

/// `c`, with the tenants file's retention (if any) consulted first.
pub fn compaction_config(
    c: &fathom_compactor::Config,
    tenants: Option<&fathom_api::auth::Tenants>,
) -> fathom_compactor::Config {
    let mut c = c.clone();
    if let Some(t) = tenants {
        let t = t.clone();
        c.retention_overrides = Some(fathom_compactor::RetentionOverrides(Arc::new(
            move |name: &str| {
                TenantId::new(name)
                    .ok()
                    .and_then(|id| t.limits(&id).retention)
            },
        )));
    }
    c
}

/// `app` behind `auth`, if any.
pub fn authenticated(app: axum::Router, auth: Option<&Auth>) -> axum::Router {
    match auth {
        Some(a) => a.layer(app),
        None => app,
    }
}

/// The in-process ingester as the distributor's write target.
struct LocalWriter(Arc<Ingester>);

#[async_trait::async_trait]
impl IngesterWriter for LocalWriter {
    async fn write(&self, batch: IngestBatch) -> Result<(), WriteError> {
        self.0.write(batch).await.map(|_| ()).map_err(|e| match e {
            fathom_ingester::Error::SeriesLimit { .. } => WriteError::Limit {
                limit: "max_series",
                source: Box::new(e),
            },
            fathom_ingester::Error::LeftOut { .. } => WriteError::LeftOut {
                source: Box::new(e),
            },
            e => WriteError::Ingester(Box::new(e)),
        })
    }

    fn held_stacks(&self, tenant: &TenantId) -> Option<Arc<dyn fathom_model::HeldStacks>> {
        self.0.held_stacks(tenant)
    }
}

struct Shared {
    ready: AtomicBool,
    registry: Registry,
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &s.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn ready(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn not_found(uri: axum::http::Uri) -> fathom_api::ApiError {
    fathom_api::ApiError::NotFound(format!("no route for {}", uri.path()))
}

/// Runs distributor, ingester, querier, a one-node metastore and the
/// compactor in this process until `shutdown` resolves, then flushes the
/// heads.
pub async fn run_all(
    cfg: AllConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let store = cfg.store.build(&cfg.data_dir)?;
    let mut registry = Registry::default();
    let auth = cfg.tenants.load(&mut registry)?;
    let tenants = auth.as_ref().map(Auth::tenants);
    // The metastore listens on its own loopback port so that it outlives
    // the public one: the shutdown flush still registers its blocks.
    // Only this process calls it: a random secret keeps other local users
    // out of it.
    let secret = fathom_api::secret::ClusterSecret::random();
    let meta = MetastoreNode::start(MetastoreConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        secret: secret.clone(),
        data_dir: cfg.data_dir.join("metastore"),
        election_timeout: (Duration::from_millis(150), Duration::from_millis(300)),
        raft_heartbeat_interval: Duration::from_millis(50),
        ..MetastoreConfig::default()
    })
    .await
    .map_err(Error::Metastore)?;
    meta.register_metrics(&mut registry);
    let client = MetastoreClient::with_options(
        [meta.addr()],
        fathom_metastore::ClientOptions {
            secret,
            ..Default::default()
        },
    )
    .map_err(Error::MetastoreClient)?;
    let imported = import_blocks(&client, store.as_ref()).await?;
    tracing::info!(
        imported,
        metastore = %cfg.data_dir.join("metastore").display(),
        store = %cfg.store.describe(&cfg.data_dir),
        "one-node metastore ready"
    );
    let index: Arc<dyn BlockIndex> = Arc::new(client.clone());
    let ingester = Ingester::open(
        fathom_ingester::Config {
            data_dir: cfg.data_dir.clone(),
            name: format!("all@{}", cfg.listen),
            flush_interval: cfg.flush_interval,
            max_head_bytes: cfg.max_head_bytes,
            max_head_memory: cfg.max_head_memory,
        },
        store.clone(),
        index.clone(),
        &mut registry,
    )?;
    if let Some(t) = tenants.clone() {
        ingester.set_series_limit(Arc::new(move |id| t.limits(id).max_series));
    }
    let exec = Executor::new(cfg.query_threads).map_err(|source| Error::Io {
        what: "starting the query runtime".into(),
        source,
    })?;
    let querier = Querier::new(
        cfg.querier.clone(),
        ingester.clone(),
        index.clone(),
        CachedStore::wrap(store.clone(), &cfg.cache, &mut registry).await?,
        exec,
        &mut registry,
    )?;
    let inflight =
        fathom_distributor::Inflight::new(&cfg.inflight, cfg.limits.max_body_bytes, &mut registry);
    let distributor = Distributor::new(
        cfg.limits.clone(),
        Arc::new(LocalWriter(ingester.clone())),
        &mut registry,
    )
    .with_tenants(tenants.clone());
    let compactor = fathom_compactor::Compactor::new(
        compaction_config(&cfg.compaction, tenants.as_ref()),
        store.clone(),
        Arc::new(MetastoreJobs(client)),
        &mut registry,
    );
    let symbols = symbols::app(
        &cfg.symbols,
        store.clone(),
        &cfg.data_dir,
        &querier,
        Some(&compactor),
        &mut registry,
    );
    let (stop_compactor, stop_rx) = tokio::sync::watch::channel(false);
    let compacting = tokio::spawn(compactor.run(stop_rx));
    // The write routes behind the in-flight bound; Flight (added after
    // the layer) is not.
    let mut routes = tonic::service::Routes::new(PushServer::new(distributor.clone()))
        .add_service(OtlpProfilesServer::new(distributor.clone()));
    let writes =
        std::mem::take(routes.axum_router_mut()).merge(fathom_distributor::router(distributor));
    *routes.axum_router_mut() = inflight.layer(writes);
    let grpc = routes
        .add_service(fathom_query_api::flight_service(querier.clone()))
        .into_axum_router();
    let app = axum::Router::new()
        .merge(grpc)
        .merge(fathom_query_api::router(querier))
        .merge(symbols)
        .merge(fathom_ui::router());
    let app = authenticated(app, auth.as_ref());
    let about = format!(
        "open it in a browser for the UI; data in {} (blocks in {}); {}",
        cfg.data_dir.display(),
        cfg.store.describe(&cfg.data_dir),
        if auth.is_some() {
            "authentication on: clients need a credential of the tenants file"
        } else {
            "authentication off: every client may read and write every tenant \
             (for a laptop, or behind a trusted proxy)"
        }
    );
    let served = serve(
        cfg.listen,
        registry,
        app,
        Some((ingester, cfg.shutdown_flush_timeout)),
        None,
        &about,
        shutdown,
    )
    .await;
    let _ = stop_compactor.send(true);
    let _ = compacting.await;
    meta.shutdown().await;
    served.map(|_| ())
}

/// The URL a person on this machine opens for `local`: `localhost` for a
/// wildcard or loopback address.
fn http_url(local: SocketAddr) -> String {
    if local.ip().is_unspecified() || local.ip().is_loopback() {
        format!("http://localhost:{}", local.port())
    } else {
        format!("http://{local}")
    }
}

/// Fills an empty metastore from the bucket once: a data directory from
/// before the metastore, or a metastore directory that was lost. Afterwards
/// the bucket is never listed.
async fn import_blocks(
    client: &MetastoreClient,
    store: &dyn object_store::ObjectStore,
) -> Result<usize, Error> {
    let m = Error::MetastoreClient;
    if !client.tenants().await.map_err(m)?.is_empty()
        || !client.pending_deletions().await.map_err(m)?.is_empty()
    {
        return Ok(0);
    }
    let blocks = fathom_block::list_blocks(store).await?;
    for b in &blocks {
        client.add_block(b.clone()).await.map_err(m)?;
    }
    if !blocks.is_empty() {
        tracing::info!(
            blocks = blocks.len(),
            "imported the bucket's blocks into the metastore"
        );
    }
    Ok(blocks.len())
}

/// What a process waits for, once bound, before it reports ready (for
/// example its registration in the metastore, or a quorum of ingesters in
/// a distributor's ring).
pub struct ReadyGate {
    /// For the log: "not ready until {what}".
    pub what: String,
    pub until: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

/// How a process stopped serving.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Nothing of it is only in its WAL: it has no ingester, or its
    /// ingester's heads were flushed to blocks.
    Flushed,
    /// Its ingester's flush at shutdown failed or ran out of time: the
    /// WAL keeps what the blocks do not, for its next start.
    WalKept,
}

/// One process's port: the roles' routes plus `/ready`, `/health`,
/// `/metrics`; ready once bound (and, with an ingester, its WAL replayed)
/// and `ready_when` has completed; on shutdown, drains requests and
/// flushes the ingester's heads (within the duration given with it). The ready
/// line gives the URL to open and `about` (what a person needs to know next:
/// where the data is, whether clients must authenticate).
pub async fn serve(
    listen: SocketAddr,
    registry: Registry,
    app: axum::Router,
    ingester: Option<(Arc<Ingester>, Duration)>,
    ready_when: Option<ReadyGate>,
    about: &str,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Stopped, Error> {
    let shared = Arc::new(Shared {
        ready: AtomicBool::new(false),
        registry,
    });
    let app = axum::Router::new()
        .route("/ready", get(ready))
        .route("/health", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .with_state(shared.clone())
        .merge(app)
        .fallback(not_found);
    // Around the whole router, so that it sees what routing adds (the
    // `Allow` header of a 405).
    let app = axum::Router::new().fallback_service(tower::Layer::layer(
        &axum::middleware::from_fn(explain::json_errors),
        app,
    ));
    let app = app.layer(axum::middleware::from_fn(telemetry::trace_request));
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| Error::Io {
            what: format!("binding {listen}"),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| Error::Io {
        what: "reading the bound address".into(),
        source,
    })?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let flusher = ingester
        .clone()
        .map(|(i, _)| tokio::spawn(i.run_flush_loop(stop_rx)));
    let announce = format!(
        "fathom is ready at {} (HTTP, gRPC and Flight SQL on this port); {about}",
        http_url(local)
    );
    let gate = match ready_when {
        None => {
            shared.ready.store(true, Ordering::Release);
            tracing::info!(listen = %local, "{announce}");
            None
        }
        Some(gate) => {
            tracing::info!(listen = %local, "listening; not ready until {}", gate.what);
            let shared = shared.clone();
            Some(tokio::spawn(async move {
                gate.until.await;
                shared.ready.store(true, Ordering::Release);
                tracing::info!(listen = %local, "{announce}");
            }))
        }
    };
    axum::serve(explain::Listener(listener), app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| Error::Io {
            what: "serving".into(),
            source,
        })?;
    if let Some(g) = gate {
        g.abort();
    }
    shared.ready.store(false, Ordering::Release);
    let _ = stop_tx.send(true);
    if let Some(f) = flusher {
        let _ = f.await;
    }
    let mut stopped = Stopped::Flushed;
    if let Some((ingester, shutdown_flush_timeout)) = ingester {
        tracing::info!("flushing heads before exit");
        let deadline = std::time::Instant::now() + shutdown_flush_timeout;
        match ingester.flush(Some(deadline)).await {
            Ok(blocks) => tracing::info!(blocks = blocks.len(), "flushed heads; bye"),
            Err(e) => {
                stopped = Stopped::WalKept;
                tracing::error!(error = %e, "flush at shutdown failed; the WAL keeps the data")
            }
        }
        ingester.close().await;
    }
    Ok(stopped)
}

pub use fathom_distributor::{InflightConfig, Limits};
pub use fathom_querier::{CacheConfig, Config as QuerierConfig, SqlConfig};

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_distributor::{FoldedParams, Format, Payload, decode_payloads};

    /// The in-process ingester's refusals reach the distributor as its own
    /// errors, kept as the `WriteError`'s source: a tenant's series limit
    /// is a `Limit` (429 through the one mapping) whose source is the
    /// ingester's `SeriesLimit`, and the message is the ingester's.
    #[tokio::test]
    async fn the_local_writer_keeps_the_ingesters_error() {
        let dir = tempfile::tempdir().unwrap();
        let ingester = Ingester::open(
            fathom_ingester::Config {
                data_dir: dir.path().to_owned(),
                name: "test".into(),
                flush_interval: Duration::from_secs(3600),
                max_head_bytes: 1 << 30,
                max_head_memory: 1 << 30,
            },
            Arc::new(object_store::memory::InMemory::new()),
            Arc::new(fathom_block::MemoryIndex::default()),
            &mut Registry::default(),
        )
        .unwrap();
        ingester.set_series_limit(Arc::new(|_| Some(1)));
        let tenant = TenantId::new("t1").unwrap();
        let batch = |service: &str| {
            let mut p = Payload::new(
                Format::Folded(FoldedParams::default()),
                "main;work 10\n".into(),
            );
            p.labels = fathom_model::Labels::from_pairs([("service_name", service)]).unwrap();
            p.name_hint = Some("cpu".into());
            let (profiles, symbols) =
                decode_payloads(&tenant, vec![p], &fathom_distributor::Limits::default()).unwrap();
            IngestBatch {
                tenant: tenant.clone(),
                profiles,
                symbols,
            }
        };
        let w = LocalWriter(ingester);
        w.write(batch("a"))
            .await
            .expect("the first series is within the limit");
        let e = w.write(batch("b")).await.unwrap_err();
        let WriteError::Limit { limit, source } = &e else {
            panic!("a tenant's limit: {e:?}")
        };
        assert_eq!(*limit, "max_series");
        assert!(
            matches!(
                source.downcast_ref::<fathom_ingester::Error>(),
                Some(fathom_ingester::Error::SeriesLimit {
                    limit: 1,
                    series: 1,
                    ..
                })
            ),
            "{source:?}"
        );
        let api = fathom_api::ApiError::from(e);
        assert_eq!(api.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            api.to_string().contains("at its limit of 1 series"),
            "{api}"
        );
    }
}
