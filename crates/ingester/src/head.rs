//! The per-tenant in-memory head: what has been acknowledged and not yet
//! cut into a block. A profile's samples stay in the vector they were
//! decoded into (stack id and value, 24 bytes a sample); the series,
//! time and profile id a block's sample row repeats are held once a
//! profile, and the rows of a block's sample table are built when the
//! head is read (a snapshot) or cut, not on the write path.

use std::sync::Arc;

use arrow::array::RecordBatch;
use fathom_block::{BlockData, ProfileRow, SeriesRow, samples_batch};
use fathom_model::{Id, IdMap, IdSet, IngestBatch, Profile, Sample, Symbols};

/// Rows of one batch a head's samples are read as (a snapshot, a cut);
/// a profile with more rows is one batch of its own.
const BATCH_ROWS: usize = 1 << 16;

/// What the head's size estimate counts a sample at: the figure it used
/// when it held 64-byte rows, kept so that blocks are cut at the same
/// sizes. The head holds 24 bytes a sample, but a cut or a snapshot of a
/// whole head builds the wide rows, so `--max-head-size` and
/// `--max-head-memory` count that width rather than what is held.
const ROW_BYTES_READ: usize = 56;

/// The bytes a head holds for one sample: its stack id and value, in
/// the vector the profile was decoded into ([`HeadSamples`]).
pub const HEAD_SAMPLE_BYTES: usize = std::mem::size_of::<Sample>();

/// One profile's samples as a head holds them: the vector its profile
/// was decoded into, moved in (stack id and value, 24 bytes a sample),
/// and the three values every row of the profile repeats, once.
pub(crate) struct HeadSamples {
    profile_id: Id,
    series_id: Id,
    time_nanos: i64,
    samples: Vec<Sample>,
}

/// The profiles of one write, shared with the snapshots taken while the
/// head grows (a snapshot clones these under the head's lock and reads
/// them as rows after releasing it).
pub(crate) type Chunk = Arc<[HeadSamples]>;

/// One tenant's head.
#[derive(Default)]
pub(crate) struct TenantHead {
    pub(crate) series: IdMap<SeriesRow>,
    pub(crate) profiles: Vec<ProfileRow>,
    profile_ids: IdSet,
    /// The samples of every write, one chunk a write, oldest first.
    chunks: Vec<Chunk>,
    /// Shared with the blocks cut from this head: a cut encodes the
    /// frozen head's table where it is, not a copy of it (writes go to
    /// an active head, the only holder then).
    pub(crate) symbols: Arc<Symbols>,
    pub(crate) sample_rows: usize,
    pub(crate) bytes: usize,
}

/// A batch made ready for a head outside the head's write lock: its
/// series ids computed and, with a shared lock, the symbols the head
/// already holds dropped ([`Prepared::drop_known`]). What is left under
/// the write lock is inserting ids, moving each profile's samples in and
/// the new symbols.
pub(crate) struct Prepared {
    tenant: fathom_model::TenantId,
    profiles: Vec<Profile>,
    series_ids: Vec<Id>,
    symbols: Symbols,
}

impl Prepared {
    /// Makes `batch` ready: series ids, and a sample vector with more
    /// than an eighth to spare (a decoder's growth) reallocated to its
    /// length, since the head keeps it (an allocator may keep a block in
    /// place when less than half of it is spare).
    pub(crate) fn new(batch: IngestBatch) -> Self {
        let IngestBatch {
            tenant,
            mut profiles,
            symbols,
        } = batch;
        let series_ids: Vec<Id> = profiles.iter().map(Profile::series_id).collect();
        for p in &mut profiles {
            let len = p.samples.len();
            if p.samples.capacity() > len + len / 8 {
                p.samples.shrink_to_fit();
            }
        }
        Prepared {
            tenant,
            profiles,
            series_ids,
            symbols,
        }
    }

    /// Drops the symbols `known` (the table of the head the batch goes
    /// to) holds already. The caller needs a shared lock on it only,
    /// writers side by side; the head must stay the one the batch is
    /// applied to (no cut in between), or the symbols dropped would be
    /// missing from it.
    pub(crate) fn drop_known(&mut self, known: &Symbols) {
        self.symbols.remove_held_by(known);
    }

    /// The WAL record of what is left: after [`Prepared::drop_known`], of
    /// format 5 when it names a stack or location the head holds
    /// ([`fathom_proto::WRITE_FORMAT_HELD`]), which replay finds in the
    /// head that the records before it rebuilt.
    pub(crate) fn record(&self) -> Vec<u8> {
        fathom_proto::encode_write(&self.tenant, &self.profiles, &self.symbols)
    }
}

/// The rows ([`fathom_block::samples_schema`]) of the profiles of
/// `chunks` that `keep` selects, in batches of about [`BATCH_ROWS`].
fn sample_batches(
    chunks: &[Chunk],
    mut keep: impl FnMut(&HeadSamples) -> bool,
) -> Vec<RecordBatch> {
    let batch = |group: &[&HeadSamples], rows| {
        samples_batch(
            rows,
            group
                .iter()
                .map(|p| (&p.series_id, p.time_nanos, &p.profile_id, &p.samples[..])),
        )
    };
    let mut out = Vec::new();
    let mut group: Vec<&HeadSamples> = Vec::new();
    let mut rows = 0;
    let kept = chunks.iter().flat_map(|c| c.iter());
    for p in kept.filter(|p| !p.samples.is_empty() && keep(p)) {
        group.push(p);
        rows += p.samples.len();
        if rows >= BATCH_ROWS {
            out.push(batch(&group, rows));
            group.clear();
            rows = 0;
        }
    }
    if !group.is_empty() {
        out.push(batch(&group, rows));
    }
    out
}

/// A profile's samples by stack id: as they are when already in that
/// order (the pprof normalizer's output is, so every replica of a write
/// skips the sort), else a sorted copy.
fn by_stack(p: &HeadSamples) -> std::borrow::Cow<'_, [Sample]> {
    if p.samples.is_sorted_by_key(|x| x.stack) {
        std::borrow::Cow::Borrowed(&p.samples[..])
    } else {
        let mut v = p.samples.clone();
        v.sort_unstable_by_key(|x| x.stack);
        std::borrow::Cow::Owned(v)
    }
}

/// Every row of a head's chunks in the order a block stores them
/// (series, time, profile, stack), a batch of about [`BATCH_ROWS`] at a
/// time, each built when asked for: the profiles are sorted up front (a
/// few thousand, not the rows), each profile's samples by stack as its
/// batch is built. A cut encodes each batch and drops it before the next
/// ([`fathom_block::encode_sorted_block`]): the head's wide rows are never
/// all in memory, and the block writer neither copies them into one batch
/// nor sorts them.
struct SortedRows {
    chunks: Vec<Chunk>,
    /// (chunk, profile in it) of every profile with samples, in order.
    order: Vec<(usize, usize)>,
    /// The next profile of `order` to give rows of.
    at: usize,
}

impl SortedRows {
    /// The rows of `chunks`' profiles, or of those `keep` names.
    fn new(chunks: Vec<Chunk>, keep: Option<&IdSet>) -> Self {
        let mut order: Vec<(usize, usize)> = chunks
            .iter()
            .enumerate()
            .flat_map(|(c, chunk)| {
                chunk
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| {
                        !p.samples.is_empty() && keep.is_none_or(|k| k.contains(&p.profile_id))
                    })
                    .map(move |(i, _)| (c, i))
            })
            .collect();
        order.sort_unstable_by_key(|&(c, i)| {
            let p = &chunks[c][i];
            (p.series_id, p.time_nanos, p.profile_id)
        });
        SortedRows {
            chunks,
            order,
            at: 0,
        }
    }
}

impl Iterator for SortedRows {
    type Item = RecordBatch;

    fn next(&mut self) -> Option<RecordBatch> {
        let profile = |&(c, i): &(usize, usize)| &self.chunks[c][i];
        let rest = self.order.get(self.at..).filter(|r| !r.is_empty())?;
        let mut rows = 0;
        let mut n = 0;
        while n < rest.len() && rows < BATCH_ROWS {
            rows += profile(&rest[n]).samples.len();
            n += 1;
        }
        let group: Vec<&HeadSamples> = rest[..n].iter().map(profile).collect();
        let sorted: Vec<_> = group.iter().map(|p| by_stack(p)).collect();
        self.at += n;
        Some(samples_batch(
            rows,
            group
                .iter()
                .zip(&sorted)
                .map(|(p, s)| (&p.series_id, p.time_nanos, &p.profile_id, &s[..])),
        ))
    }
}

impl TenantHead {
    /// Adds a batch; profiles whose id is already present are skipped
    /// (replays and retries are idempotent). Returns the samples added.
    /// Takes the batch by value: its symbols move into the head's table
    /// (new entries only), nothing is cloned.
    pub(crate) fn apply(&mut self, batch: IngestBatch) -> usize {
        self.apply_prepared(Prepared::new(batch))
    }

    /// [`TenantHead::apply`] of a batch prepared outside the lock: each
    /// new profile's sample vector moves into the head as it is.
    pub(crate) fn apply_prepared(&mut self, prepared: Prepared) -> usize {
        let Prepared {
            profiles,
            series_ids,
            tenant: _,
            symbols,
        } = prepared;
        let mut chunk = Vec::with_capacity(profiles.len());
        let mut added = 0usize;
        for (p, sid) in profiles.into_iter().zip(series_ids) {
            // Profiles already held (a retry, a replay) are left out.
            if !self.profile_ids.insert(p.id) {
                continue;
            }
            self.series
                .entry(sid)
                .or_insert_with(|| SeriesRow::of(&p))
                .include(p.time_nanos);
            self.profiles.push(ProfileRow::of(&p, sid));
            added += p.samples.len();
            chunk.push(HeadSamples {
                profile_id: p.id,
                series_id: sid,
                time_nanos: p.time_nanos,
                samples: p.samples,
            });
        }
        if added == 0 {
            return 0;
        }
        let before = self.symbols.stacks.len() + self.symbols.locations.len();
        Arc::make_mut(&mut self.symbols).merge_owned(symbols);
        let new_syms = self.symbols.stacks.len() + self.symbols.locations.len() - before;
        self.chunks.push(chunk.into());
        self.sample_rows += added;
        // ~200 bytes a symbol entry: an estimate for the size trigger,
        // not an account.
        self.bytes += added * ROW_BYTES_READ + new_syms * 200 + 100;
        added
    }

    /// The block of this head, its sample rows not yet built
    /// ([`UnbuiltBlock::encode`], CPU work for the blocking pool).
    pub(crate) fn to_block(&self, tenant: String, source: String) -> UnbuiltBlock {
        let series = self.series.values().cloned().collect();
        let symbols = Arc::clone(&self.symbols);
        self.unbuilt(
            tenant,
            source,
            (series, self.profiles.clone(), symbols),
            None,
        )
    }

    /// The block of the profiles `keep` names, a part of this head: the
    /// series they belong to (each spanning its kept profiles' times) and
    /// the symbols their samples name, nothing else.
    pub(crate) fn to_block_of(&self, tenant: String, source: String, keep: IdSet) -> UnbuiltBlock {
        let mut series: IdMap<SeriesRow> = IdMap::default();
        let mut profiles = Vec::with_capacity(keep.len());
        for p in self
            .profiles
            .iter()
            .filter(|p| keep.contains(&p.profile_id))
        {
            if let Some(s) = series.get_mut(&p.series_id) {
                s.include(p.time_nanos);
            } else if let Some(s) = self.series.get(&p.series_id) {
                let mut s = s.clone();
                s.min_time_nanos = p.time_nanos;
                s.max_time_nanos = p.time_nanos;
                series.insert(p.series_id, s);
            }
            profiles.push(p.clone());
        }
        let mut stacks = IdSet::default();
        let kept = self.chunks.iter().flat_map(|c| c.iter());
        for p in kept.filter(|p| keep.contains(&p.profile_id)) {
            let mut last = None;
            for s in &p.samples {
                // A profile's samples usually come in stack order.
                if last != Some(s.stack) {
                    stacks.insert(s.stack);
                    last = Some(s.stack);
                }
            }
        }
        let symbols = Arc::new(self.symbols.subset(&stacks));
        let rows = (series.into_values().collect(), profiles, symbols);
        self.unbuilt(tenant, source, rows, Some(keep))
    }

    /// A level-0 block of these series, profiles and symbols, whose rows
    /// are those of the head's profiles `keep` names (all: none).
    fn unbuilt(
        &self,
        tenant: String,
        source: String,
        (series, profiles, symbols): (Vec<SeriesRow>, Vec<ProfileRow>, Arc<Symbols>),
        keep: Option<IdSet>,
    ) -> UnbuiltBlock {
        UnbuiltBlock {
            data: BlockData {
                tenant,
                source,
                level: 0,
                compacted_from: Vec::new(),
                series,
                profiles,
                samples: Vec::new(),
                symbols,
                rollup_widths_nanos: Vec::new(),
            },
            chunks: self.chunks.clone(),
            keep,
        }
    }

    /// Every sample as rows, oldest write first.
    #[cfg(test)]
    pub(crate) fn batches(&self) -> Vec<RecordBatch> {
        sample_batches(&self.chunks, |_| true)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }
}

/// A head's block before its sample rows are built: everything else
/// copied, the samples shared with the head.
pub(crate) struct UnbuiltBlock {
    data: BlockData,
    chunks: Vec<Chunk>,
    /// The profiles of `chunks` the block holds; none: every one.
    keep: Option<IdSet>,
}

impl UnbuiltBlock {
    /// The block's files, its sample rows built from the head's chunks a
    /// batch at a time as they are encoded ([`SortedRows`]).
    pub(crate) fn encode(self) -> Result<EncodedBlock, fathom_block::Error> {
        let UnbuiltBlock { data, chunks, keep } = self;
        fathom_block::encode_sorted_block(&data, SortedRows::new(chunks, keep.as_ref()))
    }

    /// The sample rows [`UnbuiltBlock::encode`] writes, in its order.
    #[cfg(test)]
    fn sorted_rows(self) -> Vec<RecordBatch> {
        SortedRows::new(self.chunks, self.keep.as_ref()).collect()
    }
}

/// A block's meta and files, as [`fathom_block::encode_block`] gives them.
pub(crate) type EncodedBlock = (fathom_block::BlockMeta, Vec<(&'static str, bytes::Bytes)>);

/// A consistent view of one tenant's head for a query: what
/// [`crate::Ingester::snapshot`] returns in process, what the head-read
/// Flight service sends (series and profiles as the JSON app metadata of
/// the first message, samples as the Arrow batches) and what
/// [`crate::FlightHeads`] gives back.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct HeadSnapshot {
    pub series: Vec<SeriesRow>,
    pub profiles: Vec<ProfileRow>,
    /// Rows in `fathom_block::samples_schema()` of the profiles in
    /// `profiles`; travel as Flight batches, not in the metadata.
    #[serde(skip)]
    pub samples: Vec<RecordBatch>,
}

impl HeadSnapshot {
    /// Takes `h`'s series and profiles in `[start, end]`, and its sample
    /// chunks into `chunks` (shared, not copied): the part of a snapshot
    /// done under the head's lock. The heads of one snapshot are taken in
    /// turn (the active head, then those being cut): a profile that an
    /// earlier one gave (`taken`) is left out.
    ///
    /// A head skips a profile it holds, but not one that a head cut since
    /// holds: a retry that comes after a cut (a client's, or a
    /// distributor's resend of a write a replica refused) puts a second
    /// copy in the active head while the first is still being stored. A
    /// snapshot gives each profile once: the querier counts a profile id
    /// once a query and leaves its other copies out by id, which for a
    /// second copy in the same source would leave out both.
    pub(crate) fn extend_from(
        &mut self,
        h: &TenantHead,
        start: i64,
        end: i64,
        chunks: &mut Vec<Chunk>,
        taken: &mut IdSet,
    ) {
        self.series.extend(
            h.series
                .values()
                .filter(|s| s.min_time_nanos <= end && s.max_time_nanos >= start)
                .cloned(),
        );
        self.profiles.extend(
            h.profiles
                .iter()
                .filter(|p| p.time_nanos >= start && p.time_nanos <= end)
                .filter(|p| taken.insert(p.profile_id))
                .cloned(),
        );
        chunks.extend(h.chunks.iter().cloned());
    }

    /// Adds the rows of the profiles of `chunks` in `[start, end]`: the
    /// part of a snapshot done after the lock is released. `chunks` in
    /// the order [`HeadSnapshot::extend_from`] took them: the rows of a
    /// profile are those of its first copy, the one whose row it kept.
    pub(crate) fn add_samples(&mut self, chunks: &[Chunk], start: i64, end: i64) {
        let mut seen = IdSet::default();
        self.samples.extend(sample_batches(chunks, |p| {
            p.time_nanos >= start && p.time_nanos <= end && seen.insert(p.profile_id)
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;

    /// One batch of the test batches of `(seed, value)`.
    fn batch(profiles: &[(u64, i64)]) -> IngestBatch {
        let mut out = IngestBatch {
            tenant: fathom_model::TenantId::new("t").unwrap(),
            profiles: Vec::new(),
            symbols: Symbols::default(),
        };
        for &(seed, value) in profiles {
            let b = crate::tests::batch("t", seed, value);
            out.profiles.extend(b.profiles);
            out.symbols.merge_owned(b.symbols);
        }
        out
    }

    fn values(h: &TenantHead) -> Vec<i64> {
        let mut v: Vec<i64> = h
            .batches()
            .iter()
            .flat_map(|b| b.column(4).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn a_prepared_batch_leaves_out_profiles_held_and_symbols_known() {
        let mut h = TenantHead::default();
        assert_eq!(h.apply(batch(&[(1, 10), (2, 20)])), 2);
        // Profile 2 again (a retry) beside a new one, 3.
        let mut p = Prepared::new(batch(&[(2, 20), (3, 30)]));
        p.drop_known(&h.symbols);
        let s = &p.symbols;
        assert_eq!(
            (s.stacks.len(), s.locations.len(), s.functions.len()),
            (1, 1, 0),
            "only profile 3's stack and location are new"
        );
        assert_eq!(h.apply_prepared(p), 1);
        assert_eq!(values(&h), [10, 20, 30]);
        assert_eq!(h.profiles.len(), 3);
        assert_eq!(h.symbols.stacks.len(), 3);
        // Every stack the head's rows name is in its table.
        for b in h.batches() {
            for id in b.column(3).as_fixed_size_binary().iter().flatten() {
                let id = Id(id.try_into().unwrap());
                assert!(h.symbols.stacks.contains_key(&id), "{id:?}");
            }
        }
        // All held: nothing added, nothing merged.
        let mut p = Prepared::new(batch(&[(1, 10), (3, 30)]));
        p.drop_known(&h.symbols);
        assert!(p.symbols.is_empty());
        assert_eq!(h.apply_prepared(p), 0);
        assert_eq!(values(&h), [10, 20, 30]);
    }

    /// Every row of the head as (series, time, profile, stack, value), in
    /// the order of `batches`.
    fn all_rows(batches: &[RecordBatch]) -> Vec<(Id, i64, Id, Id, i64)> {
        let id = |b: &RecordBatch, c: usize, i: usize| {
            Id(b.column(c)
                .as_fixed_size_binary()
                .value(i)
                .try_into()
                .unwrap())
        };
        batches
            .iter()
            .flat_map(|b| {
                let time = b.column(1).as_primitive::<Int64Type>();
                let value = b.column(4).as_primitive::<Int64Type>();
                (0..b.num_rows()).map(move |i| {
                    (
                        id(b, 0, i),
                        time.value(i),
                        id(b, 2, i),
                        id(b, 3, i),
                        value.value(i),
                    )
                })
            })
            .collect()
    }

    /// A cut gives the head's rows sorted as the block stores them, over
    /// several batches, though the head took its profiles out of order and
    /// their samples unsorted.
    #[test]
    fn a_built_block_holds_the_rows_in_the_order_it_stores_them() {
        let mut h = TenantHead::default();
        let stack = |i: u64| fathom_model::IdHasher::new("stack").u64(i).finish();
        for (seed, n) in [(5, 3u64), (2, BATCH_ROWS as u64 + 7), (9, 1), (1, 4)] {
            let mut b = batch(&[(seed, 0)]);
            // Stacks in an order that is not theirs, values to tell rows apart.
            b.profiles[0].samples = (0..n)
                .rev()
                .map(|i| Sample {
                    stack: stack(i),
                    value: (seed * 1_000_000 + i) as i64,
                })
                .collect();
            h.apply(b);
        }
        let as_taken = h.batches();
        assert!(!fathom_block::samples_sorted(&as_taken));
        let sorted = h.to_block("t".into(), "test".into()).sorted_rows();
        assert!(sorted.len() > 1, "several batches");
        assert!(fathom_block::samples_sorted(&sorted));
        let mut want = all_rows(&as_taken);
        want.sort_unstable();
        assert_eq!(all_rows(&sorted), want);
        // The block stores those rows, a batch at a time.
        let (meta, _) = h.to_block("t".into(), "test".into()).encode().unwrap();
        assert_eq!(meta.stats.samples, want.len() as u64);
    }

    /// A part of a head ([`TenantHead::to_block_of`]): the kept profiles,
    /// their series spanning the kept profiles' times alone, and only the
    /// symbols their samples name.
    #[test]
    fn a_part_holds_its_profiles_their_series_and_symbols_alone() {
        let mut h = TenantHead::default();
        for (seed, svc) in [(1, "a"), (2, "a"), (3, "b")] {
            let mut b = crate::tests::batch("t", seed, 1);
            b.profiles[0].labels =
                fathom_model::Labels::from_pairs([("service_name", svc)]).unwrap();
            h.apply(b);
        }
        assert_eq!(h.symbols.stacks.len(), 3);
        // Profiles 2 (of "a", whose series also has 1) and 3.
        let keep: IdSet = h
            .profiles
            .iter()
            .filter(|p| p.time_nanos != 1_001)
            .map(|p| p.profile_id)
            .collect();
        let block = h.to_block_of("t".into(), "test".into(), keep.clone());
        let got: IdSet = block.data.profiles.iter().map(|p| p.profile_id).collect();
        assert_eq!(got, keep);
        let mut spans: Vec<(i64, i64)> = block
            .data
            .series
            .iter()
            .map(|s| (s.min_time_nanos, s.max_time_nanos))
            .collect();
        spans.sort_unstable();
        assert_eq!(spans, vec![(1_002, 1_002), (1_003, 1_003)]);
        let (meta, _) = block.encode().unwrap();
        assert_eq!(
            (meta.stats.series, meta.stats.profiles, meta.stats.samples),
            (2, 2, 2)
        );
        assert_eq!((meta.stats.stacks, meta.stats.locations), (2, 2));
        assert_eq!((meta.min_time_nanos, meta.max_time_nanos), (1_002, 1_003));
    }

    /// A cut's block reads the head's symbol table where it is: no copy
    /// of it is made (a large head's table would be held twice while
    /// the block is encoded). A later write to the head copies the table
    /// first and leaves the block's as it was.
    #[test]
    fn a_block_shares_its_heads_symbols() {
        let mut h = TenantHead::default();
        h.apply(batch(&[(1, 10), (2, 20)]));
        assert!(!h.symbols.stacks.is_empty());
        let block = h.to_block("t".into(), "test".into());
        assert!(Arc::ptr_eq(&block.data.symbols, &h.symbols));
        let held = h.symbols.stacks.len();
        // Written to while a block holds the table (not something a cut
        // head sees, but the table must not change under the block).
        h.apply(batch(&[(3, 30)]));
        assert!(h.symbols.stacks.len() > held);
        assert_eq!(block.data.symbols.stacks.len(), held);
        let (meta, _) = block.encode().unwrap();
        assert_eq!(meta.stats.samples, 2);
    }

    /// A snapshot's rows are those of its profiles: one a sample, in
    /// the range asked for, each repeating its profile's series, time
    /// and id; a long read is cut into batches of about `BATCH_ROWS`.
    #[test]
    fn a_snapshot_reads_the_rows_of_its_profiles_in_range() {
        let mut h = TenantHead::default();
        let mut big = batch(&[(1, 10)]);
        let stack = big.profiles[0].samples[0].stack;
        big.profiles[0].samples = (0..BATCH_ROWS as i64 + 5)
            .map(|value| Sample { stack, value })
            .collect();
        h.apply(big);
        h.apply(batch(&[(2, 20), (3, 30)]));
        let (start, end) = (1_002, i64::MAX);
        let mut snap = HeadSnapshot::default();
        let mut chunks = Vec::new();
        snap.extend_from(&h, start, end, &mut chunks, &mut IdSet::default());
        snap.add_samples(&chunks, start, end);
        assert_eq!(snap.profiles.len(), 2, "profiles 2 and 3, at 1002 and 1003");
        let rows: Vec<(Id, i64, Id, i64)> = snap
            .samples
            .iter()
            .flat_map(|b| {
                let id = |c: usize, i: usize| {
                    Id(b.column(c)
                        .as_fixed_size_binary()
                        .value(i)
                        .try_into()
                        .unwrap())
                };
                let time = b.column(1).as_primitive::<Int64Type>();
                let value = b.column(4).as_primitive::<Int64Type>();
                (0..b.num_rows())
                    .map(|i| (id(0, i), time.value(i), id(2, i), value.value(i)))
                    .collect::<Vec<_>>()
            })
            .collect();
        let want: Vec<(Id, i64, Id, i64)> = snap
            .profiles
            .iter()
            .zip([20, 30])
            .map(|(p, v)| (p.series_id, p.time_nanos, p.profile_id, v))
            .collect();
        assert_eq!(rows, want);
        // The whole head: the long profile, then the two short ones.
        let all = h.batches();
        let sizes: Vec<usize> = all.iter().map(|b| b.num_rows()).collect();
        assert_eq!(sizes, [BATCH_ROWS + 5, 2]);
        assert_eq!(h.sample_rows, BATCH_ROWS + 7);
    }

    /// A profile that two heads of one snapshot hold (a retry applied to
    /// the active head after a cut, its first copy still being stored)
    /// is in the snapshot once: one row, and its samples once.
    #[test]
    fn a_snapshot_gives_a_profile_two_heads_hold_once() {
        let mut active = TenantHead::default();
        active.apply(batch(&[(2, 20), (3, 30)]));
        let mut cut = TenantHead::default();
        cut.apply(batch(&[(1, 10), (2, 20)]));
        let (start, end) = (0, i64::MAX);
        let mut snap = HeadSnapshot::default();
        let mut chunks = Vec::new();
        let mut taken = IdSet::default();
        snap.extend_from(&active, start, end, &mut chunks, &mut taken);
        snap.extend_from(&cut, start, end, &mut chunks, &mut taken);
        snap.add_samples(&chunks, start, end);
        let id = |seed: u64| batch(&[(seed, 0)]).profiles[0].id;
        let mut ids: Vec<Id> = snap.profiles.iter().map(|p| p.profile_id).collect();
        ids.sort();
        let mut want: Vec<Id> = vec![id(1), id(2), id(3)];
        want.sort();
        assert_eq!(ids, want, "each profile once");
        let mut rows: Vec<(Id, i64)> = Vec::new();
        for b in &snap.samples {
            let values = b.column(4).as_primitive::<Int64Type>();
            let profiles = b.column(2).as_fixed_size_binary();
            for i in 0..b.num_rows() {
                rows.push((Id(profiles.value(i).try_into().unwrap()), values.value(i)));
            }
        }
        rows.sort();
        let mut want_rows = vec![(id(1), 10), (id(2), 20), (id(3), 30)];
        want_rows.sort();
        assert_eq!(rows, want_rows, "each profile's samples once");
    }
}
