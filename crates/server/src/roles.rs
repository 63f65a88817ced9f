//! The routes of each role when it runs as its own process (a cluster):
//! the same components as `fathom all`, wired to each other over the
//! network instead of in memory.
//!
//! - ingester: `fathom.ingester.v1.IngesterService/Write` from distributors,
//!   Arrow Flight head reads for queriers;
//! - distributor: `/ingest` and gRPC push, replicated to the ingesters by
//!   [`ReplicatedWriter`];
//! - querier: the HTTP query API, Arrow Flight and Flight SQL, reading
//!   recent data from the ingesters with [`FlightHeads`].
//!
//! Membership (which ingesters are live) and the block index come in as
//! traits: the metastore in a cluster, fixed values in tests.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fathom_api::cluster::Ingesters;
use fathom_block::BlockIndex;
use fathom_distributor::ring::{GrpcReplicas, ReplicatedWriter};
use fathom_distributor::{Distributor, Limits, OtlpProfilesServer, PushServer};
use fathom_ingester::Ingester;
use fathom_querier::{Executor, FlightHeads, Querier};
use object_store::ObjectStore;
use prometheus_client::registry::Registry;

use crate::{Error, LocalHead};

/// An ingester process.
#[derive(Clone, Debug)]
pub struct IngesterConfig {
    /// Unique instance name (its blocks' source, its ring id).
    pub name: String,
    pub data_dir: PathBuf,
    pub flush_interval: Duration,
    pub max_head_bytes: usize,
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
        },
        store,
        index,
        registry,
    )?;
    let routes = tonic::service::Routes::new(fathom_ingester::write_service(ingester.clone()))
        .add_service(fathom_querier::flight_service(
            None,
            Some(Arc::new(LocalHead(ingester.clone()))),
        ))
        .into_axum_router();
    Ok((routes, ingester))
}

/// A distributor process.
#[derive(Clone, Debug)]
pub struct DistributorConfig {
    pub limits: Limits,
    pub replication_factor: usize,
    /// Time an ingester has to acknowledge a write.
    pub write_timeout: Duration,
}

pub fn distributor_app(
    cfg: &DistributorConfig,
    ingesters: Arc<dyn Ingesters>,
    registry: &mut Registry,
) -> axum::Router {
    let writer = ReplicatedWriter::new(
        ingesters,
        Arc::new(GrpcReplicas::new(cfg.write_timeout)),
        cfg.replication_factor,
        registry,
    );
    let d = Distributor::new(cfg.limits.clone(), Arc::new(writer), registry);
    let grpc = tonic::service::Routes::new(PushServer::new(d.clone()))
        .add_service(OtlpProfilesServer::new(d.clone()))
        .into_axum_router();
    axum::Router::new()
        .merge(fathom_distributor::router(d))
        .merge(grpc)
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
}

pub async fn querier_app(
    cfg: &QuerierRoleConfig,
    ingesters: Arc<dyn Ingesters>,
    index: Arc<dyn BlockIndex>,
    store: Arc<dyn ObjectStore>,
    registry: &mut Registry,
) -> Result<axum::Router, Error> {
    let exec = Executor::new(cfg.query_threads).map_err(|source| Error::Io {
        what: "starting the query runtime".into(),
        source,
    })?;
    let heads = FlightHeads::new(ingesters, cfg.replication_factor, cfg.head_timeout);
    let store = fathom_querier::CachedStore::wrap(store, &cfg.cache, registry).await?;
    let q = Querier::new(
        cfg.querier.clone(),
        Arc::new(heads),
        index,
        store,
        exec,
        registry,
    )?;
    let grpc = tonic::service::Routes::new(fathom_querier::flight_service(Some(q.clone()), None))
        .into_axum_router();
    Ok(axum::Router::new()
        .merge(fathom_querier::router(q))
        .merge(fathom_ui::router())
        .merge(grpc))
}
