//! Java legacy profiles (heapz, contentionz and the symbol section of Java
//! CPU profiles), transcribed from Go's `legacy_java_profile.go`.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::regex::Regex;
use super::{
    LFunction, LLine, LProfile, LSample, LegacyError, MAX_LINE, go_trim_space, lossy,
    parse_hex_addresses, parse_int, parse_uint, re, scale_heap_sample,
};
use crate::Limits;

super::pattern!(ATTRIBUTE_RE, r"([\w ]+)=([\w ]+)");
super::pattern!(JAVA_SAMPLE_RE, r" *(\d+) +(\d+) +@ +([ x0-9a-f]*)");
super::pattern!(JAVA_LOCATION_RE, r"^\s*0x([[:xdigit:]]+)\s+(.*)\s*$");
super::pattern!(
    JAVA_LOCATION_FILE_LINE_RE,
    r"^(.*)\s+\((.+):(-?[[:digit:]]+)\)$"
);
super::pattern!(JAVA_LOCATION_PATH_RE, r"^(.*)\s+\((.*)\)$");

#[cfg(test)]
pub(super) fn assert_patterns_compile() {
    for p in [
        &ATTRIBUTE_RE,
        &JAVA_SAMPLE_RE,
        &JAVA_LOCATION_RE,
        &JAVA_LOCATION_FILE_LINE_RE,
        &JAVA_LOCATION_PATH_RE,
    ] {
        assert!(!re(p).is_never());
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Heap,
    Contention,
}

/// Splits off the first line, `\n` excluded, when there is one.
fn next_line(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|&c| c == b'\n')?;
    Some((&b[..i], &b[i + 1..]))
}

/// Refuses lines as long as the text parsers do (Go reads these with
/// `bytes.Buffer` and has no limit; a limit keeps matching cheap).
fn check_len(line: &[u8], line_no: usize) -> Result<(), LegacyError> {
    if line.len() >= MAX_LINE {
        return Err(LegacyError::LineTooLong {
            line: line_no,
            limit: MAX_LINE - 1,
        });
    }
    Ok(())
}

/// Go's `parseJavaProfile`: `--- heapz 1 ---` and `--- contentionz 1 ---`.
pub(super) fn parse_java_profile(b: &[u8], limits: &Limits) -> Result<LProfile, LegacyError> {
    let Some((header, rest)) = next_line(b) else {
        return Err(LegacyError::Unrecognized);
    };
    let kind = match go_trim_space(header) {
        b"--- heapz 1 ---" => Kind::Heap,
        b"--- contentionz 1 ---" => Kind::Contention,
        _ => return Err(LegacyError::Unrecognized),
    };
    let mut p = LProfile::new(limits);
    let (rest, mut line_no) = parse_java_header(kind, rest, &mut p)?;
    let (rest, locs) = parse_java_samples(kind, rest, &mut p, &mut line_no)?;
    parse_java_locations(rest, &locs, &mut p)?;
    strip_addresses(&mut p);
    Ok(p)
}

/// Go's `parseJavaHeader`: `attribute = value` lines. Returns the rest of
/// the input and the number of the next line.
fn parse_java_header<'b>(
    kind: Kind,
    mut b: &'b [u8],
    p: &mut LProfile,
) -> Result<(&'b [u8], usize), LegacyError> {
    let format = match kind {
        Kind::Heap => "java heap",
        Kind::Contention => "java contention",
    };
    let mut line_no = 2;
    while let Some((raw, rest)) = next_line(b) {
        check_len(raw, line_no)?;
        let line = go_trim_space(raw);
        if !line.is_empty() {
            let Some(c) = re(&ATTRIBUTE_RE).captures(line) else {
                return Ok((b, line_no));
            };
            let attribute = go_trim_space(c.str(1));
            let value = go_trim_space(c.str(2));
            let bad = || LegacyError::BadAttribute {
                format,
                attribute: lossy(attribute),
                value: lossy(value),
            };
            match (kind, attribute) {
                (_, b"format") => {
                    if value != b"java" {
                        return Err(LegacyError::Unrecognized);
                    }
                }
                (Kind::Heap, b"resolution") => {
                    let unit = lossy(value);
                    p.set_types(
                        &[("inuse_objects", "count"), ("inuse_space", &unit)],
                        ("", ""),
                    );
                }
                (Kind::Contention, b"resolution") => {
                    let unit = lossy(value);
                    let pt = (p.period_type.0.clone(), p.period_type.1.clone());
                    p.set_types(
                        &[("contentions", "count"), ("delay", &unit)],
                        (&pt.0, &pt.1),
                    );
                }
                (Kind::Contention, b"sampling period") => {
                    p.period_type = ("contentions".to_owned(), "count".to_owned());
                    p.period = parse_int(value, 0).ok_or_else(bad)?;
                }
                (Kind::Contention, b"ms since reset") => {
                    let ms = parse_int(value, 0).ok_or_else(bad)?;
                    p.duration_nanos = ms.wrapping_mul(1_000_000);
                }
                _ => return Err(LegacyError::Unrecognized),
            }
        }
        b = rest;
        line_no += 1;
    }
    Ok((b, line_no))
}

/// Go's `parseJavaSamples`.
fn parse_java_samples<'b>(
    kind: Kind,
    mut b: &'b [u8],
    p: &mut LProfile,
    line_no: &mut usize,
) -> Result<(&'b [u8], HashMap<u64, usize>), LegacyError> {
    let mut locs = HashMap::new();
    while let Some((raw, rest)) = next_line(b) {
        check_len(raw, *line_no)?;
        let line = go_trim_space(raw);
        if !line.is_empty() {
            let Some(c) = re(&JAVA_SAMPLE_RE).captures(line) else {
                return Ok((b, locs));
            };
            let format = match kind {
                Kind::Heap => "java heap",
                Kind::Contention => "java contention",
            };
            // Java profiles put the values the other way around.
            let addrs = parse_hex_addresses(c.str(3), format, *line_no)?;
            let mut sloc = Vec::with_capacity(addrs.len());
            for a in addrs {
                sloc.push(p.location_for(&mut locs, a)?);
            }
            let num = |v: &[u8]| {
                parse_int(v, 0).ok_or_else(|| LegacyError::MalformedLine {
                    format,
                    line: *line_no,
                    detail: format!("{} is not a 64-bit integer", lossy(v)),
                })
            };
            let mut v0 = num(c.str(2))?;
            let mut v1 = num(c.str(1))?;
            let mut num_labels = Vec::new();
            match kind {
                Kind::Heap => {
                    const JAVA_HEAPZ_SAMPLING_RATE: i64 = 524288;
                    if v0 == 0 {
                        return Err(LegacyError::JavaZeroCount { line: *line_no });
                    }
                    num_labels.push(("bytes".to_owned(), v1.wrapping_div(v0)));
                    (v0, v1) = scale_heap_sample(v0, v1, JAVA_HEAPZ_SAMPLING_RATE);
                }
                Kind::Contention => {
                    if p.period != 0 {
                        v0 = v0.wrapping_mul(p.period);
                        v1 = v1.wrapping_mul(p.period);
                    }
                }
            }
            p.push_sample(LSample {
                locations: sloc,
                values: vec![v0, v1],
                num_labels,
                ..Default::default()
            })?;
        }
        b = rest;
        *line_no += 1;
    }
    Ok((b, locs))
}

/// Go's `parseJavaLocations`: `0xaddr function (file:line)` lines name the
/// locations the samples use; then locations, functions and mappings are
/// renumbered.
pub(super) fn parse_java_locations(
    b: &[u8],
    locs: &HashMap<u64, usize>,
    p: &mut LProfile,
) -> Result<(), LegacyError> {
    let mut fns: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut rest = b;
    let mut line_no = 0usize;
    while !rest.is_empty() {
        let (raw, next) = next_line(rest).unwrap_or((rest, &[]));
        rest = next;
        line_no += 1;
        check_len(raw, line_no)?;
        let line = go_trim_space(raw);
        if line.is_empty() {
            continue;
        }
        let Some(c) = re(&JAVA_LOCATION_RE).captures(line) else {
            continue;
        };
        let addr = parse_uint(c.str(1), 16).ok_or_else(|| LegacyError::AddressOverflow {
            format: "java",
            line: line_no,
            text: lossy(c.str(1)),
        })?;
        let Some(&loc) = locs.get(&addr) else {
            // Unused.
            continue;
        };
        let what = c.str(2);
        let (func, file, line_num): (&[u8], Vec<u8>, i64) =
            if let Some(fl) = re(&JAVA_LOCATION_FILE_LINE_RE).captures(what) {
                let n = parse_int(fl.str(3), 10).filter(|&n| n > 0).unwrap_or(0);
                (fl.str(1), fl.str(2).to_vec(), n)
            } else if let Some(fp) = re(&JAVA_LOCATION_PATH_RE).captures(what) {
                // A shared library: keep just its base name.
                (fp.str(1), go_path_base(fp.str(2)), 0)
            } else if super::contains(what, b"generated stub/JIT") {
                (b"STUB", Vec::new(), 0)
            } else {
                // Internal states such as "GC" or "VM".
                (what, Vec::new(), 0)
            };
        let f = match fns.get(func) {
            Some(&f) => f,
            None => {
                let name = lossy(func);
                p.fn_arena.push(LFunction {
                    id: 0,
                    system_name: name.clone(),
                    name,
                    filename: lossy(&file),
                });
                let f = p.fn_arena.len() - 1;
                p.functions.push(f);
                fns.insert(func.to_vec(), f);
                f
            }
        };
        let l = &mut p.loc_arena[loc];
        l.lines = vec![LLine {
            function: f,
            line: line_num,
        }];
        l.address = 0;
    }
    p.remap_location_ids();
    p.remap_function_ids();
    p.remap_mapping_ids();
    Ok(())
}

/// `Aggregate(true, true, true, true, false, false)`: drops addresses so
/// equal functions merge.
pub(super) fn strip_addresses(p: &mut LProfile) {
    for &l in &p.locations {
        p.loc_arena[l].address = 0;
    }
}

/// Go's `filepath.Base` for '/'-separated paths.
fn go_path_base(path: &[u8]) -> Vec<u8> {
    if path.is_empty() {
        return b".".to_vec();
    }
    let trimmed = {
        let mut end = path.len();
        while end > 0 && path[end - 1] == b'/' {
            end -= 1;
        }
        &path[..end]
    };
    if trimmed.is_empty() {
        return b"/".to_vec();
    }
    match trimmed.iter().rposition(|&c| c == b'/') {
        Some(i) => trimmed[i + 1..].to_vec(),
        None => trimmed.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_heap() {
        let data = b"--- heapz 1 ---\nformat = java\nresolution = bytes\n  7048     1 @ 0x00000003 0x00000004\n0x00000003 com.example.A.f (A.java:12)\n0x00000004 GC\n";
        let p = parse_java_profile(data, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.samples.len(), 1);
        assert_eq!(p.sample_types[1], ("inuse_space".into(), "bytes".into()));
        let names: Vec<&str> = p
            .functions
            .iter()
            .map(|&f| p.fn_arena[f].name.as_str())
            .collect();
        assert_eq!(names, vec!["com.example.A.f", "GC"]);
        assert!(p.locations.iter().all(|&l| p.loc_arena[l].address == 0));
    }

    #[test]
    fn path_base() {
        assert_eq!(go_path_base(b"/lib/x.so"), b"x.so");
        assert_eq!(go_path_base(b"x/"), b"x");
        assert_eq!(go_path_base(b""), b".");
    }
}
