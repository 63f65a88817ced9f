//! The web UI in headless Chromium against a real `fathom all` holding real
//! profiles of the corpus: every view is compared with the HTTP API's
//! answer for the same selection (integration/python/ui_browser.py drives
//! the browser with selenium). Screenshots go to `target/ui-screenshots/`.
//!
//! Needs `chromium`, `chromedriver` and Python `selenium`
//! (scripts/test-all.sh installs them); fails, saying so, without them.

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
    let check = Command::new("python3")
        .args(["-c", "import selenium"])
        .output()
        .expect("python3 is required");
    assert!(
        check.status.success(),
        "the selenium Python package is required (pip install selenium; scripts/test-all.sh installs it): {}",
        String::from_utf8_lossy(&check.stderr)
    );
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
        f.log().lines().rev().take(30).collect::<Vec<_>>().join("\n")
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
