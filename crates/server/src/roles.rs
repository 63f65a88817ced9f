//! The routes of each role when it runs as its own process (a cluster):
//! the same components as `fathom all`, wired to each other over the
//! network instead of in memory.
//!
//! - ingester: `fathom.ingester.v1.IngesterService/WriteRecord` (and `Write`) from distributors,
//!   Arrow Flight head reads for queriers;
//! - distributor: `/ingest` and gRPC push, replicated to the ingesters by
//!   [`ReplicatedWriter`];
//! - querier: the HTTP query API, Arrow Flight and Flight SQL, reading
//!   recent data from the ingesters with [`FlightHeads`] (the ingester
//!   crate's client of its own head-read Flight service).
//!
//! The ingester's routes are internal: they answer only calls that carry
//! the cluster secret (see [`fathom_api::secret`]).
//!
//! Membership (which ingesters are live) and the block index come in as
//! traits: the metastore in a cluster, fixed values in tests.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fathom_api::cluster::Ingesters;
use fathom_api::secret::{ClusterSecret, require_cluster_secret};
use fathom_block::BlockIndex;
use fathom_distributor::ring::{GrpcReplicas, ReplicatedWriter};
use fathom_distributor::{
    Distributor, Inflight, InflightConfig, Limits, OtlpProfilesServer, PushServer,
};
use fathom_ingester::{FlightHeads, Ingester};
use fathom_querier::{Executor, Querier};
use object_store::ObjectStore;
use prometheus_client::registry::Registry;

use crate::{Error, TenantsFileConfig, authenticated};

/// An ingester process.
#[derive(Clone, Debug)]
pub struct IngesterConfig {
    /// Unique instance name (its blocks' source, its ring id).
    pub name: String,
    pub data_dir: PathBuf,
    pub flush_interval: Duration,
    pub max_head_bytes: usize,
    /// Writes are refused (retryable) while the heads hold this much.
    pub max_head_memory: usize,
    /// Every route (writes, head reads) requires this secret.
    pub secret: ClusterSecret,
    /// Used here only for the per-tenant `max_series` (authentication is
    /// the distributors' and queriers' job); none: no series limit.
    pub tenants: TenantsFileConfig,
}

/// The ingester's routes and the ingester (for [`crate::serve`] to flush
/// at shutdown).
pub fn ingester_app(
    cfg: &IngesterConfig,
    store: Arc<dyn ObjectStore>,
    index: Arc<dyn BlockIndex>,
    registry: &mut Registry,
) -> Result<(axum::Router, Arc<Ingester>), Error> {
    let ingester = Ingester::open(
        fathom_ingester::Config {
            data_dir: cfg.data_dir.clone(),
            name: cfg.name.clone(),
            flush_interval: cfg.flush_interval,
            max_head_bytes: cfg.max_head_bytes,
            max_head_memory: cfg.max_head_memory,
        },
        store,
        index,
        registry,
    )?;
    if let Some(path) = &cfg.tenants.path {
        let t = crate::Auth::load(path, cfg.tenants.reload_interval, registry)?.tenants();
        tracing::info!("the tenants file sets the per-tenant max_series of this ingester's head");
        ingester.set_series_limit(Arc::new(move |id| t.limits(id).max_series));
    }
    let routes = tonic::service::Routes::new(fathom_ingester::write_service(ingester.clone()))
        .add_service(fathom_ingester::flight_service(ingester.clone()))
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(
            cfg.secret.clone(),
            require_cluster_secret,
        ));
    Ok((routes, ingester))
}

/// A distributor process.
#[derive(Clone, Debug)]
pub struct DistributorConfig {
    pub limits: Limits,
    pub replication_factor: usize,
    /// Time an ingester has to acknowledge a write.
    pub write_timeout: Duration,
    /// Credentials and per-tenant limits (none: authentication off).
    pub tenants: TenantsFileConfig,
    /// Sent with every write to an ingester.
    pub secret: ClusterSecret,
    /// Write requests worked on at once.
    pub inflight: InflightConfig,
}

/// The distributor's routes, behind authentication when a tenants file is
/// set (the distributor is an external edge).
pub fn distributor_app(
    cfg: &DistributorConfig,
    ingesters: Arc<dyn Ingesters>,
    registry: &mut Registry,
) -> Result<axum::Router, Error> {
    let auth = cfg.tenants.load(registry)?;
    let writer = ReplicatedWriter::new(
        ingesters,
        Arc::new(GrpcReplicas::new(cfg.write_timeout, cfg.secret.clone())),
        cfg.replication_factor,
        registry,
    );
    let inflight = Inflight::new(&cfg.inflight, cfg.limits.max_body_bytes, registry);
    let d = Distributor::new(cfg.limits.clone(), Arc::new(writer), registry)
        .with_tenants(auth.as_ref().map(crate::Auth::tenants));
    let grpc = tonic::service::Routes::new(PushServer::new(d.clone()))
        .add_service(OtlpProfilesServer::new(d.clone()))
        .into_axum_router();
    // Authentication outside: a request without a credential takes no
    // share of the in-flight budget.
    let app = inflight.layer(
        axum::Router::new()
            .merge(fathom_distributor::router(d))
            .merge(grpc),
    );
    Ok(authenticated(app, auth.as_ref()))
}

/// A querier process.
#[derive(Clone, Debug)]
pub struct QuerierRoleConfig {
    pub querier: fathom_querier::Config,
    pub replication_factor: usize,
    pub query_threads: usize,
    /// Time an ingester has to answer a head read.
    pub head_timeout: Duration,
    /// The block file cache.
    pub cache: fathom_querier::CacheConfig,
    /// Credentials and per-tenant query limits (none: authentication off).
    pub tenants: TenantsFileConfig,
    /// Sent with every head read to an ingester.
    pub secret: ClusterSecret,
    /// Server-side symbolization (local copies of debug info under the
    /// cache directory).
    pub symbols: crate::SymbolsConfig,
}

pub async fn querier_app(
    cfg: &QuerierRoleConfig,
    ingesters: Arc<dyn Ingesters>,
    index: Arc<dyn BlockIndex>,
    store: Arc<dyn ObjectStore>,
    registry: &mut Registry,
) -> Result<axum::Router, Error> {
    let auth = cfg.tenants.load(registry)?;
    let exec = Executor::new(cfg.query_threads).map_err(|source| Error::Io {
        what: "starting the query runtime".into(),
        source,
    })?;
    let heads = FlightHeads::new(
        ingesters,
        cfg.replication_factor,
        cfg.head_timeout,
        cfg.secret.clone(),
    );
    let debuginfo_store = store.clone();
    let store = fathom_querier::CachedStore::wrap(store, &cfg.cache, registry).await?;
    let q = Querier::new(
        cfg.querier.clone(),
        Arc::new(heads),
        index,
        store,
        exec,
        registry,
    )?;
    let grpc =
        tonic::service::Routes::new(fathom_query_api::flight_service(q.clone())).into_axum_router();
    let symbols = crate::symbols::app(
        &cfg.symbols,
        debuginfo_store,
        &cfg.cache.dir,
        &q,
        None,
        registry,
    );
    let app = axum::Router::new()
        .merge(symbols)
        .merge(fathom_query_api::router(q))
        .merge(fathom_ui::router())
        .merge(grpc);
    Ok(authenticated(app, auth.as_ref()))
}
