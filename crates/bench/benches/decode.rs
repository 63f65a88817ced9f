//! pprof decode + normalize throughput on the real corpus, in bytes of
//! uncompressed pprof per second (one core: criterion runs one thread).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fathom_bench::{pprof_files, uncompressed};
use fathom_model::Labels;
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
}

criterion_group!(benches, bench);
criterion_main!(benches);
