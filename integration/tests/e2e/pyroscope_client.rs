//! A real Pyroscope client (`pyroscope-io` from PyPI) profiles a Python
//! program against `fathom all`; its functions show up in queries.

use std::process::Command;
use std::time::{Duration, Instant};

use fathom_integration::Fathom;

const PROGRAM: &str = r#"
import os, sys, time
import pyroscope
pyroscope.configure(
    application_name="pyapp",
    server_address=sys.argv[1],
    tags={"env": "e2e"},
    sample_rate=100,
)

def hot_loop():
    x = 0
    for i in range(200000):
        x += i * i
    return x

def main():
    t0 = time.time()
    while time.time() - t0 < float(sys.argv[2]):
        hot_loop()

main()
pyroscope.shutdown()
"#;

#[test]
fn pyroscope_python_client_functions_show_up() {
    fathom_integration::require_python("pyroscope", "the pyroscope-io Python package");
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let script = dir.path().join("app.py");
    std::fs::write(&script, PROGRAM).unwrap();
    let out = Command::new("python3")
        .arg(&script)
        .arg(f.url(""))
        .arg("12")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let q = "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"pyapp\", env=\"e2e\"}";
    let t0 = Instant::now();
    loop {
        let v = f
            .get_json(None, "/api/v1/query", &[("query", q), ("format", "top")])
            .unwrap();
        let rows = v["rows"].as_array().unwrap();
        let hot = rows.iter().find(|r| r["name"] == "hot_loop");
        if let Some(hot) = hot {
            let total = v["total"].as_i64().unwrap();
            let cum = hot["cum"].as_i64().unwrap();
            assert!(total > 0);
            assert!(
                cum * 2 > total,
                "hot_loop should dominate: {cum} of {total}: {v}"
            );
            let folded = f.folded(None, q, "now-1h", "now").unwrap();
            assert!(
                folded
                    .keys()
                    .any(|s| s.contains("main") && s.ends_with("hot_loop")),
                "{folded:?}"
            );
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "hot_loop not found in {v}\nserver log:\n{}",
            f.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
