//! `fathom import --synthetic` writes day blocks with rollups that a fresh
//! `fathom all` finds and answers from: a merge over mid-hour bounds (from
//! rollups and raw edges) sums to what a range query (raw samples) sums.

use fathom_integration::{Fathom, fathom_bin};

#[test]
fn imported_history_answers_from_rollups_like_raw_samples() {
    let dir = tempfile::tempdir().unwrap();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let end_s = (now_s / 3600 - 2) * 3600;
    let out = std::process::Command::new(fathom_bin())
        .args([
            "import",
            "--synthetic",
            "--duration",
            "30h",
            "--instances",
            "2",
        ])
        .args(["--interval", "60s", "--stacks-per-profile", "8"])
        .args(["--service-name", "imported", "--end", &end_s.to_string()])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("imported 3600 profiles"), "{stdout}");

    let f = Fathom::start(dir.path(), &[]).unwrap();
    let q = "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"imported\"}";
    // Mid-hour bounds (unix ms) around 28 of the 30 hours.
    let start_ms = ((end_s - 29 * 3600 - 1234) * 1000).to_string();
    let end_ms = ((end_s - 1800) * 1000 + 7).to_string();
    let folded = f.folded(None, q, &start_ms, &end_ms).unwrap();
    let merged: i64 = folded.values().sum();
    assert!(merged > 0);
    assert!(f.metric("fathom_querier_rollup_reads_total").unwrap() > 0.0);
    let step = (40 * 3600).to_string();
    let r = f
        .get_json(
            None,
            "/api/v1/query_range",
            &[
                ("query", q),
                ("start", &start_ms),
                ("end", &end_ms),
                ("step", &step),
            ],
        )
        .unwrap();
    let raw: i64 = r["series"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["points"].as_array().unwrap().iter())
        .map(|p| p[1].as_i64().unwrap())
        .sum();
    assert_eq!(merged, raw, "rollups and raw samples agree");
}
