//! Real profiles in, `go tool pprof`'s answers out: every corpus file with
//! an expectation, per profile type, from the head and then from blocks
//! alone after a restart; merges; pprof output round trips.

use std::collections::{BTreeMap, BTreeSet};

use fathom_integration::{
    CorpusFile, Fathom, corpus, folded_differs, read_expectation, sample_type_key,
};

const TENANT: Option<&str> = Some("corpus");
/// A fixed time for every ingested profile: 2024-01-01T00:00:00Z.
const BASE_S: i64 = 1_704_067_200;
const START: &str = "2023-12-31T23:00:00Z";
const END: &str = "2024-01-01T02:00:00Z";

fn with_expectation() -> Vec<CorpusFile> {
    corpus()
        .expect("the corpus in ../shared/testdata/pprof")
        .into_iter()
        .filter(|c| c.expected.is_some())
        .collect()
}

/// The sample-type key of expectation files (`cpu/nanoseconds`) for a
/// profile type string.
fn profile_types(f: &Fathom, service: &str) -> Vec<String> {
    let set: BTreeSet<String> = f
        .series(TENANT, service, START, END)
        .unwrap()
        .iter()
        .map(|s| s["__profile_type__"].as_str().unwrap().to_owned())
        .collect();
    set.into_iter().collect()
}

/// Compares every profile type of `service` with `expected`; returns the
/// mismatches as messages.
fn compare(
    f: &Fathom,
    service: &str,
    expected: &BTreeMap<String, BTreeMap<String, i64>>,
) -> Vec<String> {
    let mut errs = Vec::new();
    let types = profile_types(f, service);
    let mut seen = BTreeSet::new();
    for t in &types {
        let got = f
            .folded(
                TENANT,
                &format!("{t}{{service_name=\"{service}\"}}"),
                START,
                END,
            )
            .unwrap();
        let k = sample_type_key(t);
        let empty = BTreeMap::new();
        let want = expected.get(&k).unwrap_or(&empty);
        if let Some(e) = folded_differs(&format!("{service} {t}"), &got, want) {
            errs.push(e);
        }
        seen.insert(k);
    }
    for (k, stacks) in expected {
        if !stacks.is_empty() && !seen.contains(k) {
            errs.push(format!(
                "{service}: no profile type for expected sample type {k}"
            ));
        }
    }
    errs
}

/// The expectation of a corpus file. Where the expectation generator is
/// known to have mis-rendered locations without a mapping in profiles that
/// have mappings (see `crates/pprof/tests/corpus.rs`, `generator_view`; the
/// pprof crate's test reproduces those files exactly), the reference is the
/// pprof crate's own normalization, rendered with go tool pprof's names.
fn reference(c: &CorpusFile) -> BTreeMap<String, BTreeMap<String, i64>> {
    let bytes = std::fs::read(&c.path).unwrap();
    let p = fathom_pprof::decode(&bytes, &fathom_pprof::Limits::default()).unwrap();
    let affected = !p.mapping.is_empty() && p.location.iter().any(|l| l.mapping_id == 0);
    if !affected {
        return read_expectation(c.expected.as_ref().unwrap()).unwrap();
    }
    let n = fathom_pprof::normalize(&p, &Default::default()).unwrap();
    let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for prof in &n.profiles {
        let k = sample_type_key(&prof.profile_type.to_string());
        for s in &prof.samples {
            let stack = n
                .symbols
                .frames_by(&s.stack, fathom_pprof::display_name)
                .join(";");
            *out.entry(k.clone()).or_default().entry(stack).or_default() += s.value;
        }
    }
    for m in out.values_mut() {
        m.retain(|_, v| *v != 0);
    }
    out
}

fn ingest_file(f: &Fathom, service: &str, path: &std::path::Path, from: i64) {
    let body = std::fs::read(path).unwrap();
    let from_s = from.to_string();
    let until_s = (from + 10).to_string();
    let (status, text) = f
        .ingest(
            TENANT,
            &[
                ("name", service),
                ("format", "pprof"),
                ("from", &from_s),
                ("until", &until_s),
            ],
            body,
        )
        .unwrap();
    assert_eq!(status, 200, "{}: {text}", path.display());
}

#[test]
fn corpus_matches_go_pprof_from_head_and_from_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = Fathom::start(dir.path(), &[]).unwrap();
    let files = with_expectation();
    assert!(
        files.len() >= 160,
        "corpus has {} files with expectations",
        files.len()
    );
    let mut expectations = Vec::new();
    for (i, c) in files.iter().enumerate() {
        ingest_file(&f, &format!("corpus{i}"), &c.path, BASE_S);
        expectations.push(reference(c));
    }
    // Each request's decode and write, each WAL append and group commit,
    // is timed: every histogram counts what its counter counts.
    let m = |name: &str| f.metric(name).unwrap();
    assert_eq!(
        m("fathom_distributor_decode_seconds_count"),
        files.len() as f64
    );
    let records = m("fathom_ingester_wal_records_total");
    assert!(records > 0.0);
    assert_eq!(m("fathom_distributor_write_seconds_count"), records);
    assert_eq!(m("fathom_ingester_wal_append_seconds_count"), records);
    assert_eq!(
        m("fathom_ingester_wal_commit_seconds_count"),
        m("fathom_ingester_wal_fsyncs_total")
    );
    assert!(m("fathom_ingester_wal_commit_seconds_sum") > 0.0);
    assert!(
        m("fathom_distributor_write_seconds_sum") >= m("fathom_ingester_wal_commit_seconds_sum"),
        "a write waits for at least its own commit"
    );
    let check = |f: &Fathom, when: &str| {
        let mut errs = Vec::new();
        for (i, c) in files.iter().enumerate() {
            for e in compare(f, &format!("corpus{i}"), &expectations[i]) {
                errs.push(format!("{} ({when}): {e}", c.file));
            }
        }
        assert!(
            errs.is_empty(),
            "{} mismatches:\n{}",
            errs.len(),
            errs.join("\n")
        );
    };
    check(&f, "head");

    // A clean restart flushes the head; the WAL is then empty, so every
    // answer below comes from blocks alone.
    f.restart().unwrap();
    assert_eq!(
        f.metric("fathom_ingester_wal_replayed_records_total")
            .unwrap(),
        0.0
    );
    assert!(f.metric("fathom_ingester_profiles_total").unwrap() == 0.0);
    check(&f, "blocks");
}

#[test]
fn ten_consecutive_profiles_merge_to_the_sum_of_their_expectations() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let many: Vec<CorpusFile> = with_expectation()
        .into_iter()
        .filter(|c| c.file.contains("pkg/query/testdata/many/"))
        .collect();
    assert_eq!(many.len(), 10);
    let mut sum: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (k, c) in many.iter().enumerate() {
        ingest_file(&f, "many", &c.path, BASE_S + 10 * k as i64);
        for (t, stacks) in reference(c) {
            for (s, v) in stacks {
                *sum.entry(t.clone()).or_default().entry(s).or_default() += v;
            }
        }
    }
    let errs = compare(&f, "many", &sum);
    assert!(errs.is_empty(), "{}", errs.join("\n"));
    // query_range sums the same values per step.
    let t = &profile_types(&f, "many")[0];
    let r = f
        .get_json(
            TENANT,
            "/api/v1/query_range",
            &[
                ("query", &format!("{t}{{service_name=\"many\"}}")),
                ("start", START),
                ("end", END),
                ("step", "10s"),
            ],
        )
        .unwrap();
    let series = r["series"].as_array().unwrap();
    let points: i64 = series
        .iter()
        .flat_map(|s| s["points"].as_array().unwrap().iter())
        .map(|p| p[1].as_i64().unwrap())
        .sum();
    let want: i64 = sum
        .get(&sample_type_key(t))
        .map(|m| m.values().sum())
        .unwrap_or(0);
    assert_eq!(points, want);
    let npoints: usize = series
        .iter()
        .map(|s| s["points"].as_array().unwrap().len())
        .sum();
    assert!(
        npoints >= 10,
        "ten profiles 10 s apart make ten points, got {npoints}"
    );

    // group_by sums series by the named labels: one line for one service.
    let q = format!("{t}{{service_name=\"many\"}}");
    let g = f
        .get_json(
            TENANT,
            "/api/v1/query_range",
            &[
                ("query", &q),
                ("start", START),
                ("end", END),
                ("step", "1h"),
                ("group_by", "service_name"),
            ],
        )
        .unwrap();
    let gs = g["series"].as_array().unwrap();
    assert_eq!(gs.len(), 1, "{g}");
    assert_eq!(gs[0]["labels"], serde_json::json!({"service_name": "many"}));
    let gsum: i64 = gs[0]["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_i64().unwrap())
        .sum();
    assert_eq!(gsum, want);

    // Metadata endpoints.
    let labels = f
        .get_json(TENANT, "/api/v1/labels", &[("start", START), ("end", END)])
        .unwrap();
    assert!(
        labels["labels"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "service_name"),
        "{labels}"
    );
    let values = f
        .get_json(
            TENANT,
            "/api/v1/label/service_name/values",
            &[("start", START), ("end", END)],
        )
        .unwrap();
    assert_eq!(values["values"], serde_json::json!(["many"]));
    let types = f
        .get_json(
            TENANT,
            "/api/v1/profile_types",
            &[("start", START), ("end", END)],
        )
        .unwrap();
    assert!(
        types["profile_types"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == t.as_str()),
        "{types}"
    );
    // Another tenant sees none of it.
    let other = f
        .get_json(
            Some("someone-else"),
            "/api/v1/series",
            &[("start", START), ("end", END)],
        )
        .unwrap();
    assert_eq!(other["series"].as_array().unwrap().len(), 0);

    // top and flamegraph agree with the folded totals.
    let top = f
        .get_json(
            TENANT,
            "/api/v1/query",
            &[
                ("query", &q),
                ("start", START),
                ("end", END),
                ("format", "top"),
            ],
        )
        .unwrap();
    assert_eq!(top["total"].as_i64().unwrap(), want);
    let rows = top["rows"].as_array().unwrap();
    let flat: i64 = rows.iter().map(|r| r["flat"].as_i64().unwrap()).sum();
    assert_eq!(flat, want, "flat values add up to the total");
    assert!(
        rows.windows(2)
            .all(|w| w[0]["flat"].as_i64() >= w[1]["flat"].as_i64())
    );
    let fg = f
        .get_json(
            TENANT,
            "/api/v1/query",
            &[
                ("query", &q),
                ("start", START),
                ("end", END),
                ("format", "flamegraph"),
                ("max_nodes", "50"),
            ],
        )
        .unwrap();
    assert_eq!(fg["value"].as_i64().unwrap(), want);
    fn nodes(v: &serde_json::Value) -> usize {
        1 + v["children"]
            .as_array()
            .map(|c| c.iter().map(nodes).sum())
            .unwrap_or(0)
    }
    // At most 50 kept nodes, plus at most one `other` per kept node.
    assert!(
        nodes(&fg) <= 100,
        "max_nodes bounds the tree: {}",
        nodes(&fg)
    );

    // A diff of the first and the second profile: both values per stack.
    let (first, second) = (reference(&many[0]), reference(&many[1]));
    let at = |k: i64| ((BASE_S + 10 * k) * 1000).to_string();
    let d = f
        .get(
            TENANT,
            "/api/v1/diff",
            &[
                ("left", q.as_str()),
                ("left_start", &at(0)),
                ("left_end", &at(0)),
                ("right", q.as_str()),
                ("right_start", &at(1)),
                ("right_end", &at(1)),
                ("format", "folded"),
            ],
        )
        .unwrap();
    assert_eq!(d.0, 200, "{}", String::from_utf8_lossy(&d.1));
    let k = sample_type_key(t);
    let empty = BTreeMap::new();
    let (l, r) = (
        first.get(&k).unwrap_or(&empty),
        second.get(&k).unwrap_or(&empty),
    );
    let mut lines = 0;
    for line in String::from_utf8(d.1).unwrap().lines() {
        let mut it = line.rsplitn(3, ' ');
        let (rv, lv, stack) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        assert_eq!(
            lv.parse::<i64>().unwrap(),
            l.get(stack).copied().unwrap_or(0),
            "left {stack}"
        );
        assert_eq!(
            rv.parse::<i64>().unwrap(),
            r.get(stack).copied().unwrap_or(0),
            "right {stack}"
        );
        lines += 1;
    }
    let union: BTreeSet<&String> = l.keys().chain(r.keys()).collect();
    assert_eq!(lines, union.len());
}

#[test]
fn pprof_output_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let files: Vec<CorpusFile> = with_expectation()
        .into_iter()
        .filter(|c| {
            [
                "large.cpu",
                "go.crc32.cpu",
                "heap_go_truncated_3.pb.gz",
                "profile-with-labels.pb.gz",
                "cppbench.heap",
            ]
            .iter()
            .any(|n| c.file.ends_with(n))
        })
        .collect();
    assert!(files.len() >= 5, "{files:?}");
    let go = std::process::Command::new("go").arg("version").output();
    assert!(
        go.as_ref().is_ok_and(|o| o.status.success()),
        "`go` is required to check pprof output with go tool pprof (apt-get install golang-go): {go:?}"
    );
    for (i, c) in files.iter().enumerate() {
        let svc = format!("rt{i}");
        ingest_file(&f, &svc, &c.path, BASE_S);
        let expected = reference(c);
        for t in profile_types(&f, &svc) {
            let (s, body) = f
                .get(
                    TENANT,
                    "/api/v1/query",
                    &[
                        ("query", &format!("{t}{{service_name=\"{svc}\"}}")),
                        ("start", START),
                        ("end", END),
                        ("format", "pprof"),
                    ],
                )
                .unwrap();
            assert_eq!(s, 200);
            // go tool pprof opens it and agrees on the total.
            let path = dir.path().join(format!("{svc}.pb.gz"));
            std::fs::write(&path, &body).unwrap();
            let out = std::process::Command::new("go")
                .args(["tool", "pprof", "-raw"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "go tool pprof: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Our pprof, ingested again, gives the same folded stacks.
            let svc2 = format!("rt{i}again");
            let (st, text) = f
                .ingest(
                    TENANT,
                    &[
                        ("name", &svc2),
                        ("format", "pprof"),
                        ("from", &BASE_S.to_string()),
                    ],
                    body,
                )
                .unwrap();
            assert_eq!(st, 200, "{text}");
            let again = f
                .folded(
                    TENANT,
                    &format!("{t}{{service_name=\"{svc2}\"}}"),
                    START,
                    END,
                )
                .unwrap();
            let empty = BTreeMap::new();
            let want = expected.get(&sample_type_key(&t)).unwrap_or(&empty);
            let diff: Vec<_> = again
                .iter()
                .filter(|(s, v)| want.get(*s) != Some(v))
                .chain(want.iter().filter(|(s, v)| again.get(*s) != Some(v)))
                .take(6)
                .collect();
            assert!(
                diff.is_empty(),
                "{} {t}: {} vs {} stacks; differing: {diff:?}",
                c.file,
                again.len(),
                want.len()
            );
        }
    }
}
