//! Shared helpers for Fathom's benchmarks: the real corpus from
//! `../shared/testdata`, and small statistics.
//!
//! Run them with `cargo bench -p fathom-bench --profile bench-fast`
//! (`docs/benchmarks.md`).

use std::path::{Path, PathBuf};

/// `../shared/testdata/pprof` relative to the workspace.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/pprof")
}

/// (name, bytes as stored) of every corpus file with an expectation that
/// is protobuf pprof (raw or gzip'd), the formats clients send today.
pub fn pprof_files() -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir();
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv")).expect("corpus manifest");
    let mut out = Vec::new();
    for line in manifest.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 18 || f[17].is_empty() || !f[4].starts_with("pprof-proto") {
            continue;
        }
        if let Ok(b) = std::fs::read(dir.join(f[0])) {
            out.push((f[0].to_owned(), b));
        }
    }
    out
}

/// Gunzips when gzip'd: the uncompressed size is what throughput counts.
pub fn uncompressed(b: &[u8]) -> Vec<u8> {
    use std::io::Read;
    if !b.starts_with(&[0x1f, 0x8b]) {
        return b.to_vec();
    }
    let mut out = Vec::new();
    match flate2::read::GzDecoder::new(b).read_to_end(&mut out) {
        Ok(_) => out,
        Err(_) => b.to_vec(),
    }
}

/// The `q`-quantile (0..=1) of `v` (sorted in place).
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}
