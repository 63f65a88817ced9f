//! Folded ("collapsed") stacks: `root;...;leaf <value>` lines, as written by
//! FlameGraph's stackcollapse scripts and accepted by Pyroscope's
//! `/ingest?format=folded`.

use std::collections::HashMap;

use fathom_model::{
    Function, Id, Labels, Line, Location, Profile, ProfileType, Sample, Stack, Symbols,
};

use crate::Limits;
use crate::gzip::{GunzipError, gunzip, is_gzip};
use crate::normalize::{Normalized, profile_id};

/// How repeated lines of the same stack combine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Aggregation {
    /// Values of the same stack are added (the default).
    #[default]
    Sum,
    /// Values of the same stack are averaged (integer mean, rounded toward
    /// zero), like Pyroscope's `aggregationType=average`.
    Average,
}

/// How to interpret a folded upload (Pyroscope's `/ingest` parameters).
#[derive(Clone, Debug)]
pub struct FoldedOptions {
    /// Series labels of the profile, including `service_name`.
    pub labels: Labels,
    /// Pyroscope's app-name suffix (`cpu`, `inuse_space`, `mutex_count`,
    /// ...); when known it decides the profile type (see [`folded_profile_type`]).
    pub name_hint: Option<String>,
    /// Pyroscope's `units`: `samples` (the default), `objects`, `bytes`,
    /// `goroutines`, `lock_samples`, `lock_nanoseconds`.
    pub units: Option<String>,
    /// Sampling frequency in Hz for CPU-like profiles (default 100).
    pub sample_rate: Option<u32>,
    /// How repeated lines of one stack combine (Pyroscope's
    /// `aggregationType`).
    pub aggregation: Aggregation,
    /// The profile's timestamp; 0 leaves it for the caller to fill.
    pub time_nanos: i64,
    /// How long the profile covers, in nanoseconds (0 if unknown).
    pub duration_nanos: i64,
    /// Seeds the profile id, like [`crate::NormalizeOptions::profile_id_seed`].
    pub profile_id_seed: Id,
}

impl Default for FoldedOptions {
    fn default() -> Self {
        FoldedOptions {
            labels: Labels::new(),
            name_hint: None,
            units: None,
            sample_rate: None,
            aggregation: Aggregation::Sum,
            time_nanos: 0,
            duration_nanos: 0,
            profile_id_seed: Id::ZERO,
        }
    }
}

/// The default sampling frequency of folded CPU uploads, in Hz.
pub const DEFAULT_SAMPLE_RATE: u32 = 100;

/// Why folded text could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum FoldedError {
    /// The text (after decompression) is larger than allowed.
    #[error("the folded profile is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    /// The gzip stream is corrupt or truncated.
    #[error("the gzip stream is corrupt or truncated: {0}")]
    Gzip(std::io::Error),
    /// UTF-16 text (it has a byte-order mark) with an odd number of bytes.
    #[error("the text starts with a UTF-16 byte-order mark but has an odd number of bytes")]
    OddUtf16,
    /// A line has no value after its stack.
    #[error("line {line}: expected `frame;frame;... <value>`, found no value after the last space")]
    MissingValue { line: usize },
    /// A value is not a non-negative 64-bit integer.
    #[error("line {line}: the value {value:?} is not a non-negative integer")]
    InvalidValue { line: usize, value: String },
    /// `units` is not one Pyroscope defines.
    #[error(
        "unknown units {0:?}: use samples, objects, bytes, goroutines, lock_samples or lock_nanoseconds"
    )]
    UnknownUnits(String),
    /// `sample_rate` is zero.
    #[error("the sample rate must be at least 1 Hz")]
    ZeroSampleRate,
    /// Too many lines or distinct frames.
    #[error("the folded profile has more than {limit} {what}")]
    LimitExceeded { what: &'static str, limit: usize },
}

/// What a folded upload measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Values are samples taken at the sample rate, stored as time.
    Time,
    /// Values are stored as they are.
    Plain,
}

/// The profile type of a folded upload, and whether its values are samples
/// to be converted to nanoseconds (multiplied by `1e9 / sample_rate`).
///
/// A known `name_hint` decides first (Pyroscope's `convertMetadata`):
///
/// | hint | profile type | values |
/// |---|---|---|
/// | `cpu`, `itimer` | `process_cpu:cpu:nanoseconds:cpu:nanoseconds` | × period |
/// | `wall` | `wall:wall:nanoseconds:wall:nanoseconds` | × period |
/// | `inuse_objects`, `alloc_objects` | `memory:<hint>:count:space:bytes` | as is |
/// | `inuse_space`, `alloc_space` | `memory:<hint>:bytes:space:bytes` | as is |
/// | `alloc_in_new_tlab_objects`, `alloc_outside_tlab_objects` | `memory:<hint>:count:space:bytes` | as is |
/// | `alloc_in_new_tlab_bytes`, `alloc_outside_tlab_bytes` | `memory:<hint>:bytes:space:bytes` | as is |
/// | `live` | `memory:live:count:objects:count` | as is |
/// | `goroutines` | `goroutines:goroutine:count:goroutine:count` | as is |
/// | `mutex_count` | `mutex:contentions:count:contentions:count` | as is |
/// | `mutex_duration` | `mutex:delay:nanoseconds:contentions:count` | as is |
/// | `block_count`, `lock_count` | `block:contentions:count:contentions:count` | as is |
/// | `block_duration`, `lock_duration` | `block:delay:nanoseconds:contentions:count` | as is |
/// | `exceptions` | `exceptions:exceptions:count:exceptions:count` | as is |
///
/// Otherwise `units` decides:
///
/// | units | profile type | values |
/// |---|---|---|
/// | `samples` (default) | `process_cpu:cpu:nanoseconds:cpu:nanoseconds` | × period |
/// | `objects` | `memory:inuse_objects:count:space:bytes` | as is |
/// | `bytes` | `memory:inuse_space:bytes:space:bytes` | as is |
/// | `goroutines` | `goroutines:goroutine:count:goroutine:count` | as is |
/// | `lock_samples` | `mutex:contentions:count:contentions:count` | as is |
/// | `lock_nanoseconds` | `mutex:delay:nanoseconds:contentions:count` | as is |
///
/// The period is `1e9 / sample_rate` nanoseconds for time profiles and 1
/// otherwise.
pub fn folded_profile_type(
    name_hint: Option<&str>,
    units: Option<&str>,
) -> Result<(ProfileType, bool), FoldedError> {
    let t = |n: &str, st: &str, su: &str, pt: &str, pu: &str| ProfileType::new(n, st, su, pt, pu);
    let cpu = || {
        (
            t("process_cpu", "cpu", "nanoseconds", "cpu", "nanoseconds"),
            Kind::Time,
        )
    };
    let by_hint = match name_hint.unwrap_or("") {
        "cpu" | "itimer" => Some(cpu()),
        "wall" => Some((
            t("wall", "wall", "nanoseconds", "wall", "nanoseconds"),
            Kind::Time,
        )),
        h @ ("inuse_objects"
        | "alloc_objects"
        | "alloc_in_new_tlab_objects"
        | "alloc_outside_tlab_objects") => {
            Some((t("memory", h, "count", "space", "bytes"), Kind::Plain))
        }
        h @ ("inuse_space"
        | "alloc_space"
        | "alloc_in_new_tlab_bytes"
        | "alloc_outside_tlab_bytes") => {
            Some((t("memory", h, "bytes", "space", "bytes"), Kind::Plain))
        }
        "live" => Some((
            t("memory", "live", "count", "objects", "count"),
            Kind::Plain,
        )),
        "goroutines" => Some((
            t("goroutines", "goroutine", "count", "goroutine", "count"),
            Kind::Plain,
        )),
        "mutex_count" => Some((
            t("mutex", "contentions", "count", "contentions", "count"),
            Kind::Plain,
        )),
        "mutex_duration" => Some((
            t("mutex", "delay", "nanoseconds", "contentions", "count"),
            Kind::Plain,
        )),
        "block_count" | "lock_count" => Some((
            t("block", "contentions", "count", "contentions", "count"),
            Kind::Plain,
        )),
        "block_duration" | "lock_duration" => Some((
            t("block", "delay", "nanoseconds", "contentions", "count"),
            Kind::Plain,
        )),
        "exceptions" => Some((
            t("exceptions", "exceptions", "count", "exceptions", "count"),
            Kind::Plain,
        )),
        _ => None,
    };
    let (ty, kind) = match by_hint {
        Some(x) => x,
        None => match units.unwrap_or("samples") {
            "samples" | "" => cpu(),
            "objects" => (
                t("memory", "inuse_objects", "count", "space", "bytes"),
                Kind::Plain,
            ),
            "bytes" => (
                t("memory", "inuse_space", "bytes", "space", "bytes"),
                Kind::Plain,
            ),
            "goroutines" => (
                t("goroutines", "goroutine", "count", "goroutine", "count"),
                Kind::Plain,
            ),
            "lock_samples" => (
                t("mutex", "contentions", "count", "contentions", "count"),
                Kind::Plain,
            ),
            "lock_nanoseconds" => (
                t("mutex", "delay", "nanoseconds", "contentions", "count"),
                Kind::Plain,
            ),
            other => return Err(FoldedError::UnknownUnits(other.to_owned())),
        },
    };
    Ok((ty, kind == Kind::Time))
}

/// Converts UTF-16 text with a byte-order mark to UTF-8 and strips a UTF-8
/// byte-order mark; other input is returned as is.
fn to_utf8(text: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, FoldedError> {
    use std::borrow::Cow;
    let utf16 = |be: bool| -> Result<Cow<'_, [u8]>, FoldedError> {
        let body = &text[2..];
        if !body.len().is_multiple_of(2) {
            return Err(FoldedError::OddUtf16);
        }
        let units = body.chunks_exact(2).map(|c| {
            if be {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_le_bytes([c[0], c[1]])
            }
        });
        let s: String = char::decode_utf16(units)
            .map(|r| r.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect();
        Ok(Cow::Owned(s.into_bytes()))
    };
    match text {
        [0xff, 0xfe, ..] => utf16(false),
        [0xfe, 0xff, ..] => utf16(true),
        [0xef, 0xbb, 0xbf, rest @ ..] => Ok(Cow::Borrowed(rest)),
        _ => Ok(Cow::Borrowed(text)),
    }
}

/// Parses folded stacks into one profile (see [`folded_profile_type`] for
/// its type).
///
/// Format: one `frame;frame;...;leaf <value>` per line, root first. The
/// value is everything after the last space or tab and must be a
/// non-negative integer; frames are split on `;` and kept verbatim (spaces
/// included, empty frames included). `\r\n` line ends, blank lines and
/// lines starting with `#` are accepted; any other line without a valid
/// value is an error naming the line (1-based). Input may be gzip'd, UTF-8
/// (an optional BOM is stripped; invalid sequences become U+FFFD) or UTF-16
/// with a BOM. Lines of the same stack are summed or averaged, lines with
/// value 0 are dropped. Each frame becomes a function of that name with one
/// location (no mapping, address 0).
pub fn parse_folded(
    text: &[u8],
    opts: &FoldedOptions,
    limits: &Limits,
) -> Result<Normalized, FoldedError> {
    let limit = limits.max_decompressed_bytes;
    let decompressed;
    let text = if is_gzip(text) {
        decompressed = gunzip(text, limit).map_err(|e| match e {
            GunzipError::Corrupt(e) => FoldedError::Gzip(e),
            GunzipError::TooLarge => FoldedError::TooLarge { limit },
        })?;
        &decompressed[..]
    } else {
        if text.len() > limit {
            return Err(FoldedError::TooLarge { limit });
        }
        text
    };
    let text = to_utf8(text)?;

    let (profile_type, is_time) =
        folded_profile_type(opts.name_hint.as_deref(), opts.units.as_deref())?;
    let rate = opts.sample_rate.unwrap_or(DEFAULT_SAMPLE_RATE);
    if rate == 0 {
        return Err(FoldedError::ZeroSampleRate);
    }
    let period: i64 = if is_time {
        1_000_000_000 / i64::from(rate)
    } else {
        1
    };

    let mut symbols = Symbols::default();
    let mut frames: HashMap<&[u8], Id> = HashMap::new();
    let mut slot_of: HashMap<Id, usize> = HashMap::new();
    let mut stacks: Vec<Id> = Vec::new();
    let mut sums: Vec<i64> = Vec::new();
    let mut counts: Vec<i64> = Vec::new();
    let mut stack = Stack::default();
    let mut nlines = 0usize;

    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line_no = i + 1;
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = line.trim_ascii();
        if line.is_empty() || line[0] == b'#' {
            continue;
        }
        let Some(sep) = line.iter().rposition(|&b| b == b' ' || b == b'\t') else {
            return Err(FoldedError::MissingValue { line: line_no });
        };
        let (stack_text, value_text) = (&line[..sep], &line[sep + 1..]);
        let value = parse_value(value_text).ok_or_else(|| FoldedError::InvalidValue {
            line: line_no,
            value: String::from_utf8_lossy(value_text).into_owned(),
        })?;
        nlines += 1;
        if nlines > limits.max_samples {
            return Err(FoldedError::LimitExceeded {
                what: "lines",
                limit: limits.max_samples,
            });
        }
        if value == 0 {
            continue;
        }
        let stack_text = stack_text.trim_ascii_end();
        stack.locations.clear();
        for frame in stack_text.split(|&b| b == b';').rev() {
            let id = match frames.get(frame) {
                Some(&id) => id,
                None => {
                    if frames.len() >= limits.max_functions {
                        return Err(FoldedError::LimitExceeded {
                            what: "distinct frames",
                            limit: limits.max_functions,
                        });
                    }
                    let function = symbols.add_function(Function {
                        name: String::from_utf8_lossy(frame).into_owned(),
                        ..Default::default()
                    });
                    let id = symbols.add_location(Location {
                        mapping: Id::ZERO,
                        address: 0,
                        lines: vec![Line { function, line: 0 }],
                    });
                    frames.insert(frame, id);
                    id
                }
            };
            stack.locations.push(id);
        }
        let stack_id = stack.id();
        symbols
            .stacks
            .entry(stack_id)
            .or_insert_with(|| stack.clone());
        let value = value.saturating_mul(period);
        match slot_of.get(&stack_id) {
            Some(&s) => {
                sums[s] = sums[s].saturating_add(value);
                counts[s] += 1;
            }
            None => {
                slot_of.insert(stack_id, stacks.len());
                stacks.push(stack_id);
                sums.push(value);
                counts.push(1);
            }
        }
    }

    let samples: Vec<Sample> = stacks
        .iter()
        .zip(sums.iter().zip(&counts))
        .filter_map(|(&stack, (&sum, &count))| {
            let value = match opts.aggregation {
                Aggregation::Sum => sum,
                Aggregation::Average => sum / count.max(1),
            };
            (value != 0).then_some(Sample { stack, value })
        })
        .collect();
    let mut profiles = Vec::new();
    if !samples.is_empty() {
        let labels = opts.labels.clone();
        profiles.push(Profile {
            id: profile_id(
                &opts.profile_id_seed,
                &profile_type.to_string(),
                &labels.to_string(),
            ),
            profile_type,
            labels,
            time_nanos: opts.time_nanos,
            duration_nanos: opts.duration_nanos,
            period,
            samples,
        });
    }
    Ok(Normalized { profiles, symbols })
}

fn parse_value(s: &[u8]) -> Option<i64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

/// Folded lines of samples: `root;...;leaf` (inlined functions expanded,
/// see [`Symbols::frames`]) with summed values; equal strings summed, zero
/// sums dropped, sorted by string.
///
/// Accepts `(stack, value)` pairs, e.g.
/// `folded_lines(p.samples.iter().map(|s| (s.stack, s.value)), &symbols)`.
pub fn folded_lines(
    samples: impl IntoIterator<Item = (Id, i64)>,
    symbols: &Symbols,
) -> Vec<(String, i64)> {
    // Sum by stack first (cheap), then render each distinct stack once.
    let mut by_stack: HashMap<Id, i64> = HashMap::new();
    for (stack, value) in samples {
        let v = by_stack.entry(stack).or_insert(0);
        *v = v.wrapping_add(value);
    }
    let mut by_text: HashMap<String, i64> = HashMap::with_capacity(by_stack.len());
    for (stack, value) in by_stack {
        let v = by_text.entry(symbols.frames(&stack).join(";")).or_insert(0);
        *v = v.wrapping_add(value);
    }
    let mut out: Vec<(String, i64)> = by_text.into_iter().filter(|&(_, v)| v != 0).collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: &Normalized) -> Vec<(String, i64)> {
        let p = &n.profiles[0];
        folded_lines(p.samples.iter().map(|s| (s.stack, s.value)), &n.symbols)
    }

    fn plain() -> FoldedOptions {
        FoldedOptions {
            units: Some("objects".into()),
            ..Default::default()
        }
    }

    #[test]
    fn parses_and_sums() {
        let n = parse_folded(
            b"a;b;c 1\r\na;b;c 2\n\n# comment\na;b 5\nx y;z 0\n",
            &plain(),
            &Limits::default(),
        )
        .expect("parses");
        assert_eq!(lines(&n), vec![("a;b".into(), 5), ("a;b;c".into(), 3)]);
        let p = &n.profiles[0];
        assert_eq!(
            p.profile_type.to_string(),
            "memory:inuse_objects:count:space:bytes"
        );
        assert_eq!(p.period, 1);
    }

    #[test]
    fn cpu_values_become_nanoseconds() {
        let opts = FoldedOptions {
            sample_rate: Some(99),
            ..Default::default()
        };
        let n = parse_folded(b"main;work 3", &opts, &Limits::default()).expect("parses");
        let p = &n.profiles[0];
        assert_eq!(
            p.profile_type.to_string(),
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        );
        assert_eq!(p.period, 10_101_010);
        assert_eq!(lines(&n), vec![("main;work".into(), 30_303_030)]);
    }

    #[test]
    fn frames_may_contain_spaces() {
        let n = parse_folded(
            b"java;Interpreter [x];do it 7",
            &plain(),
            &Limits::default(),
        )
        .expect("parses");
        assert_eq!(lines(&n), vec![("java;Interpreter [x];do it".into(), 7)]);
    }

    #[test]
    fn average() {
        let opts = FoldedOptions {
            aggregation: Aggregation::Average,
            ..plain()
        };
        let n = parse_folded(b"a 1\na 4\nb 2\n", &opts, &Limits::default()).expect("parses");
        assert_eq!(lines(&n), vec![("a".into(), 2), ("b".into(), 2)]);
    }

    #[test]
    fn errors_name_the_line() {
        let e =
            parse_folded(b"a 1\nno-value\n", &plain(), &Limits::default()).expect_err("invalid");
        assert_eq!(
            e.to_string(),
            "line 2: expected `frame;frame;... <value>`, found no value after the last space"
        );
        assert!(matches!(
            parse_folded(b"a 1\nb 1.5\n", &plain(), &Limits::default()),
            Err(FoldedError::InvalidValue { line: 2, .. })
        ));
        assert!(matches!(
            parse_folded(b"a -1\n", &plain(), &Limits::default()),
            Err(FoldedError::InvalidValue { line: 1, .. })
        ));
        assert!(matches!(
            parse_folded(
                b"a 1",
                &FoldedOptions {
                    units: Some("parsecs".into()),
                    ..plain()
                },
                &Limits::default()
            ),
            Err(FoldedError::UnknownUnits(_))
        ));
        assert!(matches!(
            parse_folded(
                b"a 1",
                &FoldedOptions {
                    sample_rate: Some(0),
                    ..Default::default()
                },
                &Limits::default()
            ),
            Err(FoldedError::ZeroSampleRate)
        ));
        let tight = Limits {
            max_samples: 1,
            ..Limits::default()
        };
        assert!(matches!(
            parse_folded(b"a 1\nb 1\n", &plain(), &tight),
            Err(FoldedError::LimitExceeded { what: "lines", .. })
        ));
    }

    #[test]
    fn hints_and_units() {
        let ty = |h: Option<&str>, u: Option<&str>| {
            folded_profile_type(h, u)
                .map(|(t, time)| (t.to_string(), time))
                .ok()
        };
        assert_eq!(
            ty(None, None),
            Some(("process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(), true))
        );
        assert_eq!(
            ty(Some("block_duration"), Some("samples")),
            Some(("block:delay:nanoseconds:contentions:count".into(), false))
        );
        assert_eq!(
            ty(Some("myapp"), Some("lock_samples")),
            Some(("mutex:contentions:count:contentions:count".into(), false))
        );
        assert_eq!(
            ty(None, Some("goroutines")),
            Some(("goroutines:goroutine:count:goroutine:count".into(), false))
        );
        assert_eq!(
            ty(Some("alloc_space"), None),
            Some(("memory:alloc_space:bytes:space:bytes".into(), false))
        );
        assert_eq!(
            ty(Some("wall"), None),
            Some(("wall:wall:nanoseconds:wall:nanoseconds".into(), true))
        );
    }

    #[test]
    fn utf16_and_bom() {
        let text: Vec<u8> = [0xff, 0xfe]
            .into_iter()
            .chain("a;b 2\r\n".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        let n = parse_folded(&text, &plain(), &Limits::default()).expect("parses");
        assert_eq!(lines(&n), vec![("a;b".into(), 2)]);
        let n = parse_folded(b"\xef\xbb\xbfa 2", &plain(), &Limits::default()).expect("parses");
        assert_eq!(lines(&n), vec![("a".into(), 2)]);
        assert!(matches!(
            parse_folded(&[0xfe, 0xff, 0], &plain(), &Limits::default()),
            Err(FoldedError::OddUtf16)
        ));
    }
}
