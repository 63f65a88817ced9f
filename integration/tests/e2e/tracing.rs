//! Fathom's own traces, exported over OTLP/gRPC to a real receiver: a
//! Python `TraceService` (PyPI `opentelemetry-proto` and `grpcio`) that
//! writes each span it receives as a JSON line. An ingest through a
//! distributor is one trace with spans from the distributor and the
//! ingesters it replicated to, linked across the process boundary; a query
//! is one trace with the querier's and the ingesters' spans; a process
//! without an endpoint sends nothing.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fathom_integration::cluster::{Cluster, ClusterOptions};
use fathom_integration::{Fathom, corpus, workspace};

/// The receiver: listens on argv[1] (`0`: any free port), prints the port,
/// appends one JSON object per span to argv[2].
const RECEIVER: &str = r#"
import json, sys, threading
from concurrent import futures
import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

out = open(sys.argv[2], "a")
lock = threading.Lock()

def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None

class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        with lock:
            for rs in request.resource_spans:
                res = {a.key: value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.write(json.dumps({
                            "service": res.get("service.name"),
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(),
                            "name": s.name,
                            "kind": s.kind,
                            "attributes": {a.key: value(a.value) for a in s.attributes},
                        }) + "\n")
            out.flush()
        return trace_service_pb2.ExportTraceServiceResponse()

server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
port = server.add_insecure_port("127.0.0.1:" + sys.argv[1])
if port == 0:
    sys.exit("cannot listen on port " + sys.argv[1])
server.start()
print(port, flush=True)
server.wait_for_termination()
"#;

/// A Python with `grpcio` and `opentelemetry-proto`: the OTLP venv of
/// `scripts/test-all.sh` (the OpenTelemetry SDK brings both).
fn receiver_python() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    let venv = target.join("otlp-venv");
    let py = venv.join("bin/python");
    let check = Command::new(&py)
        .args([
            "-c",
            "import grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc",
        ])
        .output();
    let ok = check.as_ref().is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "the OTLP receiver of this test needs {py} with grpcio and opentelemetry-proto; run \
         scripts/test-all.sh, or: python3 -m venv {venv} && {venv}/bin/pip install grpcio \
         opentelemetry-proto ({})",
        check
            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            .unwrap_or_else(|e| e.to_string()),
        py = py.display(),
        venv = venv.display(),
    );
    py
}

#[derive(Clone, Debug)]
struct Span {
    service: Option<String>,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: HashMap<String, serde_json::Value>,
}

struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Receiver {
    fn start(dir: &Path, port: u16) -> Receiver {
        let out = dir.join("spans.jsonl");
        let script = dir.join("receiver.py");
        std::fs::write(&script, RECEIVER).unwrap();
        let mut child = Command::new(receiver_python())
            .arg(&script)
            .arg(port.to_string())
            .arg(&out)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the OTLP receiver did not start: {line:?}"));
        Receiver { child, port, out }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Span> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let str = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
                Span {
                    service: v["service"].as_str().map(str::to_owned),
                    trace_id: str("trace_id"),
                    span_id: str("span_id"),
                    parent_span_id: str("parent_span_id"),
                    name: str("name"),
                    attributes: v["attributes"]
                        .as_object()
                        .map(|m| m.clone().into_iter().collect())
                        .unwrap_or_default(),
                }
            })
            .collect()
    }

    /// Waits until `done` holds for the spans received so far.
    fn wait_for(&self, what: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let t0 = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{what}: not received within 30s; got {} spans: {:#?}",
                spans.len(),
                spans
                    .iter()
                    .map(|s| (&s.service, &s.name, &s.trace_id))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sample_pprof() -> Vec<u8> {
    let file = corpus()
        .unwrap()
        .into_iter()
        .find(|c| c.file.ends_with("internal/report/testdata/sample.cpu"))
        .expect("sample.cpu in the corpus");
    std::fs::read(&file.path).unwrap()
}

/// A W3C traceparent of the test's own, so that each request's trace is
/// known in advance (and the edge is shown to continue a client's trace).
fn traceparent(trace_id: &str) -> String {
    format!("00-{trace_id}-00f067aa0ba902b7-01")
}

/// A count attribute, sent as an OTLP int (tracing-opentelemetry would send
/// a `usize` field as a string: the spans record counts as i64).
fn count(v: &serde_json::Value) -> i64 {
    v.as_i64()
        .unwrap_or_else(|| panic!("not an int attribute: {v}"))
}

fn services(spans: &[&Span]) -> BTreeSet<String> {
    spans.iter().filter_map(|s| s.service.clone()).collect()
}

#[test]
fn tracing_spans_cross_the_roles_and_reach_an_otlp_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(dir.path(), 0);
    let opts = ClusterOptions {
        all_args: vec!["--otlp-traces-endpoint".into(), rx.endpoint()],
        ..ClusterOptions::default()
    };
    let c = Cluster::start(&dir.path().join("cluster"), &opts).unwrap();
    let http = reqwest::blocking::Client::new();

    // One ingest, through a distributor, in a trace of the test's own.
    let ingest_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let t0 = Instant::now();
    let r = http
        .post(c.distributors[0].url("/ingest"))
        .header("X-Scope-OrgID", "traced")
        .header("traceparent", traceparent(ingest_trace))
        .query(&[
            ("name", "sample"),
            ("format", "pprof"),
            ("from", "1704067200"),
        ])
        .body(sample_pprof())
        .send()
        .unwrap();
    let ingest_time = t0.elapsed();
    assert_eq!(r.status(), 200, "{}", r.text().unwrap());

    let spans = rx.wait_for("the ingest's spans from 3 ingesters", |spans| {
        let ours: Vec<&Span> = spans
            .iter()
            .filter(|s| s.trace_id == ingest_trace)
            .collect();
        ["POST /ingest", "distributor_accept"]
            .iter()
            .all(|w| ours.iter().any(|s| s.name == *w))
            && ours.iter().filter(|s| s.name == "replica_write").count() >= 3
            && ours.iter().filter(|s| s.name == "ingester_write").count() >= 3
            && ours
                .iter()
                .filter(|s| s.name == "/fathom.ingester.v1.IngesterService/WriteRecord")
                .count()
                >= 3
    });
    let ingest: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == ingest_trace)
        .collect();
    let by_id: HashMap<&str, &Span> = ingest.iter().map(|s| (s.span_id.as_str(), *s)).collect();
    // The edge continued the client's trace: the distributor's request span
    // has the client's span as its parent.
    let edge = ingest
        .iter()
        .find(|s| s.service.as_deref() == Some("fathom-distributor") && s.name == "POST /ingest")
        .expect("the distributor's request span");
    assert_eq!(edge.parent_span_id, "00f067aa0ba902b7");
    // Every ingester's request span has a distributor span as its parent:
    // the context crossed the process boundary in the gRPC metadata.
    let ingester_requests: Vec<&&Span> = ingest
        .iter()
        .filter(|s| {
            s.service.as_deref() == Some("fathom-ingester")
                && s.name == "/fathom.ingester.v1.IngesterService/WriteRecord"
        })
        .collect();
    assert!(
        ingester_requests.len() >= 2,
        "ingester write spans: {ingester_requests:#?}"
    );
    let mut replicas = BTreeSet::new();
    for s in &ingester_requests {
        let parent = by_id
            .get(s.parent_span_id.as_str())
            .unwrap_or_else(|| panic!("the parent of {s:?} is not in the trace"));
        assert_eq!(parent.service.as_deref(), Some("fathom-distributor"));
        assert_eq!(parent.name, "replica_write");
        replicas.insert(parent.attributes["ingester"].as_str().unwrap().to_owned());
    }
    assert!(replicas.len() >= 2, "replicas: {replicas:?}");
    let accept = ingest
        .iter()
        .find(|s| s.name == "distributor_accept")
        .expect("distributor_accept");
    assert_eq!(accept.attributes["tenant"], "traced");
    for w in ingest.iter().filter(|s| s.name == "ingester_write") {
        assert_eq!(w.attributes["tenant"], "traced");
        assert!(count(&w.attributes["profiles"]) > 0, "{w:?}");
    }
    eprintln!(
        "ingest (took {ingest_time:?}): {} spans in one trace from {:?}",
        ingest.len(),
        services(&ingest)
    );

    // One query, at the querier: heads from the ingesters over Flight.
    let query_trace = "0af7651916cd43dd8448eb211c80319c";
    query(&c, query_trace);
    let wanted = [
        "GET /api/v1/query",
        "query_plan",
        "head_read",
        "query_execute",
        "/arrow.flight.protocol.FlightService/DoGet",
    ];
    let spans = rx.wait_for("the query's spans", |spans| {
        wanted.iter().all(|w| {
            spans
                .iter()
                .any(|s| s.trace_id == query_trace && s.name == *w)
        })
    });
    let query_spans: Vec<&Span> = spans.iter().filter(|s| s.trace_id == query_trace).collect();
    let by_id: HashMap<&str, &Span> = query_spans
        .iter()
        .map(|s| (s.span_id.as_str(), *s))
        .collect();
    let names: BTreeSet<&str> = query_spans.iter().map(|s| s.name.as_str()).collect();
    assert!(services(&query_spans).contains("fathom-querier"));
    assert!(services(&query_spans).contains("fathom-ingester"));
    for want in wanted {
        assert!(names.contains(want), "no {want} span in {names:?}");
    }
    for s in query_spans
        .iter()
        .filter(|s| s.service.as_deref() == Some("fathom-ingester"))
    {
        if s.name.ends_with("/DoGet") {
            let parent = by_id[s.parent_span_id.as_str()];
            assert_eq!(parent.service.as_deref(), Some("fathom-querier"));
            assert_eq!(parent.name, "head_read");
        }
    }
    eprintln!(
        "query: {} spans in one trace from {:?}: {names:?}",
        query_spans.len(),
        services(&query_spans)
    );

    // Heads flushed to blocks (graceful restart): the query's trace now
    // has the block reads.
    let mut c = c;
    c.restart_ingesters(true).unwrap();
    let block_trace = "5b8efff798038103d269b633813fc60c";
    query(&c, block_trace);
    let spans = rx.wait_for("the query's block reads", |spans| {
        spans
            .iter()
            .any(|s| s.trace_id == block_trace && s.name == "block_index_read")
    });
    let reads: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == block_trace && s.name == "block_index_read")
        .collect();
    assert!(
        reads
            .iter()
            .all(|s| s.service.as_deref() == Some("fathom-querier")),
        "{reads:?}"
    );
    eprintln!("query over blocks: {} block index reads", reads.len());
    drop(c);

    // Without an endpoint nothing is sent, not even to the OTLP default
    // port (when this machine has it free, a second receiver sits there).
    let quiet = tempfile::tempdir().unwrap();
    let default_port = std::net::TcpListener::bind("127.0.0.1:4317")
        .map(drop)
        .is_ok();
    let rx2 = default_port.then(|| Receiver::start(quiet.path(), 4317));
    let before = rx.spans().len();
    let f = Fathom::start(&quiet.path().join("all"), &[]).unwrap();
    let (s, b) = f
        .ingest(
            Some("quiet"),
            &[
                ("name", "sample"),
                ("format", "pprof"),
                ("from", "1704067200"),
            ],
            sample_pprof(),
        )
        .unwrap();
    assert_eq!(s, 200, "{b}");
    let (s, _) = f
        .get(
            Some("quiet"),
            "/api/v1/query",
            &[
                (
                    "query",
                    "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"sample\"}",
                ),
                ("start", "1704060000000"),
                ("end", "1704070000000"),
                ("format", "folded"),
            ],
        )
        .unwrap();
    assert_eq!(s, 200);
    // Longer than the export interval (2s).
    std::thread::sleep(Duration::from_secs(4));
    drop(f);
    assert_eq!(
        rx.spans().len(),
        before,
        "spans arrived without an endpoint"
    );
    if let Some(rx2) = rx2 {
        assert!(
            rx2.spans().is_empty(),
            "fathom without an endpoint sent to the OTLP default port"
        );
    } else {
        eprintln!("127.0.0.1:4317 is busy: checked the test's receiver only");
    }
    assert!(
        !f_log_mentions_export(&quiet.path().join("all")),
        "fathom all logged trace export without an endpoint"
    );
}

/// The test's query, at the querier, in trace `trace_id`; must find data.
fn query(c: &Cluster, trace_id: &str) {
    let r = reqwest::blocking::Client::new()
        .get(c.querier.url("/api/v1/query"))
        .header("X-Scope-OrgID", "traced")
        .header("traceparent", traceparent(trace_id))
        .query(&[
            (
                "query",
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"sample\"}",
            ),
            ("start", "1704060000000"),
            ("end", "1704070000000"),
            ("format", "folded"),
        ])
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(!r.text().unwrap().is_empty(), "the query found nothing");
}

fn f_log_mentions_export(data_dir: &Path) -> bool {
    std::fs::read_to_string(data_dir.join("fathom.log"))
        .unwrap_or_default()
        .contains("exporting traces")
}
