//! speedscope JSON through `POST /ingest?format=speedscope` against a live
//! `fathom all`: sampled and evented files, gzip'd or not; bad files refused.

use fathom_integration::{Fathom, testdata};

const TENANT: Option<&str> = Some("speedscope");
const START: &str = "2023-12-31T23:00:00Z";
const END: &str = "2024-01-01T02:00:00Z";
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(testdata().join("other/speedscope").join(rel)).unwrap()
}

fn ingest(f: &Fathom, service: &str, body: Vec<u8>) -> (u16, String) {
    f.ingest(
        TENANT,
        &[
            ("name", service),
            ("format", "speedscope"),
            ("from", "1704067200"),
            ("until", "1704067210"),
        ],
        body,
    )
    .unwrap()
}

#[test]
fn speedscope_files_ingest_as_pyroscope_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();

    // Evented, unit none: Pyroscope's a;b 500, a;b;c 500, a;b;d 400
    // samples at 10 kHz.
    let (s, b) = ingest(
        &f,
        "evented",
        read("grafana+pyroscope/pkg/og/convert/speedscope/testdata/simple.speedscope.json"),
    );
    assert_eq!(s, 200, "{b}");
    let got = f
        .folded(
            TENANT,
            &format!("{CPU}{{service_name=\"evented\",profile_name=\"simple.txt\"}}"),
            START,
            END,
        )
        .unwrap();
    let want = [
        ("a;b", 50_000_000),
        ("a;b;c", 50_000_000),
        ("a;b;d", 40_000_000),
    ];
    assert_eq!(got, want.iter().map(|(k, v)| (k.to_string(), *v)).collect());

    // Sampled, two profiles, gzip'd body: one series per profile name.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(
        &mut e,
        &read("grafana+pyroscope/pkg/og/convert/speedscope/testdata/two-sampled.speedscope.json"),
    )
    .unwrap();
    let (s, b) = ingest(&f, "sampled", e.finish().unwrap());
    assert_eq!(s, 200, "{b}");
    for name in ["one", "two"] {
        let got = f
            .folded(
                TENANT,
                &format!("{CPU}{{service_name=\"sampled\",profile_name=\"{name}\"}}"),
                START,
                END,
            )
            .unwrap();
        let want = [
            ("a;b", 5_000_000_000),
            ("a;b;c", 5_000_000_000),
            ("a;b;d", 4_000_000_000),
        ];
        assert_eq!(
            got,
            want.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            "{name}"
        );
    }

    // Bad files: a 4xx naming the problem, nothing stored.
    for (rel, needle) in [
        (
            "jlfwong+speedscope/sample/profiles/speedscope/invalid/out-of-order-events.json",
            "innermost open",
        ),
        (
            "jlfwong+speedscope/sample/profiles/speedscope/invalid/incomplete-trace.json",
            "never closed",
        ),
    ] {
        let (s, b) = ingest(&f, "bad", read(rel));
        assert_eq!(s, 400, "{rel}: {b}");
        assert!(b.contains(needle), "{rel}: {b}");
    }
    let (s, b) = ingest(&f, "bad", b"{\"not\": \"speedscope\"".to_vec());
    assert_eq!(s, 400, "{b}");
    assert!(b.contains("speedscope"), "{b}");
    let v = f
        .get_json(
            TENANT,
            "/api/v1/series",
            &[
                ("query", "{service_name=\"bad\"}"),
                ("start", START),
                ("end", END),
            ],
        )
        .unwrap();
    assert!(v["series"].as_array().unwrap().is_empty(), "{v}");
}
