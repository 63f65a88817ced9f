//! The per-tenant in-memory head: what has been acknowledged and not yet
//! cut into a block, in the same row layout as a block's sample table.

use arrow::array::RecordBatch;
use fathom_block::{BlockData, ProfileRow, SamplesBuilder, SeriesRow, samples_schema};
use fathom_model::{IdMap, IdSet, IngestBatch, Symbols};

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

impl TenantHead {
    /// Adds a batch; profiles whose id is already present are skipped
    /// (replays and retries are idempotent). Returns the samples added.
    /// Takes the batch by value: its symbols move into the head's table
    /// (new entries only), nothing is cloned.
    pub(crate) fn apply(&mut self, batch: IngestBatch) -> usize {
        let mut b = SamplesBuilder::with_capacity(batch.sample_count());
        let IngestBatch {
            profiles, symbols, ..
        } = batch;
        for mut p in profiles {
            if !self.profile_ids.insert(p.id) {
                continue;
            }
            let sid = p.series_id();
            self.series
                .entry(sid)
                .or_insert_with(|| SeriesRow::of(&p))
                .include(p.time_nanos);
            self.profiles.push(ProfileRow::of(&p, sid));
            b.push_owned_profile(&mut p, &sid);
        }
        let added = b.len();
        if added == 0 {
            return 0;
        }
        let before = self.symbols.stacks.len() + self.symbols.locations.len();
        self.symbols.merge_owned(symbols);
        let new_syms = self.symbols.stacks.len() + self.symbols.locations.len() - before;
        self.recent.push(b.finish());
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
