//! Wires Fathom's roles into a process. `fathom all` runs the distributor,
//! the ingester and the querier here, connected through the same traits
//! they use across the network in a cluster ([`IngesterWriter`] for writes,
//! [`HeadSource`] for recent data, [`BlockIndex`] for blocks): single-process
//! mode is the same code, wired locally.
//!
//! ```text
//!            one port (HTTP/1.1 + h2c): /ingest, /api/v1/*, gRPC Push, Arrow Flight (SQL), /metrics, /ready
//!                 │                         │
//!            distributor ── LocalWriter ──► ingester ── blocks ──► object store
//!                                             ▲                      │
//!            querier ──── LocalHead ──────────┘    MemoryIndex ◄─────┘ (listed once at start)
//! ```
//!
//! Start-up: open the object store, list its blocks into the index, replay
//! the WAL, bind, then report ready. Shutdown (SIGTERM/SIGINT): stop
//! accepting, drain requests, flush the heads to blocks (bounded in time;
//! what does not make it stays in the WAL).

mod cluster;
mod roles;
mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use fathom_block::{BlockIndex, MemoryIndex};
use fathom_distributor::{Distributor, IngesterWriter, PushServer, WriteError};
use fathom_ingester::Ingester;
use fathom_model::{Id, IngestBatch, Symbols, TenantId};
use fathom_querier::{Executor, HeadData, HeadSource, Querier, QueryError};
use prometheus_client::registry::Registry;

pub use cluster::{MetastoreIngesters, MetastoreJobs};
pub use roles::{
    DistributorConfig, IngesterConfig, QuerierRoleConfig, distributor_app, ingester_app,
    querier_app,
};
pub use store::{ObjectStoreConfig, StoreKind};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("object store: {0}")]
    Store(String),
    #[error("listing blocks at start-up: {0}")]
    Blocks(#[from] fathom_block::Error),
    #[error("opening the ingester: {0}")]
    Ingester(#[from] fathom_ingester::Error),
    #[error("starting the querier: {0}")]
    Querier(#[from] QueryError),
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
    pub shutdown_flush_timeout: Duration,
    pub limits: Limits,
    pub querier: fathom_querier::Config,
    pub query_threads: usize,
}

/// The in-process ingester as the distributor's write target.
struct LocalWriter(Arc<Ingester>);

#[async_trait::async_trait]
impl IngesterWriter for LocalWriter {
    async fn write(&self, batch: IngestBatch) -> Result<(), WriteError> {
        self.0
            .write(&batch)
            .await
            .map(|_| ())
            .map_err(|e| WriteError::Unavailable(format!("ingester: {e}")))
    }
}

/// The in-process ingester as the querier's source of recent data.
struct LocalHead(Arc<Ingester>);

#[async_trait::async_trait]
impl HeadSource for LocalHead {
    async fn snapshot(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> Result<Vec<HeadData>, QueryError> {
        let s = self.0.snapshot(tenant, start, end);
        Ok(vec![HeadData {
            series: s.series,
            profiles: s.profiles,
            samples: s.samples,
        }])
    }

    async fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Result<Symbols, QueryError> {
        Ok(self.0.symbols(tenant, stacks))
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

/// Runs distributor, ingester and querier in this process until `shutdown`
/// resolves, then flushes the heads.
pub async fn run_all(
    cfg: AllConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let store = cfg.store.build(&cfg.data_dir)?;
    let blocks = fathom_block::list_blocks(store.as_ref()).await?;
    tracing::info!(blocks = blocks.len(), store = %cfg.store.describe(&cfg.data_dir), "loaded block index");
    let index: Arc<dyn BlockIndex> = Arc::new(MemoryIndex::new(blocks));
    let mut registry = Registry::default();
    let ingester = Ingester::open(
        fathom_ingester::Config {
            data_dir: cfg.data_dir.clone(),
            name: format!("all@{}", cfg.listen),
            flush_interval: cfg.flush_interval,
            max_head_bytes: cfg.max_head_bytes,
        },
        store.clone(),
        index.clone(),
        &mut registry,
    )?;
    let exec = Executor::new(cfg.query_threads).map_err(|source| Error::Io {
        what: "starting the query runtime".into(),
        source,
    })?;
    let querier = Querier::new(
        cfg.querier.clone(),
        Arc::new(LocalHead(ingester.clone())),
        index.clone(),
        store.clone(),
        exec,
        &mut registry,
    )?;
    let distributor = Distributor::new(
        cfg.limits.clone(),
        Arc::new(LocalWriter(ingester.clone())),
        &mut registry,
    );
    let grpc = tonic::service::Routes::new(PushServer::new(distributor.clone()))
        .add_service(fathom_querier::flight_service(Some(querier.clone()), None))
        .into_axum_router();
    let app = axum::Router::new()
        .merge(fathom_distributor::router(distributor))
        .merge(fathom_querier::router(querier))
        .merge(grpc);
    serve(
        cfg.listen,
        registry,
        app,
        Some(ingester),
        cfg.shutdown_flush_timeout,
        shutdown,
    )
    .await
}

/// One process's port: the roles' routes plus `/ready`, `/health`,
/// `/metrics`; ready once bound (and, with an ingester, its WAL replayed);
/// on shutdown, drains requests and flushes the ingester's heads.
pub async fn serve(
    listen: SocketAddr,
    registry: Registry,
    app: axum::Router,
    ingester: Option<Arc<Ingester>>,
    shutdown_flush_timeout: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
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
        .map(|i| tokio::spawn(i.run_flush_loop(stop_rx)));
    shared.ready.store(true, Ordering::Release);
    tracing::info!(listen = %local, "fathom is ready: HTTP and gRPC on one port");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| Error::Io {
            what: "serving".into(),
            source,
        })?;
    shared.ready.store(false, Ordering::Release);
    let _ = stop_tx.send(true);
    if let Some(f) = flusher {
        let _ = f.await;
    }
    if let Some(ingester) = ingester {
        tracing::info!("flushing heads before exit");
        let deadline = std::time::Instant::now() + shutdown_flush_timeout;
        match ingester.flush(Some(deadline)).await {
            Ok(blocks) => tracing::info!(blocks = blocks.len(), "flushed heads; bye"),
            Err(e) => {
                tracing::error!(error = %e, "flush at shutdown failed; the WAL keeps the data")
            }
        }
    }
    Ok(())
}

pub use fathom_distributor::Limits;
pub use fathom_querier::{Config as QuerierConfig, SqlConfig};
