//! The UI benchmark: in one run, headless Chromium against a real
//! `fathom all` (the binary of this profile) prints
//!
//! - `ui_first_paint_day`: page load to a painted icicle graph for one day
//!   of one service (8,640 real Kafka JVM CPU profiles at 10 s, as in the
//!   macro benchmark's `jvm` day), median of 5 cold page loads;
//! - `ui_first_paint_50k`: the same for a 50,000-node flame graph (1,000
//!   call chains 50 frames deep, every node wide enough to be drawn);
//! - `ui_zoom_redraw_50k`: the time of a zoom redraw of that graph.
//!
//! Targets (design brief): first paint under 1 s for the day, redraw under
//! 50 ms. Needs chromium, chromedriver and Python selenium. Run with
//! `cargo bench --profile bench-fast -p fathom-bench --bench ui` after
//! `cargo build --profile bench-fast -p fathom`.

use std::process::Command;
use std::sync::Arc;

use fathom_bench::corpus_dir;
use fathom_integration::{Fathom, workspace};

const TENANT: &str = "ui-bench";
const DAY: i64 = 8640;
/// 2024-01-01T00:00:00Z.
const BASE_S: i64 = 1_704_067_200;

/// The nine consecutive Kafka JVM CPU profiles of the corpus.
fn jvm_profiles() -> Vec<Vec<u8>> {
    let dir = corpus_dir().join("grafana+pyroscope/pkg/og/convert/jfr/testdata");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.contains("kafka-0__cpu") && n.contains("process_cpu_cpu_nanoseconds")
        })
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Folded stacks whose flame graph has `chains × depth` nodes under the
/// root, every one of them wide enough to be drawn on a 1,400 px canvas:
/// `chains` distinct call chains `depth` frames deep, with values 50..150.
fn wide_folded(chains: usize, depth: usize) -> String {
    let mut out = String::new();
    for c in 0..chains {
        let frames: Vec<String> = (0..depth)
            .map(|d| format!("pkg{}/mod{}.fn_{c}_{d}", c % 37, d % 7))
            .collect();
        out.push_str(&format!("{} {}\n", frames.join(";"), 50 + (c * 7919) % 100));
    }
    out
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let f = Arc::new(Fathom::start(dir.path(), &[]).unwrap());
    let profiles = Arc::new(jvm_profiles());
    let t = std::time::Instant::now();
    let workers: Vec<_> = (0..4i64)
        .map(|w| {
            let (f, profiles) = (f.clone(), profiles.clone());
            std::thread::spawn(move || {
                let mut i = w;
                while i < DAY {
                    let from = (BASE_S + i * 10).to_string();
                    let until = (BASE_S + i * 10 + 10).to_string();
                    let (s, b) = f
                        .ingest(
                            Some(TENANT),
                            &[
                                ("name", "ui-day"),
                                ("format", "pprof"),
                                ("from", &from),
                                ("until", &until),
                            ],
                            profiles[i as usize % profiles.len()].clone(),
                        )
                        .unwrap();
                    assert_eq!(s, 200, "{b}");
                    i += 4;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    eprintln!("pushed the day in {:.1} s", t.elapsed().as_secs_f64());
    let (s, b) = f
        .ingest(
            Some(TENANT),
            &[
                ("name", "ui-wide"),
                ("format", "folded"),
                ("from", &(BASE_S + 3600).to_string()),
            ],
            wide_folded(1000, 50).into_bytes(),
        )
        .unwrap();
    assert_eq!(s, 200, "{b}");
    let out = Command::new("python3")
        .arg(workspace().join("integration/python/ui_bench.py"))
        .args([
            &f.url(""),
            TENANT,
            &(BASE_S * 1000).to_string(),
            &((BASE_S + DAY * 10) * 1000).to_string(),
        ])
        .output()
        .expect("running python3 (with selenium)");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{}", String::from_utf8_lossy(&out.stdout));
}
