//! Arrow Flight and Flight SQL with real clients from PyPI
//! (`adbc-driver-flightsql`, `pyarrow.flight`): their answers equal the HTTP
//! API's and the `go tool pprof` expectations; tenants are isolated from the
//! SQL side; bad SQL, DML, the memory limit and the timeout are clear errors
//! and the server keeps serving; time predicates are pushed down.

use std::collections::BTreeMap;
use std::process::Command;

use fathom_integration::{Fathom, read_expectation, testdata, workspace};
use serde_json::Value;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// 2024-01-01T00:00:00Z.
const BASE_S: i64 = 1_704_067_200;
const START: &str = "2023-12-31T23:00:00Z";
const END: &str = "2024-01-01T02:00:00Z";
const LARGE: &str = "google+pprof/internal/proftest/testdata/large.cpu";
const SMALL: &str = "google+pprof/internal/report/testdata/sample.cpu";

fn ingest(f: &Fathom, tenant: &str, file: &str, service: &str, at_s: i64) {
    let body = std::fs::read(testdata().join("pprof").join(file)).unwrap();
    let from = at_s.to_string();
    let until = (at_s + 10).to_string();
    let (s, b) = f
        .ingest(
            Some(tenant),
            &[
                ("name", service),
                ("from", &from),
                ("until", &until),
                ("format", "pprof"),
            ],
            body,
        )
        .unwrap();
    assert_eq!(s, 200, "{b}");
}

fn require_python_clients() {
    fathom_integration::require_python(
        "adbc_driver_flightsql.dbapi, pyarrow.flight",
        "the adbc-driver-flightsql and pyarrow Python packages",
    );
}

fn as_totals(v: &Value) -> BTreeMap<String, i64> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_i64().unwrap()))
        .filter(|(_, v)| *v != 0)
        .collect()
}

fn grpc_uri(f: &Fathom) -> String {
    f.url("")
        .replacen("http://", "grpc://", 1)
        .trim_end_matches('/')
        .to_owned()
}

#[test]
fn flight_sql_and_flight_clients_match_the_http_api() {
    require_python_clients();
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(
        dir.path(),
        &["--sql-memory-limit", "64MiB", "--sql-timeout", "20s"],
    )
    .unwrap();
    ingest(&f, "sql-a", LARGE, "sqlsvc", BASE_S);
    ingest(&f, "sql-b", SMALL, "other", BASE_S);

    let out = Command::new("python3")
        .arg(workspace().join("integration/python/flight_sql_client.py"))
        .args([&grpc_uri(&f), "sql-a", "sql-b", "sqlsvc", CPU, START, END])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        f.log()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();

    // Per-stack totals: SQL (flattened and joined tables, prepared
    // statement), Flight DoGet, the HTTP API and go tool pprof agree.
    let sel = format!("{CPU}{{service_name=\"sqlsvc\"}}");
    let http = f.folded(Some("sql-a"), &sel, START, END).unwrap();
    let expected = read_expectation(
        &testdata()
            .join("pprof/expected")
            .join(format!("{LARGE}.folded.tsv.gz")),
    )
    .unwrap();
    let expected = expected.get("cpu/nanoseconds").expect("cpu expectation");
    assert!(http.len() > 1000, "large.cpu has many stacks");
    assert_eq!(&http, expected, "HTTP against go tool pprof");
    for key in ["stacks", "joined", "prepared", "flight_merge"] {
        assert_eq!(as_totals(&v[key]), http, "{key} against the HTTP API");
    }

    // Per-function flat totals: the leaf column and leaf_frame() equal the
    // HTTP top table.
    let top = f
        .get_json(
            Some("sql-a"),
            "/api/v1/query",
            &[
                ("query", &sel),
                ("start", START),
                ("end", END),
                ("format", "top"),
            ],
        )
        .unwrap();
    let flat: BTreeMap<String, i64> = top["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["flat"].as_i64().unwrap(),
            )
        })
        .filter(|(_, v)| *v != 0)
        .collect();
    assert_eq!(as_totals(&v["leaf"]), flat);
    assert_eq!(as_totals(&v["leaf_udf"]), flat);
    let with_main: i64 = http
        .keys()
        .filter(|k| k.split(';').any(|f| f == "main.main"))
        .count() as i64;
    assert!(with_main > 0);
    assert!(
        v["contains"].as_i64().unwrap() >= with_main,
        "stack_contains finds every stack through main.main: {}",
        v["contains"]
    );

    // Metadata: every table with its columns.
    let tables = v["tables"].as_object().unwrap();
    for t in ["profiles", "samples", "series", "stacks", "functions"] {
        let cols = tables
            .get(&format!("fathom.public.{t}"))
            .unwrap_or_else(|| panic!("{t} missing from adbc_get_objects: {tables:?}"));
        assert!(!cols.as_array().unwrap().is_empty(), "{t} has no columns");
    }
    let profile_cols: Vec<&str> = tables["fathom.public.profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for c in [
        "time",
        "profile_type",
        "service_name",
        "labels",
        "stack",
        "value",
        "profile_id",
    ] {
        assert!(
            profile_cols.contains(&c),
            "profiles lacks {c}: {profile_cols:?}"
        );
    }

    // Tenants: a query without WHERE sees one tenant only.
    assert_eq!(v["services_a"], serde_json::json!(["sqlsvc"]));
    assert_eq!(v["services_b"], serde_json::json!(["other"]));
    assert_eq!(v["b_sees_service_a"], 0);
    let (ca, cb) = (
        v["count_a"].as_i64().unwrap(),
        v["count_b"].as_i64().unwrap(),
    );
    assert!(ca > 0 && cb > 0 && ca != cb, "counts {ca} / {cb}");

    // Errors name their cause, with the matching status; the server goes on.
    let err = |k: &str| -> String {
        v["errors"][k]
            .as_str()
            .unwrap_or_else(|| panic!("{k} should fail: {}", v["errors"]))
            .to_owned()
    };
    assert!(err("syntax").contains("SQL syntax"), "{}", err("syntax"));
    assert!(
        err("syntax").contains("InvalidArgument"),
        "{}",
        err("syntax")
    );
    assert!(
        err("unknown_table").contains("no_such_table"),
        "{}",
        err("unknown_table")
    );
    for k in ["insert", "create"] {
        assert!(err(k).contains("read-only"), "{}", err(k));
        assert!(err(k).contains("PermissionDenied"), "{}", err(k));
    }
    assert!(err("memory").contains("memory limit"), "{}", err("memory"));
    assert!(
        err("memory").contains("ResourceExhausted"),
        "{}",
        err("memory")
    );
    assert!(
        err("timeout").contains("timeout of 20s"),
        "{}",
        err("timeout")
    );
    assert!(
        err("timeout").contains("DeadlineExceeded"),
        "{}",
        err("timeout")
    );
    assert!(v["after_errors"].as_i64().unwrap() > 0);
    assert_eq!(v["flight_schema"], serde_json::json!(["stack", "value"]));
    let fe = v["flight_error"]
        .as_str()
        .expect("a ticket without a query fails");
    assert!(fe.contains("query parameter is required"), "{fe}");
    assert!(f.log().contains("ready"), "server still up");
    let (s, _) = f.get(None, "/ready", &[]).unwrap();
    assert_eq!(s, 200);
}

/// A one-hour SQL query reads the one block of that hour, not the block of
/// a month before.
#[test]
fn sql_time_predicates_are_pushed_down() {
    require_python_clients();
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fathom::start(dir.path(), &[]).unwrap();
    let month_ago = BASE_S - 30 * 86_400;
    ingest(&f, "push", SMALL, "svc", month_ago);
    f.restart().unwrap(); // flushes: block 1
    ingest(&f, "push", SMALL, "svc", BASE_S);
    f.restart().unwrap(); // flushes: block 2

    let run = |sql: &str| -> i64 {
        let script = format!(
            "import adbc_driver_flightsql.dbapi as fs, warnings\nwarnings.simplefilter('ignore')\n\
             conn = fs.connect('{}', db_kwargs={{'adbc.flight.sql.rpc.call_header.x-scope-orgid': 'push'}})\n\
             c = conn.cursor()\nc.execute(\"{sql}\")\nprint(c.fetchall()[0][0])\nc.close()\nconn.close()",
            grpc_uri(&f)
        );
        let out = fathom_integration::python3_script(&script, std::iter::empty::<&str>());
        String::from_utf8_lossy(&out).trim().parse().unwrap()
    };
    let scanned = || {
        f.metric("fathom_querier_sql_scanned_sources_total")
            .unwrap()
    };

    let all = run("SELECT count(*) FROM profiles");
    let s0 = scanned();
    let hour = run(&format!(
        "SELECT count(*) FROM profiles WHERE time >= TIMESTAMP '{START}' AND time < TIMESTAMP '{END}'"
    ));
    let s1 = scanned();
    assert!(all > 0);
    assert_eq!(hour * 2, all, "the hour holds one of the two profiles");
    assert_eq!(s1 - s0, 1.0, "one block read for one hour of data");
    let before = s1;
    run("SELECT count(*) FROM profiles");
    let s2 = scanned();
    assert_eq!(s2 - before, 2.0, "both blocks without a time predicate");
    // now() is folded to a literal before the scan: nothing of 2024 is read.
    let recent = run("SELECT count(*) FROM profiles WHERE time > now() - INTERVAL '1 hour'");
    assert_eq!(recent, 0);
    assert_eq!(scanned() - s2, 0.0, "no block overlaps the last hour");
}
