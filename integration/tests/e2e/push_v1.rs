//! Pyroscope's push.v1 (`/push.v1.PusherService/Push`) against `fathom all`:
//! the real SDKs that speak it (PyPI `pyroscope-io` 1.4.x, crates.io
//! `pyroscope` 2.x with its pprof-rs backend), Connect in proto and JSON
//! over HTTP/1.1 and HTTP/2, gRPC from a tonic client generated from the
//! same protos, idempotence by sample ID, and bad input.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fathom_integration::{Fathom, corpus, workspace};
use fathom_proto::pyroscope::push::v1::{
    PushRequest, RawProfileSeries, RawSample, pusher_service_client::PusherServiceClient,
};
use fathom_proto::pyroscope::types::v1::LabelPair;
use prost::Message;

const PATH: &str = "/push.v1.PusherService/Push";
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// A real Go CPU profile of the corpus (gzip'd pprof).
fn go_cpu() -> Vec<u8> {
    let files = corpus().unwrap();
    let c = files
        .iter()
        .find(|c| c.file.ends_with("go.crc32.cpu"))
        .expect("go.crc32.cpu in the corpus");
    std::fs::read(&c.path).unwrap()
}

fn lp(name: &str, value: &str) -> LabelPair {
    LabelPair {
        name: name.into(),
        value: value.into(),
    }
}

fn push_request(service: &str, samples: Vec<(Vec<u8>, &str)>) -> PushRequest {
    PushRequest {
        series: vec![RawProfileSeries {
            labels: vec![
                lp("__name__", "process_cpu"),
                lp("service_name", service),
                lp("k8s.namespace", "prod"),
            ],
            samples: samples
                .into_iter()
                .map(|(raw_profile, id)| RawSample {
                    raw_profile,
                    id: id.into(),
                })
                .collect(),
            annotations: vec![],
        }],
    }
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// POSTs a Connect request; returns (status, content type, body).
fn connect(
    http: &reqwest::blocking::Client,
    f: &Fathom,
    tenant: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (u16, String, Vec<u8>) {
    let mut rb = http
        .post(f.url(PATH))
        .header("Content-Type", content_type)
        .header("X-Scope-OrgID", tenant)
        .body(body);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, ct, r.bytes().unwrap().to_vec())
}

/// Asserts a Connect error: a 4xx with `{"code", "message"}` whose code
/// is `code` and whose message contains `needle`.
fn assert_connect_error(
    what: &str,
    (status, ct, body): (u16, String, Vec<u8>),
    code: &str,
    needle: &str,
) {
    let text = String::from_utf8_lossy(&body);
    assert!(
        (400..500).contains(&status),
        "{what}: expected a 4xx, got {status}: {text}"
    );
    assert!(
        ct.starts_with("application/json"),
        "{what}: content type {ct}: {text}"
    );
    let v: serde_json::Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {text}"));
    assert_eq!(v["code"], code, "{what}: {v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(needle),
        "{what}: message {msg:?} does not name {needle:?}"
    );
}

/// The value of the `requests` counter for a protocol and outcome.
fn requests(f: &Fathom, protocol: &str, outcome: &str) -> f64 {
    let text = f
        .http
        .get(f.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("fathom_distributor_requests_total{"))
        .filter(|l| l.contains(&format!("protocol=\"{protocol}\"")))
        .filter(|l| l.contains(&format!("outcome=\"{outcome}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `name` is a function of `query` (a top table row) for
/// `tenant`; returns (its cumulative value, the total).
fn wait_for_function(
    f: &Fathom,
    tenant: &str,
    query: &str,
    name: &str,
    contains: bool,
) -> (i64, i64) {
    let t0 = Instant::now();
    loop {
        let v = f
            .get_json(
                Some(tenant),
                "/api/v1/query",
                &[("query", query), ("format", "top")],
            )
            .unwrap();
        let rows = v["rows"].as_array().unwrap();
        let hit = rows.iter().find(|r| {
            let n = r["name"].as_str().unwrap_or_default();
            if contains {
                n.contains(name)
            } else {
                n == name
            }
        });
        if let Some(hit) = hit {
            return (hit["cum"].as_i64().unwrap(), v["total"].as_i64().unwrap());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{name} not found in {query}: {v}\nserver log:\n{}",
            f.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn total(f: &Fathom, tenant: &str, query: &str) -> i64 {
    let v = f
        .get_json(
            Some(tenant),
            "/api/v1/query",
            &[("query", query), ("format", "top"), ("start", "now-1h")],
        )
        .unwrap();
    v["total"].as_i64().unwrap_or(0)
}

fn series_count(f: &Fathom, tenant: &str) -> usize {
    let v = f
        .get_json(Some(tenant), "/api/v1/series", &[("start", "now-30d")])
        .unwrap();
    v["series"].as_array().unwrap().len()
}

/// A venv under the target directory with PyPI's `pyroscope-io` 1.4.x
/// (the suite's system Python keeps 0.8.16 for the legacy-SDK test).
/// Created on first use; scripts/test-all.sh creates it too.
pub(crate) fn pyroscope_io_venv() -> PathBuf {
    let dir = target_dir().join("pyroscope-io-1.4");
    let python = dir.join("bin/python");
    let ok = |python: &Path| {
        Command::new(python)
            .args([
                "-c",
                "import importlib.metadata as m, sys; v = m.version('pyroscope-io'); \
                 sys.exit(0 if v.startswith('1.4.') else 1)",
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok(&python) {
        let out = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&dir)
            .output()
            .expect("python3 is required");
        assert!(
            out.status.success(),
            "python3 -m venv {} failed (Debian: apt-get install python3-venv): {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new(dir.join("bin/pip"))
            .args(["install", "-q", "pyroscope-io>=1.4,<1.5"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pip install pyroscope-io 1.4.x into {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            ok(&python),
            "pyroscope-io 1.4.x is not importable from {}",
            dir.display()
        );
    }
    python
}

const PY_PROGRAM: &str = r#"
import sys, time
import pyroscope
pyroscope.configure(
    application_name="pyapp-v1",
    server_address=sys.argv[1],
    tags={"env": "e2e", "team.name": "core"},
    tenant_id=sys.argv[3],
    basic_auth_username="user",
    basic_auth_password="secret",
    sample_rate=100,
)

def hot_loop_v1():
    x = 0
    for i in range(200000):
        x += i * i
    return x

def main():
    t0 = time.time()
    while time.time() - t0 < float(sys.argv[2]):
        hot_loop_v1()

main()
pyroscope.shutdown()
"#;

#[test]
fn pyroscope_io_1_4_pushes_over_push_v1() {
    let python = pyroscope_io_venv();
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let script = dir.path().join("app.py");
    std::fs::write(&script, PY_PROGRAM).unwrap();
    let out = Command::new(&python)
        .arg(&script)
        .arg(f.url(""))
        .arg("12")
        .arg("py-tenant")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Its tags are labels (`team.name` sanitized as Pyroscope does), its
    // tenant the X-Scope-OrgID it sent.
    let q = format!("{CPU}{{service_name=\"pyapp-v1\", env=\"e2e\", team_name=\"core\"}}");
    let (cum, total) = wait_for_function(&f, "py-tenant", &q, "hot_loop_v1", false);
    assert!(
        cum * 2 > total,
        "hot_loop_v1 should dominate: {cum} of {total}"
    );
    let folded = f.folded(Some("py-tenant"), &q, "now-1h", "now").unwrap();
    assert!(
        folded
            .keys()
            .any(|s| s.contains("main") && s.ends_with("hot_loop_v1")),
        "{folded:?}"
    );
    // It came over push.v1 Connect (not /ingest), and nothing was refused.
    assert!(requests(&f, "push_v1_connect", "ok") >= 1.0, "{}", f.log());
    assert_eq!(requests(&f, "push_v1_connect", "error"), 0.0, "{}", f.log());
    assert_eq!(requests(&f, "http", "ok"), 0.0);
}

#[test]
fn pyroscope_rust_client_pushes_over_push_v1() {
    // A small program using crates.io `pyroscope` 2.x with the pprof-rs
    // backend, built in a target directory of its own under ours (a cargo
    // inside `cargo test` must not wait for the outer one's lock).
    let app = workspace().join("integration/pyroscope-rs-app");
    let target = target_dir().join("pyroscope-rs-app");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--locked", "--quiet"])
        .current_dir(&app)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("cargo is required");
    assert!(
        out.status.success(),
        "building {}: {}",
        app.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let out = Command::new(target.join("debug/pyroscope-rs-app"))
        .arg(f.url(""))
        .arg("8")
        .arg("rs-tenant")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pyroscope-rs-app: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let q = format!("{CPU}{{service_name=\"rustapp\", env=\"e2e\"}}");
    let (cum, total) = wait_for_function(&f, "rs-tenant", &q, "fathom_hot_function", true);
    assert!(
        cum * 2 > total,
        "fathom_hot_function should dominate: {cum} of {total}"
    );
    // The SDK's own labels arrive sanitized (`process.runtime.name`).
    let v = f
        .get_json(
            Some("rs-tenant"),
            "/api/v1/label/process_runtime_name/values",
            &[],
        )
        .unwrap();
    assert_eq!(v["values"], serde_json::json!(["rust"]), "{v}");
    assert!(requests(&f, "push_v1_connect", "ok") >= 1.0, "{}", f.log());
    assert_eq!(requests(&f, "push_v1_connect", "error"), 0.0, "{}", f.log());
}

#[test]
fn connect_push_v1_proto_json_http2_and_idempotence() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let pprof = go_cpu();
    let http1 = reqwest::blocking::Client::new();
    let http2 = reqwest::blocking::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let q = format!("{CPU}{{service_name=\"connect\", k8s_namespace=\"prod\"}}");

    // proto, the request gzip'd, raw_profile gzip'd too.
    let req = push_request("connect", vec![(gzip(&pprof), "11111111-aaaa")]);
    let (s, ct, body) = connect(
        &http1,
        &f,
        "c",
        "application/proto",
        &[
            ("Content-Encoding", "gzip"),
            ("Authorization", "Bearer abc"),
        ],
        gzip(&req.encode_to_vec()),
    );
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(ct, "application/proto");
    assert!(body.is_empty());
    let once = total(&f, "c", &q);
    assert!(once > 0);

    // The same IDs again (a retry, over HTTP/2 this time): stored once.
    let (s, _, body) = connect(
        &http2,
        &f,
        "c",
        "application/proto",
        &[("Authorization", "Basic dXNlcjpzZWNyZXQ=")],
        req.encode_to_vec(),
    );
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(total(&f, "c", &q), once, "a retried push was counted twice");

    // JSON, the profile uncompressed, a new ID: counted again.
    let raw = if pprof.starts_with(&[0x1f, 0x8b]) {
        let mut d = flate2::read::GzDecoder::new(&pprof[..]);
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut d, &mut v).unwrap();
        v
    } else {
        pprof.clone()
    };
    let json = serde_json::to_vec(&push_request("connect", vec![(raw, "22222222-bbbb")])).unwrap();
    let text = String::from_utf8_lossy(&json).into_owned();
    assert!(
        text.contains("\"rawProfile\""),
        "canonical JSON names: {}",
        &text[..200]
    );
    let (s, ct, body) = connect(
        &http2,
        &f,
        "c",
        "application/json",
        &[("Connect-Protocol-Version", "1")],
        json,
    );
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(ct, "application/json");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({})
    );
    assert_eq!(total(&f, "c", &q), 2 * once);
    assert!(requests(&f, "push_v1_connect", "ok") >= 3.0);
}

#[test]
fn grpc_push_v1_from_a_tonic_client() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let pprof = go_cpu();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = f.url("");
    let call = |req: PushRequest, compressed: bool| {
        rt.block_on(async {
            let mut c = PusherServiceClient::connect(url.clone()).await.unwrap();
            if compressed {
                c = c.send_compressed(tonic::codec::CompressionEncoding::Gzip);
            }
            let mut req = tonic::Request::new(req);
            req.metadata_mut()
                .insert("x-scope-orgid", "g".parse().unwrap());
            req.metadata_mut()
                .insert("authorization", "Bearer token".parse().unwrap());
            c.push(req).await
        })
    };
    // One bad sample refuses the request whole, naming it.
    let bad = push_request(
        "grpc",
        vec![(pprof.clone(), "a"), (b"not a profile".to_vec(), "b")],
    );
    let st = call(bad, false).unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument, "{st:?}");
    assert!(
        st.message().contains("series 0 sample 1"),
        "{}",
        st.message()
    );
    assert_eq!(series_count(&f, "g"), 0);
    let mut no_service = push_request("grpc", vec![(pprof.clone(), "c")]);
    no_service.series[0]
        .labels
        .retain(|l| l.name != "service_name");
    let st = call(no_service, false).unwrap_err();
    assert_eq!(st.code(), tonic::Code::InvalidArgument);
    assert!(st.message().contains("service_name"), "{}", st.message());

    call(push_request("grpc", vec![(pprof.clone(), "d")]), true).unwrap();
    let q = format!("{CPU}{{service_name=\"grpc\"}}");
    let once = total(&f, "g", &q);
    assert!(once > 0);
    call(push_request("grpc", vec![(pprof, "d")]), false).unwrap();
    assert_eq!(
        total(&f, "g", &q),
        once,
        "the same ID twice was stored twice"
    );
    assert!(requests(&f, "push_v1_grpc", "ok") >= 2.0);
    assert!(requests(&f, "push_v1_grpc", "error") >= 2.0);

    // A gzip bomb as gRPC message compression: 256 MiB of zeros in a
    // sample, compressed to about 256 KiB on the wire. tonic refuses the
    // message once it decompresses past --max-body-size (16 MiB).
    let bomb = push_request("grpc", vec![(vec![0u8; 256 << 20], "bomb")]);
    let st = call(bomb, true).unwrap_err();
    assert_eq!(st.code(), tonic::Code::ResourceExhausted, "{st:?}");
    let (s, _) = f.get(None, "/ready", &[]).unwrap();
    assert_eq!(s, 200);
}

#[test]
fn bad_push_v1_input_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(
        dir.path(),
        &["--max-labels", "8", "--max-decompressed-size", "8MiB"],
    )
    .unwrap();
    let http = reqwest::blocking::Client::new();
    let pprof = go_cpu();
    let good = push_request("bad", vec![(pprof.clone(), "x")]);
    let proto = "application/proto";
    let bad = "bad";

    // Garbage, and a truncated protobuf.
    assert_connect_error(
        "garbage",
        connect(
            &http,
            &f,
            bad,
            proto,
            &[],
            b"\xff\xff\xff\xff garbage".to_vec(),
        ),
        "invalid_argument",
        "PushRequest",
    );
    let wire = good.encode_to_vec();
    assert_connect_error(
        "truncated",
        connect(&http, &f, bad, proto, &[], wire[..wire.len() / 2].to_vec()),
        "invalid_argument",
        "truncated",
    );
    assert_connect_error(
        "garbage JSON",
        connect(
            &http,
            &f,
            bad,
            "application/json",
            &[],
            b"{\"series\": [".to_vec(),
        ),
        "invalid_argument",
        "JSON",
    );
    // A valid envelope around a profile that is not one.
    assert_connect_error(
        "bad profile",
        connect(
            &http,
            &f,
            bad,
            proto,
            &[],
            push_request("bad", vec![(pprof.clone(), "y"), (vec![1, 2, 3], "z")]).encode_to_vec(),
        ),
        "invalid_argument",
        "series 0 sample 1: invalid pprof",
    );

    // The wrong content type: 415 in Connect's shape.
    let r = connect(&http, &f, bad, "text/plain", &[], wire.clone());
    assert_eq!(r.0, 415);
    assert_connect_error("text/plain", r, "invalid_argument", "application/proto");
    let r = connect(
        &http,
        &f,
        bad,
        "application/connect+proto",
        &[],
        wire.clone(),
    );
    assert_connect_error("streaming", r, "invalid_argument", "application/json");

    // Gzip bombs (64 MiB of zeros in 64 KiB, eight times the limit): the
    // request, and a sample inside a valid request.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        e.write_all(&zeros).unwrap();
    }
    let bomb = e.finish().unwrap();
    assert_connect_error(
        "gzip bomb request",
        connect(
            &http,
            &f,
            bad,
            proto,
            &[("Content-Encoding", "gzip")],
            bomb.clone(),
        ),
        "invalid_argument",
        "larger than the limit of 8388608 bytes",
    );
    assert_connect_error(
        "gzip bomb sample",
        connect(
            &http,
            &f,
            bad,
            proto,
            &[],
            push_request("bad", vec![(bomb, "b")]).encode_to_vec(),
        ),
        "invalid_argument",
        "series 0 sample 0",
    );
    assert_connect_error(
        "not gzip",
        connect(
            &http,
            &f,
            bad,
            proto,
            &[("Content-Encoding", "gzip")],
            wire.clone(),
        ),
        "invalid_argument",
        "gzip",
    );

    // Oversized label sets: too many labels, a long value, a bad name, far
    // too many label pairs on the wire; no service_name.
    let with_labels = |extra: Vec<LabelPair>| {
        let mut r = good.clone();
        r.series[0].labels.extend(extra);
        r.encode_to_vec()
    };
    let many: Vec<LabelPair> = (0..12).map(|i| lp(&format!("l{i}"), "v")).collect();
    assert_connect_error(
        "too many labels",
        connect(&http, &f, bad, proto, &[], with_labels(many)),
        "invalid_argument",
        "series 0: the series has",
    );
    assert_connect_error(
        "long value",
        connect(
            &http,
            &f,
            bad,
            proto,
            &[],
            with_labels(vec![lp("a", &"v".repeat(5000))]),
        ),
        "invalid_argument",
        "series 0: value of label \"a\"",
    );
    assert_connect_error(
        "bad name",
        connect(
            &http,
            &f,
            bad,
            proto,
            &[],
            with_labels(vec![lp("1bad", "v")]),
        ),
        "invalid_argument",
        "\"1bad\"",
    );
    let flood: Vec<LabelPair> = (0..10_000).map(|_| lp("", "")).collect();
    assert_connect_error(
        "label flood",
        connect(&http, &f, bad, proto, &[], with_labels(flood)),
        "invalid_argument",
        "series 0: labels or annotations",
    );
    let mut no_service = good.clone();
    no_service.series[0]
        .labels
        .retain(|l| l.name != "service_name");
    assert_connect_error(
        "no service_name",
        connect(&http, &f, bad, proto, &[], no_service.encode_to_vec()),
        "invalid_argument",
        "service_name",
    );
    // A bad tenant.
    assert_connect_error(
        "bad tenant",
        connect(&http, &f, "../etc", proto, &[], wire.clone()),
        "invalid_argument",
        "X-Scope-OrgID",
    );

    // Still serving, nothing of the above stored; the good request is
    // accepted, so the refusals were about the input.
    assert_eq!(series_count(&f, bad), 0);
    let (s, _, body) = connect(&http, &f, bad, proto, &[], wire);
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    assert!(series_count(&f, bad) > 0);
    assert!(!f.log().contains("panicked"), "{}", f.log());
}

/// On the cluster's roles, the same port as `fathom all`: push.v1 to one
/// distributor, JFR to the other, and Pyroscope's querier API (what
/// Grafana calls) on the querier answering like its own HTTP API.
#[test]
fn push_v1_jfr_and_grafana_on_cluster_roles() {
    use fathom_integration::cluster::{Cluster, ClusterOptions};
    use fathom_proto::pyroscope::querier::v1::{
        SelectMergeStacktracesRequest, SelectMergeStacktracesResponse,
    };
    use fathom_proto::pyroscope::types::v1::{LabelValuesRequest, LabelValuesResponse};

    const TENANT: &str = "roles";
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), &ClusterOptions::default()).unwrap();
    let http = reqwest::blocking::Client::new();
    let post = |url: String, ct: &str, body: Vec<u8>| {
        let r = http
            .post(url)
            .header("Content-Type", ct)
            .header("X-Scope-OrgID", TENANT)
            .body(body)
            .send()
            .unwrap();
        let s = r.status().as_u16();
        (s, r.bytes().unwrap().to_vec())
    };

    let req = push_request("pv1-roles", vec![(go_cpu(), "roles-1")]);
    let (s, b) = post(
        c.distributors[0].url(PATH),
        "application/proto",
        req.encode_to_vec(),
    );
    assert_eq!(s, 200, "push.v1: {}", String::from_utf8_lossy(&b));

    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (_, jfr) = fathom_jfr::corpus::recordings(&fathom_integration::testdata())
        .unwrap()
        .into_iter()
        .next()
        .expect("a JFR recording in the corpus");
    let last = c.distributors[c.distributors.len() - 1].url("/ingest");
    let r = http
        .post(last)
        .query(&[
            ("name", "jfr-roles"),
            ("format", "jfr"),
            ("from", &(now_s - 10).to_string()),
            ("until", &now_s.to_string()),
        ])
        .header("X-Scope-OrgID", TENANT)
        .body(std::fs::read(&jfr).unwrap())
        .send()
        .unwrap();
    let s = r.status().as_u16();
    assert_eq!(s, 200, "JFR: {}", r.text().unwrap());

    // Fathom's HTTP API on the querier: the push.v1 profile's total.
    // (A querier lists the ingesters in the background, about once a
    // second: one that has just started may not read every head yet.)
    let q = format!("{CPU}{{service_name=\"pv1-roles\"}}");
    let t0 = std::time::Instant::now();
    let (total, v) = loop {
        let v: serde_json::Value = http
            .get(c.querier.url("/api/v1/query"))
            .header("X-Scope-OrgID", TENANT)
            .query(&[
                ("query", q.as_str()),
                ("format", "top"),
                ("start", "now-1h"),
            ])
            .send()
            .unwrap()
            .json()
            .unwrap();
        let total = v["total"].as_i64().unwrap_or(0);
        if total > 0 || t0.elapsed() > std::time::Duration::from_secs(30) {
            break (total, v);
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert!(total > 0, "{v}");

    // Pyroscope's API on the same querier port.
    let now_ms = i64::try_from(now_s).unwrap() * 1000;
    let (start, end) = (now_ms - 3_600_000, now_ms + 60_000);
    let req = LabelValuesRequest {
        name: "service_name".into(),
        matchers: vec![],
        start,
        end,
    };
    let (s, b) = post(
        c.querier.url("/querier.v1.QuerierService/LabelValues"),
        "application/proto",
        req.encode_to_vec(),
    );
    assert_eq!(s, 200, "LabelValues: {}", String::from_utf8_lossy(&b));
    let names = LabelValuesResponse::decode(b.as_slice()).unwrap().names;
    assert_eq!(names, ["jfr-roles", "pv1-roles"]);
    let req = SelectMergeStacktracesRequest {
        profile_type_id: CPU.into(),
        label_selector: "{service_name=\"pv1-roles\"}".into(),
        start,
        end,
        ..Default::default()
    };
    let (s, b) = post(
        c.querier
            .url("/querier.v1.QuerierService/SelectMergeStacktraces"),
        "application/proto",
        req.encode_to_vec(),
    );
    assert_eq!(
        s,
        200,
        "SelectMergeStacktraces: {}",
        String::from_utf8_lossy(&b)
    );
    let fg = SelectMergeStacktracesResponse::decode(b.as_slice())
        .unwrap()
        .flamegraph
        .expect("a flame graph");
    assert_eq!(fg.total, total, "the Grafana API and the HTTP API disagree");
}
