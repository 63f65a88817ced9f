//! Blocks are plain Parquet that a user can open with pyarrow.

use std::process::Command;

use fathom_integration::{Fathom, corpus};

const SCRIPT: &str = r#"
import glob, json, sys
import pyarrow.parquet as pq
import pyarrow.compute as pc
store = sys.argv[1]
metas = glob.glob(f"{store}/*/blocks/*/meta.json")
samples = pq.read_table([m.replace("meta.json", "samples.parquet") for m in metas][0])
series = pq.read_table([m.replace("meta.json", "series.parquet") for m in metas][0])
funcs = pq.read_table([m.replace("meta.json", "functions.parquet") for m in metas][0])
print(json.dumps({
    "blocks": len(metas),
    "columns": samples.column_names,
    "rows": samples.num_rows,
    "total": pc.sum(samples["value"]).as_py(),
    "profile_types": sorted(set(series["profile_type"].to_pylist())),
    "services": sorted(set(series["service_name"].to_pylist())),
    "has_main": "main.main" in set(funcs["name"].to_pylist()),
}))
"#;

#[test]
fn flushed_blocks_open_with_pyarrow() {
    let check = Command::new("python3")
        .args(["-c", "import pyarrow"])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "pyarrow is required (pip install pyarrow): {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fathom::start(dir.path(), &[]).unwrap();
    let file = corpus()
        .unwrap()
        .into_iter()
        .find(|c| c.file.ends_with("internal/report/testdata/sample.cpu"))
        .unwrap();
    let (s, b) = f
        .ingest(
            Some("pa"),
            &[
                ("name", "sample"),
                ("format", "pprof"),
                ("from", "1704067200"),
            ],
            std::fs::read(&file.path).unwrap(),
        )
        .unwrap();
    assert_eq!(s, 200, "{b}");
    let cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"sample\"}";
    let want: i64 = f
        .folded(Some("pa"), cpu, "1704060000000", "1704070000000")
        .unwrap()
        .values()
        .sum::<i64>()
        + f.folded(
            Some("pa"),
            "process_cpu:samples:count:cpu:nanoseconds{service_name=\"sample\"}",
            "1704060000000",
            "1704070000000",
        )
        .unwrap()
        .values()
        .sum::<i64>();
    f.stop().unwrap(); // flushes the head into a block
    let out = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(dir.path().join("store"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["blocks"], 1, "{v}");
    assert_eq!(
        v["columns"],
        serde_json::json!(["series_id", "time_nanos", "profile_id", "stack_id", "value"])
    );
    assert_eq!(v["total"].as_i64().unwrap(), want, "{v}");
    assert_eq!(v["services"], serde_json::json!(["sample"]));
    assert_eq!(
        v["profile_types"],
        serde_json::json!([
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "process_cpu:samples:count:cpu:nanoseconds"
        ])
    );
    assert_eq!(v["has_main"], true);
}
