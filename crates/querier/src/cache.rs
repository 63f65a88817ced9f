//! A read-through cache of block files in front of the object store: a
//! `foyer` hybrid cache (memory, then a disk directory) of whole objects.
//!
//! Block files are immutable — written once under a fresh block id, never
//! rewritten — so a cached copy never goes stale; a deleted block's copy is
//! simply never asked for again and ages out. Only `*.parquet` files up to
//! `max_object_bytes` are cached; everything else (meta.json, writes,
//! listings, conditional reads) passes straight through.
//!
//! ```text
//!  DataFusion / block reader ── get_opts, get_ranges, head ──► CachedStore
//!      hit:  memory ─► disk ─► slice the cached object
//!      miss: one GET of the whole object ─► cache ─► slice
//! ```
//!
//! A whole-object GET on a miss costs one request where a Parquet reader
//! issues several range requests (footer, page index, column chunks), and a
//! query reads most of a samples file anyway.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Buf, BufMut, Bytes};
use foyer::{
    BlockEngineConfig, DeviceBuilder, EstimatedSize, FsDeviceBuilder, HybridCache,
    HybridCacheBuilder, Source, StorageFilter,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, GetResultPayload, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
    Result,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The disk tier writes in blocks of this size; an entry must fit in one.
const DISK_BLOCK_BYTES: usize = 16 << 20;
/// Larger objects are cached in memory only.
const DISK_MAX_ENTRY_BYTES: usize = DISK_BLOCK_BYTES - (64 << 10);

/// How the querier caches block files.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Bytes of block files kept in memory (0: no cache at all).
    pub memory_bytes: usize,
    /// Bytes of block files kept on disk under `dir` (0: memory only).
    pub disk_bytes: usize,
    /// Where the disk tier lives.
    pub dir: PathBuf,
    /// Larger objects are not cached (objects over 16 MiB - 64 KiB are
    /// cached in memory only).
    pub max_object_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            memory_bytes: 256 << 20,
            disk_bytes: 2 << 30,
            dir: PathBuf::from("data/cache"),
            max_object_bytes: 64 << 20,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabel {
    tier: &'static str,
}

#[derive(Clone, Default)]
struct Metrics {
    hits: Family<TierLabel, Counter>,
    misses: Counter,
    fetched_bytes: Counter,
    uncached: Counter,
}

/// One cached object: what a `GetResult` needs besides the bytes.
#[derive(Clone, Debug, PartialEq)]
struct Object {
    last_modified_ms: i64,
    e_tag: Option<String>,
    bytes: Bytes,
}

impl foyer::Code for Object {
    fn encode(&self, w: &mut impl std::io::Write) -> foyer::Result<()> {
        let etag = self.e_tag.as_deref().unwrap_or("");
        let mut head = Vec::with_capacity(21 + etag.len());
        head.put_i64_le(self.last_modified_ms);
        head.put_u8(u8::from(self.e_tag.is_some()));
        head.put_u32_le(etag.len() as u32);
        head.put_slice(etag.as_bytes());
        head.put_u64_le(self.bytes.len() as u64);
        w.write_all(&head).map_err(foyer::Error::io_error)?;
        w.write_all(&self.bytes).map_err(foyer::Error::io_error)
    }

    fn decode(r: &mut impl std::io::Read) -> foyer::Result<Self> {
        let mut fixed = [0u8; 13];
        r.read_exact(&mut fixed).map_err(foyer::Error::io_error)?;
        let mut f = &fixed[..];
        let last_modified_ms = f.get_i64_le();
        let has_etag = f.get_u8() == 1;
        let etag_len = f.get_u32_le() as usize;
        let mut etag = vec![0u8; etag_len];
        r.read_exact(&mut etag).map_err(foyer::Error::io_error)?;
        let mut len = [0u8; 8];
        r.read_exact(&mut len).map_err(foyer::Error::io_error)?;
        let mut bytes = vec![0u8; u64::from_le_bytes(len) as usize];
        r.read_exact(&mut bytes).map_err(foyer::Error::io_error)?;
        Ok(Object {
            last_modified_ms,
            e_tag: has_etag.then(|| String::from_utf8_lossy(&etag).into_owned()),
            bytes: Bytes::from(bytes),
        })
    }

    fn estimated_size(&self) -> usize {
        21 + self.e_tag.as_ref().map_or(0, String::len) + self.bytes.len()
    }
}

/// An [`ObjectStore`] that serves block files from a hybrid cache.
pub struct CachedStore {
    inner: Arc<dyn ObjectStore>,
    cache: HybridCache<String, Object>,
    max_object_bytes: u64,
    /// Paths found too large to cache (bounded): later reads go straight
    /// to the store instead of fetching the whole object first.
    too_large: parking_lot::Mutex<std::collections::HashSet<String>>,
    metrics: Metrics,
}

/// At most this many too-large paths are remembered.
const TOO_LARGE_PATHS: usize = 4096;

impl fmt::Debug for CachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CachedStore({})", self.inner)
    }
}

impl fmt::Display for CachedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CachedStore({})", self.inner)
    }
}

/// Opening the disk tier failed.
#[derive(Debug, thiserror::Error)]
#[error("opening the block cache in {dir}: {message}")]
pub struct CacheError {
    dir: String,
    message: String,
}

impl CachedStore {
    /// Wraps `inner`, or returns it unchanged when the cache is disabled
    /// (`memory_bytes` 0). Registers `fathom_querier_block_file_cache_*`.
    pub async fn wrap(
        inner: Arc<dyn ObjectStore>,
        cfg: &CacheConfig,
        registry: &mut Registry,
    ) -> std::result::Result<Arc<dyn ObjectStore>, CacheError> {
        if cfg.memory_bytes == 0 {
            return Ok(inner);
        }
        let err = |e: &dyn fmt::Display| CacheError {
            dir: cfg.dir.display().to_string(),
            message: e.to_string(),
        };
        let builder = HybridCacheBuilder::new()
            .with_name("fathom-blocks")
            .memory(cfg.memory_bytes)
            .with_weighter(|k: &String, v: &Object| k.len() + v.bytes.len() + 64)
            .storage();
        let cache = if cfg.disk_bytes > 0 {
            std::fs::create_dir_all(&cfg.dir).map_err(|e| err(&e))?;
            let device = FsDeviceBuilder::new(&cfg.dir)
                .with_capacity(cfg.disk_bytes)
                .build()
                .map_err(|e| err(&e))?;
            builder
                .with_engine_config(
                    BlockEngineConfig::new(device)
                        .with_block_size(DISK_BLOCK_BYTES)
                        .with_admission_filter(
                            StorageFilter::new()
                                .with_condition(EstimatedSize::new(..DISK_MAX_ENTRY_BYTES)),
                        ),
                )
                .build()
                .await
        } else {
            builder.build().await
        }
        .map_err(|e| err(&e))?;
        let metrics = Metrics::default();
        let r = registry.sub_registry_with_prefix("fathom_querier_block_file_cache");
        r.register(
            "hits",
            "Block file reads served from the cache, by tier (memory, disk)",
            metrics.hits.clone(),
        );
        r.register(
            "misses",
            "Block file reads that fetched the object from the object store",
            metrics.misses.clone(),
        );
        r.register(
            "fetched_bytes",
            "Bytes of block files fetched from the object store on misses",
            metrics.fetched_bytes.clone(),
        );
        r.register(
            "uncached_reads",
            "Reads passed through uncached (not a block file, too large, conditional)",
            metrics.uncached.clone(),
        );
        Ok(Arc::new(CachedStore {
            inner,
            cache,
            max_object_bytes: cfg.max_object_bytes,
            too_large: Default::default(),
            metrics,
        }))
    }

    fn cacheable(location: &Path, options: &GetOptions) -> bool {
        location.as_ref().ends_with(".parquet")
            && options.if_match.is_none()
            && options.if_none_match.is_none()
            && options.if_modified_since.is_none()
            && options.if_unmodified_since.is_none()
            && options.version.is_none()
    }

    /// The whole object, from the cache or fetched into it; `None` when it
    /// is too large to cache.
    async fn object(&self, location: &Path) -> Result<Option<Object>> {
        let key = location.to_string();
        if self.too_large.lock().contains(&key) {
            return Ok(None);
        }
        match self.cache.get(&key).await {
            Ok(Some(e)) => {
                let tier = match e.source() {
                    Source::Disk => "disk",
                    _ => "memory",
                };
                self.metrics.hits.get_or_create(&TierLabel { tier }).inc();
                return Ok(Some(e.value().clone()));
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, path = %location, "block cache read failed"),
        }
        self.metrics.misses.inc();
        let r = self.inner.get_opts(location, GetOptions::default()).await?;
        if r.meta.size > self.max_object_bytes {
            let mut t = self.too_large.lock();
            if t.len() >= TOO_LARGE_PATHS {
                t.clear();
            }
            t.insert(key);
            return Ok(None);
        }
        let meta = r.meta.clone();
        let bytes = r.bytes().await?;
        self.metrics.fetched_bytes.inc_by(bytes.len() as u64);
        let obj = Object {
            last_modified_ms: meta.last_modified.timestamp_millis(),
            e_tag: meta.e_tag,
            bytes,
        };
        self.cache.insert(key, obj.clone());
        Ok(Some(obj))
    }

    fn meta(location: &Path, o: &Object) -> ObjectMeta {
        ObjectMeta {
            location: location.clone(),
            last_modified: chrono::DateTime::from_timestamp_millis(o.last_modified_ms)
                .unwrap_or_default(),
            size: o.bytes.len() as u64,
            e_tag: o.e_tag.clone(),
            version: None,
        }
    }

    /// The bytes of `range`, clipped at the end like the stores clip it.
    fn slice(o: &Object, range: Range<u64>) -> Result<Bytes> {
        let r = GetRange::Bounded(range)
            .as_range(o.bytes.len() as u64)
            .map_err(range_error)?;
        Ok(o.bytes.slice(r.start as usize..r.end as usize))
    }
}

fn range_error(e: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
    object_store::Error::Generic {
        store: "block cache",
        source: Box::new(e),
    }
}

#[async_trait]
impl ObjectStore for CachedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if !Self::cacheable(location, &options) {
            self.metrics.uncached.inc();
            return self.inner.get_opts(location, options).await;
        }
        let Some(o) = self.object(location).await? else {
            self.metrics.uncached.inc();
            return self.inner.get_opts(location, options).await;
        };
        let len = o.bytes.len() as u64;
        let range = match &options.range {
            None => 0..len,
            Some(r) => r.as_range(len).map_err(|e| object_store::Error::Generic {
                store: "block cache",
                source: Box::new(e),
            })?,
        };
        let meta = Self::meta(location, &o);
        let body = if options.head {
            Bytes::new()
        } else {
            Self::slice(&o, range.clone())?
        };
        Ok(GetResult {
            payload: GetResultPayload::Stream(
                futures::stream::once(async move { Ok(body) }).boxed(),
            ),
            meta,
            range,
            attributes: Default::default(),
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        if Self::cacheable(location, &GetOptions::default())
            && let Some(o) = self.object(location).await?
        {
            return ranges.iter().map(|r| Self::slice(&o, r.clone())).collect();
        }
        self.metrics.uncached.inc();
        self.inner.get_ranges(location, ranges).await
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
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};
    use prometheus_client::encoding::text::encode;

    /// Sum of the samples of `name` whose line contains `with`.
    fn metric_with(reg: &Registry, name: &str, with: &str) -> f64 {
        let mut s = String::new();
        encode(&mut s, reg).unwrap();
        s.lines()
            .filter(|l| l.starts_with(name) && l.contains(with))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn metric(reg: &Registry, name: &str) -> f64 {
        metric_with(reg, name, "")
    }

    async fn setup(
        memory: usize,
        disk: usize,
    ) -> (
        tempfile::TempDir,
        Arc<InMemory>,
        Arc<dyn ObjectStore>,
        Registry,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let inner = Arc::new(InMemory::new());
        let mut reg = Registry::default();
        let store = CachedStore::wrap(
            inner.clone(),
            &CacheConfig {
                memory_bytes: memory,
                disk_bytes: disk,
                dir: dir.path().join("cache"),
                max_object_bytes: 64 << 10,
            },
            &mut reg,
        )
        .await
        .unwrap();
        (dir, inner, store, reg)
    }

    #[tokio::test]
    async fn serves_ranges_from_one_fetch_and_counts_hits() {
        let (_d, inner, store, reg) = setup(1 << 20, 0).await;
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let p = Path::from("t/b1/samples.parquet");
        inner.put(&p, PutPayload::from(data.clone())).await.unwrap();

        let r = store.get_range(&p, 100..200).await.unwrap();
        assert_eq!(&r[..], &data[100..200]);
        let rs = store.get_ranges(&p, &[0..10, 9990..10_000]).await.unwrap();
        assert_eq!(&rs[0][..], &data[0..10]);
        assert_eq!(&rs[1][..], &data[9990..10_000]);
        let suffix = store
            .get_opts(
                &p,
                GetOptions {
                    range: Some(GetRange::Suffix(8)),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(suffix.range, 9992..10_000);
        assert_eq!(&suffix.bytes().await.unwrap()[..], &data[9992..]);
        assert_eq!(store.head(&p).await.unwrap().size, 10_000);
        assert_eq!(metric(&reg, "fathom_querier_block_file_cache_misses"), 1.0);
        assert_eq!(metric(&reg, "fathom_querier_block_file_cache_hits"), 3.0);
        assert_eq!(
            metric(&reg, "fathom_querier_block_file_cache_fetched_bytes"),
            10_000.0
        );
        // Past the end is clipped as the store clips it; a start past the
        // end is an error, not a panic.
        assert_eq!(
            store.get_range(&p, 9_000..10_001).await.ok(),
            inner.get_range(&p, 9_000..10_001).await.ok()
        );
        assert!(store.get_range(&p, 10_001..10_002).await.is_err());
        assert!(inner.get_range(&p, 10_001..10_002).await.is_err());
    }

    #[tokio::test]
    async fn passes_through_what_it_must_not_cache() {
        let (_d, inner, store, reg) = setup(1 << 20, 0).await;
        let meta = Path::from("t/b1/meta.json");
        inner.put(&meta, PutPayload::from("{}")).await.unwrap();
        let big = Path::from("t/b1/big.parquet");
        inner
            .put(&big, PutPayload::from(vec![7u8; 100 << 10]))
            .await
            .unwrap();
        assert_eq!(
            &store.get(&meta).await.unwrap().bytes().await.unwrap()[..],
            b"{}"
        );
        assert_eq!(store.get_range(&big, 0..3).await.unwrap(), vec![7u8; 3]);
        assert_eq!(store.get_range(&big, 0..3).await.unwrap(), vec![7u8; 3]);
        // meta.json once, the big file twice: nothing of either cached.
        assert_eq!(
            metric(&reg, "fathom_querier_block_file_cache_uncached_reads"),
            3.0
        );
        assert_eq!(metric(&reg, "fathom_querier_block_file_cache_hits"), 0.0);
    }

    #[tokio::test]
    async fn evicted_objects_come_back_from_disk() {
        let (_d, inner, store, reg) = setup(128 << 10, 16 << 20).await;
        let paths: Vec<Path> = (0..4)
            .map(|i| Path::from(format!("t/b{i}/samples.parquet")))
            .collect();
        for (i, p) in paths.iter().enumerate() {
            inner
                .put(p, PutPayload::from(vec![i as u8; 60 << 10]))
                .await
                .unwrap();
        }
        // Memory holds two of the four; the others are written to disk on
        // eviction (asynchronously), so churn until a read hits the disk.
        for _ in 0..50 {
            for (i, p) in paths.iter().enumerate() {
                let b = store.get_range(p, 0..(60 << 10)).await.unwrap();
                assert!(b.iter().all(|x| *x == i as u8), "object {i} intact");
            }
            if metric_with(
                &reg,
                "fathom_querier_block_file_cache_hits",
                "tier=\"disk\"",
            ) > 0.0
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("no read was served from the disk tier");
    }

    #[test]
    fn object_codec_round_trips() {
        use foyer::Code;
        for e_tag in [None, Some("\"abc\"".to_string()), Some(String::new())] {
            let o = Object {
                last_modified_ms: 1_700_000_000_123,
                e_tag,
                bytes: Bytes::from_static(b"parquet bytes"),
            };
            let mut buf = Vec::new();
            o.encode(&mut buf).unwrap();
            assert_eq!(buf.len(), o.estimated_size());
            assert_eq!(Object::decode(&mut &buf[..]).unwrap(), o);
        }
    }
}
