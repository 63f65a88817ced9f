//! The metastore as the other roles see it: live ingesters for the
//! distributors' ring and the queriers' head reads, the block index, and
//! the compactor's jobs.

use std::time::Duration;

use fathom_api::cluster::{IngesterAddr, Ingesters};
use fathom_block::BlockMeta;
use fathom_compactor::CompactionIndex;
use fathom_metastore::{MetastoreClient, Role};

/// Live ingesters from the metastore.
pub struct MetastoreIngesters(pub MetastoreClient);

#[async_trait::async_trait]
impl Ingesters for MetastoreIngesters {
    async fn ingesters(&self) -> Result<Vec<IngesterAddr>, String> {
        let members = self
            .0
            .members(Some(Role::Ingester))
            .await
            .map_err(|e| e.to_string())?;
        Ok(members
            .into_iter()
            .map(|m| IngesterAddr {
                id: m.id,
                addr: m.addr,
            })
            .collect())
    }
}

/// The compactor's view of the metastore.
pub struct MetastoreJobs(pub MetastoreClient);

#[async_trait::async_trait]
impl CompactionIndex for MetastoreJobs {
    async fn all(&self) -> Result<Vec<BlockMeta>, String> {
        self.0.all_blocks().await.map_err(|e| e.to_string())
    }

    async fn replace(
        &self,
        tenant: &str,
        add: Vec<BlockMeta>,
        remove: Vec<String>,
    ) -> Result<(), String> {
        self.0
            .replace_blocks(tenant, add, remove)
            .await
            .map_err(|e| e.to_string())
    }

    async fn pending_deletions(&self) -> Result<Vec<(BlockMeta, i64)>, String> {
        self.0.pending_deletions().await.map_err(|e| e.to_string())
    }

    async fn purge(&self, tenant: &str, ids: Vec<String>) -> Result<(), String> {
        self.0.purge(tenant, ids).await.map_err(|e| e.to_string())
    }

    async fn acquire(&self, job: &str, owner: &str, ttl: Duration) -> Result<bool, String> {
        self.0
            .acquire_lease(job, owner, ttl)
            .await
            .map_err(|e| e.to_string())
    }

    async fn release(&self, job: &str, owner: &str) -> Result<(), String> {
        self.0
            .release_lease(job, owner)
            .await
            .map_err(|e| e.to_string())
    }
}
