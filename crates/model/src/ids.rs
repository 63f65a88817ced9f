use std::fmt;

use xxhash_rust::xxh3::{Xxh3, xxh3_128};

/// A content-addressed 128-bit id (xxh3-128 of a canonical encoding).
///
/// 128 bits keep the birthday bound far out of reach: after 2^40 distinct
/// stacks the chance of any collision is about 2^-49.
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Id(pub [u8; 16]);

/// One 128-bit word for the hasher of an [`IdMap`] (one step of
/// foldhash), not a length and 16 bytes as the derived `Hash` of an
/// array writes them: ids are map keys on the ingest path's every
/// sample. In-memory maps only; nothing stores these hashes.
impl std::hash::Hash for Id {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u128(u128::from_ne_bytes(self.0));
    }
}

impl Id {
    pub const ZERO: Id = Id([0; 16]);

    pub fn from_u128(v: u128) -> Self {
        Id(v.to_be_bytes())
    }

    pub fn as_u128(&self) -> u128 {
        u128::from_be_bytes(self.0)
    }

    /// Parses a slice of exactly 16 bytes.
    pub fn from_slice(b: &[u8]) -> Option<Self> {
        Some(Id(b.try_into().ok()?))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        let v = hex::decode(s).ok()?;
        Self::from_slice(&v)
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Id({})", self.to_hex())
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// A map keyed by [`Id`]: foldhash with a per-process random seed, several
/// times cheaper than std's SipHash for 16-byte keys (every symbol table,
/// normalize's per-sample lookups), still keyed so that crafted input
/// cannot choose collisions.
pub type IdMap<V> = std::collections::HashMap<Id, V, IdHashState>;

/// A set of [`Id`]s, hashed as [`IdMap`] keys.
pub type IdSet = std::collections::HashSet<Id, IdHashState>;

/// The keyed hash of [`IdMap`] and [`IdSet`], for tables of ids built
/// another way (normalize's slots of a series' stacks).
pub type IdHashState = foldhash::fast::RandomState;

/// Builds an [`Id`] from a canonical, unambiguous encoding of fields: every
/// variable-length field is length-prefixed, so `("ab","c")` and `("a","bc")`
/// differ. The encoding is collected in a buffer and hashed once with
/// xxh3-128 (seed 0), stable across builds and hosts; one-shot hashing of
/// short inputs is much cheaper than a streaming state. The buffer is an
/// array on the stack up to [`IdHasher::INLINE`] bytes (functions with
/// names of a few hundred bytes, locations with a few inlined lines), then
/// a `Vec`, so most ids cost no allocation; appending is a bounds check
/// and a copy.
pub struct IdHasher {
    inline: [u8; IdHasher::INLINE],
    len: usize,
    /// The whole encoding once it outgrew `inline` (empty until then).
    spill: Vec<u8>,
}

impl IdHasher {
    /// Bytes of encoding kept on the stack.
    pub const INLINE: usize = 512;

    /// `domain` separates kinds of ids (a function and a mapping with the
    /// same bytes never share an id).
    #[inline]
    pub fn new(domain: &str) -> Self {
        let mut h = IdHasher {
            inline: [0; IdHasher::INLINE],
            len: 0,
            spill: Vec::new(),
        };
        h.str(domain);
        h
    }

    // Always inlined, and the builder methods below inlined across
    // crates: most fields are 8 or 16 bytes, whose copies then compile
    // to a store or two; a call each (with a `memmove` call for the
    // copy) was most of a location id's cost in perf.
    #[inline(always)]
    fn put(&mut self, b: &[u8]) {
        if self.spill.is_empty()
            && let Some(dst) = self
                .len
                .checked_add(b.len())
                .and_then(|end| self.inline.get_mut(self.len..end))
        {
            dst.copy_from_slice(b);
            self.len += b.len();
            return;
        }
        self.put_spilled(b);
    }

    /// [`IdHasher::put`] once the encoding outgrew `inline`.
    #[cold]
    #[inline(never)]
    fn put_spilled(&mut self, b: &[u8]) {
        if self.spill.is_empty() {
            self.spill
                .reserve(self.len.saturating_add(b.len()).max(2 * IdHasher::INLINE));
            self.spill.extend_from_slice(&self.inline[..self.len]);
        }
        self.spill.extend_from_slice(b);
    }

    #[inline]
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.put(&(b.len() as u64).to_le_bytes());
        self.put(b);
        self
    }

    #[inline]
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    #[inline]
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.put(&v.to_le_bytes());
        self
    }

    #[inline]
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.u64(v as u64)
    }

    #[inline]
    pub fn id(&mut self, id: &Id) -> &mut Self {
        self.put(&id.0);
        self
    }

    /// `self.bytes(last).finish()` without copying `last` into the
    /// encoding: the same id, hashed as a stream, for a large last field
    /// (a whole request body).
    pub fn finish_with_bytes(&self, last: &[u8]) -> Id {
        let mut s = Xxh3::new();
        s.update(self.encoding());
        s.update(&(last.len() as u64).to_le_bytes());
        s.update(last);
        Id::from_u128(s.digest128())
    }

    #[inline]
    fn encoding(&self) -> &[u8] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill[..]
        }
    }

    #[inline]
    pub fn finish(&self) -> Id {
        Id::from_u128(xxh3_128(self.encoding()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefix_separates_fields() {
        let a = IdHasher::new("t").str("ab").str("c").finish();
        let b = IdHasher::new("t").str("a").str("bc").finish();
        assert_ne!(a, b);
    }

    #[test]
    fn map_keys_hash_by_the_whole_id() {
        use std::hash::BuildHasher;
        let state = foldhash::fast::RandomState::default();
        let a = IdHasher::new("x").u64(1).finish();
        let mut b = a;
        assert_eq!(state.hash_one(a), state.hash_one(b));
        // A change in either half of the 16 bytes changes the hash.
        b.0[0] ^= 1;
        assert_ne!(state.hash_one(a), state.hash_one(b));
        let mut c = a;
        c.0[15] ^= 1;
        assert_ne!(state.hash_one(a), state.hash_one(c));
        let set: IdSet = [a, b, c, a].into_iter().collect();
        assert_eq!(set.len(), 3);
    }

    #[test]
    fn hex_round_trip() {
        let a = IdHasher::new("t").str("x").finish();
        assert_eq!(Id::from_hex(&a.to_hex()), Some(a));
        assert_eq!(Id::from_hex("zz"), None);
    }

    #[test]
    fn stable_across_builds() {
        // A pinned value: if this changes, every stored id changes, and
        // blocks written before no longer agree with new data.
        let a = IdHasher::new("function").str("main").finish();
        assert_eq!(
            a,
            Id::from_u128(xxh3_128(
                b"\x08\0\0\0\0\0\0\0function\x04\0\0\0\0\0\0\0main"
            ))
        );
        assert_eq!(a.to_hex(), "8a0a621a4c609cfc93d902f2467b06e6");
        let b = IdHasher::new("function").str("main").finish();
        assert_eq!(a, b);
        assert_eq!(a.to_hex().len(), 32);
        assert_ne!(a, IdHasher::new("mapping").str("main").finish());
    }

    /// A streamed last field gives the id of the same bytes appended.
    #[test]
    fn a_last_field_hashed_as_a_stream_gives_the_same_id() {
        for prefix in [0usize, 10, 600] {
            for n in [0usize, 1, 100, 240, 1000, 100_000] {
                let name = "p".repeat(prefix);
                let body: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
                let mut h = IdHasher::new("request");
                h.str(&name);
                let streamed = h.finish_with_bytes(&body);
                assert_eq!(streamed, h.bytes(&body).finish(), "{prefix} + {n} bytes");
                assert_ne!(streamed, IdHasher::new("request").str(&name).finish());
            }
        }
    }

    #[test]
    fn long_encodings_spill_to_the_heap_with_the_same_bytes() {
        // Around and far past the inline buffer: the id is xxh3-128 of the
        // same canonical bytes, whatever the split.
        for n in [0usize, 1, 480, 495, 496, 497, 511, 512, 513, 2000] {
            let name = "x".repeat(n);
            let mut want = Vec::new();
            for field in ["function", name.as_str(), "file.go"] {
                want.extend_from_slice(&(field.len() as u64).to_le_bytes());
                want.extend_from_slice(field.as_bytes());
            }
            want.extend_from_slice(&7u64.to_le_bytes());
            let got = IdHasher::new("function")
                .str(&name)
                .str("file.go")
                .i64(7)
                .finish();
            assert_eq!(got, Id::from_u128(xxh3_128(&want)), "name of {n} bytes");
        }
    }
}
