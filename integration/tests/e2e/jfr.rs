//! JFR through `POST /ingest?format=jfr` against a live `fathom all`:
//! Pyroscope's test recordings (raw, gzip'd, multipart with labels) equal
//! the `go tool pprof` view of the pprof files Pyroscope converted them to;
//! a recording made here by the machine's own JDK shows its hot method;
//! bad input is refused whole.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use fathom_integration::{Fathom, folded_differs, read_expectation, sample_type_key, testdata};

const TENANT: Option<&str> = Some("jfr");
const BASE_S: i64 = 1_704_067_200;
const START: &str = "2023-12-31T23:00:00Z";
const END: &str = "2024-01-01T02:00:00Z";

type Folded = BTreeMap<String, BTreeMap<String, i64>>;

fn gunzip(b: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(b)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// A `multipart/form-data` body with the given (name, bytes) parts, as
/// the Pyroscope Java agent sends it; returns (content type, body).
fn multipart(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "fathom-jfr-test-boundary-7d1f";
    let mut body = Vec::new();
    for (name, bytes) in parts {
        write!(
            body,
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .unwrap();
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    write!(body, "--{boundary}--\r\n").unwrap();
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// POST /ingest?format=jfr with extra headers; returns (status, text).
fn post(f: &Fathom, service: &str, headers: &[(&str, &str)], body: Vec<u8>) -> (u16, String) {
    let from = BASE_S.to_string();
    let until = (BASE_S + 10).to_string();
    let mut rb = f.http.post(f.url("/ingest")).query(&[
        ("name", service),
        ("format", "jfr"),
        ("from", from.as_str()),
        ("until", until.as_str()),
        ("sampleRate", "100"),
        ("spyName", "javaspy"),
    ]);
    if let Some(t) = TENANT {
        rb = rb.header("X-Scope-OrgID", t);
    }
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.body(body).send().unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

fn series(f: &Fathom, service: &str) -> Vec<serde_json::Value> {
    f.series(TENANT, service, START, END).unwrap()
}

fn recordings() -> Vec<(String, PathBuf)> {
    fathom_jfr::corpus::recordings(&testdata()).unwrap_or_else(|e| panic!("the JFR corpus: {e}"))
}

/// Pyroscope's conversions of `<name>.jfr.gz`: (profile type as in the
/// file name, label-set hash, expectation) per output file.
fn expectations(name: &str) -> Vec<(String, String, Folded)> {
    fathom_jfr::corpus::conversions(&testdata(), name)
        .unwrap_or_else(|e| panic!("the JFR corpus: {e}"))
        .into_iter()
        .map(|c| {
            let folded = read_expectation(&c.expectation).unwrap();
            (c.profile_type, c.labels_hash, folded)
        })
        .collect()
}

fn ingest_recording(f: &Fathom, service: &str, path: &Path, how: usize) -> String {
    let gz = std::fs::read(path).unwrap();
    let labels = path.with_file_name(format!(
        "{}.labels.pb.gz",
        path.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .strip_suffix(".jfr.gz")
            .unwrap()
    ));
    let (status, text, form) = if labels.exists() {
        // The Java agent's form: `jfr` and `labels` parts (one gzip'd,
        // one not, to cover both).
        let l = std::fs::read(&labels).unwrap();
        let (ct, body) = multipart(&[("jfr", &gz), ("labels", &gunzip(&l))]);
        let (s, t) = post(f, service, &[("Content-Type", &ct)], body);
        (s, t, "multipart with labels")
    } else {
        match how % 3 {
            0 => {
                let (s, t) = post(f, service, &[], gz);
                (s, t, "gzip'd body")
            }
            1 => {
                let (s, t) = post(f, service, &[], gunzip(&gz));
                (s, t, "raw body")
            }
            _ => {
                let (ct, body) = multipart(&[("jfr", &gunzip(&gz))]);
                let (s, t) = post(f, service, &[("Content-Type", &ct)], body);
                (s, t, "multipart without labels")
            }
        }
    };
    assert_eq!(status, 200, "{} ({form}): {text}", path.display());
    form.to_owned()
}

/// The label-set hash of Pyroscope's file without context labels: it
/// holds the whole recording of a type; every other hash holds the samples
/// of one context label set.
const WHOLE: &str = "17241709254077376921";

#[test]
fn pyroscope_recordings_match_their_pprof_conversions() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let recs = recordings();
    assert_eq!(recs.len(), 11, "recordings in shared/testdata/jfr");
    let mut errs = Vec::new();
    for (i, (name, path)) in recs.iter().enumerate() {
        let service = format!("jfr{i}");
        let form = ingest_recording(&f, &service, path, i);
        let theirs = expectations(name);
        let ss = series(&f, &service);
        // Profile types, as the file names of Pyroscope's conversions say.
        let got_types: BTreeSet<String> = ss
            .iter()
            .map(|s| s["__profile_type__"].as_str().unwrap().to_owned())
            .collect();
        let want_types: BTreeSet<String> = theirs.iter().map(|(t, _, _)| t.clone()).collect();
        let got_names: BTreeSet<String> = got_types.iter().map(|t| t.replace(':', "_")).collect();
        if got_names != want_types {
            errs.push(format!(
                "{name} ({form}): types {got_names:?}, expected {want_types:?}"
            ));
        }
        // Per type, merged over label sets: Pyroscope's whole-recording file.
        for t in &got_types {
            let got = f
                .folded(
                    TENANT,
                    &format!("{t}{{service_name=\"{service}\"}}"),
                    START,
                    END,
                )
                .unwrap();
            let tn = t.replace(':', "_");
            let want = theirs
                .iter()
                .find(|(ft, h, _)| *ft == tn && h == WHOLE)
                .and_then(|(_, _, e)| e.get(&sample_type_key(t)).cloned())
                .unwrap_or_default();
            errs.extend(folded_differs(&format!("{name} ({form}) {t}"), &got, &want));
        }
        // With labels, each series carrying context labels equals one of
        // Pyroscope's labelled files.
        if form == "multipart with labels" {
            let names: BTreeSet<&str> = ss
                .iter()
                .flat_map(|s| s.as_object().unwrap().keys().map(String::as_str))
                .filter(|k| *k != "__profile_type__")
                .collect();
            let mut labelled = 0;
            for s in &ss {
                let obj = s.as_object().unwrap();
                let t = obj["__profile_type__"].as_str().unwrap();
                if obj.len() == 2 {
                    continue; // service_name only: the samples without context
                }
                labelled += 1;
                // Exactly this series: its labels, and every other label
                // name of the recording's series absent (empty).
                let sel: Vec<String> = names
                    .iter()
                    .map(|k| {
                        format!(
                            "{k}=\"{}\"",
                            obj.get(*k).and_then(|v| v.as_str()).unwrap_or("")
                        )
                    })
                    .collect();
                let got = f
                    .folded(TENANT, &format!("{t}{{{}}}", sel.join(",")), START, END)
                    .unwrap();
                let tn = t.replace(':', "_");
                let found = theirs.iter().any(|(ft, h, e)| {
                    *ft == tn && h != WHOLE && e.get(&sample_type_key(t)) == Some(&got)
                });
                if !found {
                    errs.push(format!(
                        "{name}: series {sel:?} of {t} matches no labelled conversion"
                    ));
                }
            }
            let files = theirs.iter().filter(|(_, h, _)| h != WHOLE).count();
            if labelled != files {
                errs.push(format!(
                    "{name}: {labelled} labelled series, Pyroscope has {files} files"
                ));
            }
        }
    }
    assert!(
        errs.is_empty(),
        "{} mismatches:\n{}",
        errs.len(),
        errs.join("\n")
    );
}

fn assert_4xx(what: &str, status: u16, body: &str, needle: &str) {
    assert!(
        (400..500).contains(&status),
        "{what}: expected a 4xx, got {status}: {body}"
    );
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {body}"));
    let msg = v["error"].as_str().unwrap_or("");
    assert!(
        msg.contains(needle),
        "{what}: the message should name the problem ({needle:?}): {msg}"
    );
}

#[test]
fn bad_jfr_is_refused_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &["--max-decompressed-size", "8MiB"]).unwrap();
    let (_, path) = recordings().into_iter().next().unwrap();
    let jfr = gunzip(&std::fs::read(&path).unwrap());

    let (s, b) = post(&f, "bad", &[], b"this is not a flight recording".to_vec());
    assert_4xx("garbage", s, &b, "not a JFR recording");
    let (s, b) = post(&f, "bad", &[], jfr[..jfr.len() / 2].to_vec());
    assert_4xx("truncated", s, &b, "invalid JFR");
    let (s, b) = post(&f, "bad", &[], jfr[..100].to_vec());
    assert_4xx("truncated header", s, &b, "invalid JFR");
    let gz = gzip(&jfr);
    let (s, b) = post(&f, "bad", &[], gz[..gz.len() / 2].to_vec());
    assert_4xx("truncated gzip", s, &b, "gzip");

    // A gzip bomb: 64 MiB of zeros behind a JFR magic.
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(b"FLR\0").unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        e.write_all(&zeros).unwrap();
    }
    let bomb = e.finish().unwrap();
    let (s, b) = post(&f, "bad", &[], bomb.clone());
    assert_eq!(s, 413, "{b}");
    assert_4xx("gzip bomb", s, &b, "limit");
    let (ct, body) = multipart(&[("jfr", &bomb)]);
    let (s, b) = post(&f, "bad", &[("Content-Type", &ct)], body);
    assert_4xx("gzip bomb in the jfr part", s, &b, "limit");

    // Multipart without the recording.
    let (ct, body) = multipart(&[("labels", b"")]);
    let (s, b) = post(&f, "bad", &[("Content-Type", &ct)], body);
    assert_4xx("multipart without jfr", s, &b, "no 'jfr' part");
    // A labels part that is not a LabelsSnapshot.
    let (ct, body) = multipart(&[("jfr", &jfr), ("labels", b"\xff\xff\xff\xff")]);
    let (s, b) = post(&f, "bad", &[("Content-Type", &ct)], body);
    assert_4xx("bad labels", s, &b, "labels part");
    // An empty body.
    let (s, b) = post(&f, "bad", &[], Vec::new());
    assert_4xx("empty", s, &b, "empty");

    assert!(
        series(&f, "bad").is_empty(),
        "a refused request stored data"
    );
    // The server still serves.
    let (s, b) = post(&f, "good", &[], jfr);
    assert_eq!(s, 200, "{b}");
    assert!(!series(&f, "good").is_empty());
}

const HOT_JAVA: &str = r#"
public class FathomHot {
    static long burn(long n) {
        long x = 0;
        for (long i = 0; i < n; i++) {
            x += (i * 31) ^ (x >>> 3);
        }
        return x;
    }

    public static void main(String[] args) {
        long end = System.nanoTime() + 3_000_000_000L;
        long sink = 0;
        while (System.nanoTime() < end) {
            sink += burn(1_000_000);
        }
        System.out.println(sink);
    }
}
"#;

#[test]
fn a_recording_of_the_local_jdk_shows_its_hot_method() {
    for tool in ["java", "javac"] {
        let ok = Command::new(tool)
            .arg("-version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(
            ok,
            "`{tool}` is not installed: this test needs a JDK (Debian: apt-get install openjdk-17-jdk-headless; scripts/test-all.sh installs it)"
        );
    }
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("FathomHot.java"), HOT_JAVA).unwrap();
    let out = Command::new("javac")
        .arg("FathomHot.java")
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = work.path().join("hot.jfr");
    let out = Command::new("java")
        .arg(format!(
            "-XX:StartFlightRecording=filename={},settings=profile",
            rec.display()
        ))
        .args(["-cp", "."])
        .arg("FathomHot")
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "java: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jfr = std::fs::read(&rec).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(dir.path(), &[]).unwrap();
    let (s, b) = post(&f, "jdk-app", &[], jfr);
    assert_eq!(s, 200, "{b}");
    let got = f
        .folded(
            TENANT,
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name=\"jdk-app\"}",
            START,
            END,
        )
        .unwrap();
    let total: i64 = got.values().sum();
    let hot: i64 = got
        .iter()
        .filter(|(s, _)| s.ends_with("FathomHot.main;FathomHot.burn"))
        .map(|(_, v)| v)
        .sum();
    assert!(total > 0, "no CPU samples: {got:?}");
    assert!(
        hot * 2 > total,
        "FathomHot.burn should hold most CPU time: {hot} of {total}; {:?}",
        got.iter().take(5).collect::<Vec<_>>()
    );
}
