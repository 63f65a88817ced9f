//! Tests against the shared corpus of real profiles (`shared/testdata`):
//! every file with an expectation must decode and normalize to exactly
//! what `go tool pprof -raw` says it contains.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use fathom_model::{Function, Id, Labels, Line, Location, Mapping, Symbols};
use fathom_pprof::{
    DecodeError, FoldedError, FoldedOptions, Limits, NormalizeOptions, Normalized, decode,
    decode_and_normalize, encode, folded_lines, go_pprof_display_name, normalize, parse_folded,
};
use fathom_proto::pprof;
use proptest::prelude::*;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/testdata");

fn root() -> PathBuf {
    PathBuf::from(ROOT)
}

struct Row {
    file: String,
    expected: Option<String>,
}

fn manifest() -> Vec<Row> {
    let text =
        std::fs::read_to_string(root().join("pprof/MANIFEST.tsv")).expect("read MANIFEST.tsv");
    let mut lines = text.lines().map(|l| l.trim_end_matches('\r'));
    let header: Vec<&str> = lines.next().expect("header").split('\t').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect("column");
    let (file, expected) = (col("file"), col("expected"));
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            Row {
                file: f[file].to_owned(),
                expected: f
                    .get(expected)
                    .filter(|e| !e.is_empty())
                    .map(|e| (*e).to_owned()),
            }
        })
        .collect()
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(b)
        .read_to_end(&mut out)
        .expect("gunzip");
    out
}

fn opts() -> NormalizeOptions {
    NormalizeOptions {
        labels: Labels::from_pairs([("service_name", "test")]).expect("valid labels"),
        ..Default::default()
    }
}

/// `<sample_type>/<unit>` → sample → summed value, from normalized output.
type Folded = BTreeMap<(String, String), i64>;

/// The symbols with the names `go tool pprof` displays: its default
/// demangling heuristics shorten names that equal their system names.
fn go_display(symbols: &Symbols) -> Symbols {
    let mut s = symbols.clone();
    for f in s.functions.values_mut() {
        if f.name == f.system_name {
            f.name = go_pprof_display_name(&f.name).into_owned();
        }
    }
    s
}

/// How the expectations were generated, for rendering only.
///
/// The expectations are `go tool pprof -raw` output parsed by a script.
/// `-raw` numbers locations like `profile.Merge` (first use in sample
/// order, leaf first, skipping all-zero samples) and prints
/// `  N: 0xADDR M=K name file:line` — without `M=K` for a location that has
/// no mapping. In profiles that have mappings, the script did not recognize
/// such a line as a location: its text (`N: 0xADDR name`, and any further
/// inlined names) became extra names of the previous location, and the
/// location itself, never defined, printed as `0x0`. (Profiles without any
/// mapping are unaffected.) This rewrites the rendering of locations the
/// same way; stacks and values still come from `normalize`.
fn generator_view(p: &pprof::Profile, symbols: &Symbols) -> Symbols {
    let mut out = go_display(symbols);
    if p.mapping.is_empty() {
        return out;
    }
    let s = |i: i64| p.string_table.get(i as usize).cloned().unwrap_or_default();
    let functions: HashMap<u64, &pprof::Function> = p.function.iter().map(|f| (f.id, f)).collect();
    let mappings: HashMap<u64, &pprof::Mapping> = p.mapping.iter().map(|m| (m.id, m)).collect();
    let locations: HashMap<u64, &pprof::Location> = p.location.iter().map(|l| (l.id, l)).collect();
    let function = |id: u64| {
        let f = functions[&id];
        Function {
            name: s(f.name),
            system_name: s(f.system_name),
            filename: s(f.filename),
            start_line: f.start_line,
        }
    };
    // The id normalize gives a pprof location.
    let model_id = |l: &pprof::Location| {
        let mapping = mappings.get(&l.mapping_id).map_or(Id::ZERO, |m| {
            Mapping {
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename: s(m.filename),
                build_id: s(m.build_id),
            }
            .id()
        });
        Location {
            mapping,
            address: l.address,
            lines: l
                .line
                .iter()
                .filter(|ln| ln.function_id != 0)
                .map(|ln| Line {
                    function: function(ln.function_id).id(),
                    line: ln.line,
                })
                .collect(),
        }
        .id()
    };
    // `-raw` order: like profile.Merge.
    let mut order = Vec::new();
    let mut seen_ids = std::collections::HashSet::new();
    let mut seen_keys = std::collections::HashSet::new();
    for sample in p.sample.iter().filter(|x| x.value.iter().any(|&v| v != 0)) {
        for &lid in &sample.location_id {
            let l = locations[&lid];
            let key = (
                l.mapping_id,
                l.address,
                l.line
                    .iter()
                    .map(|x| (x.function_id, x.line))
                    .collect::<Vec<_>>(),
            );
            if seen_ids.insert(lid) && seen_keys.insert(key) {
                order.push(l);
            }
        }
    }
    let mut current: Option<Id> = None;
    for (i, l) in order.into_iter().enumerate() {
        let mid = model_id(l);
        if l.mapping_id != 0 {
            current = Some(mid);
            continue;
        }
        let names: Vec<String> = l
            .line
            .iter()
            .filter(|ln| ln.function_id != 0)
            .map(|ln| {
                let f = function(ln.function_id);
                if f.name == f.system_name {
                    go_pprof_display_name(&f.name).into_owned()
                } else {
                    f.name
                }
            })
            .collect();
        let mut extra = vec![match names.first() {
            Some(first) => format!("{}: {:#x} {first}", i + 1, l.address),
            None => format!("{}: {:#x}", i + 1, l.address),
        }];
        extra.extend(names.into_iter().skip(1));
        if let Some(c) = current {
            let lines: Vec<Line> = extra
                .into_iter()
                .map(|name| Line {
                    function: out.add_function(Function {
                        name,
                        ..Default::default()
                    }),
                    line: 0,
                })
                .collect();
            if let Some(loc) = out.locations.get_mut(&c) {
                loc.lines.extend(lines);
            }
        }
        out.locations.insert(mid, Location::default());
    }
    out
}

fn folded_of(p: &pprof::Profile, n: &Normalized) -> Folded {
    let symbols = generator_view(p, &n.symbols);
    let mut by_key: BTreeMap<String, Vec<(Id, i64)>> = BTreeMap::new();
    for p in &n.profiles {
        let key = format!(
            "{}/{}",
            p.profile_type.sample_type, p.profile_type.sample_unit
        );
        by_key
            .entry(key)
            .or_default()
            .extend(p.samples.iter().map(|s| (s.stack, s.value)));
    }
    let mut out = Folded::new();
    for (key, samples) in by_key {
        for (stack, v) in folded_lines(samples, &symbols) {
            out.insert((key.clone(), stack), v);
        }
    }
    out
}

/// The expectation, with keys mapped by the documented defaults (empty
/// sample type → `unknown`, empty unit → `count`).
fn expected(path: &str) -> Folded {
    let text = String::from_utf8(gunzip(&read(&root().join("pprof").join(path)))).expect("utf-8");
    let mut out = Folded::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        // Frame names may contain tabs: the key is the first field and the
        // value the last.
        let (key, rest) = line.split_once('\t').expect("key");
        let (stack, v) = rest.rsplit_once('\t').expect("value");
        let (t, u) = key.rsplit_once('/').expect("type/unit");
        let t = if t.is_empty() { "unknown" } else { t };
        let u = if u.is_empty() { "count" } else { u };
        let v: i64 = v.parse().expect("value");
        *out.entry((format!("{t}/{u}"), stack.to_owned()))
            .or_insert(0) += v;
    }
    out
}

fn load_pprof(file: &str) -> Result<(pprof::Profile, Normalized), String> {
    let bytes = read(&root().join("pprof").join(file));
    let p = decode(&bytes, &Limits::default()).map_err(|e| format!("decode: {e}"))?;
    let n = normalize(&p, &opts()).map_err(|e| format!("normalize: {e}"))?;
    Ok((p, n))
}

fn load(file: &str) -> Result<Normalized, String> {
    load_pprof(file).map(|x| x.1)
}

fn diff(want: &Folded, got: &Folded) -> String {
    let mut out = String::new();
    let mut n = 0;
    // CORPUS_DEBUG=1 prints every difference.
    let max = if std::env::var_os("CORPUS_DEBUG").is_some() {
        usize::MAX / 2
    } else {
        6
    };
    for (k, v) in want {
        if got.get(k) != Some(v) && n < max {
            out += &format!("  want {}\t{}\t{v}, got {:?}\n", k.0, k.1, got.get(k));
            n += 1;
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) && n < 2 * max {
            out += &format!("  unexpected {}\t{}\t{v}\n", k.0, k.1);
            n += 1;
        }
    }
    out += &format!(
        "  ({} expected lines, {} produced)\n",
        want.len(),
        got.len()
    );
    out
}

#[test]
fn every_expectation_matches_exactly() {
    let rows = manifest();
    assert_eq!(rows.len(), 169, "manifest rows");
    let mut passed = 0;
    let mut failures = Vec::new();
    for row in &rows {
        let Some(exp) = &row.expected else { continue };
        let want = expected(exp);
        match load_pprof(&row.file) {
            Ok((p, n)) => {
                // Each profile's samples come in stack id order, the order
                // a block stores them in (a head cut takes them as given).
                for x in &n.profiles {
                    if !x.samples.is_sorted_by(|a, b| a.stack < b.stack) {
                        failures.push(format!("{}: {} not in stack order", row.file, x.labels));
                    }
                }
                let got = folded_of(&p, &n);
                // CORPUS_DUMP=<dir> writes what we produce, for diffing.
                if let Some(dir) = std::env::var_os("CORPUS_DUMP") {
                    let path = Path::new(&dir).join(row.file.replace('/', "__"));
                    let text: String = got
                        .iter()
                        .map(|((k, s), v)| format!("{k}\t{s}\t{v}\n"))
                        .collect();
                    std::fs::write(path, text).expect("write dump");
                }
                if got == want {
                    passed += 1;
                } else {
                    failures.push(format!("{}:\n{}", row.file, diff(&want, &got)));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", row.file)),
        }
    }
    println!(
        "corpus: {passed} of {} files with expectations match",
        passed + failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(passed, 166);
}

#[test]
fn jfr_conversions_get_pyroscope_profile_types() {
    // Pyroscope names these files after the profile type it produced.
    let mut checked = 0;
    for row in manifest() {
        let Some(name) = row
            .file
            .strip_prefix("grafana+pyroscope/pkg/og/convert/jfr/testdata/")
        else {
            continue;
        };
        let Some(ty) = name
            .split(".jfr.gz.")
            .nth(1)
            .and_then(|r| r.split('.').next())
        else {
            continue;
        };
        let n = load(&row.file).expect("loads");
        let got: Vec<String> = n
            .profiles
            .iter()
            .map(|p| p.profile_type.to_string().replace(':', "_"))
            .collect();
        assert!(got.iter().all(|g| g == ty), "{name}: {got:?}");
        checked += 1;
    }
    assert_eq!(checked, 51);
}

#[test]
fn many_merged_equal_the_sum_of_expectations() {
    let rows: Vec<Row> = manifest()
        .into_iter()
        .filter(|r| {
            r.file
                .starts_with("parca-dev+parca/pkg/query/testdata/many/")
        })
        .collect();
    assert_eq!(rows.len(), 10);
    let mut symbols = Symbols::default();
    let mut by_key: BTreeMap<String, Vec<(Id, i64)>> = BTreeMap::new();
    let mut want = Folded::new();
    for row in &rows {
        let n = load(&row.file).expect("loads");
        symbols.merge(&n.symbols);
        for p in &n.profiles {
            let key = format!(
                "{}/{}",
                p.profile_type.sample_type, p.profile_type.sample_unit
            );
            by_key
                .entry(key)
                .or_default()
                .extend(p.samples.iter().map(|s| (s.stack, s.value)));
        }
        for (k, v) in expected(row.expected.as_deref().expect("has expectation")) {
            *want.entry(k).or_insert(0) += v;
        }
    }
    want.retain(|_, v| *v != 0);
    let mut got = Folded::new();
    let symbols = go_display(&symbols);
    for (key, samples) in by_key {
        for (stack, v) in folded_lines(samples, &symbols) {
            got.insert((key.clone(), stack), v);
        }
    }
    assert!(got == want, "merged mismatch:\n{}", diff(&want, &got));
}

#[test]
fn files_without_expectations_have_documented_results() {
    let rows: Vec<Row> = manifest()
        .into_iter()
        .filter(|r| r.expected.is_none())
        .collect();
    assert_eq!(rows.len(), 3);
    for row in rows {
        let result = load(&row.file);
        println!(
            "{}: {}",
            row.file,
            match &result {
                Ok(n) => format!("ok, {} profiles", n.profiles.len()),
                Err(e) => e.clone(),
            }
        );
        if row.file.ends_with("invalid_utf8.pb.gz") {
            // Refused: names are stored and served as UTF-8.
            let e = result.expect_err("invalid UTF-8 is refused");
            assert!(e.contains("UTF-8"), "{e}");
        } else if let Err(e) = result {
            assert!(!e.is_empty());
        }
    }
}

fn all_files() -> Vec<(String, Vec<u8>)> {
    manifest()
        .into_iter()
        .map(|r| {
            let b = read(&root().join("pprof").join(&r.file));
            (r.file, b)
        })
        .collect()
}

/// Decoding (and normalizing what decodes) must not panic.
fn no_panic(bytes: &[u8]) -> bool {
    std::panic::catch_unwind(|| {
        if let Ok(p) = decode(bytes, &Limits::default()) {
            let _ = normalize(&p, &opts());
        }
        let _ = decode_and_normalize(bytes, &Limits::default(), &opts());
        let _ = parse_folded(bytes, &FoldedOptions::default(), &Limits::default());
    })
    .is_ok()
}

#[test]
fn truncated_files_never_panic() {
    let mut bad = Vec::new();
    for (file, bytes) in all_files() {
        let mut inputs = vec![bytes.clone()];
        if bytes.starts_with(&[0x1f, 0x8b]) {
            inputs.push(gunzip(&bytes));
        }
        for input in inputs {
            let len = input.len();
            let mut cuts: Vec<usize> = vec![0, 1, 2, 3, 8, 16, 17, 64, 100];
            cuts.extend([len / 3, len / 2, len * 2 / 3]);
            cuts.extend((1..6).map(|i| len.saturating_sub(i)));
            // A spread of cut points; fewer for big files (slow in debug).
            let points = if len > 256 << 10 { 4 } else { 32 };
            cuts.extend((0..len).step_by((len / points).max(1)));
            cuts.retain(|&c| c < len);
            cuts.sort_unstable();
            cuts.dedup();
            for cut in cuts {
                if !no_panic(&input[..cut]) {
                    bad.push(format!("{file} cut at {cut}"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "panics: {bad:?}");
}

/// A gzip member holding `n` zero bytes.
fn zeros_member(n: usize) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let chunk = vec![0u8; 1 << 16];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len());
        e.write_all(&chunk[..k]).expect("write");
        left -= k;
    }
    e.finish().expect("finish")
}

#[test]
fn gzip_bomb_of_concatenated_members_fails_at_the_limit() {
    // 1024 members of 1 MiB of zeros: 1 GiB decompressed, ~1 MiB compressed.
    let member = zeros_member(1 << 20);
    let bomb: Vec<u8> = std::iter::repeat_n(member.as_slice(), 1024)
        .flatten()
        .copied()
        .collect();
    assert!(bomb.len() < 4 << 20);
    let e = decode(&bomb, &Limits::default()).expect_err("a bomb");
    assert!(
        matches!(e, DecodeError::TooLarge { limit } if limit == 64 << 20),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "the decompressed profile is larger than the limit of 67108864 bytes"
    );
    let e = parse_folded(&bomb, &FoldedOptions::default(), &Limits::default()).expect_err("a bomb");
    assert!(matches!(e, FoldedError::TooLarge { .. }), "{e}");
}

/// Writes a deflate bit stream, least significant bit first.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn put(&mut self, v: u64, n: u32) {
        self.acc |= v << self.n;
        self.n += n;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    /// A Huffman code, which deflate stores most significant bit first.
    fn code(&mut self, code: u64, len: u32) {
        let rev = (0..len).fold(0, |r, i| r | (((code >> i) & 1) << (len - 1 - i)));
        self.put(rev, len);
    }
}

#[test]
fn gzip_bomb_single_stream_fails_at_the_limit() {
    // One deflate block with fixed Huffman codes: a literal 0, then
    // "copy 258 bytes from distance 1" repeated: 1 GiB from ~6.5 MiB,
    // generated without ever holding the decompressed data.
    let total: u64 = 1 << 30;
    let mut b = Bits {
        out: vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff],
        acc: 0,
        n: 0,
    };
    b.put(1, 1); // BFINAL
    b.put(1, 2); // BTYPE = fixed Huffman
    b.code(0x30, 8); // literal 0
    let matches = (total - 1) / 258;
    for _ in 0..matches {
        b.code(0xc0 + (285 - 280), 8); // length 258
        b.code(0, 5); // distance 1
    }
    b.code(0, 7); // end of block
    b.put(0, 7); // pad
    b.out.truncate(b.out.len());
    // The trailer's CRC is never reached: decoding stops at the limit.
    b.out.extend_from_slice(&0u32.to_le_bytes());
    b.out
        .extend_from_slice(&((1 + matches * 258) as u32).to_le_bytes());
    let e = decode(&b.out, &Limits::default()).expect_err("a bomb");
    assert!(matches!(e, DecodeError::TooLarge { .. }), "{e}");
}

#[test]
fn collapsed_corpus() {
    let dir = root().join("other/collapsed");
    let mut files = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files.sort();
    assert_eq!(files.len(), 35);
    let opts = FoldedOptions {
        units: Some("objects".into()),
        labels: Labels::from_pairs([("service_name", "test")]).expect("valid"),
        ..Default::default()
    };
    for path in files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let bytes = read(&path);
        let result = parse_folded(&bytes, &opts, &Limits::default());
        if name == "simple-with-invalids.txt" {
            // `# comment` is skipped; `// some other comment` is not a stack.
            let e = result.expect_err("invalid line");
            assert!(
                matches!(e, FoldedError::InvalidValue { line: 2, .. }),
                "{e}"
            );
            continue;
        }
        let n = result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(n.profiles.len(), 1, "{name}");
        let p = &n.profiles[0];
        let got: BTreeMap<String, i64> =
            folded_lines(p.samples.iter().map(|s| (s.stack, s.value)), &n.symbols)
                .into_iter()
                .collect();
        // Independent oracle: sum the lines by stack text.
        let text = match bytes.as_slice() {
            [0xff, 0xfe, rest @ ..] => String::from_utf16(
                &rest
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect::<Vec<_>>(),
            )
            .expect("utf-16"),
            [0xfe, 0xff, rest @ ..] => String::from_utf16(
                &rest
                    .chunks_exact(2)
                    .map(|c| u16::from_be_bytes([c[0], c[1]]))
                    .collect::<Vec<_>>(),
            )
            .expect("utf-16"),
            _ => String::from_utf8_lossy(&bytes).into_owned(),
        };
        let mut want: BTreeMap<String, i64> = BTreeMap::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (stack, v) = line.rsplit_once(' ').expect("value");
            *want.entry(stack.trim_end().to_owned()).or_insert(0) += v.parse::<i64>().expect("int");
        }
        want.retain(|_, v| *v != 0);
        assert_eq!(got, want, "{name}");
        if name == "simple.txt" || name.starts_with("simple-") {
            assert_eq!(
                got.into_iter().collect::<Vec<_>>(),
                vec![
                    ("a;b".to_owned(), 5),
                    ("a;b;c".to_owned(), 5),
                    ("a;b;d".to_owned(), 4)
                ],
                "{name}"
            );
        }
    }
}

#[test]
fn encode_round_trips_corpus_profiles() {
    let mut checked = 0;
    for row in manifest() {
        if row.expected.is_none() {
            continue;
        }
        let n = load(&row.file).expect("loads");
        // The big profiles add time (in debug builds), not coverage.
        if n.symbols.locations.len() > 5_000 {
            continue;
        }
        for p in &n.profiles {
            let samples: Vec<(Id, i64)> = p.samples.iter().map(|s| (s.stack, s.value)).collect();
            let bytes = encode(
                &p.profile_type,
                &samples,
                &n.symbols,
                p.time_nanos,
                p.duration_nanos,
                p.period,
            );
            let back = normalize(
                &decode(&bytes, &Limits::default()).expect("decodes"),
                &NormalizeOptions::default(),
            )
            .expect("normalizes");
            assert_eq!(back.profiles.len(), 1, "{}", row.file);
            let b = &back.profiles[0];
            assert_eq!(b.profile_type, p.profile_type);
            assert_eq!(
                (b.time_nanos, b.duration_nanos, b.period),
                (p.time_nanos, p.duration_nanos, p.period)
            );
            assert_eq!(
                folded_lines(b.samples.iter().map(|s| (s.stack, s.value)), &back.symbols),
                folded_lines(samples.iter().copied(), &n.symbols),
                "{}",
                row.file
            );
            // Content-addressed symbols survive the trip unchanged.
            let mut ids: Vec<Id> = b.samples.iter().map(|s| s.stack).collect();
            let mut orig: Vec<Id> = samples.iter().map(|s| s.0).collect();
            ids.sort();
            orig.sort();
            assert_eq!(ids, orig, "{}", row.file);
            checked += 1;
        }
    }
    assert!(checked > 300, "{checked}");
}

#[test]
#[ignore = "throughput measurement; run with --release -- --ignored --nocapture"]
fn throughput() {
    let files: Vec<(String, Vec<u8>)> = all_files()
        .into_iter()
        .map(|(f, b)| {
            let raw = if b.starts_with(&[0x1f, 0x8b]) {
                gunzip(&b)
            } else {
                b
            };
            (f, raw)
        })
        .collect();
    let total: usize = files.iter().map(|f| f.1.len()).sum();
    let rounds = 5;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        for (_, b) in &files {
            if let Ok(p) = decode(b, &Limits::default()) {
                let _ = normalize(&p, &opts());
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "decode+normalize: {:.1} MB/s over {} files, {:.1} MB uncompressed",
        (total * rounds) as f64 / secs / 1e6,
        files.len(),
        total as f64 / 1e6
    );
    let big: Vec<&(String, Vec<u8>)> = files.iter().filter(|f| f.1.len() > 1 << 20).collect();
    for (name, b) in big {
        let (mut dec, mut norm) = (0.0, 0.0);
        for _ in 0..rounds {
            let start = std::time::Instant::now();
            let p = decode(b, &Limits::default()).expect("decodes");
            let mid = std::time::Instant::now();
            let _ = normalize(&p, &opts()).expect("normalizes");
            dec += (mid - start).as_secs_f64();
            norm += mid.elapsed().as_secs_f64();
        }
        let mb = (b.len() * rounds) as f64 / 1e6;
        println!(
            "  {name}: {:.1} MB/s (decode {:.1} MB/s, normalize {:.1} MB/s)",
            mb / (dec + norm),
            mb / dec,
            mb / norm
        );
    }
}

fn small_files() -> Vec<Vec<u8>> {
    all_files()
        .into_iter()
        .map(|(_, b)| {
            if b.starts_with(&[0x1f, 0x8b]) {
                gunzip(&b)
            } else {
                b
            }
        })
        .filter(|b| b.len() < 64 << 10)
        .collect()
}

/// The one-pass [`decode_and_normalize`] against [`decode`] then
/// [`normalize`]: the same profiles, symbols and frame index, or the same
/// error, worded the same.
fn one_pass_agrees(bytes: &[u8], limits: &Limits) -> Result<(), String> {
    let two = decode(bytes, limits)
        .map_err(|e| e.to_string())
        .and_then(|p| normalize(&p, &opts()).map_err(|e| e.to_string()));
    let one = decode_and_normalize(bytes, limits, &opts()).map_err(|e| e.to_string());
    match (one, two) {
        (Ok(a), Ok(b)) if a == b && a.symbols.frame_index == b.symbols.frame_index => Ok(()),
        (Err(a), Err(b)) if a == b => Ok(()),
        (a, b) => Err(format!(
            "one pass: {:?}; two passes: {:?}",
            a.map(|n| n.profiles.len()),
            b.map(|n| n.profiles.len())
        )),
    }
}

#[test]
fn one_pass_agrees_with_decode_then_normalize_on_the_corpus() {
    let mut bad = Vec::new();
    let mut decoded = 0;
    for (file, bytes) in all_files() {
        let mut inputs = vec![bytes.clone()];
        if bytes.starts_with(&[0x1f, 0x8b]) {
            inputs.push(gunzip(&bytes));
        }
        for input in inputs {
            decoded += usize::from(decode(&input, &Limits::default()).is_ok());
            if let Err(e) = one_pass_agrees(&input, &Limits::default()) {
                bad.push(format!("{file}: {e}"));
            }
        }
    }
    assert!(decoded > 100, "only {decoded} corpus inputs decode");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Limits that the samples alone break (their count, the memory their
/// vectors take) refuse the profile with the same error either way.
#[test]
fn one_pass_agrees_at_the_limits() {
    let mut refused = 0;
    for bytes in small_files_cached().iter().take(24) {
        let Ok(p) = decode(bytes, &Limits::default()) else {
            continue;
        };
        let samples = p.sample.len();
        let frames: usize = p.sample.iter().map(|s| s.location_id.len()).sum();
        let mut cases = vec![
            Limits {
                max_samples: samples.saturating_sub(1),
                ..Limits::default()
            },
            Limits {
                max_samples: samples,
                ..Limits::default()
            },
        ];
        // Around the memory the decode commits to, frames included.
        for cut in [frames * 8, frames * 4, frames, 64 << 10, 1 << 10] {
            cases.push(Limits {
                max_decoded_bytes: cut,
                ..Limits::default()
            });
        }
        for limits in cases {
            refused += usize::from(decode(bytes, &limits).is_err());
            if let Err(e) = one_pass_agrees(bytes, &limits) {
                panic!("{e} with {limits:?}");
            }
        }
    }
    assert!(refused > 10, "the limits refused only {refused} decodes");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn mutated_real_files_never_panic(
        pick in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let files = small_files_cached();
        let mut b = files[pick.index(files.len())].clone();
        for (at, v) in edits {
            if !b.is_empty() {
                let i = at.index(b.len());
                b[i] = v;
            }
        }
        let keep = cut.index(b.len() + 1);
        b.truncate(keep.max(b.len() / 2));
        prop_assert!(no_panic(&b));
        // And the distributor's one pass reads it as the two passes do.
        prop_assert_eq!(one_pass_agrees(&b, &Limits::default()), Ok(()));
    }
}

fn small_files_cached() -> &'static [Vec<u8>] {
    static FILES: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    FILES.get_or_init(small_files)
}

#[test]
fn profile_ids_are_deterministic_and_seeded() {
    let bytes = read(&root().join("pprof/google+pprof/internal/report/testdata/sample.cpu"));
    let p = decode(&bytes, &Limits::default()).expect("decodes");
    let a = normalize(&p, &opts()).expect("normalizes");
    let b = normalize(&p, &opts()).expect("normalizes");
    assert_eq!(a, b);
    let seeded = NormalizeOptions {
        profile_id_seed: Id::from_u128(1),
        ..opts()
    };
    let c = normalize(&p, &seeded).expect("normalizes");
    let ids = |n: &Normalized| n.profiles.iter().map(|p| p.id).collect::<Vec<_>>();
    assert_ne!(ids(&a), ids(&c));
    let distinct: HashMap<Id, ()> = ids(&a).into_iter().map(|i| (i, ())).collect();
    assert_eq!(distinct.len(), a.profiles.len());
}
