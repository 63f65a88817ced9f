//! OpenTelemetry profiles (OTLP) against `fathom all`: the real eBPF
//! profiler request over OTLP/HTTP (protobuf, gzip'd protobuf and JSON)
//! gives Pyroscope's expected CPU and off-CPU results; the PyPI
//! `opentelemetry-sdk-extension-profiling` exports over OTLP/HTTP and OTLP
//! gRPC (gzip'd); bad input is refused whole with a message.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use fathom_integration::{Fathom, testdata, workspace};

const OTLP_DIR: &str = "other/otlp/grafana+pyroscope/pkg/test/integration/testdata";
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const OFF_CPU: &str = "off_cpu:off_cpu:nanoseconds:unknown:count";
const EXPORT: &str = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

fn otlp_file(name: &str) -> Vec<u8> {
    let p = testdata().join(OTLP_DIR).join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn post(f: &Fathom, tenant: &str, content_type: &str, gzip: bool, body: Vec<u8>) -> (u16, String) {
    post_to(
        &f.url("/v1development/profiles"),
        tenant,
        content_type,
        gzip,
        body,
    )
}

fn post_to(url: &str, tenant: &str, ct: &str, gzip: bool, body: Vec<u8>) -> (u16, String) {
    let mut rb = reqwest::blocking::Client::new()
        .post(url)
        .header("X-Scope-OrgID", tenant)
        .header("Content-Type", ct)
        .body(body);
    if gzip {
        rb = rb.header("Content-Encoding", "gzip");
    }
    let r = rb.send().unwrap();
    (r.status().as_u16(), r.text().unwrap_or_default())
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// Stack (root first, `function@file(build id)` per frame) → value, from a
/// query's pprof output.
fn queried_stacks(f: &Fathom, tenant: &str, query: &str) -> BTreeMap<String, i64> {
    queried_stacks_at(&f.url("/api/v1/query"), tenant, query)
}

/// [`queried_stacks`] from the query URL of any process (a cluster's
/// querier).
fn queried_stacks_at(url: &str, tenant: &str, query: &str) -> BTreeMap<String, i64> {
    // The eBPF request was recorded on 2026-03-30.
    let r = reqwest::blocking::Client::new()
        .get(url)
        .header("X-Scope-OrgID", tenant)
        .query(&[
            ("query", query),
            ("start", "1774900000000"),
            ("end", "1774920000000"),
            ("format", "pprof"),
        ])
        .send()
        .unwrap();
    let s = r.status().as_u16();
    let body = r.bytes().unwrap().to_vec();
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&body));
    let p = fathom_pprof::decode(&body, &fathom_pprof::Limits::default()).unwrap();
    let str_at = |i: i64| p.string_table[i as usize].clone();
    let mut out = BTreeMap::new();
    for s in &p.sample {
        let mut frames = Vec::new();
        for lid in s.location_id.iter().rev() {
            let loc = p.location.iter().find(|l| l.id == *lid).unwrap();
            let map = p
                .mapping
                .iter()
                .find(|m| m.id == loc.mapping_id)
                .map_or(String::new(), |m| {
                    format!("{}({})", str_at(m.filename), str_at(m.build_id))
                });
            if loc.line.is_empty() {
                frames.push(format!("0x{:x}@{map}", loc.address));
            }
            for line in loc.line.iter().rev() {
                let func = p
                    .function
                    .iter()
                    .find(|f| f.id == line.function_id)
                    .unwrap();
                frames.push(format!("{}@{map}", str_at(func.name)));
            }
        }
        *out.entry(frames.join(";")).or_insert(0) += s.value[0];
    }
    out
}

/// The same from Pyroscope's expected output (a compact JSON profile).
fn expected_stacks(name: &str) -> BTreeMap<String, i64> {
    let v: serde_json::Value = serde_json::from_slice(&otlp_file(name)).unwrap();
    let mut out = BTreeMap::new();
    for s in v["samples"].as_array().unwrap() {
        let mut frames = Vec::new();
        for l in s["locations"].as_array().unwrap().iter().rev() {
            let map = l["mapping"].as_str().unwrap().split_once(' ').unwrap().1;
            for line in l["lines"].as_array().unwrap().iter().rev() {
                let name = line.as_str().unwrap().split_once('[').unwrap().0;
                frames.push(format!("{name}@{map}"));
            }
        }
        *out.entry(frames.join(";")).or_insert(0) +=
            s["values"].as_str().unwrap().parse::<i64>().unwrap();
    }
    out
}

#[test]
fn otlp_ebpf_profiler_request_matches_expected_cpu_and_off_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let pb = otlp_file("otel-ebpf-profile.pb.bin");
    let sends = [
        ("otlp-pb", "application/x-protobuf", false, pb.clone()),
        ("otlp-gz", "application/x-protobuf", true, gzip(&pb)),
        (
            "otlp-json",
            "application/json",
            false,
            otlp_file("otel-ebpf-profile.pb.json"),
        ),
    ];
    let cpu = expected_stacks("otel-ebpf-profile-cpu.out.json");
    let off = expected_stacks("otel-ebpf-profile-offcpu.out.json");
    assert!(!cpu.is_empty() && !off.is_empty());
    for (tenant, ct, gz, body) in sends {
        let (s, b) = post(&f, tenant, ct, gz, body);
        assert_eq!(s, 200, "{tenant}: {b}\n{}", f.log());
        let q = |t: &str| format!("{t}{{service_name=\"unknown_service\"}}");
        assert_eq!(queried_stacks(&f, tenant, &q(CPU)), cpu, "{tenant}: CPU");
        assert_eq!(
            queried_stacks(&f, tenant, &q(OFF_CPU)),
            off,
            "{tenant}: off-CPU"
        );
        // Native frames without symbols keep binary and address.
        let portal = queried_stacks(
            &f,
            tenant,
            &format!("{OFF_CPU}{{service_name=\"unknown_service:xdg-desktop-portal\"}}"),
        );
        let unsymbolized = portal
            .keys()
            .flat_map(|k| k.split(';'))
            .filter(|fr| fr.starts_with("0x") && fr.contains("@libglib-2.0.so"))
            .count();
        assert!(unsymbolized > 0, "{tenant}: {portal:?}");
    }
    // The same profiles again as JSON (other bytes, so other profile ids)
    // into a tenant whose head holds their stacks: the write leaves the
    // stacks out and the values add up.
    let (s, b) = post(
        &f,
        "otlp-pb",
        "application/json",
        false,
        otlp_file("otel-ebpf-profile.pb.json"),
    );
    assert_eq!(s, 200, "{b}\n{}", f.log());
    let twice = |m: &BTreeMap<String, i64>| -> BTreeMap<String, i64> {
        m.iter().map(|(k, v)| (k.clone(), 2 * v)).collect()
    };
    let q = format!("{CPU}{{service_name=\"unknown_service\"}}");
    assert_eq!(
        queried_stacks(&f, "otlp-pb", &q),
        twice(&cpu),
        "held stacks"
    );
}

/// The Python of the venv with the OpenTelemetry profiling SDK, created by
/// `scripts/test-all.sh`.
fn otel_python() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let venv = target.join("otlp-venv");
    let py = venv.join("bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import opentelemetry.sdk.extension.profiling"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{} with opentelemetry-sdk-extension-profiling is required: run scripts/test-all.sh, or \
         python3 -m venv {1} && {1}/bin/pip install opentelemetry-sdk-extension-profiling==0.63b4",
        py.display(),
        venv.display()
    );
    py
}

const PROGRAM: &str = r#"
import sys, time
from opentelemetry.sdk.extension.profiling import Profiler

def hot_loop():
    x = 0
    for i in range(100000):
        x += i * i
    return x

def main(seconds):
    t0 = time.time()
    while time.time() - t0 < seconds:
        hot_loop()

profiler = Profiler()
profiler.start()
main(float(sys.argv[1]))
profiler.stop()
"#;

#[test]
fn otlp_python_sdk_exports_over_http_and_grpc() {
    let py = otel_python();
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let script = dir.path().join("app.py");
    std::fs::write(&script, PROGRAM).unwrap();
    let runs = [
        (
            "otlp-py-http",
            "http/protobuf",
            f.url("/v1development/profiles"),
        ),
        ("otlp-py-grpc", "grpc", f.url("")),
    ];
    for (service, protocol, endpoint) in runs {
        let out = Command::new(&py)
            .arg(&script)
            .arg("3")
            .env("OTEL_SERVICE_NAME", service)
            .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=e2e")
            .env("OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL", protocol)
            .env(
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                endpoint.trim_end_matches('/'),
            )
            .env("OTEL_EXPORTER_OTLP_PROFILES_INSECURE", "true")
            .env("OTEL_PROFILING_EXPORT_INTERVAL", "1")
            // gzip over both protocols (the uncompressed path is the eBPF
            // request's).
            .env("OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION", "gzip")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{service}: {stderr}");
        assert!(
            !stderr.contains("Failed to export"),
            "{service}: the exporter reported a failure: {stderr}\n{}",
            f.log()
        );
        let q = format!(
            "wall:samples:count:wall:nanoseconds{{service_name=\"{service}\", deployment_environment=\"e2e\"}}"
        );
        let t0 = Instant::now();
        loop {
            let v = f
                .get_json(None, "/api/v1/query", &[("query", &q), ("format", "top")])
                .unwrap();
            let rows = v["rows"].as_array().unwrap();
            if let Some(hot) = rows.iter().find(|r| r["name"] == "hot_loop") {
                let total = v["total"].as_i64().unwrap();
                assert!(hot["cum"].as_i64().unwrap() > 0 && total > 0, "{v}");
                let folded = f.folded(None, &q, "now-1h", "now").unwrap();
                assert!(
                    folded.keys().any(|s| s.ends_with("main;hot_loop")),
                    "{service}: {folded:?}"
                );
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{service}: hot_loop not found in {v}\nstderr: {stderr}\nserver log:\n{}",
                f.log()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// A gRPC `Export` call with raw bytes as the request message.
fn grpc_export(url: &str, body: Vec<u8>) -> Result<(), tonic::Status> {
    grpc_export_as(url, None, body, false)
}

/// [`grpc_export`] as a tenant.
fn grpc_export_as(
    url: &str,
    tenant: Option<&str>,
    body: Vec<u8>,
    gzip: bool,
) -> Result<(), tonic::Status> {
    let metadata: Vec<(&'static str, String)> = tenant
        .map(|t| ("x-scope-orgid", t.to_owned()))
        .into_iter()
        .collect();
    fathom_integration::grpc_raw(url, EXPORT, &metadata, body, gzip)
}

/// v1.7-layout request bytes: several sample types and a
/// `location_indices` list in the Profile.
fn legacy_request() -> Vec<u8> {
    fn len_field(field: u8, body: &[u8], out: &mut Vec<u8>) {
        out.push(field << 3 | 2);
        out.push(body.len() as u8);
        out.extend_from_slice(body);
    }
    let mut profile = Vec::new();
    len_field(1, &[8, 1, 16, 2], &mut profile);
    len_field(1, &[8, 3, 16, 2], &mut profile);
    len_field(2, &[8, 0, 16, 2, 26, 1, 5], &mut profile);
    len_field(3, &[0, 1], &mut profile);
    let mut scope = Vec::new();
    len_field(2, &profile, &mut scope);
    let mut rp = Vec::new();
    len_field(2, &scope, &mut rp);
    let mut req = Vec::new();
    len_field(1, &rp, &mut req);
    req
}

fn assert_refused(what: &str, (status, body): (u16, String), code: u16, needle: &str) {
    assert_eq!(status, code, "{what}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {body}"));
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains(needle),
        "{what}: {msg:?} does not say {needle:?}"
    );
}

#[test]
fn otlp_bad_input_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &["--max-decompressed-size", "8MiB"]).unwrap();
    let pb = otlp_file("otel-ebpf-profile.pb.bin");
    let ct = "application/x-protobuf";

    let garbage = b"\x0a\xff\xff\xff\x0fnot a protobuf".to_vec();
    assert_refused(
        "garbage",
        post(&f, "bad", ct, false, garbage.clone()),
        400,
        "not a valid OTLP",
    );
    for cut in [1, 100, 5000, pb.len() / 2, pb.len() - 3] {
        let what = format!("truncated at {cut}");
        assert_refused(
            &what,
            post(&f, "bad", ct, false, pb[..cut].to_vec()),
            400,
            "not a valid OTLP",
        );
    }
    assert_refused(
        "JSON garbage",
        post(
            &f,
            "bad",
            "application/json",
            false,
            b"{\"resourceProfiles\": [".to_vec(),
        ),
        400,
        "JSON",
    );
    assert_refused(
        "wrong content type",
        post(&f, "bad", "text/plain", false, pb.clone()),
        415,
        "application/x-protobuf",
    );
    assert_refused(
        "protobuf sent as JSON",
        post(&f, "bad", "application/json", false, pb.clone()),
        400,
        "JSON",
    );
    assert_refused(
        "the v1.7 layout",
        post(&f, "bad", ct, false, legacy_request()),
        400,
        "v1.7.0 or earlier",
    );
    assert_refused(
        "gzip bomb",
        post(&f, "bad", ct, true, gzip(&vec![0u8; 20 << 20])),
        413,
        "limit",
    );
    assert_refused(
        "not gzip",
        post(&f, "bad", ct, true, pb.clone()),
        400,
        "gzip",
    );
    let stored = |f: &Fathom| f.metric("fathom_distributor_profiles_total").unwrap_or(0.0);
    assert_eq!(stored(&f), 0.0, "a refused request stored profiles");
    let attrs: Vec<String> = (0..100)
        .map(|i| format!(r#"{{"key":"k{i}","value":{{"stringValue":"v"}}}}"#))
        .collect();
    let json = format!(
        r#"{{"resourceProfiles":[{{"resource":{{"attributes":[{}]}},"scopeProfiles":[{{"profiles":[{{
            "sampleType":{{"typeStrindex":1,"unitStrindex":2}},
            "samples":[{{"stackIndex":1,"values":["5"]}}]}}]}}]}}],
            "dictionary":{{"stringTable":["","cpu","nanoseconds","f"],
              "functionTable":[{{}},{{"nameStrindex":3}}],
              "locationTable":[{{}},{{"lines":[{{"functionIndex":1}}]}}],
              "stackTable":[{{}},{{"locationIndices":[1]}}]}}}}"#,
        attrs.join(",")
    );
    assert_refused(
        "oversized attribute set",
        post(
            &f,
            "bad",
            "application/json",
            false,
            json.clone().into_bytes(),
        ),
        400,
        "labels",
    );
    // The same request with few attributes is fine (the check above is
    // about the attributes, not the request).
    let small = json.replace(&attrs[3..].join(","), &attrs[3]);
    assert_eq!(stored(&f), 0.0, "a refused request stored profiles");
    let (s, b) = post(&f, "ok", "application/json", false, small.into_bytes());
    assert_eq!(s, 200, "{b}");
    assert_eq!(stored(&f), 1.0);

    let url = f.url("");
    let e = grpc_export(&url, garbage).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("not a valid OTLP"), "{e:?}");
    let e = grpc_export(&url, legacy_request()).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("v1.7.0 or earlier"), "{e:?}");
    let e = grpc_export(&url, pb[..pb.len() / 3].to_vec()).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // A gzip bomb over gRPC: 64 MiB of zeros, over the 16 MiB message limit.
    let e = grpc_export_as(&url, Some("bad"), vec![0u8; 64 << 20], true).unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("size limit"), "{e:?}");
    assert_eq!(stored(&f), 1.0, "a refused gRPC request stored profiles");
    grpc_export(&url, pb.clone()).unwrap();
    assert!(stored(&f) > 1.0);

    // The server still serves, and tenant "bad" has nothing in the time
    // range of the eBPF request nor now.
    let (s, _) = f.get(None, "/ready", &[]).unwrap();
    assert_eq!(s, 200);
    for (start, end) in [("1774900000000", "1774920000000"), ("now-1h", "now")] {
        let v = f
            .get_json(
                Some("bad"),
                "/api/v1/profile_types",
                &[("start", start), ("end", end)],
            )
            .unwrap();
        assert_eq!(v["profile_types"], serde_json::json!([]), "{v}");
    }
}

/// On a cluster (RF=3): OTLP/HTTP and OTLP gRPC to the distributor
/// processes, queried from the querier, give the same expected results.
#[test]
fn otlp_on_a_cluster_distributor() {
    use fathom_integration::cluster::{Cluster, ClusterOptions};
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), &ClusterOptions::default()).unwrap();
    let pb = otlp_file("otel-ebpf-profile.pb.bin");
    let (s, b) = post_to(
        &c.distributors[0].url("/v1development/profiles"),
        "otlp-http",
        "application/x-protobuf",
        false,
        pb.clone(),
    );
    assert_eq!(s, 200, "{b}");
    let d1 = c.distributors[c.distributors.len() - 1].url("");
    grpc_export_as(&d1, Some("otlp-grpc"), pb, true).unwrap();
    let cpu = expected_stacks("otel-ebpf-profile-cpu.out.json");
    let off = expected_stacks("otel-ebpf-profile-offcpu.out.json");
    let q = |t: &str| format!("{t}{{service_name=\"unknown_service\"}}");
    let url = c.querier.url("/api/v1/query");
    for tenant in ["otlp-http", "otlp-grpc"] {
        assert_eq!(queried_stacks_at(&url, tenant, &q(CPU)), cpu, "{tenant}");
        assert_eq!(
            queried_stacks_at(&url, tenant, &q(OFF_CPU)),
            off,
            "{tenant}"
        );
    }
    // The same profiles as JSON through the distributor that wrote them:
    // it knows the replicas hold their stacks and leaves them out, and
    // the values add up.
    let (s, b) = post_to(
        &c.distributors[0].url("/v1development/profiles"),
        "otlp-http",
        "application/json",
        false,
        otlp_file("otel-ebpf-profile.pb.json"),
    );
    assert_eq!(s, 200, "{b}");
    let twice: BTreeMap<String, i64> = cpu.iter().map(|(k, v)| (k.clone(), 2 * v)).collect();
    assert_eq!(
        queried_stacks_at(&url, "otlp-http", &q(CPU)),
        twice,
        "held stacks"
    );
}
