//! The ingester: makes acknowledged writes durable, answers queries for
//! recent data, and cuts blocks to object storage.
//!
//! ```text
//! write(batch) ──► WAL append + fsync (group commit) ──► per-tenant head ──► ack
//!                                                           │ every flush interval,
//!                                                           │ at the size limit, on shutdown
//!                                                           ▼
//!                      rotate WAL, freeze heads ──► encode Parquet (blocking pool)
//!                      ──► upload files, meta.json last ──► block index ──► drop old WAL segments
//! ```
//!
//! Invariants:
//! - a write is acknowledged only after its WAL record is fsync'd, and the
//!   record is in a segment older than any cut that does not include it (a
//!   gate makes "append + apply" atomic with respect to a cut);
//! - WAL segments are deleted only after every block cut from them is
//!   stored and registered; until then the frozen heads stay queryable;
//! - applying a profile id twice is a no-op, so replay after a crash and
//!   client retries do not double count within a head; across a head and a
//!   block the querier removes duplicates by profile id.
//!
//! Failure modes: object storage down → uploads retry with backoff while
//! writes keep being acknowledged (the WAL grows); a crash → replay on start;
//! a torn WAL tail (crash mid-append, never acknowledged) is truncated.

mod grpc;
mod head;
mod wal;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fathom_block::{BlockIndex, BlockMeta};
use fathom_model::{Id, IngestBatch, Symbols, TenantId};
use fathom_proto::ingester::WriteRequest;
use object_store::ObjectStore;
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use prost::Message;

pub use grpc::{WriteServer, write_service};
pub use head::HeadSnapshot;
use head::TenantHead;
pub use wal::WalError;
use wal::{Wal, WalMetrics};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("wal record could not be decoded: {0}")]
    Record(String),
    #[error("block upload: {0}")]
    Block(#[from] fathom_block::Error),
    #[error("flush did not finish before its deadline; the data stays in the WAL")]
    FlushDeadline,
    #[error("ingester is shutting down")]
    ShuttingDown,
}

/// Ingester settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Directory for the WAL (`<dir>/wal`).
    pub data_dir: PathBuf,
    /// Instance name, recorded as each block's source.
    pub name: String,
    /// Cut blocks at least this often.
    pub flush_interval: Duration,
    /// Cut blocks when the heads hold more than this many (estimated) bytes.
    pub max_head_bytes: usize,
}

struct Pending {
    wal_segment: u64,
    heads: Arc<HashMap<String, TenantHead>>,
    done: HashSet<String>,
}

#[derive(Default)]
struct State {
    active: HashMap<String, TenantHead>,
    active_bytes: usize,
    pending: VecDeque<Pending>,
}

#[derive(Clone, Default)]
struct Metrics {
    wal: WalMetrics,
    profiles: Counter,
    samples: Counter,
    blocks: Counter,
    block_bytes: Counter,
    upload_failures: Counter,
    index_failures: Counter,
    head_bytes: Gauge,
    replayed: Counter,
}

/// The ingester; see the crate documentation.
pub struct Ingester {
    cfg: Config,
    store: Arc<dyn ObjectStore>,
    index: Arc<dyn BlockIndex>,
    wal: Wal,
    gate: tokio::sync::RwLock<()>,
    state: RwLock<State>,
    flush_lock: tokio::sync::Mutex<()>,
    last_flush: parking_lot::Mutex<Instant>,
    m: Metrics,
}

impl Ingester {
    /// Replays the WAL into the heads and starts a new WAL segment.
    pub fn open(
        cfg: Config,
        store: Arc<dyn ObjectStore>,
        index: Arc<dyn BlockIndex>,
        registry: &mut Registry,
    ) -> Result<Arc<Self>, Error> {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("fathom_ingester");
        r.register(
            "wal_bytes",
            "Bytes appended to the WAL",
            m.wal.bytes.clone(),
        );
        r.register(
            "wal_records",
            "Records appended to the WAL",
            m.wal.records.clone(),
        );
        r.register(
            "wal_fsyncs",
            "WAL group commits (one fsync each)",
            m.wal.fsyncs.clone(),
        );
        r.register("profiles", "Profiles added to heads", m.profiles.clone());
        r.register("samples", "Sample rows added to heads", m.samples.clone());
        r.register("blocks_flushed", "Blocks cut and stored", m.blocks.clone());
        r.register(
            "block_bytes",
            "Bytes of stored blocks",
            m.block_bytes.clone(),
        );
        r.register(
            "block_upload_failures",
            "Failed block uploads (retried)",
            m.upload_failures.clone(),
        );
        r.register(
            "block_index_failures",
            "Failed attempts to register a stored block in the block index (retried)",
            m.index_failures.clone(),
        );
        r.register(
            "head_bytes",
            "Estimated bytes held in heads",
            m.head_bytes.clone(),
        );
        r.register(
            "wal_replayed_records",
            "WAL records replayed at start",
            m.replayed.clone(),
        );

        let mut state = State::default();
        let mut bad = 0usize;
        let (wal, replayed) =
            Wal::open(
                &cfg.data_dir.join("wal"),
                m.wal.clone(),
                |rec| match decode_record(rec) {
                    Ok(batch) => {
                        let h = state.active.entry(batch.tenant.to_string()).or_default();
                        let before = h.bytes;
                        h.apply(&batch);
                        state.active_bytes += h.bytes - before;
                    }
                    Err(_) => bad += 1,
                },
            )?;
        if bad > 0 {
            tracing::error!(records = bad, "skipped undecodable wal records");
        }
        m.replayed.inc_by(replayed as u64);
        m.head_bytes.set(state.active_bytes as i64);
        tracing::info!(records = replayed, dir = %cfg.data_dir.display(), "replayed wal");
        Ok(Arc::new(Ingester {
            cfg,
            store,
            index,
            wal,
            gate: tokio::sync::RwLock::new(()),
            state: RwLock::new(state),
            flush_lock: tokio::sync::Mutex::new(()),
            last_flush: parking_lot::Mutex::new(Instant::now()),
            m,
        }))
    }

    /// Makes a batch durable, then visible to queries. Returns the sample
    /// rows added (0 when every profile was already present).
    pub async fn write(&self, batch: &IngestBatch) -> Result<usize, Error> {
        let rec = fathom_proto::encode_write_request(batch);
        let _g = self.gate.read().await;
        self.wal.append(rec).await?;
        let mut st = self.state.write();
        let h = st.active.entry(batch.tenant.to_string()).or_default();
        let before = h.bytes;
        let added = h.apply(batch);
        let grown = h.bytes - before;
        st.active_bytes += grown;
        self.m.head_bytes.set(st.active_bytes as i64);
        self.m.profiles.inc_by(batch.profiles.len() as u64);
        self.m.samples.inc_by(added as u64);
        Ok(added)
    }

    /// The head data of `tenant` in `[start, end]` (nanoseconds), including
    /// heads being flushed.
    pub fn snapshot(&self, tenant: &TenantId, start: i64, end: i64) -> HeadSnapshot {
        let st = self.state.read();
        let mut out = HeadSnapshot::default();
        if let Some(h) = st.active.get(tenant.as_str()) {
            out.extend_from(h, start, end);
        }
        for p in &st.pending {
            if let Some(h) = p.heads.get(tenant.as_str()) {
                out.extend_from(h, start, end);
            }
        }
        out
    }

    /// The symbols that `stacks` of `tenant` need, from the heads.
    pub fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Symbols {
        let st = self.state.read();
        let mut out = Symbols::default();
        let heads = st.active.get(tenant.as_str()).into_iter().chain(
            st.pending
                .iter()
                .filter_map(|p| p.heads.get(tenant.as_str())),
        );
        for h in heads {
            out.merge(&h.symbols.subset(stacks));
        }
        out
    }

    /// Whether a cut is due (interval elapsed with data, or size reached).
    pub fn flush_due(&self) -> bool {
        let st = self.state.read();
        let has_data = st.active.values().any(|h| !h.is_empty());
        has_data
            && (st.active_bytes >= self.cfg.max_head_bytes
                || self.last_flush.lock().elapsed() >= self.cfg.flush_interval)
    }

    /// Cuts every head into blocks and stores them, retrying uploads until
    /// `deadline` (forever when `None`). Returns the blocks written.
    pub async fn flush(&self, deadline: Option<Instant>) -> Result<Vec<BlockMeta>, Error> {
        let _f = self.flush_lock.lock().await;
        {
            let _g = self.gate.write().await;
            let has_data = self.state.read().active.values().any(|h| !h.is_empty());
            if has_data {
                let seg = self.wal.rotate().await?;
                let mut st = self.state.write();
                let heads = std::mem::take(&mut st.active);
                st.active_bytes = 0;
                st.pending.push_back(Pending {
                    wal_segment: seg,
                    heads: Arc::new(heads),
                    done: HashSet::new(),
                });
            }
            *self.last_flush.lock() = Instant::now();
        }
        let mut written = Vec::new();
        loop {
            let next = {
                let st = self.state.read();
                st.pending
                    .front()
                    .map(|p| (p.wal_segment, p.heads.clone(), p.done.clone()))
            };
            let Some((seg, heads, done)) = next else {
                break;
            };
            for (tenant, head) in heads.iter() {
                if head.is_empty() || done.contains(tenant) {
                    continue;
                }
                let meta = self.store_head(tenant, head, deadline).await?;
                written.push(meta);
                if let Some(p) = self.state.write().pending.front_mut() {
                    p.done.insert(tenant.clone());
                }
            }
            self.state.write().pending.pop_front();
            let removed = self.wal.remove_before(seg)?;
            tracing::debug!(segments = removed, "dropped flushed wal segments");
        }
        self.m.head_bytes.set(self.state.read().active_bytes as i64);
        Ok(written)
    }

    async fn store_head(
        &self,
        tenant: &str,
        head: &TenantHead,
        deadline: Option<Instant>,
    ) -> Result<BlockMeta, Error> {
        let data = head.to_block(tenant.to_owned(), self.cfg.name.clone());
        let (meta, files) = tokio::task::spawn_blocking(move || fathom_block::encode_block(&data))
            .await
            .map_err(|e| Error::Record(format!("encode task failed: {e}")))??;
        let mut backoff = Duration::from_millis(200);
        loop {
            match fathom_block::write_block(self.store.as_ref(), &meta, files.clone()).await {
                Ok(()) => break,
                Err(e) => {
                    self.m.upload_failures.inc();
                    tracing::warn!(tenant, block_id = %meta.id, error = %e, "block upload failed; retrying");
                    if deadline.is_some_and(|d| Instant::now() + backoff > d) {
                        return Err(Error::FlushDeadline);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        // A stored block that the index does not know is invisible to
        // queries: keep retrying (the WAL segment stays until this returns
        // Ok), but do not upload again.
        loop {
            match self.index.add(meta.clone()).await {
                Ok(()) => break,
                Err(e) => {
                    self.m.index_failures.inc();
                    tracing::warn!(tenant, block_id = %meta.id, error = %e, "block index update failed; retrying");
                    if deadline.is_some_and(|d| Instant::now() + backoff > d) {
                        return Err(Error::FlushDeadline);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        self.m.blocks.inc();
        self.m.block_bytes.inc_by(meta.stats.bytes);
        tracing::info!(
            tenant,
            block_id = %meta.id,
            profiles = meta.stats.profiles,
            samples = meta.stats.samples,
            bytes = meta.stats.bytes,
            "flushed block"
        );
        Ok(meta)
    }

    /// Runs [`Ingester::flush`] whenever it is due, until `stop` fires.
    pub async fn run_flush_loop(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => return,
            }
            if self.flush_due()
                && let Err(e) = self.flush(None).await
            {
                tracing::error!(error = %e, "flush failed");
            }
        }
    }

    /// Bytes of WAL segments on disk.
    pub fn wal_disk_bytes(&self) -> u64 {
        self.wal.disk_bytes()
    }
}

fn decode_record(rec: &[u8]) -> Result<IngestBatch, Error> {
    let req = WriteRequest::decode(rec).map_err(|e| Error::Record(e.to_string()))?;
    IngestBatch::try_from(req).map_err(|e| Error::Record(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_block::MemoryIndex;
    use fathom_model::*;
    use object_store::memory::InMemory;

    fn batch(tenant: &str, seed: u64, value: i64) -> IngestBatch {
        let mut symbols = Symbols::default();
        let f = symbols.add_function(Function {
            name: "main".into(),
            ..Default::default()
        });
        let l = symbols.add_location(Location {
            address: 1,
            lines: vec![Line {
                function: f,
                line: 1,
            }],
            ..Default::default()
        });
        let st = symbols.add_stack(Stack { locations: vec![l] });
        IngestBatch {
            tenant: TenantId::new(tenant).unwrap(),
            profiles: vec![Profile {
                id: IdHasher::new("test").u64(seed).finish(),
                profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
                    .parse()
                    .unwrap(),
                labels: Labels::from_pairs([("service_name", "svc")]).unwrap(),
                time_nanos: 1_000 + seed as i64,
                duration_nanos: 10,
                period: 1,
                samples: vec![Sample { stack: st, value }],
            }],
            symbols,
        }
    }

    fn open(dir: &std::path::Path, store: Arc<InMemory>, index: Arc<MemoryIndex>) -> Arc<Ingester> {
        Ingester::open(
            Config {
                data_dir: dir.to_owned(),
                name: "test".into(),
                flush_interval: Duration::from_secs(3600),
                max_head_bytes: 1 << 30,
            },
            store,
            index,
            &mut Registry::default(),
        )
        .unwrap()
    }

    fn total(s: &HeadSnapshot) -> i64 {
        use arrow::array::AsArray;
        s.samples
            .iter()
            .map(|b| {
                b.column(4)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .iter()
                    .sum::<i64>()
            })
            .sum()
    }

    #[tokio::test]
    async fn replay_flush_and_idempotence() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(InMemory::new());
        let index = Arc::new(MemoryIndex::default());
        let t = TenantId::new("t1").unwrap();
        {
            let ing = open(dir.path(), store.clone(), index.clone());
            assert_eq!(ing.write(&batch("t1", 1, 5)).await.unwrap(), 1);
            assert_eq!(ing.write(&batch("t1", 2, 7)).await.unwrap(), 1);
            // The same profile id again is a no-op.
            assert_eq!(ing.write(&batch("t1", 2, 7)).await.unwrap(), 0);
            assert_eq!(ing.write(&batch("t2", 3, 100)).await.unwrap(), 1);
            assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 12);
            // Tenants never see each other's heads.
            assert_eq!(
                total(&ing.snapshot(&TenantId::new("t2").unwrap(), 0, i64::MAX)),
                100
            );
            // Time ranges filter profiles and series.
            assert_eq!(ing.snapshot(&t, 0, 1001).profiles.len(), 1);
        }
        // Crash (no flush): the WAL brings everything back.
        let ing = open(dir.path(), store.clone(), index.clone());
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 12);
        assert_eq!(ing.snapshot(&t, 0, i64::MAX).profiles.len(), 2);

        let blocks = ing.flush(None).await.unwrap();
        assert_eq!(blocks.len(), 2, "one block per tenant");
        assert!(ing.snapshot(&t, 0, i64::MAX).profiles.is_empty());
        let metas = index.blocks("t1", 0, i64::MAX).await.unwrap();
        assert_eq!(metas.len(), 1);
        assert_eq!(metas[0].stats.samples, 2);
        assert_eq!(
            (metas[0].min_time_nanos, metas[0].max_time_nanos),
            (1001, 1002)
        );
        drop(ing);
        // After a flush the WAL is empty.
        let ing = open(dir.path(), store, index);
        assert!(ing.snapshot(&t, 0, i64::MAX).profiles.is_empty());
    }

    #[tokio::test]
    async fn failed_upload_keeps_data_queryable_and_in_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(InMemory::new());
        let index = Arc::new(MemoryIndex::default());
        let t = TenantId::new("t1").unwrap();
        let ing = Ingester::open(
            Config {
                data_dir: dir.path().to_owned(),
                name: "test".into(),
                flush_interval: Duration::from_secs(3600),
                max_head_bytes: 1 << 30,
            },
            Arc::new(ReadOnly(store.clone())),
            index.clone(),
            &mut Registry::default(),
        )
        .unwrap();
        ing.write(&batch("t1", 1, 5)).await.unwrap();
        let err = ing
            .flush(Some(Instant::now() + Duration::from_millis(300)))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::FlushDeadline), "{err}");
        // Still queryable from the frozen head, nothing registered.
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        assert!(index.blocks("t1", 0, i64::MAX).await.unwrap().is_empty());
        drop(ing);
        // And still in the WAL: a restart with a working store flushes it.
        let ing = open(dir.path(), store, index.clone());
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        assert_eq!(ing.flush(None).await.unwrap().len(), 1);
        assert_eq!(index.blocks("t1", 0, i64::MAX).await.unwrap().len(), 1);
    }

    /// A block index that refuses every change until `healthy` is set.
    #[derive(Default)]
    struct FlakyIndex {
        healthy: std::sync::atomic::AtomicBool,
        inner: MemoryIndex,
    }

    #[async_trait::async_trait]
    impl BlockIndex for FlakyIndex {
        async fn add(&self, meta: BlockMeta) -> Result<(), fathom_block::IndexError> {
            if !self.healthy.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(fathom_block::IndexError("metastore unreachable".into()));
            }
            self.inner.add(meta).await
        }
        async fn blocks(
            &self,
            tenant: &str,
            start: i64,
            end: i64,
        ) -> Result<Vec<BlockMeta>, fathom_block::IndexError> {
            self.inner.blocks(tenant, start, end).await
        }
        async fn all(&self) -> Result<Vec<BlockMeta>, fathom_block::IndexError> {
            self.inner.all().await
        }
        async fn remove(
            &self,
            tenant: &str,
            ids: &[String],
        ) -> Result<(), fathom_block::IndexError> {
            self.inner.remove(tenant, ids).await
        }
    }

    #[tokio::test]
    async fn failed_index_update_keeps_the_block_pending_and_in_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(InMemory::new());
        let index = Arc::new(FlakyIndex::default());
        let t = TenantId::new("t1").unwrap();
        let open_flaky = |index: Arc<FlakyIndex>| {
            Ingester::open(
                Config {
                    data_dir: dir.path().to_owned(),
                    name: "test".into(),
                    flush_interval: Duration::from_secs(3600),
                    max_head_bytes: 1 << 30,
                },
                store.clone(),
                index,
                &mut Registry::default(),
            )
            .unwrap()
        };
        let ing = open_flaky(index.clone());
        ing.write(&batch("t1", 1, 5)).await.unwrap();
        let err = ing
            .flush(Some(Instant::now() + Duration::from_millis(300)))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::FlushDeadline), "{err}");
        // Uploaded but not indexed: still served from the frozen head.
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        assert!(index.inner.all().await.unwrap().is_empty());
        drop(ing);
        // The WAL segment was kept: a restart with a reachable index
        // registers the data.
        index
            .healthy
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let ing = open_flaky(index.clone());
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        assert_eq!(ing.flush(None).await.unwrap().len(), 1);
        assert_eq!(
            index.inner.blocks("t1", 0, i64::MAX).await.unwrap().len(),
            1
        );
        assert!(ing.snapshot(&t, 0, i64::MAX).profiles.is_empty());
    }

    /// An object store whose writes fail.
    #[derive(Debug)]
    struct ReadOnly(Arc<InMemory>);

    impl std::fmt::Display for ReadOnly {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("read-only")
        }
    }

    fn refused() -> object_store::Error {
        object_store::Error::Generic {
            store: "read-only",
            source: "the store is down".into(),
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for ReadOnly {
        async fn put_opts(
            &self,
            _: &object_store::path::Path,
            _: object_store::PutPayload,
            _: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            Err(refused())
        }
        async fn put_multipart_opts(
            &self,
            _: &object_store::path::Path,
            _: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            Err(refused())
        }
        async fn get_opts(
            &self,
            l: &object_store::path::Path,
            o: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.0.get_opts(l, o).await
        }
        fn delete_stream(
            &self,
            l: futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>
        {
            self.0.delete_stream(l)
        }
        fn list(
            &self,
            p: Option<&object_store::path::Path>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.0.list(p)
        }
        async fn list_with_delimiter(
            &self,
            p: Option<&object_store::path::Path>,
        ) -> object_store::Result<object_store::ListResult> {
            self.0.list_with_delimiter(p).await
        }
        async fn copy_opts(
            &self,
            _: &object_store::path::Path,
            _: &object_store::path::Path,
            _: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            Err(refused())
        }
    }
}
