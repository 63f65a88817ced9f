use crate::ids::{Id, IdHasher, IdMap};

/// A function as pprof describes it. Its id hashes every field.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Function {
    pub name: String,
    pub system_name: String,
    pub filename: String,
    pub start_line: i64,
}

impl Function {
    pub fn id(&self) -> Id {
        Self::id_of(
            &self.name,
            &self.system_name,
            &self.filename,
            self.start_line,
        )
    }

    /// The id of a function with these fields, none of them copied.
    #[inline]
    pub fn id_of(name: &str, system_name: &str, filename: &str, start_line: i64) -> Id {
        IdHasher::new("function")
            .str(name)
            .str(system_name)
            .str(filename)
            .i64(start_line)
            .finish()
    }
}

/// A mapped binary. Its id hashes the fields that identify the binary and
/// where it was loaded.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Mapping {
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub filename: String,
    pub build_id: String,
}

impl Mapping {
    pub fn id(&self) -> Id {
        Self::id_of(
            [self.memory_start, self.memory_limit, self.file_offset],
            &self.filename,
            &self.build_id,
        )
    }

    /// The id of a mapping with these fields (`[memory_start,
    /// memory_limit, file_offset]`), none of them copied.
    #[inline]
    pub fn id_of(range: [u64; 3], filename: &str, build_id: &str) -> Id {
        IdHasher::new("mapping")
            .u64(range[0])
            .u64(range[1])
            .u64(range[2])
            .str(filename)
            .str(build_id)
            .finish()
    }
}

/// One line of a location: a function and a line number. A location with
/// several lines is an inlined call chain, callee first (pprof's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    pub function: Id,
    pub line: i64,
}

/// A program counter with its symbolization. `mapping` is [`Id::ZERO`] when
/// the profile had no mapping for it; `lines` is empty when unsymbolized.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Location {
    pub mapping: Id,
    pub address: u64,
    pub lines: Vec<Line>,
}

impl Location {
    pub fn id(&self) -> Id {
        Self::id_of(&self.mapping, self.address, self.lines.iter().copied())
    }

    /// The id of a location with these fields, its lines given one by one
    /// (no vector needed).
    pub fn id_of(mapping: &Id, address: u64, lines: impl ExactSizeIterator<Item = Line>) -> Id {
        let mut h = IdHasher::new("location");
        h.id(mapping).u64(address).u64(lines.len() as u64);
        for l in lines {
            h.id(&l.function).i64(l.line);
        }
        h.finish()
    }
}

/// A call stack: location ids, leaf first (pprof's order).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    pub locations: Vec<Id>,
}

impl Stack {
    /// `IdHasher::new("stack").u64(n)` then each location id: see
    /// [`StackHasher`], which computes the same id with a reused buffer.
    pub fn id(&self) -> Id {
        StackHasher::default().id(&self.locations)
    }
}

/// The generation a union of two tables relies on: the older one, so that
/// a writer's check fails if either head was cut.
fn oldest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The canonical encoding of a stack id starts with the domain `stack`,
/// length-prefixed as [`IdHasher::str`] writes it.
const STACK_DOMAIN: &[u8; 13] = b"\x05\0\0\0\0\0\0\0stack";

/// Computes [`Stack::id`]s with one buffer kept across calls: the
/// per-sample hot path of normalize (one stack id per pprof sample) then
/// costs no allocation and one capacity check per stack instead of one
/// per frame. The bytes hashed are exactly those of
/// `IdHasher::new("stack").u64(n).id(l0).id(l1)...` (checked by a test).
#[derive(Default)]
pub struct StackHasher {
    buf: Vec<u8>,
}

impl StackHasher {
    /// The id of a stack of `locations` (leaf first).
    pub fn id(&mut self, locations: &[Id]) -> Id {
        self.begin(locations.len());
        for l in locations {
            self.push(l);
        }
        self.finish()
    }

    /// Starts a stack of `n` locations, given next one by one with
    /// [`StackHasher::push`] (no vector of ids needed); [`StackHasher::finish`]
    /// gives its id, the same as [`StackHasher::id`] of those `n` ids.
    #[inline]
    pub fn begin(&mut self, n: usize) {
        let b = &mut self.buf;
        b.clear();
        b.reserve(STACK_DOMAIN.len() + 8 + 16 * n);
        b.extend_from_slice(STACK_DOMAIN);
        b.extend_from_slice(&(n as u64).to_le_bytes());
    }

    /// The next location of the stack [`StackHasher::begin`] started.
    #[inline]
    pub fn push(&mut self, location: &Id) {
        self.buf.extend_from_slice(&location.0);
    }

    /// The id of the stack given since [`StackHasher::begin`].
    #[inline]
    pub fn finish(&self) -> Id {
        Id::from_u128(xxhash_rust::xxh3::xxh3_128(&self.buf))
    }
}

/// A symbol table: everything a set of samples refers to, keyed by
/// content-addressed ids. Merging two tables is a union by id.
///
/// Equality compares the four tables only (not [`Symbols::frame_index`]).
#[derive(Clone, Debug, Default)]
pub struct Symbols {
    pub stacks: IdMap<Stack>,
    pub locations: IdMap<Location>,
    pub functions: IdMap<Function>,
    pub mappings: IdMap<Mapping>,
    /// Each stack's frames as indexes among the table's locations, when
    /// whoever built the table knew them (see [`FrameIndex`]).
    pub frame_index: Option<std::sync::Arc<FrameIndex>>,
    /// Set when the table leaves out stacks that the samples beside it
    /// name because the head they are written to held them
    /// ([`HeldStacks`]): the generation of that head. Only that head can
    /// take such a batch; the writer checks the generation.
    pub relies_on: Option<u64>,
}

/// The stacks a head already holds, asked by whoever builds a batch for it
/// (the pprof normalizer), so that a stack the head holds is neither
/// copied into the batch's table nor written to the WAL again: a single
/// process's own ingester, or, in a cluster, the stacks every replica of a
/// series has acknowledged (the distributor's record of them).
///
/// Answers hold for one generation of the head: a cut replaces the head
/// with an empty one and starts the next generation. A batch built with
/// these answers records [`HeldStacks::generation`] in
/// [`Symbols::relies_on`], read before the first answer, and the head's
/// writer takes it only while the generation is unchanged (or fills the
/// stacks in again). A replica whose head no longer holds what a record
/// left out refuses it, and the distributor builds the write again whole.
pub trait HeldStacks: Send + Sync + std::fmt::Debug {
    /// The head generation the answers are for.
    fn generation(&self) -> u64;
    /// Whether the head (every head that `series`'s profiles go to) holds
    /// each stack of `ids` (with its locations, functions and mappings),
    /// in order: asked once per series of a profile, so that an
    /// implementation takes its lock once and the lookups' cache misses
    /// overlap.
    fn holds(&self, series: &crate::Labels, ids: &[Id]) -> Vec<bool>;
}

impl PartialEq for Symbols {
    fn eq(&self, other: &Self) -> bool {
        self.stacks == other.stacks
            && self.locations == other.locations
            && self.functions == other.functions
            && self.mappings == other.mappings
    }
}

/// A table's locations in one order and every stack's frames as indexes
/// in that order: what a write record stores (a varint per frame). The
/// pprof normalizer knows each frame's index as it builds a stack, so a
/// record can be written without looking every frame's location id up
/// again, which misses the cache once per stack (docs/benchmarks.md).
///
/// It describes the table it was built with: [`FrameIndex::matches`]
/// tells whether it still describes a table (the same location and stack
/// ids; content-addressed stacks then have the same frames), and the
/// table's own mutators drop it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FrameIndex {
    /// Every location id of the table, once each, in record order.
    pub locations: Vec<Id>,
    /// Every stack id of the table, once each, with the end of its
    /// frames in `indexes` (each starts where the previous one ends).
    pub stacks: Vec<(Id, u32)>,
    /// Every stack's frames, leaf first, as indexes into `locations`.
    pub indexes: Vec<u32>,
}

/// A table's locations and stacks in the order of a [`FrameIndex`] that
/// describes it ([`FrameIndex::resolve`]).
#[derive(Debug)]
pub struct ResolvedIndex<'a> {
    pub locations: Vec<(&'a Id, &'a Location)>,
    pub stacks: Vec<(&'a Id, &'a Stack)>,
}

impl FrameIndex {
    /// Whether this describes `s`: as many locations and stacks, each of
    /// them in `s`, with as many frames as `s` gives it, and every index
    /// in range. Costs a lookup per location and per stack, none per
    /// frame.
    pub fn matches(&self, s: &Symbols) -> bool {
        self.resolve(s).is_some()
    }

    /// `s`'s entries in this index's order, when this describes `s` (as
    /// [`FrameIndex::matches`] checks): the check is the lookups a
    /// record's encoder needs anyway, one per location and per stack.
    pub fn resolve<'a>(&self, s: &'a Symbols) -> Option<ResolvedIndex<'a>> {
        if self.locations.len() != s.locations.len()
            || self.stacks.len() != s.stacks.len()
            || self.stacks.last().map_or(0, |&(_, end)| end as usize) != self.indexes.len()
            || self
                .indexes
                .iter()
                .any(|&i| i as usize >= self.locations.len())
        {
            return None;
        }
        let locations = self
            .locations
            .iter()
            .map(|id| s.locations.get_key_value(id))
            .collect::<Option<Vec<_>>>()?;
        let mut start = 0u32;
        let stacks = self
            .stacks
            .iter()
            .map(|(id, end)| {
                let frames = end.checked_sub(start);
                start = *end;
                s.stacks
                    .get_key_value(id)
                    .filter(|(_, st)| frames == Some(st.locations.len() as u32))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ResolvedIndex { locations, stacks })
    }

    /// The frames of the `k`th stack (`None` past the last, or when the
    /// ends are out of order).
    pub fn frames(&self, k: usize) -> Option<&[u32]> {
        let start = match k.checked_sub(1) {
            None => 0,
            Some(p) => self.stacks.get(p)?.1 as usize,
        };
        self.indexes.get(start..self.stacks.get(k)?.1 as usize)
    }
}

impl Symbols {
    pub fn add_function(&mut self, f: Function) -> Id {
        let id = f.id();
        self.functions.entry(id).or_insert(f);
        id
    }

    pub fn add_mapping(&mut self, m: Mapping) -> Id {
        let id = m.id();
        self.mappings.entry(id).or_insert(m);
        id
    }

    pub fn add_location(&mut self, l: Location) -> Id {
        let id = l.id();
        self.locations.entry(id).or_insert(l);
        id
    }

    pub fn add_stack(&mut self, s: Stack) -> Id {
        let id = s.id();
        self.stacks.entry(id).or_insert(s);
        id
    }

    /// Adds every entry of `other` (a union by id).
    pub fn merge(&mut self, other: &Symbols) {
        self.frame_index = None;
        self.relies_on = oldest(self.relies_on, other.relies_on);
        for (k, v) in &other.stacks {
            self.stacks.entry(*k).or_insert_with(|| v.clone());
        }
        for (k, v) in &other.locations {
            self.locations.entry(*k).or_insert_with(|| v.clone());
        }
        for (k, v) in &other.functions {
            self.functions.entry(*k).or_insert_with(|| v.clone());
        }
        for (k, v) in &other.mappings {
            self.mappings.entry(*k).or_insert_with(|| v.clone());
        }
    }

    /// The frame names of a stack, root first and leaf last, inlined
    /// functions expanded (caller before callee). A location without lines
    /// prints as its address, `0x<hex>`, as `go tool pprof` prints it (the
    /// correctness contract's folded form). Unknown ids print as `?`.
    pub fn frames(&self, stack: &Id) -> Vec<String> {
        self.frames_by(stack, |f| f.name.clone())
    }

    /// [`Symbols::frames`] with each function's name chosen by `name`.
    pub fn frames_by(&self, stack: &Id, name: impl Fn(&Function) -> String) -> Vec<String> {
        self.frames_with(stack, name, |loc| format!("0x{:x}", loc.address))
    }

    /// [`Symbols::frames_by`] for what people look at (flame graphs, top
    /// tables, the compare view): a location without lines reads as
    /// [`Symbols::address_name`], its binary and offset when it awaits
    /// server-side symbolization.
    pub fn frames_display_by(&self, stack: &Id, name: impl Fn(&Function) -> String) -> Vec<String> {
        self.frames_with(stack, name, |loc| self.address_name(loc))
    }

    fn frames_with(
        &self,
        stack: &Id,
        name: impl Fn(&Function) -> String,
        address: impl Fn(&Location) -> String,
    ) -> Vec<String> {
        let mut out = Vec::new();
        let Some(s) = self.stacks.get(stack) else {
            out.push("?".to_owned());
            return out;
        };
        for loc_id in s.locations.iter().rev() {
            match self.locations.get(loc_id) {
                None => out.push("?".to_owned()),
                Some(loc) if loc.lines.is_empty() => out.push(address(loc)),
                Some(loc) => {
                    for line in loc.lines.iter().rev() {
                        out.push(
                            self.functions
                                .get(&line.function)
                                .map(&name)
                                .unwrap_or_else(|| "?".to_owned()),
                        );
                    }
                }
            }
        }
        out
    }

    /// How a location nobody symbolized is shown to people:
    /// `<file name>+0x<offset>` (the offset in the file, the same in every
    /// process) when its mapping names a file, else `0x<address>`.
    pub fn address_name(&self, loc: &Location) -> String {
        match self.mappings.get(&loc.mapping) {
            Some(m) if !m.filename.is_empty() => {
                let base = m.filename.rsplit('/').next().unwrap_or(&m.filename);
                let offset = loc
                    .address
                    .checked_sub(m.memory_start)
                    .and_then(|a| a.checked_add(m.file_offset))
                    .unwrap_or(loc.address);
                format!("{base}+0x{offset:x}")
            }
            _ => format!("0x{:x}", loc.address),
        }
    }

    /// [`Symbols::merge`] that moves `other`'s entries in instead of
    /// cloning them: what a head does with each write's table. Into an
    /// empty table, `other` is taken whole, its frame index with it.
    pub fn merge_owned(&mut self, other: Symbols) {
        if self.stacks.is_empty()
            && self.locations.is_empty()
            && self.functions.is_empty()
            && self.mappings.is_empty()
            && self.relies_on.is_none()
        {
            *self = other;
            return;
        }
        self.frame_index = None;
        self.relies_on = oldest(self.relies_on, other.relies_on);
        for (k, v) in other.stacks {
            self.stacks.entry(k).or_insert(v);
        }
        for (k, v) in other.locations {
            self.locations.entry(k).or_insert(v);
        }
        for (k, v) in other.functions {
            self.functions.entry(k).or_insert(v);
        }
        for (k, v) in other.mappings {
            self.mappings.entry(k).or_insert(v);
        }
    }

    /// Removes the entries `held` has too (by id): what is left is what
    /// merging into `held` would add. Only reads `held`, so a head's table
    /// can be asked under a shared lock.
    pub fn remove_held_by(&mut self, held: &Symbols) {
        self.frame_index = None;
        self.stacks.retain(|id, _| !held.stacks.contains_key(id));
        self.locations
            .retain(|id, _| !held.locations.contains_key(id));
        self.functions
            .retain(|id, _| !held.functions.contains_key(id));
        self.mappings
            .retain(|id, _| !held.mappings.contains_key(id));
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// The part of this table that `stacks` need: those stacks and every
    /// location, function and mapping they reach. Unknown stacks are skipped.
    pub fn subset<'a>(&self, stacks: impl IntoIterator<Item = &'a Id>) -> Symbols {
        let mut out = Symbols::default();
        for sid in stacks {
            let Some(st) = self.stacks.get(sid) else {
                continue;
            };
            if out.stacks.insert(*sid, st.clone()).is_some() {
                continue;
            }
            for lid in &st.locations {
                let Some(loc) = self.locations.get(lid) else {
                    continue;
                };
                if out.locations.contains_key(lid) {
                    continue;
                }
                if let Some(m) = self.mappings.get(&loc.mapping) {
                    out.mappings.entry(loc.mapping).or_insert_with(|| m.clone());
                }
                for line in &loc.lines {
                    if let Some(f) = self.functions.get(&line.function) {
                        out.functions
                            .entry(line.function)
                            .or_insert_with(|| f.clone());
                    }
                }
                out.locations.insert(*lid, loc.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A union of tables built against a head relies on the older
    /// generation of the two, so the writer's check fails if either head
    /// was cut; a table that relies on none changes nothing.
    #[test]
    fn a_union_relies_on_the_older_generation() {
        let with = |g| Symbols {
            relies_on: g,
            ..Default::default()
        };
        for (a, b, want) in [
            (Some(3), Some(5), Some(3)),
            (Some(5), Some(3), Some(3)),
            (None, Some(5), Some(5)),
            (Some(5), None, Some(5)),
            (None, None, None),
        ] {
            let mut x = with(a);
            x.merge(&with(b));
            assert_eq!(x.relies_on, want, "merge {a:?} {b:?}");
            let mut y = with(a);
            y.merge_owned(with(b));
            assert_eq!(y.relies_on, want, "merge_owned {a:?} {b:?}");
        }
    }

    /// The stack id of the canonical encoding, spelled out with
    /// [`IdHasher`] (what `Stack::id` computed before [`StackHasher`]).
    fn stack_id_by_id_hasher(locations: &[Id]) -> Id {
        let mut h = IdHasher::new("stack");
        h.u64(locations.len() as u64);
        for l in locations {
            h.id(l);
        }
        h.finish()
    }

    #[test]
    fn stack_hasher_hashes_the_canonical_encoding() {
        let mut hasher = StackHasher::default();
        // Empty, short, and longer than IdHasher's 1 KiB stack buffer;
        // one hasher reused across sizes, larger then smaller.
        for n in [0usize, 1, 2, 61, 62, 63, 200, 3] {
            let locations: Vec<Id> = (0..n)
                .map(|i| IdHasher::new("location").u64(i as u64).finish())
                .collect();
            let want = stack_id_by_id_hasher(&locations);
            assert_eq!(hasher.id(&locations), want, "{n} frames");
            // Given one by one, as normalize does, after a longer stack.
            hasher.begin(n);
            for l in &locations {
                hasher.push(l);
            }
            assert_eq!(hasher.finish(), want, "{n} frames one by one");
            assert_eq!(
                Stack {
                    locations: locations.clone()
                }
                .id(),
                want
            );
        }
        // Order matters: a stack is not a set.
        let a = IdHasher::new("location").u64(1).finish();
        let b = IdHasher::new("location").u64(2).finish();
        assert_ne!(hasher.id(&[a, b]), hasher.id(&[b, a]));
    }

    fn sample_symbols() -> (Symbols, Id) {
        let mut s = Symbols::default();
        let main = s.add_function(Function {
            name: "main".into(),
            ..Default::default()
        });
        let a = s.add_function(Function {
            name: "a".into(),
            ..Default::default()
        });
        let b = s.add_function(Function {
            name: "b".into(),
            ..Default::default()
        });
        let l_main = s.add_location(Location {
            address: 1,
            lines: vec![Line {
                function: main,
                line: 1,
            }],
            ..Default::default()
        });
        // b inlined into a: callee first.
        let l_ab = s.add_location(Location {
            address: 2,
            lines: vec![
                Line {
                    function: b,
                    line: 3,
                },
                Line {
                    function: a,
                    line: 2,
                },
            ],
            ..Default::default()
        });
        let l_raw = s.add_location(Location {
            address: 0xbeef,
            ..Default::default()
        });
        let lib = s.add_mapping(Mapping {
            memory_start: 0x7f00_0000_0000,
            memory_limit: 0x7f00_0001_0000,
            file_offset: 0x2000,
            filename: "/usr/lib/libfoo.so".into(),
            build_id: "ab12".into(),
        });
        let l_lib = s.add_location(Location {
            mapping: lib,
            address: 0x7f00_0000_0123,
            ..Default::default()
        });
        let st = s.add_stack(Stack {
            locations: vec![l_raw, l_lib, l_ab, l_main],
        });
        (s, st)
    }

    /// The folded form prints an address-only frame as `go tool pprof`
    /// does; the display form names its binary and the offset in it.
    #[test]
    fn an_address_reads_as_pprof_prints_it_and_shows_its_binary() {
        let mut s = Symbols::default();
        let m = s.add_mapping(Mapping {
            memory_start: 0x7f00_0000_0000,
            memory_limit: 0x7f00_0001_0000,
            filename: "/lib/libc-2.15.so".into(),
            ..Default::default()
        });
        let l = s.add_location(Location {
            mapping: m,
            address: 0x7f00_0000_0123,
            ..Default::default()
        });
        let st = s.add_stack(Stack { locations: vec![l] });
        assert_eq!(s.frames(&st), vec!["0x7f0000000123"]);
        assert_eq!(
            s.frames_display_by(&st, |f| f.name.clone()),
            vec!["libc-2.15.so+0x123"]
        );
    }

    #[test]
    fn frames_root_first_with_inlines() {
        let (s, st) = sample_symbols();
        assert_eq!(
            s.frames(&st),
            vec!["main", "a", "b", "0x7f0000000123", "0xbeef"]
        );
        assert_eq!(
            s.frames_display_by(&st, |f| f.name.clone()),
            vec!["main", "a", "b", "libfoo.so+0x2123", "0xbeef"]
        );
    }

    #[test]
    fn merge_is_union_by_id() {
        let (s, st) = sample_symbols();
        let mut m = Symbols::default();
        m.merge(&s);
        m.merge(&s);
        assert_eq!(m, s);
        let mut owned = Symbols::default();
        owned.merge_owned(s.clone());
        owned.merge_owned(s.clone());
        assert_eq!(owned, s);
        assert_eq!(m.frames(&st), s.frames(&st));
    }

    /// Moved into an empty table, a table keeps its frame index (it still
    /// describes it); merged into one with entries, the index is dropped.
    #[test]
    fn merge_owned_into_an_empty_table_keeps_the_frame_index() {
        let (mut s, _) = sample_symbols();
        let index = std::sync::Arc::new(FrameIndex {
            locations: s.locations.keys().copied().collect(),
            ..Default::default()
        });
        s.frame_index = Some(index.clone());
        let mut empty = Symbols::default();
        empty.merge_owned(s.clone());
        assert_eq!(empty.frame_index, Some(index));
        empty.merge_owned(s.clone());
        assert_eq!(empty.frame_index, None);
        assert_eq!(empty, s);
        let mut relying = Symbols {
            relies_on: Some(1),
            ..Default::default()
        };
        relying.merge_owned(s);
        assert_eq!(relying.frame_index, None, "not empty: it relies on a head");
        assert_eq!(relying.relies_on, Some(1));
    }
}
