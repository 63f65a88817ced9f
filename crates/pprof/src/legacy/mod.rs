//! Legacy (pre-protobuf) profile formats that `go tool pprof` still
//! accepts, ported from `github.com/google/pprof/profile/legacy_profile.go`
//! and `legacy_java_profile.go`:
//!
//! - gperftools CPU profiles (binary words, 32 or 64 bit, either
//!   endianness), including the Java variant with a symbol section;
//! - heapz / `heap profile:` text (gperftools `heap_v2`, Go debug=1 `heap`,
//!   `heapprofile`, growthz, fragmentationz, jemalloc `heap_v2/N`), with
//!   Go pprof's unsampling (`scaleHeapSample`);
//! - Go count profiles (`goroutine profile: total N`, `threadcreate ...`);
//! - threadz text;
//! - contentionz / Go `--- mutex:` / `--- contention:` text;
//! - Java heapz and contentionz text.
//!
//! The parsers are tried in Go's order; the first one that recognizes the
//! input decides (its error, if any, is final), exactly like
//! `profile.parseLegacy`. They build a small Go-like object graph
//! ([`LProfile`]) so the Go post-processing (memory-map association,
//! id remapping, frame clean-ups) can be transcribed step by step, then
//! convert it into a protobuf [`pprof::Profile`].
//!
//! Deliberate differences from Go, all for robustness:
//! - no panics: Go panics on some malformed inputs; here they are errors;
//! - the jemalloc parser also emits the last stack of the file (Go drops it);
//! - sample and location counts are checked against [`Limits`] while
//!   parsing, so a hostile input cannot allocate without bound;
//! - lines of Java profiles are limited to 64 KiB like the other text
//!   formats (Go reads them without a limit).

mod cpu;
mod java;
mod regex;
mod text;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::LazyLock;

use fathom_proto::pprof;

use crate::Limits;
use regex::Regex;

/// Why a legacy-format profile could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LegacyError {
    /// No legacy parser recognized the input.
    #[error("not a recognized legacy profile format")]
    Unrecognized,
    /// A text line exceeds Go's `bufio.Scanner` limit.
    #[error("line {line} is longer than {limit} bytes")]
    LineTooLong { line: usize, limit: usize },
    /// A line of a recognized format does not have the expected shape.
    #[error("{format} profile, line {line}: {detail}")]
    MalformedLine {
        format: &'static str,
        line: usize,
        detail: String,
    },
    /// A hexadecimal address does not fit in 64 bits.
    #[error("{format} profile, line {line}: address {text} does not fit in 64 bits")]
    AddressOverflow {
        format: &'static str,
        line: usize,
        text: String,
    },
    /// A heap sample reports bytes for zero objects.
    #[error("heap profile, line {line}: {which} count was 0 but {which} bytes was {size}")]
    ZeroCountWithBytes {
        line: usize,
        which: &'static str,
        size: i64,
    },
    /// A Java heap sample reports zero objects.
    #[error("java heap profile, line {line}: the object count must be non-zero")]
    JavaZeroCount { line: usize },
    /// A header attribute has a value that is not a number.
    #[error("{format} profile: attribute {attribute:?} has a non-numeric value {value:?}")]
    BadAttribute {
        format: &'static str,
        attribute: String,
        value: String,
    },
    /// The profile has more samples or locations than allowed.
    #[error("the profile has more than {limit} {what}")]
    LimitExceeded { what: &'static str, limit: usize },
}

/// Go's `bufio.MaxScanTokenSize`: longer lines make `bufio.Scanner` fail.
const MAX_LINE: usize = 64 * 1024;

/// Parses `data` as one of the legacy formats, in Go's order.
pub(crate) fn parse(data: &[u8], limits: &Limits) -> Result<pprof::Profile, LegacyError> {
    type Parser = fn(&[u8], &Limits) -> Result<LProfile, LegacyError>;
    let parsers: [Parser; 6] = [
        cpu::parse_cpu,
        text::parse_heap,
        text::parse_go_count,
        text::parse_thread,
        text::parse_contention,
        java::parse_java_profile,
    ];
    for parser in parsers {
        match parser(data, limits) {
            Ok(mut p) => {
                p.add_legacy_frame_info();
                return Ok(p.into_pprof());
            }
            Err(LegacyError::Unrecognized) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(LegacyError::Unrecognized)
}

// ---------------------------------------------------------------------------
// Go-like object graph. Indices into arenas stand in for Go pointers.

#[derive(Default)]
struct LSample {
    locations: Vec<usize>,
    values: Vec<i64>,
    labels: Vec<(String, String)>,
    num_labels: Vec<(String, i64)>,
}

#[derive(Default)]
struct LLocation {
    id: u64,
    mapping: Option<usize>,
    address: u64,
    lines: Vec<LLine>,
}

struct LLine {
    function: usize,
    line: i64,
}

#[derive(Default)]
struct LFunction {
    id: u64,
    name: String,
    system_name: String,
    filename: String,
}

#[derive(Default, Clone)]
struct LMapping {
    id: u64,
    start: u64,
    limit: u64,
    offset: u64,
    file: String,
    build_id: String,
}

/// A profile under construction, shaped like Go's `profile.Profile`.
struct LProfile {
    max_samples: usize,
    max_locations: usize,
    sample_types: Vec<(String, String)>,
    period_type: (String, String),
    period: i64,
    duration_nanos: i64,
    samples: Vec<LSample>,
    /// Arena of every location ever created.
    loc_arena: Vec<LLocation>,
    /// Go's `p.Location`.
    locations: Vec<usize>,
    fn_arena: Vec<LFunction>,
    /// Go's `p.Function`.
    functions: Vec<usize>,
    map_arena: Vec<LMapping>,
    /// Go's `p.Mapping`.
    mappings: Vec<usize>,
    drop_frames: String,
    keep_frames: String,
}

impl LProfile {
    fn new(limits: &Limits) -> Self {
        LProfile {
            max_samples: limits.max_samples,
            max_locations: limits.max_locations,
            sample_types: Vec::new(),
            period_type: (String::new(), String::new()),
            period: 0,
            duration_nanos: 0,
            samples: Vec::new(),
            loc_arena: Vec::new(),
            locations: Vec::new(),
            fn_arena: Vec::new(),
            functions: Vec::new(),
            map_arena: Vec::new(),
            mappings: Vec::new(),
            drop_frames: String::new(),
            keep_frames: String::new(),
        }
    }

    fn set_types(&mut self, sample_types: &[(&str, &str)], period_type: (&str, &str)) {
        self.sample_types = sample_types
            .iter()
            .map(|(t, u)| ((*t).to_owned(), (*u).to_owned()))
            .collect();
        self.period_type = (period_type.0.to_owned(), period_type.1.to_owned());
    }

    fn push_sample(&mut self, s: LSample) -> Result<(), LegacyError> {
        if self.samples.len() >= self.max_samples {
            return Err(LegacyError::LimitExceeded {
                what: "samples",
                limit: self.max_samples,
            });
        }
        self.samples.push(s);
        Ok(())
    }

    /// The location for `addr`, creating it (and appending it to
    /// `p.Location`) on first use, like the `locs[addr]` maps in Go.
    fn location_for(
        &mut self,
        cache: &mut HashMap<u64, usize>,
        addr: u64,
    ) -> Result<usize, LegacyError> {
        if let Some(&i) = cache.get(&addr) {
            return Ok(i);
        }
        if self.loc_arena.len() >= self.max_locations {
            return Err(LegacyError::LimitExceeded {
                what: "locations",
                limit: self.max_locations,
            });
        }
        let i = self.loc_arena.len();
        self.loc_arena.push(LLocation {
            address: addr,
            ..Default::default()
        });
        self.locations.push(i);
        cache.insert(addr, i);
        Ok(i)
    }

    /// Go's `ParseMemoryMapFromScanner`: reads the memory map, then
    /// renumbers locations, functions and mappings.
    fn parse_memory_map(&mut self, s: &mut Scanner<'_>) -> Result<(), LegacyError> {
        let parsed = parse_proc_maps(s)?;
        for m in parsed {
            self.map_arena.push(m);
            self.mappings.push(self.map_arena.len() - 1);
        }
        self.massage_mappings();
        self.remap_location_ids();
        self.remap_function_ids();
        self.remap_mapping_ids();
        Ok(())
    }

    /// Go's `massageMappings`.
    fn massage_mappings(&mut self) {
        if self.mappings.len() > 1 {
            let mut merged = vec![self.mappings[0]];
            for &m in &self.mappings[1..] {
                let Some(&lm) = merged.last() else { continue };
                if adjacent(&self.map_arena[lm], &self.map_arena[m]) {
                    let src = self.map_arena[m].clone();
                    let dst = &mut self.map_arena[lm];
                    dst.limit = src.limit;
                    if !src.file.is_empty() {
                        dst.file = src.file;
                    }
                    if !src.build_id.is_empty() {
                        dst.build_id = src.build_id;
                    }
                    for &l in &self.locations {
                        let loc = &mut self.loc_arena[l];
                        if loc.mapping == Some(m) {
                            loc.mapping = Some(lm);
                        }
                    }
                    continue;
                }
                merged.push(m);
            }
            self.mappings = merged;
        }
        // Move what looks like the main binary to the front.
        for i in 0..self.mappings.len() {
            let file = self.map_arena[self.mappings[i]]
                .file
                .replace("(deleted)", "");
            let file = go_trim_space(file.as_bytes());
            if file.is_empty() || re(&LIB_RE).is_match(file) || file[0] == b'[' {
                continue;
            }
            self.mappings.swap(0, i);
            break;
        }
        for (i, &m) in self.mappings.iter().enumerate() {
            self.map_arena[m].id = i as u64 + 1;
        }
    }

    /// Go's `remapLocationIDs`: keeps the locations samples use, in order
    /// of first use, numbered from 1.
    fn remap_location_ids(&mut self) {
        let mut seen = vec![false; self.loc_arena.len()];
        let mut list = Vec::new();
        for s in &self.samples {
            for &l in &s.locations {
                if seen[l] {
                    continue;
                }
                seen[l] = true;
                list.push(l);
                self.loc_arena[l].id = list.len() as u64;
            }
        }
        self.locations = list;
    }

    /// Go's `remapFunctionIDs`.
    fn remap_function_ids(&mut self) {
        let mut seen = vec![false; self.fn_arena.len()];
        let mut list = Vec::new();
        for &l in &self.locations {
            for ln in &self.loc_arena[l].lines {
                if seen[ln.function] {
                    continue;
                }
                seen[ln.function] = true;
                list.push(ln.function);
                self.fn_arena[ln.function].id = list.len() as u64;
            }
        }
        self.functions = list;
    }

    /// Go's `remapMappingIDs`: fixes up the main mapping, associates each
    /// location with the mapping covering its address (or a fake one).
    fn remap_mapping_ids(&mut self) {
        if self.mappings.len() > 1 {
            let m0 = &self.map_arena[self.mappings[0]];
            let m1 = &self.map_arena[self.mappings[1]];
            if m0.file.starts_with("/anon_hugepage") && m0.limit == m1.start {
                self.mappings.remove(0);
            }
        }
        if let Some(&m0) = self.mappings.first() {
            const EXPECTED_START: u64 = 0x400000;
            let m = &mut self.map_arena[m0];
            if m.start.wrapping_sub(m.offset) == EXPECTED_START {
                m.start = EXPECTED_START;
                m.offset = 0;
            }
        }
        let mut fake: Option<usize> = None;
        'next: for li in 0..self.locations.len() {
            let l = self.locations[li];
            let a = self.loc_arena[l].address;
            if self.loc_arena[l].mapping.is_some() || a == 0 {
                continue;
            }
            for &m in &self.mappings {
                let mm = &self.map_arena[m];
                if mm.start <= a && a < mm.limit {
                    self.loc_arena[l].mapping = Some(m);
                    continue 'next;
                }
            }
            for &m in &self.mappings {
                let mm = &mut self.map_arena[m];
                if mm.offset != 0 && mm.start.wrapping_sub(mm.offset) <= a && a < mm.start {
                    mm.start = mm.start.wrapping_sub(mm.offset);
                    mm.offset = 0;
                    self.loc_arena[l].mapping = Some(m);
                    continue 'next;
                }
            }
            let f = match fake {
                Some(f) => f,
                None => {
                    self.map_arena.push(LMapping {
                        id: 1,
                        limit: u64::MAX,
                        ..Default::default()
                    });
                    let f = self.map_arena.len() - 1;
                    self.mappings.push(f);
                    fake = Some(f);
                    f
                }
            };
            self.loc_arena[l].mapping = Some(f);
        }
        for (i, &m) in self.mappings.iter().enumerate() {
            self.map_arena[m].id = i as u64 + 1;
        }
    }

    /// Go's `cleanupDuplicateLocations`: drops a leaf duplicated by the
    /// signal handler (the copy adjusted by -1).
    fn cleanup_duplicate_locations(&mut self) {
        for s in &mut self.samples {
            if s.locations.len() > 1 {
                let a0 = self.loc_arena[s.locations[0]].address;
                let a1 = self.loc_arena[s.locations[1]].address;
                if a0 == a1.wrapping_add(1) {
                    s.locations.remove(1);
                }
            }
        }
    }

    /// Go's `addLegacyFrameInfo`.
    fn add_legacy_frame_info(&mut self) {
        const HEAPZ: [&[&str]; 5] = [
            &["allocations", "size"],
            &["objects", "space"],
            &["inuse_objects", "inuse_space"],
            &["alloc_objects", "alloc_space"],
            &[
                "alloc_objects",
                "alloc_space",
                "inuse_objects",
                "inuse_space",
            ],
        ];
        let is = |types: &[&str]| {
            self.sample_types.len() == types.len()
                && self.sample_types.iter().zip(types).all(|(a, b)| a.0 == *b)
        };
        let (drop, keep) = if HEAPZ.iter().any(|t| is(t)) {
            (ALLOC_RX, ALLOC_SKIP_RX)
        } else if is(&["contentions", "delay"]) {
            (LOCK_RX, "")
        } else {
            (CPU_PROFILER_RX, "")
        };
        self.drop_frames = drop.to_owned();
        self.keep_frames = keep.to_owned();
    }

    /// Encodes the object graph as a protobuf profile (Go's `preEncode`).
    fn into_pprof(self) -> pprof::Profile {
        let mut st = Strings::default();
        let mut out = pprof::Profile {
            sample_type: self
                .sample_types
                .iter()
                .map(|(t, u)| pprof::ValueType {
                    r#type: st.index(t),
                    unit: st.index(u),
                })
                .collect(),
            ..Default::default()
        };
        out.sample = self
            .samples
            .iter()
            .map(|s| {
                let mut label: Vec<pprof::Label> = s
                    .labels
                    .iter()
                    .map(|(k, v)| pprof::Label {
                        key: st.index(k),
                        str: st.index(v),
                        ..Default::default()
                    })
                    .collect();
                label.extend(s.num_labels.iter().map(|(k, n)| pprof::Label {
                    key: st.index(k),
                    num: *n,
                    ..Default::default()
                }));
                pprof::Sample {
                    location_id: s.locations.iter().map(|&l| self.loc_arena[l].id).collect(),
                    value: s.values.clone(),
                    label,
                }
            })
            .collect();
        out.mapping = self
            .mappings
            .iter()
            .map(|&m| {
                let m = &self.map_arena[m];
                pprof::Mapping {
                    id: m.id,
                    memory_start: m.start,
                    memory_limit: m.limit,
                    file_offset: m.offset,
                    filename: st.index(&m.file),
                    build_id: st.index(&m.build_id),
                    ..Default::default()
                }
            })
            .collect();
        out.location = self
            .locations
            .iter()
            .map(|&l| {
                let l = &self.loc_arena[l];
                pprof::Location {
                    id: l.id,
                    mapping_id: l.mapping.map_or(0, |m| self.map_arena[m].id),
                    address: l.address,
                    line: l
                        .lines
                        .iter()
                        .map(|ln| pprof::Line {
                            function_id: self.fn_arena[ln.function].id,
                            line: ln.line,
                            column: 0,
                        })
                        .collect(),
                    is_folded: false,
                }
            })
            .collect();
        out.function = self
            .functions
            .iter()
            .map(|&f| {
                let f = &self.fn_arena[f];
                pprof::Function {
                    id: f.id,
                    name: st.index(&f.name),
                    system_name: st.index(&f.system_name),
                    filename: st.index(&f.filename),
                    start_line: 0,
                }
            })
            .collect();
        out.drop_frames = st.index(&self.drop_frames);
        out.keep_frames = st.index(&self.keep_frames);
        out.duration_nanos = self.duration_nanos;
        out.period_type = Some(pprof::ValueType {
            r#type: st.index(&self.period_type.0),
            unit: st.index(&self.period_type.1),
        });
        out.period = self.period;
        out.string_table = st.table;
        out
    }
}

/// Go's `adjacent`: whether two mapping entries are one mapping split in two.
fn adjacent(m1: &LMapping, m2: &LMapping) -> bool {
    if !m1.file.is_empty() && !m2.file.is_empty() && m1.file != m2.file {
        return false;
    }
    if !m1.build_id.is_empty() && !m2.build_id.is_empty() && m1.build_id != m2.build_id {
        return false;
    }
    if m1.limit != m2.start {
        return false;
    }
    if m1.offset != 0 && m2.offset != 0 {
        let offset = m1.offset.wrapping_add(m1.limit.wrapping_sub(m1.start));
        if offset != m2.offset {
            return false;
        }
    }
    true
}

/// A string table under construction; index 0 is "".
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Default for Strings {
    fn default() -> Self {
        let mut index = HashMap::new();
        index.insert(String::new(), 0);
        Strings {
            table: vec![String::new()],
            index,
        }
    }
}

impl Strings {
    fn index(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

// ---------------------------------------------------------------------------
// Go helpers.

/// Go's `bufio.Scanner` with `ScanLines`: lines without their `\n` and a
/// trailing `\r`; after the input ends `text()` is empty; a line of
/// [`MAX_LINE`] bytes or more stops the scan with an error (and leaves
/// `text()` unchanged, like Go).
struct Scanner<'a> {
    data: &'a [u8],
    pos: usize,
    token: &'a [u8],
    line: usize,
    err: Option<LegacyError>,
    done: bool,
}

impl<'a> Scanner<'a> {
    fn new(data: &'a [u8]) -> Self {
        Scanner {
            data,
            pos: 0,
            token: &[],
            line: 0,
            err: None,
            done: false,
        }
    }

    fn scan(&mut self) -> bool {
        if self.done {
            return false;
        }
        let rest = &self.data[self.pos.min(self.data.len())..];
        if rest.is_empty() {
            self.token = &[];
            self.done = true;
            return false;
        }
        let (raw, advance) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], i + 1),
            None => (rest, rest.len()),
        };
        if raw.len() >= MAX_LINE {
            self.err = Some(LegacyError::LineTooLong {
                line: self.line + 1,
                limit: MAX_LINE - 1,
            });
            self.done = true;
            return false;
        }
        self.pos += advance;
        self.line += 1;
        self.token = raw.strip_suffix(b"\r").unwrap_or(raw);
        true
    }

    fn text(&self) -> &'a [u8] {
        self.token
    }

    /// The number of the line `text()` returns (1-based).
    fn line(&self) -> usize {
        self.line
    }

    fn check(&self) -> Result<(), LegacyError> {
        match &self.err {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

/// Go's `strings.TrimSpace` on bytes (Unicode white space).
fn go_trim_space(mut s: &[u8]) -> &[u8] {
    while let Some((c, n)) = first_char(s) {
        if !c.is_whitespace() {
            break;
        }
        s = &s[n..];
    }
    while let Some((c, n)) = last_char(s) {
        if !c.is_whitespace() {
            break;
        }
        s = &s[..s.len() - n];
    }
    s
}

fn first_char(s: &[u8]) -> Option<(char, usize)> {
    let b = *s.first()?;
    let n = match b {
        0x00..=0x7f => return Some((char::from(b), 1)),
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => return None,
    };
    let c = std::str::from_utf8(s.get(..n)?).ok()?.chars().next()?;
    Some((c, n))
}

fn last_char(s: &[u8]) -> Option<(char, usize)> {
    let b = *s.last()?;
    if b < 0x80 {
        return Some((char::from(b), 1));
    }
    for n in 2..=4.min(s.len()) {
        let tail = &s[s.len() - n..];
        if tail[0] & 0xc0 != 0x80 {
            let c = std::str::from_utf8(tail).ok()?.chars().next()?;
            return Some((c, n));
        }
    }
    None
}

/// Go's `isSpaceOrComment`.
fn is_space_or_comment(line: &[u8]) -> bool {
    let t = go_trim_space(line);
    t.is_empty() || t[0] == b'#'
}

/// Go's `isMemoryMapSentinel`.
fn is_memory_map_sentinel(line: &[u8]) -> bool {
    contains(line, b"--- Memory map: ---") || contains(line, b"MAPPED_LIBRARIES:")
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Go's `strconv.ParseUint(s, base, 64)` for base 0 (prefixes, `_`
/// separators), 10 or 16.
fn parse_uint(s: &[u8], base: u32) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let base0 = base == 0;
    let (base, digits, prefixed) = if base0 {
        let lower = |i: usize| s.get(i).map(u8::to_ascii_lowercase);
        if s[0] == b'0' && s.len() >= 3 && lower(1) == Some(b'x') {
            (16, &s[2..], true)
        } else if s[0] == b'0' && s.len() >= 3 && lower(1) == Some(b'o') {
            (8, &s[2..], true)
        } else if s[0] == b'0' && s.len() >= 3 && lower(1) == Some(b'b') {
            (2, &s[2..], true)
        } else if s[0] == b'0' {
            (8, &s[1..], true)
        } else {
            (10, s, false)
        }
    } else {
        (base, s, false)
    };
    let allow_underscore = base0;
    let mut v: u64 = 0;
    let mut any = false;
    for &c in digits {
        if c == b'_' && allow_underscore {
            continue;
        }
        let d = char::from(c).to_digit(base)?;
        v = v.checked_mul(u64::from(base))?.checked_add(u64::from(d))?;
        any = true;
    }
    if allow_underscore && digits.contains(&b'_') && !underscore_ok(s) {
        return None;
    }
    if !(any || prefixed && base == 8 && digits.is_empty()) {
        return None;
    }
    Some(v)
}

/// Go's `underscoreOK`: `_` only between digits or after a base prefix.
fn underscore_ok(s: &[u8]) -> bool {
    let mut saw = b'^';
    let mut i = 0;
    let mut s = s;
    if let Some(&c) = s.first()
        && (c == b'-' || c == b'+')
    {
        s = &s[1..];
    }
    let mut hex = false;
    if s.len() >= 2 && s[0] == b'0' {
        let c = s[1].to_ascii_lowercase();
        if c == b'x' || c == b'o' || c == b'b' {
            hex = c == b'x';
            i = 2;
            saw = b'0';
        }
    }
    while i < s.len() {
        let c = s[i];
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
        i += 1;
    }
    saw != b'_'
}

/// Go's `strconv.ParseInt(s, base, 64)`.
fn parse_int(s: &[u8], base: u32) -> Option<i64> {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let u = parse_uint(digits, base)?;
    if neg {
        if u <= 1u64 << 63 {
            Some((u as i64).wrapping_neg())
        } else {
            None
        }
    } else {
        i64::try_from(u).ok()
    }
}

/// Go's `parseHexAddresses`: every `0x[0-9a-f]+` in `s`, as numbers.
fn parse_hex_addresses(
    s: &[u8],
    format: &'static str,
    line: usize,
) -> Result<Vec<u64>, LegacyError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < s.len() {
        if s[i] == b'0' && s.get(i + 1) == Some(&b'x') {
            let start = i + 2;
            let mut end = start;
            while end < s.len() && matches!(s[end], b'0'..=b'9' | b'a'..=b'f') {
                end += 1;
            }
            if end > start {
                let v =
                    parse_uint(&s[start..end], 16).ok_or_else(|| LegacyError::AddressOverflow {
                        format,
                        line,
                        text: lossy(&s[i..end]),
                    })?;
                out.push(v);
                i = end;
                continue;
            }
        }
        i += 1;
    }
    Ok(out)
}

/// Go's `scaleHeapSample`: unsamples a Poisson-sampled heap sample.
fn scale_heap_sample(count: i64, size: i64, rate: i64) -> (i64, i64) {
    if count == 0 || size == 0 {
        return (0, 0);
    }
    if rate <= 1 {
        return (count, size);
    }
    let avg_size = size as f64 / count as f64;
    let scale = 1.0 / (1.0 - (-avg_size / rate as f64).exp());
    ((count as f64 * scale) as i64, (size as f64 * scale) as i64)
}

/// Compiles a pattern from this module, or a pattern that never matches if
/// it were invalid (the unit tests check they all compile).
fn re(cell: &'static LazyLock<Regex>) -> &'static Regex {
    cell
}

macro_rules! pattern {
    ($name:ident, $p:expr) => {
        static $name: LazyLock<Regex> =
            LazyLock::new(|| Regex::new($p).unwrap_or_else(Regex::never));
    };
}
pub(crate) use pattern;

pattern!(LIB_RE, r"([.]so$|[.]so[._][0-9]+)");
pattern!(LOG_INFO_RE, r"^[^\[\]]+:[0-9]+]\s");
// Go's procMapsRE and briefMapsRE, expanded.
pattern!(
    PROC_MAPS_RE,
    r"^\s*(?:0x)?([[:xdigit:]]+)[\s-]?\s*(?:0x)?([[:xdigit:]]+):?(?:\s+([-rwxp]+))?(?:\s+([[:xdigit:]]+))?\s+[[:xdigit:]]+:[[:xdigit:]]+\s+[[:digit:]]+(?:\s+(\S+))?"
);
pattern!(
    BRIEF_MAPS_RE,
    r"^\s*(?:0x)?([[:xdigit:]]+)[\s-]?\s*(?:0x)?([[:xdigit:]]+):?(?:\s+([-rwxp]+))?(?:\s+(\S+))?(?:\s+\(@([[:xdigit:]]+)\))?(?:\s+([[:xdigit:]]+))?"
);

/// Go's `removeLoggingInfo`: strips a glog prefix (`file.cc:12] `).
fn remove_logging_info(line: &[u8]) -> &[u8] {
    match re(&LOG_INFO_RE).captures(line) {
        Some(c) => &line[c.end()..],
        None => line,
    }
}

/// Go's `strings.NewReplacer(attrs...).Replace(s)`: at each position the
/// first pair (in argument order) whose old string matches is replaced.
fn replace<'s>(s: &'s [u8], attrs: &[(Vec<u8>, Vec<u8>)]) -> Cow<'s, [u8]> {
    if attrs.is_empty() || !s.contains(&b'$') {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    'outer: while i < s.len() {
        for (old, new) in attrs {
            if !old.is_empty() && s[i..].starts_with(old) {
                out.extend_from_slice(new);
                i += old.len();
                continue 'outer;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    Cow::Owned(out)
}

/// Go's `parseProcMapsFromScanner`.
fn parse_proc_maps(s: &mut Scanner<'_>) -> Result<Vec<LMapping>, LegacyError> {
    let mut out = Vec::new();
    let mut attrs: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    while s.scan() {
        let line = replace(remove_logging_info(s.text()), &attrs);
        match parse_mapping_entry(&line) {
            Some(Some(m)) => out.push(m),
            Some(None) => {}
            None => {
                if let Some(eq) = line.iter().position(|&b| b == b'=') {
                    let mut k = b"$".to_vec();
                    k.extend_from_slice(go_trim_space(&line[..eq]));
                    attrs.push((k, go_trim_space(&line[eq + 1..]).to_vec()));
                }
            }
        }
    }
    s.check()?;
    Ok(out)
}

/// Go's `parseMappingEntry`: `None` if unrecognized, `Some(None)` for a
/// non-executable entry.
fn parse_mapping_entry(l: &[u8]) -> Option<Option<LMapping>> {
    let (start, end, perm, file, offset, build_id);
    if let Some(c) = re(&PROC_MAPS_RE).captures(l) {
        (start, end, perm, offset, file, build_id) =
            (c.str(1), c.str(2), c.str(3), c.str(4), c.str(5), &b""[..]);
    } else if let Some(c) = re(&BRIEF_MAPS_RE).captures(l) {
        (start, end, perm, file, offset, build_id) =
            (c.str(1), c.str(2), c.str(3), c.str(4), c.str(5), c.str(6));
    } else {
        return None;
    }
    if !perm.is_empty() && !perm.contains(&b'x') {
        return Some(None);
    }
    let mut m = LMapping {
        file: lossy(file),
        build_id: lossy(build_id),
        ..Default::default()
    };
    m.start = parse_uint(start, 16)?;
    m.limit = parse_uint(end, 16)?;
    if !offset.is_empty() {
        m.offset = parse_uint(offset, 16)?;
    }
    Some(Some(m))
}

const ALLOC_RX: &str = concat!(
    r"calloc|cfree|malloc|free|memalign|do_memalign|(__)?posix_memalign|pvalloc|valloc|realloc|",
    r"tcmalloc::.*|tc_calloc|tc_cfree|tc_malloc|tc_free|tc_memalign|tc_posix_memalign|tc_pvalloc|",
    r"tc_valloc|tc_realloc|tc_new|tc_delete|tc_newarray|tc_deletearray|tc_new_nothrow|",
    r"tc_newarray_nothrow|malloc_zone_malloc|malloc_zone_calloc|malloc_zone_valloc|",
    r"malloc_zone_realloc|malloc_zone_memalign|malloc_zone_free|runtime\..*|BaseArena::.*|",
    r"(::)?do_malloc_no_errno|(::)?do_malloc_pages|(::)?do_malloc|DoSampledAllocation|",
    r"MallocedMemBlock::MallocedMemBlock|_M_allocate|__builtin_(vec_)?delete|",
    r"__builtin_(vec_)?new|__gnu_cxx::new_allocator::allocate|__libc_malloc|",
    r"__malloc_alloc_template::allocate|allocate|cpp_alloc|operator new(\[\])?|",
    r"simple_alloc::allocate"
);
const ALLOC_SKIP_RX: &str = r"runtime\.panic|runtime\.reflectcall|runtime\.call[0-9]*";
const CPU_PROFILER_RX: &str = r"ProfileData::Add|ProfileData::prof_handler|CpuProfiler::prof_handler|__pthread_sighandler|__restore";
const LOCK_RX: &str = concat!(
    r"RecordLockProfileData|(base::)?RecordLockProfileData.*|(base::)?SubmitMutexProfileData.*|",
    r"(base::)?SubmitSpinLockProfileData.*|(base::Mutex::)?AwaitCommon.*|",
    r"(base::Mutex::)?Unlock.*|(base::Mutex::)?UnlockSlow.*|(base::Mutex::)?ReaderUnlock.*|",
    r"(base::MutexLock::)?~MutexLock.*|(Mutex::)?AwaitCommon.*|(Mutex::)?Unlock.*|",
    r"(Mutex::)?UnlockSlow.*|(Mutex::)?ReaderUnlock.*|(MutexLock::)?~MutexLock.*|",
    r"(SpinLock::)?Unlock.*|(SpinLock::)?SlowUnlock.*|(SpinLockHolder::)?~SpinLockHolder.*"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_patterns_compile() {
        for p in [&LIB_RE, &LOG_INFO_RE, &PROC_MAPS_RE, &BRIEF_MAPS_RE] {
            assert!(!re(p).is_never());
        }
        text::assert_patterns_compile();
        java::assert_patterns_compile();
    }

    #[test]
    fn go_number_parsing() {
        assert_eq!(parse_int(b"010", 0), Some(8));
        assert_eq!(parse_int(b"09", 0), None);
        assert_eq!(parse_int(b"0x1F", 0), Some(31));
        assert_eq!(parse_int(b"1_000", 0), Some(1000));
        assert_eq!(parse_int(b"1__0", 0), None);
        assert_eq!(parse_int(b"0", 0), Some(0));
        assert_eq!(parse_int(b"-9223372036854775808", 10), Some(i64::MIN));
        assert_eq!(parse_int(b"9223372036854775808", 10), None);
        assert_eq!(parse_int(b"1_0", 10), None);
        assert_eq!(parse_uint(b"ffffffffffffffff", 16), Some(u64::MAX));
        assert_eq!(parse_uint(b"10000000000000000", 16), None);
        assert_eq!(parse_uint(b"", 16), None);
    }

    #[test]
    fn trim_space_is_unicode_aware() {
        assert_eq!(go_trim_space(" \t a b\u{a0}".as_bytes()), b"a b");
        assert_eq!(go_trim_space(b"\xff "), b"\xff");
        assert_eq!(go_trim_space(b""), b"");
    }

    #[test]
    fn scanner_matches_bufio() {
        let mut s = Scanner::new(b"a\r\n\nb");
        let mut got = Vec::new();
        while s.scan() {
            got.push(s.text().to_vec());
        }
        assert_eq!(got, vec![b"a".to_vec(), b"".to_vec(), b"b".to_vec()]);
        assert_eq!(s.text(), b"");
        let long = vec![b'x'; MAX_LINE];
        let mut s = Scanner::new(&long);
        assert!(!s.scan());
        assert!(s.check().is_err());
    }

    #[test]
    fn hex_addresses() {
        assert_eq!(
            parse_hex_addresses(b"@ 0x1 0x0x2 0xAB 0xab", "t", 1),
            Ok(vec![1, 0, 0xab])
        );
        assert!(parse_hex_addresses(b"0x10000000000000000", "t", 1).is_err());
    }

    #[test]
    fn proc_maps_entries() {
        let m = parse_mapping_entry(b"00400000-00fcb000 r-xp 00000000 08:01 1234   /bin/x")
            .flatten()
            .expect("parses");
        assert_eq!(
            (m.start, m.limit, m.file.as_str()),
            (0x400000, 0xfcb000, "/bin/x")
        );
        let m = parse_mapping_entry(b"00400000-00fcb000: /home/x/main")
            .flatten()
            .expect("parses");
        assert_eq!(
            (m.start, m.limit, m.file.as_str()),
            (0x400000, 0xfcb000, "/home/x/main")
        );
        assert!(matches!(
            parse_mapping_entry(b"00400000-00fcb000 r--p 00000000 08:01 1234 /bin/x"),
            Some(None)
        ));
        assert!(parse_mapping_entry(b"cycles/second = 12").is_none());
    }

    #[test]
    fn replacer_and_logging_prefix() {
        let attrs = vec![
            (b"$a".to_vec(), b"X".to_vec()),
            (b"$ab".to_vec(), b"Y".to_vec()),
        ];
        assert_eq!(&*replace(b"1$ab2", &attrs), b"1Xb2");
        assert_eq!(remove_logging_info(b"foo.cc:12] 0-1: /x"), b"0-1: /x");
        assert_eq!(remove_logging_info(b"0-1: /x"), b"0-1: /x");
    }

    #[test]
    fn heap_scaling_matches_go() {
        assert_eq!(scale_heap_sample(1, 9216, 524288), (57, 528909));
        assert_eq!(scale_heap_sample(0, 1, 2), (0, 0));
        assert_eq!(scale_heap_sample(3, 7, 1), (3, 7));
    }
}
