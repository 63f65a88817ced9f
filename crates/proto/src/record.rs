//! A direct decoder of format-2, 3, 4 and 5 `WriteRequest`
//! records into an [`IngestBatch`](model::IngestBatch).
//!
//! Every replica of a write and every WAL replay decodes the record. prost
//! first builds the message (a `Vec<u8>` for every id: one per sample, per
//! line, per symbol; a `String` per label and profile type) and the
//! conversion then copies it into the model. This reads the wire bytes
//! once: ids straight into [`Id`]s, strings validated and copied once,
//! samples into their final vectors.
//!
//! It is an accelerator, not a second definition of the format: it
//! accepts only what it is sure of (format 2, 3 or 4, well-formed framing,
//! every id 16 bytes, every reference defined) and returns `None` for
//! anything else, and [`crate::decode_write_request`] then takes the prost
//! path, which decides (and words the error). Fields follow prost's rules:
//! unknown fields are skipped, a repeated field's occurrences append, a
//! singular field's last occurrence wins, and a known field with another
//! wire type is malformed. A test checks that both paths agree on
//! every record, including damaged ones.
//!
//! Format 5 is the one extension: a single process's ingester writes it
//! for its own WAL, naming stacks and locations its head already holds
//! without repeating them. Given that head, this decoder accepts such
//! references; without it, both paths read format 5 as format 4.

use fathom_model as model;
use model::Id;

/// One field of a message: its number and, by wire type, its value.
struct Field<'a> {
    number: u64,
    value: Value<'a>,
}

enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A fixed-size value (wire types 1 and 5): no field of the format
    /// has one, so it is only ever skipped.
    Fixed,
}

/// prost's varint: at most 10 bytes, the tenth no more than 1.
#[inline]
fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in 0..10 {
        let byte = *b.get(*pos)?;
        *pos += 1;
        if shift == 9 && byte > 1 {
            return None;
        }
        v |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of a message; `None` at the first framing error.
struct Fields<'a> {
    b: &'a [u8],
    pos: usize,
}

fn fields(b: &[u8]) -> Fields<'_> {
    Fields { b, pos: 0 }
}

impl<'a> Fields<'a> {
    /// The next field, `Ok(None)` at the end, `Err(())` if malformed.
    #[inline]
    fn next_field(&mut self) -> Result<Option<Field<'a>>, ()> {
        if self.pos >= self.b.len() {
            return Ok(None);
        }
        let key = varint(self.b, &mut self.pos).ok_or(())?;
        let number = key >> 3;
        if number == 0 || number > u64::from(u32::MAX >> 3) {
            return Err(());
        }
        let value = match key & 7 {
            0 => Value::Varint(varint(self.b, &mut self.pos).ok_or(())?),
            2 => {
                let len = varint(self.b, &mut self.pos).ok_or(())?;
                let start = self.pos;
                let end = usize::try_from(len)
                    .ok()
                    .and_then(|l| start.checked_add(l))
                    .filter(|&e| e <= self.b.len())
                    .ok_or(())?;
                self.pos = end;
                Value::Bytes(&self.b[start..end])
            }
            w @ (1 | 5) => {
                let n = if w == 1 { 8 } else { 4 };
                self.pos = self
                    .pos
                    .checked_add(n)
                    .filter(|&e| e <= self.b.len())
                    .ok_or(())?;
                Value::Fixed
            }
            // Groups (3, 4) and invalid wire types: left to prost.
            _ => return Err(()),
        };
        Ok(Some(Field { number, value }))
    }
}

/// Calls `f` for each field of `b`; `None` if the framing is bad or `f`
/// refuses a field.
#[inline]
fn each<'a>(b: &'a [u8], mut f: impl FnMut(Field<'a>) -> Option<()>) -> Option<()> {
    let mut it = fields(b);
    while let Some(field) = it.next_field().ok()? {
        f(field)?;
    }
    Some(())
}

impl<'a> Value<'a> {
    #[inline]
    fn varint(&self) -> Option<u64> {
        match self {
            Value::Varint(v) => Some(*v),
            _ => None,
        }
    }

    #[inline]
    fn bytes(&self) -> Option<&'a [u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    #[inline]
    fn str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }
}

#[inline]
fn id(b: &[u8]) -> Option<Id> {
    Id::from_slice(b)
}

/// The top-level fields of a record, by kind, in wire order.
#[derive(Default)]
struct Top<'a> {
    tenant: &'a str,
    format: u32,
    profiles: Vec<&'a [u8]>,
    functions: Vec<&'a [u8]>,
    mappings: Vec<&'a [u8]>,
    locations: Vec<&'a [u8]>,
    stacks: Vec<&'a [u8]>,
}

/// Appends the elements of a repeated varint field (packed, or one
/// element per occurrence as prost also accepts) to `out`, each as
/// `conv` makes it of the varint; `None` for another wire type or a bad
/// varint.
#[inline]
fn repeated_varints<T>(v: &Value<'_>, out: &mut Vec<T>, conv: impl Fn(u64) -> T) -> Option<()> {
    match v {
        Value::Varint(x) => out.push(conv(*x)),
        Value::Bytes(p) => {
            let mut pos = 0;
            while pos < p.len() {
                out.push(conv(varint(p, &mut pos)?));
            }
        }
        Value::Fixed => return None,
    }
    Some(())
}

/// A `Sample` message laid out as fathom's encoders write it: its 16-byte
/// stack id (field 1), then its value (field 2) unless it is 0, and
/// nothing else. The usual case, read without the general field loop
/// (a held stack's samples are most of a steady stream's records); any
/// other layout is `None`, and the field loop reads it (and decides).
/// Same result as the loop for every input it accepts.
#[inline]
fn sample_as_written(b: &[u8]) -> Option<(&[u8], i64)> {
    // Key of field 1, wire type 2, then the length 16.
    let (head, rest) = b.split_at_checked(18)?;
    if head[..2] != [0x0a, 16] {
        return None;
    }
    let stack = &head[2..];
    match rest {
        [] => Some((stack, 0)),
        // Key of field 2, wire type 0: the varint must end the message.
        [0x10, v @ ..] => {
            let mut pos = 0;
            let value = varint(v, &mut pos)?;
            (pos == v.len()).then_some((stack, value as i64))
        }
        _ => None,
    }
}

/// Decodes a format-2, 3 or 4 record (or 5 naming nothing it lacks), or
/// `None` (see the module docs).
pub(crate) fn decode_direct(record: &[u8]) -> Option<model::IngestBatch> {
    decode_skipping(record, |_| None)
}

/// The format version of an encoded `WriteRequest` (0 when absent), if
/// its top-level fields can be read.
pub(crate) fn format_of(record: &[u8]) -> Option<u32> {
    let mut format = 0;
    each(record, |f| {
        if f.number == 7 {
            // uint32: prost keeps the low 32 bits.
            format = f.value.varint()? as u32;
        }
        Some(())
    })?;
    Some(format)
}

/// [`decode_direct`], leaving out of the batch's symbols what
/// `known(tenant)` already holds: the record is read and checked all the
/// same (it is accepted or refused exactly as [`decode_direct`] does), and
/// every reference is checked against the record, never against `known`,
/// but for a format-5 record's: a sample may name by id a stack, and a
/// stack a location, that the record lacks and `known` holds.
///
/// `known` must be closed, as a head's table is: with a stack, it holds
/// the stack's locations, and with a location, its functions and mapping.
/// Then only the stacks need a lookup: a known stack brings nothing, and
/// only the locations of the new stacks, and the functions and mappings
/// of the new locations, are looked up and copied. In a steady stream
/// most stacks are known, so most of the record's symbols cost no lookup
/// in the (large) table at all. Symbols that no stack of the record
/// reaches are left out. Without `known` everything is copied.
pub(crate) fn decode_skipping<'k>(
    record: &[u8],
    known: impl FnOnce(&str) -> Option<&'k model::Symbols>,
) -> Option<model::IngestBatch> {
    decode_held(record, known, false)
}

/// [`decode_skipping`]; with `trusted`, a format-5 sample that names by id
/// a stack the record lacks is taken as held by `known` without a lookup
/// (its caller knows that head holds every such stack: see
/// [`crate::decode_write_request_held`]).
pub(crate) fn decode_held<'k>(
    record: &[u8],
    known: impl FnOnce(&str) -> Option<&'k model::Symbols>,
    trusted: bool,
) -> Option<model::IngestBatch> {
    let mut top = Top::default();
    each(record, |f| {
        match f.number {
            1 => top.tenant = f.value.str()?,
            2 => top.profiles.push(f.value.bytes()?),
            3 => top.functions.push(f.value.bytes()?),
            4 => top.mappings.push(f.value.bytes()?),
            5 => top.locations.push(f.value.bytes()?),
            6 => top.stacks.push(f.value.bytes()?),
            // uint32: prost keeps the low 32 bits.
            7 => top.format = f.value.varint()? as u32,
            _ => {}
        }
        Some(())
    })?;
    // Whether stacks may index locations (format 3 on), and samples
    // index stacks (format 4).
    let (indexed, columns) = match top.format {
        crate::WRITE_FORMAT | crate::WRITE_FORMAT_HELD => (true, true),
        crate::WRITE_FORMAT_V3 => (true, false),
        crate::WRITE_FORMAT_V2 => (false, false),
        _ => return None,
    };
    let tenant = model::TenantId::new(top.tenant).ok()?;
    let known = known(top.tenant);
    // Format 5 may name stacks and locations it lacks when `known` (the
    // head it was written to) holds them.
    let held = if top.format == crate::WRITE_FORMAT_HELD {
        known
    } else {
        None
    };
    let mut symbols = model::Symbols::default();
    if known.is_none() {
        symbols.functions.reserve(top.functions.len());
        symbols.mappings.reserve(top.mappings.len());
        symbols.locations.reserve(top.locations.len());
        symbols.stacks.reserve(top.stacks.len());
    }
    // Every table is read (and checked) first, borrowing its strings; what
    // is copied is decided once the stacks are known.
    let mut functions = Vec::with_capacity(top.functions.len());
    for b in top.functions {
        let (mut name, mut system_name, mut filename, mut start_line, mut fid) =
            ("", "", "", 0i64, &[][..]);
        each(b, |f| {
            match f.number {
                1 => name = f.value.str()?,
                2 => system_name = f.value.str()?,
                3 => filename = f.value.str()?,
                4 => start_line = f.value.varint()? as i64,
                5 => fid = f.value.bytes()?,
                _ => {}
            }
            Some(())
        })?;
        functions.push((id(fid)?, [name, system_name, filename], start_line));
    }
    let mut mappings = Vec::with_capacity(top.mappings.len());
    for b in top.mappings {
        let mut m = model::Mapping::default();
        let (mut filename, mut build_id, mut mid) = ("", "", &[][..]);
        each(b, |f| {
            match f.number {
                1 => m.memory_start = f.value.varint()?,
                2 => m.memory_limit = f.value.varint()?,
                3 => m.file_offset = f.value.varint()?,
                4 => filename = f.value.str()?,
                5 => build_id = f.value.str()?,
                6 => mid = f.value.bytes()?,
                _ => {}
            }
            Some(())
        })?;
        mappings.push((id(mid)?, m, filename, build_id));
    }
    // Location ids in wire order (what format 3's stacks index, and what
    // format 2's stacks must name), each location's mapping and address,
    // and its lines as a range of `lines`.
    let mut location_ids = Vec::with_capacity(top.locations.len());
    let mut locations = Vec::with_capacity(top.locations.len());
    let mut lines: Vec<model::Line> = Vec::new();
    for b in top.locations {
        let first = lines.len();
        let (mut mapping, mut lid, mut address) = (&[][..], &[][..], 0u64);
        each(b, |f| {
            match f.number {
                1 => mapping = f.value.bytes()?,
                2 => address = f.value.varint()?,
                3 => {
                    let (mut function, mut line) = (&[][..], 0i64);
                    each(f.value.bytes()?, |g| {
                        match g.number {
                            1 => function = g.value.bytes()?,
                            2 => line = g.value.varint()? as i64,
                            _ => {}
                        }
                        Some(())
                    })?;
                    lines.push(model::Line {
                        function: id(function)?,
                        line,
                    });
                }
                4 => lid = f.value.bytes()?,
                _ => {}
            }
            Some(())
        })?;
        location_ids.push(id(lid)?);
        locations.push((id(mapping)?, address, first..lines.len()));
    }
    // Format 2's stacks name locations by id: their positions, once one
    // does.
    let mut location_at: Option<model::IdMap<u32>> = None;
    // Every stack id of the record in wire order, known or not: what
    // format 4's samples index.
    let mut stack_ids = Vec::with_capacity(top.stacks.len());
    // Every stack's frames as positions among the record's locations,
    // one after another, and where each stack's end.
    let mut frames: Vec<u32> = Vec::new();
    let mut frame_ends: Vec<usize> = Vec::with_capacity(top.stacks.len());
    // The locations (by position) that a new stack names.
    let mut needed = vec![known.is_none(); location_ids.len()];
    for b in top.stacks {
        let (mut sid, mut packed, mut per_frame) = (&[][..], &[][..], false);
        let start = frames.len();
        each(b, |f| {
            match f.number {
                // Format 0's one-element-per-frame field: left to prost.
                1 => {
                    f.value.bytes()?;
                    per_frame = true;
                }
                2 => sid = f.value.bytes()?,
                3 => packed = f.value.bytes()?,
                // Format 3's indexes, packed or (as prost also accepts)
                // one varint per element; uint32 keeps the low 32 bits.
                // prost reads the field in every format.
                4 => repeated_varints(&f.value, &mut frames, |v| v as u32)?,
                _ => {}
            }
            Some(())
        })?;
        if !indexed {
            frames.truncate(start);
        }
        if per_frame || packed.len() % 16 != 0 || (!packed.is_empty() && frames.len() > start) {
            return None;
        }
        if !packed.is_empty() {
            let at = location_at.get_or_insert_with(|| {
                location_ids
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (*l, i as u32))
                    .collect()
            });
            for c in packed.chunks_exact(16) {
                let lid = id(c)?;
                let i = match at.get(&lid) {
                    Some(&i) => i,
                    // A location the head holds: given a position past
                    // the record's own, never copied (`needed` false).
                    None if held.is_some_and(|k| k.locations.contains_key(&lid)) => {
                        let i = u32::try_from(location_ids.len()).ok()?;
                        location_ids.push(lid);
                        needed.push(false);
                        at.insert(lid, i);
                        i
                    }
                    None => return None,
                };
                frames.push(i);
            }
        }
        if frames[start..]
            .iter()
            .any(|&i| i as usize >= location_ids.len())
        {
            return None;
        }
        stack_ids.push(id(sid)?);
        frame_ends.push(frames.len());
    }
    // Which stacks the head lacks, asked in one loop of lookups and
    // nothing else: in a large head each lookup misses the cache, and
    // with no other work between them the processor overlaps the misses.
    let keep: Vec<bool> = match known {
        None => vec![true; stack_ids.len()],
        Some(k) => stack_ids
            .iter()
            .map(|sid| !k.stacks.contains_key(sid))
            .collect(),
    };
    let mut start = 0;
    for ((&sid, &end), keep) in stack_ids.iter().zip(&frame_ends).zip(keep) {
        let positions = &frames[start..end];
        start = end;
        if !keep {
            continue;
        }
        let mut stack = Vec::with_capacity(positions.len());
        for &i in positions {
            stack.push(*location_ids.get(i as usize)?);
            *needed.get_mut(i as usize)? = true;
        }
        symbols
            .stacks
            .insert(sid, model::Stack { locations: stack });
    }
    // The record's stack ids as a set, for samples that name their stack
    // by id (formats 2 and 3): built at the first one.
    let mut by_id: Option<model::IdSet> = None;
    // The new stacks' locations that are new, then their functions and
    // mappings that are new.
    let mut new_functions = model::IdSet::default();
    let mut new_mappings = model::IdSet::default();
    for (i, (&lid, (mapping, address, range))) in location_ids.iter().zip(&locations).enumerate() {
        if !needed[i] || known.is_some_and(|k| k.locations.contains_key(&lid)) {
            continue;
        }
        let loc_lines = lines.get(range.clone())?;
        if known.is_some() {
            new_mappings.insert(*mapping);
            new_functions.extend(loc_lines.iter().map(|l| l.function));
        }
        symbols.locations.insert(
            lid,
            model::Location {
                mapping: *mapping,
                address: *address,
                lines: loc_lines.to_vec(),
            },
        );
    }
    for (fid, [name, system_name, filename], start_line) in functions {
        if known.is_none_or(|k| new_functions.contains(&fid) && !k.functions.contains_key(&fid)) {
            symbols.functions.insert(
                fid,
                model::Function {
                    name: name.to_owned(),
                    system_name: system_name.to_owned(),
                    filename: filename.to_owned(),
                    start_line,
                },
            );
        }
    }
    for (mid, mut m, filename, build_id) in mappings {
        if known.is_none_or(|k| new_mappings.contains(&mid) && !k.mappings.contains_key(&mid)) {
            m.filename = filename.to_owned();
            m.build_id = build_id.to_owned();
            symbols.mappings.insert(mid, m);
        }
    }
    let mut profiles = Vec::with_capacity(top.profiles.len());
    // Format 4's sample columns of one profile, and its samples as read,
    // reused.
    let (mut sample_stacks, mut sample_values) = (Vec::<u32>::new(), Vec::<i64>::new());
    let mut read = Vec::<model::Sample>::new();
    for b in top.profiles {
        let (mut pid, mut profile_type) = (&[][..], "");
        let (mut time_nanos, mut duration_nanos, mut period) = (0i64, 0i64, 0i64);
        let mut labels: Vec<(&str, &str)> = Vec::new();
        // Read into a reused vector, then copied into one of their number
        // (the head keeps it as it is): grown sample by sample, the
        // profile's own vector would be copied at every doubling and once
        // more when the head trims it, and counting the samples first
        // reads every field twice.
        read.clear();
        sample_stacks.clear();
        sample_values.clear();
        each(b, |f| {
            match f.number {
                1 => pid = f.value.bytes()?,
                2 => profile_type = f.value.str()?,
                3 => {
                    let (mut name, mut value) = ("", "");
                    each(f.value.bytes()?, |g| {
                        match g.number {
                            1 => name = g.value.str()?,
                            2 => value = g.value.str()?,
                            _ => {}
                        }
                        Some(())
                    })?;
                    labels.push((name, value));
                }
                4 => time_nanos = f.value.varint()? as i64,
                5 => duration_nanos = f.value.varint()? as i64,
                6 => period = f.value.varint()? as i64,
                7 => {
                    let b = f.value.bytes()?;
                    let (stack, value) = match sample_as_written(b) {
                        Some(s) => s,
                        None => {
                            let (mut stack, mut value) = (&[][..], 0i64);
                            each(b, |g| {
                                match g.number {
                                    1 => stack = g.value.bytes()?,
                                    2 => value = g.value.varint()? as i64,
                                    _ => {}
                                }
                                Some(())
                            })?;
                            (stack, value)
                        }
                    };
                    let stack = id(stack)?;
                    // Trusted, a stack the record lacks is the head's: no
                    // lookup in either (each would miss the cache).
                    if !(trusted && held.is_some()) {
                        let ids = by_id.get_or_insert_with(|| stack_ids.iter().copied().collect());
                        if !ids.contains(&stack)
                            && !held.is_some_and(|k| k.stacks.contains_key(&stack))
                        {
                            return None;
                        }
                    }
                    read.push(model::Sample { stack, value });
                }
                // prost reads the columns in every format; only format 4
                // has them.
                8 => repeated_varints(&f.value, &mut sample_stacks, |v| v as u32)?,
                9 => repeated_varints(&f.value, &mut sample_values, |v| v as i64)?,
                _ => {}
            }
            Some(())
        })?;
        if columns {
            if sample_stacks.len() != sample_values.len() {
                return None;
            }
            read.reserve(sample_stacks.len());
            for (&s, &value) in sample_stacks.iter().zip(&sample_values) {
                let stack = *stack_ids.get(s as usize)?;
                read.push(model::Sample { stack, value });
            }
        }
        let samples = read.as_slice().to_vec();
        profiles.push(model::Profile {
            id: id(pid)?,
            profile_type: profile_type.parse().ok()?,
            labels: model::Labels::from_pairs(labels).ok()?,
            time_nanos,
            duration_nanos,
            period,
            samples,
        });
    }
    Some(model::IngestBatch {
        tenant,
        profiles,
        symbols,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_write_request, decode_write_request_prost, encode_write_request};
    use prost::Message;

    /// Both decoders on `b`: the same batch, or both refuse.
    fn agree(b: &[u8]) -> bool {
        let fast = decode_write_request(b);
        let prost = decode_write_request_prost(b);
        assert_eq!(fast.is_ok(), prost.is_ok(), "{fast:?} / {prost:?}");
        assert_eq!(fast.ok(), prost.ok());
        let direct = decode_direct(b);
        // Leaving known symbols out accepts and refuses the same records,
        // and gives the rest.
        let known = half_known();
        let skipping = decode_skipping(b, |_| Some(&known));
        assert_eq!(skipping.is_some(), direct.is_some());
        if let (Some(all), Some(part)) = (&direct, &skipping) {
            assert_eq!(part.profiles, all.profiles);
            assert_eq!(part.symbols, new_part(&all.symbols, &known));
        }
        direct.is_some()
    }

    /// A closed part of the test batch's symbols, as a head holds them:
    /// its stacks with frames, every other one, with everything they reach.
    fn half_known() -> model::Symbols {
        let s = crate::encode::tests::batch().symbols;
        let mut stacks: Vec<_> = s
            .stacks
            .iter()
            .filter(|(_, st)| !st.locations.is_empty())
            .map(|(id, _)| *id)
            .collect();
        stacks.sort();
        s.subset(stacks.iter().step_by(2))
    }

    /// What skipping `known` leaves of `all`: what the stacks that `known`
    /// lacks reach, without what `known` holds.
    fn new_part(all: &model::Symbols, known: &model::Symbols) -> model::Symbols {
        let new: Vec<Id> = all
            .stacks
            .keys()
            .filter(|s| !known.stacks.contains_key(*s))
            .copied()
            .collect();
        minus(&all.subset(&new), known)
    }

    /// `all` without the entries whose ids `known` holds.
    fn minus(all: &model::Symbols, known: &model::Symbols) -> model::Symbols {
        fn without<V: Clone, W>(m: &model::IdMap<V>, k: &model::IdMap<W>) -> model::IdMap<V> {
            m.iter()
                .filter(|(id, _)| !k.contains_key(*id))
                .map(|(id, v)| (*id, v.clone()))
                .collect()
        }
        model::Symbols {
            stacks: without(&all.stacks, &known.stacks),
            locations: without(&all.locations, &known.locations),
            functions: without(&all.functions, &known.functions),
            mappings: without(&all.mappings, &known.mappings),
            frame_index: None,
            relies_on: None,
        }
    }

    /// The head holds what it skipped: applying the rest to it gives the
    /// whole table; a tenant without a table gets everything.
    #[test]
    fn skipping_leaves_out_what_is_known() {
        let mut b = crate::encode::tests::batch();
        let known = half_known();
        assert!(!known.stacks.is_empty() && !known.locations.is_empty());
        // A new stack through a known location and a new one, whose
        // function is new and whose mapping is known.
        let (&l1, old) = known
            .locations
            .iter()
            .find(|(_, l)| l.mapping != Id::ZERO)
            .unwrap();
        let f3 = b.symbols.add_function(model::Function {
            name: "new".into(),
            ..Default::default()
        });
        let l3 = b.symbols.add_location(model::Location {
            mapping: old.mapping,
            address: 0x9999,
            lines: vec![model::Line {
                function: f3,
                line: 1,
            }],
        });
        let st3 = b.symbols.add_stack(model::Stack {
            locations: vec![l3, l1],
        });
        b.profiles[0].samples.push(model::Sample {
            stack: st3,
            value: 5,
        });
        let rec = encode_write_request(&b);
        let part = decode_skipping(&rec, |t| (t == "team-a").then_some(&known)).unwrap();
        assert!(part.symbols.stacks.contains_key(&st3));
        assert!(part.symbols.locations.contains_key(&l3));
        assert!(part.symbols.functions.contains_key(&f3));
        assert!(!part.symbols.locations.contains_key(&l1));
        assert!(!part.symbols.mappings.contains_key(&old.mapping));
        assert!(part.symbols.stacks.len() < b.symbols.stacks.len());
        assert_eq!(part.symbols, new_part(&b.symbols, &known));
        assert_eq!(part.profiles, b.profiles);
        let mut head = known.clone();
        head.merge_owned(part.symbols);
        assert_eq!(head, b.symbols);
        // Nothing of a known stack is copied, however much of the record
        // it covers.
        let all_known = decode_skipping(&rec, |_| Some(&b.symbols)).unwrap();
        assert_eq!(all_known.symbols, model::Symbols::default());
        assert_eq!(all_known.profiles, b.profiles);
        let other = decode_skipping(&rec, |t| (t == "team-b").then_some(&known)).unwrap();
        assert_eq!(other, b);
        for old in [
            crate::write_request_format3(&b).encode_to_vec(),
            crate::write_request_format2(&b).encode_to_vec(),
        ] {
            let part = decode_skipping(&old, |_| Some(&known)).unwrap();
            assert_eq!(part.symbols, new_part(&b.symbols, &known));
            assert_eq!(part.profiles, b.profiles);
            assert!(part.symbols.locations.contains_key(&l3));
        }
    }

    /// Samples that name their stack by id land in a vector of their
    /// number (the head keeps it as it is), not of the next power of two.
    #[test]
    fn samples_by_id_are_decoded_into_a_vector_of_their_size() {
        let mut b = crate::encode::tests::batch();
        let stack = b.profiles[0].samples[0].stack;
        b.profiles[0].samples = (0..1000)
            .map(|value| model::Sample { stack, value })
            .collect();
        let rec = crate::write_request_format3(&b).encode_to_vec();
        let got = decode_direct(&rec).unwrap();
        assert_eq!(got.profiles, b.profiles);
        for p in &got.profiles {
            assert_eq!(p.samples.capacity(), p.samples.len());
        }
        // So do the columns' samples (format 4).
        let got = decode_direct(&encode_write_request(&b)).unwrap();
        assert_eq!(got.profiles, b.profiles);
        for p in &got.profiles {
            assert_eq!(p.samples.capacity(), p.samples.len());
        }
    }

    #[test]
    fn reads_records_directly() {
        let b = crate::encode::tests::batch();
        let rec = encode_write_request(&b);
        assert_eq!(decode_direct(&rec), Some(b.clone()));
        assert!(agree(&rec));
        let empty = model::IngestBatch {
            tenant: model::TenantId::new("t").unwrap(),
            profiles: vec![],
            symbols: model::Symbols::default(),
        };
        assert_eq!(
            decode_direct(&encode_write_request(&empty)),
            Some(empty.clone())
        );
        // prost's rules: unknown fields skipped (every wire type but
        // groups), the last tenant wins, repeated fields append.
        let mut more = rec.clone();
        more.extend_from_slice(b"\xc8\x06\x2a"); // field 89, varint
        more.extend_from_slice(b"\xd1\x06\x01\x02\x03\x04\x05\x06\x07\x08"); // field 90, fixed64
        more.extend_from_slice(b"\xdd\x06\x01\x02\x03\x04"); // field 91, fixed32
        more.extend_from_slice(b"\x0a\x06team-b"); // tenant again
        let got = decode_direct(&more).expect("read directly");
        assert_eq!(got.tenant.as_str(), "team-b");
        assert!(agree(&more));
        let twice = [rec.clone(), rec.clone()].concat();
        let got = decode_direct(&twice).expect("read directly");
        assert_eq!(got.profiles.len(), 2 * b.profiles.len());
        assert!(agree(&twice));
    }

    /// A record of what is left once a head's symbols are dropped is of
    /// format 5: it names the head's stack and location by id, and reads
    /// only against a head that holds them, giving back what the head
    /// lacked.
    #[test]
    fn format5_names_what_the_head_holds() {
        let mut b = crate::encode::tests::batch();
        let (two, leaf) = b
            .symbols
            .stacks
            .iter()
            .find(|(_, st)| st.locations.len() == 2)
            .map(|(id, st)| (*id, st.locations[1]))
            .unwrap();
        // A stack the head lacks, on a location it holds.
        let extra = b.symbols.add_stack(model::Stack {
            locations: vec![leaf],
        });
        b.profiles[0].samples.push(model::Sample {
            stack: extra,
            value: 3,
        });
        let head = b.symbols.subset([&two]);
        let mut left = b.clone();
        left.symbols.remove_held_by(&head);
        assert!(left.symbols.stacks.contains_key(&extra));
        assert!(!left.symbols.locations.contains_key(&leaf));
        let rec = encode_write_request(&left);
        let w = crate::ingester::WriteRequest::decode(&rec[..]).unwrap();
        assert_eq!(w.format_version, crate::WRITE_FORMAT_HELD);
        assert_eq!(rec, w.encode_to_vec(), "prost reads every field");

        // Without the head (or with one that lacks them): refused.
        assert_eq!(decode_direct(&rec), None);
        assert!(decode_write_request(&rec).is_err());
        let empty = model::Symbols::default();
        assert!(crate::decode_write_request_skipping(&rec, |_| Some(&empty)).is_err());
        // Against the head: the samples as written, the table the head
        // lacked.
        let got = crate::decode_write_request_skipping(&rec, |_| Some(&head)).unwrap();
        assert_eq!(got.profiles, b.profiles);
        let mut whole = head.clone();
        whole.merge_owned(got.symbols.clone());
        assert_eq!(whole, b.symbols);
        // Trusted (the head number says the head holds them), the same
        // batch without a lookup; untrusted, it is still looked up.
        let trusted = crate::decode_write_request_held(&rec, |_| Some(&head), true).unwrap();
        assert_eq!(trusted, got);
        assert!(crate::decode_write_request_held(&rec, |_| Some(&empty), false).is_err());
        // Only a format-5 record's samples are taken on trust: a format-4
        // record naming a stack it lacks is refused all the same.
        let mut v4 = crate::ingester::WriteRequest::from(&left);
        v4.format_version = crate::WRITE_FORMAT;
        let v4 = v4.encode_to_vec();
        assert!(crate::decode_write_request_held(&v4, |_| Some(&head), true).is_err());
    }

    #[test]
    fn leaves_format0_and_unknown_versions_to_prost() {
        let b = crate::encode::tests::batch();
        let v0 = crate::write_request_format0(&b).encode_to_vec();
        assert_eq!(decode_direct(&v0), None);
        assert_eq!(decode_write_request(&v0).unwrap(), b);
        let mut future = crate::ingester::WriteRequest::from(&b);
        future.format_version = crate::WRITE_FORMAT_HELD + 1;
        let future = future.encode_to_vec();
        assert_eq!(decode_direct(&future), None);
        assert!(matches!(
            decode_write_request(&future),
            Err(crate::ConvertError::FormatVersion { version: 6 })
        ));
    }

    /// A sample's fields in any layout prost reads (value first, an
    /// unknown field, a repeated field, the longest varint) give what
    /// prost gives, not only the layout the encoders write and
    /// [`sample_as_written`] takes; a broken one is refused by both.
    #[test]
    fn samples_in_any_layout_read_as_prost_reads_them() {
        use prost::encoding::encode_varint;
        let b = crate::encode::tests::batch();
        let stack = b.profiles[0].samples[0].stack;
        let mut req = crate::write_request_format3(&b);
        let mut profile = req.profiles.remove(0);
        profile.samples.clear();
        let (base, profile) = (req.encode_to_vec(), profile.encode_to_vec());
        let id = [&[0x0a, 16][..], &stack.0].concat();
        let layouts: [(Vec<u8>, Option<i64>); 9] = [
            ([&id[..], &[0x10, 5]].concat(), Some(5)),
            (id.clone(), Some(0)),
            ([&id[..], &[0x10, 0]].concat(), Some(0)),
            ([&[0x10, 5][..], &id].concat(), Some(5)),
            ([&id[..], &[0x10, 5, 0x18, 1]].concat(), Some(5)),
            ([&id[..], &[0x10, 5, 0x10, 7]].concat(), Some(7)),
            ([&id[..], &[0x10], &[0xff; 9], &[0x01]].concat(), Some(-1)),
            ([&id[..], &[0x10, 0x80]].concat(), None),
            ([&[0x0a, 15][..], &stack.0[..15], &[0x10, 5]].concat(), None),
        ];
        for (sample, want) in layouts {
            let mut p = profile.clone();
            p.push(7 << 3 | 2);
            encode_varint(sample.len() as u64, &mut p);
            p.extend_from_slice(&sample);
            let mut rec = base.clone();
            rec.push(2 << 3 | 2);
            encode_varint(p.len() as u64, &mut rec);
            rec.extend_from_slice(&p);
            assert_eq!(agree(&rec), want.is_some(), "{sample:02x?}");
            if let Some(value) = want {
                let got = decode_direct(&rec).unwrap();
                let last = got.profiles.last().unwrap();
                assert_eq!(
                    last.samples,
                    [model::Sample { stack, value }],
                    "{sample:02x?}"
                );
            }
        }
    }

    /// Every single-byte change and every truncation of a record: the
    /// direct decoder never accepts what prost refuses, and what it
    /// accepts equals prost's batch.
    #[test]
    fn agrees_with_prost_on_damaged_records() {
        let b = crate::encode::tests::batch();
        damage_agrees(&encode_write_request(&b));
        damage_agrees(&crate::write_request_format3(&b).encode_to_vec());
        damage_agrees(&crate::write_request_format2(&b).encode_to_vec());
    }

    fn damage_agrees(rec: &[u8]) {
        let rec = rec.to_vec();
        let mut direct = 0;
        let mut tried = 0;
        for i in 0..rec.len() {
            for v in [
                0x00,
                0xff,
                0x80,
                0x7f,
                rec[i] ^ 0x01,
                rec[i] ^ 0x08,
                rec[i] ^ 0x40,
            ] {
                let mut m = rec.clone();
                m[i] = v;
                tried += 1;
                direct += usize::from(agree(&m));
            }
        }
        for n in 0..rec.len() {
            tried += 1;
            direct += usize::from(agree(&rec[..n]));
        }
        // Some damage still decodes (a changed value, a skipped field):
        // the comparison covered accepted records, not only refusals.
        assert!(direct > 100, "{direct} of {tried} read directly");
        assert!(direct < tried);
    }
}
