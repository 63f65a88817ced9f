//! A pass over the protobuf bytes before decoding them: it bounds what
//! decoding will allocate, counts what the limits count, and collects the
//! wire-level evidence of the field layout (see [`crate::wire`]).
//!
//! The scan follows only the paths Fathom decodes (request → resource →
//! scope → profile → sample, and the dictionary tables) and skips every
//! other field by its length, so it costs one linear walk and no
//! allocation. Anything that is not well-formed protobuf stops it with
//! [`Error::Malformed`].

use std::mem::size_of;

use crate::wire;
use crate::{Error, Limits};

/// What the wire types of the fields say about the layout.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Evidence {
    /// Why the request looks like v1.8/v1.9 (`values = 2`).
    pub(crate) v1_8: Option<&'static str>,
    /// Why it looks like v1.10 or later (`values = 4`).
    pub(crate) v1_10: Option<&'static str>,
    /// Why it looks like v1.7.0 or earlier (no stack table).
    pub(crate) legacy: Option<&'static str>,
}

/// What the scan found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    pub(crate) evidence: Evidence,
    pub(crate) profiles: usize,
    pub(crate) samples: usize,
    /// Upper bound of the memory the decoded request takes.
    pub(crate) decoded_bytes: usize,
}

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf` in the whole request, for messages.
    base: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], base: usize) -> Self {
        Reader { buf, pos: 0, base }
    }

    fn malformed(&self, what: &str) -> Error {
        Error::Malformed(format!("{what} at byte {}", self.base + self.pos))
    }

    fn varint(&mut self) -> Result<u64, Error> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.malformed("truncated varint"));
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.malformed("varint longer than 10 bytes"))
    }

    /// The next field's number and wire type, or `None` at the end.
    fn key(&mut self) -> Result<Option<(u64, u8)>, Error> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        let field = k >> 3;
        if field == 0 {
            return Err(self.malformed("field number 0"));
        }
        Ok(Some((field, (k & 7) as u8)))
    }

    fn take(&mut self, n: usize) -> Result<Reader<'a>, Error> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.malformed("truncated field"))?;
        let sub = Reader::new(&self.buf[self.pos..end], self.base + self.pos);
        self.pos = end;
        Ok(sub)
    }

    fn len_delimited(&mut self) -> Result<Reader<'a>, Error> {
        let n = self.varint()?;
        let n = usize::try_from(n).map_err(|_| self.malformed("length out of range"))?;
        self.take(n)
    }

    /// Skips a field's value; returns the sub-reader of a length-delimited one.
    fn skip(&mut self, wire_type: u8) -> Result<Option<Reader<'a>>, Error> {
        match wire_type {
            VARINT => self.varint().map(|_| None),
            I64 => self.take(8).map(|_| None),
            LEN => self.len_delimited().map(Some),
            I32 => self.take(4).map(|_| None),
            3 | 4 => Err(self.malformed("protobuf groups are not supported")),
            _ => Err(self.malformed("invalid wire type")),
        }
    }

    fn len(&self) -> usize {
        self.buf.len()
    }
}

struct Scanner<'l> {
    limits: &'l Limits,
    out: Scan,
}

impl Scanner<'_> {
    fn charge(&mut self, n: usize) {
        self.out.decoded_bytes = self.out.decoded_bytes.saturating_add(n);
    }

    fn request(&mut self, mut r: Reader<'_>) -> Result<(), Error> {
        while let Some((f, wt)) = r.key()? {
            let sub = r.skip(wt)?;
            match (f, sub) {
                (1, Some(sub)) => {
                    self.charge(size_of::<wire::ResourceProfiles>());
                    self.resource_profiles(sub)?;
                }
                (2, Some(sub)) => self.dictionary(sub)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn attributes(&mut self, mut r: Reader<'_>, field: u64) -> Result<(), Error> {
        while let Some((f, wt)) = r.key()? {
            if let (true, Some(sub)) = (f == field, r.skip(wt)?) {
                // The strings of a key-value are at most its bytes.
                self.charge(size_of::<wire::KeyValue>() + size_of::<wire::AnyValue>() + sub.len());
            }
        }
        Ok(())
    }

    fn resource_profiles(&mut self, mut r: Reader<'_>) -> Result<(), Error> {
        while let Some((f, wt)) = r.key()? {
            match (f, r.skip(wt)?) {
                (1, Some(sub)) => self.attributes(sub, 1)?,
                (2, Some(mut sub)) => {
                    self.charge(size_of::<wire::ScopeProfiles>());
                    while let Some((f, wt)) = sub.key()? {
                        match (f, sub.skip(wt)?) {
                            (1, Some(scope)) => self.attributes(scope, 3)?,
                            (2, Some(p)) => self.profile(p)?,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn profile(&mut self, mut r: Reader<'_>) -> Result<(), Error> {
        self.out.profiles += 1;
        if self.out.profiles > self.limits.max_profiles {
            return Err(Error::TooLarge(format!(
                "the request has more than {} profiles",
                self.limits.max_profiles
            )));
        }
        self.charge(size_of::<wire::Profile>());
        let mut sample_types = 0usize;
        while let Some((f, wt)) = r.key()? {
            match (f, wt) {
                (1, _) => sample_types += 1,
                (3 | 4, LEN) => {
                    self.out.evidence.legacy = Some(
                        "Profile field 3 or 4 holds a list (location_indices or a table), where v1.8+ has time_unix_nano and duration_nano",
                    )
                }
                (5, VARINT) => {
                    self.out.evidence.legacy = Some(
                        "Profile field 5 is a number (duration_nanos), where v1.8+ has period_type",
                    )
                }
                (6, LEN) => {
                    self.out.evidence.legacy =
                        Some("Profile field 6 is a message (period_type), where v1.8+ has period")
                }
                _ => {}
            }
            let sub = r.skip(wt)?;
            if let (2, Some(s)) = (f, sub) {
                self.sample(s)?;
            }
        }
        if sample_types > 1 {
            self.out.evidence.legacy =
                Some("a Profile has several sample types, where v1.8+ has exactly one");
        }
        Ok(())
    }

    fn sample(&mut self, mut r: Reader<'_>) -> Result<(), Error> {
        self.out.samples += 1;
        if self.out.samples > self.limits.max_samples {
            return Err(Error::TooLarge(format!(
                "the request has more than {} samples",
                self.limits.max_samples
            )));
        }
        self.charge(size_of::<wire::Sample>());
        while let Some((f, wt)) = r.key()? {
            let ev = &mut self.out.evidence;
            match (f, wt) {
                (2, VARINT) => {
                    ev.legacy = Some(
                        "Sample field 2 is a single number (locations_length), where v1.8+ has a packed list",
                    )
                }
                (3, LEN) => {
                    ev.v1_8 = Some("Sample field 3 is a packed list (v1.8/v1.9 attribute_indices)")
                }
                (3, VARINT) => {
                    ev.v1_10 = Some("Sample field 3 is a single number (v1.10 link_index)")
                }
                (4, LEN) => ev.v1_10 = Some("Sample field 4 is a packed list (v1.10 values)"),
                (4, VARINT) => {
                    ev.v1_8 = Some("Sample field 4 is a single number (v1.8/v1.9 link_index)")
                }
                (5, VARINT) => {
                    ev.legacy = Some(
                        "Sample field 5 is a varint (link_index), where v1.8+ has fixed64 timestamps",
                    )
                }
                (6, _) => ev.legacy = Some("Sample has field 6 (timestamps_unix_nano before v1.8)"),
                _ => {}
            }
            if let Some(sub) = r.skip(wt)? {
                // A packed list of n bytes holds at most n varints (n / 8
                // fixed64), each decoded into 8 bytes.
                self.charge(sub.len().saturating_mul(8));
            } else {
                self.charge(8);
            }
        }
        Ok(())
    }

    fn table_entry(&mut self, count: &mut usize, what: &str) -> Result<(), Error> {
        *count += 1;
        if *count > self.limits.max_table_entries {
            return Err(Error::TooLarge(format!(
                "the dictionary's {what} has more than {} entries",
                self.limits.max_table_entries
            )));
        }
        Ok(())
    }

    fn dictionary(&mut self, mut r: Reader<'_>) -> Result<(), Error> {
        self.charge(size_of::<wire::ProfilesDictionary>());
        let mut counts = [0usize; 8];
        while let Some((f, wt)) = r.key()? {
            let Some(mut sub) = r.skip(wt)? else {
                continue;
            };
            let len = sub.len();
            match f {
                1 => {
                    self.table_entry(&mut counts[1], "mapping_table")?;
                    self.charge(size_of::<wire::Mapping>() + len * 4);
                }
                2 => {
                    self.table_entry(&mut counts[2], "location_table")?;
                    self.charge(size_of::<wire::Location>());
                    while let Some((f, wt)) = sub.key()? {
                        let inner = sub.skip(wt)?;
                        if f == 3 && inner.is_some() {
                            self.charge(size_of::<wire::Line>());
                        }
                    }
                }
                3 => {
                    self.table_entry(&mut counts[3], "function_table")?;
                    self.charge(size_of::<wire::Function>());
                }
                5 => {
                    self.table_entry(&mut counts[5], "string_table")?;
                    self.charge(size_of::<String>() + len);
                }
                6 => {
                    self.table_entry(&mut counts[6], "attribute_table")?;
                    self.charge(
                        size_of::<wire::KeyValueAndUnit>() + size_of::<wire::AnyValue>() + len,
                    );
                    if let Some((1, LEN)) = sub.key()? {
                        self.out.evidence.legacy = Some(
                            "attribute_table entries have a string key (KeyValue), where v1.8+ has key_strindex",
                        );
                    }
                }
                7 => {
                    self.table_entry(&mut counts[7], "stack_table")?;
                    self.charge(size_of::<wire::Stack>() + len * 4);
                    while let Some((f, wt)) = sub.key()? {
                        sub.skip(wt)?;
                        if f != 1 {
                            self.out.evidence.legacy = Some(
                                "dictionary field 7 holds attribute units, where v1.8+ has the stack table",
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Scans an `ExportProfilesServiceRequest`; fails on malformed protobuf
/// and on counts over the limits, including the decoded size.
pub(crate) fn scan(body: &[u8], limits: &Limits) -> Result<Scan, Error> {
    let mut s = Scanner {
        limits,
        out: Scan::default(),
    };
    s.request(Reader::new(body, 0))?;
    if s.out.decoded_bytes > limits.max_decoded_bytes {
        return Err(Error::TooLarge(format!(
            "the request would take more than {} bytes of memory decoded",
            limits.max_decoded_bytes
        )));
    }
    Ok(s.out)
}
