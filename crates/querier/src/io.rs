//! I/O off the query executor (the IOx pattern): queries run on the
//! dedicated query runtime ([`crate::Executor`]), and every object-store
//! read, metastore (block index) call and ingester (head) call they make is
//! sent to the I/O runtime, the one that serves requests, and awaited.
//! Network and disk waits then never sit on the query runtime's few
//! threads, and a CPU-bound query never delays the progress of another
//! query's I/O.
//!
//! An object read is fetched whole on the I/O runtime (the readers ask for
//! byte ranges: Parquet footers, column chunks, a block's small files) and
//! handed over as one buffer.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use fathom_block::{BlockIndex, BlockMeta, IndexError};
use fathom_model::{Id, Symbols, TenantId};
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::{HeadSnapshot, HeadSource, QueryError};

fn join_error(e: tokio::task::JoinError) -> object_store::Error {
    object_store::Error::Generic {
        store: "io runtime",
        source: Box::new(e),
    }
}

/// Runs `f` on `io` and waits for it (an aborted wait aborts nothing: the
/// I/O finishes and is dropped). `f` runs in the caller's span, so an
/// ingester's head read stays a child of the query's trace.
async fn on_io<F, T>(io: &Handle, f: F) -> std::result::Result<T, tokio::task::JoinError>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    io.spawn(f.in_current_span()).await
}

/// An [`ObjectStore`] whose calls run on the I/O runtime: every object
/// read of the querier goes through it, and a missing block file comes
/// out of it as an error of its own ([`missing_block_file`]).
#[derive(Debug)]
pub(crate) struct IoStore {
    inner: Arc<dyn ObjectStore>,
    io: Handle,
}

impl IoStore {
    pub(crate) fn new(inner: Arc<dyn ObjectStore>, io: Handle) -> Self {
        IoStore { inner, io }
    }
}

impl std::fmt::Display for IoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "io({})", self.inner)
    }
}

/// A block file that is not there, as an error of its own rather than
/// `NotFound`: a block the index lists must be read whole. DataFusion
/// takes a file path that is not found for a directory and lists it,
/// which reads nothing and is no error, so a samples file deleted by a
/// compaction while the query ran, or lost, would silently leave the
/// block's samples out of the answer. Other objects (`meta.json`, which
/// readers ask for to learn whether a block exists) keep `NotFound`.
fn missing_block_file(location: &Path, e: object_store::Error) -> object_store::Error {
    match e {
        object_store::Error::NotFound { path, source }
            if location.as_ref().ends_with(".parquet") =>
        {
            object_store::Error::Generic {
                store: "block files",
                source: format!(
                    "block file {path} is missing ({source}): its block was deleted after the \
                     query listed it (compacted away; retry the query) or is lost"
                )
                .into(),
            }
        }
        e => e,
    }
}

#[async_trait]
impl ObjectStore for IoStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let (s, l) = (self.inner.clone(), location.clone());
        on_io(&self.io, async move { s.put_opts(&l, payload, opts).await })
            .await
            .map_err(join_error)?
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let (s, l) = (self.inner.clone(), location.clone());
        let (meta, range, attributes, body) = on_io(&self.io, async move {
            let r = s
                .get_opts(&l, options)
                .await
                .map_err(|e| missing_block_file(&l, e))?;
            let (meta, range, attributes) = (r.meta.clone(), r.range.clone(), r.attributes.clone());
            let body = r.bytes().await?;
            Ok::<_, object_store::Error>((meta, range, attributes, body))
        })
        .await
        .map_err(join_error)??;
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(body) }).boxed(),
            ),
            meta,
            range,
            attributes,
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let (s, l, r) = (self.inner.clone(), location.clone(), ranges.to_vec());
        on_io(&self.io, async move {
            s.get_ranges(&l, &r)
                .await
                .map_err(|e| missing_block_file(&l, e))
        })
        .await
        .map_err(join_error)?
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let (s, p) = (self.inner.clone(), prefix.cloned());
        on_io(
            &self.io,
            async move { s.list_with_delimiter(p.as_ref()).await },
        )
        .await
        .map_err(join_error)?
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

/// A [`BlockIndex`] (the metastore) whose calls run on the I/O runtime.
pub(crate) struct IoIndex {
    inner: Arc<dyn BlockIndex>,
    io: Handle,
}

impl IoIndex {
    pub(crate) fn new(inner: Arc<dyn BlockIndex>, io: Handle) -> Self {
        IoIndex { inner, io }
    }
}

fn index_join(e: tokio::task::JoinError) -> IndexError {
    IndexError::new(e)
}

#[async_trait]
impl BlockIndex for IoIndex {
    async fn add(&self, meta: BlockMeta) -> std::result::Result<(), IndexError> {
        let i = self.inner.clone();
        on_io(&self.io, async move { i.add(meta).await })
            .await
            .map_err(index_join)?
    }

    async fn blocks(
        &self,
        tenant: &str,
        start: i64,
        end: i64,
    ) -> std::result::Result<Vec<BlockMeta>, IndexError> {
        let (i, t) = (self.inner.clone(), tenant.to_owned());
        on_io(&self.io, async move { i.blocks(&t, start, end).await })
            .await
            .map_err(index_join)?
    }

    async fn all(&self) -> std::result::Result<Vec<BlockMeta>, IndexError> {
        let i = self.inner.clone();
        on_io(&self.io, async move { i.all().await })
            .await
            .map_err(index_join)?
    }

    async fn remove(&self, tenant: &str, ids: &[String]) -> std::result::Result<(), IndexError> {
        let (i, t, ids) = (self.inner.clone(), tenant.to_owned(), ids.to_vec());
        on_io(&self.io, async move { i.remove(&t, &ids).await })
            .await
            .map_err(index_join)?
    }
}

/// A [`HeadSource`] (the ingesters) whose calls run on the I/O runtime.
pub(crate) struct IoHeads {
    inner: Arc<dyn HeadSource>,
    io: Handle,
}

impl IoHeads {
    pub(crate) fn new(inner: Arc<dyn HeadSource>, io: Handle) -> Self {
        IoHeads { inner, io }
    }
}

fn head_join(e: tokio::task::JoinError) -> QueryError {
    QueryError::Task(format!("head call on the io runtime: {e}"))
}

#[async_trait]
impl HeadSource for IoHeads {
    async fn snapshot(
        &self,
        tenant: &TenantId,
        start: i64,
        end: i64,
    ) -> std::result::Result<Vec<HeadSnapshot>, QueryError> {
        let (h, t) = (self.inner.clone(), tenant.clone());
        // The request's tenant limits are task-local: they go along.
        let limits = fathom_api::auth::request_limits();
        on_io(&self.io, async move {
            match limits {
                Some(l) => {
                    fathom_api::auth::with_request_limits(l, h.snapshot(&t, start, end)).await
                }
                None => h.snapshot(&t, start, end).await,
            }
        })
        .await
        .map_err(head_join)?
    }

    async fn symbols(
        &self,
        tenant: &TenantId,
        stacks: &[Id],
    ) -> std::result::Result<Symbols, QueryError> {
        let (h, t, s) = (self.inner.clone(), tenant.clone(), stacks.to_vec());
        on_io(&self.io, async move { h.symbols(&t, &s).await })
            .await
            .map_err(head_join)?
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use fathom_block::MemoryIndex;
    use fathom_model::Selector;
    use object_store::memory::InMemory;
    use parking_lot::Mutex;

    use super::*;
    use crate::test_util::{ReadHook, history};
    use crate::{Config, test_querier_on};

    /// A merge and a SQL query execute on the query runtime
    /// (`fathom-query` threads), and every object read they make runs on
    /// the I/O runtime (here the test's).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn object_reads_of_queries_run_on_the_io_runtime() {
        let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (metas, all) = history(mem.as_ref()).await;
        // Records the name of the thread each read runs on.
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let on_read = seen.clone();
        let threads = Arc::new(ReadHook {
            inner: mem,
            on_read: Box::new(move |_, _| {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                on_read.lock().insert(name);
                Box::pin(async {})
            }),
        });
        let q = test_querier_on(
            Config {
                use_rollups: false,
                ..Config::default()
            },
            Arc::new(MemoryIndex::new(metas)),
            threads,
        );
        let tenant = TenantId::new("t").unwrap();
        let pt = all[0].profile_type.to_string();
        let sel = Selector::parse(&format!("{pt}{{service_name=\"svc\"}}")).unwrap();
        let m = q.merge(&tenant, &sel, 0, i64::MAX - 1).await.unwrap();
        assert!(m.total() != 0);
        q.sql_collect(
            &tenant,
            "SELECT leaf, count(*) FROM profiles WHERE profile_id IS NOT NULL GROUP BY leaf",
        )
        .await
        .unwrap();
        let seen = seen.lock().clone();
        assert!(!seen.is_empty(), "no object read was seen");
        assert!(
            seen.iter().all(|n| !n.starts_with("fathom-query")),
            "object reads ran on the query runtime: {seen:?}"
        );
    }

    /// A block the index lists whose samples file is gone (deleted by a
    /// compaction while the query ran, or lost) fails the merge, naming
    /// the file: never an answer without that block's samples.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listed_block_without_its_samples_file_fails_the_query() {
        use object_store::ObjectStoreExt;
        let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (metas, all) = history(mem.as_ref()).await;
        assert!(metas.len() > 1, "a history of several blocks");
        let q = test_querier_on(
            Config {
                use_rollups: false,
                ..Config::default()
            },
            Arc::new(MemoryIndex::new(metas.clone())),
            mem.clone(),
        );
        let tenant = TenantId::new("t").unwrap();
        let pt = all[0].profile_type.to_string();
        let sel = Selector::parse(&format!("{pt}{{service_name=\"svc\"}}")).unwrap();
        let whole = q.merge(&tenant, &sel, 0, i64::MAX - 1).await.unwrap();
        assert!(whole.total() != 0);
        let m = &metas[0];
        let gone = fathom_block::block_file(&m.tenant, &m.id, fathom_block::files::SAMPLES);
        mem.delete(&gone).await.unwrap();
        let err = q
            .merge(&tenant, &sel, 0, i64::MAX - 1)
            .await
            .map(|m| m.total())
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(gone.as_ref()) && msg.contains("missing"),
            "{msg}"
        );
    }
}
