//! Decoding raw bytes into a validated pprof [`pprof::Profile`].

use std::borrow::Cow;

use fathom_proto::pprof;

use crate::Limits;
use crate::gzip::{GunzipError, gunzip, is_gzip};
use crate::index::{IndexError, Indexes};
use crate::legacy::{self, LegacyError};
use crate::wire;

/// Why bytes could not be decoded as a profile.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The input has zero bytes (after decompression).
    #[error("the profile is empty (zero bytes)")]
    Empty,
    /// The gzip stream is corrupt or truncated.
    #[error("the gzip stream is corrupt or truncated: {0}")]
    Gzip(std::io::Error),
    /// The (decompressed) input is larger than allowed.
    #[error("the decompressed profile is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    /// Neither the protobuf decoder nor any legacy parser accepts the input.
    #[error(
        "not a pprof profile: not a valid protobuf ({protobuf}), and not any legacy text or binary format either"
    )]
    NotAProfile { protobuf: String },
    /// A legacy parser recognized the input but found it malformed.
    #[error("malformed legacy profile: {0}")]
    Legacy(LegacyError),
    /// Decoding would take more memory than allowed.
    #[error("the decoded profile would take more than the limit of {limit} bytes of memory")]
    DecodedTooLarge { limit: usize },
    /// A table of the profile is larger than allowed.
    #[error("the profile has {count} {what}; the limit is {limit}")]
    LimitExceeded {
        what: &'static str,
        count: usize,
        limit: usize,
    },
    /// The string table does not start with "".
    #[error("string_table[0] must be the empty string, found {0:?}")]
    StringTableStart(String),
    /// A string index is out of range.
    #[error("{what} refers to string {index}, but the string table has {len} entries")]
    StringIndex {
        what: String,
        index: i64,
        len: usize,
    },
    /// A mapping, location or function has the reserved id 0.
    #[error("{what} {index} has id 0, which pprof reserves")]
    ZeroId { what: &'static str, index: usize },
    /// Two mappings, locations or functions share an id.
    #[error("two {what}s have id {id}")]
    DuplicateId { what: &'static str, id: u64 },
    /// A sample has a different number of values than sample types.
    #[error("sample {sample} has {got} values, but the profile declares {want} sample types")]
    ValueCount {
        sample: usize,
        got: usize,
        want: usize,
    },
    /// A sample refers to a location that does not exist.
    #[error("sample {sample} refers to location {location}, which the profile does not define")]
    UnknownLocation { sample: usize, location: u64 },
    /// A location refers to a mapping that does not exist.
    #[error("location {location} refers to mapping {mapping}, which the profile does not define")]
    UnknownMapping { location: u64, mapping: u64 },
    /// A location line refers to a function that does not exist.
    #[error("location {location} refers to function {function}, which the profile does not define")]
    UnknownFunction { location: u64, function: u64 },
}

/// Decodes a profile: gzip'd or raw pprof protobuf, or any legacy format
/// `go tool pprof` reads (see the [`crate`] docs), then validates it.
///
/// - gzip input (magic `1f 8b`) is decompressed, all members, never past
///   [`Limits::max_decompressed_bytes`];
/// - the protobuf is read by a hand-written decoder into the prost types:
///   a first pass over the top-level framing checks the table sizes against
///   `limits` before anything is allocated (and gives every table its exact
///   capacity), and the memory committed while decoding is capped by
///   [`Limits::max_decoded_bytes`], so a small hostile input cannot
///   allocate without bound;
/// - a string that is not valid UTF-8 refuses the profile (an error that
///   names the byte offset): names are stored and served as UTF-8;
/// - if the bytes are not a valid protobuf profile, the legacy parsers are
///   tried in Go's order;
/// - the result is validated: string indices in range, string_table[0]
///   empty, ids non-zero and unique, every referenced location, mapping and
///   function defined (id 0 means "none" for a location's mapping and a
///   line's function), one value per sample type.
///
/// Never panics, whatever the input.
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<pprof::Profile, DecodeError> {
    let data: Cow<'_, [u8]> = if is_gzip(bytes) {
        Cow::Owned(
            gunzip(bytes, limits.max_decompressed_bytes).map_err(|e| match e {
                GunzipError::Corrupt(e) => DecodeError::Gzip(e),
                GunzipError::TooLarge => DecodeError::TooLarge {
                    limit: limits.max_decompressed_bytes,
                },
            })?,
        )
    } else {
        if bytes.len() > limits.max_decompressed_bytes {
            return Err(DecodeError::TooLarge {
                limit: limits.max_decompressed_bytes,
            });
        }
        Cow::Borrowed(bytes)
    };
    if data.is_empty() {
        return Err(DecodeError::Empty);
    }
    let protobuf_err = match decode_protobuf(&data, limits) {
        Ok(p) => match validate(&p, limits) {
            Ok(()) => return Ok(p),
            Err(e) => e,
        },
        Err(e @ (DecodeError::LimitExceeded { .. } | DecodeError::DecodedTooLarge { .. })) => {
            return Err(e);
        }
        Err(e) => e,
    };
    match legacy::parse(&data, limits) {
        Ok(p) => {
            validate(&p, limits)?;
            Ok(p)
        }
        // Not legacy either: report why it is not a valid protobuf profile
        // (a framing error, or the validation error of what did decode).
        Err(LegacyError::Unrecognized) => Err(protobuf_err),
        Err(e) => Err(DecodeError::Legacy(e)),
    }
}

/// Why [`decode_and_normalize`] refused a profile: what [`decode`] or
/// [`crate::normalize`] said.
#[derive(Debug, thiserror::Error)]
pub enum DecodeNormalizeError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Normalize(#[from] crate::NormalizeError),
}

/// [`decode`] then [`crate::normalize`], the same result for every input,
/// faster for a valid protobuf profile: its samples are normalized as they
/// are read from the bytes, one at a time (values and labels into vectors
/// reused from one sample to the next, location ids read from the wire
/// as the frames are), instead of first decoding each into vectors of its
/// own (the ingest path).
///
/// Anything the one pass does not accept (a framing or validation error,
/// a limit, a legacy text profile, too many series) goes through
/// [`decode`] and [`crate::normalize`], which decide and word the error.
pub fn decode_and_normalize(
    bytes: &[u8],
    limits: &Limits,
    opts: &crate::NormalizeOptions,
) -> Result<crate::Normalized, DecodeNormalizeError> {
    let data: Option<Cow<'_, [u8]>> = if is_gzip(bytes) {
        gunzip(bytes, limits.max_decompressed_bytes)
            .ok()
            .map(Cow::Owned)
    } else {
        (bytes.len() <= limits.max_decompressed_bytes).then_some(Cow::Borrowed(bytes))
    };
    if let Some(n) = data.and_then(|d| normalize_protobuf(&d, limits, opts)) {
        return Ok(n);
    }
    let p = decode(bytes, limits)?;
    Ok(crate::normalize(&p, opts)?)
}

/// The one pass of [`decode_and_normalize`]; `None` where [`decode`] or
/// [`crate::normalize`] would refuse `data` or read it another way.
fn normalize_protobuf(
    data: &[u8],
    limits: &Limits,
    opts: &crate::NormalizeOptions,
) -> Option<crate::Normalized> {
    if data.is_empty() {
        return None;
    }
    let counts = wire::prescan(data).ok()?;
    check_counts(&counts, limits).ok()?;
    let wire::Tables {
        profile: p,
        budget,
        strings,
        lines,
    } = wire::decode_tables(data, &counts, limits.max_decoded_bytes, true).ok()?;
    let lines = wire::LocationLines::Flat(&lines);
    // Everything but the samples, which are checked as they are read.
    let indexes =
        validate_with_strings(&p, lines, strings.len(), strings.first().copied(), limits).ok()?;
    // The frames are at most the sample bytes; what is reserved for them
    // up front stays within what is left of the decode budget.
    let frames = counts
        .sample_bytes
        .min(budget.left() / std::mem::size_of::<u32>());
    let mut samples = CheckedSamples {
        wire: wire::WireSamples::new(data, budget),
        strings: strings.len(),
    };
    let n = crate::normalize::Normalizer::new(
        &p,
        indexes,
        lines,
        &strings,
        opts,
        counts.samples,
        frames,
    );
    n.run(&mut samples).ok()
}

/// The samples of a profile's bytes, with the checks [`validate`] makes of
/// each that [`crate::normalize`] does not (every label's strings in
/// range; normalize checks value counts and locations).
struct CheckedSamples<'a> {
    wire: wire::WireSamples<'a>,
    strings: usize,
}

impl crate::normalize::Samples for CheckedSamples<'_> {
    type Stop = wire::LeftToDecode;
    type Ids<'s>
        = wire::PackedIds<'s>
    where
        Self: 's;
    fn next_sample(
        &mut self,
    ) -> Option<Result<crate::normalize::SampleRef<'_, wire::PackedIds<'_>>, Self::Stop>> {
        let strings = self.strings;
        let in_range = |i: i64| i == 0 || usize::try_from(i).is_ok_and(|i| i < strings);
        Some(match self.wire.next_sample()? {
            Ok(s)
                if s.label
                    .iter()
                    .all(|l| in_range(l.key) && in_range(l.str) && in_range(l.num_unit)) =>
            {
                Ok(s)
            }
            _ => Err(wire::LeftToDecode),
        })
    }
}

/// The table sizes [`wire::prescan`] counted, against `limits`.
fn check_counts(counts: &wire::Counts, limits: &Limits) -> Result<(), DecodeError> {
    check_limit("sample types", counts.sample_types, limits.max_sample_types)?;
    check_limit("samples", counts.samples, limits.max_samples)?;
    check_limit("mappings", counts.mappings, limits.max_mappings)?;
    check_limit("locations", counts.locations, limits.max_locations)?;
    check_limit("functions", counts.functions, limits.max_functions)?;
    check_limit("strings", counts.strings, limits.max_strings)
}

fn check_limit(what: &'static str, count: usize, limit: usize) -> Result<(), DecodeError> {
    if count > limit {
        return Err(DecodeError::LimitExceeded { what, count, limit });
    }
    Ok(())
}

fn decode_protobuf(data: &[u8], limits: &Limits) -> Result<pprof::Profile, DecodeError> {
    let not = |protobuf: String| DecodeError::NotAProfile { protobuf };
    let counts = wire::prescan(data).map_err(|e| not(e.to_string()))?;
    check_counts(&counts, limits)?;
    wire::decode_profile(data, &counts, limits.max_decoded_bytes).map_err(|e| match e {
        wire::WireError::Malformed(e) => not(e.to_string()),
        wire::WireError::TooBig => DecodeError::DecodedTooLarge {
            limit: limits.max_decoded_bytes,
        },
    })
}

/// Checks a profile's internal consistency and size (see [`decode`]).
///
/// [`decode`] already calls this; it is public for profiles built or
/// modified in memory.
pub fn validate(p: &pprof::Profile, limits: &Limits) -> Result<(), DecodeError> {
    validate_with_strings(
        p,
        wire::LocationLines::Own,
        p.string_table.len(),
        p.string_table.first().map(String::as_str),
        limits,
    )
    .map(drop)
}

/// [`validate`] of a profile whose string table is held apart (`len`
/// strings, the first `first`), as the one pass of
/// [`decode_and_normalize`] borrows it from the request's bytes (and
/// keeps the locations' lines in one vector: `lines`). Returns the id
/// indexes it built, for normalize.
fn validate_with_strings(
    p: &pprof::Profile,
    lines: wire::LocationLines<'_>,
    len: usize,
    first: Option<&str>,
    limits: &Limits,
) -> Result<Indexes, DecodeError> {
    check_limit("sample types", p.sample_type.len(), limits.max_sample_types)?;
    check_limit("samples", p.sample.len(), limits.max_samples)?;
    check_limit("mappings", p.mapping.len(), limits.max_mappings)?;
    check_limit("locations", p.location.len(), limits.max_locations)?;
    check_limit("functions", p.function.len(), limits.max_functions)?;
    check_limit("strings", len, limits.max_strings)?;
    if let Some(first) = first
        && !first.is_empty()
    {
        return Err(DecodeError::StringTableStart(first.to_owned()));
    }
    let check = |index: i64, what: &dyn Fn() -> String| -> Result<(), DecodeError> {
        if index == 0 || usize::try_from(index).is_ok_and(|i| i < len) {
            Ok(())
        } else {
            Err(DecodeError::StringIndex {
                what: what(),
                index,
                len,
            })
        }
    };
    for (i, st) in p.sample_type.iter().enumerate() {
        check(st.r#type, &|| format!("sample type {i}"))?;
        check(st.unit, &|| format!("the unit of sample type {i}"))?;
    }
    if let Some(pt) = &p.period_type {
        check(pt.r#type, &|| "the period type".to_owned())?;
        check(pt.unit, &|| "the period unit".to_owned())?;
    }
    check(p.drop_frames, &|| "drop_frames".to_owned())?;
    check(p.keep_frames, &|| "keep_frames".to_owned())?;
    check(p.default_sample_type, &|| "default_sample_type".to_owned())?;
    check(p.doc_url, &|| "doc_url".to_owned())?;
    for (i, &c) in p.comment.iter().enumerate() {
        check(c, &|| format!("comment {i}"))?;
    }
    for m in &p.mapping {
        check(m.filename, &|| format!("the file name of mapping {}", m.id))?;
        check(m.build_id, &|| format!("the build id of mapping {}", m.id))?;
    }
    for f in &p.function {
        check(f.name, &|| format!("the name of function {}", f.id))?;
        check(f.system_name, &|| {
            format!("the system name of function {}", f.id)
        })?;
        check(f.filename, &|| {
            format!("the file name of function {}", f.id)
        })?;
    }
    let indexes = Indexes::new(p).map_err(|(what, e)| match e {
        IndexError::Zero(index) => DecodeError::ZeroId { what, index },
        IndexError::Duplicate(id) => DecodeError::DuplicateId { what, id },
    })?;
    for (pos, l) in p.location.iter().enumerate() {
        if l.mapping_id != 0 && indexes.mappings.get(l.mapping_id).is_none() {
            return Err(DecodeError::UnknownMapping {
                location: l.id,
                mapping: l.mapping_id,
            });
        }
        for line in lines.of(&p.location, pos) {
            if line.function_id != 0 && indexes.functions.get(line.function_id).is_none() {
                return Err(DecodeError::UnknownFunction {
                    location: l.id,
                    function: line.function_id,
                });
            }
        }
    }
    let want = p.sample_type.len();
    for (i, s) in p.sample.iter().enumerate() {
        if s.value.len() != want {
            return Err(DecodeError::ValueCount {
                sample: i,
                got: s.value.len(),
                want,
            });
        }
        for &l in &s.location_id {
            if indexes.locations.get(l).is_none() {
                return Err(DecodeError::UnknownLocation {
                    sample: i,
                    location: l,
                });
            }
        }
        for (j, l) in s.label.iter().enumerate() {
            check(l.key, &|| format!("label {j} of sample {i}"))?;
            check(l.str, &|| format!("the value of label {j} of sample {i}"))?;
            check(l.num_unit, &|| {
                format!("the unit of label {j} of sample {i}")
            })?;
        }
    }
    Ok(indexes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NormalizeOptions, normalize};
    use prost::Message;

    fn tiny() -> pprof::Profile {
        pprof::Profile {
            sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
            sample: vec![pprof::Sample {
                location_id: vec![1],
                value: vec![5],
                label: vec![],
            }],
            location: vec![pprof::Location {
                id: 1,
                line: vec![pprof::Line {
                    function_id: 1,
                    line: 3,
                    column: 0,
                }],
                ..Default::default()
            }],
            function: vec![pprof::Function {
                id: 1,
                name: 3,
                ..Default::default()
            }],
            string_table: vec!["".into(), "cpu".into(), "nanoseconds".into(), "main".into()],
            ..Default::default()
        }
    }

    /// A head that holds `ids`, answering for generation 7.
    #[derive(Debug)]
    struct Head {
        ids: fathom_model::IdSet,
        asked: std::sync::atomic::AtomicUsize,
    }

    impl fathom_model::HeldStacks for Head {
        fn generation(&self) -> u64 {
            7
        }
        fn holds(&self, _series: &fathom_model::Labels, ids: &[fathom_model::Id]) -> Vec<bool> {
            self.asked
                .fetch_add(ids.len(), std::sync::atomic::Ordering::Relaxed);
            ids.iter().map(|id| self.ids.contains(id)).collect()
        }
    }

    /// Normalized against a head, a pprof's table leaves out the stacks
    /// the head holds; its samples still name them, and the table says
    /// which generation of the head it relies on.
    #[test]
    fn stacks_the_head_holds_are_left_out() {
        let mut p = tiny();
        for (id, line) in [(2, 9), (3, 11)] {
            p.location.push(pprof::Location {
                id,
                line: vec![pprof::Line {
                    function_id: 1,
                    line,
                    column: 0,
                }],
                ..Default::default()
            });
        }
        // Location 3 only in the stack the head will hold.
        for (stack, v) in [(vec![1, 3], 3), (vec![2], 4), (vec![1, 3], 1)] {
            p.sample.push(pprof::Sample {
                location_id: stack,
                value: vec![v],
                label: vec![],
            });
        }
        let raw = p.encode_to_vec();
        let limits = Limits::default();
        let plain = decode_and_normalize(&raw, &limits, &NormalizeOptions::default()).unwrap();
        assert_eq!(plain.symbols.stacks.len(), 3);
        assert_eq!(plain.symbols.relies_on, None);
        let sum =
            |n: &crate::Normalized| -> i64 { n.profiles[0].samples.iter().map(|s| s.value).sum() };
        assert_eq!(sum(&plain), 13);

        assert_eq!(plain.symbols.locations.len(), 3);
        // The head holds the two-frame stack (and, as a head does, its
        // locations and function).
        let two = plain.profiles[0]
            .samples
            .iter()
            .map(|s| s.stack)
            .find(|id| plain.symbols.stacks[id].locations.len() == 2)
            .unwrap();
        let head = std::sync::Arc::new(Head {
            ids: [two].into_iter().collect(),
            asked: Default::default(),
        });
        let opts = NormalizeOptions {
            held: Some(head.clone()),
            ..Default::default()
        };
        for n in [
            decode_and_normalize(&raw, &limits, &opts).unwrap(),
            normalize(&decode(&raw, &limits).unwrap(), &opts).unwrap(),
        ] {
            assert_eq!(n.symbols.stacks.len(), 2);
            assert!(!n.symbols.stacks.contains_key(&two));
            // Nor the location only that stack names; the rest as
            // without the head.
            assert_eq!(n.symbols.locations.len(), 2);
            for (id, l) in &n.symbols.locations {
                assert_eq!(plain.symbols.locations.get(id), Some(l));
            }
            assert_eq!(n.symbols.functions, plain.symbols.functions);
            assert!(n.profiles[0].samples.iter().any(|s| s.stack == two));
            assert_eq!(n.profiles, plain.profiles);
            assert_eq!(n.symbols.relies_on, Some(7));
            let fi = n.symbols.frame_index.as_deref().unwrap();
            assert!(
                fi.matches(&n.symbols),
                "the frame index describes the table"
            );
        }
        // Asked about each of the profile's stacks once, per pass.
        assert_eq!(head.asked.load(std::sync::atomic::Ordering::Relaxed), 6);

        // A head that holds none of them: nothing left out, nothing
        // relied on.
        let none = NormalizeOptions {
            held: Some(std::sync::Arc::new(Head {
                ids: Default::default(),
                asked: Default::default(),
            })),
            ..Default::default()
        };
        let n = decode_and_normalize(&raw, &limits, &none).unwrap();
        assert_eq!(n.symbols, plain.symbols);
        assert_eq!(n.symbols.relies_on, None);
    }

    #[test]
    fn round_trips_raw_and_gzip() {
        let raw = tiny().encode_to_vec();
        let p = decode(&raw, &Limits::default()).expect("decodes");
        assert_eq!(p, tiny());
        let gz = crate::encode::gzip(&raw);
        assert_eq!(decode(&gz, &Limits::default()).expect("decodes"), tiny());
    }

    /// A valid profile takes the one pass (and gets its result); one the
    /// validation refuses does not, whatever normalize alone would make of
    /// it, and gets decode's error.
    #[test]
    fn one_pass_takes_valid_profiles_only() {
        let opts = crate::NormalizeOptions::default();
        let limits = Limits::default();
        let raw = tiny().encode_to_vec();
        let one = normalize_protobuf(&raw, &limits, &opts).expect("the one pass");
        assert_eq!(one, crate::normalize(&tiny(), &opts).unwrap());
        assert_eq!(one.profiles[0].samples[0].value, 5);
        // A zero sample with a dangling location, and a label string out
        // of range: normalize would skip both; validation refuses them.
        let mut p = tiny();
        p.sample.push(pprof::Sample {
            location_id: vec![42],
            value: vec![0],
            label: vec![],
        });
        assert!(normalize_protobuf(&p.encode_to_vec(), &limits, &opts).is_none());
        let e = decode_and_normalize(&p.encode_to_vec(), &limits, &opts).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sample 1 refers to location 42, which the profile does not define"
        );
        let mut p = tiny();
        p.sample[0].label.push(pprof::Label {
            key: 1,
            num: 3,
            num_unit: 99,
            ..Default::default()
        });
        assert!(normalize_protobuf(&p.encode_to_vec(), &limits, &opts).is_none());
        assert!(matches!(
            decode_and_normalize(&p.encode_to_vec(), &limits, &opts),
            Err(DecodeNormalizeError::Decode(
                DecodeError::StringIndex { .. }
            ))
        ));
        // The samples' memory counts against the decode budget: the least
        // budget that decodes `tiny` refuses it with 63 more frames.
        let fits = |max_decoded_bytes| Limits {
            max_decoded_bytes,
            ..Limits::default()
        };
        let least = (0..4096)
            .find(|&n| decode(&raw, &fits(n)).is_ok())
            .expect("tiny decodes within 4 KiB");
        let small = fits(least);
        assert!(normalize_protobuf(&raw, &small, &opts).is_some());
        assert!(normalize_protobuf(&raw, &fits(least - 1), &opts).is_none());
        let mut p = tiny();
        p.sample[0].location_id = vec![1; 64];
        assert!(normalize_protobuf(&p.encode_to_vec(), &small, &opts).is_none());
        assert!(matches!(
            decode_and_normalize(&p.encode_to_vec(), &small, &opts),
            Err(DecodeNormalizeError::Decode(
                DecodeError::DecodedTooLarge { .. }
            ))
        ));
    }

    /// The one pass reads a sample's location ids from the wire as they
    /// come: one packed field, unpacked ids, or several fields mixing
    /// both all give the result of a full decode; a field that cuts a
    /// varint, or a varint too long, is left to the full decode, which
    /// refuses it.
    #[test]
    fn one_pass_reads_location_ids_however_they_are_sent() {
        let opts = crate::NormalizeOptions::default();
        let limits = Limits::default();
        let mut p = tiny();
        for id in [2, 300] {
            let mut l = p.location[0].clone();
            l.id = id;
            l.line[0].line = id as i64;
            p.location.push(l);
        }
        p.sample[0].location_id = vec![1, 300, 2];
        let want = crate::normalize(&p, &opts).unwrap();
        let packed = p.encode_to_vec();
        assert_eq!(
            normalize_protobuf(&packed, &limits, &opts).as_ref(),
            Some(&want)
        );
        // The profile without its sample, then one whose field 1 (the
        // ids) is written as `ids`; its value is 5, packed.
        let mut rest = p.clone();
        rest.sample.clear();
        let with_ids = |ids: &[u8]| {
            let mut sample = ids.to_vec();
            sample.extend_from_slice(&[0x12, 1, 5]);
            let mut b = rest.encode_to_vec();
            b.push(0x12);
            prost::encoding::encode_varint(sample.len() as u64, &mut b);
            b.extend_from_slice(&sample);
            b
        };
        // 300 is the varint ac 02.
        let unpacked = [0x08, 1, 0x08, 0xac, 0x02, 0x08, 2];
        let split = [0x0a, 1, 1, 0x0a, 3, 0xac, 0x02, 2];
        let mixed = [0x0a, 1, 1, 0x08, 0xac, 0x02, 0x0a, 0, 0x0a, 1, 2];
        for ids in [&unpacked[..], &split, &mixed] {
            let b = with_ids(ids);
            assert_eq!(decode(&b, &limits).unwrap(), p, "{ids:x?}");
            assert_eq!(
                normalize_protobuf(&b, &limits, &opts).as_ref(),
                Some(&want),
                "{ids:x?}"
            );
        }
        let cut_between_fields = [0x0a, 1, 0xac, 0x0a, 2, 0x02, 2];
        let cut_at_the_end = [0x0a, 3, 1, 2, 0xac];
        let mut too_long = vec![0x0a, 12, 1];
        too_long.extend_from_slice(&[0x80; 10]);
        too_long.push(1);
        for ids in [&cut_between_fields[..], &cut_at_the_end, &too_long] {
            let b = with_ids(ids);
            assert!(normalize_protobuf(&b, &limits, &opts).is_none(), "{ids:x?}");
            let e = decode_and_normalize(&b, &limits, &opts).unwrap_err();
            assert!(e.to_string().contains("bad packed varint"), "{ids:x?}: {e}");
        }
    }

    #[test]
    fn names_the_dangling_reference() {
        let mut p = tiny();
        p.sample[0].location_id = vec![99];
        let e = decode(&p.encode_to_vec(), &Limits::default()).expect_err("invalid");
        assert_eq!(
            e.to_string(),
            "sample 0 refers to location 99, which the profile does not define"
        );
        let mut p = tiny();
        p.location[0].line[0].function_id = 7;
        assert!(matches!(
            validate(&p, &Limits::default()),
            Err(DecodeError::UnknownFunction {
                location: 1,
                function: 7
            })
        ));
        // The one pass, which keeps the lines apart, checks them too.
        let raw = p.encode_to_vec();
        assert!(
            normalize_protobuf(&raw, &Limits::default(), &NormalizeOptions::default()).is_none()
        );
        assert!(matches!(
            decode_and_normalize(&raw, &Limits::default(), &NormalizeOptions::default()),
            Err(DecodeNormalizeError::Decode(DecodeError::UnknownFunction {
                location: 1,
                function: 7
            }))
        ));
        let mut p = tiny();
        p.location[0].mapping_id = 4;
        assert!(matches!(
            validate(&p, &Limits::default()),
            Err(DecodeError::UnknownMapping {
                location: 1,
                mapping: 4
            })
        ));
    }

    #[test]
    fn other_validation_errors() {
        let l = Limits::default();
        let mut p = tiny();
        p.function[0].name = 17;
        assert!(matches!(
            validate(&p, &l),
            Err(DecodeError::StringIndex { index: 17, .. })
        ));
        let mut p = tiny();
        p.sample[0].value.push(1);
        assert!(matches!(
            validate(&p, &l),
            Err(DecodeError::ValueCount {
                sample: 0,
                got: 2,
                want: 1
            })
        ));
        let mut p = tiny();
        p.string_table[0] = "x".into();
        assert!(matches!(
            validate(&p, &l),
            Err(DecodeError::StringTableStart(_))
        ));
        let mut p = tiny();
        p.location.push(p.location[0].clone());
        assert!(matches!(
            validate(&p, &l),
            Err(DecodeError::DuplicateId {
                what: "location",
                id: 1
            })
        ));
        let mut p = tiny();
        p.function[0].id = 0;
        assert!(matches!(
            validate(&p, &l),
            Err(DecodeError::ZeroId {
                what: "function",
                ..
            })
        ));
    }

    #[test]
    fn limits_apply_before_decoding() {
        let mut p = tiny();
        p.sample = vec![p.sample[0].clone(); 10];
        let limits = Limits {
            max_samples: 9,
            ..Limits::default()
        };
        assert!(matches!(
            decode(&p.encode_to_vec(), &limits),
            Err(DecodeError::LimitExceeded {
                what: "samples",
                count: 10,
                limit: 9
            })
        ));
        let limits = Limits {
            max_decoded_bytes: 500,
            ..Limits::default()
        };
        assert!(matches!(
            decode(&p.encode_to_vec(), &limits),
            Err(DecodeError::DecodedTooLarge { .. })
        ));
        let limits = Limits {
            max_decompressed_bytes: 3,
            ..Limits::default()
        };
        assert!(matches!(
            decode(&p.encode_to_vec(), &limits),
            Err(DecodeError::TooLarge { limit: 3 })
        ));
    }

    #[test]
    fn nested_amplification_is_bounded() {
        // 1 MiB of empty labels (2 bytes each) would decode to 16 MiB.
        let mut sample = vec![];
        for _ in 0..(1 << 19) {
            sample.extend_from_slice(&[0x1a, 0x00]);
        }
        let mut raw = vec![0x12];
        let mut len = sample.len();
        while len >= 0x80 {
            raw.push((len as u8) | 0x80);
            len >>= 7;
        }
        raw.push(len as u8);
        raw.extend_from_slice(&sample);
        let limits = Limits {
            max_decoded_bytes: 8 << 20,
            ..Limits::default()
        };
        assert!(matches!(
            decode(&raw, &limits),
            Err(DecodeError::DecodedTooLarge { .. })
        ));
    }

    #[test]
    fn invalid_utf8_is_refused() {
        let mut raw = tiny().encode_to_vec();
        let at = raw
            .windows(4)
            .position(|w| w == b"main")
            .expect("string present");
        raw[at] = 0xff;
        let err = decode(&raw, &Limits::default()).expect_err("invalid UTF-8");
        assert!(err.to_string().contains("UTF-8"), "{err}");
    }

    #[test]
    fn garbage_and_empty() {
        let l = Limits::default();
        assert!(matches!(decode(b"", &l), Err(DecodeError::Empty)));
        assert!(matches!(
            decode(b"hello world\n", &l),
            Err(DecodeError::NotAProfile { .. })
        ));
        assert!(matches!(
            decode(&[0x1f, 0x8b, 1, 2], &l),
            Err(DecodeError::Gzip(_))
        ));
    }
}
