//! Blocks are plain Parquet that a user can open with pyarrow.

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
def table(name):
    return pq.read_table([m.replace("meta.json", name + ".parquet") for m in metas][0])
stacks, locations, mappings, profiles = (
    table(n) for n in ["stacks", "locations", "mappings", "profiles"])
ids = lambda t, c: set(t[c].to_pylist())
items = lambda t, c: set(i for l in t[c].to_pylist() for i in l)
print(json.dumps({
    "file_rows": {n: table(n).num_rows for n in
             ["samples", "profiles", "series", "stacks", "locations", "functions", "mappings"]},
    "stacks_of_samples_stored": ids(samples, "stack_id") <= ids(stacks, "stack_id"),
    "locations_of_stacks_stored": items(stacks, "location_ids") == ids(locations, "location_id"),
    "functions_of_locations_stored":
        items(locations, "line_function_ids") <= ids(funcs, "function_id"),
    "mappings_of_locations_stored":
        ids(locations, "mapping_id") - {bytes(16)} <= ids(mappings, "mapping_id"),
    "series_of_profiles_stored": ids(profiles, "series_id") == ids(series, "series_id"),
    "empty_stacks": sum(1 for l in stacks["location_ids"].to_pylist() if not l),
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
    fathom_integration::require_python("pyarrow", "pyarrow");
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fathom::start(dir.path(), &[]).unwrap();
    let (s, b) = f
        .ingest(
            Some("pa"),
            &[
                ("name", "sample"),
                ("format", "pprof"),
                ("from", "1704067200"),
            ],
            sample_cpu(),
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
    let out = fathom_integration::python3_script(SCRIPT, [dir.path().join("store")]);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
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
    // Every file reads, and the ids one file names are the ids another
    // holds: the id columns Fathom encodes itself (crates/block/src/
    // idcol.rs) read in pyarrow as they were written.
    for (file, rows) in v["file_rows"].as_object().unwrap() {
        assert!(rows.as_u64().unwrap() > 0, "{file}: {v}");
    }
    for check in [
        "stacks_of_samples_stored",
        "locations_of_stacks_stored",
        "functions_of_locations_stored",
        "mappings_of_locations_stored",
        "series_of_profiles_stored",
    ] {
        assert_eq!(v[check], true, "{check}: {v}");
    }
    assert_eq!(v["empty_stacks"], 0, "{v}");
}

/// `fathom all` runs a one-node metastore and the compactor: two flushed
/// blocks of one hour become one, answers do not change, the replaced
/// blocks' files are deleted, and the metastore's index survives a restart.
#[test]
fn fathom_all_compacts_its_blocks_through_its_metastore() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fathom::start(
        dir.path(),
        &[
            "--flush-interval",
            "1s",
            "--compaction-interval",
            "1s",
            "--delete-delay",
            "0s",
        ],
    )
    .unwrap();
    let body = sample_cpu();
    let total = |f: &Fathom| -> i64 { sample_folded(f).values().sum() };
    let wait = |f: &Fathom, what: &str, ok: &dyn Fn(&Fathom) -> bool| {
        let t0 = std::time::Instant::now();
        while !ok(f) {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "{what}:\n{}",
                f.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let metric = |f: &Fathom, name: &str| f.metric(name).unwrap_or(0.0);
    let mut single = 0;
    for (i, from) in ["1704067200", "1704067260"].iter().enumerate() {
        push_sample(&f, &body, from);
        if i == 0 {
            single = total(&f);
            assert!(single > 0);
        }
        // Each write is cut into its own block and registered.
        wait(&f, "block flushed", &|f| {
            metric(f, "fathom_ingester_blocks_flushed_total") >= (i + 1) as f64
        });
    }
    // Each cut's two stages are timed, in the metrics and the log.
    for stage in ["encode", "store"] {
        let n = metric(&f, &format!("fathom_ingester_block_{stage}_seconds_count"));
        assert!(n >= 2.0, "{n} {stage} timings for two cuts");
        assert!(f.log().contains(&format!("{stage}_ms=")), "{}", f.log());
    }
    wait(&f, "two blocks compacted into one", &|f| {
        metric(f, "fathom_compactor_jobs_total") >= 1.0
            && metric(f, "fathom_metastore_blocks") == 1.0
    });
    assert_eq!(total(&f), 2 * single, "compaction keeps the answer");
    let metas = || {
        std::fs::read_dir(dir.path().join("store/pc/blocks"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().join("meta.json").exists())
            .count()
    };
    wait(&f, "replaced blocks deleted", &|_| metas() == 1);
    f.restart().unwrap();
    wait(&f, "the index is on disk", &|f| {
        metric(f, "fathom_metastore_blocks") == 1.0
    });
    assert_eq!(total(&f), 2 * single, "the same answer after a restart");
    // A lost metastore directory (or a data directory from before the
    // metastore): the bucket is listed once and its blocks imported.
    f.stop().unwrap();
    std::fs::remove_dir_all(dir.path().join("metastore")).unwrap();
    f.start_again().unwrap();
    assert!(
        f.log()
            .contains("imported the bucket's blocks into the metastore"),
        "{}",
        f.log()
    );
    assert_eq!(
        total(&f),
        2 * single,
        "the same answer from imported blocks"
    );
}

/// `fathom all` builds each write against its head: a write whose stacks
/// the head holds leaves them out of its WAL record (format 5), which
/// names them without repeating them. After kill -9 (no flush), replay
/// rebuilds every acknowledged write, each exactly once, with the same
/// answer.
#[test]
fn fathom_all_replays_writes_built_against_its_head_after_kill() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fathom::start(dir.path(), &[]).unwrap();
    let body = sample_cpu();
    let mut single = 0;
    for (i, from) in ["1704067200", "1704067260", "1704067320"]
        .iter()
        .enumerate()
    {
        push_sample(&f, &body, from);
        if i == 0 {
            single = sample_folded(&f).values().sum::<i64>();
            assert!(single > 0);
        }
    }
    let before = sample_folded(&f);
    assert_eq!(before.values().sum::<i64>(), 3 * single);
    f.kill();
    f.start_again().unwrap();
    assert_eq!(
        f.metric("fathom_ingester_wal_replayed_records_total")
            .unwrap(),
        3.0,
        "{}",
        f.log()
    );
    assert!(
        !f.log().contains("skipped undecodable wal records"),
        "{}",
        f.log()
    );
    assert_eq!(sample_folded(&f), before, "the same answer after replay");
}

/// Go's `sample.cpu` of the corpus, as a client posts it.
fn sample_cpu() -> Vec<u8> {
    let file = corpus()
        .unwrap()
        .into_iter()
        .find(|c| c.file.ends_with("internal/report/testdata/sample.cpu"))
        .unwrap();
    std::fs::read(&file.path).unwrap()
}

/// Posts `body` to tenant `pc` as service `sample` at `from` (seconds).
fn push_sample(f: &Fathom, body: &[u8], from: &str) {
    let (s, b) = f
        .ingest(
            Some("pc"),
            &[("name", "sample"), ("format", "pprof"), ("from", from)],
            body.to_vec(),
        )
        .unwrap();
    assert_eq!(s, 200, "{b}");
}

/// Service `sample`'s CPU time in tenant `pc`, merged over the hours
/// these tests write.
fn sample_folded(f: &Fathom) -> std::collections::BTreeMap<String, i64> {
    f.folded(
        Some("pc"),
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"sample\"}",
        "1704060000000",
        "1704070000000",
    )
    .unwrap()
}
