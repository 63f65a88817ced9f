//! Text legacy formats: heap (heapz, Go debug=1, growthz, fragmentationz,
//! jemalloc), Go count profiles, threadz and contention profiles. Each
//! function is a transcription of the Go function of the same name in
//! `legacy_profile.go`.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use super::regex::Regex;
use super::{
    LProfile, LSample, LegacyError, Scanner, go_trim_space, is_memory_map_sentinel,
    is_space_or_comment, lossy, parse_hex_addresses, parse_int, parse_uint, re, scale_heap_sample,
};
use crate::Limits;

super::pattern!(COUNT_START_RE, r"\A(\S+) profile: total \d+\z");
super::pattern!(COUNT_RE, r"\A(\d+) @(( 0x[0-9a-f]+)+)\z");
super::pattern!(
    HEAP_HEADER_RE,
    r"heap profile: *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\] *@ *(heap[_a-z0-9]*)/?(\d*)"
);
super::pattern!(
    HEAP_SAMPLE_RE,
    r"(-?\d+): *(-?\d+) *\[ *(\d+): *(\d+) *] @([ x0-9a-f]*)"
);
super::pattern!(JEMALLOC_HEAP_HEADER_RE, r"^heap_v2/*(\d+)$");
super::pattern!(
    JEMALLOC_THREAD_RE,
    r"t(\d+): (-?\d+): *(-?\d+) *\[ *(\d+): *(\d+) *\]"
);
super::pattern!(JEMALLOC_BACKTRACE_RE, r"@([ x0-9a-f]*)");
super::pattern!(CONTENTION_SAMPLE_RE, r"(\d+) *(\d+) @([ x0-9a-f]*)");
super::pattern!(
    GROWTH_HEADER_RE,
    r"heap profile: *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\] @ growthz?"
);
super::pattern!(
    FRAGMENTATION_HEADER_RE,
    r"heap profile: *(\d+): *(\d+) *\[ *(\d+): *(\d+) *\] @ fragmentationz?"
);
super::pattern!(THREADZ_START_RE, r"--- threadz \d+ ---");
super::pattern!(
    THREAD_START_RE,
    r"--- Thread ([[:xdigit:]]+) \(name: (.*)/(\d+)\) stack: ---"
);

#[cfg(test)]
pub(super) fn assert_patterns_compile() {
    for p in [
        &COUNT_START_RE,
        &COUNT_RE,
        &HEAP_HEADER_RE,
        &HEAP_SAMPLE_RE,
        &JEMALLOC_HEAP_HEADER_RE,
        &JEMALLOC_THREAD_RE,
        &JEMALLOC_BACKTRACE_RE,
        &CONTENTION_SAMPLE_RE,
        &GROWTH_HEADER_RE,
        &FRAGMENTATION_HEADER_RE,
        &THREADZ_START_RE,
        &THREAD_START_RE,
    ] {
        assert!(!re(p).is_never());
    }
}

/// How heap samples were taken, from the header.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sampling {
    None,
    V2,
    Jemalloc,
}

/// Go's `parseHeap`: heapz, Go debug=1 heap, growthz, fragmentationz and
/// jemalloc heap profiles.
pub(super) fn parse_heap(b: &[u8], limits: &Limits) -> Result<LProfile, LegacyError> {
    const F: &str = "heap";
    let mut s = Scanner::new(b);
    if !s.scan() {
        s.check()?;
        return Err(LegacyError::Unrecognized);
    }
    let mut p = LProfile::new(limits);
    let line = s.text();
    let (sampling, period, has_alloc) = if re(&HEAP_HEADER_RE).is_match(line) {
        parse_heap_header(line)?
    } else if re(&GROWTH_HEADER_RE).is_match(line) || re(&FRAGMENTATION_HEADER_RE).is_match(line) {
        (Sampling::None, 1, false)
    } else if let Some(c) = re(&JEMALLOC_HEAP_HEADER_RE).captures(line) {
        let period = match c.str(1) {
            [] => 0,
            d => parse_int(d, 10).ok_or(LegacyError::Unrecognized)?,
        };
        (Sampling::Jemalloc, period, false)
    } else {
        return Err(LegacyError::Unrecognized);
    };
    p.period = period;
    let period_type = ("space", "bytes");
    if has_alloc {
        p.set_types(
            &[
                ("alloc_objects", "count"),
                ("alloc_space", "bytes"),
                ("inuse_objects", "count"),
                ("inuse_space", "bytes"),
            ],
            period_type,
        );
    } else {
        p.set_types(&[("objects", "count"), ("space", "bytes")], period_type);
    }

    let mut locs = HashMap::new();
    if sampling == Sampling::Jemalloc {
        let mut addrs: Vec<u64> = Vec::new();
        let mut threads: BTreeMap<Vec<u8>, (Vec<i64>, i64)> = BTreeMap::new();
        let flush = |p: &mut LProfile,
                     locs: &mut HashMap<u64, usize>,
                     addrs: &[u64],
                     threads: &BTreeMap<Vec<u8>, (Vec<i64>, i64)>|
         -> Result<(), LegacyError> {
            let mut sloc = Vec::with_capacity(addrs.len());
            for &a in addrs {
                sloc.push(p.location_for(locs, a.wrapping_sub(1))?);
            }
            for (tid, (value, blocksize)) in threads {
                p.push_sample(LSample {
                    locations: sloc.clone(),
                    values: value.clone(),
                    labels: vec![("thread".to_owned(), lossy(tid))],
                    num_labels: vec![("bytes".to_owned(), *blocksize)],
                })?;
            }
            Ok(())
        };
        while s.scan() {
            let line = go_trim_space(s.text());
            if is_space_or_comment(line) {
                continue;
            }
            if is_memory_map_sentinel(line) {
                break;
            }
            if let Some(c) = re(&JEMALLOC_THREAD_RE).captures(line) {
                if addrs.is_empty() {
                    // A global aggregate before any backtrace.
                    continue;
                }
                let mut value = Vec::with_capacity(4);
                let mut blocksize = 0;
                if has_alloc {
                    add_heap_values(
                        c.str(4),
                        c.str(5),
                        "allocation",
                        s.line(),
                        sampling,
                        p.period,
                        &mut value,
                        &mut blocksize,
                    )?;
                }
                add_heap_values(
                    c.str(2),
                    c.str(3),
                    "inuse",
                    s.line(),
                    sampling,
                    p.period,
                    &mut value,
                    &mut blocksize,
                )?;
                threads.insert(c.str(1).to_vec(), (value, blocksize));
            }
            if let Some(c) = re(&JEMALLOC_BACKTRACE_RE).captures(line) {
                if !addrs.is_empty() && !threads.is_empty() {
                    flush(&mut p, &mut locs, &addrs, &threads)?;
                    addrs.clear();
                    threads.clear();
                }
                addrs = parse_hex_addresses(c.str(1), F, s.line())?;
            }
        }
        s.check()?;
        // Go forgets the last backtrace of the file; keep it.
        if !addrs.is_empty() && !threads.is_empty() {
            flush(&mut p, &mut locs, &addrs, &threads)?;
        }
        parse_additional_sections(&mut s, &mut p)?;
        return Ok(p);
    }

    while s.scan() {
        let line = go_trim_space(s.text());
        if is_space_or_comment(line) {
            continue;
        }
        if is_memory_map_sentinel(line) {
            break;
        }
        let Some(c) = re(&HEAP_SAMPLE_RE).captures(line) else {
            return Err(LegacyError::MalformedLine {
                format: F,
                line: s.line(),
                detail: "expected `count: bytes [count: bytes] @ addresses`".to_owned(),
            });
        };
        let mut value = Vec::with_capacity(4);
        let mut blocksize = 0;
        if has_alloc {
            add_heap_values(
                c.str(3),
                c.str(4),
                "allocation",
                s.line(),
                sampling,
                p.period,
                &mut value,
                &mut blocksize,
            )?;
        }
        add_heap_values(
            c.str(1),
            c.str(2),
            "inuse",
            s.line(),
            sampling,
            p.period,
            &mut value,
            &mut blocksize,
        )?;
        let addrs = parse_hex_addresses(c.str(5), F, s.line())?;
        let mut sloc = Vec::with_capacity(addrs.len());
        for a in addrs {
            // Adjust by -1 to land on the call instruction.
            sloc.push(p.location_for(&mut locs, a.wrapping_sub(1))?);
        }
        p.push_sample(LSample {
            locations: sloc,
            values: value,
            num_labels: vec![("bytes".to_owned(), blocksize)],
            ..Default::default()
        })?;
    }
    s.check()?;
    parse_additional_sections(&mut s, &mut p)?;
    Ok(p)
}

/// Go's `parseHeapHeader`: (sampling, period, has_alloc).
fn parse_heap_header(line: &[u8]) -> Result<(Sampling, i64, bool), LegacyError> {
    let c = re(&HEAP_HEADER_RE)
        .captures(line)
        .ok_or(LegacyError::Unrecognized)?;
    let mut period = 0;
    if !c.str(6).is_empty() {
        period = parse_int(c.str(6), 10).ok_or(LegacyError::Unrecognized)?;
    }
    let has_alloc =
        (c.str(3) != c.str(1) && c.str(3) != b"0") || (c.str(4) != c.str(2) && c.str(4) != b"0");
    match c.str(5) {
        b"heapz_v2" | b"heap_v2" => Ok((Sampling::V2, period, has_alloc)),
        b"heapprofile" => Ok((Sampling::None, 1, has_alloc)),
        b"heap" => Ok((Sampling::V2, period / 2, has_alloc)),
        _ => Err(LegacyError::Unrecognized),
    }
}

/// The `addValues` closure of Go's `parseHeapSample`.
#[allow(clippy::too_many_arguments)]
fn add_heap_values(
    count: &[u8],
    size: &[u8],
    which: &'static str,
    line: usize,
    sampling: Sampling,
    rate: i64,
    value: &mut Vec<i64>,
    blocksize: &mut i64,
) -> Result<(), LegacyError> {
    let malformed = |what: &[u8]| LegacyError::MalformedLine {
        format: "heap",
        line,
        detail: format!("{} is not a 64-bit integer", lossy(what)),
    };
    let mut count = parse_int(count, 10).ok_or_else(|| malformed(count))?;
    let mut size = parse_int(size, 10).ok_or_else(|| malformed(size))?;
    if count == 0 && size != 0 {
        return Err(LegacyError::ZeroCountWithBytes { line, which, size });
    }
    if count != 0 {
        *blocksize = size.wrapping_div(count);
        if sampling != Sampling::None {
            (count, size) = scale_heap_sample(count, size, rate);
        }
    }
    value.push(count);
    value.push(size);
    Ok(())
}

/// Go's `parseGoCount`: `goroutine profile: total N` / `threadcreate ...`.
pub(super) fn parse_go_count(b: &[u8], limits: &Limits) -> Result<LProfile, LegacyError> {
    const F: &str = "count";
    let mut s = Scanner::new(b);
    while s.scan() && is_space_or_comment(s.text()) {}
    s.check()?;
    let Some(c) = re(&COUNT_START_RE).captures(s.text()) else {
        return Err(LegacyError::Unrecognized);
    };
    let ty = lossy(c.str(1));
    let mut p = LProfile::new(limits);
    p.set_types(&[(&ty, "count")], (&ty, "count"));
    p.period = 1;
    let mut locs = HashMap::new();
    while s.scan() {
        let line = s.text();
        if is_space_or_comment(line) {
            continue;
        }
        if line.starts_with(b"---") {
            break;
        }
        let malformed = || LegacyError::MalformedLine {
            format: F,
            line: s.line(),
            detail: "expected `count @ 0xaddr ...`".to_owned(),
        };
        let c = re(&COUNT_RE).captures(line).ok_or_else(malformed)?;
        let n = parse_int(c.str(1), 0).ok_or_else(malformed)?;
        let mut sloc = Vec::new();
        for field in c.str(2).split(|b| b.is_ascii_whitespace()) {
            if field.is_empty() {
                continue;
            }
            let addr = parse_uint(field, 0).ok_or_else(malformed)?;
            sloc.push(p.location_for(&mut locs, addr.wrapping_sub(1))?);
        }
        p.push_sample(LSample {
            locations: sloc,
            values: vec![n],
            ..Default::default()
        })?;
    }
    s.check()?;
    parse_additional_sections(&mut s, &mut p)?;
    Ok(p)
}

/// Go's `parseThread`: threadz profiles.
pub(super) fn parse_thread(b: &[u8], limits: &Limits) -> Result<LProfile, LegacyError> {
    let mut s = Scanner::new(b);
    while s.scan() && is_space_or_comment(s.text()) {}
    let mut line = s.text();
    if re(&THREADZ_START_RE).is_match(line) {
        while s.scan() {
            line = s.text();
            if is_memory_map_sentinel(line) || line.starts_with(b"-") {
                break;
            }
        }
    } else if !re(&THREAD_START_RE).is_match(line) {
        return Err(LegacyError::Unrecognized);
    }
    let mut p = LProfile::new(limits);
    p.set_types(&[("thread", "count")], ("thread", "count"));
    p.period = 1;
    let mut locs = HashMap::new();
    while !is_memory_map_sentinel(line) {
        if line.starts_with(b"---- no stack trace for") {
            break;
        }
        if !re(&THREAD_START_RE).is_match(line) {
            return Err(LegacyError::Unrecognized);
        }
        let (next, addrs) = parse_thread_sample(&mut s)?;
        line = next;
        let Some(addrs) = addrs else {
            // "same as previous thread": bump the previous sample.
            if let Some(v) = p.samples.last_mut().and_then(|x| x.values.first_mut()) {
                *v = v.wrapping_add(1);
            }
            continue;
        };
        let mut sloc = Vec::with_capacity(addrs.len());
        for (i, a) in addrs.into_iter().enumerate() {
            // Adjust all but the leaf by -1 to land on the call.
            let a = if i > 0 { a.wrapping_sub(1) } else { a };
            sloc.push(p.location_for(&mut locs, a)?);
        }
        p.push_sample(LSample {
            locations: sloc,
            values: vec![1],
            ..Default::default()
        })?;
    }
    parse_additional_sections(&mut s, &mut p)?;
    p.cleanup_duplicate_locations();
    Ok(p)
}

/// Go's `parseThreadSample`: the line after the trace, and its addresses
/// (`None` for "same as previous thread", or when there are none).
fn parse_thread_sample<'a>(
    s: &mut Scanner<'a>,
) -> Result<(&'a [u8], Option<Vec<u64>>), LegacyError> {
    let mut line: &[u8] = &[];
    let mut same = false;
    let mut addrs = Vec::new();
    while s.scan() {
        line = go_trim_space(s.text());
        if line.is_empty() {
            continue;
        }
        if line.starts_with(b"---") {
            break;
        }
        if super::contains(line, b"same as previous thread") {
            same = true;
            continue;
        }
        addrs.extend(parse_hex_addresses(line, "thread", s.line())?);
    }
    s.check()?;
    if same || addrs.is_empty() {
        return Ok((line, None));
    }
    Ok((line, Some(addrs)))
}

/// Go's `parseContention`: gperftools contentionz and Go `--- mutex:` /
/// `--- contention:` profiles.
pub(super) fn parse_contention(b: &[u8], limits: &Limits) -> Result<LProfile, LegacyError> {
    let mut s = Scanner::new(b);
    if !s.scan() {
        s.check()?;
        return Err(LegacyError::Unrecognized);
    }
    let first = s.text();
    if !(first.starts_with(b"--- contentionz ")
        || first.starts_with(b"--- mutex:")
        || first.starts_with(b"--- contention:"))
    {
        return Err(LegacyError::Unrecognized);
    }
    let mut p = LProfile::new(limits);
    p.set_types(
        &[("contentions", "count"), ("delay", "nanoseconds")],
        ("contentions", "count"),
    );
    p.period = 1;
    let mut cpu_hz: i64 = 0;
    while s.scan() {
        let line = go_trim_space(s.text());
        if is_space_or_comment(line) {
            continue;
        }
        if line.starts_with(b"---") {
            break;
        }
        let Some(eq) = line.iter().position(|&b| b == b'=') else {
            break;
        };
        let key = go_trim_space(&line[..eq]);
        let val = go_trim_space(&line[eq + 1..]);
        let num = || parse_int(val, 0).ok_or(LegacyError::Unrecognized);
        match key {
            b"cycles/second" => cpu_hz = num()?,
            b"sampling period" => p.period = num()?,
            b"ms since reset" => p.duration_nanos = num()?.wrapping_mul(1_000_000),
            b"discarded samples" => {}
            // "format", "resolution" (Java) and anything else.
            _ => return Err(LegacyError::Unrecognized),
        }
    }
    s.check()?;
    let mut locs = HashMap::new();
    loop {
        let line = go_trim_space(s.text());
        if line.starts_with(b"---") {
            break;
        }
        if !is_space_or_comment(line) {
            let (value, addrs) = parse_contention_sample(line, p.period, cpu_hz, s.line())?;
            let mut sloc = Vec::with_capacity(addrs.len());
            for a in addrs {
                sloc.push(p.location_for(&mut locs, a.wrapping_sub(1))?);
            }
            p.push_sample(LSample {
                locations: sloc,
                values: value,
                ..Default::default()
            })?;
        }
        if !s.scan() {
            break;
        }
    }
    s.check()?;
    parse_additional_sections(&mut s, &mut p)?;
    Ok(p)
}

/// Go's `parseContentionSample`: values are [contentions, delay].
fn parse_contention_sample(
    line: &[u8],
    period: i64,
    cpu_hz: i64,
    n: usize,
) -> Result<(Vec<i64>, Vec<u64>), LegacyError> {
    // Go returns errUnrecognized here, which lets the Java parser try.
    let c = re(&CONTENTION_SAMPLE_RE)
        .captures(line)
        .ok_or(LegacyError::Unrecognized)?;
    let malformed = |what: &[u8]| LegacyError::MalformedLine {
        format: "contention",
        line: n,
        detail: format!("{} is not a 64-bit integer", lossy(what)),
    };
    let mut v1 = parse_int(c.str(1), 10).ok_or_else(|| malformed(c.str(1)))?;
    let mut v2 = parse_int(c.str(2), 10).ok_or_else(|| malformed(c.str(2)))?;
    // Unsample: delays from cycles to nanoseconds, counts by the period.
    if period > 0 {
        if cpu_hz > 0 {
            let cpu_ghz = cpu_hz as f64 / 1e9;
            v1 = (v1 as f64 * period as f64 / cpu_ghz) as i64;
        }
        v2 = v2.wrapping_mul(period);
    }
    let addrs = parse_hex_addresses(c.str(3), "contention", n)?;
    Ok((vec![v2, v1], addrs))
}

/// Go's `parseAdditionalSections`: skips to the memory map, if any, and
/// parses it.
fn parse_additional_sections(s: &mut Scanner<'_>, p: &mut LProfile) -> Result<(), LegacyError> {
    while !is_memory_map_sentinel(s.text()) && s.scan() {}
    s.check()?;
    p.parse_memory_map(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn go_count_profile() {
        let p = parse_go_count(
            b"# comment\ngoroutine profile: total 3\n2 @ 0x10 0x20\n#\t0x10 main.f\n\n1 @ 0x30\n",
            &limits(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.samples.len(), 2);
        assert_eq!(p.sample_types, vec![("goroutine".into(), "count".into())]);
        let addrs: Vec<u64> = p.samples[0]
            .locations
            .iter()
            .map(|&l| p.loc_arena[l].address)
            .collect();
        assert_eq!(addrs, vec![0xf, 0x1f]);
        assert!(matches!(
            parse_go_count(b"goroutine profile: total 3\n2 @ zz\n", &limits()),
            Err(LegacyError::MalformedLine { line: 2, .. })
        ));
        assert!(matches!(
            parse_go_count(b"hello\n", &limits()),
            Err(LegacyError::Unrecognized)
        ));
    }

    #[test]
    fn heap_header_variants() {
        let h = |l: &str| parse_heap_header(l.as_bytes()).ok();
        assert!(matches!(
            h("heap profile: 1: 2 [3: 4] @ heap/1048576"),
            Some((Sampling::V2, 524288, true))
        ));
        assert!(matches!(
            h("heap profile:    144:  8498176 [   144:  8498176] @ heapz_v2/524288"),
            Some((Sampling::V2, 524288, false))
        ));
        assert!(matches!(
            h("heap profile: 1: 2 [1: 2] @ heapprofile"),
            Some((Sampling::None, 1, false))
        ));
        assert!(h("heap profile: 1: 2 [1: 2] @ heapfoo").is_none());
    }

    #[test]
    fn heap_zero_count_with_bytes_is_an_error() {
        let r = parse_heap(
            b"heap profile: 1: 2 [1: 2] @ heap_v2/1\n0: 5 [0: 0] @ 0x1\n",
            &limits(),
        );
        assert!(matches!(
            r,
            Err(LegacyError::ZeroCountWithBytes { line: 2, .. })
        ));
    }

    #[test]
    fn jemalloc_keeps_every_backtrace() {
        let data = b"heap_v2/524288\n  t*: 2: 20 [0: 0]\n@ 0x10 0x20\n  t*: 1: 10 [0: 0]\n  t1: 1: 10 [0: 0]\n@ 0x30\n  t*: 1: 10 [0: 0]\n  t2: 1: 10 [0: 0]\n";
        let p = parse_heap(data, &limits()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.samples.len(), 2);
        assert_eq!(p.samples[1].labels, vec![("thread".into(), "2".into())]);
    }

    #[test]
    fn contention_sample_backtracks_like_go() {
        let (v, a) =
            parse_contention_sample(b"12345 @ 0x10", 0, 0, 1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v, vec![5, 1234]);
        assert_eq!(a, vec![0x10]);
    }

    #[test]
    fn thread_same_as_previous() {
        let data = b"--- threadz 1 ---\n\n--- Thread 1 (name: a/1) stack: ---\n  PC: 0x10\n  0x21\n--- Thread 2 (name: b/2) stack: ---\n  [same as previous thread]\n--- Memory map: ---\n";
        let p = parse_thread(data, &limits()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.samples.len(), 1);
        assert_eq!(p.samples[0].values, vec![2]);
    }
}
