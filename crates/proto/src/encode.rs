//! [`encode_write_request`]: a `WriteRequest` written straight from the
//! model.
//!
//! The ingester's WAL record is the protobuf `WriteRequest` of each write,
//! encoded once by the distributor and stored by each replica as received.
//! Building the prost message first copies every string, id and sample of
//! the batch into new allocations only to encode and drop them (12% of
//! the ingest benchmark's CPU, docs/benchmarks.md); this writes the same
//! bytes from the [`IngestBatch`](model::IngestBatch) itself.

use fathom_model as model;
use prost::encoding::{WireType, encode_key, encoded_len_varint, key_len};

/// Length of a length-delimited field with a payload of `len` bytes.
fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// Length of a repeated message field.
fn repeated_len<'a, T: 'a>(
    tag: u32,
    items: impl IntoIterator<Item = &'a T>,
    len: impl Fn(&T) -> usize,
) -> usize {
    items.into_iter().map(|x| delimited_len(tag, len(x))).sum()
}

/// A proto3 string or bytes field: omitted when empty.
fn bytes_len(tag: u32, b: &[u8]) -> usize {
    if b.is_empty() {
        0
    } else {
        delimited_len(tag, b.len())
    }
}

/// A proto3 int64 or uint64 field: omitted when zero.
fn varint_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v)
    }
}

/// Appends `v` as a varint, as prost's `encode_varint` does, inlined: a
/// record is mostly varints (frame and stack indexes), and the buffer is
/// sized up front.
#[inline]
fn encode_varint(mut v: u64, buf: &mut Vec<u8>) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_header(buf: &mut Vec<u8>, tag: u32, len: usize) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

fn put_bytes(buf: &mut Vec<u8>, tag: u32, b: &[u8]) {
    if !b.is_empty() {
        put_header(buf, tag, b.len());
        buf.extend_from_slice(b);
    }
}

fn put_varint(buf: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v, buf);
    }
}

fn label_len(name: &str, value: &str) -> usize {
    bytes_len(1, name.as_bytes()) + bytes_len(2, value.as_bytes())
}

fn sample_len(s: &model::Sample) -> usize {
    bytes_len(1, &s.stack.0) + varint_len(2, s.value as u64)
}

/// The samples' fields: format 4's columns when `stacks_len` (the packed
/// length of the positions) is given, else one message per sample.
fn samples_len(p: &model::Profile, stacks_len: Option<usize>) -> usize {
    match stacks_len {
        _ if p.samples.is_empty() => 0,
        Some(n) => delimited_len(8, n) + delimited_len(9, values_len(p)),
        None => repeated_len(7, &p.samples, sample_len),
    }
}

/// The packed length of a profile's sample values.
fn values_len(p: &model::Profile) -> usize {
    p.samples
        .iter()
        .map(|x| encoded_len_varint(x.value as u64))
        .sum()
}

fn profile_len(p: &model::Profile, profile_type: &str, stacks_len: Option<usize>) -> usize {
    bytes_len(1, &p.id.0)
        + bytes_len(2, profile_type.as_bytes())
        + p.labels
            .iter()
            .map(|(k, v)| delimited_len(3, label_len(k, v)))
            .sum::<usize>()
        + varint_len(4, p.time_nanos as u64)
        + varint_len(5, p.duration_nanos as u64)
        + varint_len(6, p.period as u64)
        + samples_len(p, stacks_len)
}

fn function_len(f: &model::Function) -> usize {
    bytes_len(1, f.name.as_bytes())
        + bytes_len(2, f.system_name.as_bytes())
        + bytes_len(3, f.filename.as_bytes())
        + varint_len(4, f.start_line as u64)
        + delimited_len(5, 16)
}

fn mapping_len(m: &model::Mapping) -> usize {
    varint_len(1, m.memory_start)
        + varint_len(2, m.memory_limit)
        + varint_len(3, m.file_offset)
        + bytes_len(4, m.filename.as_bytes())
        + bytes_len(5, m.build_id.as_bytes())
        + delimited_len(6, 16)
}

fn line_len(l: &model::Line) -> usize {
    bytes_len(1, &l.function.0) + varint_len(2, l.line as u64)
}

fn location_len(l: &model::Location) -> usize {
    bytes_len(1, &l.mapping.0)
        + varint_len(2, l.address)
        + repeated_len(3, &l.lines, line_len)
        + delimited_len(4, 16)
}

/// The order in which a format-3 record writes a table's locations and
/// stacks, and each stack's locations as that format writes them: indexes
/// into the record's locations, or `None` (by id, as format 2) when one of
/// them is not in the record. Shared by the encoder and the prost message
/// ([`crate::ingester::WriteRequest`]'s `From`).
///
/// When the table carries a [`model::FrameIndex`] that still describes it
/// (the pprof normalizer's), its order and indexes are taken as they are;
/// otherwise the maps' order, with each frame's location looked up.
pub(crate) struct StackFrames<'a> {
    pub(crate) locations: Vec<(&'a model::Id, &'a model::Location)>,
    pub(crate) stacks: Vec<(&'a model::Id, &'a model::Stack)>,
    /// Every stack's indexes, one after the other.
    indexes: std::borrow::Cow<'a, [u32]>,
    /// Per stack (in `stacks`' order): its range in `indexes` and the
    /// packed field's payload length, or `None`.
    frames: Vec<Option<(usize, usize, usize)>>,
}

impl<'a> StackFrames<'a> {
    pub(crate) fn new(s: &'a model::Symbols) -> Self {
        if let Some(fi) = s.frame_index.as_deref()
            && let Some(f) = Self::indexed(s, fi)
        {
            return f;
        }
        let index: Option<model::IdMap<u32>> = u32::try_from(s.locations.len()).ok().map(|_| {
            s.locations
                .keys()
                .enumerate()
                .map(|(i, id)| (*id, i as u32))
                .collect()
        });
        let n: usize = s.stacks.values().map(|st| st.locations.len()).sum();
        let mut indexes = Vec::with_capacity(n);
        let mut frames = Vec::with_capacity(s.stacks.len());
        for st in s.stacks.values() {
            let start = indexes.len();
            let mut packed = 0;
            let mut all = index.is_some();
            for l in &st.locations {
                match index.as_ref().and_then(|m| m.get(l)) {
                    Some(&i) => {
                        packed += encoded_len_varint(u64::from(i));
                        indexes.push(i);
                    }
                    None => {
                        all = false;
                        break;
                    }
                }
            }
            if all {
                frames.push(Some((start, indexes.len(), packed)));
            } else {
                indexes.truncate(start);
                frames.push(None);
            }
        }
        StackFrames {
            locations: s.locations.iter().collect(),
            stacks: s.stacks.iter().collect(),
            indexes: indexes.into(),
            frames,
        }
    }

    /// From `fi`, when it describes `s` ([`model::FrameIndex::resolve`]:
    /// the check is the lookups that fetch the entries): every stack by
    /// index.
    fn indexed(s: &'a model::Symbols, fi: &'a model::FrameIndex) -> Option<Self> {
        let model::ResolvedIndex { locations, stacks } = fi.resolve(s)?;
        let mut frames = Vec::with_capacity(fi.stacks.len());
        let mut start = 0;
        for &(_, end) in &fi.stacks {
            let end = end as usize;
            let packed = fi
                .indexes
                .get(start..end)?
                .iter()
                .map(|&i| encoded_len_varint(u64::from(i)))
                .sum();
            frames.push(Some((start, end, packed)));
            start = end;
        }
        Some(StackFrames {
            locations,
            stacks,
            indexes: std::borrow::Cow::Borrowed(&fi.indexes),
            frames,
        })
    }

    /// The format of a record of these stacks and samples `positions`:
    /// [`WRITE_FORMAT_HELD`](crate::WRITE_FORMAT_HELD) when it names a
    /// stack or a location it lacks (left out because the head it is
    /// written to holds them), else [`WRITE_FORMAT`](crate::WRITE_FORMAT).
    pub(crate) fn format(&self, positions: &SampleStacks) -> u32 {
        if self.frames.iter().any(Option::is_none) || positions.profiles.iter().any(Option::is_none)
        {
            crate::WRITE_FORMAT_HELD
        } else {
            crate::WRITE_FORMAT
        }
    }

    /// The indexes of the `k`th stack (in `stacks`' order), if it is
    /// written by index.
    pub(crate) fn indexes(&self, k: usize) -> Option<&[u32]> {
        let (start, end, _) = (*self.frames.get(k)?)?;
        self.indexes.get(start..end)
    }

    /// Every sample's stack of `profiles` as its position in `stacks`:
    /// what format 4 writes. A normalized pprof's samples mostly follow
    /// the order in which its stacks were made, so each sample first
    /// tries the position after the previous sample's (one comparison);
    /// only a sample elsewhere builds, once, and asks a map of the
    /// positions.
    pub(crate) fn sample_stacks(&self, profiles: &[model::Profile]) -> SampleStacks {
        let mut position: Option<model::IdMap<u32>> = None;
        let n = profiles.iter().map(|p| p.samples.len()).sum();
        let mut out = SampleStacks {
            positions: Vec::with_capacity(n),
            profiles: Vec::with_capacity(profiles.len()),
        };
        for p in profiles {
            let start = out.positions.len();
            let mut packed = 0;
            let mut next = 0usize;
            for x in &p.samples {
                let at = match self.stacks.get(next) {
                    Some((id, _)) if **id == x.stack => Some(next as u32),
                    _ => position
                        .get_or_insert_with(|| {
                            self.stacks
                                .iter()
                                .enumerate()
                                .map(|(i, (id, _))| (**id, i as u32))
                                .collect()
                        })
                        .get(&x.stack)
                        .copied(),
                };
                match at {
                    Some(i) => {
                        packed += encoded_len_varint(u64::from(i));
                        out.positions.push(i);
                        next = i as usize + 1;
                    }
                    None => break,
                }
            }
            if out.positions.len() - start == p.samples.len() {
                out.profiles
                    .push(Some((start, out.positions.len(), packed)));
            } else {
                out.positions.truncate(start);
                out.profiles.push(None);
            }
        }
        out
    }
}

/// Each profile's samples' stacks as positions among a record's stacks,
/// or `None` for a profile with a sample whose stack the record lacks
/// (written by id, as format 3: the receiver then refuses it).
pub(crate) struct SampleStacks {
    positions: Vec<u32>,
    /// Per profile: its range in `positions` and the packed length.
    profiles: Vec<Option<(usize, usize, usize)>>,
}

impl SampleStacks {
    /// The `k`th profile's positions and their packed length, if it is
    /// written by position.
    pub(crate) fn of(&self, k: usize) -> Option<(&[u32], usize)> {
        let (start, end, packed) = (*self.profiles.get(k)?)?;
        Some((self.positions.get(start..end)?, packed))
    }
}

fn stack_len(s: &model::Stack, frames: Option<(usize, usize, usize)>) -> usize {
    delimited_len(2, 16)
        + match frames {
            _ if s.locations.is_empty() => 0,
            Some((_, _, packed)) => delimited_len(4, packed),
            None => delimited_len(3, 16 * s.locations.len()),
        }
}

/// The bytes of `WriteRequest::from(b).encode_to_vec()` (format
/// [`WRITE_FORMAT`](crate::WRITE_FORMAT): every symbol with its id, stacks
/// naming the record's locations by index, samples as columns naming the
/// record's stacks by index), without
/// building the message: same fields, same order (the symbol maps'
/// iteration order), proto3 defaults omitted the way prost omits them.
/// An id is 16 bytes, never empty, so prost writes it too (it omits only
/// empty `bytes`).
pub fn encode_write_request(b: &model::IngestBatch) -> Vec<u8> {
    encode_write(&b.tenant, &b.profiles, &b.symbols)
}

/// [`encode_write_request`] of a batch given as its parts.
pub fn encode_write(
    tenant: &model::TenantId,
    profiles: &[model::Profile],
    s: &model::Symbols,
) -> Vec<u8> {
    let frames = StackFrames::new(s);
    let positions = frames.sample_stacks(profiles);
    let format = frames.format(&positions);
    let types: Vec<String> = profiles
        .iter()
        .map(|p| p.profile_type.to_string())
        .collect();
    let profile_lens: Vec<usize> = profiles
        .iter()
        .zip(&types)
        .enumerate()
        .map(|(k, (p, t))| profile_len(p, t, positions.of(k).map(|(_, n)| n)))
        .collect();
    let total = bytes_len(1, tenant.as_str().as_bytes())
        + repeated_len(2, &profile_lens, |&l| l)
        + repeated_len(3, s.functions.values(), function_len)
        + repeated_len(4, s.mappings.values(), mapping_len)
        + repeated_len(5, frames.locations.iter().map(|(_, l)| *l), location_len)
        + frames
            .stacks
            .iter()
            .zip(&frames.frames)
            .map(|((_, st), f)| delimited_len(6, stack_len(st, *f)))
            .sum::<usize>()
        + varint_len(7, u64::from(format));
    let mut buf = Vec::with_capacity(total);
    put_bytes(&mut buf, 1, tenant.as_str().as_bytes());
    for (k, ((p, t), &len)) in profiles.iter().zip(&types).zip(&profile_lens).enumerate() {
        put_header(&mut buf, 2, len);
        put_bytes(&mut buf, 1, &p.id.0);
        put_bytes(&mut buf, 2, t.as_bytes());
        for (k, v) in p.labels.iter() {
            put_header(&mut buf, 3, label_len(k, v));
            put_bytes(&mut buf, 1, k.as_bytes());
            put_bytes(&mut buf, 2, v.as_bytes());
        }
        put_varint(&mut buf, 4, p.time_nanos as u64);
        put_varint(&mut buf, 5, p.duration_nanos as u64);
        put_varint(&mut buf, 6, p.period as u64);
        match positions.of(k) {
            _ if p.samples.is_empty() => {}
            Some((at, packed)) => {
                put_header(&mut buf, 8, packed);
                for &i in at {
                    encode_varint(u64::from(i), &mut buf);
                }
                put_header(&mut buf, 9, values_len(p));
                for x in &p.samples {
                    encode_varint(x.value as u64, &mut buf);
                }
            }
            _ => {
                for x in &p.samples {
                    put_header(&mut buf, 7, sample_len(x));
                    put_bytes(&mut buf, 1, &x.stack.0);
                    put_varint(&mut buf, 2, x.value as u64);
                }
            }
        }
    }
    for (id, f) in &s.functions {
        put_header(&mut buf, 3, function_len(f));
        put_bytes(&mut buf, 1, f.name.as_bytes());
        put_bytes(&mut buf, 2, f.system_name.as_bytes());
        put_bytes(&mut buf, 3, f.filename.as_bytes());
        put_varint(&mut buf, 4, f.start_line as u64);
        put_bytes(&mut buf, 5, &id.0);
    }
    for (id, m) in &s.mappings {
        put_header(&mut buf, 4, mapping_len(m));
        put_varint(&mut buf, 1, m.memory_start);
        put_varint(&mut buf, 2, m.memory_limit);
        put_varint(&mut buf, 3, m.file_offset);
        put_bytes(&mut buf, 4, m.filename.as_bytes());
        put_bytes(&mut buf, 5, m.build_id.as_bytes());
        put_bytes(&mut buf, 6, &id.0);
    }
    for &(id, l) in &frames.locations {
        put_header(&mut buf, 5, location_len(l));
        put_bytes(&mut buf, 1, &l.mapping.0);
        put_varint(&mut buf, 2, l.address);
        for x in &l.lines {
            put_header(&mut buf, 3, line_len(x));
            put_bytes(&mut buf, 1, &x.function.0);
            put_varint(&mut buf, 2, x.line as u64);
        }
        put_bytes(&mut buf, 4, &id.0);
    }
    for (&(id, st), f) in frames.stacks.iter().zip(&frames.frames) {
        put_header(&mut buf, 6, stack_len(st, *f));
        put_bytes(&mut buf, 2, &id.0);
        if st.locations.is_empty() {
            continue;
        }
        match *f {
            Some((start, end, packed)) => {
                put_header(&mut buf, 4, packed);
                for &i in &frames.indexes[start..end] {
                    encode_varint(u64::from(i), &mut buf);
                }
            }
            None => {
                put_header(&mut buf, 3, 16 * st.locations.len());
                for l in &st.locations {
                    buf.extend_from_slice(&l.0);
                }
            }
        }
    }
    put_varint(&mut buf, 7, u64::from(format));
    debug_assert_eq!(buf.len(), total);
    buf
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ingester::WriteRequest;
    use prost::Message;

    /// A batch that exercises every field, zero and empty defaults,
    /// negative varints and multi-byte lengths.
    pub(crate) fn batch() -> model::IngestBatch {
        let mut symbols = model::Symbols::default();
        let long = "x".repeat(300);
        let f1 = symbols.add_function(model::Function {
            name: "main".into(),
            system_name: "_main".into(),
            filename: "main.c".into(),
            start_line: 12,
        });
        let f2 = symbols.add_function(model::Function {
            name: long.clone(),
            system_name: String::new(),
            filename: String::new(),
            start_line: -3,
        });
        let m = symbols.add_mapping(model::Mapping {
            memory_start: 0x400000,
            memory_limit: 0x500000,
            file_offset: 0,
            filename: "/bin/app".into(),
            build_id: "abcd".into(),
        });
        let l1 = symbols.add_location(model::Location {
            mapping: m,
            address: 0x401234,
            lines: vec![
                model::Line {
                    function: f2,
                    line: 7,
                },
                model::Line {
                    function: f1,
                    line: 0,
                },
            ],
        });
        let l2 = symbols.add_location(model::Location {
            mapping: model::Id::ZERO,
            address: 0,
            lines: vec![],
        });
        let st1 = symbols.add_stack(model::Stack {
            locations: vec![l1, l2],
        });
        let st2 = symbols.add_stack(model::Stack { locations: vec![] });
        let profile = |n: u64, value: i64| model::Profile {
            id: model::IdHasher::new("t").u64(n).finish(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
                .parse()
                .unwrap(),
            labels: model::Labels::from_pairs([("service_name", "app"), ("env", long.as_str())])
                .unwrap(),
            time_nanos: 1_700_000_000_000_000_000,
            duration_nanos: if n == 0 { 0 } else { 10_000_000_000 },
            period: -1,
            samples: vec![
                model::Sample { stack: st1, value },
                model::Sample {
                    stack: st2,
                    value: 0,
                },
            ],
        };
        model::IngestBatch {
            tenant: model::TenantId::new("team-a").unwrap(),
            profiles: vec![profile(0, 5), profile(1, -9), profile(2, i64::MAX)],
            symbols,
        }
    }

    /// A stack whose location the batch does not hold is written by id
    /// (format 2's field) and the rest by index; both read back.
    #[test]
    fn a_stack_outside_the_batch_keeps_its_ids() {
        let mut b = batch();
        let stray = model::Id([9; 16]);
        let st = b.symbols.add_stack(model::Stack {
            locations: vec![stray],
        });
        let rec = encode_write_request(&b);
        assert_eq!(rec, WriteRequest::from(&b).encode_to_vec());
        let w = WriteRequest::decode(&rec[..]).unwrap();
        let by_id: Vec<_> = w
            .stacks
            .iter()
            .filter(|s| !s.locations.is_empty())
            .collect();
        assert_eq!(by_id.len(), 1);
        assert_eq!(by_id[0].id, st.0.to_vec());
        assert!(w.stacks.iter().any(|s| !s.location_indexes.is_empty()));
        // The stray location is not defined, so the record is refused as
        // any dangling reference is, by both decoders.
        assert!(crate::decode_write_request(&rec).is_err());
        assert!(crate::decode_write_request_prost(&rec).is_err());
    }

    /// A profile with a sample whose stack the batch does not hold writes
    /// its samples by id (format 3's field), the others as columns; the
    /// record is refused by both decoders, as any dangling reference is.
    #[test]
    fn a_sample_outside_the_batch_keeps_its_id() {
        let mut b = batch();
        b.profiles[1].samples.push(model::Sample {
            stack: model::Id([7; 16]),
            value: 1,
        });
        let rec = encode_write_request(&b);
        assert_eq!(rec, WriteRequest::from(&b).encode_to_vec());
        let w = WriteRequest::decode(&rec[..]).unwrap();
        assert_eq!(w.profiles[1].samples.len(), 3);
        assert!(w.profiles[1].sample_stacks.is_empty());
        assert_eq!(w.profiles[0].sample_stacks.len(), 2);
        assert!(w.profiles[0].samples.is_empty());
        assert!(matches!(
            crate::decode_write_request(&rec),
            Err(crate::ConvertError::UnknownStack)
        ));
        assert!(crate::decode_write_request_prost(&rec).is_err());
    }

    /// The inlined varint writes prost's bytes for every length of varint.
    #[test]
    fn varints_as_prost_writes_them() {
        let mut values = vec![
            0,
            1,
            127,
            128,
            300,
            u64::from(u32::MAX),
            u64::MAX,
            (-3i64) as u64,
        ];
        values.extend((0..64).map(|b| 1u64 << b));
        values.extend((1..64).map(|b| (1u64 << b) - 1));
        for v in values {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            encode_varint(v, &mut ours);
            prost::encoding::encode_varint(v, &mut theirs);
            assert_eq!(ours, theirs, "{v}");
            assert_eq!(ours.len(), encoded_len_varint(v), "{v}");
        }
    }

    /// Samples in any order of their stacks (the order the stacks were
    /// made, backwards, one stack repeated, a frame index or none) are
    /// written by position and read back as themselves.
    #[test]
    fn sample_positions_in_any_order() {
        for indexed in [false, true] {
            let mut plain = batch();
            let mut b = if indexed {
                with_frame_index(plain.clone())
            } else {
                plain.clone()
            };
            let ids: Vec<model::Id> = StackFrames::new(&b.symbols)
                .stacks
                .iter()
                .map(|(id, _)| **id)
                .collect();
            assert_eq!(ids.len(), 2);
            let order = [0, 1, 1, 0, 0, 1, 0];
            b.profiles[0].samples = order
                .iter()
                .zip(1..)
                .map(|(&k, value)| model::Sample {
                    stack: ids[k],
                    value,
                })
                .collect();
            plain.profiles[0].samples = b.profiles[0].samples.clone();
            let rec = encode_write_request(&b);
            assert_eq!(rec, WriteRequest::from(&b).encode_to_vec());
            let w = WriteRequest::decode(&rec[..]).unwrap();
            let want: Vec<u32> = order.iter().map(|&k| k as u32).collect();
            assert_eq!(w.profiles[0].sample_stacks, want);
            assert_eq!(crate::decode_write_request(&rec).unwrap(), plain);
            assert_eq!(crate::decode_write_request_prost(&rec).unwrap(), plain);
        }
    }

    /// Format 4 is smaller than format 3 for the same batch: a sample
    /// costs two varints instead of a message with a 16-byte id.
    #[test]
    fn format4_is_smaller_than_format3() {
        let mut b = batch();
        let st = *b.symbols.stacks.keys().next().unwrap();
        b.profiles[0]
            .samples
            .extend((0..100).map(|value| model::Sample { stack: st, value }));
        let v4 = encode_write_request(&b);
        let v3 = crate::write_request_format3(&b).encode_to_vec();
        assert!(
            v4.len() + 100 * 18 < v3.len(),
            "{} / {}",
            v4.len(),
            v3.len()
        );
        assert_eq!(crate::decode_write_request(&v3).unwrap(), b);
        assert_eq!(crate::decode_write_request(&v4).unwrap(), b);
    }

    /// Format 3 is smaller than format 2 for the same batch: stacks cost a
    /// varint per frame instead of 16 bytes.
    #[test]
    fn format3_is_smaller_than_format2() {
        let mut b = batch();
        let deep: Vec<model::Id> = b
            .symbols
            .locations
            .keys()
            .copied()
            .cycle()
            .take(64)
            .collect();
        b.symbols.add_stack(model::Stack { locations: deep });
        let v3 = encode_write_request(&b);
        let v2 = crate::write_request_format2(&b).encode_to_vec();
        assert!(v3.len() + 60 * 15 < v2.len(), "{} / {}", v3.len(), v2.len());
        assert_eq!(crate::decode_write_request(&v2).unwrap(), b);
        assert_eq!(crate::decode_write_request(&v3).unwrap(), b);
    }

    /// `b`'s symbols with a frame index in an order of their own
    /// (locations and stacks reversed from the maps' order).
    fn with_frame_index(mut b: model::IngestBatch) -> model::IngestBatch {
        let s = &b.symbols;
        let mut locations: Vec<model::Id> = s.locations.keys().copied().collect();
        locations.reverse();
        let at = |l: &model::Id| locations.iter().position(|x| x == l).unwrap() as u32;
        let mut fi = model::FrameIndex {
            locations: locations.clone(),
            ..Default::default()
        };
        let mut stacks: Vec<_> = s.stacks.iter().collect();
        stacks.reverse();
        for (id, st) in stacks {
            fi.indexes.extend(st.locations.iter().map(at));
            fi.stacks.push((*id, fi.indexes.len() as u32));
        }
        assert!(fi.matches(s));
        b.symbols.frame_index = Some(std::sync::Arc::new(fi));
        b
    }

    /// A table's frame index decides the record's order, and the record
    /// reads back as the same batch; the prost message follows it too.
    #[test]
    fn a_frame_index_orders_the_record() {
        let plain = batch();
        let b = with_frame_index(plain.clone());
        let rec = encode_write_request(&b);
        assert_eq!(rec, WriteRequest::from(&b).encode_to_vec());
        assert_ne!(rec, encode_write_request(&plain), "a different order");
        assert_eq!(rec.len(), encode_write_request(&plain).len());
        let w = WriteRequest::decode(&rec[..]).unwrap();
        let order = &b.symbols.frame_index.as_ref().unwrap().locations;
        let written: Vec<_> = w.locations.iter().map(|l| l.id.clone()).collect();
        let want: Vec<_> = order.iter().map(|l| l.0.to_vec()).collect();
        assert_eq!(written, want);
        assert_eq!(crate::decode_write_request(&rec).unwrap(), plain);
        assert_eq!(crate::decode_write_request_prost(&rec).unwrap(), plain);
    }

    /// An index that no longer describes its table (a stack or location
    /// added, removed or swapped after it was built) is not used: the
    /// record is the one of the maps' order, complete.
    #[test]
    fn a_stale_frame_index_is_ignored() {
        let stale = |edit: fn(&mut model::Symbols)| {
            let mut b = batch();
            // A stack no sample uses, for the swap below.
            let l = *b.symbols.locations.keys().next().unwrap();
            // And a location no stack uses.
            b.symbols.add_location(model::Location {
                address: 76,
                ..Default::default()
            });
            b.symbols.add_stack(model::Stack {
                locations: vec![l; 5],
            });
            let mut b = with_frame_index(b);
            edit(&mut b.symbols);
            assert!(!b.symbols.frame_index.as_ref().unwrap().matches(&b.symbols));
            let rec = encode_write_request(&b);
            assert_eq!(rec, WriteRequest::from(&b).encode_to_vec());
            let mut plain = b.clone();
            plain.symbols.frame_index = None;
            assert_eq!(rec, encode_write_request(&plain));
            assert_eq!(crate::decode_write_request(&rec).unwrap(), plain);
        };
        stale(|s| {
            let l = *s.locations.keys().next().unwrap();
            s.add_stack(model::Stack { locations: vec![l] });
        });
        stale(|s| {
            let l = *s.locations.keys().next().unwrap();
            s.stacks.retain(|_, st| st.locations.len() != 5);
            s.add_stack(model::Stack {
                locations: vec![l, l, l],
            });
        });
        stale(|s| {
            s.add_location(model::Location {
                address: 77,
                ..Default::default()
            });
        });
        // Same counts, another location.
        stale(|s| {
            let unused = model::Location {
                address: 78,
                ..Default::default()
            };
            let gone = *s.locations.iter().find(|(_, l)| l.address == 76).unwrap().0;
            s.locations.remove(&gone);
            s.add_location(unused);
        });
    }

    #[test]
    fn same_bytes_as_the_prost_message() {
        let b = batch();
        let direct = encode_write_request(&b);
        assert_eq!(direct, WriteRequest::from(&b).encode_to_vec());
        // And it decodes back to the same batch.
        let back =
            model::IngestBatch::try_from(WriteRequest::decode(&direct[..]).unwrap()).unwrap();
        assert_eq!(back, b);
        let empty = model::IngestBatch {
            tenant: model::TenantId::new("t").unwrap(),
            profiles: vec![],
            symbols: model::Symbols::default(),
        };
        assert_eq!(
            encode_write_request(&empty),
            WriteRequest::from(&empty).encode_to_vec()
        );
    }
}
