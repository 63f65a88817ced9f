//! The ingest write path stage by stage, on the real corpus, one thread:
//! MB/s of uncompressed pprof through each stage, next to a bare prost
//! decode of the same bytes. Small enough to build with the `bench-fast`
//! profile in minutes (it needs only this crate, `fathom-proto` and
//! `fathom-model`), unlike the macro benchmark.
//!
//! ```sh
//! cargo bench -p fathom-pprof --profile bench-fast --bench stages
//! ```
//!
//! The ingester's stages are measured both ways the code still supports:
//! a record of format 0 (no symbol ids: the ingester re-hashes every
//! symbol and encodes its own WAL record, what a cluster ingester did
//! before format 2) and of the current format (3: ids as sent, stacks
//! index the record's locations; the received bytes are the WAL record:
//! one decode), the latter both with the direct decoder
//! (`fathom_proto::decode_write_request`) and through the prost message
//! (`decode_write_request_prost`, what it replaced).
//!
//! A single process's write (`fathom all`) is measured both ways too:
//! `in_process_normalize_encode_drop` is the path before record format 5
//! (every symbol normalized and encoded, then those the head holds looked
//! up and dropped); `in_process_normalize_drop_encode` normalizes against
//! a head holding the whole corpus (a steady stream), drops what it holds
//! and encodes the rest. `FATHOM_BENCH_STAGE_ONLY=a,b` runs only the
//! stages named; run with `MIMALLOC_PURGE_DELAY=-1`, as the server sets
//! mimalloc (`cmd/src/alloc.rs`), or fresh pages' zeroing shows in every
//! stage.

/// The allocator of `fathom`'s server roles (cmd/src/alloc.rs), so that
/// allocation costs what it costs in the server.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::time::Instant;

use fathom_model::{IngestBatch, Labels, TenantId};
use fathom_pprof::{Limits, NormalizeOptions, decode, decode_and_normalize, normalize};
use prost::Message;

/// Bytes a head holds for one sample (`fathom_ingester::HEAD_SAMPLE_BYTES`:
/// a stack id of 16 bytes and a value of 8; the ingester depends on this
/// crate, so the width is spelled here).
const HEAD_ROW_BYTES: usize = std::mem::size_of::<fathom_model::Sample>();

/// Every protobuf pprof of the corpus with an expectation, uncompressed.
fn corpus() -> Vec<Vec<u8>> {
    use std::io::Read;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/pprof");
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv")).expect("corpus manifest");
    let mut out = Vec::new();
    for line in manifest.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 18 || f[17].is_empty() || !f[4].starts_with("pprof-proto") {
            continue;
        }
        let Ok(b) = std::fs::read(dir.join(f[0])) else {
            continue;
        };
        if b.starts_with(&[0x1f, 0x8b]) {
            let mut u = Vec::new();
            if flate2::read::GzDecoder::new(&b[..])
                .read_to_end(&mut u)
                .is_ok()
            {
                out.push(u);
            }
        } else {
            out.push(b);
        }
    }
    out
}

/// A head's table as [`fathom_model::HeldStacks`] (generation 0).
#[derive(Debug)]
struct CorpusHead(fathom_model::Symbols);

impl fathom_model::HeldStacks for CorpusHead {
    fn generation(&self) -> u64 {
        0
    }
    fn holds(&self, _series: &fathom_model::Labels, ids: &[fathom_model::Id]) -> Vec<bool> {
        ids.iter()
            .map(|id| self.0.stacks.contains_key(id))
            .collect()
    }
}

/// Runs `pass` over the corpus for about `secs`; MB/s of `bytes` per pass.
/// With `FATHOM_BENCH_STAGE_ONLY` set to a comma-separated list of stage
/// names (`prost_decode,normalize`), only those stages run (the others
/// print NaN): for `perf stat` or `perf record` of one stage.
fn rate(name: &str, bytes: usize, secs: f64, mut pass: impl FnMut() -> usize) -> f64 {
    if std::env::var("FATHOM_BENCH_STAGE_ONLY")
        .is_ok_and(|only| !only.split(',').any(|o| o == name))
    {
        return f64::NAN;
    }
    std::hint::black_box(pass());
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        std::hint::black_box(pass());
        n += 1;
    }
    (bytes as f64 * n as f64) / 1e6 / t0.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::var("FATHOM_BENCH_STAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let files = corpus();
    let total: usize = files.iter().map(Vec::len).sum();
    println!(
        "info: {} corpus files, {:.1} MB uncompressed",
        files.len(),
        total as f64 / 1e6
    );
    let limits = Limits::default();
    let opts = NormalizeOptions {
        labels: Labels::from_pairs([("service_name", "bench")]).unwrap(),
        ..Default::default()
    };
    let tenant = TenantId::new("bench").unwrap();
    let decoded: Vec<_> = files
        .iter()
        .map(|b| decode(b, &limits).expect("corpus pprof"))
        .collect();
    let batches: Vec<IngestBatch> = decoded
        .iter()
        .map(|p| {
            let n = normalize(p, &opts).expect("corpus pprof");
            IngestBatch {
                tenant: tenant.clone(),
                profiles: n.profiles,
                symbols: n.symbols,
            }
        })
        .collect();
    let records: Vec<Vec<u8>> = batches
        .iter()
        .map(fathom_proto::encode_write_request)
        .collect();
    let rows: usize = batches.iter().map(IngestBatch::sample_count).sum();
    let stacks: usize = batches.iter().map(|b| b.symbols.stacks.len()).sum();
    println!(
        "info: {rows} sample rows ({:.1} bytes of pprof a row; a head holds {HEAD_ROW_BYTES} bytes a sample), {stacks} stacks (summed over files)",
        total as f64 / rows.max(1) as f64,
    );
    let v4_total: usize = records.iter().map(Vec::len).sum();
    let older = |f: fn(&IngestBatch) -> fathom_proto::ingester::WriteRequest| {
        batches.iter().map(|b| f(b).encoded_len()).sum::<usize>() as f64 / total as f64
    };
    println!(
        "figure record_bytes_per_pprof_byte: {:.2} ({v4_total} bytes of records for {total} bytes of pprof: what a distributor sends each replica and each WAL stores; format 3, samples by stack id: {:.2}; format 2, stacks by location id too: {:.2})",
        v4_total as f64 / total as f64,
        older(fathom_proto::write_request_format3),
        older(fathom_proto::write_request_format2),
    );
    let v0: Vec<Vec<u8>> = batches
        .iter()
        .map(|b| fathom_proto::write_request_format0(b).encode_to_vec())
        .collect();

    // The same batches as format-3 records (samples by stack id), as the
    // previous build wrote them: the ingester's decode of both, in the
    // same rounds.
    let v3: Vec<Vec<u8>> = batches
        .iter()
        .map(|b| fathom_proto::write_request_format3(b).encode_to_vec())
        .collect();
    // Records decoded whole, as into an empty head.
    let as_received = |recs: &[Vec<u8>]| {
        recs.iter()
            .map(|r| {
                fathom_proto::decode_write_request(r)
                    .unwrap()
                    .profiles
                    .len()
            })
            .sum()
    };
    // A steady stream's records: the head already holds every symbol, so
    // the replica reads the record whole and copies only its samples.
    let steady = |recs: &[Vec<u8>]| {
        recs.iter()
            .zip(&batches)
            .map(|(r, b)| {
                fathom_proto::decode_write_request_skipping(r, |_| Some(&b.symbols))
                    .unwrap()
                    .sample_count()
            })
            .sum()
    };

    // A head that holds the whole corpus's symbols, as an ingester's
    // does after a while of a steady stream. On one quiet thread a table
    // of this size still fits the last-level cache, so this shows less of
    // the lookups' cost than a cluster's busy ingesters pay
    // (docs/benchmarks.md).
    let mut head = fathom_model::Symbols::default();
    for b in &batches {
        head.merge_owned(b.symbols.clone());
    }
    println!(
        "info: a head of the whole corpus holds {} stacks, {} locations, {} functions",
        head.stacks.len(),
        head.locations.len(),
        head.functions.len(),
    );
    // The same head asked by a single process's normalizer
    // (`NormalizeOptions::held`): every stack of the corpus is held, as in
    // a steady stream, so none is copied into the batch.
    let corpus_head = std::sync::Arc::new(CorpusHead(head.clone()));
    let against_head = NormalizeOptions {
        held: Some(corpus_head.clone()),
        ..opts.clone()
    };
    let large_head = |recs: &[Vec<u8>]| {
        recs.iter()
            .map(|r| {
                fathom_proto::decode_write_request_skipping(r, |_| Some(&head))
                    .unwrap()
                    .sample_count()
            })
            .sum()
    };

    // A replica's records in a steady stream: every stack is in its head,
    // so the distributor leaves them out (format 5: samples name their
    // stacks by id) and the replica, its head number matching, takes
    // them as held without lookups (`Record.held_under`).
    let held_records: Vec<Vec<u8>> = files
        .iter()
        .map(|b| {
            let mut n = decode_and_normalize(b, &limits, &against_head).unwrap();
            n.symbols.remove_held_by(&corpus_head.0);
            fathom_proto::encode_write(&tenant, &n.profiles, &n.symbols)
        })
        .collect();
    assert!(
        held_records
            .iter()
            .all(|r| fathom_proto::write_format(r) == Some(fathom_proto::WRITE_FORMAT_HELD))
    );
    let held_trusted = |recs: &[Vec<u8>]| {
        recs.iter()
            .map(|r| {
                fathom_proto::decode_write_request_held(r, |_| Some(&head), true)
                    .unwrap()
                    .sample_count()
            })
            .sum()
    };

    // Rounds interleave the stages, so that a change in the machine's load
    // (it is shared) shows up as spread rather than as one stage's figure.
    let rounds: usize = std::env::var("FATHOM_BENCH_STAGE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut all: Vec<[f64; 19]> = Vec::new();
    for _ in 0..rounds {
        let prost = rate("prost_decode", total, secs, || {
            files
                .iter()
                .map(|b| {
                    fathom_proto::pprof::Profile::decode(&b[..])
                        .unwrap()
                        .sample
                        .len()
                })
                .sum()
        });
        let dec = rate("pprof_decode", total, secs, || {
            files
                .iter()
                .map(|b| decode(b, &limits).unwrap().sample.len())
                .sum()
        });
        let norm = rate("normalize", total, secs, || {
            decoded
                .iter()
                .map(|p| normalize(p, &opts).unwrap().profiles.len())
                .sum()
        });
        let enc = rate("encode_record", total, secs, || {
            batches
                .iter()
                .map(|b| fathom_proto::encode_write_request(b).len())
                .sum()
        });
        let two_passes = rate("decode_then_normalize", total, secs, || {
            files
                .iter()
                .map(|b| {
                    let p = decode(b, &limits).unwrap();
                    normalize(&p, &opts).unwrap().profiles.len()
                })
                .sum()
        });
        let one_pass = rate("decode_and_normalize_one_pass", total, secs, || {
            files
                .iter()
                .map(|b| {
                    decode_and_normalize(b, &limits, &opts)
                        .unwrap()
                        .profiles
                        .len()
                })
                .sum()
        });
        let against = rate("decode_and_normalize_against_head", total, secs, || {
            files
                .iter()
                .map(|b| {
                    decode_and_normalize(b, &limits, &against_head)
                        .unwrap()
                        .profiles
                        .len()
                })
                .sum()
        });
        // What a single process's write does before its WAL append:
        // normalized against the head, the symbols the head holds
        // dropped, the rest encoded (format 5).
        let in_process = rate("in_process_normalize_drop_encode", total, secs, || {
            files
                .iter()
                .map(|b| {
                    let mut n = decode_and_normalize(b, &limits, &against_head).unwrap();
                    n.symbols.remove_held_by(&corpus_head.0);
                    fathom_proto::encode_write(&tenant, &n.profiles, &n.symbols).len()
                })
                .sum()
        });
        // The same before this build: everything normalized and encoded,
        // then the symbols the head holds looked up and dropped.
        let in_process_before = rate("in_process_normalize_encode_drop", total, secs, || {
            files
                .iter()
                .map(|b| {
                    let mut n = decode_and_normalize(b, &limits, &opts).unwrap();
                    let len = fathom_proto::encode_write(&tenant, &n.profiles, &n.symbols).len();
                    n.symbols.remove_held_by(&corpus_head.0);
                    len
                })
                .sum()
        });
        let distributor = rate(
            "distributor_decode_and_normalize_encode",
            total,
            secs,
            || {
                files
                    .iter()
                    .map(|b| {
                        let n = decode_and_normalize(b, &limits, &opts).unwrap();
                        let batch = IngestBatch {
                            tenant: tenant.clone(),
                            profiles: n.profiles,
                            symbols: n.symbols,
                        };
                        fathom_proto::encode_write_request(&batch).len()
                    })
                    .sum()
            },
        );
        let ingester_v0 = rate(
            "ingester_record_format0_rehash_reencode",
            total,
            secs,
            || {
                v0.iter()
                    .map(|r| {
                        let b = fathom_proto::decode_write_request(r).unwrap();
                        fathom_proto::encode_write_request(&b).len()
                    })
                    .sum()
            },
        );
        let ingester_current = rate("ingester_record_as_received", total, secs, || {
            as_received(&records)
        });
        let ingester_via_prost = rate("ingester_record_via_prost_message", total, secs, || {
            records
                .iter()
                .map(|r| {
                    fathom_proto::decode_write_request_prost(r)
                        .unwrap()
                        .profiles
                        .len()
                })
                .sum()
        });
        let ingester_v3 = rate("ingester_record_format3_as_received", total, secs, || {
            as_received(&v3)
        });
        let steady_v4 = rate("ingester_record_known_symbols", total, secs, || {
            steady(&records)
        });
        let steady_v3 = rate("ingester_record_format3_known_symbols", total, secs, || {
            steady(&v3)
        });
        let large_v4 = rate(
            "ingester_record_known_symbols_large_head",
            total,
            secs,
            || large_head(&records),
        );
        let large_v3 = rate(
            "ingester_record_format3_known_symbols_large_head",
            total,
            secs,
            || large_head(&v3),
        );
        let held = rate("ingester_record_held_trusted", total, secs, || {
            held_trusted(&held_records)
        });
        all.push([
            prost,
            dec,
            norm,
            enc,
            distributor,
            ingester_v0,
            ingester_current,
            ingester_via_prost,
            two_passes,
            one_pass,
            ingester_v3,
            steady_v4,
            steady_v3,
            large_v4,
            large_v3,
            against,
            in_process,
            in_process_before,
            held,
        ]);
    }
    let median = |i: usize| {
        let mut v: Vec<f64> = all.iter().map(|r| r[i]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let spread = |i: usize| {
        let v: Vec<String> = all.iter().map(|r| format!("{:.1}", r[i])).collect();
        v.join(" / ")
    };
    let [
        prost,
        dec,
        norm,
        enc,
        distributor,
        ingester_v0,
        ingester_current,
        ingester_via_prost,
        two_passes,
        one_pass,
        ingester_v3,
        steady_v4,
        steady_v3,
        large_v4,
        large_v3,
        against,
        in_process,
        in_process_before,
        held,
    ] = std::array::from_fn(median);
    // The ratio of each round's figure to the same round's prost decode.
    let ratio = |i: usize| {
        let mut v: Vec<f64> = all.iter().map(|r| r[i] / r[0]).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };

    let figure = |name: &str, i: usize, v: f64| {
        println!(
            "figure stage_{name}: {v:.1} MB/s of uncompressed pprof on one thread, median of {rounds} rounds ({}); {:.2}x a bare prost decode of the same round",
            spread(i),
            ratio(i),
        );
    };
    figure("prost_decode", 0, prost);
    figure("pprof_decode", 1, dec);
    figure("normalize", 2, norm);
    figure("encode_record", 3, enc);
    figure("decode_then_normalize", 8, two_passes);
    figure("decode_and_normalize_one_pass", 9, one_pass);
    figure("decode_and_normalize_against_head", 15, against);
    figure("distributor_decode_and_normalize_encode", 4, distributor);
    figure("in_process_normalize_drop_encode", 16, in_process);
    figure("in_process_normalize_encode_drop", 17, in_process_before);
    figure("ingester_record_format0_rehash_reencode", 5, ingester_v0);
    figure("ingester_record_as_received", 6, ingester_current);
    figure("ingester_record_via_prost_message", 7, ingester_via_prost);
    figure("ingester_record_format3_as_received", 10, ingester_v3);
    figure("ingester_record_known_symbols", 11, steady_v4);
    figure("ingester_record_format3_known_symbols", 12, steady_v3);
    figure("ingester_record_known_symbols_large_head", 13, large_v4);
    figure(
        "ingester_record_format3_known_symbols_large_head",
        14,
        large_v3,
    );
    figure("ingester_record_held_trusted", 18, held);
    // The time per byte of the stages add up: a cluster write costs the
    // distributor's pass plus one ingester pass per replica.
    let per_write = |ingester: f64| 1.0 / (1.0 / distributor + 3.0 / ingester);
    println!(
        "figure stage_cluster_cpu_rf3: {:.1} MB/s per core of CPU for one write on 3 replicas with format 0 records, {:.1} with format 4, {:.1} with format 4 into heads that hold its symbols (format 3: {:.1}), {:.1} into a head of the whole corpus (format 3: {:.1}) (distributor + 3 ingester decodes; WAL, head and network not included)",
        per_write(ingester_v0),
        per_write(ingester_current),
        per_write(steady_v4),
        per_write(steady_v3),
        per_write(large_v4),
        per_write(large_v3),
    );
}
