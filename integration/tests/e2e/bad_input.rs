//! Bad input: each request gets a 4xx with a JSON message, nothing panics,
//! the server keeps serving, and nothing of a refused request is stored.

use std::io::Write;

use fathom_integration::{Fathom, corpus};

const BAD: Option<&str> = Some("bad");

fn assert_4xx(what: &str, status: u16, body: &str) {
    assert!(
        (400..500).contains(&status),
        "{what}: expected a 4xx, got {status}: {body}"
    );
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {body}"));
    let msg = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no error field: {body}"));
    assert!(msg.len() > 5, "{what}: message too short: {msg}");
}

fn ingest_pprof(f: &Fathom, name: &str, body: Vec<u8>) -> (u16, String) {
    f.ingest(
        BAD,
        &[("name", name), ("format", "pprof"), ("from", "1704067200")],
        body,
    )
    .unwrap()
}

/// A tiny deterministic generator, so failures reproduce.
fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn bad_input_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(
        dir.path(),
        &["--max-labels", "8", "--max-decompressed-size", "8MiB"],
    )
    .unwrap();
    let files = corpus().unwrap();

    // Corpus files that go tool pprof itself rejects.
    let odd: Vec<_> = files.iter().filter(|c| c.expected.is_none()).collect();
    assert_eq!(odd.len(), 3);
    for c in odd {
        let (s, b) = ingest_pprof(&f, "odd", std::fs::read(&c.path).unwrap());
        assert_4xx(&c.file, s, &b);
    }

    // Truncated gzip'd files: the gzip stream ends early.
    for c in files.iter().filter(|c| c.expected.is_some()).take(40) {
        let bytes = std::fs::read(&c.path).unwrap();
        if !bytes.starts_with(&[0x1f, 0x8b]) || bytes.len() < 64 {
            continue;
        }
        let (s, b) = ingest_pprof(&f, "truncated", bytes[..bytes.len() / 2].to_vec());
        assert_4xx(&format!("truncated {}", c.file), s, &b);
    }

    // Random bytes.
    let mut seed = 0x9e3779b97f4a7c15u64;
    for n in [1usize, 7, 100, 4096] {
        let body: Vec<u8> = (0..n).map(|_| xorshift(&mut seed) as u8).collect();
        let (s, b) = ingest_pprof(&f, "random", body);
        assert_4xx(&format!("{n} random bytes"), s, &b);
    }

    // A gzip bomb: 1 GiB of zeros in about 1 MB.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..1024 {
        e.write_all(&zeros).unwrap();
    }
    let bomb = e.finish().unwrap();
    assert!(bomb.len() < 2 << 20);
    let (s, b) = ingest_pprof(&f, "bomb", bomb);
    assert_eq!(s, 413, "{b}");
    assert_4xx("gzip bomb", s, &b);

    // Empty body, missing name, bad format, bad times.
    let good = std::fs::read(
        &files
            .iter()
            .find(|c| c.file.ends_with("go.crc32.cpu"))
            .unwrap()
            .path,
    )
    .unwrap();
    let (s, b) = ingest_pprof(&f, "empty", Vec::new());
    assert_4xx("empty body", s, &b);
    let (s, b) = f.ingest(BAD, &[("format", "pprof")], good.clone()).unwrap();
    assert_4xx("no name", s, &b);
    let (s, b) = f
        .ingest(BAD, &[("name", "x"), ("format", "jfr")], good.clone())
        .unwrap();
    assert_4xx("unknown format", s, &b);
    let (s, b) = f
        .ingest(
            BAD,
            &[("name", "x"), ("format", "pprof"), ("from", "yesterday")],
            good.clone(),
        )
        .unwrap();
    assert_4xx("bad from", s, &b);

    // Oversized label sets: too many labels, a long value, a bad name.
    let many: Vec<String> = (0..20).map(|i| format!("l{i}=v")).collect();
    let (s, b) = ingest_pprof(&f, &format!("x{{{}}}", many.join(",")), good.clone());
    assert_4xx("too many labels", s, &b);
    let (s, b) = ingest_pprof(&f, &format!("x{{a={}}}", "v".repeat(5000)), good.clone());
    assert_4xx("long label value", s, &b);
    let (s, b) = ingest_pprof(&f, "x{1bad=v}", good.clone());
    assert_4xx("bad label name", s, &b);

    // A bad tenant id, on writes and on reads.
    let (s, b) = f
        .ingest(
            Some("../etc"),
            &[("name", "x"), ("format", "pprof")],
            good.clone(),
        )
        .unwrap();
    assert_4xx("bad tenant", s, &b);
    let (s, b) = f.get(Some("a b"), "/api/v1/labels", &[]).unwrap();
    assert_4xx("bad tenant on read", s, &String::from_utf8_lossy(&b));

    // Bad selectors and ranges.
    let q = "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"x\"}";
    for (what, params) in [
        (
            "unclosed selector",
            vec![(
                "query",
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds{a=\"b\"",
            )],
        ),
        (
            "bad regex",
            vec![(
                "query",
                "process_cpu:cpu:nanoseconds:cpu:nanoseconds{a=~\"(\"}",
            )],
        ),
        ("no profile type", vec![("query", "{a=\"b\"}")]),
        ("short profile type", vec![("query", "cpu{a=\"b\"}")]),
        ("missing query", vec![]),
        (
            "start after end",
            vec![("query", q), ("start", "2000"), ("end", "1000")],
        ),
        ("bad time", vec![("query", q), ("start", "last tuesday")]),
        (
            "range too long",
            vec![("query", q), ("start", "0"), ("end", "now")],
        ),
        ("bad format", vec![("query", q), ("format", "svg")]),
        ("bad max_nodes", vec![("query", q), ("max_nodes", "0")]),
    ] {
        let (s, b) = f.get(BAD, "/api/v1/query", &params).unwrap();
        assert_4xx(what, s, &String::from_utf8_lossy(&b));
    }
    let (s, b) = f
        .get(BAD, "/api/v1/query_range", &[("query", q), ("step", "0s")])
        .unwrap();
    assert_4xx("zero step", s, &String::from_utf8_lossy(&b));
    let (s, b) = f
        .get(
            BAD,
            "/api/v1/query_range",
            &[("query", q), ("start", "now-7d"), ("step", "1s")],
        )
        .unwrap();
    assert_4xx("too many points", s, &String::from_utf8_lossy(&b));
    let (s, b) = f.get(BAD, "/api/v1/nope", &[]).unwrap();
    assert_eq!(s, 404, "{}", String::from_utf8_lossy(&b));

    // Still serving, and nothing of the above was stored.
    let (s, _) = f.get(None, "/ready", &[]).unwrap();
    assert_eq!(s, 200);
    // Every refused ingest above used from=2024-01-01T00:00:00Z: look there.
    let window = [
        ("start", "2023-12-31T00:00:00Z"),
        ("end", "2024-01-02T00:00:00Z"),
    ];
    let v = f.get_json(BAD, "/api/v1/series", &window).unwrap();
    assert_eq!(v["series"].as_array().unwrap().len(), 0, "{v}");
    // The same good profile is accepted, so the refusals were about the input.
    let (s, b) = ingest_pprof(&f, "x", good);
    assert_eq!(s, 200, "{b}");
    let v = f.get_json(BAD, "/api/v1/series", &window).unwrap();
    assert!(
        !v["series"].as_array().unwrap().is_empty(),
        "the window sees stored data: {v}"
    );
}

#[test]
fn grpc_push_is_all_or_nothing() {
    use fathom_proto::push::{
        LabelPair, PushRequest, RawProfile, push_service_client::PushServiceClient,
    };
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let files = corpus().unwrap();
    let good = std::fs::read(
        &files
            .iter()
            .find(|c| c.file.ends_with("go.crc32.cpu"))
            .unwrap()
            .path,
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = f.url("");
    let profile = |svc: &str, pprof: Vec<u8>| RawProfile {
        labels: vec![LabelPair {
            name: "service_name".into(),
            value: svc.into(),
        }],
        pprof,
        profile_id: vec![],
    };
    let status = rt.block_on(async {
        let mut c = PushServiceClient::connect(url.clone()).await.unwrap();
        let mut req = tonic::Request::new(PushRequest {
            profiles: vec![
                profile("mixed", good.clone()),
                profile("mixed", b"not a profile".to_vec()),
            ],
        });
        req.metadata_mut()
            .insert("x-scope-orgid", "grpc".parse().unwrap());
        c.push(req).await.unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("profile 1"),
        "{}",
        status.message()
    );
    let v = f
        .get_json(Some("grpc"), "/api/v1/series", &[("start", "now-30d")])
        .unwrap();
    assert_eq!(v["series"].as_array().unwrap().len(), 0, "{v}");

    let ok = rt.block_on(async {
        let mut c = PushServiceClient::connect(url).await.unwrap();
        let mut req = tonic::Request::new(PushRequest {
            profiles: vec![profile("pushed", good)],
        });
        req.metadata_mut()
            .insert("x-scope-orgid", "grpc".parse().unwrap());
        c.push(req).await.unwrap().into_inner()
    });
    assert!(ok.samples > 0);
    let v = f
        .get_json(Some("grpc"), "/api/v1/series", &[("start", "now-30d")])
        .unwrap();
    let series = v["series"].as_array().unwrap();
    assert!(!series.is_empty());
    assert!(series.iter().all(|s| s["service_name"] == "pushed"), "{v}");
}

/// Sends `request` as is on a new connection and returns the status and
/// body of the answer (hyper closes the connection after refusing).
fn raw(f: &Fathom, request: &[u8]) -> (u16, String) {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", f.port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    // The server closes after an error; a reset after the answer is fine.
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

#[test]
fn requests_refused_before_a_handler_get_json_that_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let error = |what: &str, (status, body): (u16, String)| -> String {
        assert_4xx(what, status, &body);
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["error"]
            .as_str()
            .unwrap()
            .to_owned()
    };

    // The README's old example: a raw `"` in the query, refused by the HTTP
    // parser.
    let e = error(
        "raw quote",
        raw(
            &f,
            b"GET /api/v1/query?query=process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"myapp\"}&format=top HTTP/1.1\r\nhost: x\r\n\r\n",
        ),
    );
    assert!(e.contains("`\"`") && e.contains("percent-encode"), "{e}");
    // A space in the URL.
    let e = error(
        "space",
        raw(
            &f,
            b"GET /api/v1/series?query=a b HTTP/1.1\r\nhost: x\r\n\r\n",
        ),
    );
    assert!(e.contains("URL"), "{e}");
    // Oversized headers.
    let mut big = b"GET /ready HTTP/1.1\r\nhost: x\r\n".to_vec();
    for i in 0..200 {
        big.extend_from_slice(format!("x-filler-{i}: {}\r\n", "a".repeat(4000)).as_bytes());
    }
    big.extend_from_slice(b"\r\n");
    let (status, body) = raw(&f, &big);
    assert_eq!(status, 431, "{body}");
    let e = error("headers", (status, body));
    assert!(e.contains("headers"), "{e}");
    // Not HTTP at all.
    let e = error("garbage", raw(&f, b"\x01\x02 hello\r\n\r\n"));
    assert!(e.contains("malformed"), "{e}");

    // Refusals of axum's extractors and router, in the same shape.
    let e = error(
        "bad percent-encoding",
        raw(
            &f,
            b"GET /api/v1/label/%ff%fe/values HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        ),
    );
    assert!(e.contains("UTF-8") && e.contains("name"), "{e}");
    let e = error(
        "method",
        raw(
            &f,
            b"DELETE /api/v1/query HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        ),
    );
    assert!(e.contains("does not take DELETE: use GET"), "{e}");

    // A well-formed request on the same server is still answered.
    let (status, body) = raw(
        &f,
        b"GET /ready HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{body}");
}
