//! Authentication and per-tenant limits (`--tenants-file`) against the real
//! binary and real clients: every API refuses a missing or wrong
//! credential, a read-only one writing, and a credential for tenant A
//! asking for tenant B; pyroscope-io (Basic), the agent (Bearer) and ADBC
//! Flight SQL (token) get in; a changed file applies without a restart;
//! one tenant over its rate is refused with 429 while another's writes go
//! through.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fathom_integration::{Fathom, fathom_bin, testdata};
use reqwest::blocking::RequestBuilder;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const SMALL: &str = "google+pprof/internal/report/testdata/sample.cpu";

const A_WRITE: &str = "tok-a-write-5f0c2e9a1b7d";
const A_READ: &str = "tok-a-read-93d1c07e44aa";
const NOISY: &str = "tok-noisy-0b8e7f3c21d9";
const QUIET: &str = "tok-quiet-7c2a9e1d05f4";
const SMALL_TOKEN: &str = "tok-small-4e6b8d0a2c1f";
const CAPPED: &str = "tok-capped-8a3f61d2c9e0";
const SDK_PASSWORD: &str = "sdk-secret-b-1f9e";
const OPS_PASSWORD: &str = "ops correct horse";

/// `fathom hash-secret [--pbkdf2]` of `secret`.
fn hash(secret: &str, pbkdf2: bool) -> String {
    let mut cmd = Command::new(fathom_bin());
    cmd.arg("hash-secret");
    if pbkdf2 {
        cmd.args(["--pbkdf2", "--iterations", "20000"]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("running fathom hash-secret");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{secret}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "fathom hash-secret failed");
    let h = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(
        h.starts_with(if pbkdf2 { "pbkdf2-sha256:" } else { "sha256:" }),
        "{h}"
    );
    h
}

/// The tenants file of these tests, plus `extra` credentials.
fn tenants_file(extra: &str) -> String {
    format!(
        r#"
defaults:
  max_query_range: 31d
tenants:
  team-a:
    limits: {{ max_query_range: 2d }}
  noisy:
    limits: {{ ingestion_rate: 8KiB, ingestion_burst: 16KiB }}
  small:
    limits: {{ max_profile_size: 1KiB, max_labels: 2 }}
  capped:
    limits: {{ max_series: 4 }}
credentials:
  - name: agents-a
    token: {}
    scopes: [write]
    tenants: [team-a]
  - name: grafana-a
    token: {}
    scopes: [read]
    tenants: [team-a]
  - name: sdk-b
    user: sdk
    password: {}
    scopes: [read, write]
    tenants: [team-b]
  - name: operator
    user: ops
    password: {}
    scopes: [read]
    tenants: [team-a, team-b]
  - name: noisy
    token: {}
    scopes: [write]
    tenants: [noisy]
  - name: quiet
    token: {}
    scopes: [read, write]
    tenants: [quiet]
  - name: small
    token: {}
    scopes: [write]
    tenants: [small]
  - name: capped
    token: {}
    scopes: [write]
    tenants: [capped]
{extra}"#,
        hash(A_WRITE, false),
        hash(A_READ, false),
        hash(SDK_PASSWORD, false),
        hash(OPS_PASSWORD, true),
        hash(NOISY, false),
        hash(QUIET, false),
        hash(SMALL_TOKEN, false),
        hash(CAPPED, false),
    )
}

/// `fathom all` with the tenants file (checked every 200 ms).
fn start(dir: &Path) -> (Fathom, PathBuf) {
    let file = dir.join("tenants.yaml");
    std::fs::write(&file, tenants_file("")).unwrap();
    let f = Fathom::start(
        &dir.join("data"),
        &[
            "--tenants-file",
            file.to_str().unwrap(),
            "--tenants-reload-interval",
            "200ms",
        ],
    )
    .unwrap();
    (f, file)
}

fn bearer(rb: RequestBuilder, token: &str) -> RequestBuilder {
    rb.header("Authorization", format!("Bearer {token}"))
}

fn small_pprof() -> Vec<u8> {
    std::fs::read(testdata().join("pprof").join(SMALL)).unwrap()
}

/// POST /ingest of the small pprof with `auth` (a request builder hook);
/// returns status, Retry-After and body.
fn ingest(
    f: &Fathom,
    service: &str,
    auth: impl FnOnce(RequestBuilder) -> RequestBuilder,
) -> (u16, Option<String>, String) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (from, until) = ((now - 60).to_string(), (now - 50).to_string());
    let rb = f
        .http
        .post(f.url("/ingest"))
        .query(&[
            ("name", service),
            ("format", "pprof"),
            ("from", from.as_str()),
            ("until", until.as_str()),
        ])
        .body(small_pprof());
    let r = auth(rb).send().unwrap();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (r.status().as_u16(), retry, r.text().unwrap())
}

/// GET /api/v1/series over the last day with `auth`; returns status and
/// body.
fn series(f: &Fathom, auth: impl FnOnce(RequestBuilder) -> RequestBuilder) -> (u16, String) {
    let rb = f
        .http
        .get(f.url("/api/v1/series"))
        .query(&[("start", "now-1d"), ("end", "now")]);
    let r = auth(rb).send().unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

fn series_count(body: &str) -> usize {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["series"].as_array().unwrap().len()
}

/// A unary gRPC call of raw bytes to `path` with `metadata`.
fn grpc_raw(
    url: &str,
    path: &'static str,
    metadata: &[(&'static str, String)],
    body: Vec<u8>,
) -> Result<(), tonic::Status> {
    fathom_integration::grpc_raw(url, path, metadata, body, false)
}

fn auth_header(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

/// A Connect unary call with a JSON body; returns status and body.
fn connect_json(
    f: &Fathom,
    path: &str,
    auth: impl FnOnce(RequestBuilder) -> RequestBuilder,
) -> (u16, serde_json::Value) {
    let rb = f
        .http
        .post(f.url(path))
        .header("Content-Type", "application/json")
        .header("Connect-Protocol-Version", "1")
        .body("{}");
    let r = auth(rb).send().unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

#[test]
fn auth_every_api_refuses_missing_wrong_and_foreign_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = start(dir.path());
    assert!(
        f.log().contains("authentication on"),
        "the server says authentication is on: {}",
        f.log()
    );

    // Open: readiness, health, metrics.
    for p in ["/ready", "/health", "/metrics"] {
        let r = f.http.get(f.url(p)).send().unwrap();
        assert_eq!(r.status().as_u16(), 200, "{p} stays open");
    }

    // /ingest.
    let (s, _, b) = ingest(&f, "svc", |r| r);
    assert_eq!(s, 401, "{b}");
    assert!(b.contains("requires a credential"), "{b}");
    let (s, _, b) = ingest(&f, "svc", |r| bearer(r, "tok-wrong"));
    assert_eq!(s, 401, "{b}");
    assert!(b.contains("unknown bearer token"), "{b}");
    let (s, _, b) = ingest(&f, "svc", |r| bearer(r, A_READ));
    assert_eq!(s, 403, "a read-only credential writing: {b}");
    assert!(b.contains("may not write"), "{b}");
    let (s, _, b) = ingest(&f, "svc", |r| {
        bearer(r, A_WRITE).header("X-Scope-OrgID", "team-b")
    });
    assert_eq!(s, 403, "tenant A's credential asking for tenant B: {b}");
    assert!(b.contains("team-b"), "{b}");
    let (s, _, b) = ingest(&f, "svc", |r| bearer(r, A_WRITE));
    assert_eq!(s, 200, "{b}");
    let (s, _, b) = ingest(&f, "svc-b", |r| r.basic_auth("sdk", Some(SDK_PASSWORD)));
    assert_eq!(s, 200, "Basic with a user of the file: {b}");

    // HTTP query API.
    let (s, b) = series(&f, |r| r);
    assert_eq!(s, 401, "{b}");
    let (s, b) = series(&f, |r| bearer(r, A_WRITE));
    assert_eq!(s, 403, "a write-only credential reading: {b}");
    let (s, b) = series(&f, |r| bearer(r, A_READ));
    assert_eq!(s, 200, "{b}");
    assert!(series_count(&b) >= 1, "team-a's series: {b}");
    assert!(b.contains("\"svc\"") && !b.contains("svc-b"), "{b}");
    let (s, b) = series(&f, |r| bearer(r, A_READ).header("X-Scope-OrgID", "team-b"));
    assert_eq!(s, 403, "{b}");
    let (s, b) = series(&f, |r| r.basic_auth("sdk", Some("wrong")));
    assert_eq!(s, 401, "{b}");
    // The operator reads either tenant, one per request.
    let (s, b) = series(&f, |r| {
        r.basic_auth("ops", Some(OPS_PASSWORD))
            .header("X-Scope-OrgID", "team-b")
    });
    assert_eq!(s, 200, "{b}");
    assert!(b.contains("svc-b") && !b.contains("\"svc\""), "{b}");
    let (s, b) = series(&f, |r| {
        r.basic_auth("ops", Some(OPS_PASSWORD))
            .header("X-Scope-OrgID", "team-c")
    });
    assert_eq!(s, 403, "{b}");
    // Per-tenant query range: team-a may ask for 2 days, team-b for 31.
    let long = |auth: &dyn Fn(RequestBuilder) -> RequestBuilder| {
        let rb = f
            .http
            .get(f.url("/api/v1/series"))
            .query(&[("start", "now-3d"), ("end", "now")]);
        let r = auth(rb).send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let (s, b) = long(&|r| bearer(r, A_READ));
    assert_eq!(s, 400, "team-a's max_query_range is 2d: {b}");
    assert!(b.contains("longer than the limit"), "{b}");
    let (s, b) = long(&|r| r.basic_auth("sdk", Some(SDK_PASSWORD)));
    assert_eq!(s, 200, "{b}");

    // The UI: the browser's Basic prompt.
    let r = f.http.get(f.url("/")).send().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let www = r.headers()["www-authenticate"].to_str().unwrap().to_owned();
    assert!(www.starts_with("Basic "), "{www}");
    let r = f
        .http
        .get(f.url("/"))
        .basic_auth("ops", Some(OPS_PASSWORD))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // push.v1 over Connect.
    let (s, v) = connect_json(&f, "/push.v1.PusherService/Push", |r| r);
    assert_eq!(s, 401, "{v}");
    assert_eq!(v["code"], "unauthenticated", "{v}");
    let (s, v) = connect_json(&f, "/push.v1.PusherService/Push", |r| bearer(r, A_READ));
    assert_eq!(s, 403, "{v}");
    assert_eq!(v["code"], "permission_denied", "{v}");
    let (s, v) = connect_json(&f, "/push.v1.PusherService/Push", |r| bearer(r, A_WRITE));
    assert_eq!(s, 200, "an empty push with a write credential: {v}");

    // The querier's Connect API (Grafana's data source).
    let path = "/querier.v1.QuerierService/ProfileTypes";
    let (s, v) = connect_json(&f, path, |r| r);
    assert_eq!(s, 401, "{v}");
    assert_eq!(v["code"], "unauthenticated", "{v}");
    let (s, v) = connect_json(&f, path, |r| bearer(r, A_READ));
    assert_eq!(s, 200, "{v}");

    // OTLP over HTTP: refused before the body is read; a write credential
    // gets as far as decoding.
    let otlp_http = |auth: &dyn Fn(RequestBuilder) -> RequestBuilder| {
        let rb = f
            .http
            .post(f.url("/v1development/profiles"))
            .header("Content-Type", "application/x-protobuf")
            .body(b"not otlp".to_vec());
        auth(rb).send().unwrap().status().as_u16()
    };
    assert_eq!(otlp_http(&|r| r), 401);
    assert_eq!(otlp_http(&|r| bearer(r, A_READ)), 403);
    assert_eq!(otlp_http(&|r| bearer(r, A_WRITE)), 400);

    // gRPC: fathom push, push.v1, OTLP.
    let url = f.url("");
    for path in [
        "/fathom.push.v1.PushService/Push",
        "/push.v1.PusherService/Push",
        "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
    ] {
        let e = grpc_raw(&url, path, &[], vec![]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{path}: {e:?}");
        assert!(e.message().contains("credential"), "{path}: {e:?}");
        let e = grpc_raw(&url, path, &[auth_header("tok-wrong")], vec![]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{path}: {e:?}");
        let e = grpc_raw(&url, path, &[auth_header(A_READ)], vec![]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{path}: {e:?}");
        let e = grpc_raw(
            &url,
            path,
            &[auth_header(A_WRITE), ("x-scope-orgid", "team-b".into())],
            vec![],
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{path}: {e:?}");
        assert!(e.message().contains("team-b"), "{path}: {e:?}");
    }
    // And a real push through gRPC with the agent's credential.
    let pushed = {
        use fathom_proto::push::{
            LabelPair, PushRequest, RawProfile, push_service_client::PushServiceClient,
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut c = PushServiceClient::connect(url.clone()).await.unwrap();
            let mut req = tonic::Request::new(PushRequest {
                profiles: vec![RawProfile {
                    labels: vec![LabelPair {
                        name: "service_name".into(),
                        value: "grpc-svc".into(),
                    }],
                    pprof: small_pprof(),
                    profile_id: vec![],
                }],
            });
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {A_WRITE}").parse().unwrap(),
            );
            c.push(req).await.unwrap().into_inner()
        })
    };
    assert!(pushed.samples > 0, "the push was stored: {pushed:?}");

    // Flight (read): a raw DoGet without a credential.
    let e = grpc_raw(
        &url,
        "/arrow.flight.protocol.FlightService/DoGet",
        &[],
        vec![],
    )
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = grpc_raw(
        &url,
        "/arrow.flight.protocol.FlightService/DoGet",
        &[auth_header(A_WRITE)],
        vec![],
    )
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

    // Counted, and no secret in the log.
    assert!(
        f.metric("fathom_auth_refused_total{reason=\"unauthenticated\"}")
            .unwrap()
            >= 8.0
    );
    assert!(
        f.metric("fathom_auth_refused_total{reason=\"permission_denied\"}")
            .unwrap()
            >= 8.0
    );
    let log = f.log();
    for secret in [A_WRITE, A_READ, SDK_PASSWORD, OPS_PASSWORD, NOISY] {
        assert!(!log.contains(secret), "a secret in the log");
    }
}

#[test]
fn auth_real_clients_pyroscope_io_basic_and_adbc_token() {
    fathom_integration::require_python(
        "pyroscope, adbc_driver_flightsql.dbapi",
        "pyroscope-io 0.8.16 and adbc-driver-flightsql",
    );
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = start(dir.path());

    // pyroscope-io 0.8.16 (the legacy /ingest) and 1.4 (push.v1), Basic.
    let program = r#"
import sys, time, pyroscope
pyroscope.configure(application_name=sys.argv[2], server_address=sys.argv[1],
                    basic_auth_username="sdk", basic_auth_password=sys.argv[3], sample_rate=100)
def hot_loop():
    x = 0
    for i in range(200000):
        x += i * i
    return x
t0 = time.time()
while time.time() - t0 < 11:
    hot_loop()
pyroscope.shutdown()
"#;
    let script = dir.path().join("app.py");
    std::fs::write(&script, program).unwrap();
    let venv = crate::push_v1::pyroscope_io_venv();
    let run = |python: &Path, app: &str| {
        let out = Command::new(python)
            .arg(&script)
            .arg(f.url(""))
            .arg(app)
            .arg(SDK_PASSWORD)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "python: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let legacy = std::thread::scope(|s| {
        let a = s.spawn(|| run(Path::new("python3"), "py-legacy"));
        run(&venv, "py-new");
        a.join()
    });
    legacy.unwrap();
    let has_hot = |app: &str| {
        let q = format!("{CPU}{{service_name=\"{app}\"}}");
        let t0 = Instant::now();
        loop {
            let r = f
                .http
                .get(f.url("/api/v1/query"))
                .query(&[
                    ("query", q.as_str()),
                    ("format", "top"),
                    ("start", "now-1h"),
                ])
                .basic_auth("sdk", Some(SDK_PASSWORD))
                .send()
                .unwrap();
            let text = r.text().unwrap();
            if text.contains("hot_loop") {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{app}'s hot_loop not in team-b: {text}\n{}",
                f.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    has_hot("py-legacy");
    has_hot("py-new");
    // Nothing of it in team-a.
    let (_, b) = series(&f, |r| bearer(r, A_READ));
    assert!(!b.contains("py-"), "{b}");

    // ADBC Flight SQL: a token as the authorization header; none; a
    // credential of another tenant.
    let (s, _, b) = ingest(&f, "svc", |r| bearer(r, A_WRITE));
    assert_eq!(s, 200, "{b}");
    let grpc = f.url("").replacen("http://", "grpc://", 1);
    let grpc = grpc.trim_end_matches('/');
    let adbc = |kwargs: &str| -> std::process::Output {
        let script = format!(
            "import adbc_driver_flightsql.dbapi as fs, warnings\nwarnings.simplefilter('ignore')\n\
             conn = fs.connect('{grpc}', db_kwargs={{{kwargs}}})\n\
             c = conn.cursor()\nc.execute(\"SELECT count(*) FROM series\")\nprint(c.fetchall()[0][0])\n\
             c.close()\nconn.close()"
        );
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .output()
            .unwrap()
    };
    let out = adbc(&format!(
        "'adbc.flight.sql.authorization_header': 'Bearer {A_READ}'"
    ));
    assert!(
        out.status.success(),
        "ADBC with a token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(n > 0, "team-a's series");
    let out = adbc("");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Unauthenticated") || err.contains("UNAUTHENTICATED"),
        "{err}"
    );
    let out = adbc(&format!(
        "'adbc.flight.sql.authorization_header': 'Bearer {A_READ}', \
         'adbc.flight.sql.rpc.call_header.x-scope-orgid': 'team-b'"
    ));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.to_lowercase().contains("permission"), "{err}");
    // ADBC's own Basic login (a Flight handshake), as the operator.
    let out = adbc("'username': 'ops', 'password': 'ops correct horse'");
    assert!(
        out.status.success(),
        "ADBC with username/password: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(n > 0, "the operator's first tenant is team-a");
}

/// `max_series` (each ingest of the sample CPU profile is two series, one
/// per sample type): a tenant's new series past its limit are refused with
/// 429 and a message naming the limit, its existing series keep being
/// written, the refusal is counted, and a raised limit applies without a
/// restart.
#[test]
fn auth_max_series_refuses_new_series_only() {
    let dir = tempfile::tempdir().unwrap();
    let (f, file) = start(dir.path());
    for svc in ["s1", "s2"] {
        let (s, _, b) = ingest(&f, svc, |r| bearer(r, CAPPED));
        assert_eq!(s, 200, "{svc}: {b}");
    }
    let (s, _, b) = ingest(&f, "s3", |r| bearer(r, CAPPED));
    assert_eq!(s, 429, "{b}");
    assert!(
        b.contains("tenant capped is at its limit of 4 series") && b.contains("max_series"),
        "{b}"
    );
    // Existing series are still written; another tenant is not limited.
    let (s, _, b) = ingest(&f, "s1", |r| bearer(r, CAPPED));
    assert_eq!(s, 200, "{b}");
    for svc in ["q1", "q2", "q3"] {
        let (s, _, b) = ingest(&f, svc, |r| bearer(r, QUIET));
        assert_eq!(s, 200, "{svc}: {b}");
    }
    assert_eq!(
        f.metric("fathom_distributor_tenant_refused_total{tenant=\"capped\",limit=\"max_series\"}")
            .unwrap(),
        1.0
    );
    // A raised limit applies without a restart.
    let before = f
        .metric("fathom_auth_tenants_file_reloads_total{outcome=\"ok\"}")
        .unwrap_or(0.0);
    let raised = tenants_file("").replace("max_series: 4 ", "max_series: 6 ");
    assert!(raised.contains("max_series: 6 "));
    std::fs::write(&file, raised).unwrap();
    let t0 = Instant::now();
    loop {
        let (s, _, b) = ingest(&f, "s3", |r| bearer(r, CAPPED));
        if s == 200 {
            break;
        }
        assert_eq!(s, 429, "{b}");
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the raised limit within 20 s: {b}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        f.metric("fathom_auth_tenants_file_reloads_total{outcome=\"ok\"}")
            .unwrap()
            > before
    );
}

#[test]
fn auth_changed_tenants_file_applies_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (f, file) = start(dir.path());
    let new = "tok-new-2d7e9c4b1a08";
    let (s, _, _) = ingest(&f, "svc", |r| bearer(r, new));
    assert_eq!(s, 401);
    let eventually = |what: &str, mut ok: Box<dyn FnMut() -> bool + '_>| {
        let t0 = Instant::now();
        while !ok() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{what} within 20 s:\n{}",
                f.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // A new credential.
    let extra = format!(
        "  - name: new\n    token: {}\n    scopes: [write]\n    tenants: [team-a]\n",
        hash(new, false)
    );
    std::fs::write(&file, tenants_file(&extra)).unwrap();
    eventually(
        "the new token is accepted",
        Box::new(|| ingest(&f, "svc", |r| bearer(r, new)).0 == 200),
    );
    assert_eq!(
        f.metric("fathom_auth_tenants_file_reloads_total{outcome=\"ok\"}")
            .unwrap(),
        1.0
    );
    // A broken file: the last good one stays, the log and a metric say so.
    std::fs::write(&file, "credentials: [ {name: x").unwrap();
    eventually(
        "the broken file is noticed",
        Box::new(|| f.metric("fathom_auth_tenants_file_ok").unwrap() == 0.0),
    );
    assert!(f.log().contains("tenants file is broken"), "{}", f.log());
    let (s, _, b) = ingest(&f, "svc", |r| bearer(r, new));
    assert_eq!(s, 200, "the last good file is in force: {b}");
    // A credential removed.
    std::fs::write(&file, tenants_file("")).unwrap();
    eventually(
        "the removed token is refused",
        Box::new(|| ingest(&f, "svc", |r| bearer(r, new)).0 == 401),
    );
    assert_eq!(f.metric("fathom_auth_tenants_file_ok").unwrap(), 1.0);
}

#[test]
fn auth_per_tenant_limits_and_one_tenant_over_its_rate_does_not_stop_another() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = start(dir.path());
    let size = small_pprof().len() as f64;
    // Size and label limits of tenant "small" (the flags allow more).
    let (s, _, b) = ingest(&f, "svc", |r| bearer(r, SMALL_TOKEN));
    assert_eq!(s, 413, "max_profile_size 1KiB: {b}");
    assert!(b.contains("max_profile_size"), "{b}");
    let r = f
        .http
        .post(f.url("/ingest"))
        .query(&[("name", "svc{a=1,b=2,c=3}"), ("format", "folded")])
        .body("main;work 10\n")
        .header("Authorization", format!("Bearer {SMALL_TOKEN}"))
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let b = r.text().unwrap();
    assert_eq!(status, 400, "max_labels 2: {b}");
    assert!(b.contains("labels"), "{b}");

    // Noisy pushes from 4 threads as fast as it can for 4 s (8 KiB/s, burst
    // 16 KiB); quiet pushes every 100 ms meanwhile.
    let run_for = Duration::from_secs(4);
    let t0 = Instant::now();
    let (noisy, quiet) = std::thread::scope(|s| {
        let noisy: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let (mut ok, mut limited, mut retry_ok) = (0usize, 0usize, true);
                    while t0.elapsed() < run_for {
                        let (st, retry, b) = ingest(&f, "noisy", |r| bearer(r, NOISY));
                        match st {
                            200 => ok += 1,
                            429 => {
                                limited += 1;
                                retry_ok &= retry
                                    .as_deref()
                                    .and_then(|r| r.parse::<u64>().ok())
                                    .is_some_and(|r| r >= 1);
                                assert!(b.contains("ingestion rate"), "{b}");
                            }
                            other => panic!("noisy got {other}: {b}"),
                        }
                    }
                    (ok, limited, retry_ok)
                })
            })
            .collect();
        let quiet = s.spawn(|| {
            let mut statuses = Vec::new();
            while t0.elapsed() < run_for {
                statuses.push(ingest(&f, "quiet", |r| bearer(r, QUIET)).0);
                std::thread::sleep(Duration::from_millis(100));
            }
            statuses
        });
        let noisy: Vec<_> = noisy.into_iter().map(|h| h.join().unwrap()).collect();
        (noisy, quiet.join().unwrap())
    });
    let elapsed = t0.elapsed().as_secs_f64();
    let ok: usize = noisy.iter().map(|n| n.0).sum();
    let limited: usize = noisy.iter().map(|n| n.1).sum();
    assert!(
        noisy.iter().all(|n| n.2),
        "every 429 has a Retry-After of at least 1 s"
    );
    assert!(limited > 0, "noisy was limited: {noisy:?}");
    // The bucket admits at most its burst plus the rate over the run.
    let admitted = ok as f64 * size;
    let bound = 16.0 * 1024.0 + 8.0 * 1024.0 * elapsed + size;
    assert!(
        admitted <= bound,
        "noisy got {admitted} bytes through in {elapsed:.1} s; the bucket allows {bound}"
    );
    assert!(ok >= 1, "noisy's burst went through");
    assert!(quiet.len() >= 10, "{quiet:?}");
    assert!(
        quiet.iter().all(|s| *s == 200),
        "every write of the quiet tenant was acknowledged: {quiet:?}"
    );
    // Counted per tenant.
    let refused = |t: &str, limit: &str| {
        f.metric(&format!(
            "fathom_distributor_tenant_refused_total{{tenant=\"{t}\",limit=\"{limit}\"}}"
        ))
        .unwrap_or(0.0)
    };
    assert_eq!(refused("noisy", "rate"), limited as f64);
    assert_eq!(refused("quiet", "rate"), 0.0);
    assert_eq!(refused("small", "size"), 1.0);
    assert_eq!(refused("small", "labels"), 1.0);
    // push.v1 over Connect: refused in Connect's shape, with Retry-After,
    // before the body is read.
    let connect_push = || {
        f.http
            .post(f.url("/push.v1.PusherService/Push"))
            .header("Content-Type", "application/json")
            .header("Connect-Protocol-Version", "1")
            .bearer_auth(NOISY)
            .body(format!("{{}}{}", " ".repeat(15_000)))
            .send()
            .unwrap()
    };
    let _ = connect_push();
    let r = connect_push();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["code"], "resource_exhausted", "{v}");
    // The quiet tenant's data is all there.
    let (s, b) = series(&f, |r| bearer(r, QUIET));
    assert_eq!(s, 200);
    assert!(series_count(&b) >= 1 && b.contains("quiet"), "{b}");
}

/// A child process killed on drop.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn auth_agent_pushes_with_a_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = start(dir.path());
    let agent = |token: &str, log: &Path| {
        let out = std::fs::File::create(log).unwrap();
        Killed(
            Command::new(fathom_bin())
                .arg("agent")
                .args(["--remote", &f.url(""), "--push-interval", "2s"])
                .args(["--bearer-token", token])
                .arg("--metrics-listen")
                .arg(format!("127.0.0.1:{}", fathom_integration::free_port()))
                .env("RUST_LOG", "info")
                .stdout(Stdio::from(out.try_clone().unwrap()))
                .stderr(Stdio::from(out))
                .spawn()
                .expect("starting fathom agent"),
        )
    };
    let good_log = dir.path().join("agent-good.log");
    let bad_log = dir.path().join("agent-bad.log");
    let mut good = agent(A_WRITE, &good_log);
    let mut bad = agent("tok-wrong", &bad_log);
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let t0 = Instant::now();
    loop {
        for (a, log) in [(&mut good, &good_log), (&mut bad, &bad_log)] {
            if let Some(status) = a.0.try_wait().unwrap() {
                panic!(
                    "the agent exited with {status} (it needs root and BPF):\n{}",
                    read(log)
                );
            }
        }
        let r = f
            .http
            .get(f.url("/api/v1/profile_types"))
            .query(&[("start", "now-1h"), ("end", "now")])
            .header("Authorization", format!("Bearer {A_READ}"))
            .send()
            .unwrap();
        let text = r.text().unwrap();
        if text.contains("process_cpu") && read(&bad_log).contains("Unauthenticated") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the agent's profiles in team-a ({text}) and the wrong token refused:\n{}\n{}",
            read(&good_log),
            read(&bad_log)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        !read(&good_log).contains("remote refused"),
        "{}",
        read(&good_log)
    );
}

#[test]
fn auth_the_example_file_of_docs_security_md_works() {
    let doc =
        std::fs::read_to_string(fathom_integration::workspace().join("docs/security.md")).unwrap();
    let yaml = doc
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/security.md has a yaml example");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.yaml");
    std::fs::write(&file, yaml).unwrap();
    let f = Fathom::start(
        &dir.path().join("data"),
        &["--tenants-file", file.to_str().unwrap()],
    )
    .unwrap();
    let (s, _, b) = ingest(&f, "checkout", |r| {
        bearer(r, "example-agent-token-change-me")
    });
    assert_eq!(s, 200, "{b}");
    let (s, b) = series(&f, |r| {
        bearer(r, "example-grafana-token-change-me").header("X-Scope-OrgID", "team-a")
    });
    assert_eq!(s, 200, "{b}");
    assert!(b.contains("checkout"), "{b}");
    // The operator's first tenant is team-b: nothing there.
    let (s, b) = series(&f, |r| {
        r.basic_auth("ops", Some("example-password-change-me"))
    });
    assert_eq!(s, 200, "{b}");
    assert!(!b.contains("checkout"), "{b}");
    let (s, _, _) = ingest(&f, "checkout", |r| {
        bearer(r, "example-grafana-token-change-me")
    });
    assert_eq!(s, 403);
}

#[test]
fn auth_the_ui_in_headless_chromium_with_basic() {
    for bin in ["chromium", "chromedriver"] {
        let ok = Command::new("sh")
            .args(["-c", &format!("command -v {bin} || test -x /usr/bin/{bin}")])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "{bin} is required for the UI test (scripts/test-all.sh installs it)"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (f, _) = start(dir.path());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (from, until) = ((now - 60).to_string(), (now - 50).to_string());
    let r = f
        .http
        .post(f.url("/ingest"))
        .query(&[
            ("name", "ui-svc"),
            ("format", "pprof"),
            ("from", from.as_str()),
            ("until", until.as_str()),
        ])
        .basic_auth("sdk", Some(SDK_PASSWORD))
        .body(small_pprof())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let out = Command::new("python3")
        .arg(fathom_integration::workspace().join("integration/python/ui_auth.py"))
        .args([&f.url(""), "sdk", SDK_PASSWORD, "ui-svc"])
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "the browser test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
