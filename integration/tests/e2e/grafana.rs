//! Grafana's Pyroscope data source against `fathom all`: Pyroscope's
//! `querier.v1` API over Connect, called by the real Connect client from
//! PyPI (`connectrpc`, with messages and stubs generated at test time from
//! the repo's protos), in protobuf and in JSON, answers exactly what
//! Fathom's HTTP API answers for the same selection and range; the
//! flamebearer endpoints Grafana's Profiles Drilldown calls
//! (`/pyroscope/render`, `/pyroscope/render-diff`) agree with both; bad
//! requests get Connect errors that name the problem.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use fathom_integration::{Fathom, testdata, workspace};
use fathom_proto::pprof;
use fathom_proto::pyroscope::google::v1 as google;
use fathom_proto::pyroscope::querier::v1 as querier;
use fathom_proto::pyroscope::types::v1 as types;
use prost::Message;
use serde_json::{Value, json};

const TENANT: &str = "grafana";
const APP: &str = "grafana-app";
/// 2024-01-01T00:00:00Z.
const BASE_S: i64 = 1_704_067_200;
const START_MS: i64 = (BASE_S - 60) * 1000;
const END_MS: i64 = (BASE_S + 600) * 1000;
/// A Go CPU profile of 230 locations and stacks up to 27 deep: enough for
/// `max_nodes` to prune, small enough for a debug build (and for JSON
/// parsers' nesting limits).
const MEDIUM: &str = "parca-dev+parca/pkg/query/testdata/fib.pb.gz";
const SMALL: &str = "google+pprof/internal/report/testdata/sample.cpu";
const HEAP: &str = "grafana+pyroscope/pkg/og/convert/pprof/testdata/nodejs-heap.pb.gz";

/// What is ingested: (file, service, region, unix seconds).
const PROFILES: [(&str, &str, &str, i64); 7] = [
    (MEDIUM, APP, "eu", BASE_S),
    (SMALL, APP, "eu", BASE_S + 5),
    (SMALL, APP, "eu", BASE_S + 120),
    (SMALL, APP, "us", BASE_S + 60),
    (MEDIUM, APP, "us", BASE_S + 180),
    (HEAP, APP, "eu", BASE_S + 30),
    (SMALL, "other-app", "eu", BASE_S + 30),
];

/// The cargo target directory of this test binary (`<target>/debug/deps/e2e-…`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| workspace().join("target"))
}

/// The venv with `connectrpc` and its code generators (scripts/test-all.sh
/// makes it: their protobuf runtime must not meet the SDKs' pinned ones).
fn connect_venv() -> PathBuf {
    let venv = target_dir().join("py-connect");
    let bin = venv.join("bin");
    let ok = Command::new(bin.join("python"))
        .args(["-c", "import connectrpc, protobuf"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok && bin.join("protoc-gen-py").exists() && bin.join("protoc-gen-connectrpc").exists(),
        "Grafana's Connect client is required in {0}: scripts/test-all.sh creates it \
         (python3 -m venv {0} && {0}/bin/pip install connectrpc==0.13.0 protoc-gen-connectrpc==0.13.0 \
         protobuf-py==0.7.0 protoc-gen-py==0.7.0)",
        venv.display()
    );
    venv
}

/// Generates the Python messages and Connect stubs from the repo's protos
/// into `dir/gen`.
fn generate(venv: &Path, dir: &Path) {
    let gen_dir = dir.join("gen");
    std::fs::create_dir_all(&gen_dir).unwrap();
    let bin = venv.join("bin");
    let out = Command::new("protoc")
        .arg("-I")
        .arg(workspace().join("crates/proto/proto"))
        .arg(format!(
            "--plugin=protoc-gen-py={}",
            bin.join("protoc-gen-py").display()
        ))
        .arg(format!(
            "--plugin=protoc-gen-connectrpc={}",
            bin.join("protoc-gen-connectrpc").display()
        ))
        .arg(format!("--py_out={}", gen_dir.display()))
        .arg(format!("--connectrpc_out={}", gen_dir.display()))
        .args([
            "querier/v1/querier.proto",
            "types/v1/types.proto",
            "google/v1/profile.proto",
        ])
        .output()
        .expect("protoc is required (apt-get install protobuf-compiler)");
    assert!(
        out.status.success(),
        "protoc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One call's answer.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Ok { json: Value, binary: Vec<u8> },
    Err { code: String, message: String },
}

impl Answer {
    fn ok<M: Message + Default>(&self) -> M {
        match self {
            Answer::Ok { binary, .. } => M::decode(binary.as_slice()).unwrap(),
            Answer::Err { code, message } => panic!("{code}: {message}"),
        }
    }

    fn err(&self) -> (&str, &str) {
        match self {
            Answer::Err { code, message } => (code, message),
            Answer::Ok { json, .. } => panic!("expected an error, got {json}"),
        }
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Makes every call with the Python Connect client, once per codec, and
/// returns the answers per call after checking that both codecs agree.
fn connect_calls(f: &Fathom, calls: &[Value]) -> Vec<Answer> {
    let venv = connect_venv();
    let dir = tempfile::tempdir().unwrap();
    generate(&venv, dir.path());
    let calls_path = dir.path().join("calls.json");
    std::fs::write(&calls_path, serde_json::to_vec(calls).unwrap()).unwrap();
    let out = Command::new(venv.join("bin/python"))
        .arg(workspace().join("integration/python/grafana_connect_client.py"))
        .arg(dir.path())
        .arg(f.url(""))
        .arg(TENANT)
        .arg(&calls_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python: {}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        f.log()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let parse = |codec: &str| -> Vec<Answer> {
        v[codec]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| match a.get("error") {
                Some(e) => Answer::Err {
                    code: e["code"].as_str().unwrap().to_owned(),
                    message: e["message"].as_str().unwrap().to_owned(),
                },
                None => Answer::Ok {
                    json: a["ok"].clone(),
                    binary: unhex(a["binary"].as_str().unwrap()),
                },
            })
            .collect()
    };
    let (proto, json) = (parse("proto"), parse("json"));
    assert_eq!(proto.len(), calls.len());
    for (i, (p, j)) in proto.iter().zip(&json).enumerate() {
        assert_eq!(p, j, "call {i} ({}): proto and JSON differ", calls[i]);
    }
    proto
}

fn call(method: &str, request_type: &str, request: Value) -> Value {
    json!({"method": method, "request_type": request_type, "request": request})
}

fn ingest_all(f: &Fathom) {
    for (file, service, region, at) in PROFILES {
        let body = std::fs::read(testdata().join("pprof").join(file)).unwrap();
        let name = format!("{service}{{region={region}}}");
        let (from, until) = (at.to_string(), (at + 10).to_string());
        let (s, b) = f
            .ingest(
                Some(TENANT),
                &[
                    ("name", name.as_str()),
                    ("from", &from),
                    ("until", &until),
                    ("format", "pprof"),
                ],
                body,
            )
            .unwrap();
        assert_eq!(s, 200, "{b}");
    }
}

fn http(f: &Fathom, path: &str, q: &[(&str, &str)]) -> Value {
    let (start, end) = (START_MS.to_string(), END_MS.to_string());
    let mut all = vec![("start", start.as_str()), ("end", end.as_str())];
    all.extend_from_slice(q);
    f.get_json(Some(TENANT), path, &all).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// Flattened levels read back as a renderer does: stack → [total per
/// column…, self per column…]; a node's parent is the node one level up
/// whose span holds its x offset (in a column where the node is not empty).
fn unflatten(
    names: &[String],
    levels: &[Vec<i64>],
    cols: usize,
) -> BTreeMap<Vec<String>, Vec<i64>> {
    let width = 3 * cols + 1;
    let mut abs: Vec<Vec<Vec<i64>>> = Vec::new();
    for level in levels {
        assert_eq!(level.len() % width, 0);
        let mut end = vec![0; cols];
        abs.push(
            level
                .chunks_exact(width)
                .map(|n| {
                    (0..cols)
                        .map(|c| {
                            let x = end[c] + n[3 * c];
                            end[c] = x + n[3 * c + 1];
                            x
                        })
                        .collect()
                })
                .collect(),
        );
    }
    let mut paths: Vec<Vec<Vec<String>>> = Vec::new();
    let mut out = BTreeMap::new();
    for (d, level) in levels.iter().enumerate() {
        let mut here = Vec::new();
        for (k, n) in level.chunks_exact(width).enumerate() {
            let path = if d == 0 {
                assert_eq!(names[n[width - 1] as usize], "total");
                Vec::new()
            } else {
                let c = (0..cols).find(|&c| n[3 * c + 1] > 0).unwrap();
                let x = abs[d][k][c];
                let parent = (0..abs[d - 1].len())
                    .find(|&p| {
                        let px = abs[d - 1][p][c];
                        px <= x && x < px + levels[d - 1][p * width + 3 * c + 1]
                    })
                    .expect("a parent spans every node");
                let mut path = paths[d - 1][parent].clone();
                path.push(names[n[width - 1] as usize].clone());
                path
            };
            let vals: Vec<i64> = (0..cols)
                .map(|c| n[3 * c + 1])
                .chain((0..cols).map(|c| n[3 * c + 2]))
                .collect();
            assert!(
                out.insert(path.clone(), vals).is_none(),
                "two nodes for {path:?}"
            );
            here.push(path);
        }
        paths.push(here);
    }
    out
}

/// The same map from the HTTP API's flame graph JSON; `keys` are the
/// totals then the selfs.
fn tree_map(
    node: &Value,
    keys: &[&str],
    path: &mut Vec<String>,
    out: &mut BTreeMap<Vec<String>, Vec<i64>>,
) {
    out.insert(
        path.clone(),
        keys.iter().map(|k| node[*k].as_i64().unwrap()).collect(),
    );
    for c in node["children"].as_array().unwrap() {
        path.push(c["name"].as_str().unwrap().to_owned());
        tree_map(c, keys, path, out);
        path.pop();
    }
}

fn http_tree(v: &Value, keys: &[&str]) -> BTreeMap<Vec<String>, Vec<i64>> {
    let mut out = BTreeMap::new();
    tree_map(v, keys, &mut Vec::new(), &mut out);
    out
}

/// The levels of a flamebearer JSON.
fn flamebearer_levels(fb: &Value) -> Vec<Vec<i64>> {
    fb["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect()
        })
        .collect()
}

fn level_values(l: &[querier::Level]) -> Vec<Vec<i64>> {
    l.iter().map(|l| l.values.clone()).collect()
}

/// The HTTP API's pprof answer, decoded.
fn http_pprof(f: &Fathom, query: &str) -> pprof::Profile {
    let (s, b) = f
        .get(
            Some(TENANT),
            "/api/v1/query",
            &[
                ("query", query),
                ("start", &START_MS.to_string()),
                ("end", &END_MS.to_string()),
                ("format", "pprof"),
            ],
        )
        .unwrap();
    assert_eq!(s, 200);
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(b.as_slice())
        .read_to_end(&mut raw)
        .unwrap();
    pprof::Profile::decode(raw.as_slice()).unwrap()
}

fn as_pprof(p: &google::Profile) -> pprof::Profile {
    pprof::Profile::decode(p.encode_to_vec().as_slice()).unwrap()
}

/// HTTP range series as labels → (ms → value).
fn http_range(v: &Value) -> BTreeMap<BTreeMap<String, String>, BTreeMap<i64, f64>> {
    v["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let labels = s["labels"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            let pts = s["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_i64().unwrap(), p[1].as_i64().unwrap() as f64))
                .collect();
            (labels, pts)
        })
        .collect()
}

fn connect_range(
    r: &querier::SelectSeriesResponse,
) -> BTreeMap<BTreeMap<String, String>, BTreeMap<i64, f64>> {
    r.series
        .iter()
        .map(|s| {
            (
                s.labels
                    .iter()
                    .map(|l| (l.name.clone(), l.value.clone()))
                    .collect(),
                s.points.iter().map(|p| (p.timestamp, p.value)).collect(),
            )
        })
        .collect()
}

#[test]
fn grafana_connect_client_answers_like_the_http_api() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    ingest_all(&f);

    let types_http = strings(&http(&f, "/api/v1/profile_types", &[])["profile_types"]);
    let cpu = types_http
        .iter()
        .find(|t| t.starts_with("process_cpu:cpu:nanoseconds"))
        .expect("a CPU profile type")
        .clone();
    let heap = types_http
        .iter()
        .find(|t| t.starts_with("memory:inuse_space"))
        .expect("a heap profile type")
        .clone();
    let app = format!("{{service_name=\"{APP}\"}}");
    let app_cpu = format!("{cpu}{app}");
    let eu = format!("{{service_name=\"{APP}\", region=\"eu\"}}");
    let us = format!("{{service_name=\"{APP}\", region=\"us\"}}");
    let range = json!({"start": START_MS, "end": END_MS});
    let with = |extra: Value| {
        let mut r = range.clone();
        r.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        r
    };
    let stacks = |extra: Value| -> Value {
        with(json!({"profileTypeID": cpu, "labelSelector": app}))
            .as_object()
            .unwrap()
            .clone()
            .into_iter()
            .chain(extra.as_object().unwrap().clone())
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    const SMS: &str = "querier.v1.SelectMergeStacktracesRequest";
    let calls = vec![
        /* 0 */
        call(
            "profile_types",
            "querier.v1.ProfileTypesRequest",
            range.clone(),
        ),
        /* 1 */
        call(
            "label_names",
            "types.v1.LabelNamesRequest",
            with(json!({"matchers": [app]})),
        ),
        /* 2 */
        call(
            "label_values",
            "types.v1.LabelValuesRequest",
            with(json!({"name": "region", "matchers": [app]})),
        ),
        /* 3 */
        call(
            "label_values",
            "types.v1.LabelValuesRequest",
            with(json!({"name": "__profile_type__", "matchers": [app]})),
        ),
        /* 4 */
        call(
            "series",
            "querier.v1.SeriesRequest",
            with(
                json!({"matchers": [format!("{{__profile_type__=\"{cpu}\", service_name=\"{APP}\"}}")]}),
            ),
        ),
        /* 5 */
        call(
            "series",
            "querier.v1.SeriesRequest",
            with(json!({"matchers": [app], "labelNames": ["service_name", "__profile_type__"]})),
        ),
        /* 6 */ call("select_merge_stacktraces", SMS, stacks(json!({}))),
        /* 7 */
        call(
            "select_merge_stacktraces",
            SMS,
            stacks(json!({"maxNodes": 64})),
        ),
        /* 8 */
        call(
            "select_merge_stacktraces",
            SMS,
            stacks(json!({"format": "PROFILE_FORMAT_PPROF"})),
        ),
        /* 9 */
        call(
            "select_merge_profile",
            "querier.v1.SelectMergeProfileRequest",
            with(json!({"profileTypeID": cpu, "labelSelector": app})),
        ),
        /* 10 */
        call(
            "select_series",
            "querier.v1.SelectSeriesRequest",
            with(
                json!({"profileTypeID": cpu, "labelSelector": app, "groupBy": ["region"], "step": 60,
                        "aggregation": "TIME_SERIES_AGGREGATION_TYPE_SUM"}),
            ),
        ),
        /* 11 */
        call(
            "select_series",
            "querier.v1.SelectSeriesRequest",
            with(json!({"profileTypeID": cpu, "labelSelector": app, "step": 60})),
        ),
        /* 12 */
        call(
            "select_series",
            "querier.v1.SelectSeriesRequest",
            with(
                json!({"profileTypeID": cpu, "labelSelector": app, "groupBy": ["region"], "step": 60,
                        "aggregation": "TIME_SERIES_AGGREGATION_TYPE_AVERAGE"}),
            ),
        ),
        /* 13 */
        call(
            "diff",
            "querier.v1.DiffRequest",
            json!({
                "left": with(json!({"profileTypeID": cpu, "labelSelector": eu, "maxNodes": 256})),
                "right": with(json!({"profileTypeID": cpu, "labelSelector": us})),
            }),
        ),
        /* 14 */
        call(
            "select_merge_stacktraces",
            SMS,
            stacks(json!({"labelSelector": "{service_name="})),
        ),
        /* 15 */
        call(
            "select_merge_stacktraces",
            SMS,
            stacks(json!({"profileTypeID": ""})),
        ),
        /* 16 */
        call(
            "select_merge_stacktraces",
            SMS,
            stacks(json!({"spanSelector": ["9a517183f26a089d"]})),
        ),
        /* 17 */
        call(
            "select_series",
            "querier.v1.SelectSeriesRequest",
            with(json!({"profileTypeID": cpu, "labelSelector": app, "step": -1})),
        ),
        /* 18 */
        call(
            "diff",
            "querier.v1.DiffRequest",
            json!({
                "left": with(json!({"profileTypeID": cpu, "labelSelector": eu})),
                "right": with(json!({"profileTypeID": heap, "labelSelector": eu})),
            }),
        ),
        /* 19 */
        call(
            "label_names",
            "types.v1.LabelNamesRequest",
            with(json!({"matchers": ["{region=~\"(\"}"]})),
        ),
        /* 20 */
        call(
            "select_merge_stacktraces",
            SMS,
            stacks(json!({"format": "PROFILE_FORMAT_DOT"})),
        ),
        /* 21 */
        call(
            "get_profile_stats",
            "types.v1.GetProfileStatsRequest",
            json!({}),
        ),
    ];
    let a = connect_calls(&f, &calls);

    // ProfileTypes: the HTTP API's list, each split into its parts.
    let pts: querier::ProfileTypesResponse = a[0].ok();
    let ids: Vec<String> = pts.profile_types.iter().map(|p| p.id.clone()).collect();
    assert_eq!(ids, types_http);
    for p in &pts.profile_types {
        let parts = [
            &p.name,
            &p.sample_type,
            &p.sample_unit,
            &p.period_type,
            &p.period_unit,
        ];
        assert_eq!(parts.map(|s| s.as_str()).join(":"), p.id);
    }

    // LabelNames: the HTTP API's labels plus Pyroscope's reserved ones.
    let names: types::LabelNamesResponse = a[1].ok();
    let http_labels = strings(&http(&f, "/api/v1/labels", &[("query", &app)])["labels"]);
    let own: Vec<String> = names
        .names
        .iter()
        .filter(|n| !n.starts_with("__"))
        .cloned()
        .collect();
    assert_eq!(own, http_labels);
    for r in [
        "__name__",
        "__profile_type__",
        "__type__",
        "__unit__",
        "__period_type__",
        "__period_unit__",
    ] {
        assert!(
            names.names.iter().any(|n| n == r),
            "{r} in {:?}",
            names.names
        );
    }

    // LabelValues, of a label and of the profile type.
    let values: types::LabelValuesResponse = a[2].ok();
    let http_values =
        strings(&http(&f, "/api/v1/label/region/values", &[("query", &app)])["values"]);
    assert_eq!(values.names, http_values);
    assert_eq!(values.names, ["eu", "us"]);
    let app_types: types::LabelValuesResponse = a[3].ok();
    let http_series = http(&f, "/api/v1/series", &[("query", &app)]);
    let app_types_http: BTreeSet<String> = http_series["series"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["__profile_type__"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        app_types.names,
        app_types_http.iter().cloned().collect::<Vec<_>>()
    );

    // Series: the HTTP API's series, with the reserved labels.
    let series: querier::SeriesResponse = a[4].ok();
    let got: BTreeSet<BTreeMap<String, String>> = series
        .labels_set
        .iter()
        .map(|l| {
            let m: BTreeMap<String, String> = l
                .labels
                .iter()
                .map(|p| (p.name.clone(), p.value.clone()))
                .collect();
            assert_eq!(m["__profile_type__"], cpu);
            assert_eq!(m["__name__"], "process_cpu");
            m.into_iter()
                .filter(|(k, _)| !k.starts_with("__"))
                .collect()
        })
        .collect();
    let want: BTreeSet<BTreeMap<String, String>> =
        http(&f, "/api/v1/series", &[("query", &app_cpu)])["series"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                s.as_object()
                    .unwrap()
                    .iter()
                    .filter(|(k, _)| !k.starts_with("__"))
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect()
            })
            .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), 2, "{got:?}");
    let projected: querier::SeriesResponse = a[5].ok();
    let got: BTreeSet<Vec<(String, String)>> = projected
        .labels_set
        .iter()
        .map(|l| {
            l.labels
                .iter()
                .map(|p| (p.name.clone(), p.value.clone()))
                .collect()
        })
        .collect();
    let want: BTreeSet<Vec<(String, String)>> = app_types_http
        .iter()
        .map(|t| {
            vec![
                ("__profile_type__".to_owned(), t.clone()),
                ("service_name".to_owned(), APP.to_owned()),
            ]
        })
        .collect();
    assert_eq!(got, want);

    // SelectMergeStacktraces: the HTTP API's flame graph, flattened.
    for (i, max_nodes) in [(6, None), (7, Some("64"))] {
        let r: querier::SelectMergeStacktracesResponse = a[i].ok();
        let fg = r.flamegraph.unwrap();
        let mut q = vec![("query", app_cpu.as_str()), ("format", "flamegraph")];
        if let Some(n) = max_nodes {
            q.push(("max_nodes", n));
        }
        let tree = http(&f, "/api/v1/query", &q);
        let want = http_tree(&tree, &["value", "self"]);
        assert_eq!(
            unflatten(&fg.names, &level_values(&fg.levels), 1),
            want,
            "call {i}"
        );
        assert_eq!(fg.total, tree["value"].as_i64().unwrap());
        assert_eq!(fg.max_self, want.values().map(|v| v[1]).max().unwrap());
        if max_nodes.is_some() {
            assert!(
                fg.names.iter().any(|n| n == "other"),
                "pruning makes `other` nodes"
            );
            assert!(want.len() < 64 * 2, "{} nodes", want.len());
        }
    }

    // pprof, from SelectMergeStacktraces and SelectMergeProfile: the HTTP
    // API's pprof.
    let want = http_pprof(&f, &app_cpu);
    assert!(!want.sample.is_empty());
    let r: querier::SelectMergeStacktracesResponse = a[8].ok();
    assert_eq!(as_pprof(&r.pprof.unwrap().profile.unwrap()), want);
    let p: google::Profile = a[9].ok();
    assert_eq!(as_pprof(&p), want);

    // SelectSeries: the HTTP API's range query.
    let (s60, gb) = ("60", "region");
    let by_region = http_range(&http(
        &f,
        "/api/v1/query_range",
        &[("query", &app_cpu), ("step", s60), ("group_by", gb)],
    ));
    let r: querier::SelectSeriesResponse = a[10].ok();
    assert_eq!(connect_range(&r), by_region);
    assert_eq!(by_region.len(), 2);
    // Without group_by, Pyroscope sums every series into one.
    let per_series = http_range(&http(
        &f,
        "/api/v1/query_range",
        &[("query", &app_cpu), ("step", s60)],
    ));
    let mut summed: BTreeMap<i64, f64> = BTreeMap::new();
    for pts in per_series.values() {
        for (t, v) in pts {
            *summed.entry(*t).or_default() += v;
        }
    }
    let r: querier::SelectSeriesResponse = a[11].ok();
    assert_eq!(
        connect_range(&r),
        BTreeMap::from([(BTreeMap::new(), summed)])
    );
    // Average: per profile; the eu step at BASE_S holds two profiles.
    let r: querier::SelectSeriesResponse = a[12].ok();
    let avg = connect_range(&r);
    for (labels, pts) in &by_region {
        for (t, v) in pts {
            let n = PROFILES
                .iter()
                .filter(|p| {
                    p.1 == APP
                        && p.0 != HEAP
                        && Some(p.2) == labels.get("region").map(String::as_str)
                })
                .filter(|p| (p.3 * 1000 - START_MS) / 60_000 == (t - START_MS) / 60_000)
                .count() as f64;
            assert!(n >= 1.0, "{labels:?} {t}");
            assert_eq!(avg[labels][t], v / n, "{labels:?} {t}");
        }
    }
    assert!(avg.values().any(|p| p.values().count() > 0));

    // Diff: the HTTP API's diff flame graph, flattened.
    let d: querier::DiffResponse = a[13].ok();
    let fg = d.flamegraph.unwrap();
    let http_diff = f
        .get_json(
            Some(TENANT),
            "/api/v1/diff",
            &[
                ("left", format!("{cpu}{eu}").as_str()),
                ("right", format!("{cpu}{us}").as_str()),
                ("left_start", &START_MS.to_string()),
                ("left_end", &END_MS.to_string()),
                ("right_start", &START_MS.to_string()),
                ("right_end", &END_MS.to_string()),
                ("format", "flamegraph"),
                ("max_nodes", "256"),
            ],
        )
        .unwrap();
    let want = http_tree(&http_diff, &["left", "right", "self_left", "self_right"]);
    assert_eq!(unflatten(&fg.names, &level_values(&fg.levels), 2), want);
    assert_eq!(fg.left_ticks, http_diff["left"].as_i64().unwrap());
    assert_eq!(fg.right_ticks, http_diff["right"].as_i64().unwrap());
    assert_eq!(fg.total, fg.left_ticks + fg.right_ticks);

    // Errors: Connect codes, and messages that name the problem.
    let (code, msg) = a[14].err();
    assert_eq!(code, "invalid_argument");
    assert!(msg.contains("label_selector"), "{msg}");
    let (code, msg) = a[15].err();
    assert_eq!(code, "invalid_argument");
    assert!(msg.contains("profile_typeID"), "{msg}");
    let (code, msg) = a[16].err();
    assert_eq!(code, "unimplemented");
    assert!(msg.contains("span"), "{msg}");
    let (code, msg) = a[17].err();
    assert_eq!(code, "invalid_argument");
    assert!(msg.contains("step"), "{msg}");
    let (code, msg) = a[18].err();
    assert_eq!(code, "invalid_argument");
    assert!(msg.contains("same profile type"), "{msg}");
    let (code, msg) = a[19].err();
    assert_eq!(code, "invalid_argument");
    assert!(
        msg.contains("matchers[0]") && msg.contains("regex"),
        "{msg}"
    );
    let (code, msg) = a[20].err();
    assert_eq!(code, "unimplemented");
    assert!(msg.contains("PROFILE_FORMAT_DOT"), "{msg}");

    // GetProfileStats: the span of everything ingested.
    let stats: types::GetProfileStatsResponse = a[21].ok();
    assert!(stats.data_ingested);
    let times = PROFILES.iter().map(|p| p.3 * 1000);
    assert_eq!(stats.oldest_profile_time, times.clone().min().unwrap());
    assert_eq!(stats.newest_profile_time, times.max().unwrap());

    // The flamebearer endpoints: the same flame graphs, with a timeline.
    let (from, until) = (START_MS.to_string(), END_MS.to_string());
    let render = f
        .get_json(
            Some(TENANT),
            "/pyroscope/render",
            &[
                ("query", app_cpu.as_str()),
                ("from", &from),
                ("until", &until),
                ("max-nodes", "64"),
                ("groupBy", "region"),
            ],
        )
        .unwrap();
    let r7: querier::SelectMergeStacktracesResponse = a[7].ok();
    let fg7 = r7.flamegraph.unwrap();
    let fb = &render["flamebearer"];
    assert_eq!(strings(&fb["names"]), fg7.names);
    assert_eq!(flamebearer_levels(fb), level_values(&fg7.levels));
    assert_eq!(fb["numTicks"].as_i64().unwrap(), fg7.total);
    assert_eq!(fb["maxSelf"].as_i64().unwrap(), fg7.max_self);
    assert_eq!(render["metadata"]["format"], "single");
    assert_eq!(render["metadata"]["units"], "samples");
    let sum = |t: &Value| {
        t["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .sum::<i64>()
    };
    assert_eq!(render["timeline"]["durationDelta"], 15);
    let groups = render["groups"].as_object().unwrap();
    assert_eq!(groups.keys().collect::<Vec<_>>(), ["eu", "us"]);
    assert_eq!(groups.values().map(sum).sum::<i64>(), fg7.total);
    let render_one = f
        .get_json(
            Some(TENANT),
            "/pyroscope/render",
            &[
                ("query", app_cpu.as_str()),
                ("from", &from),
                ("until", &until),
            ],
        )
        .unwrap();
    assert_eq!(
        sum(&render_one["timeline"]),
        fg7.total,
        "the timeline adds up to the flame graph"
    );

    let render_diff = f
        .get_json(
            Some(TENANT),
            "/pyroscope/render-diff",
            &[
                ("leftQuery", format!("{cpu}{eu}").as_str()),
                ("rightQuery", format!("{cpu}{us}").as_str()),
                ("leftFrom", &from),
                ("leftUntil", &until),
                ("rightFrom", &from),
                ("rightUntil", &until),
                ("max-nodes", "256"),
            ],
        )
        .unwrap();
    assert_eq!(
        flamebearer_levels(&render_diff["flamebearer"]),
        level_values(&fg.levels)
    );
    assert_eq!(render_diff["metadata"]["format"], "double");
    assert_eq!(render_diff["leftTicks"].as_i64().unwrap(), fg.left_ticks);
    assert_eq!(render_diff["rightTicks"].as_i64().unwrap(), fg.right_ticks);
    let (s, b) = f
        .get(Some(TENANT), "/pyroscope/render", &[("from", &from)])
        .unwrap();
    assert_eq!(s, 400);
    assert!(
        String::from_utf8_lossy(&b).contains("query is required"),
        "{}",
        String::from_utf8_lossy(&b)
    );
}

/// Raw Connect requests a client library would never send: the protocol's
/// refusals, tenants, and the JSON codec by hand (as curl users do).
#[test]
fn connect_protocol_edges() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    ingest_all(&f);
    let url = f.url("/querier.v1.QuerierService/ProfileTypes");
    let post = |ct: &str, tenant: &str, body: Vec<u8>| {
        let r = f
            .http
            .post(&url)
            .header("content-type", ct)
            .header("X-Scope-OrgID", tenant)
            .body(body)
            .send()
            .unwrap();
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (status, ct, r.bytes().unwrap().to_vec())
    };
    let range = format!(r#"{{"start": "{START_MS}", "end": "{END_MS}"}}"#);

    // JSON by hand: int64 as strings, the canonical field names back.
    let (s, ct, b) = post("application/json", TENANT, range.clone().into_bytes());
    assert_eq!((s, ct.as_str()), (200, "application/json"));
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert!(
        v["profileTypes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["ID"].as_str().unwrap().starts_with("process_cpu:cpu"))
    );

    // Tenants are isolated, and a bad tenant is named.
    let (s, _, b) = post(
        "application/json",
        "someone-else",
        range.clone().into_bytes(),
    );
    assert_eq!(s, 200);
    assert_eq!(serde_json::from_slice::<Value>(&b).unwrap(), json!({}));
    let (s, _, b) = post("application/json", "../etc", range.clone().into_bytes());
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!((s, v["code"].as_str()), (400, Some("invalid_argument")));
    assert!(
        v["message"].as_str().unwrap().contains("X-Scope-OrgID"),
        "{v}"
    );

    // Garbage protobuf, bad JSON, a wrong content type, a GET.
    for (ct, body, status, code, needle) in [
        (
            "application/proto",
            vec![0xff, 0xff, 0xff, 0x01],
            400,
            "invalid_argument",
            "ProfileTypesRequest",
        ),
        (
            "application/json",
            b"{\"start\": [1]}".to_vec(),
            400,
            "invalid_argument",
            "ProfileTypesRequest",
        ),
        (
            "text/plain",
            b"hello".to_vec(),
            415,
            "invalid_argument",
            "application/proto",
        ),
    ] {
        let (s, rct, b) = post(ct, TENANT, body);
        let v: Value = serde_json::from_slice(&b)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&b)));
        assert_eq!(s, status, "{v}");
        assert_eq!(rct, "application/json");
        assert_eq!(v["code"], code, "{v}");
        assert!(v["message"].as_str().unwrap().contains(needle), "{v}");
    }
    let r = f.http.get(&url).send().unwrap();
    assert_eq!(r.status().as_u16(), 405);

    // An empty protobuf body is a request with defaults (the last hour):
    // valid, and empty here.
    let (s, ct, b) = post("application/proto", TENANT, Vec::new());
    assert_eq!((s, ct.as_str()), (200, "application/proto"));
    let r = querier::ProfileTypesResponse::decode(b.as_slice()).unwrap();
    assert!(r.profile_types.is_empty());
}
