use std::collections::BTreeMap;

use parking_lot::RwLock;

use crate::meta::BlockMeta;

/// Why the block index could not answer or record something (for example,
/// the metastore is unreachable or refused the change), its cause kept as
/// the source. Callers must treat it as "unknown", never as "no blocks": a
/// query that cannot list blocks fails instead of silently missing data.
#[derive(Clone, Debug, thiserror::Error)]
#[error("block index: {source}")]
pub struct IndexError {
    #[source]
    source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
}

impl IndexError {
    pub fn new(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        IndexError {
            source: std::sync::Arc::from(source.into()),
        }
    }
}

/// Where blocks are found at query time: the index of blocks per tenant and
/// time range. Queriers never list the bucket.
///
/// In single-process mode this is a [`MemoryIndex`] loaded from the bucket
/// at start-up; the cluster's metastore implements the same trait.
#[async_trait::async_trait]
pub trait BlockIndex: Send + Sync + 'static {
    /// Registers a block that is completely stored.
    async fn add(&self, meta: BlockMeta) -> Result<(), IndexError>;
    /// Blocks of `tenant` that may hold data in `[start, end]` (nanoseconds).
    async fn blocks(
        &self,
        tenant: &str,
        start: i64,
        end: i64,
    ) -> Result<Vec<BlockMeta>, IndexError>;
    /// Every block of every tenant.
    async fn all(&self) -> Result<Vec<BlockMeta>, IndexError>;
    /// Forgets blocks (after compaction replaced them).
    async fn remove(&self, tenant: &str, ids: &[String]) -> Result<(), IndexError>;
}

/// An in-memory [`BlockIndex`].
#[derive(Default)]
pub struct MemoryIndex {
    by_tenant: RwLock<BTreeMap<String, BTreeMap<String, BlockMeta>>>,
}

impl MemoryIndex {
    pub fn new(blocks: Vec<BlockMeta>) -> Self {
        let idx = MemoryIndex::default();
        {
            let mut m = idx.by_tenant.write();
            for b in blocks {
                m.entry(b.tenant.clone())
                    .or_default()
                    .insert(b.id.clone(), b);
            }
        }
        idx
    }
}

#[async_trait::async_trait]
impl BlockIndex for MemoryIndex {
    async fn add(&self, meta: BlockMeta) -> Result<(), IndexError> {
        self.by_tenant
            .write()
            .entry(meta.tenant.clone())
            .or_default()
            .insert(meta.id.clone(), meta);
        Ok(())
    }

    async fn blocks(
        &self,
        tenant: &str,
        start: i64,
        end: i64,
    ) -> Result<Vec<BlockMeta>, IndexError> {
        Ok(self
            .by_tenant
            .read()
            .get(tenant)
            .map(|m| {
                m.values()
                    .filter(|b| b.overlaps(start, end))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn all(&self) -> Result<Vec<BlockMeta>, IndexError> {
        Ok(self
            .by_tenant
            .read()
            .values()
            .flat_map(|m| m.values().cloned())
            .collect())
    }

    async fn remove(&self, tenant: &str, ids: &[String]) -> Result<(), IndexError> {
        if let Some(m) = self.by_tenant.write().get_mut(tenant) {
            for id in ids {
                m.remove(id);
            }
        }
        Ok(())
    }
}
