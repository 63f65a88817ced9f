//! Times decode + normalize over files:
//! `cargo run --release -p fathom-pprof --example bench -- [--rounds N] <file>...`
//! Prints wall-clock throughput; run under `perf stat -e task-clock` on a
//! busy machine for CPU time.

use std::io::Read;

use fathom_pprof::{Limits, NormalizeOptions, decode, normalize};

fn main() {
    let mut rounds = 10usize;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--rounds" {
            rounds = args.next().and_then(|r| r.parse().ok()).unwrap_or(rounds);
        } else {
            files.push(a);
        }
    }
    let inputs: Vec<Vec<u8>> = files
        .iter()
        .filter_map(|f| std::fs::read(f).ok())
        .map(|b| {
            let mut out = Vec::new();
            if b.starts_with(&[0x1f, 0x8b])
                && flate2::read::MultiGzDecoder::new(&b[..])
                    .read_to_end(&mut out)
                    .is_ok()
            {
                out
            } else {
                b
            }
        })
        .collect();
    let total: usize = inputs.iter().map(Vec::len).sum();
    let (mut dec, mut norm) = (0.0f64, 0.0f64);
    for _ in 0..rounds {
        for raw in &inputs {
            let t = std::time::Instant::now();
            let Ok(p) = decode(raw, &Limits::default()) else {
                continue;
            };
            let m = std::time::Instant::now();
            let n = normalize(&p, &NormalizeOptions::default());
            dec += (m - t).as_secs_f64();
            norm += m.elapsed().as_secs_f64();
            drop(n);
        }
    }
    let mb = (total * rounds) as f64 / 1e6;
    println!(
        "{} files, {total} bytes: {:.1} MB/s (decode {:.1} MB/s, normalize {:.1} MB/s)",
        inputs.len(),
        mb / (dec + norm),
        mb / dec,
        mb / norm
    );
}
