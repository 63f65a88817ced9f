//! Turning a decoded pprof into Fathom profiles and symbols.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::BuildHasher;

use fathom_model::{
    Function, Id, IdHasher, Labels, Line, Location, Mapping, Profile, ProfileType, Sample, Stack,
    StackHasher, Symbols,
};
use fathom_proto::pprof;

use crate::index::{IdIndex, IdTable, Indexes};

/// The default for [`NormalizeOptions::max_series`].
pub const DEFAULT_MAX_SERIES: usize = 10_000;

/// Sample label keys that never become series labels: per-sample ids whose
/// values are unique, so they would create a series per sample.
pub const IGNORED_SAMPLE_LABELS: [&str; 2] = ["span_id", "profile_id"];

/// How to turn one pprof into Fathom profiles.
#[derive(Clone, Debug)]
pub struct NormalizeOptions {
    /// Series labels for every output profile, including `service_name`.
    /// Sample labels never override them.
    pub labels: Labels,
    /// A Pyroscope-style profile name suffix (`cpu`, `alloc_objects`,
    /// `inuse_space`, `goroutines`, `mutex_count`, `block_duration`,
    /// `itimer`, `wall`, ...). It only decides the profile name when the
    /// sample types do not (see [`profile_type`]).
    pub name_hint: Option<String>,
    /// Replaces the pprof's `time_nanos`.
    pub time_nanos_override: Option<i64>,
    /// Replaces the pprof's `duration_nanos`.
    pub duration_nanos_override: Option<i64>,
    /// Seeds the output profile ids: the same seed, type and labels always
    /// give the same id (replicas of a write share it).
    pub profile_id_seed: Id,
    /// The most distinct label sets (series) one pprof may produce.
    pub max_series: usize,
    /// The stacks the head this write goes to holds already: those are
    /// left out of the output's table (its samples still name them), and
    /// the table records the head's generation
    /// ([`Symbols::relies_on`](fathom_model::Symbols::relies_on)). Only
    /// the heads that answered can take such a batch (a single process's
    /// own ingester, or in a cluster the replicas the distributor asked
    /// about); `None` (the default) builds a table with every stack.
    pub held: Option<std::sync::Arc<dyn fathom_model::HeldStacks>>,
}

impl Default for NormalizeOptions {
    fn default() -> Self {
        NormalizeOptions {
            labels: Labels::new(),
            name_hint: None,
            time_nanos_override: None,
            duration_nanos_override: None,
            profile_id_seed: Id::ZERO,
            max_series: DEFAULT_MAX_SERIES,
            held: None,
        }
    }
}

/// Profiles plus the symbols their samples refer to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Normalized {
    /// One profile per (profile type, series) with samples.
    pub profiles: Vec<Profile>,
    /// Every stack, location, function and mapping the samples refer to.
    pub symbols: Symbols,
}

/// Why a pprof could not be normalized. [`crate::decode`] output never
/// fails except for [`NormalizeError::TooManySeries`]; the other variants
/// exist for profiles built in memory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NormalizeError {
    /// A string index is out of range.
    #[error("{what} refers to string {index}, but the string table has {len} entries")]
    StringIndex {
        what: &'static str,
        index: i64,
        len: usize,
    },
    /// A mapping, location or function table has a zero or repeated id.
    #[error("the {what} table has a zero or duplicate id")]
    BadIds { what: &'static str },
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
    /// Sample labels split the profile into too many series.
    #[error("sample labels split the profile into more than {limit} series")]
    TooManySeries { limit: usize },
}

/// The Fathom profile type of one pprof sample type.
///
/// The result is `<name>:<sample_type>:<sample_unit>:<period_type>:<period_unit>`.
/// Type and unit strings are kept as the profile says (case included),
/// except that an empty type becomes `unknown`, an empty unit becomes
/// `count`, and `:` becomes `_`. The name is chosen by the first rule that
/// applies, comparing case-insensitively (`s` = sample type, `p` = period
/// type):
///
/// 1. `s` starts with `alloc` or `inuse`, or is `objects`, `space`, `live`,
///    `allocations` or `bytes`, or `p` is `space` → `memory`;
/// 2. `s` is `cpu` → `process_cpu`;
/// 3. `s` is `samples`/`sample` and `p` is `cpu` or empty → `process_cpu`;
/// 4. `s` is `wall`, or `s` is `samples`/`sample`/`time` and `p` is `wall`
///    or `wallclock` → `wall`;
/// 5. `s` or `p` is `goroutine`/`goroutines` → `goroutines`;
/// 6. `s` is `contentions` or `delay` or starts with `lock` → `block` if
///    `p` is `block`, `mutex` if `p` is `mutex`, else `block` if the name
///    hint contains `block`, else `mutex` (Go's mutex and block profiles
///    are otherwise identical);
/// 7. `s` starts with `exception` → `exceptions`;
/// 8. a name hint, if given: `cpu`/`itimer`/`process_cpu` → `process_cpu`,
///    `wall` → `wall`, `alloc_*`/`inuse_*`/`memory`/`live` → `memory`,
///    `goroutine(s)` → `goroutines`, `mutex*` → `mutex`,
///    `block*`/`lock*` → `block`, `exception(s)` → `exceptions`, anything
///    else is used itself (sanitized);
/// 9. otherwise the period type's name, else the sample type's name
///    (`unknown` if both are empty).
///
/// A type spelled `unknown` counts as empty, so the placeholder is stable
/// when a profile is encoded and normalized again.
///
/// Names are sanitized to `[A-Za-z0-9_.-]` (others become `_`).
pub fn profile_type(
    sample_type: &str,
    sample_unit: &str,
    period_type: &str,
    period_unit: &str,
    name_hint: Option<&str>,
) -> ProfileType {
    let name = profile_name(sample_type, period_type, name_hint);
    ProfileType {
        name,
        sample_type: type_field(sample_type),
        sample_unit: unit_field(sample_unit),
        period_type: type_field(period_type),
        period_unit: unit_field(period_unit),
    }
}

fn type_field(s: &str) -> String {
    if s.is_empty() {
        "unknown".to_owned()
    } else {
        s.replace(':', "_")
    }
}

fn unit_field(s: &str) -> String {
    if s.is_empty() {
        "count".to_owned()
    } else {
        s.replace(':', "_")
    }
}

fn sanitize_name(s: &str) -> String {
    if s.is_empty() {
        return "unknown".to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn profile_name(sample_type: &str, period_type: &str, hint: Option<&str>) -> String {
    // `unknown` is what an empty type becomes: treat it as empty, so that
    // names survive encode → decode → normalize.
    let unplaceholder = |t: &str| if t == "unknown" { "" } else { t }.to_owned();
    let (sample_type, period_type) = (unplaceholder(sample_type), unplaceholder(period_type));
    let s = sample_type.to_ascii_lowercase();
    let p = period_type.to_ascii_lowercase();
    let hint_lc = hint.map(str::to_ascii_lowercase);
    let h = hint_lc.as_deref().unwrap_or("");
    let named = |n: &str| n.to_owned();
    if s.starts_with("alloc")
        || s.starts_with("inuse")
        || matches!(
            s.as_str(),
            "objects" | "space" | "live" | "allocations" | "bytes"
        )
        || p == "space"
    {
        return named("memory");
    }
    if s == "cpu" {
        return named("process_cpu");
    }
    let samples = matches!(s.as_str(), "samples" | "sample");
    if samples && (p == "cpu" || p.is_empty()) {
        return named("process_cpu");
    }
    if s == "wall" || ((samples || s == "time") && matches!(p.as_str(), "wall" | "wallclock")) {
        return named("wall");
    }
    if matches!(s.as_str(), "goroutine" | "goroutines")
        || matches!(p.as_str(), "goroutine" | "goroutines")
    {
        return named("goroutines");
    }
    if s == "contentions" || s == "delay" || s.starts_with("lock") {
        return named(match p.as_str() {
            "block" => "block",
            "mutex" => "mutex",
            _ if h.contains("block") => "block",
            _ => "mutex",
        });
    }
    if s.starts_with("exception") {
        return named("exceptions");
    }
    if let Some(hint) = hint.filter(|h| !h.is_empty()) {
        return match h {
            "cpu" | "itimer" | "process_cpu" => named("process_cpu"),
            "wall" => named("wall"),
            "memory" | "live" => named("memory"),
            "goroutine" | "goroutines" => named("goroutines"),
            "exception" | "exceptions" => named("exceptions"),
            _ if h.starts_with("alloc_") || h.starts_with("inuse_") => named("memory"),
            _ if h.starts_with("mutex") => named("mutex"),
            _ if h.starts_with("block") || h.starts_with("lock") => named("block"),
            _ => sanitize_name(hint),
        };
    }
    if !period_type.is_empty() {
        sanitize_name(&period_type)
    } else {
        sanitize_name(&sample_type)
    }
}

/// The name a function is shown under in folded, top and flame graph
/// output: what `go tool pprof` displays (see [`go_pprof_display_name`],
/// applied when the name equals the system name, as pprof does).
pub fn display_name(f: &fathom_model::Function) -> String {
    if f.name == f.system_name {
        go_pprof_display_name(&f.name).into_owned()
    } else {
        f.name.clone()
    }
}

/// The name `go tool pprof` displays for a function whose name equals its
/// system name (its default `demangleFunctionNames` heuristics): a name
/// that looks like demangled C++ — it contains `<`, `>`, `[`, `]` or `::`,
/// but neither `.<` (Java) nor `]).` (Go generic methods) — loses its
/// parameter lists `(...)` and then its template arguments `<...>`.
/// Mangled names (`_Z...`) are not demangled.
///
/// Fathom stores names as profiles send them; this is for displays that
/// want pprof's short names, and for comparing with `go tool pprof` output.
pub fn go_pprof_display_name(name: &str) -> Cow<'_, str> {
    let looks_cpp = !name.contains(".<")
        && !name.contains("]).")
        && (name.contains(['<', '>', '[', ']']) || name.contains("::"));
    if !looks_cpp {
        return Cow::Borrowed(name);
    }
    let once = remove_matching(name.as_bytes(), b'(', b')');
    let twice = remove_matching(&once, b'<', b'>');
    match String::from_utf8(twice) {
        Ok(s) if s == name => Cow::Borrowed(name),
        Ok(s) => Cow::Owned(s),
        Err(_) => Cow::Borrowed(name),
    }
}

/// Go pprof's `removeMatching`: removes nested `start ... end` groups; on
/// an unmatched `end` it stops and returns what it has so far.
fn remove_matching(name: &[u8], start: u8, end: u8) -> Vec<u8> {
    let mut name = name.to_vec();
    let (mut nesting, mut first, mut current) = (0i64, 0usize, 0usize);
    while let Some(index) = name
        .get(current..)
        .and_then(|rest| rest.iter().position(|&c| c == start || c == end))
    {
        current += index;
        if name[current] == start {
            nesting += 1;
            if nesting == 1 {
                first = current;
            }
        } else {
            nesting -= 1;
            if nesting < 0 {
                return name;
            }
            if nesting == 0 {
                name.drain(first..=current);
                current = first;
                continue;
            }
        }
        current += 1;
    }
    name
}

/// Turns a sample label key into a valid label name: invalid characters
/// become `_` (a leading digit too). `None` for an empty key.
pub fn sanitize_label_name(key: &str) -> Option<String> {
    if key.is_empty() {
        return None;
    }
    Some(
        key.chars()
            .enumerate()
            .map(|(i, c)| {
                let ok = c.is_ascii_alphabetic()
                    || c == '_'
                    || (i > 0 && (c.is_ascii_digit() || c == '.'));
                if ok { c } else { '_' }
            })
            .collect(),
    )
}

struct Series {
    labels: Labels,
    /// Each stack's slot (its index in `stacks`), found by the stack id's
    /// hash: 4 bytes a stack where a map from ids to slots takes 24, so
    /// that a large profile's table is a sixth of the memory (inserting
    /// into such a map was 9 % of a process's ingest).
    slots: hashbrown::HashTable<u32>,
    stacks: Vec<Id>,
    /// `stacks.len() × types` sums, row-major.
    values: Vec<i64>,
}

/// A series' stacks in id order, each with its slot: the order of every
/// profile's samples the series gives. A block stores a profile's samples
/// by stack id, so a head cut takes them as they are instead of sorting
/// each profile again on every replica (`by_stack` in the ingester's head).
/// One sort serves every sample type of the series. Stack ids are unique
/// within a series, so the order is total.
fn by_stack(stacks: &[Id]) -> Vec<(Id, usize)> {
    let mut order: Vec<(Id, usize)> = stacks.iter().copied().zip(0..).collect();
    order.sort_unstable_by_key(|&(stack, _)| stack);
    order
}

/// Normalizes a pprof into Fathom profiles (see the crate docs for the
/// rules): one profile per (sample type, series), samples with equal
/// stacks summed, zero values dropped, symbols content-addressed.
pub fn normalize(
    p: &pprof::Profile,
    opts: &NormalizeOptions,
) -> Result<Normalized, NormalizeError> {
    let frames = p.sample.iter().map(|s| s.location_id.len()).sum();
    let strings: Vec<&str> = p.string_table.iter().map(String::as_str).collect();
    let mut samples = ProfileSamples(p.sample.iter());
    normalize_from(p, &strings, &mut samples, (p.sample.len(), frames), opts)
}

/// Normalizes the profile of `p`'s tables, `strings` and `samples`, which
/// number about `sizes.0` and name about `sizes.1` locations together.
fn normalize_from<S: Samples<Stop = std::convert::Infallible>>(
    p: &pprof::Profile,
    strings: &[&str],
    samples: &mut S,
    sizes: (usize, usize),
    opts: &NormalizeOptions,
) -> Result<Normalized, NormalizeError> {
    let lines = crate::wire::LocationLines::Own;
    let indexes = Indexes::new(p).map_err(|(what, _)| NormalizeError::BadIds { what })?;
    let n = Normalizer::new(p, indexes, lines, strings, opts, sizes.0, sizes.1);
    n.run(samples).map_err(|e| match e {
        Stopped::Normalize(e) => e,
        Stopped::Source(never) => match never {},
    })
}

/// A pprof's samples apart from its tables, in three columns one sample
/// after another: what a converter from another format (OTLP) builds
/// instead of a `pprof::Sample`, three vectors of its own, a sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleColumns {
    location_ids: Vec<u64>,
    values: Vec<i64>,
    labels: Vec<pprof::Label>,
    /// Where each sample ends in the three columns.
    ends: Vec<[usize; 3]>,
}

impl SampleColumns {
    /// Adds a sample: its location ids (leaf first), its values (one a
    /// sample type) and its labels.
    pub fn push(
        &mut self,
        location_ids: impl IntoIterator<Item = u64>,
        values: &[i64],
        labels: impl IntoIterator<Item = pprof::Label>,
    ) {
        self.location_ids.extend(location_ids);
        self.values.extend_from_slice(values);
        self.labels.extend(labels);
        self.ends.push([
            self.location_ids.len(),
            self.values.len(),
            self.labels.len(),
        ]);
    }

    /// How many samples were added.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// [`normalize`] of the profile whose tables are `p`'s (its `sample` and
/// `string_table` are not read), whose strings are `strings` and whose
/// samples are `samples`: the same profiles and symbols as [`normalize`]
/// of a pprof that has them all.
pub fn normalize_columns(
    p: &pprof::Profile,
    strings: &[&str],
    samples: &SampleColumns,
    opts: &NormalizeOptions,
) -> Result<Normalized, NormalizeError> {
    let mut rows = ColumnSamples {
        c: samples,
        next: 0,
        start: [0; 3],
    };
    let sizes = (samples.len(), samples.location_ids.len());
    normalize_from(p, strings, &mut rows, sizes, opts)
}

/// The samples of [`SampleColumns`], one at a time.
struct ColumnSamples<'a> {
    c: &'a SampleColumns,
    next: usize,
    /// Where the next sample starts in each column.
    start: [usize; 3],
}

impl Samples for ColumnSamples<'_> {
    type Stop = std::convert::Infallible;
    type Ids<'s>
        = DecodedIds<'s>
    where
        Self: 's;
    fn next_sample(&mut self) -> Option<Result<SampleRef<'_, DecodedIds<'_>>, Self::Stop>> {
        let end = *self.c.ends.get(self.next)?;
        let [l, v, b] = std::mem::replace(&mut self.start, end);
        self.next += 1;
        // `push` wrote each end at or past the one before.
        let ids = self.c.location_ids.get(l..end[0]).unwrap_or_default();
        Some(Ok(SampleRef {
            locations: DecodedIds(ids.iter()),
            frames: ids.len(),
            value: self.c.values.get(v..end[1]).unwrap_or_default(),
            label: self.c.labels.get(b..end[2]).unwrap_or_default(),
        }))
    }
}

/// Where [`Normalizer::run`] reads samples from, one at a time.
pub(crate) trait Samples {
    /// Why the source stopped early.
    type Stop;
    /// A sample's location ids, leaf first, read as the loop needs them.
    type Ids<'s>: Iterator<Item = Result<u64, Self::Stop>>
    where
        Self: 's;
    fn next_sample(&mut self) -> Option<Result<SampleRef<'_, Self::Ids<'_>>, Self::Stop>>;
}

/// A sample as [`Normalizer::run`] reads it.
pub(crate) struct SampleRef<'s, I> {
    /// The location ids, leaf first, and how many there are.
    pub(crate) locations: I,
    pub(crate) frames: usize,
    pub(crate) value: &'s [i64],
    pub(crate) label: &'s [pprof::Label],
}

/// The samples of a decoded profile.
struct ProfileSamples<'a>(std::slice::Iter<'a, pprof::Sample>);

/// The location ids of a decoded sample.
struct DecodedIds<'s>(std::slice::Iter<'s, u64>);

impl Iterator for DecodedIds<'_> {
    type Item = Result<u64, std::convert::Infallible>;

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|&id| Ok(id))
    }
}

impl Samples for ProfileSamples<'_> {
    type Stop = std::convert::Infallible;
    type Ids<'s>
        = DecodedIds<'s>
    where
        Self: 's;
    fn next_sample(&mut self) -> Option<Result<SampleRef<'_, DecodedIds<'_>>, Self::Stop>> {
        self.0.next().map(|s| {
            Ok(SampleRef {
                locations: DecodedIds(s.location_id.iter()),
                frames: s.location_id.len(),
                value: &s.value,
                label: &s.label,
            })
        })
    }
}

/// Why [`Normalizer::run`] stopped.
pub(crate) enum Stopped<E> {
    Normalize(NormalizeError),
    Source(E),
}

impl<E> From<NormalizeError> for Stopped<E> {
    fn from(e: NormalizeError) -> Self {
        Stopped::Normalize(e)
    }
}

/// A location's model id and its index among the frame index's
/// locations, once computed.
#[derive(Clone, Copy)]
struct LocationMemo {
    id: Id,
    index: u32,
}

impl LocationMemo {
    /// A location not computed yet (no index is u32::MAX: the decoder's
    /// limits bound the locations).
    const NOT_YET: LocationMemo = LocationMemo {
        id: Id::ZERO,
        index: u32::MAX,
    };

    #[inline]
    fn computed(&self) -> bool {
        self.index != u32::MAX
    }
}

pub(crate) struct Normalizer<'a> {
    p: &'a pprof::Profile,
    /// The profile's string table (`p.string_table` is not read: the
    /// one pass of decode borrows the strings from the request instead).
    strings: &'a [&'a str],
    /// Where the locations' lines are (the one pass of decode keeps them
    /// in one vector for the profile, not one a location).
    location_lines: crate::wire::LocationLines<'a>,
    opts: &'a NormalizeOptions,
    /// pprof location id → position in the profile's table.
    location_index: IdIndex,
    /// pprof location id → its model id and index among
    /// `frame_index.locations`, once computed (a sample's frames read
    /// these only: 20 bytes an entry).
    locations: IdTable<LocationMemo>,
    fn_index: IdIndex,
    map_index: IdIndex,
    /// Content ids of the pprof's functions and mappings (by position),
    /// computed from the borrowed strings when first named.
    fn_ids: Vec<Option<Id>>,
    map_ids: Vec<Option<Id>>,
    /// The output's stacks; its locations, functions and mappings are
    /// built at the end, for the stacks kept only ([`Normalizer::tables`]).
    symbols: Symbols,
    /// Every location named so far (one entry per pprof location, so a
    /// content id may repeat) and the stacks kept, each stack's frames as
    /// indexes: compacted at the end and written into `symbols`.
    frame_index: fathom_model::FrameIndex,
    /// The pprof position of each entry of `frame_index.locations`.
    positions: Vec<u32>,
    /// A location's lines while its id is computed (reused).
    lines: Vec<Line>,
    /// About how many samples `run` will read.
    expected_samples: usize,
}

impl<'a> Normalizer<'a> {
    /// A normalizer of `p`, whose samples ([`Normalizer::run`] reads them
    /// from a [`Samples`]) number about `samples` and name at most about
    /// `frames` locations together: tables are sized for them (the frames
    /// of a profile's stacks, grown by doubling, cost one process's ingest
    /// 2 % in copies and fresh pages). `indexes` are `p`'s.
    pub(crate) fn new(
        p: &'a pprof::Profile,
        indexes: Indexes,
        lines: crate::wire::LocationLines<'a>,
        strings: &'a [&'a str],
        opts: &'a NormalizeOptions,
        samples: usize,
        frames: usize,
    ) -> Self {
        Normalizer {
            p,
            strings,
            location_lines: lines,
            opts,
            locations: IdTable::new(&indexes.locations, LocationMemo::NOT_YET),
            location_index: indexes.locations,
            fn_index: indexes.functions,
            map_index: indexes.mappings,
            fn_ids: vec![None; p.function.len()],
            map_ids: vec![None; p.mapping.len()],
            symbols: Symbols::default(),
            frame_index: fathom_model::FrameIndex {
                locations: Vec::with_capacity(p.location.len()),
                stacks: Vec::with_capacity(samples),
                indexes: Vec::with_capacity(frames),
            },
            positions: Vec::with_capacity(p.location.len()),
            lines: Vec::new(),
            expected_samples: samples,
        }
    }

    fn string(&self, index: i64, what: &'static str) -> Result<&'a str, NormalizeError> {
        let t = self.strings;
        if index == 0 {
            return Ok(t.first().copied().unwrap_or(""));
        }
        usize::try_from(index)
            .ok()
            .and_then(|i| t.get(i))
            .copied()
            .ok_or(NormalizeError::StringIndex {
                what,
                index,
                len: t.len(),
            })
    }

    fn mapping_id(&mut self, location: u64, id: u64) -> Result<Id, NormalizeError> {
        if id == 0 {
            return Ok(Id::ZERO);
        }
        let i = self
            .map_index
            .get(id)
            .ok_or(NormalizeError::UnknownMapping {
                location,
                mapping: id,
            })?;
        if let Some(id) = self.map_ids[i] {
            return Ok(id);
        }
        let m = &self.p.mapping[i];
        let mid = Mapping::id_of(
            [m.memory_start, m.memory_limit, m.file_offset],
            self.string(m.filename, "a mapping file name")?,
            self.string(m.build_id, "a mapping build id")?,
        );
        self.map_ids[i] = Some(mid);
        Ok(mid)
    }

    fn function_id(&mut self, location: u64, id: u64) -> Result<Id, NormalizeError> {
        let i = self
            .fn_index
            .get(id)
            .ok_or(NormalizeError::UnknownFunction {
                location,
                function: id,
            })?;
        if let Some(id) = self.fn_ids[i] {
            return Ok(id);
        }
        let f = &self.p.function[i];
        let fid = Function::id_of(
            self.string(f.name, "a function name")?,
            self.string(f.system_name, "a function system name")?,
            self.string(f.filename, "a function file name")?,
            f.start_line,
        );
        self.fn_ids[i] = Some(fid);
        Ok(fid)
    }

    /// The model id and index among `frame_index.locations` of pprof
    /// location `id` when the sample loop does not find them in place: a
    /// location the profile does not have, or one whose ids
    /// [`Normalizer::all_location_ids`] could not compute, which computing
    /// them again reports (out of line, so that the loop stays small).
    #[inline(never)]
    fn missing_location_id(
        &mut self,
        sample: usize,
        id: u64,
    ) -> Result<LocationMemo, NormalizeError> {
        let pos = self
            .location_index
            .get(id)
            .ok_or(NormalizeError::UnknownLocation {
                sample,
                location: id,
            })?;
        debug_assert!(
            self.locations.get(id).is_none_or(|m| !m.computed()),
            "the sample loop reads a known location in place"
        );
        // Fewer than u32::MAX: the decoder's limits bound the locations.
        let memo = self.location_memo(pos as u32)?;
        self.locations.set(id, memo);
        Ok(memo)
    }

    /// Computes the ids of every location of the profile in the order of
    /// its table, before the samples are read: the table, its lines and
    /// (in most profiles) its functions are then read front to back, where
    /// in the order the samples first name them they were read at random,
    /// a cache miss a location. A location whose ids fail (a function or
    /// mapping that does not exist) is left for the samples: the error is
    /// reported only if a sample names it, as before.
    fn all_location_ids(&mut self) {
        let p = self.p;
        for (pos, l) in p.location.iter().enumerate() {
            // Fewer than u32::MAX: the decoder's limits bound the locations.
            if let Ok(memo) = self.location_memo(pos as u32) {
                self.locations.set(l.id, memo);
            }
        }
    }

    /// The ids of the location at `pos` of the table, remembered in the
    /// frame index (its model id and index among `frame_index.locations`);
    /// nothing is remembered when it fails.
    fn location_memo(&mut self, pos: u32) -> Result<LocationMemo, NormalizeError> {
        let l = &self.p.location[pos as usize];
        let mapping = self.mapping_id(l.id, l.mapping_id)?;
        let mut lines = std::mem::take(&mut self.lines);
        lines.clear();
        // A line without a function names nothing: it is dropped.
        let location_lines = self.location_lines.of(&self.p.location, pos as usize);
        for ln in location_lines.iter().filter(|ln| ln.function_id != 0) {
            lines.push(Line {
                function: self.function_id(l.id, ln.function_id)?,
                line: ln.line,
            });
        }
        let lid = Location::id_of(&mapping, l.address, lines.iter().copied());
        self.lines = lines;
        // Fewer than u32::MAX: the decoder's limits bound the locations.
        let memo = LocationMemo {
            id: lid,
            index: self.frame_index.locations.len() as u32,
        };
        self.frame_index.locations.push(lid);
        self.positions.push(pos);
        Ok(memo)
    }

    /// Asks the head (if any) which of the profile's stacks it holds, all
    /// at once per series (one loop of lookups, whose cache misses
    /// overlap), and builds the others into the table; the frame index
    /// keeps those only. Whether any was left out.
    fn stacks(&mut self, series: &[Series]) -> bool {
        let fi = &mut self.frame_index;
        let held = match self.opts.held.as_deref() {
            Some(h) => {
                let ids: Vec<Id> = fi.stacks.iter().map(|s| s.0).collect();
                match series {
                    [one] => h.holds(&one.labels, &ids),
                    _ => {
                        // Series may go to other heads: a stack is left
                        // out only when the heads of every series that
                        // names it hold it.
                        let mut not_held = fathom_model::IdSet::default();
                        for s in series {
                            let answers = h.holds(&s.labels, &s.stacks);
                            for (id, held) in s.stacks.iter().zip(answers) {
                                if !held {
                                    not_held.insert(*id);
                                }
                            }
                        }
                        ids.iter().map(|id| !not_held.contains(id)).collect()
                    }
                }
            }
            None => Vec::new(),
        };
        let left_out = held.iter().any(|&h| h);
        let kept = fi.stacks.len() - held.iter().filter(|&&h| h).count();
        self.symbols.stacks.reserve(kept);
        let mut stacks = Vec::with_capacity(if left_out { kept } else { 0 });
        let mut indexes = Vec::new();
        let mut start = 0;
        for (k, &(id, end)) in fi.stacks.iter().enumerate() {
            let frames = &fi.indexes[start..end as usize];
            start = end as usize;
            if held.get(k).copied().unwrap_or(false) {
                continue;
            }
            let locations = frames.iter().map(|&i| fi.locations[i as usize]).collect();
            self.symbols.stacks.insert(id, Stack { locations });
            if left_out {
                indexes.extend_from_slice(frames);
                stacks.push((id, indexes.len() as u32));
            }
        }
        if left_out {
            fi.stacks = stacks;
            fi.indexes = indexes;
        }
        left_out
    }

    /// Builds the tables of what the kept stacks name (every stack, unless
    /// the head holds some): each location once, its functions and
    /// mapping; the frame index is compacted to those locations.
    fn tables(&mut self) {
        let Normalizer {
            p,
            strings,
            location_lines,
            fn_index,
            map_index,
            fn_ids,
            map_ids,
            symbols,
            frame_index: fi,
            positions,
            ..
        } = self;
        let p: &pprof::Profile = p;
        // The owned string at a string table index already checked.
        let strings: &[&str] = strings;
        let owned = |index: i64| -> String {
            usize::try_from(index)
                .ok()
                .and_then(|i| strings.get(i))
                .map(|s| (*s).to_owned())
                .unwrap_or_default()
        };
        let n = fi.locations.len();
        let mut needed = vec![false; n];
        for &i in &fi.indexes {
            needed[i as usize] = true;
        }
        let mut remap = vec![u32::MAX; n];
        let mut kept: Vec<Id> = Vec::with_capacity(n);
        // Where a location id already in `kept` is, for the rare pprof
        // that lists the same location twice under two ids (built at the
        // first such repeat).
        let mut at: Option<fathom_model::IdMap<u32>> = None;
        let count = needed.iter().filter(|&&x| x).count();
        symbols.locations.reserve(count);
        for i in 0..n {
            if !needed[i] {
                continue;
            }
            let lid = fi.locations[i];
            match symbols.locations.entry(lid) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    let pos = positions[i] as usize;
                    let l = &p.location[pos];
                    let mapping = map_index
                        .get(l.mapping_id)
                        .and_then(|m| map_ids[m].map(|id| (m, id)));
                    let lines: Vec<Line> = location_lines
                        .of(&p.location, pos)
                        .iter()
                        .filter(|ln| ln.function_id != 0)
                        .filter_map(|ln| {
                            let f = fn_index.get(ln.function_id)?;
                            let function = fn_ids[f]?;
                            if let std::collections::hash_map::Entry::Vacant(e) =
                                symbols.functions.entry(function)
                            {
                                let f = &p.function[f];
                                e.insert(Function {
                                    name: owned(f.name),
                                    system_name: owned(f.system_name),
                                    filename: owned(f.filename),
                                    start_line: f.start_line,
                                });
                            }
                            Some(Line {
                                function,
                                line: ln.line,
                            })
                        })
                        .collect();
                    if let Some((m, id)) = mapping
                        && let std::collections::hash_map::Entry::Vacant(e) =
                            symbols.mappings.entry(id)
                    {
                        let m = &p.mapping[m];
                        e.insert(Mapping {
                            memory_start: m.memory_start,
                            memory_limit: m.memory_limit,
                            file_offset: m.file_offset,
                            filename: owned(m.filename),
                            build_id: owned(m.build_id),
                        });
                    }
                    v.insert(Location {
                        mapping: mapping.map_or(Id::ZERO, |(_, id)| id),
                        address: l.address,
                        lines,
                    });
                    remap[i] = kept.len() as u32;
                    if let Some(m) = &mut at {
                        m.insert(lid, kept.len() as u32);
                    }
                    kept.push(lid);
                }
                std::collections::hash_map::Entry::Occupied(_) => {
                    let m = at.get_or_insert_with(|| {
                        kept.iter()
                            .enumerate()
                            .map(|(k, l)| (*l, k as u32))
                            .collect()
                    });
                    remap[i] = m.get(&lid).copied().unwrap_or(0);
                }
            }
        }
        if kept.len() != n {
            for x in &mut fi.indexes {
                *x = remap[*x as usize];
            }
        }
        fi.locations = kept;
    }

    /// The series labels for a sample's string labels.
    fn series_labels(&self, raw: &[(i64, i64)]) -> Result<Labels, NormalizeError> {
        let mut labels = self.opts.labels.clone();
        for &(k, v) in raw {
            let key = self.string(k, "a sample label key")?;
            let value = self.string(v, "a sample label value")?;
            if value.is_empty() || key.starts_with("__") || IGNORED_SAMPLE_LABELS.contains(&key) {
                continue;
            }
            let Some(name) = sanitize_label_name(key) else {
                continue;
            };
            // Series labels from the options win; then the first value.
            if labels.get(&name).is_none() {
                labels.insert(&name, value);
            }
        }
        Ok(labels)
    }

    pub(crate) fn run<S: Samples>(
        mut self,
        samples: &mut S,
    ) -> Result<Normalized, Stopped<S::Stop>> {
        let p = self.p;
        let expected = self.expected_samples;
        let (pt, pu) = match &p.period_type {
            Some(vt) => (
                self.string(vt.r#type, "the period type")?,
                self.string(vt.unit, "the period unit")?,
            ),
            None => ("", ""),
        };
        let hint = self.opts.name_hint.as_deref();
        // Sample types with the same profile type share one output.
        let mut types: Vec<ProfileType> = Vec::new();
        let mut slot_of_type: Vec<usize> = Vec::with_capacity(p.sample_type.len());
        for vt in &p.sample_type {
            let t = profile_type(
                self.string(vt.r#type, "a sample type")?,
                self.string(vt.unit, "a sample unit")?,
                pt,
                pu,
                hint,
            );
            let slot = match types.iter().position(|x| *x == t) {
                Some(s) => s,
                None => {
                    types.push(t);
                    types.len() - 1
                }
            };
            slot_of_type.push(slot);
        }
        let ntypes = types.len();
        let want = p.sample_type.len();

        let mut series: Vec<Series> = Vec::new();
        let mut plain_series: Option<usize> = None;
        let mut series_by_raw: HashMap<Vec<(i64, i64)>, usize> = HashMap::new();
        let mut series_by_labels: HashMap<Labels, usize> = HashMap::new();
        let mut raw_labels: Vec<(i64, i64)> = Vec::new();
        // A sample's locations, as indexes (its ids go to the hasher).
        let mut frames: Vec<u32> = Vec::new();
        let mut stack_hasher = StackHasher::default();
        // The keyed hash of every map of ids: crafted stacks cannot
        // choose their slots.
        let id_hash = fathom_model::IdHashState::default();
        // The head's generation is read before its first answer, so a cut
        // since shows as another generation.
        let generation = self.opts.held.as_deref().map(|h| h.generation());
        // The profile's stacks, once there are several series.
        let mut seen: Option<fathom_model::IdSet> = None;

        // Every location first, in table order (a profile's samples name
        // nearly all of its locations).
        self.all_location_ids();
        let mut next = 0usize;
        while let Some(s) = samples.next_sample() {
            let s = s.map_err(Stopped::Source)?;
            let si = next;
            next += 1;
            if s.value.len() != want {
                return Err(NormalizeError::ValueCount {
                    sample: si,
                    got: s.value.len(),
                    want,
                }
                .into());
            }
            // All-zero samples contribute nothing; samples without
            // locations have no stack to attribute their value to. Their
            // locations must exist all the same.
            if s.value.iter().all(|&v| v == 0) || s.frames == 0 {
                for location in s.locations {
                    let location = location.map_err(Stopped::Source)?;
                    if self.location_index.get(location).is_none() {
                        return Err(NormalizeError::UnknownLocation {
                            sample: si,
                            location,
                        }
                        .into());
                    }
                }
                continue;
            }
            raw_labels.clear();
            raw_labels.extend(
                s.label
                    .iter()
                    .filter(|l| l.str != 0)
                    .map(|l| (l.key, l.str)),
            );
            let known = if raw_labels.is_empty() {
                plain_series
            } else {
                series_by_raw.get(raw_labels.as_slice()).copied()
            };
            let sidx = match known {
                Some(i) => i,
                None => {
                    let labels = self.series_labels(&raw_labels)?;
                    let i = match series_by_labels.get(&labels) {
                        Some(&i) => i,
                        None => {
                            if series.len() >= self.opts.max_series {
                                return Err(NormalizeError::TooManySeries {
                                    limit: self.opts.max_series,
                                }
                                .into());
                            }
                            // The first series usually holds most
                            // samples (all of them without sample
                            // labels): sized for them, so its map never
                            // rehashes; later ones grow as needed.
                            let expect = if series.is_empty() { expected } else { 0 };
                            series.push(Series {
                                labels: labels.clone(),
                                slots: hashbrown::HashTable::with_capacity(expect),
                                stacks: Vec::with_capacity(expect),
                                values: Vec::with_capacity(expect.saturating_mul(ntypes)),
                            });
                            series_by_labels.insert(labels, series.len() - 1);
                            series.len() - 1
                        }
                    };
                    if raw_labels.is_empty() {
                        plain_series = Some(i);
                    } else {
                        series_by_raw.insert(raw_labels.clone(), i);
                    }
                    i
                }
            };

            frames.clear();
            stack_hasher.begin(s.frames);
            for lid in s.locations {
                let lid = lid.map_err(Stopped::Source)?;
                // Every location's ids are in place once `all_location_ids`
                // ran: read there, not returned through a `Result`, whose
                // copies through the stack held about a seventh of this
                // loop's own time in `perf annotate`.
                let memo = match self.locations.get(lid) {
                    Some(&memo) if memo.computed() => memo,
                    _ => self.missing_location_id(si, lid)?,
                };
                stack_hasher.push(&memo.id);
                frames.push(memo.index);
            }
            let stack_id = stack_hasher.finish();

            let several = series.len() > 1;
            let ser = &mut series[sidx];
            let stacks = &ser.stacks;
            let same = |s: &u32| stacks.get(*s as usize) == Some(&stack_id);
            let rehash = |s: &u32| stacks.get(*s as usize).map_or(0, |id| id_hash.hash_one(id));
            let slot = match ser.slots.entry(id_hash.hash_one(stack_id), same, rehash) {
                hashbrown::hash_table::Entry::Occupied(e) => *e.get() as usize,
                hashbrown::hash_table::Entry::Vacant(e) => {
                    // New to this series, so new to the profile while there
                    // is one series; with more, a set of the profile's
                    // stacks (built when the second one appears) says.
                    let fi = &mut self.frame_index;
                    let new = !several
                        || seen
                            .get_or_insert_with(|| fi.stacks.iter().map(|s| s.0).collect())
                            .insert(stack_id);
                    if new {
                        fi.indexes.extend_from_slice(&frames);
                        fi.stacks.push((stack_id, fi.indexes.len() as u32));
                    }
                    let slot = ser.stacks.len();
                    ser.stacks.push(stack_id);
                    ser.values.resize(ser.values.len() + ntypes, 0);
                    e.insert(slot as u32);
                    slot
                }
            };
            let row = &mut ser.values[slot * ntypes..(slot + 1) * ntypes];
            for (t, &v) in s.value.iter().enumerate() {
                let cell = &mut row[slot_of_type[t]];
                *cell = cell.wrapping_add(v);
            }
        }

        let time_nanos = self.opts.time_nanos_override.unwrap_or(p.time_nanos);
        let duration_nanos = self
            .opts
            .duration_nanos_override
            .unwrap_or(p.duration_nanos);
        let type_strings: Vec<String> = types.iter().map(ToString::to_string).collect();
        let mut profiles = Vec::new();
        for ser in &series {
            let labels_string = ser.labels.to_string();
            let order = by_stack(&ser.stacks);
            for (t, ty) in types.iter().enumerate() {
                // The type's values in stack order, and how many are not
                // zero: the vector is allocated at its final size, since a
                // head keeps it as it is (grown by doubling, it would be
                // copied about twice and then trimmed).
                let values = order.iter().map(|&(_, slot)| ser.values[slot * ntypes + t]);
                let kept = values.clone().filter(|&v| v != 0).count();
                if kept == 0 {
                    continue;
                }
                let mut samples: Vec<Sample> = Vec::with_capacity(kept);
                samples.extend(
                    order
                        .iter()
                        .zip(values)
                        .filter(|&(_, value)| value != 0)
                        .map(|(&(stack, _), value)| Sample { stack, value }),
                );
                profiles.push(Profile {
                    id: profile_id(&self.opts.profile_id_seed, &type_strings[t], &labels_string),
                    profile_type: ty.clone(),
                    labels: ser.labels.clone(),
                    time_nanos,
                    duration_nanos,
                    period: p.period,
                    samples,
                });
            }
        }
        let left_out = self.stacks(&series);
        self.tables();
        let mut symbols = self.symbols;
        if left_out {
            symbols.relies_on = generation;
        }
        // The frames of every stack of a pprof within the decoder's limits
        // number fewer than u32::MAX; otherwise no index.
        if u32::try_from(self.frame_index.indexes.len()).is_ok() {
            debug_assert!(self.frame_index.matches(&symbols));
            symbols.frame_index = Some(std::sync::Arc::new(self.frame_index));
        }
        Ok(Normalized { profiles, symbols })
    }
}

/// The deterministic id of an output profile.
pub(crate) fn profile_id(seed: &Id, profile_type: &str, labels: &str) -> Id {
    IdHasher::new("profile")
        .id(seed)
        .str(profile_type)
        .str(labels)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `p`'s samples as columns, and its strings.
    fn columns(p: &pprof::Profile) -> (SampleColumns, Vec<&str>) {
        let mut c = SampleColumns::default();
        for s in &p.sample {
            c.push(
                s.location_id.iter().copied(),
                &s.value,
                s.label.iter().cloned(),
            );
        }
        (c, p.string_table.iter().map(String::as_str).collect())
    }

    /// The profiles and symbols of a pprof's samples given as columns
    /// are those of the pprof, over the fixture and every protobuf
    /// profile of the shared corpus, with sample labels and without.
    #[test]
    fn columns_normalize_as_the_pprof_does() {
        let opts = NormalizeOptions {
            labels: Labels::from_pairs([("service_name", "columns")]).unwrap(),
            ..Default::default()
        };
        let check = |name: &str, p: &pprof::Profile| {
            let (c, strings) = columns(p);
            assert_eq!(c.len(), p.sample.len());
            let tables = pprof::Profile {
                sample: Vec::new(),
                string_table: Vec::new(),
                ..p.clone()
            };
            let got = normalize_columns(&tables, &strings, &c, &opts);
            let want = normalize(p, &opts);
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    assert_eq!(got, want, "{name}");
                    assert_eq!(got.profiles, want.profiles, "{name}");
                    assert_eq!(got.symbols.frame_index, want.symbols.frame_index, "{name}");
                }
                (got, want) => assert_eq!(got.err(), want.err(), "{name}"),
            }
        };
        check("labelled", &labelled());
        let mut checked = 0;
        for (name, raw) in crate::protobuf_corpus() {
            let Ok(p) = crate::decode(&raw, &crate::Limits::default()) else {
                continue;
            };
            check(&name, &p);
            checked += 1;
        }
        assert!(checked > 100, "only {checked} corpus profiles read");
    }

    fn pt(s: &str, su: &str, p: &str, pu: &str, h: Option<&str>) -> String {
        profile_type(s, su, p, pu, h).to_string()
    }

    #[test]
    fn naming_rules() {
        assert_eq!(
            pt("cpu", "nanoseconds", "cpu", "nanoseconds", None),
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        );
        assert_eq!(
            pt("samples", "count", "cpu", "nanoseconds", None),
            "process_cpu:samples:count:cpu:nanoseconds"
        );
        assert_eq!(
            pt("alloc_space", "bytes", "space", "bytes", None),
            "memory:alloc_space:bytes:space:bytes"
        );
        assert_eq!(
            pt("contentions", "count", "contentions", "count", None),
            "mutex:contentions:count:contentions:count"
        );
        assert_eq!(
            pt(
                "delay",
                "nanoseconds",
                "contentions",
                "count",
                Some("block_duration")
            ),
            "block:delay:nanoseconds:contentions:count"
        );
        assert_eq!(
            pt(
                "contentions",
                "count",
                "block",
                "count",
                Some("mutex_count")
            ),
            "block:contentions:count:block:count"
        );
        assert_eq!(
            pt("goroutine", "count", "goroutine", "count", None),
            "goroutines:goroutine:count:goroutine:count"
        );
        assert_eq!(
            pt("wall", "nanoseconds", "wall", "nanoseconds", None),
            "wall:wall:nanoseconds:wall:nanoseconds"
        );
        assert_eq!(
            pt("sample", "count", "wall", "microseconds", None),
            "wall:sample:count:wall:microseconds"
        );
        assert_eq!(
            pt("samples", "count", "wallclock", "nanoseconds", None),
            "wall:samples:count:wallclock:nanoseconds"
        );
        assert_eq!(
            pt("time", "nanoseconds", "wallclock", "nanoseconds", None),
            "wall:time:nanoseconds:wallclock:nanoseconds"
        );
        assert_eq!(
            pt("samples", "count", "", "milliseconds", None),
            "process_cpu:samples:count:unknown:milliseconds"
        );
        assert_eq!(
            pt("thread", "count", "thread", "count", None),
            "thread:thread:count:thread:count"
        );
        assert_eq!(
            pt("thread", "count", "thread", "count", Some("threads")),
            "threads:thread:count:thread:count"
        );
        assert_eq!(
            pt("", "", "", "", None),
            "unknown:unknown:count:unknown:count"
        );
        assert_eq!(
            pt("", "", "", "", Some("goroutines")),
            "goroutines:unknown:count:unknown:count"
        );
        assert_eq!(
            pt("exception", "count", "", "nanoseconds", Some("cpu")),
            "exceptions:exception:count:unknown:nanoseconds"
        );
        assert_eq!(
            pt("lock-time", "nanoseconds", "", "nanoseconds", None),
            "mutex:lock-time:nanoseconds:unknown:nanoseconds"
        );
        assert_eq!(
            pt("CPU", "nanoseconds", "CPU", "nanoseconds", None),
            "process_cpu:CPU:nanoseconds:CPU:nanoseconds"
        );
        assert_eq!(pt("a:b", "c:d", "e", "f", Some("x y")), "x_y:a_b:c_d:e:f");
        assert_eq!(
            pt("live", "count", "objects", "count", None),
            "memory:live:count:objects:count"
        );
        // The placeholder is stable.
        assert_eq!(
            pt("samples", "count", "unknown", "milliseconds", None),
            "process_cpu:samples:count:unknown:milliseconds"
        );
        assert_eq!(
            pt("unknown", "count", "unknown", "count", None),
            "unknown:unknown:count:unknown:count"
        );
    }

    #[test]
    fn go_display_names() {
        let d = |s| go_pprof_display_name(s).into_owned();
        assert_eq!(d("main.foo"), "main.foo");
        assert_eq!(
            d("std::vector<int>::push_back(int const&)"),
            "std::vector::push_back"
        );
        assert_eq!(
            d("<alloc::alloc::Global as core::alloc::Allocator>::allocate"),
            "::allocate"
        );
        assert_eq!(
            d("p.New[go.shape.interface { At() int; Seek(int) bool }]"),
            "p.New[go.shape.interface { At int; Seek bool }]"
        );
        assert_eq!(d("p.(*T[...]).M"), "p.(*T[...]).M");
        assert_eq!(d("java.lang.Object.<init>"), "java.lang.Object.<init>");
        assert_eq!(d("a::b)c(d)"), "a::b)c(d)");
        assert_eq!(d("f<(a)>::g"), "f::g");
    }

    #[test]
    fn label_names() {
        assert_eq!(sanitize_label_name("span-id").as_deref(), Some("span_id"));
        assert_eq!(sanitize_label_name("1x").as_deref(), Some("_x"));
        assert_eq!(sanitize_label_name("a.b_c9").as_deref(), Some("a.b_c9"));
        assert_eq!(sanitize_label_name("é").as_deref(), Some("_"));
        assert_eq!(sanitize_label_name(""), None);
    }

    fn strings(p: &mut pprof::Profile, s: &str) -> i64 {
        if let Some(i) = p.string_table.iter().position(|x| x == s) {
            return i as i64;
        }
        p.string_table.push(s.to_owned());
        p.string_table.len() as i64 - 1
    }

    /// cpu profile: two functions, samples with labels.
    fn labelled() -> pprof::Profile {
        let mut p = pprof::Profile {
            string_table: vec![String::new()],
            ..Default::default()
        };
        let cpu = strings(&mut p, "cpu");
        let ns = strings(&mut p, "nanoseconds");
        let samples = strings(&mut p, "samples");
        let count = strings(&mut p, "count");
        p.sample_type = vec![
            pprof::ValueType {
                r#type: samples,
                unit: count,
            },
            pprof::ValueType {
                r#type: cpu,
                unit: ns,
            },
        ];
        p.period_type = Some(pprof::ValueType {
            r#type: cpu,
            unit: ns,
        });
        p.period = 10;
        p.time_nanos = 77;
        for (id, name) in [(1u64, "main"), (2, "work")] {
            let n = strings(&mut p, name);
            p.function.push(pprof::Function {
                id,
                name: n,
                ..Default::default()
            });
            p.location.push(pprof::Location {
                id,
                address: id * 16,
                line: vec![pprof::Line {
                    function_id: id,
                    line: 1,
                    column: 0,
                }],
                ..Default::default()
            });
        }
        let k = strings(&mut p, "handler");
        let k2 = strings(&mut p, "service_name");
        let k3 = strings(&mut p, "span_id");
        let v1 = strings(&mut p, "/a");
        let v2 = strings(&mut p, "/b");
        let lab = |key, str| pprof::Label {
            key,
            str,
            ..Default::default()
        };
        p.sample = vec![
            pprof::Sample {
                location_id: vec![2, 1],
                value: vec![1, 10],
                label: vec![lab(k, v1), lab(k3, v2)],
            },
            pprof::Sample {
                location_id: vec![2, 1],
                value: vec![2, 20],
                label: vec![lab(k3, v1), lab(k, v1)],
            },
            pprof::Sample {
                location_id: vec![1],
                value: vec![0, 5],
                label: vec![lab(k, v2), lab(k2, v2)],
            },
            pprof::Sample {
                location_id: vec![1],
                value: vec![0, 0],
                label: vec![],
            },
            pprof::Sample {
                location_id: vec![2, 1],
                value: vec![4, 40],
                label: vec![pprof::Label {
                    key: k,
                    num: 3,
                    ..Default::default()
                }],
            },
        ];
        p
    }

    #[test]
    fn splits_by_labels_and_sums() {
        let p = labelled();
        let opts = NormalizeOptions {
            labels: Labels::from_pairs([("service_name", "svc")]).expect("valid"),
            ..Default::default()
        };
        let n = normalize(&p, &opts).expect("normalizes");
        type Summary = (String, String, Vec<(Vec<String>, i64)>);
        let summary: Vec<Summary> = n
            .profiles
            .iter()
            .map(|x| {
                (
                    x.profile_type.to_string(),
                    x.labels.to_string(),
                    x.samples
                        .iter()
                        .map(|s| (n.symbols.frames(&s.stack), s.value))
                        .collect(),
                )
            })
            .collect();
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            summary,
            vec![
                (
                    "process_cpu:samples:count:cpu:nanoseconds".into(),
                    r#"{handler="/a", service_name="svc"}"#.into(),
                    vec![(f(&["main", "work"]), 3)]
                ),
                (
                    "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
                    r#"{handler="/a", service_name="svc"}"#.into(),
                    vec![(f(&["main", "work"]), 30)]
                ),
                (
                    "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
                    r#"{handler="/b", service_name="svc"}"#.into(),
                    vec![(f(&["main"]), 5)]
                ),
                (
                    "process_cpu:samples:count:cpu:nanoseconds".into(),
                    r#"{service_name="svc"}"#.into(),
                    vec![(f(&["main", "work"]), 4)]
                ),
                (
                    "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
                    r#"{service_name="svc"}"#.into(),
                    vec![(f(&["main", "work"]), 40)]
                ),
            ]
        );
        // A head keeps each sample vector as it is: none has room to
        // spare, zero values (the /b series' `samples` type) left out.
        for x in &n.profiles {
            assert_eq!(x.samples.capacity(), x.samples.len(), "{}", x.labels);
        }
        let first = &n.profiles[0];
        assert_eq!(first.time_nanos, 77);
        assert_eq!(first.period, 10);
        assert_eq!(
            first.id,
            profile_id(
                &Id::ZERO,
                "process_cpu:samples:count:cpu:nanoseconds",
                r#"{handler="/a", service_name="svc"}"#
            )
        );
        // Deterministic.
        assert_eq!(normalize(&p, &opts).expect("normalizes"), n);
        // Overrides.
        let o2 = NormalizeOptions {
            time_nanos_override: Some(5),
            duration_nanos_override: Some(6),
            ..opts.clone()
        };
        let n2 = normalize(&p, &o2).expect("normalizes");
        assert!(
            n2.profiles
                .iter()
                .all(|x| x.time_nanos == 5 && x.duration_nanos == 6)
        );
    }

    /// Every profile's samples come in stack id order (the order a block
    /// stores them), whatever order the pprof gives them in, each type's
    /// values with their stacks, zeros left out.
    #[test]
    fn samples_come_in_stack_order() {
        let mut p = labelled();
        let sample = |location_id: Vec<u64>, value: Vec<i64>| pprof::Sample {
            location_id,
            value,
            label: vec![],
        };
        p.sample = vec![
            sample(vec![1], vec![1, 10]),
            sample(vec![2, 1], vec![2, 20]),
            sample(vec![2], vec![0, 30]),
            sample(vec![1, 2], vec![4, 40]),
            sample(vec![2, 2, 1], vec![5, 50]),
        ];
        let n = normalize(&p, &NormalizeOptions::default()).expect("normalizes");
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // Each type's (frames, value) pairs, zeros left out.
        let want = [
            vec![
                (f(&["main"]), 1),
                (f(&["main", "work"]), 2),
                (f(&["main", "work", "work"]), 5),
                (f(&["work", "main"]), 4),
            ],
            vec![
                (f(&["main"]), 10),
                (f(&["main", "work"]), 20),
                (f(&["main", "work", "work"]), 50),
                (f(&["work"]), 30),
                (f(&["work", "main"]), 40),
            ],
        ];
        assert_eq!(n.profiles.len(), want.len());
        for (x, want) in n.profiles.iter().zip(want) {
            assert!(
                x.samples.is_sorted_by(|a, b| a.stack < b.stack),
                "{} not in stack order",
                x.profile_type
            );
            let mut got: Vec<(Vec<String>, i64)> = x
                .samples
                .iter()
                .map(|s| (n.symbols.frames(&s.stack), s.value))
                .collect();
            got.sort_unstable();
            assert_eq!(got, want, "{}", x.profile_type);
        }
    }

    /// Every stack's frames by index name its locations, in order; a
    /// location the pprof lists twice (two ids, same content) is one
    /// location with one index.
    #[test]
    fn frame_index_names_every_frame() {
        let mut p = labelled();
        let mut twin = p.location[0].clone();
        twin.id = 3;
        p.location.push(twin);
        p.sample.push(pprof::Sample {
            location_id: vec![3, 2, 1, 3],
            value: vec![1, 1],
            label: vec![],
        });
        let n = normalize(&p, &NormalizeOptions::default()).expect("normalizes");
        let s = &n.symbols;
        let fi = s.frame_index.as_deref().expect("normalize indexes frames");
        assert!(fi.matches(s));
        assert_eq!(fi.locations.len(), 2, "location 3 is location 1");
        assert_eq!(fi.stacks.len(), s.stacks.len());
        for (k, (id, _)) in fi.stacks.iter().enumerate() {
            let named: Vec<Id> = fi
                .frames(k)
                .expect("every stack has frames")
                .iter()
                .map(|&i| fi.locations[i as usize])
                .collect();
            assert_eq!(named, s.stacks[id].locations);
        }
        let deep = fi.frames(fi.stacks.len() - 1).expect("the last stack");
        assert_eq!(deep.len(), 4);
        assert_eq!(deep[0], deep[3]);
        assert_eq!(fi.frames(fi.stacks.len()), None);
        // Merging tables drops the index, which no longer describes them.
        let mut merged = s.clone();
        merged.merge(
            &normalize(&labelled(), &NormalizeOptions::default())
                .unwrap()
                .symbols,
        );
        assert_eq!(merged.frame_index, None);
    }

    #[test]
    fn series_limit() {
        let opts = NormalizeOptions {
            max_series: 2,
            ..Default::default()
        };
        assert_eq!(
            normalize(&labelled(), &opts),
            Err(NormalizeError::TooManySeries { limit: 2 })
        );
    }

    #[test]
    fn reports_bad_references() {
        let mut p = labelled();
        p.sample[0].location_id.push(42);
        assert_eq!(
            normalize(&p, &NormalizeOptions::default()),
            Err(NormalizeError::UnknownLocation {
                sample: 0,
                location: 42
            })
        );
        let mut p = labelled();
        p.function[0].name = 999;
        assert!(matches!(
            normalize(&p, &NormalizeOptions::default()),
            Err(NormalizeError::StringIndex { index: 999, .. })
        ));
    }

    /// Every location's ids are computed before the samples are read, but
    /// a location no sample names is not checked: one naming a function
    /// that does not exist refuses the profile only once a sample names it.
    #[test]
    fn a_bad_location_no_sample_names_is_not_an_error() {
        let good = normalize(&labelled(), &NormalizeOptions::default()).expect("labelled");
        let mut p = labelled();
        p.location.push(pprof::Location {
            id: 3,
            address: 48,
            line: vec![pprof::Line {
                function_id: 99,
                line: 1,
                column: 0,
            }],
            ..Default::default()
        });
        let n = normalize(&p, &NormalizeOptions::default()).expect("location 3 is not named");
        assert_eq!(n, good);
        assert_eq!(
            n.symbols.frame_index.as_ref().map(|f| f.locations.len()),
            Some(2),
            "the frame index keeps the locations the stacks name"
        );
        p.sample[0].location_id.push(3);
        assert_eq!(
            normalize(&p, &NormalizeOptions::default()),
            Err(NormalizeError::UnknownFunction {
                location: 3,
                function: 99
            })
        );
    }
}
