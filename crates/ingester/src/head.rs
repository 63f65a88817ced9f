//! The per-tenant in-memory head: what has been acknowledged and not yet
//! cut into a block, in the same row layout as a block's sample table.

use arrow::array::RecordBatch;
use fathom_block::{BlockData, ProfileRow, SamplesBuilder, SeriesRow, samples_schema};
use fathom_model::{Id, IdMap, IdSet, IngestBatch, Profile, Symbols};

/// Recent small sample batches are concatenated into one chunk when there
/// are this many, so a head holds few batches without copying old data again.
const RECENT_BATCHES: usize = 64;

/// One tenant's head.
#[derive(Default)]
pub(crate) struct TenantHead {
    pub(crate) series: IdMap<SeriesRow>,
    pub(crate) profiles: Vec<ProfileRow>,
    profile_ids: IdSet,
    /// Concatenated chunks of earlier writes.
    pub(crate) samples: Vec<RecordBatch>,
    /// One batch per recent write.
    recent: Vec<RecordBatch>,
    pub(crate) symbols: Symbols,
    pub(crate) sample_rows: usize,
    pub(crate) bytes: usize,
}

/// A batch made ready for a head outside the head's write lock: its
/// sample rows built with no lock and, with a shared one, the symbols the
/// head already holds dropped ([`Prepared::drop_known`]). What is left
/// under the write lock is inserting ids and the new symbols.
pub(crate) struct Prepared {
    tenant: fathom_model::TenantId,
    profiles: Vec<Profile>,
    series_ids: Vec<Id>,
    /// Every profile's sample rows, in profile order.
    rows: RecordBatch,
    symbols: Symbols,
}

impl Prepared {
    /// Builds `batch`'s sample rows.
    pub(crate) fn new(batch: IngestBatch) -> Self {
        let IngestBatch {
            tenant,
            profiles,
            symbols,
        } = batch;
        let series_ids: Vec<Id> = profiles.iter().map(Profile::series_id).collect();
        let rows = sample_rows(&profiles, &series_ids, |_| true);
        Prepared {
            tenant,
            profiles,
            series_ids,
            rows,
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

/// The sample rows of the profiles `keep` selects (by position).
fn sample_rows(
    profiles: &[Profile],
    series_ids: &[Id],
    keep: impl Fn(usize) -> bool,
) -> RecordBatch {
    let kept = || {
        profiles
            .iter()
            .zip(series_ids)
            .enumerate()
            .filter(|(i, _)| keep(*i))
    };
    let mut b = SamplesBuilder::with_capacity(kept().map(|(_, (p, _))| p.samples.len()).sum());
    for (_, (p, sid)) in kept() {
        b.push_profile_as_is(p, sid);
    }
    b.finish()
}

impl TenantHead {
    /// Adds a batch; profiles whose id is already present are skipped
    /// (replays and retries are idempotent). Returns the samples added.
    /// Takes the batch by value: its symbols move into the head's table
    /// (new entries only), nothing is cloned.
    pub(crate) fn apply(&mut self, batch: IngestBatch) -> usize {
        self.apply_prepared(Prepared::new(batch))
    }

    /// [`TenantHead::apply`] of a batch prepared outside the lock.
    pub(crate) fn apply_prepared(&mut self, prepared: Prepared) -> usize {
        let Prepared {
            profiles,
            series_ids,
            tenant: _,
            rows,
            symbols,
        } = prepared;
        // Profiles already held (a retry, a replay) are left out.
        let mut keep = Vec::with_capacity(profiles.len());
        for (p, sid) in profiles.iter().zip(&series_ids) {
            let new = self.profile_ids.insert(p.id);
            keep.push(new);
            if !new {
                continue;
            }
            self.series
                .entry(*sid)
                .or_insert_with(|| SeriesRow::of(p))
                .include(p.time_nanos);
            self.profiles.push(ProfileRow::of(p, *sid));
        }
        // Rare: the rows are built again without them.
        let rows = if keep.iter().all(|&k| k) {
            rows
        } else {
            sample_rows(&profiles, &series_ids, |i| keep[i])
        };
        let added = rows.num_rows();
        if added == 0 {
            return 0;
        }
        let before = self.symbols.stacks.len() + self.symbols.locations.len();
        self.symbols.merge_owned(symbols);
        let new_syms = self.symbols.stacks.len() + self.symbols.locations.len() - before;
        self.recent.push(rows);
        if self.recent.len() >= RECENT_BATCHES {
            match arrow::compute::concat_batches(&samples_schema(), &self.recent) {
                Ok(chunk) => {
                    self.samples.push(chunk);
                    self.recent.clear();
                }
                Err(e) => tracing::warn!(error = %e, "could not concatenate head batches"),
            }
        }
        self.sample_rows += added;
        // 56 bytes a sample row, ~200 bytes a symbol entry: an estimate
        // for the size trigger, not an account.
        self.bytes += added * 56 + new_syms * 200 + 100;
        added
    }

    pub(crate) fn to_block(&self, tenant: String, source: String) -> BlockData {
        BlockData {
            tenant,
            source,
            level: 0,
            compacted_from: Vec::new(),
            series: self.series.values().cloned().collect(),
            profiles: self.profiles.clone(),
            samples: self.batches().cloned().collect(),
            symbols: self.symbols.clone(),
            rollup_widths_nanos: Vec::new(),
        }
    }

    /// Every sample batch, old chunks first.
    pub(crate) fn batches(&self) -> impl Iterator<Item = &RecordBatch> {
        self.samples.iter().chain(self.recent.iter())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }
}

/// A consistent view of one tenant's head for a query: what
/// [`crate::Ingester::snapshot`] returns in process, what the head-read
/// Flight service sends (series and profiles as the JSON app metadata of
/// the first message, samples as the Arrow batches) and what
/// [`crate::FlightHeads`] gives back.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct HeadSnapshot {
    pub series: Vec<SeriesRow>,
    pub profiles: Vec<ProfileRow>,
    /// Rows in `fathom_block::samples_schema()`; travel as Flight batches,
    /// not in the metadata.
    #[serde(skip)]
    pub samples: Vec<RecordBatch>,
}

impl HeadSnapshot {
    pub(crate) fn extend_from(&mut self, h: &TenantHead, start: i64, end: i64) {
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
                .cloned(),
        );
        self.samples.extend(h.batches().cloned());
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
}
