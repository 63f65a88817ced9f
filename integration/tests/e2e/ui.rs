//! The web UI in headless Chromium against a real `fathom all` holding real
//! profiles of the corpus: every view is compared with the HTTP API's
//! answer for the same selection (integration/python/ui_browser.py drives
//! the browser with selenium). Screenshots go to `target/ui-screenshots/`.
//!
//! Needs `chromium`, `chromedriver` and Python `selenium`
//! (scripts/test-all.sh installs them); fails, saying so, without them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use fathom_integration::{Fathom, testdata, workspace};

const TENANT: &str = "ui-e2e";
/// 2024-01-01T00:00:00Z.
const BASE_S: i64 = 1_704_067_200;

/// Four consecutive CPU profiles of one JVM (Kafka) from the corpus.
fn kafka_profiles() -> Vec<PathBuf> {
    let dir = testdata().join("pprof/grafana+pyroscope/pkg/og/convert/jfr/testdata");
    (0..4)
        .map(|i| {
            dir.join(format!(
                "cortex-dev-01__kafka-0__cpu__{i}.jfr.gz.process_cpu_cpu_nanoseconds_cpu_nanoseconds.17241709254077376921.pb.gz"
            ))
        })
        .collect()
}

fn require_browser() {
    for bin in ["chromium", "chromedriver"] {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {bin} || test -x /usr/bin/{bin}")])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            ok,
            "{bin} is required for the UI test (Debian: apt-get install chromium chromium-driver; scripts/test-all.sh installs it)"
        );
    }
    fathom_integration::require_python("selenium", "the selenium Python package");
}

/// The target directory the screenshots go under.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

#[test]
fn ui_views_match_the_api_in_headless_chromium() {
    require_browser();
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    // The page and its modules come from the binary.
    let (s, body) = f.get(None, "/", &[]).unwrap();
    assert_eq!(s, 200);
    assert!(String::from_utf8_lossy(&body).contains("/ui/app.js"));
    // Two versions of one service, two profiles each, a minute apart.
    for (i, path) in kafka_profiles().iter().enumerate() {
        let body = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let version = if i < 2 { "1.0" } else { "1.1" };
        let from = (BASE_S + 60 * i as i64).to_string();
        let until = (BASE_S + 60 * i as i64 + 10).to_string();
        let name = format!("kafka.cpu{{version={version}}}");
        let (s, b) = f
            .ingest(
                Some(TENANT),
                &[
                    ("name", name.as_str()),
                    ("format", "pprof"),
                    ("from", from.as_str()),
                    ("until", until.as_str()),
                ],
                body,
            )
            .unwrap();
        assert_eq!(s, 200, "{b}");
    }
    let start_ms = ((BASE_S - 600) * 1000).to_string();
    let end_ms = ((BASE_S + 900) * 1000).to_string();
    let out_dir = target_dir().join("ui-screenshots");
    let out = Command::new("python3")
        .arg(workspace().join("integration/python/ui_browser.py"))
        .args([&f.url(""), TENANT, &start_ms, &end_ms])
        .arg(&out_dir)
        .output()
        .expect("running python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser test failed:\n{stdout}\n{stderr}\nfathom log:\n{}",
        f.log()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("ui timings: {stdout}");
    for view in [
        "empty", "error", "icicle", "zoom", "search", "top", "sandwich", "compare",
    ] {
        let p = out_dir.join(format!("{view}.png"));
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "screenshot {} missing or empty", p.display());
    }
}

/// The stacks of the real JVM profile (as `go tool pprof` folds it).
fn real_stacks() -> Vec<(String, i64)> {
    use std::io::Read;
    let p = testdata().join(
        "pprof/expected/grafana+pyroscope/pkg/og/convert/jfr/testdata/cortex-dev-01__kafka-0__cpu__3.jfr.gz.process_cpu_cpu_nanoseconds_cpu_nanoseconds.17241709254077376921.pb.gz.folded.tsv.gz",
    );
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&p).unwrap())
        .read_to_string(&mut s)
        .unwrap();
    s.lines()
        .filter_map(|l| {
            let mut it = l.split('\t');
            let (_, stack, v) = (it.next()?, it.next()?, it.next()?);
            // Folded ingest counts samples: one per 10 ms of CPU.
            Some((stack.to_owned(), v.parse::<i64>().ok()? / 10_000_000))
        })
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// One profile of the real stacks in folded form, every function's (leaf)
/// value scaled by its own uniform noise in [0.85, 1.15), and `slow` (if
/// any) 20 % more expensive. Values are scaled ×100 first so that rounding
/// does not hide the noise.
fn noisy_folded(stacks: &[(String, i64)], seed: &mut u64, slow: Option<&str>) -> String {
    let mut noise: BTreeMap<&str, f64> = BTreeMap::new();
    let mut out = String::new();
    for (stack, v) in stacks {
        let leaf = stack.rsplit(';').next().unwrap();
        let k = *noise
            .entry(leaf)
            .or_insert_with(|| 0.85 + 0.3 * (xorshift(seed) % 10_000) as f64 / 10_000.0);
        let extra = if slow == Some(leaf) { 1.2 } else { 1.0 };
        let v = (*v as f64 * 100.0 * k * extra).round() as i64;
        out.push_str(&format!("{stack} {v}\n"));
    }
    out
}

/// `/api/v1/changes` on a real server: profiles built from the real corpus
/// with per-profile noise on every function; one function made 20 % more
/// expensive in B ranks first and is significant; with nothing injected,
/// nothing is significant.
#[test]
fn changes_finds_an_injected_regression_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let stacks = real_stacks();
    assert!(stacks.len() > 200, "{} stacks", stacks.len());
    // A mid-sized function by flat value: the fifth.
    let mut flat: BTreeMap<&str, i64> = BTreeMap::new();
    for (s, v) in &stacks {
        *flat.entry(s.rsplit(';').next().unwrap()).or_default() += v;
    }
    let mut by: Vec<(&str, i64)> = flat.into_iter().collect();
    by.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let target = by[4].0.to_owned();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let n = 30;
    for (version, slow) in [
        ("a", None),
        ("b", Some(target.as_str())),
        ("c", None),
        ("d", None),
    ] {
        for i in 0..n {
            let body = noisy_folded(&stacks, &mut seed, slow);
            let from = (BASE_S + 10 * i).to_string();
            let name = format!("changes.cpu{{version={version}}}");
            let (s, b) = f
                .ingest(
                    Some("changes"),
                    &[
                        ("name", name.as_str()),
                        ("format", "folded"),
                        ("from", from.as_str()),
                    ],
                    body.into_bytes(),
                )
                .unwrap();
            assert_eq!(s, 200, "{b}");
        }
    }
    let pt = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
    let start = (BASE_S * 1000 - 1000).to_string();
    let end = ((BASE_S + 10 * n + 10) * 1000).to_string();
    let changes = |a: &str, b: &str| {
        f.get_json(
            Some("changes"),
            "/api/v1/changes",
            &[
                ("left", &format!("{pt}{{version=\"{a}\"}}")),
                ("right", &format!("{pt}{{version=\"{b}\"}}")),
                ("left_start", &start),
                ("left_end", &end),
                ("right_start", &start),
                ("right_end", &end),
                ("limit", "10"),
            ],
        )
        .unwrap()
    };
    let v = changes("a", "b");
    assert_eq!(v["left"]["profiles"], n, "{}", v["left"]);
    assert_eq!(v["left"]["observations"], n, "{}", v["left"]);
    let first = &v["changes"][0];
    assert_eq!(first["name"], target.as_str(), "{}", v["changes"]);
    assert_eq!(first["significant"], true, "{first}");
    assert!(first["delta_share"].as_f64().unwrap() > 0.0, "{first}");
    // The browser shows the same ranking in the compare view, the injected
    // function first and marked significant (screenshot for docs/ui.md).
    require_browser();
    let out = Command::new("python3")
        .arg(workspace().join("integration/python/ui_compare.py"))
        .args([
            f.url("").as_str(),
            "changes",
            pt,
            "{version=\"a\"}",
            "{version=\"b\"}",
            start.as_str(),
            end.as_str(),
            target.as_str(),
        ])
        .arg(target_dir().join("ui-screenshots"))
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "the compare view test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v = changes("c", "d");
    assert_eq!(v["significant"], 0, "{}", v["changes"]);
    assert!(v["functions"].as_u64().unwrap() > 200);
    // Bad parameters are refused with a message naming them.
    let all = format!("{pt}{{}}");
    for (param, value) in [("direction", "up"), ("samples", "100000")] {
        let (s, b) = f
            .get(
                Some("changes"),
                "/api/v1/changes",
                &[("left", &all), ("right", &all), (param, value)],
            )
            .unwrap();
        assert_eq!(s, 400, "{param}={value}");
        let body = String::from_utf8_lossy(&b);
        assert!(body.contains(param), "{param}={value}: {body}");
    }
}
