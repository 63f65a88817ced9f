//! The compactor: merges the level-0 blocks that ingesters cut (three per
//! write window with RF=3) into one block per tenant and window, dropping
//! replica copies of a profile and merging symbol tables; merges those into
//! larger windows at higher levels; applies per-tenant retention; deletes
//! replaced blocks' files after a delay.
//!
//! ```text
//!  plan: index ──► blocks by (tenant, level, window) ──► jobs with ≥ 2 blocks
//!  job:  lease ──► read sources ──► dedupe by profile id ──► write block
//!        (meta.json last) ──► index: replace sources by it (one atomic step)
//!  later: sources' files deleted after `delete_delay`, then purged
//! ```
//!
//! A compactor killed mid-job leaves at most an unregistered block: the
//! index still lists the sources, so queries see the sources and nothing
//! of the half-written result. The block id is derived from the job's
//! sources, so the job taken again overwrites the same files instead of
//! leaking a second copy.

pub mod import;
mod runs;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, BooleanArray, FixedSizeBinaryArray, RecordBatch};
use fathom_block::{BlockData, BlockMeta, ProfileRow, SampleFile, SeriesRow, block_dir, columns};
use fathom_model::{Id, IdHasher, IdSet, Symbols};
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why the compaction index (the metastore) could not answer or record a
/// change: the operation, and the index's own error as the source.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct CompactionIndexError {
    /// What was asked, e.g. "listing blocks".
    pub what: &'static str,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl CompactionIndexError {
    pub fn new(
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        CompactionIndexError {
            what,
            source: source.into(),
        }
    }
}

/// What the compactor needs of the metastore.
#[async_trait::async_trait]
pub trait CompactionIndex: Send + Sync + 'static {
    async fn all(&self) -> Result<Vec<BlockMeta>, CompactionIndexError>;
    /// Adds `add` and removes `remove` of `tenant` in one step; removed
    /// blocks become pending deletion.
    async fn replace(
        &self,
        tenant: &str,
        add: Vec<BlockMeta>,
        remove: Vec<String>,
    ) -> Result<(), CompactionIndexError>;
    /// Removed blocks and when they were removed (unix ms).
    async fn pending_deletions(&self) -> Result<Vec<(BlockMeta, i64)>, CompactionIndexError>;
    /// Forgets pending deletions whose files are gone.
    async fn purge(&self, tenant: &str, ids: Vec<String>) -> Result<(), CompactionIndexError>;
    /// A lease on `job` for `owner` (true when granted or renewed).
    async fn acquire(
        &self,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, CompactionIndexError>;
    async fn release(&self, job: &str, owner: &str) -> Result<(), CompactionIndexError>;
}

/// Fills in, before a merged block is written, the functions of locations
/// that arrived as (mapping with a build id, address) only: the server's
/// symbolizer (`fathom-symbols`), so that later queries read names from
/// the block. Locations keep their ids; what it cannot resolve in its
/// bounded time stays an address (and is symbolized at query time).
#[async_trait::async_trait]
pub trait BlockSymbolizer: Send + Sync + 'static {
    async fn symbolize(&self, tenant: &fathom_model::TenantId, symbols: &mut Symbols);
}

/// Compactor settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Instance name: lease owner and the new blocks' source.
    pub name: String,
    /// Window of each level's output: `windows[0]` for level-0 → 1, etc.
    pub windows: Vec<Duration>,
    /// Retention for tenants without their own; `None` keeps forever.
    pub retention: Option<Duration>,
    pub tenant_retention: HashMap<String, Duration>,
    /// Retention from the tenants file, consulted first on every round (so
    /// that a reloaded file applies without a restart).
    pub retention_overrides: Option<RetentionOverrides>,
    /// Time between removing a block from the index and deleting its files
    /// (queries planned before the removal may still read them).
    pub delete_delay: Duration,
    /// Time between planning rounds.
    pub interval: Duration,
    pub lease_ttl: Duration,
    /// How long a window's newest level-0 block must have been there
    /// before the window's level-0 blocks are merged: the blocks of one
    /// cut (one per replica that stored a part) arrive within about a
    /// second, and merged together they cost one rewrite of the window's
    /// block instead of one each. Zero merges at once.
    pub settle: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: "compactor".into(),
            windows: vec![Duration::from_secs(3600), Duration::from_secs(24 * 3600)],
            retention: None,
            tenant_retention: HashMap::new(),
            retention_overrides: None,
            delete_delay: Duration::from_secs(15 * 60),
            interval: Duration::from_secs(60),
            lease_ttl: Duration::from_secs(10 * 60),
            settle: Duration::ZERO,
        }
    }
}

/// A tenant's retention, if something else (the tenants file) sets one.
pub type RetentionOf = dyn Fn(&str) -> Option<Duration> + Send + Sync;

/// A tenant's retention from elsewhere (the tenants file), if it sets one.
#[derive(Clone)]
pub struct RetentionOverrides(pub Arc<RetentionOf>);

impl std::fmt::Debug for RetentionOverrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetentionOverrides")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("block index: {0}")]
    Index(#[from] CompactionIndexError),
    #[error(transparent)]
    Block(#[from] fathom_block::Error),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("compaction task: {0}")]
    Task(String),
}

#[derive(Clone, Default)]
struct Metrics {
    jobs: Counter,
    failures: Counter,
    blocks_in: Counter,
    blocks_out: Counter,
    duplicate_profiles: Counter,
    rows_not_read: Counter,
    symbol_tables_not_read: Counter,
    bytes_in: Counter,
    bytes_out: Counter,
    retention_removed: Counter,
    deleted: Counter,
    pending: Gauge,
}

/// One unit of work: blocks of one tenant, level and window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub tenant: String,
    pub level: u32,
    pub window_start_nanos: i64,
    pub blocks: Vec<BlockMeta>,
}

impl Job {
    /// The lease key.
    pub fn key(&self) -> String {
        format!(
            "compact/{}/{}/{}",
            self.tenant, self.level, self.window_start_nanos
        )
    }
}

/// Groups blocks into jobs: a level's blocks fall in windows of that
/// level's size (by their first timestamp); a window with two or more
/// blocks is a job whose output is one level higher.
///
/// The level-0 blocks of a window wait while they are still arriving:
/// until its newest is `settle` old at `now_ms`, or its oldest
/// [`SETTLE_LIMIT`] times that (a window whose cuts keep coming is still
/// merged). A level-0 block alone in a window that has closed (and is
/// quiet, below) is a job of its own, so that it gets its rollup and its
/// place in the levels without waiting for a sibling that will not come.
///
/// What a job rewrites is bounded while its window grows. The blocks
/// merged into a level whose window is open (today, for the day level)
/// stay in the windows they were merged in (the day's hour blocks in
/// their hours), so a later cut of an hour merges in its hour, not into
/// the day's block. The job of a window that is open, or closed with
/// blocks still arriving (a backfill), takes its new blocks and only the
/// merged blocks no larger than what it takes
/// ([`growing_window_inputs`]): a window's bytes are rewritten about
/// log2(cuts) times while it grows, not once a cut. Once a window has
/// closed and is quiet (no block joined it for a twelfth of its length,
/// [`quiet`]), its blocks are merged into one. A window's job waits while
/// one of its lower windows has a job or blocks still settling, so that
/// it takes their results at once.
///
/// A block that crosses its own level's window (late or early profiles
/// in one cut, or a head that spans days) joins the first higher level
/// whose window holds it, so it is still merged with its replicas and
/// neighbours instead of waiting forever; one that no window holds is
/// grouped by the largest window its first timestamp falls in, and the
/// result is a top-level block. Top-level blocks are grouped like the top
/// level's inputs: one alone stays as it is, and a block that arrives
/// late for its closed window (a replica registered after its siblings
/// were merged) is merged into it. Below the top level, a block alone in
/// its window whose siblings were merged already joins their result's
/// group one level up, for the same reason.
pub fn plan(blocks: &[BlockMeta], windows: &[Duration], now_ms: i64, settle: Duration) -> Vec<Job> {
    let mut groups: BTreeMap<(String, u32, i64), Vec<BlockMeta>> = BTreeMap::new();
    let Some(top) = windows.len().checked_sub(1) else {
        return Vec::new();
    };
    let window_of = |level: usize, min: i64| {
        let w = (windows[level].as_nanos() as i64).max(1);
        let start = min.div_euclid(w) * w;
        (start, start.saturating_add(w))
    };
    let now_nanos = now_ms.saturating_mul(1_000_000);
    let open = |level: usize, min: i64| window_of(level, min).1 > now_nanos;
    let settling = settling(blocks, |min| window_of(0, min).0, now_ms, settle);
    for b in blocks {
        if b.level == 0 && settling.contains(&(b.tenant.as_str(), window_of(0, b.min_time_nanos).0))
        {
            continue;
        }
        // A top-level block is grouped with the top level's inputs of its
        // window, so a late block (a replica registered after its
        // siblings were merged, a backfill) still folds into it.
        let own = (b.level as usize).min(top);
        let fits = |l: usize| b.max_time_nanos < window_of(l, b.min_time_nanos).1;
        let mut level = (own..windows.len()).find(|&l| fits(l)).unwrap_or(top);
        // The output of a lower level's job, while its own window is
        // open, stays where it was merged: the next blocks of that
        // window merge into it.
        if level == own
            && b.level as usize == own
            && own > 0
            && open(own, b.min_time_nanos)
            && fits(own - 1)
        {
            level = own - 1;
        }
        let (start, _) = window_of(level, b.min_time_nanos);
        groups
            .entry((b.tenant.clone(), level as u32, start))
            .or_default()
            .push(b.clone());
    }
    // A level-N block alone in its window below the top level, whose
    // window's other blocks were merged already (a replica registered
    // after its siblings' job ran), joins the group of their result one
    // level up, so it is merged into it instead of staying alone for ever.
    let lone: Vec<(String, u32, i64)> = groups
        .iter()
        .filter(|(k, v)| v.len() == 1 && v[0].level == k.1 && (k.1 as usize) < top)
        .map(|(k, _)| k.clone())
        .collect();
    for key in lone {
        let (tenant, level, start) = key.clone();
        let up = level as usize + 1;
        let Some(min) = groups.get(&key).map(|v| v[0].min_time_nanos) else {
            continue;
        };
        let up_key = (tenant, up as u32, window_of(up, min).0);
        let siblings_merged = groups.get(&up_key).is_some_and(|v| {
            v.iter().any(|o| {
                o.level as usize == up && window_of(level as usize, o.min_time_nanos).0 == start
            })
        });
        if siblings_merged && let Some(late) = groups.remove(&key) {
            groups.entry(up_key).or_default().extend(late);
        }
    }
    // A closed window is merged whole once it is quiet (a backfill into
    // past days is merged like an open window while it streams in).
    let quiet_ms = |level: usize| quiet(windows[level], settle);
    let jobs: Vec<Job> = groups
        .into_iter()
        .filter_map(|((tenant, level, window_start_nanos), blocks)| {
            let newest = blocks
                .iter()
                .map(|b| b.created_at_ms)
                .max()
                .unwrap_or(i64::MIN);
            let whole = window_of(level as usize, window_start_nanos).1 <= now_nanos
                && now_ms.saturating_sub(newest) >= quiet_ms(level as usize);
            let mut blocks = if whole {
                blocks
            } else {
                growing_window_inputs(blocks, level)
            };
            let lone =
                whole && (level as usize) < top && blocks.len() == 1 && blocks[0].level == level;
            (blocks.len() >= 2 || lone).then(|| {
                blocks.sort_by(|a, b| a.id.cmp(&b.id));
                Job {
                    tenant,
                    level,
                    window_start_nanos,
                    blocks,
                }
            })
        })
        .collect();
    // A window's job waits for its lower windows' jobs and settling
    // blocks, so that it merges their results with its own once instead
    // of running twice.
    let busy: HashSet<(String, u32, i64)> = jobs
        .iter()
        .filter(|j| (j.level as usize) < top)
        .map(|j| {
            (
                j.tenant.as_str(),
                j.level as usize + 1,
                j.window_start_nanos,
            )
        })
        // Settling blocks are level 0: their hour's day waits.
        .chain(settling.iter().map(|&(tenant, start)| (tenant, 1, start)))
        .filter(|&(_, up, _)| up <= top)
        .map(|(tenant, up, start)| (tenant.to_owned(), up as u32, window_of(up, start).0))
        .collect();
    jobs.into_iter()
        .filter(|j| !busy.contains(&(j.tenant.clone(), j.level, j.window_start_nanos)))
        .collect()
}

/// How long no block must have joined a closed window before it is merged
/// whole, in milliseconds: a twelfth of the window (5 minutes for an
/// hour, 2 hours for a day), and at least [`SETTLE_LIMIT`] settles. A
/// backfill's cuts come more often than that, so that a stream into a
/// past window is not mistaken for its end (each whole merge would
/// rewrite the window).
fn quiet(window: Duration, settle: Duration) -> i64 {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    (ms(window) / 12).max(ms(settle).saturating_mul(i64::from(SETTLE_LIMIT)))
}

/// The inputs of the job of a window still growing (open, or closed with
/// blocks still arriving): its new blocks (of the window's own level or
/// below), and then, smallest first, the blocks merged in it
/// before that are no larger than what the job has taken so far. A block
/// is thus rewritten only when what joins it is at least as large as
/// itself, about log2(cuts) times over a window's life instead of once a
/// cut, and a window holds about log2(cuts) merged blocks until it closes.
/// No new block: nothing to merge.
fn growing_window_inputs(blocks: Vec<BlockMeta>, level: u32) -> Vec<BlockMeta> {
    let (mut inputs, mut merged): (Vec<BlockMeta>, Vec<BlockMeta>) =
        blocks.into_iter().partition(|b| b.level <= level);
    if inputs.is_empty() {
        return inputs;
    }
    let mut taken: u64 = inputs.iter().map(|b| b.stats.bytes).sum();
    merged.sort_by_key(|b| b.stats.bytes);
    for b in merged {
        if b.stats.bytes > taken {
            break;
        }
        taken = taken.saturating_add(b.stats.bytes);
        inputs.push(b);
    }
    inputs
}

/// A window's level-0 blocks wait at most this many settles while new
/// ones keep arriving.
pub const SETTLE_LIMIT: u32 = 4;

/// The (tenant, level-0 window start) whose level-0 blocks are still
/// arriving at `now_ms`: the newest is younger than `settle`, and the
/// oldest younger than [`SETTLE_LIMIT`] settles.
fn settling(
    blocks: &[BlockMeta],
    window_start: impl Fn(i64) -> i64,
    now_ms: i64,
    settle: Duration,
) -> HashSet<(&str, i64)> {
    if settle.is_zero() {
        return HashSet::new();
    }
    let settle_ms = i64::try_from(settle.as_millis()).unwrap_or(i64::MAX);
    let mut created: HashMap<(&str, i64), (i64, i64)> = HashMap::new();
    for b in blocks.iter().filter(|b| b.level == 0) {
        let (oldest, newest) = created
            .entry((b.tenant.as_str(), window_start(b.min_time_nanos)))
            .or_insert((i64::MAX, i64::MIN));
        *oldest = (*oldest).min(b.created_at_ms);
        *newest = (*newest).max(b.created_at_ms);
    }
    created
        .into_iter()
        .filter(|(_, (oldest, newest))| {
            now_ms.saturating_sub(*newest) < settle_ms
                && now_ms.saturating_sub(*oldest)
                    < settle_ms.saturating_mul(i64::from(SETTLE_LIMIT))
        })
        .map(|(key, _)| key)
        .collect()
}

/// A UUID-shaped id derived from the sources: the same job always writes
/// the same block.
fn derived_id(sources: &[BlockMeta]) -> String {
    let mut h = IdHasher::new("compacted-block");
    for b in sources {
        h.str(&b.id);
    }
    let b = h.finish().0;
    uuid::Builder::from_custom_bytes(b).into_uuid().to_string()
}

fn id_col<'a>(b: &'a RecordBatch, name: &str) -> Result<&'a FixedSizeBinaryArray, Error> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<FixedSizeBinaryArray>())
        .ok_or_else(|| Error::Task(format!("samples without {name}")))
}

/// The ids of column `name` of `b`, in place; `None` when it has none.
fn ids_in<'a>(b: &'a RecordBatch, name: &str) -> Option<&'a [[u8; 16]]> {
    id_col(b, name).ok().and_then(fathom_block::id_values)
}

/// What a [`merge`] left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MergeStats {
    /// Copies of profiles an earlier source holds (dropped).
    pub duplicates: u64,
    /// Sample rows of those copies that were not decoded: a source whose
    /// every profile an earlier one gave is not fetched at all (nor its
    /// symbols), and of a partly duplicated one only the new profiles'
    /// rows are decoded (its samples file is still fetched whole).
    pub rows_not_read: u64,
    /// Sources whose symbol tables were not read: none of their
    /// profiles was new, or an earlier source's table holds every stack
    /// the new ones name.
    pub symbol_tables_not_read: u64,
}

/// A compaction's merge, read but not yet encoded: the merged block's
/// series, profiles and symbols, and its sources' samples files, whose
/// rows [`Merged::encode`] merges as it writes them.
pub struct Merged {
    /// The merged block, without its sample rows (`samples` is empty).
    pub data: BlockData,
    pub stats: MergeStats,
    sources: Vec<runs::Source>,
}

impl Merged {
    /// The merged sample rows in the block's order, each profile once,
    /// decoded from the sources' files as they are taken. Sources out of
    /// the block's order give rows out of order.
    pub fn samples(&self) -> Result<impl Iterator<Item = Result<RecordBatch, Error>> + '_, Error> {
        Ok(runs::Merge::new(&self.sources)?.map(|b| b.map_err(Error::from)))
    }

    /// The merged block's files and meta. CPU-heavy: run it off the I/O
    /// runtime. The rows stream from the sources' files through the
    /// merge into the encoder, a batch at a time; only when a source's
    /// rows are out of the block's order (no block this crate or an
    /// ingester writes) are they all held, filtered and sorted.
    pub fn encode(mut self) -> Result<fathom_block::EncodedBlock, Error> {
        match fathom_block::encode_sorted_rows(&self.data, runs::Merge::new(&self.sources)?) {
            Err(fathom_block::Error::Unsorted) => {
                tracing::debug!(
                    "a compaction's source rows are out of the block's order; sorting them"
                );
                self.data.samples = without_duplicates(&self.sources)?;
                Ok(fathom_block::encode_block(&self.data)?)
            }
            r => Ok(r?),
        }
    }
}

/// The merge of `sources`: every profile once (the first block that holds
/// it wins), series spans widened, symbol tables united. The sample rows
/// are merged as [`Merged::encode`] writes them; here each source's
/// samples file is fetched (compressed) and, where needed, its profile
/// and stack columns read.
pub async fn merge(store: &dyn ObjectStore, sources: &[BlockMeta]) -> Result<Merged, Error> {
    let tenant = sources
        .first()
        .map(|b| b.tenant.clone())
        .ok_or_else(|| Error::Task("a job without blocks".into()))?;
    let mut seen = IdSet::default();
    let mut profiles: Vec<ProfileRow> = Vec::new();
    let mut series: BTreeMap<Id, SeriesRow> = BTreeMap::new();
    let mut rows: Vec<runs::Source> = Vec::with_capacity(sources.len());
    let mut symbols = Symbols::default();
    let mut stats = MergeStats::default();
    for b in sources {
        let mut dup = IdSet::default();
        let mut new = NewRows::default();
        for p in fathom_block::read_profiles(store, b).await? {
            let fresh = seen.insert(p.profile_id);
            new.push(p.profile_id, p.samples, fresh);
            if fresh {
                profiles.push(p);
            } else {
                dup.insert(p.profile_id);
                stats.duplicates += 1;
            }
        }
        for s in fathom_block::read_series(store, b).await? {
            series
                .entry(s.series_id)
                .and_modify(|e| {
                    e.min_time_nanos = e.min_time_nanos.min(s.min_time_nanos);
                    e.max_time_nanos = e.max_time_nanos.max(s.max_time_nanos);
                })
                .or_insert(s);
        }
        if new.kept.is_empty() {
            // Every profile of this source an earlier one gave: none of
            // its rows is kept, and the kept rows' symbols are theirs.
            stats.rows_not_read += b.stats.samples;
            stats.symbol_tables_not_read += 1;
            continue;
        }
        let file = SampleFile::fetch(store, b).await?;
        let file = if dup.is_empty() {
            file
        } else {
            new_rows(file, b, &new, &mut stats)?
        };
        // A replica's new profiles mostly sample stacks an earlier
        // source brought: its symbol table is read only when they do not
        // (the tables are closed, so a held stack's frames are held too).
        if !dup.is_empty() && stacks_held(&file, &symbols)? {
            stats.symbol_tables_not_read += 1;
        } else {
            symbols.merge_owned(fathom_block::read_symbols(store, b).await?);
        }
        rows.push(runs::Source { file, dup });
    }
    let level = sources.iter().map(|b| b.level).max().unwrap_or(0) + 1;
    Ok(Merged {
        data: BlockData {
            tenant,
            source: String::new(),
            level,
            compacted_from: sources.iter().map(|b| b.id.clone()).collect(),
            series: series.into_values().collect(),
            profiles,
            samples: Vec::new(),
            symbols: Arc::new(symbols),
            rollup_widths_nanos: Vec::new(),
        },
        stats,
        sources: rows,
    })
}

/// A source's profiles in its samples' order, as its profile table
/// counts their rows: the row ranges of the profiles no earlier source
/// gave, and those profiles with their row counts.
#[derive(Default)]
struct NewRows {
    /// Rows of the profiles counted so far.
    counted: u64,
    /// A count overflowed: the ranges are not to be used.
    overflowed: bool,
    ranges: Vec<std::ops::Range<usize>>,
    kept: Vec<(Id, u64)>,
}

impl NewRows {
    /// The next profile of the source, of `rows` rows; `fresh` when no
    /// earlier source gave it.
    fn push(&mut self, id: Id, rows: u64, fresh: bool) {
        let start = self.counted;
        let Some(end) = start.checked_add(rows) else {
            self.overflowed = true;
            return;
        };
        self.counted = end;
        if !fresh {
            return;
        }
        self.kept.push((id, rows));
        let (Ok(start), Ok(end)) = (usize::try_from(start), usize::try_from(end)) else {
            self.overflowed = true;
            return;
        };
        match self.ranges.last_mut() {
            Some(r) if r.end == start => r.end = end,
            _ => self.ranges.push(start..end),
        }
    }

    /// Whether the counts add up to the block's `samples` rows.
    fn counts_match(&self, samples: u64) -> bool {
        !self.overflowed && self.counted == samples
    }

    /// Rows the kept profiles have, as counted.
    fn kept_rows(&self) -> u64 {
        self.kept.iter().map(|(_, n)| *n).sum()
    }

    /// Whether `batches` are the kept profiles' rows: one run of each,
    /// in order, as long as counted.
    fn runs_match(
        &self,
        batches: impl Iterator<Item = fathom_block::Result<RecordBatch>>,
    ) -> Result<bool, Error> {
        let mut want = self.kept.iter();
        let mut run: Option<([u8; 16], u64)> = None;
        let ends = |run: Option<([u8; 16], u64)>, want: Option<&(Id, u64)>| {
            run.is_none_or(|(at, n)| want.is_some_and(|(w, c)| w.0 == at && *c == n))
        };
        for b in batches {
            let b = b?;
            let Some(pid) = ids_in(&b, columns::PROFILE_ID) else {
                return Ok(false);
            };
            for id in pid {
                match &mut run {
                    Some((at, n)) if at == id => *n += 1,
                    _ => {
                        if let Some(done) = run.replace((*id, 1))
                            && !ends(Some(done), want.next())
                        {
                            return Ok(false);
                        }
                    }
                }
            }
        }
        if run.is_some() && !ends(run, want.next()) {
            return Ok(false);
        }
        Ok(want.next().is_none())
    }
}

/// Whether `symbols` holds every stack the rows `file` selects name
/// (their stack column read alone).
fn stacks_held(file: &SampleFile, symbols: &Symbols) -> Result<bool, Error> {
    for b in file.columns(&[columns::STACK_ID])? {
        let b = b?;
        let Some(stacks) = ids_in(&b, columns::STACK_ID) else {
            return Ok(false);
        };
        let mut last: Option<&[u8; 16]> = None;
        for id in stacks {
            if last == Some(id) {
                continue;
            }
            last = Some(id);
            if !symbols.stacks.contains_key(&Id(*id)) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The rows of `file` (of block `b`) to merge, a source some of whose
/// profiles an earlier source gave: only the others' rows when its
/// profile table's row counts add up to its rows and the rows selected
/// are those profiles' runs (their profile column read alone to check);
/// otherwise every row (the merge drops the duplicates' runs).
fn new_rows(
    file: SampleFile,
    b: &BlockMeta,
    new: &NewRows,
    stats: &mut MergeStats,
) -> Result<SampleFile, Error> {
    if new.counts_match(b.stats.samples) {
        let selected = file.clone().select(&new.ranges)?;
        if new.runs_match(selected.columns(&[columns::PROFILE_ID])?)? {
            stats.rows_not_read += b.stats.samples.saturating_sub(new.kept_rows());
            return Ok(selected);
        }
    }
    tracing::debug!(
        block = %b.id,
        "the profile table's row counts do not match the samples; reading every row"
    );
    Ok(file)
}

/// Every source's rows but those of its duplicate profiles, as they come.
fn without_duplicates(sources: &[runs::Source]) -> Result<Vec<RecordBatch>, Error> {
    let mut samples = Vec::new();
    for s in sources {
        for batch in s.file.rows()? {
            let batch = batch?;
            if s.dup.is_empty() {
                samples.push(batch);
                continue;
            }
            let pid = id_col(&batch, columns::PROFILE_ID)?;
            let keep: BooleanArray = (0..pid.len())
                .map(|i| Some(!Id::from_slice(pid.value(i)).is_some_and(|id| s.dup.contains(&id))))
                .collect();
            let kept = arrow::compute::filter_record_batch(&batch, &keep)
                .map_err(|e| Error::Task(e.to_string()))?;
            if kept.num_rows() > 0 {
                samples.push(kept);
            }
        }
    }
    Ok(samples)
}

/// The rollup bucket widths of a block written by a job of `level`: hours
/// always, days as well when the output window spans a day or more (so
/// that a month is read from day totals and the edges from hour totals).
pub fn rollup_widths(windows: &[Duration], level: u32) -> Vec<i64> {
    let window = windows
        .get(level as usize)
        .or(windows.last())
        .map_or(0, |w| i64::try_from(w.as_nanos()).unwrap_or(i64::MAX));
    let mut out = vec![fathom_block::HOUR_NANOS];
    if window >= fathom_block::DAY_NANOS {
        out.push(fathom_block::DAY_NANOS);
    }
    out
}

/// The compactor.
pub struct Compactor {
    cfg: Config,
    store: Arc<dyn ObjectStore>,
    index: Arc<dyn CompactionIndex>,
    metrics: Metrics,
    symbolizer: std::sync::OnceLock<Arc<dyn BlockSymbolizer>>,
}

impl Compactor {
    pub fn new(
        cfg: Config,
        store: Arc<dyn ObjectStore>,
        index: Arc<dyn CompactionIndex>,
        registry: &mut Registry,
    ) -> Arc<Self> {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("fathom_compactor");
        r.register("jobs", "Compaction jobs done", m.jobs.clone());
        r.register(
            "job_failures",
            "Compaction jobs failed (retried)",
            m.failures.clone(),
        );
        r.register("blocks_in", "Blocks merged away", m.blocks_in.clone());
        r.register("blocks_out", "Blocks written", m.blocks_out.clone());
        r.register(
            "duplicate_profiles",
            "Replica copies of profiles dropped",
            m.duplicate_profiles.clone(),
        );
        r.register(
            "duplicate_rows_not_read",
            "Sample rows of replica copies of profiles not decoded from their blocks",
            m.rows_not_read.clone(),
        );
        r.register(
            "symbol_tables_not_read",
            "Source blocks whose symbols were not read (every stack of their new profiles already known)",
            m.symbol_tables_not_read.clone(),
        );
        r.register("bytes_in", "Bytes of merged blocks", m.bytes_in.clone());
        r.register("bytes_out", "Bytes of written blocks", m.bytes_out.clone());
        r.register(
            "retention_removed",
            "Blocks removed by retention",
            m.retention_removed.clone(),
        );
        r.register(
            "deleted_blocks",
            "Blocks whose files were deleted",
            m.deleted.clone(),
        );
        r.register(
            "pending_deletions",
            "Removed blocks whose files wait for deletion",
            m.pending.clone(),
        );
        Arc::new(Compactor {
            cfg,
            store,
            index,
            metrics: m,
            symbolizer: std::sync::OnceLock::new(),
        })
    }

    /// Symbolizes address-only locations of the blocks it writes from now
    /// on (once; later calls are ignored).
    pub fn set_symbolizer(&self, s: Arc<dyn BlockSymbolizer>) {
        let _ = self.symbolizer.set(s);
    }

    /// Runs one job under its lease; `Ok(None)` when another compactor
    /// holds it.
    pub async fn run_job(&self, job: &Job) -> Result<Option<BlockMeta>, Error> {
        let key = job.key();
        if !self
            .index
            .acquire(&key, &self.cfg.name, self.cfg.lease_ttl)
            .await
            .map_err(Error::Index)?
        {
            return Ok(None);
        }
        let r = self.compact(job).await;
        if let Err(e) = self.index.release(&key, &self.cfg.name).await {
            tracing::warn!(job = %key, error = %e, "releasing a lease failed; it expires");
        }
        match &r {
            Ok(_) => self.metrics.jobs.inc(),
            Err(_) => self.metrics.failures.inc(),
        };
        r.map(Some)
    }

    async fn compact(&self, job: &Job) -> Result<BlockMeta, Error> {
        let mut m = merge(self.store.as_ref(), &job.blocks).await?;
        if let Some(sym) = self.symbolizer.get()
            && let Ok(tenant) = fathom_model::TenantId::new(&job.tenant)
        {
            sym.symbolize(&tenant, Arc::make_mut(&mut m.data.symbols))
                .await;
        }
        m.data.source = self.cfg.name.clone();
        // One above the job's level: a block that crossed its own window
        // joined a higher level's job, and a top-level source stays top.
        m.data.level = job.level + 1;
        m.data.rollup_widths_nanos = rollup_widths(&self.cfg.windows, job.level);
        let merged = m.stats;
        let (mut meta, files) = tokio::task::spawn_blocking(move || m.encode())
            .await
            .map_err(|e| Error::Task(e.to_string()))??;
        meta.id = derived_id(&job.blocks);
        fathom_block::write_block(self.store.as_ref(), &meta, files).await?;
        self.index
            .replace(
                &job.tenant,
                vec![meta.clone()],
                job.blocks.iter().map(|b| b.id.clone()).collect(),
            )
            .await
            .map_err(Error::Index)?;
        self.metrics.blocks_in.inc_by(job.blocks.len() as u64);
        self.metrics.blocks_out.inc();
        self.metrics.duplicate_profiles.inc_by(merged.duplicates);
        self.metrics.rows_not_read.inc_by(merged.rows_not_read);
        self.metrics
            .symbol_tables_not_read
            .inc_by(merged.symbol_tables_not_read);
        self.metrics
            .bytes_in
            .inc_by(job.blocks.iter().map(|b| b.stats.bytes).sum());
        self.metrics.bytes_out.inc_by(meta.stats.bytes);
        tracing::info!(
            tenant = %job.tenant, level = meta.level, sources = job.blocks.len(),
            block = %meta.id, duplicates = merged.duplicates,
            rows_not_read = merged.rows_not_read,
            symbol_tables_not_read = merged.symbol_tables_not_read, "compacted"
        );
        Ok(meta)
    }

    /// Removes blocks past their tenant's retention from the index.
    pub async fn apply_retention(&self, now_ms: i64) -> Result<usize, Error> {
        let blocks = self.index.all().await.map_err(Error::Index)?;
        let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for b in blocks {
            let Some(keep) = self
                .cfg
                .retention_overrides
                .as_ref()
                .and_then(|o| (o.0)(&b.tenant))
                .or_else(|| self.cfg.tenant_retention.get(&b.tenant).copied())
                .or(self.cfg.retention)
            else {
                continue;
            };
            let cutoff = now_ms.saturating_sub(keep.as_millis() as i64) * 1_000_000;
            if b.max_time_nanos < cutoff {
                by.entry(b.tenant.clone()).or_default().push(b.id.clone());
            }
        }
        let mut n = 0;
        for (tenant, ids) in by {
            n += ids.len();
            self.index
                .replace(&tenant, Vec::new(), ids)
                .await
                .map_err(Error::Index)?;
        }
        self.metrics.retention_removed.inc_by(n as u64);
        Ok(n)
    }

    /// Deletes the files of blocks removed more than `delete_delay` ago.
    pub async fn delete_removed(&self, now_ms: i64) -> Result<usize, Error> {
        let pending = self.index.pending_deletions().await.map_err(Error::Index)?;
        self.metrics.pending.set(pending.len() as i64);
        let delay = self.cfg.delete_delay.as_millis() as i64;
        let mut done: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (b, removed_at) in pending {
            if now_ms - removed_at < delay {
                continue;
            }
            let prefix = block_dir(&b.tenant, &b.id);
            // meta.json first: a half-deleted block is never mistaken for a
            // complete one by a bucket listing.
            let meta = fathom_block::block_file(&b.tenant, &b.id, fathom_block::files::META);
            match self.store.delete(&meta).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let files: Vec<_> = self
                .store
                .list(Some(&prefix))
                .map_ok(|o| o.location)
                .try_collect()
                .await?;
            for f in files {
                match self.store.delete(&f).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            done.entry(b.tenant.clone()).or_default().push(b.id.clone());
        }
        let mut n = 0;
        for (tenant, ids) in done {
            n += ids.len();
            self.index.purge(&tenant, ids).await.map_err(Error::Index)?;
        }
        self.metrics.deleted.inc_by(n as u64);
        Ok(n)
    }

    /// One round: retention, every job of the plan, deletions.
    pub async fn run_once(&self) -> Result<usize, Error> {
        let now_ms = now_ms();
        self.apply_retention(now_ms).await?;
        let mut done = 0;
        // Level by level, so a window's level-1 result can join level 2 in
        // the next round.
        let blocks = self.index.all().await.map_err(Error::Index)?;
        for job in plan(&blocks, &self.cfg.windows, now_ms, self.cfg.settle) {
            match self.run_job(&job).await {
                Ok(Some(_)) => done += 1,
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(job = %job.key(), error = %e, "compaction failed; retried next round")
                }
            }
        }
        self.delete_removed(self::now_ms()).await?;
        Ok(done)
    }

    /// Rounds every `interval` until `stop`.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.run_once().await {
                tracing::error!(error = %e, "compaction round failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.interval) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A [`CompactionIndex`] in memory (tests, single process).
#[derive(Default)]
pub struct MemoryCompactionIndex {
    state: parking_lot::Mutex<MemState>,
}

#[derive(Default)]
struct MemState {
    blocks: BTreeMap<String, BlockMeta>,
    pending: Vec<(BlockMeta, i64)>,
    leases: HashMap<String, (String, i64)>,
}

impl MemoryCompactionIndex {
    pub fn new(blocks: Vec<BlockMeta>) -> Self {
        let idx = MemoryCompactionIndex::default();
        idx.state.lock().blocks = blocks.into_iter().map(|b| (b.id.clone(), b)).collect();
        idx
    }
}

#[async_trait::async_trait]
impl CompactionIndex for MemoryCompactionIndex {
    async fn all(&self) -> Result<Vec<BlockMeta>, CompactionIndexError> {
        Ok(self.state.lock().blocks.values().cloned().collect())
    }

    async fn replace(
        &self,
        _tenant: &str,
        add: Vec<BlockMeta>,
        remove: Vec<String>,
    ) -> Result<(), CompactionIndexError> {
        let mut s = self.state.lock();
        let now = now_ms();
        for id in remove {
            if let Some(b) = s.blocks.remove(&id) {
                s.pending.push((b, now));
            }
        }
        for b in add {
            s.blocks.insert(b.id.clone(), b);
        }
        Ok(())
    }

    async fn pending_deletions(&self) -> Result<Vec<(BlockMeta, i64)>, CompactionIndexError> {
        Ok(self.state.lock().pending.clone())
    }

    async fn purge(&self, tenant: &str, ids: Vec<String>) -> Result<(), CompactionIndexError> {
        self.state
            .lock()
            .pending
            .retain(|(b, _)| !(b.tenant == tenant && ids.contains(&b.id)));
        Ok(())
    }

    async fn acquire(
        &self,
        job: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, CompactionIndexError> {
        let mut s = self.state.lock();
        let now = now_ms();
        match s.leases.get(job) {
            Some((o, until)) if o != owner && *until > now => Ok(false),
            _ => {
                s.leases.insert(
                    job.to_owned(),
                    (owner.to_owned(), now + ttl.as_millis() as i64),
                );
                Ok(true)
            }
        }
    }

    async fn release(&self, job: &str, owner: &str) -> Result<(), CompactionIndexError> {
        let mut s = self.state.lock();
        if s.leases.get(job).is_some_and(|(o, _)| o == owner) {
            s.leases.remove(job);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_block::SamplesBuilder;
    use fathom_model::{Function, Labels, Line, Location, ProfileType, Stack};

    const HOUR: i64 = 3_600_000_000_000;
    const DAY: i64 = 24 * HOUR;
    /// 2024-01-01T00:00:00Z
    const T0: i64 = 1_704_067_200_000_000_000;

    fn symbols_for(names: &[&str]) -> (Symbols, Vec<Id>) {
        let mut s = Symbols::default();
        let mut stacks = Vec::new();
        for n in names {
            let f = s.add_function(Function {
                name: n.to_string(),
                system_name: n.to_string(),
                filename: "x.go".into(),
                start_line: 1,
            });
            let l = s.add_location(Location {
                mapping: Id::ZERO,
                address: 0,
                lines: vec![Line {
                    function: f,
                    line: 1,
                }],
            });
            stacks.push(s.add_stack(Stack { locations: vec![l] }));
        }
        (s, stacks)
    }

    /// A level-0 block with profiles `(profile id, time, value)`, each one
    /// sample on its own function.
    async fn block(store: &dyn ObjectStore, profiles: &[(u128, i64, i64)]) -> BlockMeta {
        block_with(store, profiles, |_| {}).await
    }

    /// [`block`], its data changed by `edit` before it is encoded.
    async fn block_with(
        store: &dyn ObjectStore,
        profiles: &[(u128, i64, i64)],
        edit: impl FnOnce(&mut BlockData),
    ) -> BlockMeta {
        block_named(store, profiles, |p| format!("f{p}"), edit).await
    }

    /// [`block_with`], each profile's function named by `name`.
    async fn block_named(
        store: &dyn ObjectStore,
        profiles: &[(u128, i64, i64)],
        name: impl Fn(u128) -> String,
        edit: impl FnOnce(&mut BlockData),
    ) -> BlockMeta {
        let pt: ProfileType = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
            .parse()
            .unwrap();
        let labels = Labels::from_pairs([("service_name", "svc")]).unwrap();
        let sid = fathom_model::series_id(&pt, &labels);
        let names: Vec<String> = profiles.iter().map(|p| name(p.0)).collect();
        let (symbols, stacks) = symbols_for(&names.iter().map(String::as_str).collect::<Vec<_>>());
        let mut sb = SamplesBuilder::with_capacity(profiles.len());
        let mut rows = Vec::new();
        for ((pid, t, v), stack) in profiles.iter().zip(&stacks) {
            let pid = Id::from_u128(*pid);
            sb.push(&sid, *t, &pid, stack, *v);
            rows.push(ProfileRow {
                profile_id: pid,
                series_id: sid,
                time_nanos: *t,
                duration_nanos: 10,
                period: 1,
                samples: 1,
            });
        }
        let mut data = BlockData {
            tenant: "t1".into(),
            source: "ingester".into(),
            level: 0,
            compacted_from: vec![],
            series: vec![SeriesRow {
                series_id: sid,
                profile_type: pt,
                labels,
                min_time_nanos: profiles.iter().map(|p| p.1).min().unwrap(),
                max_time_nanos: profiles.iter().map(|p| p.1).max().unwrap(),
            }],
            profiles: rows,
            samples: vec![sb.finish()],
            symbols: Arc::new(symbols),
            rollup_widths_nanos: Vec::new(),
        };
        edit(&mut data);
        let (meta, files) = fathom_block::encode_block(&data).unwrap();
        fathom_block::write_block(store, &meta, files)
            .await
            .unwrap();
        meta
    }

    /// A compactor with [`cfg`] over `store` and an index of `blocks`.
    fn compactor_over(
        store: &Arc<dyn ObjectStore>,
        blocks: Vec<BlockMeta>,
    ) -> (Arc<Compactor>, Arc<MemoryCompactionIndex>) {
        let index = Arc::new(MemoryCompactionIndex::new(blocks));
        let c = Compactor::new(
            cfg(),
            store.clone(),
            index.clone(),
            &mut Registry::default(),
        );
        (c, index)
    }

    fn cfg() -> Config {
        Config {
            delete_delay: Duration::ZERO,
            ..Config::default()
        }
    }

    async fn totals(store: &dyn ObjectStore, b: &BlockMeta) -> BTreeMap<Id, i64> {
        let mut out = BTreeMap::new();
        for batch in fathom_block::read_samples(store, b).await.unwrap() {
            let pid = id_col(&batch, columns::PROFILE_ID).unwrap();
            let v = batch
                .column_by_name(columns::VALUE)
                .unwrap()
                .as_any()
                .downcast_ref::<arrow::array::Int64Array>()
                .unwrap();
            for i in 0..batch.num_rows() {
                *out.entry(Id::from_slice(pid.value(i)).unwrap())
                    .or_default() += v.value(i);
            }
        }
        out
    }

    /// A block of tenant `t` for the planner's tests.
    fn planned_meta(id: &str, level: u32, min: i64, max: i64) -> BlockMeta {
        BlockMeta {
            format_version: 1,
            id: id.into(),
            tenant: "t".into(),
            min_time_nanos: min,
            max_time_nanos: max,
            level,
            source: "x".into(),
            compacted_from: vec![],
            profile_types: vec![],
            stats: Default::default(),
            created_at_ms: 0,
            rollup_widths_nanos: Vec::new(),
        }
    }

    #[test]
    fn plans_windows_per_level() {
        let mk = planned_meta;
        let blocks = vec![
            mk("a", 0, T0, T0 + 10),
            mk("b", 0, T0 + 5, T0 + HOUR - 1),
            mk("c", 0, T0 + 7, T0 + 8),
            mk("d", 0, T0 + HOUR, T0 + HOUR + 1), // next hour, alone
            mk("e", 0, T0 + HOUR - 5, T0 + HOUR + 5), // crosses the hour: level 1's day
            mk("f", 1, T0, T0 + HOUR - 1),
            mk("g", 1, T0 + 2 * HOUR, T0 + 3 * HOUR - 1), // same day
            mk("h", 2, T0 + DAY, T0 + DAY + 1),           // top level, alone in its day
            // A top-level block and a late replica of one of its sources.
            mk("k", 2, T0 + 5 * DAY, T0 + 5 * DAY + HOUR),
            mk("l", 0, T0 + 5 * DAY + 10, T0 + 5 * DAY + 2 * HOUR),
            // Replicas of a cut spanning ten days, days after T0: no
            // window holds them, so they merge under their first day.
            mk("i", 0, T0 + 3 * DAY, T0 + 13 * DAY),
            mk("j", 0, T0 + 3 * DAY, T0 + 13 * DAY),
        ];
        // Every window closed. The first day waits for its hours' jobs.
        let jobs = plan_at(&blocks, T0 + 20 * DAY, Duration::ZERO);
        assert_eq!(
            ids(&jobs),
            vec![
                (0, vec!["a", "b", "c"]),
                (0, vec!["d"]),
                (1, vec!["i", "j"]),
                (1, vec!["k", "l"])
            ]
        );
        let hours_done: Vec<BlockMeta> = blocks
            .iter()
            .filter(|b| !["a", "b", "c", "d"].contains(&b.id.as_str()))
            .cloned()
            .collect();
        assert_eq!(
            ids(&plan_at(&hours_done, T0 + 20 * DAY, Duration::ZERO)),
            vec![
                (1, vec!["e", "f", "g"]),
                (1, vec!["i", "j"]),
                (1, vec!["k", "l"])
            ]
        );
        // On the first day, in its second hour: the first hour's level-1
        // block is merged again with that hour's blocks, not into the
        // day; the block that crosses the hour and the level-1 block of
        // the third hour wait. A day still open: its top-level block is
        // merged only with new blocks at least as large as itself.
        let open_day = |k_bytes: u64| {
            let mut blocks = blocks.clone();
            for b in &mut blocks {
                match b.id.as_str() {
                    "k" => b.stats.bytes = k_bytes,
                    "l" => b.stats.bytes = 100,
                    _ => {}
                }
            }
            plan_at(&blocks, T0 + HOUR + 2, Duration::ZERO)
        };
        assert_eq!(
            ids(&open_day(1_000)),
            vec![(0, vec!["a", "b", "c", "f"]), (1, vec!["i", "j"])]
        );
        assert_eq!(
            ids(&open_day(100)),
            vec![
                (0, vec!["a", "b", "c", "f"]),
                (1, vec!["i", "j"]),
                (1, vec!["k", "l"])
            ]
        );
    }

    /// A level-0 replica registered after its siblings of the same hour
    /// were merged joins their level-1 result; a level-0 block alone in
    /// another hour of that day waits for its own siblings.
    #[test]
    fn a_late_replica_joins_its_merged_siblings() {
        let mk = planned_meta;
        let blocks = vec![
            mk("late", 0, T0 + 10, T0 + 20),
            mk("merged", 1, T0 + 5, T0 + 30),
            mk("next-hour", 0, T0 + HOUR + 10, T0 + HOUR + 20),
        ];
        // The day has closed: its level-1 blocks are the day's inputs,
        // once the block alone in the next hour has had its own job.
        let jobs = plan_at(&blocks, T0 + DAY + 30, Duration::ZERO);
        assert_eq!(ids(&jobs), vec![(0, vec!["next-hour"])]);
        let mut hour_done = blocks.clone();
        hour_done[2] = mk("next-hour-1", 1, T0 + HOUR + 10, T0 + HOUR + 20);
        let jobs = plan_at(&hour_done, T0 + DAY + 30, Duration::ZERO);
        assert_eq!(ids(&jobs), vec![(1, vec!["late", "merged", "next-hour-1"])]);
        // While the day is open, the late block merges in its hour.
        let jobs = plan_at(&blocks, T0 + HOUR + 30, Duration::ZERO);
        assert_eq!(ids(&jobs), vec![(0, vec!["late", "merged"])]);
    }

    /// What [`simulate`] saw: bytes read by jobs, and the most blocks an
    /// open hour held after a round.
    struct Simulated {
        blocks: Vec<BlockMeta>,
        rewritten: u64,
        cut_bytes: u64,
        most_in_an_open_hour: usize,
    }

    impl Simulated {
        /// About log2(120 cuts an hour) rewrites a byte cut, and as many
        /// blocks in a growing hour, with room to spare.
        fn assert_logarithmic(&self) {
            assert!(
                self.rewritten <= 10 * self.cut_bytes,
                "{} bytes rewritten for {} of cuts",
                self.rewritten,
                self.cut_bytes
            );
            assert!(
                self.most_in_an_open_hour <= 10,
                "{} blocks in a growing hour",
                self.most_in_an_open_hour
            );
        }
    }

    /// What a job leaves in the index, for the planner's tests: its
    /// sources replaced by a block `id` one level up, spanning them and
    /// as large as they are together, created at `now` (unix nanoseconds).
    fn carry_out(blocks: &mut Vec<BlockMeta>, job: &Job, id: &str, now: i64) {
        let mut out = planned_meta(
            id,
            job.level + 1,
            job.blocks.iter().map(|b| b.min_time_nanos).min().unwrap(),
            job.blocks.iter().map(|b| b.max_time_nanos).max().unwrap(),
        );
        out.stats.bytes = job.blocks.iter().map(|b| b.stats.bytes).sum();
        out.created_at_ms = now / 1_000_000;
        blocks.retain(|b| !job.blocks.iter().any(|j| j.id == b.id));
        blocks.push(out);
    }

    /// Cuts of `every` (each `CUT` bytes, registered when it ends) from
    /// `T0 + first`, planned every `round` with a 5 s settle until `end`,
    /// every job carried out (its output: the sources' bytes, one level
    /// up). Each cut's profiles are `lag` older than its time (a
    /// backfill).
    fn simulate(first: i64, every: i64, round: i64, end: i64, lag: i64) -> Simulated {
        simulate_until(first, every, round, end, end, lag)
    }

    /// [`simulate`], with no cut after `cuts_end`.
    fn simulate_until(
        first: i64,
        every: i64,
        round: i64,
        cuts_end: i64,
        end: i64,
        lag: i64,
    ) -> Simulated {
        let mut sim = Simulated {
            blocks: Vec::new(),
            rewritten: 0,
            cut_bytes: 0,
            most_in_an_open_hour: 0,
        };
        let mut next_cut = T0 + first;
        let mut merged = 0;
        let mut now = T0;
        while now <= end {
            while next_cut + every <= now.min(cuts_end) {
                let mut b = created(&format!("cut-{next_cut}"), next_cut - lag, next_cut + every);
                b.max_time_nanos = next_cut - lag + every - 1;
                b.stats.bytes = CUT;
                sim.cut_bytes += CUT;
                sim.blocks.push(b);
                next_cut += every;
            }
            for job in plan_at(&sim.blocks, now, Duration::from_secs(5)) {
                sim.rewritten += job.blocks.iter().map(|b| b.stats.bytes).sum::<u64>();
                merged += 1;
                carry_out(&mut sim.blocks, &job, &format!("merged-{merged}"), now);
            }
            let hour = (now - lag).div_euclid(HOUR) * HOUR;
            let open = sim
                .blocks
                .iter()
                .filter(|b| b.min_time_nanos >= hour && b.max_time_nanos < hour + HOUR)
                .count();
            sim.most_in_an_open_hour = sim.most_in_an_open_hour.max(open);
            now += round;
        }
        sim
    }

    const CUT: u64 = 1_000;
    const MIN: i64 = 60 * 1_000_000_000;

    /// A day of cuts, one every 20 minutes (every third one across an
    /// hour), planned every 5 minutes: once the day has closed it is one
    /// block, and its cuts were rewritten about three times in all. Were
    /// a day's hours folded into its block as they came, every cut would
    /// rewrite the whole day (23 times the bytes cut in this run).
    #[test]
    fn an_open_days_cuts_rewrite_their_hour_not_the_day() {
        let sim = simulate(10 * MIN, 20 * MIN, 5 * MIN, T0 + DAY + 3 * HOUR, 0);
        let day: Vec<(&str, u32, u64)> = sim
            .blocks
            .iter()
            .filter(|b| b.min_time_nanos < T0 + DAY)
            .map(|b| (b.id.as_str(), b.level, b.stats.bytes))
            .collect();
        let day_bytes = (10..24 * 60).step_by(20).count() as u64 * CUT;
        assert_eq!(day.len(), 1, "{day:?}");
        assert_eq!((day[0].1, day[0].2), (2, day_bytes));
        assert!(
            sim.rewritten <= 4 * day_bytes,
            "{} bytes rewritten for a day of {day_bytes}",
            sim.rewritten
        );
    }

    /// A busy tenant: a cut every 30 s for three hours, planned every
    /// 10 s. An open hour holds a handful of blocks, each cut is rewritten
    /// about log2(120) times while its hour is open and once when it
    /// closes (93 times when a job took all its window's blocks and the
    /// day's); every closed hour is one block.
    #[test]
    fn a_busy_hours_cuts_are_rewritten_a_logarithmic_number_of_times() {
        let s = 1_000_000_000;
        let sim = simulate(0, 30 * s, 10 * s, T0 + 3 * HOUR + 5 * MIN, 0);
        sim.assert_logarithmic();
        for h in 0..3 {
            let hour: Vec<(u32, u64)> = sim
                .blocks
                .iter()
                .filter(|b| b.min_time_nanos.div_euclid(HOUR) == (T0 + h * HOUR).div_euclid(HOUR))
                .map(|b| (b.level, b.stats.bytes))
                .collect();
            assert_eq!(hour, vec![(1, 120 * CUT)], "hour {h}");
        }
    }

    /// A past day's blocks stored at once (a cluster's flushed replicas):
    /// two hours' blocks and two large ones that cross an hour. The day
    /// waits for its hours' jobs, then takes their results and the large
    /// blocks in one job: one block, without waiting for the day to be
    /// quiet.
    #[test]
    fn a_past_days_blocks_stored_at_once_become_one_block() {
        let s = 1_000_000_000;
        let now = T0 + 20 * DAY;
        let sized = |id: &str, min: i64, max: i64, bytes: u64| BlockMeta {
            max_time_nanos: max,
            stats: fathom_block::BlockStats {
                bytes,
                ..Default::default()
            },
            ..created(id, min, now - 30 * s)
        };
        let mut blocks = vec![
            sized("h1a", T0 + 10, T0 + 20, 1),
            sized("h1b", T0 + 30, T0 + 40, 1),
            sized("h2a", T0 + HOUR + 10, T0 + HOUR + 20, 1),
            sized("h2b", T0 + HOUR + 30, T0 + HOUR + 40, 1),
            sized("x1", T0 + 50, T0 + 2 * HOUR, 100),
            sized("x2", T0 + 60, T0 + 2 * HOUR, 100),
        ];
        let mut rounds = Vec::new();
        for round in 0..5 {
            let jobs = plan_at(&blocks, now + round * 10 * s, Duration::from_secs(5));
            rounds.push(
                ids(&jobs)
                    .into_iter()
                    .map(|(l, b)| (l, b.join("+")))
                    .collect::<Vec<_>>(),
            );
            for (n, job) in jobs.iter().enumerate() {
                carry_out(
                    &mut blocks,
                    job,
                    &format!("r{round}j{n}"),
                    now + round * 10 * s,
                );
            }
        }
        assert_eq!(
            rounds[..3],
            [
                vec![(0, "h1a+h1b".to_owned()), (0, "h2a+h2b".to_owned())],
                vec![(1, "r0j0+r0j1+x1+x2".to_owned())],
                vec![],
            ]
        );
        assert_eq!(blocks.len(), 1);
        assert_eq!((blocks[0].level, blocks[0].stats.bytes), (2, 204));
    }

    /// The same cuts holding profiles ten days old (a backfill): their
    /// windows are closed, and while the cuts stream in they are merged
    /// as an open window's are; two hours after the last one the day is
    /// one block.
    #[test]
    fn a_backfill_is_merged_like_an_open_window_then_whole() {
        let s = 1_000_000_000;
        let end = T0 + 3 * HOUR;
        let sim = simulate_until(0, 30 * s, 10 * s, end, end + 2 * HOUR + MIN, 10 * DAY);
        sim.assert_logarithmic();
        let all: Vec<(u32, u64)> = sim
            .blocks
            .iter()
            .map(|b| (b.level, b.stats.bytes))
            .collect();
        assert_eq!(all, vec![(2, sim.cut_bytes)]);
    }

    /// The default windows' plan at `now` (unix nanoseconds).
    fn plan_at(blocks: &[BlockMeta], now: i64, settle: Duration) -> Vec<Job> {
        plan(blocks, &Config::default().windows, now / 1_000_000, settle)
    }

    fn ids(jobs: &[Job]) -> Vec<(u32, Vec<&str>)> {
        jobs.iter()
            .map(|j| (j.level, j.blocks.iter().map(|b| b.id.as_str()).collect()))
            .collect()
    }

    /// A level-0 block of the planner's tests, created at `created`
    /// (unix nanoseconds).
    fn created(id: &str, min: i64, created: i64) -> BlockMeta {
        BlockMeta {
            created_at_ms: created / 1_000_000,
            ..planned_meta(id, 0, min, min + 10)
        }
    }

    /// A cut's blocks arrive one after another (one per replica that
    /// stored a part): the window waits until the newest has settled,
    /// and merges them in one job; a window whose blocks keep coming
    /// waits no longer than the settle limit.
    #[test]
    fn a_windows_level_0_blocks_wait_until_the_newest_settled() {
        let settle = Duration::from_secs(5);
        let s = 1_000_000_000; // a second
        let now = T0 + 30 * s;
        let blocks = vec![
            created("a", T0, now - 10 * s),
            created("b", T0 + 1, now - s),
        ];
        assert!(
            plan_at(&blocks, now, settle).is_empty(),
            "b arrived 1 s ago"
        );
        assert_eq!(
            ids(&plan_at(&blocks, now + 4 * s, settle)),
            vec![(0, vec!["a", "b"])],
            "b has settled"
        );
        assert_eq!(
            ids(&plan_at(&blocks, now, Duration::ZERO)),
            vec![(0, vec!["a", "b"])],
            "no settle"
        );
        // Another window and another tenant do not wait for this one.
        let mut other = created("c", T0 + HOUR + 1, now - 10 * s);
        let mut other2 = created("d", T0 + HOUR + 2, now - 9 * s);
        let blocks2 = [blocks.clone(), vec![other.clone(), other2.clone()]].concat();
        assert_eq!(
            ids(&plan_at(&blocks2, now, settle)),
            vec![(0, vec!["c", "d"])]
        );
        other.tenant = "u".into();
        other2.tenant = "u".into();
        (other.min_time_nanos, other.max_time_nanos) = (T0 + 1, T0 + 11);
        (other2.min_time_nanos, other2.max_time_nanos) = (T0 + 2, T0 + 12);
        let blocks3 = [blocks.clone(), vec![other, other2]].concat();
        assert_eq!(
            ids(&plan_at(&blocks3, now, settle)),
            vec![(0, vec!["c", "d"])]
        );
        // Blocks that keep coming: the oldest waited four settles.
        let stream = vec![
            created("e", T0, now - 20 * s),
            created("f", T0 + 1, now - s),
        ];
        assert_eq!(
            ids(&plan_at(&stream, now, settle)),
            vec![(0, vec!["e", "f"])]
        );
        // A late level-0 block waits before it joins its merged siblings.
        let late = vec![
            created("late", T0 + 10, now - s),
            planned_meta("merged", 1, T0 + 5, T0 + 30),
        ];
        assert!(plan_at(&late, now, settle).is_empty());
        assert_eq!(
            ids(&plan_at(&late, now + 4 * s, settle)),
            vec![(0, vec!["late", "merged"])]
        );
    }

    /// A level-0 block alone in its window is merged on its own once the
    /// window has closed and is quiet (nothing joined it for 5 minutes),
    /// into a level-1 block; while the window is open it waits for
    /// siblings.
    #[test]
    fn a_lone_level_0_block_of_a_closed_window_is_a_job() {
        let settle = Duration::from_secs(5);
        let s = 1_000_000_000;
        let lone = vec![created("x", T0 + 10, T0 + HOUR + 2 * s)];
        assert!(
            plan_at(&lone, T0 + HOUR - s, Duration::ZERO).is_empty(),
            "open"
        );
        assert!(
            plan_at(&lone, T0 + HOUR + 3 * s, settle).is_empty(),
            "settling"
        );
        assert!(
            plan_at(&lone, T0 + HOUR + 7 * s, settle).is_empty(),
            "settled, but it came 5 s ago"
        );
        assert!(
            plan_at(&lone, T0 + HOUR + 301 * s, settle).is_empty(),
            "4 min 59 s ago"
        );
        assert_eq!(
            ids(&plan_at(&lone, T0 + HOUR + 302 * s, settle)),
            vec![(0, vec!["x"])]
        );
        // A lone top-level block stays as it is.
        let top = vec![planned_meta("y", 1, T0, T0 + 10)];
        assert!(plan_at(&top, T0 + 3 * DAY, settle).is_empty());
    }

    #[test]
    fn rollups_are_hours_and_days_from_day_windows() {
        let w = Config::default().windows;
        let (h, d) = (fathom_block::HOUR_NANOS, fathom_block::DAY_NANOS);
        assert_eq!(rollup_widths(&w, 0), vec![h]);
        assert_eq!(rollup_widths(&w, 1), vec![h, d]);
        assert_eq!(rollup_widths(&w, 7), vec![h, d], "past the top level");
        assert_eq!(rollup_widths(&[], 0), vec![h]);
    }

    /// A lone level-0 block of a closed hour becomes a level-1 block with
    /// its rollup and the same samples; the next round leaves it alone.
    #[tokio::test]
    async fn a_lone_block_of_a_closed_window_is_compacted_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let mut lone = block(store.as_ref(), &[(1, T0 + 1, 10), (2, T0 + 2, 20)]).await;
        // Stored ten minutes ago: its hour is quiet.
        lone.created_at_ms -= 10 * 60 * 1000;
        let before = totals(store.as_ref(), &lone).await;
        let (c, index) = compactor_over(&store, vec![lone.clone()]);
        assert_eq!(c.run_once().await.unwrap(), 1);
        let after = index.all().await.unwrap();
        assert_eq!(after.len(), 1);
        let b = &after[0];
        assert_eq!((b.level, &b.compacted_from), (1, &vec![lone.id.clone()]));
        assert_eq!(b.rollup_widths_nanos, vec![fathom_block::HOUR_NANOS]);
        assert_eq!(totals(store.as_ref(), b).await, before);
        assert_eq!(
            c.run_once().await.unwrap(),
            0,
            "a lone top-level block stays"
        );
    }

    #[tokio::test]
    async fn replicas_merge_into_one_block_once() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        // Three replicas of profiles 1 and 2, and a fourth block with 3.
        let mut metas = Vec::new();
        for _ in 0..3 {
            metas.push(block(store.as_ref(), &[(1, T0 + 1, 10), (2, T0 + 2, 20)]).await);
        }
        metas.push(block(store.as_ref(), &[(3, T0 + 3, 30)]).await);
        let bytes_before: u64 = metas.iter().map(|m| m.stats.bytes).sum();
        let (c, index) = compactor_over(&store, metas.clone());
        assert_eq!(c.run_once().await.unwrap(), 1);

        let after = index.all().await.unwrap();
        assert_eq!(after.len(), 1, "one block replaces four");
        let b = &after[0];
        assert_eq!(b.level, 1);
        assert_eq!(b.stats.profiles, 3);
        assert!(
            b.stats.bytes < bytes_before,
            "{} < {bytes_before}",
            b.stats.bytes
        );
        let t = totals(store.as_ref(), b).await;
        let want: BTreeMap<Id, i64> = [(1, 10), (2, 20), (3, 30)]
            .into_iter()
            .map(|(p, v)| (Id::from_u128(p), v))
            .collect();
        assert_eq!(t, want, "every profile once");
        // Level 1 (hour windows): hour rollups, with each profile once.
        assert_eq!(b.rollup_widths_nanos, vec![fathom_block::HOUR_NANOS]);
        let rollup = store
            .get(&fathom_block::block_file(
                &b.tenant,
                &b.id,
                fathom_block::files::ROLLUP,
            ))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let rows: usize =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(rollup)
                .unwrap()
                .build()
                .unwrap()
                .map(|b| b.unwrap().num_rows())
                .sum();
        assert!(rows > 0 && rows <= 3, "{rows} rollup rows");
        let syms = fathom_block::read_symbols(store.as_ref(), b).await.unwrap();
        assert_eq!(syms.functions.len(), 3, "symbol tables merged");

        // The sources' files are gone (delete delay 0) and purged.
        assert!(index.pending_deletions().await.unwrap().is_empty());
        for m in &metas {
            let left: Vec<_> = store
                .list(Some(&block_dir(&m.tenant, &m.id)))
                .try_collect()
                .await
                .unwrap();
            assert!(left.is_empty(), "{} still has {} files", m.id, left.len());
        }
    }

    /// Sources that overlap as replicas do: the merged rows come sorted
    /// (no sort left to the encoder), each profile once with the first
    /// source's rows.
    #[tokio::test]
    async fn merged_rows_are_sorted_and_each_profile_the_first_sources() {
        let store = object_store::memory::InMemory::new();
        let metas = vec![
            block(&store, &[(1, T0 + 1, 10), (2, T0 + 2, 20), (3, T0 + 3, 30)]).await,
            block(&store, &[(2, T0 + 2, 21), (3, T0 + 3, 31), (4, T0 + 4, 41)]).await,
            block(&store, &[(1, T0 + 1, 12), (4, T0 + 4, 42), (5, T0 + 5, 52)]).await,
        ];
        let merged = merge(&store, &metas).await.unwrap();
        assert_eq!(merged.stats.duplicates, 4);
        // The second and third sources' duplicates' rows are not read.
        assert_eq!(merged.stats.rows_not_read, 4);
        let rows: Vec<RecordBatch> = merged.samples().unwrap().map(Result::unwrap).collect();
        assert!(fathom_block::samples_sorted(&rows));
        let mut got = merged_values(&merged);
        got.sort();
        let want: Vec<(Id, i64)> = [(1, 10), (2, 20), (3, 30), (4, 41), (5, 52)]
            .into_iter()
            .map(|(p, v)| (Id::from_u128(p), v))
            .collect();
        assert_eq!(got, want);
    }

    /// Every sample row of `data` as (profile, value), in its order.
    fn merged_values(merged: &Merged) -> Vec<(Id, i64)> {
        let mut got = Vec::new();
        for b in merged.samples().unwrap() {
            let b = &b.unwrap();
            let pid = id_col(b, columns::PROFILE_ID).unwrap();
            let v = b
                .column_by_name(columns::VALUE)
                .and_then(|c| c.as_any().downcast_ref::<arrow::array::Int64Array>())
                .unwrap();
            for i in 0..b.num_rows() {
                got.push((Id::from_slice(pid.value(i)).unwrap(), v.value(i)));
            }
        }
        got
    }

    /// A source whose every profile an earlier source gave is not read:
    /// with its samples and symbol files gone from the store, the merge
    /// still succeeds, with the first source's rows.
    #[tokio::test]
    async fn a_source_of_duplicates_alone_is_not_read() {
        let store = object_store::memory::InMemory::new();
        let profiles = [(1, T0 + 1, 10), (2, T0 + 2, 20)];
        let first = block(&store, &profiles).await;
        let copy = block(&store, &[(1, T0 + 1, 11), (2, T0 + 2, 21)]).await;
        store
            .delete(&fathom_block::block_file(
                &copy.tenant,
                &copy.id,
                fathom_block::files::SAMPLES,
            ))
            .await
            .unwrap();
        drop_symbols(&store, &copy).await;
        let merged = merge(&store, &[first, copy]).await.unwrap();
        assert_eq!(
            merged.stats,
            MergeStats {
                duplicates: 2,
                rows_not_read: 2,
                symbol_tables_not_read: 1,
            }
        );
        let want: Vec<(Id, i64)> = profiles
            .iter()
            .map(|&(p, _, v)| (Id::from_u128(p), v))
            .collect();
        assert_eq!(merged_values(&merged), want);
        assert_eq!(merged.data.symbols.functions.len(), 2);
    }

    /// Deletes a block's symbol files (so that reading them fails).
    async fn drop_symbols(store: &dyn ObjectStore, b: &BlockMeta) {
        for f in [
            fathom_block::files::FUNCTIONS,
            fathom_block::files::LOCATIONS,
            fathom_block::files::STACKS,
            fathom_block::files::MAPPINGS,
        ] {
            store
                .delete(&fathom_block::block_file(&b.tenant, &b.id, f))
                .await
                .unwrap();
        }
    }

    /// A partly duplicated source whose new profile samples only stacks
    /// an earlier source holds: its symbol table is not read (its files
    /// are gone from the store here), and the merged table is whole.
    #[tokio::test]
    async fn a_new_profile_of_known_stacks_needs_no_symbols() {
        let store = object_store::memory::InMemory::new();
        let name = |p: u128| ["a", "b", "a"][p as usize - 1].to_owned();
        let first = block_named(&store, &[(1, T0 + 1, 10), (2, T0 + 2, 20)], name, |_| {}).await;
        let second = block_named(&store, &[(2, T0 + 2, 21), (3, T0 + 3, 30)], name, |_| {}).await;
        drop_symbols(&store, &second).await;
        let merged = merge(&store, &[first, second]).await.unwrap();
        assert_eq!(
            merged.stats,
            MergeStats {
                duplicates: 1,
                rows_not_read: 1,
                symbol_tables_not_read: 1,
            }
        );
        let want: Vec<(Id, i64)> = [(1, 10), (2, 20), (3, 30)]
            .into_iter()
            .map(|(p, v)| (Id::from_u128(p), v))
            .collect();
        assert_eq!(merged_values(&merged), want);
        assert_eq!(merged.data.symbols.functions.len(), 2);
        assert_eq!(merged.data.symbols.stacks.len(), 2);
    }

    /// A partly duplicated source of several pages: only its new
    /// profiles' rows, which cross a page boundary, are read, and the
    /// merge holds every profile once with the first source's value.
    #[tokio::test]
    async fn a_partly_duplicated_source_is_read_only_where_it_is_new() {
        let store = object_store::memory::InMemory::new();
        let n: u128 = 45_000;
        let (lo, hi) = (18_000, 26_000);
        let all: Vec<(u128, i64, i64)> = (0..n).map(|p| (p, T0 + p as i64, 2)).collect();
        let first: Vec<(u128, i64, i64)> = all
            .iter()
            .filter(|p| !(lo..hi).contains(&p.0))
            .map(|&(p, t, _)| (p, t, 1))
            .collect();
        let metas = vec![block(&store, &first).await, block(&store, &all).await];
        let merged = merge(&store, &metas).await.unwrap();
        let dups = (n - (hi - lo)) as u64;
        assert_eq!(
            merged.stats,
            MergeStats {
                duplicates: dups,
                rows_not_read: dups,
                symbol_tables_not_read: 0,
            }
        );
        // The new profiles' functions came from the second table.
        assert_eq!(merged.data.symbols.functions.len(), n as usize);
        let got = merged_values(&merged);
        let want: Vec<(Id, i64)> = (0..n)
            .map(|p| (Id::from_u128(p), if (lo..hi).contains(&p) { 2 } else { 1 }))
            .collect();
        assert_eq!(got, want);
    }

    /// A source whose profile table's row counts do not describe its
    /// samples (they add up wrong, or add up but lie about which rows
    /// are whose) is read whole, and the merge is still each profile
    /// once.
    #[tokio::test]
    async fn row_counts_that_do_not_match_fall_back_to_every_row() {
        let profiles = [(1, T0 + 1, 10), (2, T0 + 2, 20), (3, T0 + 3, 30)];
        for counts in [[1, 2, 1], [2, 0, 1]] {
            let store = object_store::memory::InMemory::new();
            let first = block(&store, &[(2, T0 + 2, 21)]).await;
            let lying = block_with(&store, &profiles, |d| {
                for (p, c) in d.profiles.iter_mut().zip(counts) {
                    p.samples = c;
                }
            })
            .await;
            let merged = merge(&store, &[first, lying]).await.unwrap();
            assert_eq!(
                merged.stats,
                MergeStats {
                    duplicates: 1,
                    rows_not_read: 0,
                    symbol_tables_not_read: 0,
                },
                "counts {counts:?}"
            );
            let want: Vec<(Id, i64)> = [(1, 10), (2, 21), (3, 30)]
                .into_iter()
                .map(|(p, v)| (Id::from_u128(p), v))
                .collect();
            let mut got = merged_values(&merged);
            got.sort();
            assert_eq!(got, want, "counts {counts:?}");
        }
    }

    /// Rewrites a block's samples file with its rows in reverse order
    /// (out of the block's order), as no writer of this project does.
    async fn reverse_samples(store: &dyn ObjectStore, b: &BlockMeta) {
        let rows = fathom_block::read_samples(store, b).await.unwrap();
        let all = arrow::compute::concat_batches(&fathom_block::samples_schema(), &rows).unwrap();
        let n = all.num_rows() as u32;
        let idx = arrow::array::UInt32Array::from_iter_values((0..n).rev());
        let reversed = arrow::compute::take_record_batch(&all, &idx).unwrap();
        let mut out = Vec::new();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(&mut out, reversed.schema(), None).unwrap();
        w.write(&reversed).unwrap();
        w.close().unwrap();
        let path = fathom_block::block_file(&b.tenant, &b.id, fathom_block::files::SAMPLES);
        store.put(&path, out.into()).await.unwrap();
    }

    /// The fallback for sources out of the block's order: the merged
    /// rows come out of order, the encoder refuses them, and the rows
    /// are then filtered of a source's duplicate profiles and sorted:
    /// the block is each profile once, in order.
    #[tokio::test]
    async fn sources_out_of_order_are_sorted_without_their_duplicates() {
        let store = object_store::memory::InMemory::new();
        let first = block(&store, &[(1, T0 + 1, 10), (2, T0 + 2, 20)]).await;
        let second = block(&store, &[(2, T0 + 2, 21), (3, T0 + 3, 31)]).await;
        for b in [&first, &second] {
            reverse_samples(&store, b).await;
        }
        let merged = merge(&store, &[first, second]).await.unwrap();
        let rows: Vec<RecordBatch> = merged.samples().unwrap().map(Result::unwrap).collect();
        assert!(!fathom_block::samples_sorted(&rows));
        let (meta, files) = merged.encode().unwrap();
        fathom_block::write_block(&store, &meta, files)
            .await
            .unwrap();
        let stored = fathom_block::read_samples(&store, &meta).await.unwrap();
        assert!(fathom_block::samples_sorted(&stored));
        let want: BTreeMap<Id, i64> = [(1, 10), (2, 20), (3, 31)]
            .into_iter()
            .map(|(p, v)| (Id::from_u128(p), v))
            .collect();
        assert_eq!(totals(&store, &meta).await, want);
    }

    #[tokio::test]
    async fn a_job_taken_again_writes_the_same_block() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let a = block(store.as_ref(), &[(1, T0 + 1, 10)]).await;
        let b = block(store.as_ref(), &[(1, T0 + 1, 10)]).await;
        let job = plan_at(&[a.clone(), b.clone()], T0, Duration::ZERO).remove(0);
        // A compactor that died after writing, before the index swap: its
        // block is written but not registered.
        let merged = merge(store.as_ref(), &job.blocks).await.unwrap();
        let (mut meta, files) = merged.encode().unwrap();
        meta.id = derived_id(&job.blocks);
        fathom_block::write_block(store.as_ref(), &meta, files)
            .await
            .unwrap();

        let (c, _) = compactor_over(&store, vec![a.clone(), b.clone()]);
        let out = c.run_job(&job).await.unwrap().unwrap();
        assert_eq!(out.id, meta.id, "the retried job overwrites the same block");
        let blocks = fathom_block::list_blocks(store.as_ref()).await.unwrap();
        let ids: Vec<&str> = blocks.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids.iter().filter(|i| **i == out.id).count(), 1);
        assert_eq!(
            blocks.len(),
            3,
            "two sources (deleted later) and one result, no orphan: {ids:?}"
        );
    }

    #[tokio::test]
    async fn leases_keep_two_compactors_apart() {
        let index = MemoryCompactionIndex::default();
        let ttl = Duration::from_secs(60);
        assert!(index.acquire("j", "a", ttl).await.unwrap());
        assert!(!index.acquire("j", "b", ttl).await.unwrap());
        assert!(index.acquire("j", "a", ttl).await.unwrap(), "renewal");
        index.release("j", "b").await.unwrap();
        assert!(
            !index.acquire("j", "b", ttl).await.unwrap(),
            "b cannot release a's lease"
        );
        index.release("j", "a").await.unwrap();
        assert!(index.acquire("j", "b", ttl).await.unwrap());
    }

    #[tokio::test]
    async fn retention_overrides_come_first() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let old = block(store.as_ref(), &[(1, T0, 1)]).await;
        let index = Arc::new(MemoryCompactionIndex::new(vec![old.clone()]));
        let mut config = cfg();
        config.delete_delay = Duration::from_secs(3600);
        // The flag keeps t1 forever; the tenants file says 7 days.
        config.tenant_retention.insert(
            old.tenant.clone(),
            Duration::from_secs(u32::MAX as u64 * 1000),
        );
        let tenant = old.tenant.clone();
        config.retention_overrides = Some(RetentionOverrides(Arc::new(move |t: &str| {
            (t == tenant).then(|| Duration::from_secs(7 * 86_400))
        })));
        let c = Compactor::new(
            config,
            store.clone(),
            index.clone(),
            &mut Registry::default(),
        );
        assert_eq!(c.apply_retention(now_ms()).await.unwrap(), 1);
        assert!(index.all().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn retention_removes_old_blocks_per_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let old = block(store.as_ref(), &[(1, T0, 1)]).await;
        let recent_t = (now_ms() - 60_000) * 1_000_000;
        let recent = block(store.as_ref(), &[(2, recent_t, 1)]).await;
        let index = Arc::new(MemoryCompactionIndex::new(vec![
            old.clone(),
            recent.clone(),
        ]));
        let mut config = cfg();
        config.delete_delay = Duration::from_secs(3600);
        config
            .tenant_retention
            .insert("t1".into(), Duration::from_secs(7 * 86_400));
        let c = Compactor::new(
            config,
            store.clone(),
            index.clone(),
            &mut Registry::default(),
        );
        assert_eq!(c.apply_retention(now_ms()).await.unwrap(), 1);
        let left: Vec<String> = index
            .all()
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.id)
            .collect();
        assert_eq!(left, vec![recent.id.clone()]);
        // Within the delete delay the files stay.
        assert_eq!(c.delete_removed(now_ms()).await.unwrap(), 0);
        assert!(
            fathom_block::read_meta(store.as_ref(), "t1", &old.id)
                .await
                .unwrap()
                .is_some()
        );
        assert_eq!(c.delete_removed(now_ms() + 3_600_001).await.unwrap(), 1);
        assert!(
            fathom_block::read_meta(store.as_ref(), "t1", &old.id)
                .await
                .unwrap()
                .is_none()
        );
    }
}
