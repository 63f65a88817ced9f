//! A hand-written protobuf decoder for `perftools.profiles.Profile`.
//!
//! It fills the prost-generated types, but decodes faster than prost:
//! a pre-scan counts the repeated fields (so [`Limits`](crate::Limits)
//! apply before anything is allocated and every vector gets its exact
//! capacity), packed fields are sized from their payload,  and a string that
//! is not valid UTF-8 makes the message malformed. Like Go's decoder and prost, it
//! accepts packed and unpacked repeated scalars, skips unknown fields and
//! merges repeated occurrences of a message field; groups are refused.

use fathom_proto::pprof;

/// What is wrong with the bytes, and where (an offset into the message
/// being read). Cheap to pass around; formatted only when reported.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bad {
    what: &'static str,
    field: u64,
    at: usize,
}

impl std::fmt::Display for Bad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field == 0 {
            write!(f, "{} at byte {}", self.what, self.at)
        } else {
            write!(
                f,
                "{} (field {}) at byte {}",
                self.what, self.field, self.at
            )
        }
    }
}

fn bad(what: &'static str, field: u64, at: usize) -> Bad {
    Bad { what, field, at }
}

/// One field of a message.
pub(crate) struct Field<'a> {
    pub(crate) number: u64,
    pub(crate) wire: u64,
    /// The value of a varint field.
    pub(crate) varint: u64,
    /// The payload of a length-delimited field.
    pub(crate) payload: &'a [u8],
}

#[inline]
fn read_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    // Most varints in a profile (ids, indices, small values) are one byte.
    if let Some(&byte) = b.get(*pos)
        && byte < 0x80
    {
        *pos += 1;
        return Some(u64::from(byte));
    }
    let mut v: u64 = 0;
    for shift in 0..10 {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << (7 * shift);
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Iterates over the fields of a message, checking the framing.
pub(crate) struct Fields<'a> {
    b: &'a [u8],
    pos: usize,
    failed: bool,
}

pub(crate) fn fields(b: &[u8]) -> Fields<'_> {
    Fields {
        b,
        pos: 0,
        failed: false,
    }
}

impl<'a> Fields<'a> {
    // Always inlined: every sample's fields are read through it, and a
    // call per field showed in profiles of the ingest path.
    #[inline(always)]
    fn field(&mut self) -> Result<Field<'a>, Bad> {
        let b = self.b;
        let at = self.pos;
        let key = read_varint(b, &mut self.pos).ok_or(bad("bad field key", 0, at))?;
        let (number, wire) = (key >> 3, key & 7);
        if number == 0 {
            return Err(bad("field number 0", 0, at));
        }
        let mut f = Field {
            number,
            wire,
            varint: 0,
            payload: &[],
        };
        match wire {
            0 => {
                f.varint = read_varint(b, &mut self.pos).ok_or(bad("bad varint", number, at))?;
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                self.pos = self
                    .pos
                    .checked_add(n)
                    .filter(|&p| p <= b.len())
                    .ok_or(bad("truncated fixed-size value", number, at))?;
            }
            2 => {
                let len = read_varint(b, &mut self.pos).ok_or(bad("bad length", number, at))?;
                let begin = self.pos;
                self.pos = usize::try_from(len)
                    .ok()
                    .and_then(|l| begin.checked_add(l))
                    .filter(|&p| p <= b.len())
                    .ok_or(bad("length runs past the end", number, at))?;
                f.payload = &b[begin..self.pos];
            }
            _ => {
                return Err(bad(
                    "unsupported wire type (groups are not allowed)",
                    number,
                    at,
                ));
            }
        }
        Ok(f)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, Bad>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.b.len() {
            return None;
        }
        let r = self.field();
        self.failed = r.is_err();
        Some(r)
    }
}

/// The number of elements of one occurrence of a repeated scalar field.
fn scalar_count(f: &Field<'_>) -> usize {
    if f.wire == 2 {
        varint_ends(f.payload)
    } else {
        1
    }
}

/// The varints that end in `b`: its bytes below 0x80. Eight bytes at a
/// time (a count byte by byte, as the compiler vectorizes it, was a fifth
/// of reading a sample in perf).
fn varint_ends(b: &[u8]) -> usize {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut words = b.chunks_exact(8);
    let mut n = 0;
    for w in &mut words {
        let Ok(w) = <[u8; 8]>::try_from(w) else {
            continue;
        };
        // One bit a byte that ends a varint, summed into the top byte.
        let ends = (!u64::from_le_bytes(w) & HIGH) >> 7;
        n += (ends.wrapping_mul(0x0101_0101_0101_0101) >> 56) as usize;
    }
    n + words.remainder().iter().filter(|&&c| c < 0x80).count()
}

/// Counts of the top-level repeated fields.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) sample_types: usize,
    pub(crate) samples: usize,
    /// The bytes of every sample message together: a bound on the frames
    /// the samples name (a location id takes at least one byte).
    pub(crate) sample_bytes: usize,
    pub(crate) mappings: usize,
    pub(crate) locations: usize,
    pub(crate) functions: usize,
    pub(crate) strings: usize,
}

/// Walks the top-level fields without allocating: checks their framing
/// and counts the repeated messages.
pub(crate) fn prescan(b: &[u8]) -> Result<Counts, Bad> {
    let mut c = Counts::default();
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => c.sample_types += 1,
            2 => {
                c.samples += 1;
                c.sample_bytes += f.payload.len();
            }
            3 => c.mappings += 1,
            4 => c.locations += 1,
            5 => c.functions += 1,
            6 => c.strings += 1,
            _ => {}
        }
    }
    Ok(c)
}

// Sizes of the decoded Rust structs, for the memory budget.
const SAMPLE_BYTES: usize = std::mem::size_of::<pprof::Sample>();
const LABEL_BYTES: usize = std::mem::size_of::<pprof::Label>();
const LOCATION_BYTES: usize = std::mem::size_of::<pprof::Location>();
const LINE_BYTES: usize = std::mem::size_of::<pprof::Line>();
const FUNCTION_BYTES: usize = std::mem::size_of::<pprof::Function>();
const MAPPING_BYTES: usize = std::mem::size_of::<pprof::Mapping>();
const STRING_BYTES: usize = std::mem::size_of::<String>();
const VALUE_TYPE_BYTES: usize = std::mem::size_of::<pprof::ValueType>();

/// Why decoding stopped.
pub(crate) enum WireError {
    /// The bytes are not a well-formed profile message.
    Malformed(Bad),
    /// Decoding would take more memory than allowed.
    TooBig,
}

impl From<Bad> for WireError {
    fn from(e: Bad) -> Self {
        WireError::Malformed(e)
    }
}

/// Tracks the memory a decode has committed to, against a limit.
pub(crate) struct Budget {
    used: usize,
    limit: usize,
}

impl Budget {
    /// Bytes still allowed.
    pub(crate) fn left(&self) -> usize {
        self.limit.saturating_sub(self.used)
    }

    #[inline]
    fn take(&mut self, bytes: usize) -> Result<(), WireError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(WireError::TooBig);
        }
        Ok(())
    }
}

#[inline]
fn want(f: &Field<'_>, wire: u64) -> Result<(), Bad> {
    if f.wire == wire {
        Ok(())
    } else if wire == 0 {
        Err(bad("expected a varint", f.number, 0))
    } else {
        Err(bad("expected a length-delimited value", f.number, 0))
    }
}

#[inline]
fn uint(f: &Field<'_>) -> Result<u64, Bad> {
    want(f, 0)?;
    Ok(f.varint)
}

#[inline]
fn int(f: &Field<'_>) -> Result<i64, Bad> {
    Ok(uint(f)? as i64)
}

/// Appends a repeated varint field occurrence, packed or not.
fn varints<T>(
    f: &Field<'_>,
    out: &mut Vec<T>,
    budget: &mut Budget,
    conv: impl Fn(u64) -> T,
) -> Result<(), WireError> {
    match f.wire {
        0 => {
            budget.take(std::mem::size_of::<T>())?;
            out.push(conv(f.varint));
        }
        2 => {
            let read = |out: &mut Vec<T>| -> Result<(), Bad> {
                let mut pos = 0;
                while pos < f.payload.len() {
                    let v = read_varint(f.payload, &mut pos).ok_or(bad(
                        "bad packed varint",
                        f.number,
                        pos,
                    ))?;
                    out.push(conv(v));
                }
                Ok(())
            };
            if out.capacity() - out.len() >= f.payload.len() {
                // A reused vector with room for any count (a varint takes
                // a byte at least): read first, then charge what was read,
                // without counting the payload first. Only the order of two
                // errors can differ, and the one-pass path that reuses its
                // vectors leaves the wording of errors to a full decode.
                let before = out.len();
                read(out)?;
                budget.take((out.len() - before) * std::mem::size_of::<T>())?;
            } else {
                let n = scalar_count(f);
                budget.take(n * std::mem::size_of::<T>())?;
                out.reserve_exact(n);
                read(out)?;
            }
        }
        _ => return Ok(want(f, 2)?),
    }
    Ok(())
}

fn value_type(b: &[u8], vt: &mut pprof::ValueType) -> Result<(), Bad> {
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => vt.r#type = int(&f)?,
            2 => vt.unit = int(&f)?,
            _ => {}
        }
    }
    Ok(())
}

fn label(b: &[u8]) -> Result<pprof::Label, Bad> {
    let mut l = pprof::Label::default();
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => l.key = int(&f)?,
            2 => l.str = int(&f)?,
            3 => l.num = int(&f)?,
            4 => l.num_unit = int(&f)?,
            _ => {}
        }
    }
    Ok(l)
}

fn sample(b: &[u8], budget: &mut Budget) -> Result<pprof::Sample, WireError> {
    let mut s = pprof::Sample::default();
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => varints(&f, &mut s.location_id, budget, |v| v)?,
            2 => varints(&f, &mut s.value, budget, |v| v as i64)?,
            3 => {
                want(&f, 2)?;
                budget.take(LABEL_BYTES)?;
                s.label.push(label(f.payload)?);
            }
            _ => {}
        }
    }
    Ok(s)
}

fn mapping(b: &[u8]) -> Result<pprof::Mapping, Bad> {
    let mut m = pprof::Mapping::default();
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => m.id = uint(&f)?,
            2 => m.memory_start = uint(&f)?,
            3 => m.memory_limit = uint(&f)?,
            4 => m.file_offset = uint(&f)?,
            5 => m.filename = int(&f)?,
            6 => m.build_id = int(&f)?,
            7 => m.has_functions = uint(&f)? != 0,
            8 => m.has_filenames = uint(&f)? != 0,
            9 => m.has_line_numbers = uint(&f)? != 0,
            10 => m.has_inline_frames = uint(&f)? != 0,
            _ => {}
        }
    }
    Ok(m)
}

fn line(b: &[u8]) -> Result<pprof::Line, Bad> {
    let mut l = pprof::Line::default();
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => l.function_id = uint(&f)?,
            2 => l.line = int(&f)?,
            3 => l.column = int(&f)?,
            _ => {}
        }
    }
    Ok(l)
}

/// A location; its lines go into `flat` when given (and the location's
/// own vector stays empty), else into the location.
fn location(
    b: &[u8],
    budget: &mut Budget,
    mut flat: Option<&mut Vec<pprof::Line>>,
) -> Result<pprof::Location, WireError> {
    let mut l = pprof::Location::default();
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => l.id = uint(&f)?,
            2 => l.mapping_id = uint(&f)?,
            3 => l.address = uint(&f)?,
            4 => {
                want(&f, 2)?;
                budget.take(LINE_BYTES)?;
                let ln = line(f.payload)?;
                match flat.as_deref_mut() {
                    Some(all) => all.push(ln),
                    None => l.line.push(ln),
                }
            }
            5 => l.is_folded = uint(&f)? != 0,
            _ => {}
        }
    }
    Ok(l)
}

fn function(b: &[u8]) -> Result<pprof::Function, Bad> {
    let mut x = pprof::Function::default();
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => x.id = uint(&f)?,
            2 => x.name = int(&f)?,
            3 => x.system_name = int(&f)?,
            4 => x.filename = int(&f)?,
            5 => x.start_line = int(&f)?,
            _ => {}
        }
    }
    Ok(x)
}

/// A string-table entry; invalid UTF-8 is refused (`at` is the entry's
/// offset in the message, for the error).
fn string(b: &[u8], at: usize) -> Result<&str, Bad> {
    std::str::from_utf8(b).map_err(|_| bad("string table entry is not valid UTF-8", 6, at))
}

/// Decodes a profile whose framing [`prescan`] accepted, with `counts`
/// from it, committing at most `max_bytes` of memory (estimated from the
/// sizes of the decoded structs and strings).
pub(crate) fn decode_profile(
    b: &[u8],
    counts: &Counts,
    max_bytes: usize,
) -> Result<pprof::Profile, WireError> {
    decode_tables(b, counts, max_bytes, false).map(|t| {
        let mut p = t.profile;
        p.string_table = t.strings.into_iter().map(str::to_owned).collect();
        p
    })
}

/// What [`decode_tables`] read: the profile without its string table
/// (and, when asked, without its samples or its locations' lines), the
/// budget left, the strings borrowed from the message and, when asked,
/// every location's lines in one vector.
pub(crate) struct Tables<'b> {
    pub(crate) profile: pprof::Profile,
    pub(crate) budget: Budget,
    pub(crate) strings: Vec<&'b str>,
    pub(crate) lines: FlatLines,
}

/// Every location's lines in one vector, in the order of the locations:
/// location `i`'s are `lines[ends[i - 1]..ends[i]]` (from 0 for the
/// first). One allocation for a profile instead of one a location.
#[derive(Default)]
pub(crate) struct FlatLines {
    pub(crate) lines: Vec<pprof::Line>,
    pub(crate) ends: Vec<usize>,
}

/// Where the lines of a profile's locations are.
#[derive(Clone, Copy)]
pub(crate) enum LocationLines<'a> {
    /// In each location (`pprof::Location::line`).
    Own,
    /// In one vector for all ([`FlatLines`]).
    Flat(&'a FlatLines),
}

impl<'a> LocationLines<'a> {
    /// The lines of the location at `pos` of `locations`.
    #[inline]
    pub(crate) fn of(self, locations: &'a [pprof::Location], pos: usize) -> &'a [pprof::Line] {
        match self {
            LocationLines::Own => locations.get(pos).map_or(&[], |l| &l.line),
            LocationLines::Flat(f) => {
                let start = match pos.checked_sub(1) {
                    Some(i) => f.ends.get(i).copied().unwrap_or(0),
                    None => 0,
                };
                let end = f.ends.get(pos).copied().unwrap_or(start);
                f.lines.get(start..end).unwrap_or(&[])
            }
        }
    }
}

/// [`decode_profile`]; also returns the budget. The string table is
/// returned apart, borrowed from `b` (checked UTF-8, one vector, no
/// allocation a string), and the profile's is left empty. For the one
/// pass of decode and normalize (`one_pass`), the samples (field 2) are
/// left on the wire (their memory is still counted up front, as
/// [`WireSamples`] then counts the rest) and the locations' lines are
/// returned apart, in one vector ([`FlatLines`]), each location's own
/// left empty.
pub(crate) fn decode_tables<'b>(
    b: &'b [u8],
    counts: &Counts,
    max_bytes: usize,
    one_pass: bool,
) -> Result<Tables<'b>, WireError> {
    let mut budget = Budget {
        used: 0,
        limit: max_bytes,
    };
    budget.take(
        counts.sample_types * VALUE_TYPE_BYTES
            + counts.samples * SAMPLE_BYTES
            + counts.mappings * MAPPING_BYTES
            + counts.locations * LOCATION_BYTES
            + counts.functions * FUNCTION_BYTES
            + counts.strings * STRING_BYTES,
    )?;
    let mut p = pprof::Profile {
        sample_type: Vec::with_capacity(counts.sample_types),
        sample: Vec::with_capacity(if one_pass { 0 } else { counts.samples }),
        mapping: Vec::with_capacity(counts.mappings),
        location: Vec::with_capacity(counts.locations),
        function: Vec::with_capacity(counts.functions),
        ..Default::default()
    };
    let mut strings = Vec::with_capacity(counts.strings);
    let mut flat = FlatLines::default();
    if one_pass {
        // Most locations have one line (more when calls are inlined).
        flat.lines.reserve(counts.locations);
        flat.ends.reserve(counts.locations);
    }
    for f in fields(b) {
        let f = f?;
        match f.number {
            1 => {
                want(&f, 2)?;
                let mut vt = pprof::ValueType::default();
                value_type(f.payload, &mut vt)?;
                p.sample_type.push(vt);
            }
            2 => {
                want(&f, 2)?;
                if !one_pass {
                    p.sample.push(sample(f.payload, &mut budget)?);
                }
            }
            3 => {
                want(&f, 2)?;
                p.mapping.push(mapping(f.payload)?);
            }
            4 => {
                want(&f, 2)?;
                let apart = one_pass.then_some(&mut flat.lines);
                p.location.push(location(f.payload, &mut budget, apart)?);
                if one_pass {
                    flat.ends.push(flat.lines.len());
                }
            }
            5 => {
                want(&f, 2)?;
                p.function.push(function(f.payload)?);
            }
            6 => {
                want(&f, 2)?;
                budget.take(f.payload.len())?;
                let at = (f.payload.as_ptr() as usize).saturating_sub(b.as_ptr() as usize);
                strings.push(string(f.payload, at)?);
            }
            7 => p.drop_frames = int(&f)?,
            8 => p.keep_frames = int(&f)?,
            9 => p.time_nanos = int(&f)?,
            10 => p.duration_nanos = int(&f)?,
            11 => {
                want(&f, 2)?;
                // A repeated message field merges, as in prost.
                value_type(
                    f.payload,
                    p.period_type.get_or_insert_with(Default::default),
                )?;
            }
            12 => p.period = int(&f)?,
            13 => varints(&f, &mut p.comment, &mut budget, |v| v as i64)?,
            14 => p.default_sample_type = int(&f)?,
            15 => p.doc_url = int(&f)?,
            _ => {}
        }
    }
    Ok(Tables {
        profile: p,
        budget,
        strings,
        lines: flat,
    })
}

/// Why the one pass of decode and normalize stopped reading a sample:
/// the bytes are not what [`decode_profile`] accepts, or not within its
/// budget. The full decode then decides, and words the error.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeftToDecode;

impl From<WireError> for LeftToDecode {
    fn from(_: WireError) -> Self {
        LeftToDecode
    }
}

impl From<Bad> for LeftToDecode {
    fn from(_: Bad) -> Self {
        LeftToDecode
    }
}

/// A sample's location ids still packed as varints, read one at a time
/// by the sample loop as it needs them (decoding them into a vector
/// first, then reading that back, was a store and a load a frame).
pub(crate) struct PackedIds<'s> {
    b: &'s [u8],
    pos: usize,
}

impl Iterator for PackedIds<'_> {
    type Item = Result<u64, LeftToDecode>;

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.b.len() {
            return None;
        }
        Some(read_varint(self.b, &mut self.pos).ok_or(LeftToDecode))
    }
}

/// Whether `payload`, one packed field, ends with a whole varint (or is
/// empty): the condition for appending another field's payload to it.
fn ends_whole(payload: &[u8]) -> bool {
    payload.last().is_none_or(|&c| c < 0x80)
}

/// The values a sample's reused vector has room for from the start.
const VALUES_ROOM: usize = 64;

/// The samples of a profile read one at a time from its bytes (no
/// allocation per sample, and the bytes are read in order), charging the
/// same memory budget as [`decode_profile`]. A sample's values and
/// labels go into vectors reused from one sample to the next; its
/// location ids are left packed on the wire ([`PackedIds`]).
pub(crate) struct WireSamples<'a> {
    fields: Fields<'a>,
    budget: Budget,
    value: Vec<i64>,
    label: Vec<pprof::Label>,
    /// The location ids of a sample that sent them other than as one
    /// packed field (unpacked, or in several fields), packed together.
    joined: Vec<u8>,
}

impl<'a> WireSamples<'a> {
    /// The samples of `b`, which [`decode_tables`] read without them and
    /// left `budget`.
    pub(crate) fn new(b: &'a [u8], budget: Budget) -> Self {
        WireSamples {
            fields: fields(b),
            budget,
            // Room for any sample's packed values but the rare long one
            // (a varint takes a byte at least), so that `varints` reads
            // them without counting them first.
            value: Vec::with_capacity(VALUES_ROOM),
            label: Vec::new(),
            joined: Vec::new(),
        }
    }

    /// The next sample; `Some(Err)` where [`decode_profile`] fails, or
    /// would once the sample's location ids are read (a bad varint among
    /// them stops that read instead).
    pub(crate) fn next_sample(
        &mut self,
    ) -> Option<Result<crate::normalize::SampleRef<'_, PackedIds<'_>>, LeftToDecode>> {
        loop {
            let f = match self.fields.next()? {
                Ok(f) => f,
                Err(_) => return Some(Err(LeftToDecode)),
            };
            if f.number != 2 {
                continue;
            }
            if f.wire != 2 {
                return Some(Err(LeftToDecode));
            }
            return Some(self.sample(f.payload));
        }
    }

    fn sample(
        &mut self,
        b: &'a [u8],
    ) -> Result<crate::normalize::SampleRef<'_, PackedIds<'_>>, LeftToDecode> {
        self.value.clear();
        self.label.clear();
        let mut ids: &'a [u8] = &[];
        let mut joined = false;
        for f in fields(b) {
            let f = f?;
            match f.number {
                1 => {
                    if f.wire == 2 && ids.is_empty() && !joined {
                        ids = f.payload;
                        continue;
                    }
                    if f.wire != 0 && f.wire != 2 {
                        return Err(LeftToDecode);
                    }
                    // Rare: the ids are joined into one packed run, each
                    // field whole (a varint cut at a field's end is an
                    // error, not the start of the next field's).
                    if !joined {
                        if !ends_whole(ids) {
                            return Err(LeftToDecode);
                        }
                        self.joined.clear();
                        self.joined.extend_from_slice(ids);
                        joined = true;
                    }
                    if f.wire == 0 {
                        prost::encoding::encode_varint(f.varint, &mut self.joined);
                    } else if ends_whole(f.payload) {
                        self.joined.extend_from_slice(f.payload);
                    } else {
                        return Err(LeftToDecode);
                    }
                }
                2 => varints(&f, &mut self.value, &mut self.budget, |v| v as i64)?,
                3 => {
                    want(&f, 2)?;
                    self.budget.take(LABEL_BYTES)?;
                    self.label.push(label(f.payload)?);
                }
                _ => {}
            }
        }
        let packed = if joined { &self.joined[..] } else { ids };
        // One id a varint's last byte: what a full decode's vector of
        // ids takes, charged as it would be.
        let frames = varint_ends(packed);
        self.budget.take(frames * std::mem::size_of::<u64>())?;
        Ok(crate::normalize::SampleRef {
            locations: PackedIds { b: packed, pos: 0 },
            frames,
            value: &self.value,
            label: &self.label,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn prescan_sums_the_sample_bytes_that_bound_the_frames() {
        let p = sample_profile();
        let bytes = p.encode_to_vec();
        let c = prescan(&bytes).unwrap();
        let each: Vec<usize> = p.sample.iter().map(|s| s.encoded_len()).collect();
        assert_eq!(c.samples, p.sample.len());
        assert_eq!(c.sample_bytes, each.iter().sum::<usize>());
        let frames: usize = p.sample.iter().map(|s| s.location_id.len()).sum();
        assert!(
            frames <= c.sample_bytes,
            "{frames} frames in {} bytes",
            c.sample_bytes
        );
    }

    /// The count of varints in a packed field, eight bytes at a time,
    /// agrees with reading them, for every length and any varint end.
    #[test]
    fn varint_ends_counts_what_reading_finds() {
        let mut b = Vec::new();
        for (i, v) in [1u64, 300, 0, 1 << 40, 127, 128, u64::MAX, 5, 16_383, 16_384]
            .into_iter()
            .cycle()
            .take(41)
            .enumerate()
        {
            prost::encoding::encode_varint(v, &mut b);
            let (mut pos, mut read) = (0, 0);
            while read_varint(&b, &mut pos).is_some() {
                read += 1;
            }
            assert_eq!(varint_ends(&b), read, "{i}: {b:x?}");
            assert_eq!(read, i + 1);
        }
        // A varint cut at the end is not counted.
        b.push(0x80);
        assert_eq!(varint_ends(&b), 41);
    }

    /// Lines kept in one vector give every location the lines it has in
    /// its own vector: none, one, several (inlined calls), in order.
    #[test]
    fn flat_lines_give_each_location_its_own() {
        let line = |function_id, line| pprof::Line {
            function_id,
            line,
            column: 0,
        };
        let location = |id, line: Vec<pprof::Line>| pprof::Location {
            id,
            line,
            ..Default::default()
        };
        let p = pprof::Profile {
            location: vec![
                location(1, vec![line(1, 10)]),
                location(2, vec![]),
                location(3, vec![line(2, 20), line(3, 30), line(1, 40)]),
                location(4, vec![line(3, 50)]),
            ],
            function: (1..=3)
                .map(|id| pprof::Function {
                    id,
                    ..Default::default()
                })
                .collect(),
            string_table: vec![String::new()],
            ..Default::default()
        };
        let bytes = p.encode_to_vec();
        let counts = prescan(&bytes).unwrap();
        let Ok(t) = decode_tables(&bytes, &counts, usize::MAX, true) else {
            panic!("the profile decodes");
        };
        assert!(t.profile.location.iter().all(|l| l.line.is_empty()));
        assert_eq!(t.lines.lines.len(), 5, "one vector for every line");
        let flat = LocationLines::Flat(&t.lines);
        for (pos, want) in p.location.iter().enumerate() {
            assert_eq!(flat.of(&t.profile.location, pos), &want.line[..], "{pos}");
            assert_eq!(LocationLines::Own.of(&p.location, pos), &want.line[..]);
        }
        assert!(flat.of(&t.profile.location, 4).is_empty());
        let Ok(owned) = decode_profile(&bytes, &counts, usize::MAX) else {
            panic!("the profile decodes");
        };
        assert_eq!(owned.location, p.location);
    }

    /// Over every protobuf profile of the shared corpus, the sample bytes
    /// prescan sums are at least the frames the samples name.
    #[test]
    fn sample_bytes_bound_the_frames_of_the_corpus() {
        let mut checked = 0;
        for (name, raw) in crate::protobuf_corpus() {
            let Some(bytes) = crate::gzip::gunzip(&raw, 1 << 30)
                .ok()
                .or_else(|| (!raw.starts_with(&[0x1f, 0x8b])).then(|| raw.clone()))
            else {
                continue;
            };
            let (Ok(c), Ok(p)) = (prescan(&bytes), pprof::Profile::decode(&bytes[..])) else {
                continue;
            };
            let frames: usize = p.sample.iter().map(|s| s.location_id.len()).sum();
            assert!(
                frames <= c.sample_bytes,
                "{name}: {frames} frames in {} bytes",
                c.sample_bytes
            );
            checked += 1;
        }
        assert!(checked > 100, "only {checked} corpus profiles read");
    }

    fn sample_profile() -> pprof::Profile {
        pprof::Profile {
            sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
            sample: vec![
                pprof::Sample {
                    location_id: vec![1, 2, 300],
                    value: vec![-5],
                    label: vec![pprof::Label {
                        key: 1,
                        str: 2,
                        num: -3,
                        num_unit: 4,
                    }],
                },
                pprof::Sample {
                    location_id: vec![7],
                    value: vec![1 << 40],
                    label: vec![],
                },
            ],
            mapping: vec![pprof::Mapping {
                id: 1,
                memory_start: 10,
                memory_limit: u64::MAX,
                file_offset: 3,
                filename: 1,
                build_id: 2,
                has_functions: true,
                has_filenames: false,
                has_line_numbers: true,
                has_inline_frames: true,
            }],
            location: vec![pprof::Location {
                id: 1,
                mapping_id: 1,
                address: 0xdead,
                line: vec![
                    pprof::Line {
                        function_id: 1,
                        line: -1,
                        column: 4,
                    },
                    pprof::Line {
                        function_id: 2,
                        line: 9,
                        column: 0,
                    },
                ],
                is_folded: true,
            }],
            function: vec![pprof::Function {
                id: 1,
                name: 1,
                system_name: 2,
                filename: 3,
                start_line: 77,
            }],
            string_table: vec!["".into(), "a".into(), "é".into(), "c".into()],
            drop_frames: 1,
            keep_frames: 2,
            time_nanos: -9,
            duration_nanos: 8,
            period_type: Some(pprof::ValueType { r#type: 3, unit: 1 }),
            period: 100,
            comment: vec![1, 2, 3],
            default_sample_type: 1,
            doc_url: 2,
        }
    }

    fn ok(r: Result<pprof::Profile, WireError>) -> pprof::Profile {
        match r {
            Ok(p) => p,
            Err(WireError::Malformed(e)) => panic!("{e}"),
            Err(WireError::TooBig) => panic!("too big"),
        }
    }

    #[test]
    fn matches_prost() {
        let p = sample_profile();
        let bytes = p.encode_to_vec();
        let counts = prescan(&bytes).expect("well-formed");
        assert_eq!(ok(decode_profile(&bytes, &counts, usize::MAX)), p);
        // Unpacked repeated scalars and unknown fields are accepted.
        let mut extra = bytes.clone();
        extra.extend_from_slice(&[0x68, 0x05, 0xa0, 0x06, 0x01]); // comment 5, field 100
        let mut want = p.clone();
        want.comment.push(5);
        let counts = prescan(&extra).expect("well-formed");
        assert_eq!(ok(decode_profile(&extra, &counts, usize::MAX)), want);
        // The memory budget is enforced.
        let counts = prescan(&bytes).expect("well-formed");
        assert!(matches!(
            decode_profile(&bytes, &counts, 100),
            Err(WireError::TooBig)
        ));
    }

    #[test]
    fn refuses_bad_framing() {
        assert!(prescan(&[0x0a, 0x05, 0x01]).is_err()); // runs past the end
        assert!(prescan(&[0x80]).is_err()); // truncated varint
        assert!(prescan(&[0x0b]).is_err()); // group
        assert!(prescan(&[0x00, 0x01]).is_err()); // field 0
        let counts = prescan(&[0x12, 0x02, 0x0a, 0x00]).expect("framing is fine");
        // Field 1 of a sample with wire type 2 is a packed list: fine.
        assert!(decode_profile(&[0x12, 0x02, 0x0a, 0x00], &counts, usize::MAX).is_ok());
        // A varint where a message is expected.
        let counts = prescan(&[0x10, 0x01]).expect("framing is fine");
        assert!(matches!(
            decode_profile(&[0x10, 0x01], &counts, usize::MAX),
            Err(WireError::Malformed(_))
        ));
    }
}
