//! Test fixtures shared with the edges' tests (`fathom-query-api`, behind
//! the `test-util` feature): the real corpus written as rolled-up blocks.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use fathom_block::{BlockData, DAY_NANOS, HOUR_NANOS, ProfileRow, SamplesBuilder};
use fathom_model::{Id, IdHasher, Labels, Profile, Symbols};
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

const TESTDATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/testdata/pprof"
);

/// Small pprof files of the corpus, normalized (each may hold several
/// profile types).
fn corpus() -> Vec<(Vec<Profile>, Symbols)> {
    let manifest = std::fs::read_to_string(format!("{TESTDATA}/MANIFEST.tsv"))
        .expect("the corpus manifest (shared/testdata)");
    let mut out = Vec::new();
    for line in manifest.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 17 || !f[4].starts_with("pprof-proto") || !f[16].is_empty() {
            continue;
        }
        let Ok(size) = f[3].parse::<u64>() else {
            continue;
        };
        if size > 40_000 {
            continue;
        }
        let Ok(bytes) = std::fs::read(format!("{TESTDATA}/{}", f[0])) else {
            continue;
        };
        let Ok(p) = fathom_pprof::decode(&bytes, &fathom_pprof::Limits::default()) else {
            continue;
        };
        let Ok(n) = fathom_pprof::normalize(&p, &Default::default()) else {
            continue;
        };
        if !n.profiles.is_empty() {
            out.push((n.profiles, n.symbols));
        }
    }
    assert!(out.len() >= 20, "only {} corpus files", out.len());
    out
}

/// The corpus replayed as two instances of one service every 5 minutes
/// for 50 hours from 22:00 on day 0, written as one compacted block per
/// UTC day with hour and day rollups.
pub async fn history(store: &dyn ObjectStore) -> (Vec<fathom_block::BlockMeta>, Vec<Profile>) {
    let files = corpus();
    let t0 = 20_000 * DAY_NANOS - 2 * HOUR_NANOS;
    let step = 5 * 60 * 1_000_000_000i64;
    let mut all: Vec<Profile> = Vec::new();
    let mut symbols = Symbols::default();
    for (_, s) in &files {
        symbols.merge(s);
    }
    for k in 0..600i64 {
        for instance in ["a", "b"] {
            let (profiles, _) = &files[(k as usize * 7 + instance.len()) % files.len()];
            for p in profiles {
                let mut p = p.clone();
                // Mid-second times, so no profile sits on a bucket edge.
                p.time_nanos = t0 + k * step + 1_234_567;
                let mut labels = Labels::new();
                labels.insert("service_name", "svc");
                labels.insert("instance", instance);
                p.labels = labels;
                p.id = IdHasher::new("test-profile")
                    .i64(p.time_nanos)
                    .str(instance)
                    .str(&p.profile_type.to_string())
                    .finish();
                all.push(p);
            }
        }
    }
    let mut by_day: BTreeMap<i64, Vec<&Profile>> = BTreeMap::new();
    for p in &all {
        by_day
            .entry(p.time_nanos.div_euclid(DAY_NANOS))
            .or_default()
            .push(p);
    }
    let mut metas = Vec::new();
    for profiles in by_day.values() {
        let mut sb = SamplesBuilder::default();
        let mut series: HashMap<Id, fathom_block::SeriesRow> = HashMap::new();
        let mut rows = Vec::new();
        for p in profiles {
            sb.push_profile(p);
            let sid = p.series_id();
            series
                .entry(sid)
                .or_insert_with(|| fathom_block::SeriesRow::of(p))
                .include(p.time_nanos);
            rows.push(ProfileRow::of(p, sid));
        }
        let data = BlockData {
            tenant: "t".into(),
            source: "test".into(),
            level: 2,
            compacted_from: Vec::new(),
            series: series.into_values().collect(),
            profiles: rows,
            samples: vec![sb.finish()],
            symbols: std::sync::Arc::new(symbols.clone()),
            rollup_widths_nanos: vec![HOUR_NANOS, DAY_NANOS],
        };
        let (meta, files) = fathom_block::encode_block(&data).unwrap();
        assert!(files.iter().any(|f| f.0 == fathom_block::files::ROLLUP));
        fathom_block::write_block(store, &meta, files)
            .await
            .unwrap();
        metas.push(meta);
    }
    (metas, all)
}

/// What [`ReadHook`] calls before a read of object bytes: the object and
/// the byte ranges asked for (none for a whole-object read).
pub type OnRead =
    Box<dyn Fn(&Path, &[Range<u64>]) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// A store that awaits `on_read` before every read of object bytes (not
/// before a `head`) and forwards everything to `inner`: tests watch or
/// park a query's reads with it.
pub struct ReadHook {
    pub inner: Arc<dyn ObjectStore>,
    pub on_read: OnRead,
}

impl std::fmt::Debug for ReadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadHook({:?})", self.inner)
    }
}

impl std::fmt::Display for ReadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "read_hook({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for ReadHook {
    async fn put_opts(&self, l: &Path, p: PutPayload, o: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(l, p, o).await
    }
    async fn put_multipart_opts(
        &self,
        l: &Path,
        o: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(l, o).await
    }
    async fn get_opts(&self, l: &Path, o: GetOptions) -> Result<GetResult> {
        if !o.head {
            match &o.range {
                Some(GetRange::Bounded(r)) => (self.on_read)(l, std::slice::from_ref(r)).await,
                _ => (self.on_read)(l, &[]).await,
            }
        }
        self.inner.get_opts(l, o).await
    }
    async fn get_ranges(&self, l: &Path, r: &[Range<u64>]) -> Result<Vec<Bytes>> {
        (self.on_read)(l, r).await;
        self.inner.get_ranges(l, r).await
    }
    fn delete_stream(
        &self,
        l: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(l)
    }
    fn list(&self, p: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(p)
    }
    fn list_with_offset(
        &self,
        p: Option<&Path>,
        o: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list_with_offset(p, o)
    }
    async fn list_with_delimiter(&self, p: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(p).await
    }
    async fn copy_opts(&self, f: &Path, t: &Path, o: CopyOptions) -> Result<()> {
        self.inner.copy_opts(f, t, o).await
    }
    async fn rename_opts(&self, f: &Path, t: &Path, o: RenameOptions) -> Result<()> {
        self.inner.rename_opts(f, t, o).await
    }
}
