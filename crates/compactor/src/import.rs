//! Bulk loading (`fathom import`): profiles of any age written straight
//! into top-level blocks, one per tenant and UTC day, with hour and day
//! rollups, as the compactor would have written them. For backfills and
//! for benchmarks that need a month of history without ingesting it.
//!
//! ```text
//!  profiles (+ symbols) ──► buffer per UTC day ──► encode (samples, rollup)
//!        ──► upload, meta.json last ──► metas for the block index
//! ```
//!
//! A day whose buffer would pass `max_rows` is written early and the rest
//! of it goes into another block of the same day: blocks stay bounded and
//! the compactor merges them later. Profiles keep their ids, so importing
//! the same data twice is harmless to queries (copies are counted once).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use fathom_block::{
    BlockData, BlockMeta, DAY_NANOS, HOUR_NANOS, ProfileRow, SamplesBuilder, SeriesRow,
};
use fathom_model::{
    Function, Id, IdHasher, Labels, Line, Location, Profile, ProfileType, Sample, Stack, Symbols,
};
use object_store::ObjectStore;

use crate::Error;

/// The level of imported blocks: the top of the default compaction windows
/// (hour, day), so that the compactor treats them as finished days.
pub const IMPORT_LEVEL: u32 = 2;

#[derive(Default)]
struct Day {
    samples: SamplesBuilder,
    series: HashMap<Id, SeriesRow>,
    profiles: Vec<ProfileRow>,
    symbols: Symbols,
}

/// Writes blocks from profiles given in any order.
pub struct Importer {
    store: Arc<dyn ObjectStore>,
    tenant: String,
    source: String,
    max_rows: usize,
    days: BTreeMap<i64, Day>,
    rows: usize,
    written: Vec<BlockMeta>,
    /// The block being encoded and uploaded while more profiles are
    /// buffered: at most one, so memory stays bounded (one buffer and
    /// one block in flight) and encoding overlaps decoding/generation.
    pending: Option<tokio::task::JoinHandle<Result<BlockMeta, Error>>>,
}

impl Importer {
    /// An importer for `tenant` into `store`; a block holds at most
    /// `max_rows` sample rows (the memory bound: about 100 bytes a row
    /// while buffered).
    pub fn new(store: Arc<dyn ObjectStore>, tenant: &str, max_rows: usize) -> Self {
        Importer {
            store,
            tenant: tenant.to_owned(),
            source: "import".into(),
            max_rows: max_rows.max(1),
            days: BTreeMap::new(),
            rows: 0,
            written: Vec::new(),
            pending: None,
        }
    }

    /// Adds profiles whose stacks `symbols` resolves.
    pub async fn add(&mut self, profiles: &[Profile], symbols: &Symbols) -> Result<(), Error> {
        let mut touched: Vec<i64> = Vec::new();
        for p in profiles {
            let day = p.time_nanos.div_euclid(DAY_NANOS);
            let d = self.days.entry(day).or_default();
            if !touched.contains(&day) {
                touched.push(day);
            }
            d.samples.push_profile(p);
            self.rows += p.samples.len();
            let sid = p.series_id();
            d.series
                .entry(sid)
                .or_insert_with(|| SeriesRow::of(p))
                .include(p.time_nanos);
            d.profiles.push(ProfileRow::of(p, sid));
        }
        for day in touched {
            if let Some(d) = self.days.get_mut(&day) {
                d.symbols.merge(symbols);
            }
        }
        // Write the largest days until the buffer is under the bound.
        while self.rows > self.max_rows {
            let Some(day) = self
                .days
                .iter()
                .max_by_key(|(_, d)| d.samples.len())
                .map(|(k, _)| *k)
            else {
                break;
            };
            self.flush(day).await?;
        }
        Ok(())
    }

    async fn flush(&mut self, day: i64) -> Result<(), Error> {
        let Some(d) = self.days.remove(&day) else {
            return Ok(());
        };
        self.rows = self.rows.saturating_sub(d.samples.len());
        if d.profiles.is_empty() {
            return Ok(());
        }
        let data = BlockData {
            tenant: self.tenant.clone(),
            source: self.source.clone(),
            level: IMPORT_LEVEL,
            compacted_from: Vec::new(),
            series: d.series.into_values().collect(),
            profiles: d.profiles,
            samples: vec![d.samples.finish()],
            symbols: std::sync::Arc::new(d.symbols),
            rollup_widths_nanos: vec![HOUR_NANOS, DAY_NANOS],
        };
        // One block in flight: wait for the previous one first.
        self.wait_pending().await?;
        let store = self.store.clone();
        let tenant = self.tenant.clone();
        self.pending = Some(tokio::spawn(async move {
            let (meta, files) =
                tokio::task::spawn_blocking(move || fathom_block::encode_block(&data))
                    .await
                    .map_err(|e| Error::Task(e.to_string()))??;
            fathom_block::write_block(store.as_ref(), &meta, files).await?;
            tracing::info!(%tenant, block = %meta.id, profiles = meta.stats.profiles, "imported block");
            Ok(meta)
        }));
        Ok(())
    }

    /// Waits for the block in flight, if any.
    async fn wait_pending(&mut self) -> Result<(), Error> {
        if let Some(h) = self.pending.take() {
            let meta = h.await.map_err(|e| Error::Task(e.to_string()))??;
            self.written.push(meta);
        }
        Ok(())
    }

    /// Writes what is buffered; the metas of every block written.
    pub async fn finish(mut self) -> Result<Vec<BlockMeta>, Error> {
        let days: Vec<i64> = self.days.keys().copied().collect();
        for d in days {
            self.flush(d).await?;
        }
        self.wait_pending().await?;
        Ok(self.written)
    }
}

/// A generated history: `instances` instances of one service, one CPU
/// profile each every `interval_nanos`, `stacks_per_profile` stacks drawn
/// from `distinct_stacks` (Zipf-like: a few hot stacks, a long tail).
#[derive(Clone, Debug)]
pub struct Synthetic {
    pub service_name: String,
    pub instances: usize,
    pub interval_nanos: i64,
    pub stacks_per_profile: usize,
    pub distinct_stacks: usize,
    pub seed: u64,
}

impl Default for Synthetic {
    fn default() -> Self {
        Synthetic {
            service_name: "synthetic".into(),
            instances: 10,
            interval_nanos: 10_000_000_000,
            stacks_per_profile: 32,
            distinct_stacks: 2_000,
            seed: 1,
        }
    }
}

/// splitmix64: a small deterministic generator (same history for the same
/// seed on every machine).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

impl Synthetic {
    /// The symbol table and stack ids of the history.
    pub fn symbols(&self) -> (Symbols, Vec<Id>) {
        let mut rng = Rng(self.seed);
        let mut s = Symbols::default();
        let functions: Vec<Id> = (0..(self.distinct_stacks / 4).max(8))
            .map(|i| {
                let f = Function {
                    name: format!("{}/pkg{}.func{i}", self.service_name, i % 17),
                    system_name: String::new(),
                    filename: format!("pkg{}/file{}.go", i % 17, i % 5),
                    start_line: (i % 300) as i64,
                };
                let id = f.id();
                s.functions.insert(id, f);
                id
            })
            .collect();
        let locations: Vec<Id> = functions
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let l = Location {
                    mapping: Id::ZERO,
                    address: 0x40_0000 + i as u64 * 16,
                    lines: vec![Line {
                        function: *f,
                        line: 10 + i as i64,
                    }],
                };
                let id = l.id();
                s.locations.insert(id, l);
                id
            })
            .collect();
        let mut stacks = Vec::with_capacity(self.distinct_stacks);
        while stacks.len() < self.distinct_stacks.max(1) {
            let depth = 4 + rng.below(20);
            // Root frames shared by many stacks, as in real programs.
            let locs: Vec<Id> = (0..depth)
                .map(|d| {
                    locations[(rng.below(locations.len()) >> (depth - d).min(6)) % locations.len()]
                })
                .rev()
                .collect();
            let st = Stack { locations: locs };
            let id = st.id();
            if s.stacks.insert(id, st).is_none() {
                stacks.push(id);
            }
        }
        (s, stacks)
    }

    /// The profiles of `[from, to)` (nanoseconds), in time order, in
    /// chunks of about `chunk` profiles, handed to `f`.
    pub fn profiles(
        &self,
        stacks: &[Id],
        from: i64,
        to: i64,
        mut f: impl FnMut(Vec<Profile>),
        chunk: usize,
    ) {
        let pt: ProfileType = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
            .parse()
            .expect("a valid profile type");
        let labels: Vec<Labels> = (0..self.instances)
            .map(|i| {
                let mut l = Labels::new();
                l.insert("service_name", &self.service_name);
                l.insert("instance", &format!("instance-{i}"));
                l
            })
            .collect();
        let interval = self.interval_nanos.max(1);
        let mut out = Vec::with_capacity(chunk);
        let mut t = from;
        let mut k: u64 = 0;
        while t < to {
            for (i, l) in labels.iter().enumerate() {
                let mut rng = Rng(self.seed ^ k.wrapping_mul(0x100_0000_01b3) ^ i as u64);
                let mut picked: Vec<Sample> = Vec::with_capacity(self.stacks_per_profile);
                for _ in 0..self.stacks_per_profile {
                    // Hot stacks first: the square skews picks to low indices.
                    let r = rng.below(stacks.len());
                    let idx = r * rng.below(stacks.len()) / stacks.len().max(1);
                    let stack = stacks[idx];
                    if picked.iter().any(|s| s.stack == stack) {
                        continue;
                    }
                    picked.push(Sample {
                        stack,
                        value: (1 + rng.below(50) as i64) * 10_000_000,
                    });
                }
                out.push(Profile {
                    id: IdHasher::new("synthetic-profile")
                        .str(&self.service_name)
                        .u64(i as u64)
                        .i64(t)
                        .finish(),
                    profile_type: pt.clone(),
                    labels: l.clone(),
                    time_nanos: t,
                    duration_nanos: interval,
                    period: 10_000_000,
                    samples: picked,
                });
            }
            if out.len() >= chunk {
                f(std::mem::take(&mut out));
            }
            k += 1;
            t = match t.checked_add(interval) {
                Some(t) => t,
                None => break,
            };
        }
        if !out.is_empty() {
            f(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{AsArray, RecordBatch};
    use arrow::datatypes::Int64Type;
    use object_store::ObjectStoreExt;

    async fn parquet(store: &dyn ObjectStore, m: &BlockMeta, file: &str) -> Vec<RecordBatch> {
        let bytes = store
            .get(&fathom_block::block_file(&m.tenant, &m.id, file))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap()
            .map(|b| b.unwrap())
            .collect()
    }

    fn sum(batches: &[RecordBatch], col: &str) -> i64 {
        batches
            .iter()
            .map(|b| {
                b.column_by_name(col)
                    .unwrap()
                    .as_primitive::<Int64Type>()
                    .iter()
                    .flatten()
                    .sum::<i64>()
            })
            .sum()
    }

    #[tokio::test]
    async fn a_synthetic_history_becomes_day_blocks_with_rollups() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let spec = Synthetic {
            instances: 3,
            interval_nanos: 60_000_000_000,
            stacks_per_profile: 8,
            distinct_stacks: 100,
            ..Synthetic::default()
        };
        let (symbols, stacks) = spec.symbols();
        assert_eq!(stacks.len(), 100);
        // Two days and a half, starting mid-day.
        let from = 20_000 * DAY_NANOS + 7 * HOUR_NANOS;
        let to = from + 2 * DAY_NANOS + 12 * HOUR_NANOS;
        let mut chunks = Vec::new();
        spec.profiles(&stacks, from, to, |c| chunks.push(c), 500);
        let all: Vec<Profile> = chunks.into_iter().flatten().collect();
        assert_eq!(all.len(), 3 * 60 * 60);
        let mut imp = Importer::new(store.clone(), "t", 1_000_000);
        for c in all.chunks(700) {
            imp.add(c, &symbols).await.unwrap();
        }
        let metas = imp.finish().await.unwrap();
        assert_eq!(metas.len(), 3, "one block per UTC day");
        let mut profiles = 0;
        let mut total = 0i64;
        for m in &metas {
            assert_eq!(m.level, IMPORT_LEVEL);
            assert_eq!(m.rollup_widths_nanos, vec![HOUR_NANOS, DAY_NANOS]);
            assert_eq!(
                m.min_time_nanos.div_euclid(DAY_NANOS),
                m.max_time_nanos.div_euclid(DAY_NANOS)
            );
            profiles += m.stats.profiles;
            let raw = sum(
                &parquet(store.as_ref(), m, fathom_block::files::SAMPLES).await,
                fathom_block::columns::VALUE,
            );
            let rollup = parquet(store.as_ref(), m, fathom_block::files::ROLLUP).await;
            // Each width's rows add up to the raw samples.
            for w in [HOUR_NANOS, DAY_NANOS] {
                let of_w: i64 = rollup
                    .iter()
                    .map(|b| {
                        let width = b.column(1).as_primitive::<Int64Type>();
                        let v = b.column(4).as_primitive::<Int64Type>();
                        (0..b.num_rows())
                            .filter(|&i| width.value(i) == w)
                            .map(|i| v.value(i))
                            .sum::<i64>()
                    })
                    .sum();
                assert_eq!(of_w, raw, "width {w}");
            }
            total += raw;
            let syms = fathom_block::read_symbols(store.as_ref(), m).await.unwrap();
            assert_eq!(syms.stacks.len(), 100);
        }
        assert_eq!(profiles as usize, all.len());
        assert_eq!(total, all.iter().map(Profile::total).sum::<i64>());
    }

    #[tokio::test]
    async fn a_day_past_the_row_bound_is_split() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let spec = Synthetic {
            instances: 2,
            interval_nanos: 60_000_000_000,
            stacks_per_profile: 4,
            distinct_stacks: 20,
            ..Synthetic::default()
        };
        let (symbols, stacks) = spec.symbols();
        let mut imp = Importer::new(store, "t", 1_000);
        let mut n = 0;
        let mut chunks = Vec::new();
        spec.profiles(&stacks, 0, 6 * HOUR_NANOS, |c| chunks.push(c), 100);
        for c in chunks {
            n += c.len();
            imp.add(&c, &symbols).await.unwrap();
        }
        let metas = imp.finish().await.unwrap();
        assert!(metas.len() > 1, "{} blocks", metas.len());
        assert!(metas.iter().all(|m| m.stats.samples <= 1_000 + 400));
        assert_eq!(
            metas.iter().map(|m| m.stats.profiles).sum::<u64>(),
            n as u64
        );
    }
}
