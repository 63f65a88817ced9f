//! Fathom's metastore (docs to come).

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

pub use client::{ClientOptions, MetastoreClient, spawn_heartbeat};
pub use error::{Error, MetastoreError};
pub use node::{MetastoreConfig, MetastoreNode};
pub use service::LEADER_METADATA;
pub use types::{Member, PendingDeletion, Role};
