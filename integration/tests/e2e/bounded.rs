//! Bounded by construction, over HTTP against `fathom all`: a full head
//! refuses writes with a retryable 503 (`Retry-After`) and accepts them
//! again once it is cut into a block; extreme query times are refused
//! with 400 instead of overflowing.

use std::time::{Duration, Instant};

use fathom_integration::Fathom;

fn push(f: &Fathom, i: u64) -> reqwest::blocking::Response {
    let from = (1_704_067_200 + i).to_string();
    f.http
        .post(f.url("/ingest"))
        .header("X-Scope-OrgID", "bounded")
        .query(&[
            ("name", "bounded.cpu"),
            ("format", "folded"),
            ("from", from.as_str()),
        ])
        .body(format!("main;work;step{i} 1\n"))
        .send()
        .unwrap()
}

#[test]
fn a_full_head_answers_503_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    // Every write fills the head (cap 1 byte); the flush loop cuts it
    // within a second (cut size 1 byte), which frees it.
    let f = Fathom::start(
        dir.path(),
        &["--max-head-size", "1B", "--max-head-memory", "1B"],
    )
    .unwrap();
    let mut accepted = 0;
    let mut refused = None;
    for i in 0..50 {
        let r = push(&f, i);
        match r.status().as_u16() {
            200 => accepted += 1,
            503 => {
                let retry = r.headers()["retry-after"].to_str().unwrap().to_owned();
                refused = Some((i, retry, r.text().unwrap()));
                break;
            }
            s => panic!("write {i}: {s}: {}", r.text().unwrap()),
        }
    }
    let (i, retry, body) = refused.expect("50 writes in a burst never found the head full");
    assert!(accepted >= 1, "the first write fits");
    assert_eq!(retry, "1");
    assert!(body.contains("heads are full"), "{body}");
    // Once the head is cut, the same write is accepted.
    let t0 = Instant::now();
    loop {
        let r = push(&f, i);
        if r.status().as_u16() == 200 {
            break;
        }
        assert_eq!(r.status().as_u16(), 503, "{}", r.text().unwrap());
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the head was not freed within 20 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let refusals = f
        .metric("fathom_ingester_head_full_refusals_total")
        .unwrap();
    assert!(refusals >= 1.0, "{refusals}");
    println!(
        "head full after {accepted} writes, accepted again after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn extreme_query_times_are_refused_with_400() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let min_ms = (i64::MIN / 1_000_000).to_string();
    let max_ms = (i64::MAX / 1_000_000).to_string();
    let query = "process_cpu:cpu:nanoseconds:cpu:nanoseconds{}";
    let bound = "between 1970-01-01 and 2200-01-01";
    for (what, path, params, want) in [
        (
            "smallest end",
            "/api/v1/query_range",
            vec![("end", min_ms.as_str())],
            bound,
        ),
        (
            "largest range",
            "/api/v1/query_range",
            vec![("start", min_ms.as_str()), ("end", max_ms.as_str())],
            bound,
        ),
        (
            "negative start",
            "/api/v1/query",
            vec![("start", "-1"), ("end", "1000")],
            bound,
        ),
        (
            "overflowing start",
            "/api/v1/query",
            vec![("start", "9223372036854775807")],
            "out of range",
        ),
        (
            "year 2250",
            "/api/v1/series",
            vec![("end", "2250-01-01T00:00:00Z")],
            bound,
        ),
    ] {
        let mut q = params.clone();
        q.push(("query", query));
        let (status, body) = f.get(Some("t"), path, &q).unwrap();
        let body = String::from_utf8_lossy(&body);
        assert_eq!(status, 400, "{what}: {body}");
        assert!(body.contains(want), "{what}: {body}");
    }
    // The server is still there.
    let (status, _) = f.get(None, "/ready", &[]).unwrap();
    assert_eq!(status, 200);
}
