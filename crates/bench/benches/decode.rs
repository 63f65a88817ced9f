//! pprof decode + normalize throughput on the real corpus, in bytes of
//! uncompressed pprof per second (one core: criterion runs one thread),
//! and the encoding of a head cut's block of the same profiles, in
//! samples per second.

use arrow::array::RecordBatch;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fathom_bench::{pprof_files, uncompressed};
use fathom_block::{BlockData, ProfileRow, SeriesRow, encode_sorted_block, samples_batch};
use fathom_model::{Labels, Symbols};
use fathom_pprof::{Limits, NormalizeOptions, decode, normalize};

fn bench(c: &mut Criterion) {
    let files: Vec<(String, Vec<u8>)> = pprof_files()
        .into_iter()
        .map(|(n, b)| (n, uncompressed(&b)))
        .collect();
    let total: usize = files.iter().map(|f| f.1.len()).sum();
    let limits = Limits::default();
    let opts = NormalizeOptions {
        labels: Labels::from_pairs([("service_name", "bench")]).unwrap(),
        ..Default::default()
    };
    let mut g = c.benchmark_group("pprof");
    g.throughput(Throughput::Bytes(total as u64));
    g.sample_size(20);
    g.bench_function("decode_normalize_corpus", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for (_, bytes) in &files {
                if let Ok(p) = decode(bytes, &limits)
                    && let Ok(out) = normalize(&p, &opts)
                {
                    n += out.profiles.len();
                }
            }
            n
        })
    });
    // The largest real CPU profile alone.
    if let Some((_, big)) = files.iter().max_by_key(|f| f.1.len()) {
        g.throughput(Throughput::Bytes(big.len() as u64));
        g.bench_function("decode_normalize_largest", |b| {
            b.iter(|| {
                decode(big, &limits)
                    .ok()
                    .and_then(|p| normalize(&p, &opts).ok())
            })
        });
    }
    g.finish();
    otlp(c, &files);
}

/// The corpus as OTLP profiles (each pprof converted with
/// [`fathom_otlp::from_pprof`], as the ingest benchmark's OTLP clients
/// send it): the request's decode and its conversion into Fathom's model,
/// what a distributor does with an OTLP body. Bytes of the original pprof
/// a second (of the files that convert), so that it compares with
/// `pprof/decode_normalize_corpus`.
fn otlp(c: &mut Criterion, files: &[(String, Vec<u8>)]) {
    let limits = fathom_otlp::Limits::default();
    let mut pprof_bytes = 0;
    let bodies: Vec<Vec<u8>> = files
        .iter()
        .filter_map(|(_, bytes)| {
            let p = decode(bytes, &Limits::default()).ok()?;
            let req = fathom_otlp::from_pprof(&p, &[("service.name", "bench")]).ok()?;
            pprof_bytes += bytes.len();
            Some(prost::Message::encode_to_vec(&req))
        })
        .collect();
    let mut g = c.benchmark_group("otlp");
    g.throughput(Throughput::Bytes(pprof_bytes as u64));
    g.sample_size(10);
    g.bench_function("decode_convert_corpus", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for body in &bodies {
                let out =
                    fathom_otlp::Request::decode(body, fathom_otlp::Encoding::Protobuf, &limits)
                        .and_then(|r| r.convert(fathom_model::Id::ZERO, &limits));
                n += out.map_or(0, |o| o.profiles.len());
            }
            n
        })
    });
    g.finish();
}

/// The block an ingester's cut encodes after a steady stream of the
/// corpus: every profile [`CUT_COPIES`] times, each copy a profile of its
/// own (its id and time moved), the rows in the block's order as the
/// head gives them (`encode_sorted_block`, a batch of about 64 Ki rows at
/// a time), the corpus's symbols once.
fn cut_block() -> (BlockData, Vec<RecordBatch>, usize) {
    cut_block_where(|_| true)
}

/// [`cut_block`] with only the profile copies `keep` takes (by their
/// index in the order the copies are made).
fn cut_block_where(keep: impl Fn(usize) -> bool) -> (BlockData, Vec<RecordBatch>, usize) {
    let opts = NormalizeOptions {
        labels: Labels::from_pairs([("service_name", "bench")]).unwrap(),
        ..Default::default()
    };
    let mut symbols = Symbols::default();
    let mut seen = std::collections::HashSet::new();
    let mut profiles = Vec::new();
    for (_, bytes) in pprof_files() {
        let Ok(pprof) = decode(&uncompressed(&bytes), &Limits::default()) else {
            continue;
        };
        let Ok(out) = normalize(&pprof, &opts) else {
            continue;
        };
        symbols.merge_owned(out.symbols);
        // The corpus holds a few profiles twice: a head keeps one.
        profiles.extend(out.profiles.into_iter().filter(|p| seen.insert(p.id)));
    }
    let mut series = std::collections::BTreeMap::new();
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for copy in 0..CUT_COPIES {
        for (k, p) in profiles.iter().enumerate() {
            if !keep(copy * profiles.len() + k) {
                continue;
            }
            let sid = p.series_id();
            let mut id = p.id;
            id.0[..2].copy_from_slice(&(copy as u16).to_le_bytes());
            let time = 1_700_000_000_000_000_000 + copy as i64 * 1_000_000_000;
            let mut samples = p.samples.clone();
            samples.sort_unstable_by_key(|s| s.stack);
            series
                .entry(sid)
                .or_insert_with(|| SeriesRow::of(p))
                .include(time);
            let mut row = ProfileRow::of(p, sid);
            (row.profile_id, row.time_nanos) = (id, time);
            rows.push(row);
            runs.push((sid, time, id, samples));
        }
    }
    runs.sort_unstable_by_key(|a| (a.0, a.1, a.2));
    let total = runs.iter().map(|r| r.3.len()).sum();
    let mut batches = Vec::new();
    let mut rest = &runs[..];
    while !rest.is_empty() {
        let mut n = 0;
        let mut k = 0;
        while k < rest.len() && n < 1 << 16 {
            n += rest[k].3.len();
            k += 1;
        }
        let (group, tail) = rest.split_at(k);
        batches.push(samples_batch(
            n,
            group.iter().map(|(s, t, p, x)| (s, *t, p, &x[..])),
        ));
        rest = tail;
    }
    let data = BlockData {
        tenant: "bench".into(),
        source: "bench".into(),
        level: 0,
        compacted_from: Vec::new(),
        series: series.into_values().collect(),
        profiles: rows,
        samples: Vec::new(),
        symbols: std::sync::Arc::new(symbols),
        rollup_widths_nanos: Vec::new(),
    };
    (data, batches, total)
}

/// Copies of the corpus in [`cut_block`]: about 2.5 million samples, a
/// quarter of what a 512 MiB head holds.
const CUT_COPIES: usize = 100;

fn cut(c: &mut Criterion) {
    let (data, batches, samples) = cut_block();
    let (meta, _) = encode_sorted_block(&data, batches.iter().cloned()).expect("encode");
    println!(
        "info: cut block: {samples} samples, {} profiles, {} stacks; {:.2} bytes a sample in all ({} bytes), {:.2} in samples.parquet",
        data.profiles.len(),
        data.symbols.stacks.len(),
        meta.stats.bytes as f64 / samples as f64,
        meta.stats.bytes,
        meta.stats.sample_bytes as f64 / samples as f64,
    );
    let mut g = c.benchmark_group("block");
    g.throughput(Throughput::Elements(samples as u64));
    g.sample_size(10);
    g.bench_function("encode_cut", |b| {
        b.iter(|| encode_sorted_block(&data, batches.iter().cloned()).map(|(m, _)| m.stats.bytes))
    });
    g.finish();
}

/// Replicas in [`compact`]; each misses a different one in
/// [`MISSED_EVERY`] of the profile copies (a write acknowledged by the
/// other two).
const REPLICAS: usize = 3;
const MISSED_EVERY: usize = 40;

/// What the compactor does with the level-0 blocks of three replicas'
/// cuts of [`cut_block`] (each a copy of its own, missing a different
/// 1/[`MISSED_EVERY`] of the profiles): the merge (reading the blocks
/// from an in-memory store, every profile once) and the encoding of
/// the merged block with hour rollups. Samples a second counted in the
/// merged block.
fn compact(c: &mut Criterion) {
    use object_store::memory::InMemory;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let store = InMemory::new();
    let mut metas = Vec::new();
    let mut stored = 0;
    for r in 0..REPLICAS {
        let (data, batches, samples) =
            cut_block_where(|k| k % MISSED_EVERY != r * (MISSED_EVERY / REPLICAS));
        let (meta, files) = encode_sorted_block(&data, batches).expect("encode");
        rt.block_on(fathom_block::write_block(&store, &meta, files))
            .expect("store");
        stored += samples;
        metas.push(meta);
    }
    // A job of `level`'s blocks writes the rollups of that level's
    // window: hours at level 0, hours and days at level 1.
    let compacted = |level: u32| {
        let mut m = rt
            .block_on(fathom_compactor::merge(&store, &metas))
            .expect("merge");
        m.data.rollup_widths_nanos =
            fathom_compactor::rollup_widths(&fathom_compactor::Config::default().windows, level);
        let merged = m.stats;
        let (meta, _) = m.encode().expect("encode merged");
        (meta, merged)
    };
    let (meta, merged) = compacted(0);
    println!(
        "info: compaction of {REPLICAS} replicas' blocks: {stored} samples in, {} out ({} bytes), {} duplicate profiles, {} of their sample rows and {} sources' symbol tables not read",
        meta.stats.samples,
        meta.stats.bytes,
        merged.duplicates,
        merged.rows_not_read,
        merged.symbol_tables_not_read
    );
    let mut g = c.benchmark_group("compactor");
    g.throughput(Throughput::Elements(meta.stats.samples));
    g.sample_size(10);
    g.bench_function("merge_replicas", |b| b.iter(|| compacted(0).0.stats.bytes));
    // The same merge as a level-1 job: hour and day rollups.
    g.bench_function("merge_replicas_day", |b| {
        b.iter(|| compacted(1).0.stats.bytes)
    });
    g.finish();
}

criterion_group!(benches, bench, cut, compact);
criterion_main!(benches);
