//! Real recordings from Pyroscope's test data against the `go tool pprof`
//! view of the pprof files Pyroscope converted them to, plus hostile input.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use fathom_pprof::{Limits, Normalized};

use crate::{JfrError, JfrOptions, decode, merge_generated_names};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata")
}

fn gunzip(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(raw.as_slice())
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// `sample_type/unit` → stack → value, from a `.folded.tsv.gz`.
type Folded = BTreeMap<String, BTreeMap<String, i64>>;

fn expectation(path: &Path) -> Folded {
    let text = String::from_utf8(gunzip(path)).unwrap();
    let mut out = Folded::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (t, rest) = line.split_once('\t').unwrap();
        let (stack, v) = rest.rsplit_once('\t').unwrap();
        *out.entry(t.to_owned())
            .or_default()
            .entry(stack.to_owned())
            .or_default() += v.parse::<i64>().unwrap();
    }
    out
}

fn add(into: &mut Folded, from: &Folded) {
    for (t, stacks) in from {
        let m = into.entry(t.clone()).or_default();
        for (s, v) in stacks {
            *m.entry(s.clone()).or_default() += v;
        }
    }
}

/// Fathom's profiles of one recording, per label set, in folded form with
/// `go tool pprof`'s display names.
fn folded_by_labels(n: &Normalized) -> BTreeMap<String, Folded> {
    let mut out: BTreeMap<String, Folded> = BTreeMap::new();
    for p in &n.profiles {
        let pt = p.profile_type.to_string();
        let parts: Vec<&str> = pt.split(':').collect();
        let key = format!("{}/{}", parts[1], parts[2]);
        let labels = format!("{:?}", p.labels);
        let m = out.entry(labels).or_default().entry(key).or_default();
        for s in &p.samples {
            let stack = n
                .symbols
                .frames_by(&s.stack, fathom_pprof::display_name)
                .join(";");
            *m.entry(stack).or_default() += s.value;
        }
    }
    for f in out.values_mut() {
        for m in f.values_mut() {
            m.retain(|_, v| *v != 0);
        }
        f.retain(|_, m| !m.is_empty());
    }
    out
}

fn recordings() -> Vec<(String, PathBuf)> {
    crate::corpus::recordings(&testdata()).unwrap_or_else(|e| panic!("the JFR corpus: {e}"))
}

/// Pyroscope's conversions of `<name>.jfr.gz`: (profile type as in the
/// file name, label-set hash, expectation) per output file.
fn expectations(name: &str) -> Vec<(String, String, Folded)> {
    crate::corpus::conversions(&testdata(), name)
        .unwrap_or_else(|e| panic!("the JFR corpus: {e}"))
        .into_iter()
        .map(|c| {
            let folded = expectation(&c.expectation);
            (c.profile_type, c.labels_hash, folded)
        })
        .collect()
}

fn decode_recording(name: &str, path: &Path) -> Normalized {
    let jfr = gunzip(path);
    let labels_path = path.with_file_name(format!("{name}.labels.pb.gz"));
    let labels = labels_path.exists().then(|| gunzip(&labels_path));
    decode(
        &jfr,
        labels.as_deref(),
        &JfrOptions::default(),
        &Limits::default(),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The hash Pyroscope gives the profile without context labels. Its file
/// holds the whole recording of a type (all samples, labelled or not); the
/// other hashes hold the samples of one context label set each.
const WHOLE: &str = "17241709254077376921";

fn diff(what: &str, got: &BTreeMap<String, i64>, want: &BTreeMap<String, i64>) -> Option<String> {
    if got == want {
        return None;
    }
    let only_g: Vec<_> = got
        .iter()
        .filter(|(s, v)| want.get(*s) != Some(v))
        .take(2)
        .collect();
    let only_w: Vec<_> = want
        .iter()
        .filter(|(s, v)| got.get(*s) != Some(v))
        .take(2)
        .collect();
    Some(format!(
        "{what}: {} vs {} stacks, total {} vs {}; ours-only {only_g:?}; expected-only {only_w:?}",
        got.len(),
        want.len(),
        got.values().sum::<i64>(),
        want.values().sum::<i64>()
    ))
}

#[test]
fn every_recording_matches_pyroscope_conversion() {
    let recs = recordings();
    assert_eq!(recs.len(), 11, "recordings in shared/testdata/jfr");
    let mut errs = Vec::new();
    for (name, path) in &recs {
        let n = decode_recording(name, path);
        // Profile types as Pyroscope names its files.
        let mut types: Vec<String> = n
            .profiles
            .iter()
            .map(|p| p.profile_type.to_string().replace(':', "_"))
            .collect();
        types.sort();
        types.dedup();
        let ours = folded_by_labels(&n);
        let theirs = expectations(name);
        let mut their_types: Vec<String> = theirs.iter().map(|(t, _, _)| t.clone()).collect();
        their_types.sort();
        their_types.dedup();
        if types != their_types {
            errs.push(format!(
                "{name}: types {types:?}, Pyroscope {their_types:?}"
            ));
        }

        // Merged over label sets: Pyroscope's whole-recording file.
        let mut got = Folded::new();
        for f in ours.values() {
            add(&mut got, f);
        }
        let mut whole = Folded::new();
        let mut labelled = Folded::new();
        let mut labelled_files = 0;
        for (_, hash, f) in &theirs {
            if hash == WHOLE {
                add(&mut whole, f);
            } else {
                add(&mut labelled, f);
                labelled_files += f.len();
            }
        }
        for k in whole.keys().chain(got.keys()) {
            let e = BTreeMap::new();
            if let Some(d) = diff(
                &format!("{name} {k} (all label sets)"),
                got.get(k).unwrap_or(&e),
                whole.get(k).unwrap_or(&e),
            ) {
                errs.push(d);
            }
        }

        // Each labelled series is one of Pyroscope's labelled files; the
        // series without context labels is the rest.
        let mut ours_labelled = 0;
        for (labels, f) in &ours {
            if labels == "Labels([])" {
                for (k, stacks) in f {
                    let mut rest = whole.get(k).cloned().unwrap_or_default();
                    for (s, v) in labelled.get(k).into_iter().flatten() {
                        *rest.entry(s.clone()).or_default() -= v;
                    }
                    rest.retain(|_, v| *v != 0);
                    if let Some(d) = diff(&format!("{name} {k} (no context labels)"), stacks, &rest)
                    {
                        errs.push(d);
                    }
                }
                continue;
            }
            for (k, stacks) in f {
                ours_labelled += 1;
                let found = theirs
                    .iter()
                    .any(|(_, h, e)| h != WHOLE && e.get(k) == Some(stacks));
                if !found {
                    errs.push(format!("{name} {labels} {k}: matches no labelled file"));
                }
            }
        }
        if ours_labelled != labelled_files {
            errs.push(format!(
                "{name}: {ours_labelled} labelled (series, type) profiles, Pyroscope has {labelled_files}"
            ));
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn labels_become_series_labels() {
    let (name, path) = recordings()
        .into_iter()
        .find(|(n, _)| n == "dump1")
        .unwrap();
    let n = decode_recording(&name, &path);
    let with_labels = n.profiles.iter().filter(|p| !p.labels.is_empty()).count();
    assert!(with_labels >= 4, "{with_labels} labelled profiles");
    // Request labels win over context labels.
    let jfr = gunzip(&path);
    let labels = gunzip(&path.with_file_name("dump1.labels.pb.gz"));
    let snap = <crate::LabelsSnapshot as prost::Message>::decode(labels.as_slice()).unwrap();
    let key = snap
        .contexts
        .values()
        .flat_map(|c| c.labels.keys())
        .next()
        .and_then(|k| snap.strings.get(k))
        .unwrap()
        .clone();
    let mut opts = JfrOptions::default();
    opts.labels.insert(&key, "fixed");
    let n = decode(&jfr, Some(&labels), &opts, &Limits::default()).unwrap();
    assert!(
        n.profiles
            .iter()
            .all(|p| p.labels.get(&key) == Some("fixed"))
    );
}

#[test]
fn generated_names_are_merged() {
    for (from, to) in [
        ("App$$Lambda$14/0x0000000800c03000", "App$$Lambda_"),
        ("Fib$$Lambda.0x00007ffa600c4da0", "Fib$$Lambda_"),
        ("App$$Lambda$669.0x0000000800fd7318", "App$$Lambda_"),
        (
            "jdk/internal/reflect/GeneratedMethodAccessor31",
            "jdk/internal/reflect/GeneratedMethodAccessor_",
        ),
        (
            "libzstd-jni-1.5.1-16931311898282279136.so",
            "libzstd-jni-_.so",
        ),
        (
            "./tmp/libamazonCorrettoCryptoProvider109b39cf33c563eb.so",
            "libamazonCorrettoCryptoProvider_.so",
        ),
        (
            "Foo$$EnhancerBySpringCGLIB$$12ab",
            "Foo$$EnhancerBySpringCGLIB$$_",
        ),
        ("java/lang/Thread", "java/lang/Thread"),
    ] {
        assert_eq!(merge_generated_names(from), to, "{from}");
    }
}

#[test]
fn limits_are_enforced() {
    let (name, path) = recordings().into_iter().next().unwrap();
    let jfr = gunzip(&path);
    let limits = Limits {
        max_samples: 10,
        ..Limits::default()
    };
    let e = decode(&jfr, None, &JfrOptions::default(), &limits).unwrap_err();
    assert!(
        matches!(
            e,
            JfrError::TooMany {
                what: "samples",
                ..
            }
        ),
        "{name}: {e}"
    );
    let limits = Limits {
        max_functions: 5,
        ..Limits::default()
    };
    let e = decode(&jfr, None, &JfrOptions::default(), &limits).unwrap_err();
    assert!(e.to_string().contains("functions"), "{e}");
}

#[test]
fn garbage_and_truncated_input_are_errors_not_panics() {
    let opts = JfrOptions::default();
    let l = Limits::default();
    let bads: [&[u8]; 5] = [
        b"",
        b"FLR",
        b"hello world",
        b"FLR\0\0\x02\0\0",
        &[0xffu8; 100],
    ];
    for bad in bads {
        assert!(decode(bad, None, &opts, &l).is_err());
    }
    let e = decode(b"PK\x03\x04 not jfr", None, &opts, &l).unwrap_err();
    assert!(e.to_string().contains("not a JFR recording"), "{e}");

    let (_, path) = recordings().into_iter().next().unwrap();
    let jfr = gunzip(&path);
    // Every truncation point near structure boundaries, and a spread of
    // others: an error, never a panic.
    let n = jfr.len();
    let mut cuts: Vec<usize> = (0..200.min(n)).collect();
    cuts.extend((0..n).step_by(n / 300 + 1));
    cuts.extend(n.saturating_sub(200)..n);
    for cut in cuts {
        let r = decode(&jfr[..cut], None, &opts, &l);
        assert!(r.is_err(), "a recording cut at {cut} of {n} bytes decoded");
    }
    let e = decode(&jfr[..n / 2], None, &opts, &l).unwrap_err();
    assert!(
        e.to_string().contains("truncated") || e.to_string().contains("outside the chunk"),
        "{e}"
    );

    // Flipped bytes: anything but a panic (a fixed pseudo-random walk).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..400 {
        let mut m = jfr.clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % m.len();
            m[i] = (x >> 32) as u8;
        }
        let _ = decode(&m, None, &opts, &l);
    }

    // Bad labels part.
    let e = decode(&jfr, Some(b"\xff\xff\xff"), &opts, &l).unwrap_err();
    assert!(matches!(e, JfrError::Labels(_)), "{e}");
}

mod prop {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Arbitrary bytes behind a valid magic and header shape never
        /// panic.
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..2048), size in 0i64..4096, cp in 0i64..4096, meta in 0i64..4096) {
            let mut b = b"FLR\0\0\x02\0\0".to_vec();
            b.extend(size.to_be_bytes());
            b.extend(cp.to_be_bytes());
            b.extend(meta.to_be_bytes());
            b.extend([0u8; 32]);
            b.extend(1i32.to_be_bytes());
            b.extend(body);
            let _ = decode(&b, None, &JfrOptions::default(), &Limits::default());
        }
    }
}

#[test]
fn chunks_of_one_file_add_up() {
    // A recording file may hold several chunks, each with its own
    // constant pools (their keys may repeat): two copies of one chunk
    // give every stack twice its value.
    let (name, path) = recordings()
        .into_iter()
        .find(|(n, _)| n.contains("cpu_lock_alloc__0"))
        .unwrap();
    let one = gunzip(&path);
    let mut two = one.clone();
    two.extend_from_slice(&one);
    let opts = JfrOptions::default();
    let l = Limits::default();
    let a = folded_by_labels(&decode(&one, None, &opts, &l).unwrap());
    let b = folded_by_labels(&decode(&two, None, &opts, &l).unwrap());
    let doubled: BTreeMap<String, Folded> = a
        .iter()
        .map(|(k, f)| {
            let f = f
                .iter()
                .map(|(t, m)| {
                    (
                        t.clone(),
                        m.iter().map(|(s, v)| (s.clone(), v * 2)).collect(),
                    )
                })
                .collect();
            (k.clone(), f)
        })
        .collect();
    assert_eq!(b, doubled, "{name}");
    // A second chunk cut short is an error naming its offset.
    let e = decode(&two[..one.len() + 100], None, &opts, &l).unwrap_err();
    assert!(
        e.to_string().contains(&format!("byte {}", one.len())),
        "{e}"
    );
}
