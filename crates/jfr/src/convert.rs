//! JFR events into one pprof per event kind, then Fathom profiles.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::LazyLock;

use fathom_model::{Id, Labels};
use fathom_pprof::{Limits, NormalizeOptions, Normalized};
use fathom_proto::pprof;
use prost::Message;
use regex::Regex;

use crate::reader::{Chunk, HEADER_SIZE, JStr, Scalar, Types};
use crate::{JfrError, LabelsSnapshot};

type Result<T> = std::result::Result<T, JfrError>;

/// How to turn one recording into Fathom profiles.
#[derive(Clone, Debug)]
pub struct JfrOptions {
    /// Series labels for every profile, including `service_name`; labels
    /// from the labels part never override them.
    pub labels: Labels,
    /// Samples per second of CPU and wall sampling: one sample counts
    /// `1e9 / sample_rate` nanoseconds. Pyroscope's default is 100.
    pub sample_rate: u32,
    /// Replaces the recording's start time.
    pub time_nanos_override: Option<i64>,
    /// Replaces the recording's duration.
    pub duration_nanos_override: Option<i64>,
    /// Seeds the profile ids (see [`fathom_pprof::NormalizeOptions`]).
    pub profile_id_seed: Id,
    /// The most series (label sets) one profile type may produce.
    pub max_series: usize,
}

impl Default for JfrOptions {
    fn default() -> Self {
        JfrOptions {
            labels: Labels::new(),
            sample_rate: fathom_pprof::DEFAULT_SAMPLE_RATE,
            time_nanos_override: None,
            duration_nanos_override: None,
            profile_id_seed: Id::ZERO,
            max_series: fathom_pprof::DEFAULT_MAX_SERIES,
        }
    }
}

/// The kinds of samples, each one output pprof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Cpu,
    Wall,
    InTlab,
    OutTlab,
    Lock,
    Park,
    Live,
    AllocSample,
    Malloc,
}

const KINDS: [Kind; 9] = [
    Kind::Cpu,
    Kind::Wall,
    Kind::InTlab,
    Kind::OutTlab,
    Kind::Lock,
    Kind::Park,
    Kind::Live,
    Kind::AllocSample,
    Kind::Malloc,
];

impl Kind {
    /// (sample types as (type, unit), period type, period unit).
    fn types(
        self,
    ) -> (
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static str,
    ) {
        match self {
            Kind::Cpu => (&[("cpu", "nanoseconds")], "cpu", "nanoseconds"),
            Kind::Wall => (&[("wall", "nanoseconds")], "wall", "nanoseconds"),
            Kind::InTlab => (
                &[
                    ("alloc_in_new_tlab_objects", "count"),
                    ("alloc_in_new_tlab_bytes", "bytes"),
                ],
                "space",
                "bytes",
            ),
            Kind::OutTlab => (
                &[
                    ("alloc_outside_tlab_objects", "count"),
                    ("alloc_outside_tlab_bytes", "bytes"),
                ],
                "space",
                "bytes",
            ),
            Kind::Lock => (
                &[("contentions", "count"), ("delay", "nanoseconds")],
                "mutex",
                "count",
            ),
            Kind::Park => (
                &[("contentions", "count"), ("delay", "nanoseconds")],
                "block",
                "count",
            ),
            Kind::Live => (&[("live", "count")], "objects", "count"),
            Kind::AllocSample => (
                &[
                    ("alloc_sample_objects", "count"),
                    ("alloc_sample_bytes", "bytes"),
                ],
                "space",
                "bytes",
            ),
            Kind::Malloc => (
                &[("malloc_objects", "count"), ("malloc_bytes", "bytes")],
                "space",
                "bytes",
            ),
        }
    }

    fn timed(self) -> bool {
        matches!(self, Kind::Cpu | Kind::Wall)
    }
}

/// The JFR event types the conversion reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Execution,
    WallClock,
    InTlab,
    OutTlab,
    AllocSample,
    MonitorEnter,
    ThreadPark,
    LiveObject,
    Malloc,
    ActiveSetting,
}

fn event_type(name: &str) -> Option<EventType> {
    Some(match name {
        "jdk.ExecutionSample" => EventType::Execution,
        "profiler.WallClockSample" => EventType::WallClock,
        "jdk.ObjectAllocationInNewTLAB" => EventType::InTlab,
        "jdk.ObjectAllocationOutsideTLAB" => EventType::OutTlab,
        "jdk.ObjectAllocationSample" => EventType::AllocSample,
        "jdk.JavaMonitorEnter" => EventType::MonitorEnter,
        "jdk.ThreadPark" => EventType::ThreadPark,
        "profiler.LiveObject" => EventType::LiveObject,
        "profiler.Malloc" => EventType::Malloc,
        "jdk.ActiveSetting" => EventType::ActiveSetting,
        _ => return None,
    })
}

/// Field positions of one event class.
#[derive(Clone, Copy, Debug)]
struct Layout {
    ty: EventType,
    stack: Option<usize>,
    state: Option<usize>,
    context: Option<usize>,
    span_name: Option<usize>,
    /// The second value: `tlabSize`, `allocationSize`, `weight`,
    /// `duration`, `size`; for wall clock samples `samples`.
    value: Option<usize>,
    name: Option<usize>,
    setting: Option<usize>,
}

impl Layout {
    fn of(types: &Types, class: usize, ty: EventType) -> Layout {
        let pos = |n: &str| types.classes[class].fields.iter().position(|f| f.name == n);
        let value = match ty {
            EventType::WallClock => pos("samples"),
            EventType::InTlab => pos("tlabSize"),
            EventType::OutTlab => pos("allocationSize"),
            EventType::AllocSample => pos("weight"),
            EventType::MonitorEnter | EventType::ThreadPark => pos("duration"),
            EventType::Malloc => pos("size"),
            _ => None,
        };
        Layout {
            ty,
            stack: pos("stackTrace"),
            state: pos("state"),
            context: pos("contextId"),
            span_name: pos("spanName"),
            value,
            name: pos("name"),
            setting: pos("value"),
        }
    }
}

/// Pyroscope's merging of JVM-generated names (applied to every symbol):
/// numbered reflection accessors, lambda classes, Spring CGLIB proxies and
/// native libraries extracted under random names get one stable name, so
/// that one code path is one frame across JVM runs.
pub fn merge_generated_names(s: &str) -> String {
    static RULES: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
        [
            (
                r"^(jdk/internal/reflect/GeneratedMethodAccessor)(\d+)$",
                "${1}_",
            ),
            (r"^(.+\$\$Lambda)(\$?\d*[./](0x)?[\da-f]+|\d+)$", "${1}_"),
            (
                r"^(\.?/tmp/)?(libzstd-jni-\d+\.\d+\.\d+-)(\d+)(\.so)( \(deleted\))?$",
                "libzstd-jni-_.so",
            ),
            (
                r"^(\.?/tmp/)?(lib)?(amazonCorrettoCryptoProvider)(NativeLibraries\.)?([0-9a-f]{16})(/libcrypto|/libamazonCorrettoCryptoProvider)?(\.so)( \(deleted\))?$",
                "libamazonCorrettoCryptoProvider_.so",
            ),
            (
                r"^(\.?/tmp/)?(libasyncProfiler)-(linux-arm64|linux-musl-x64|linux-x64|macos)-(17b9a1d8156277a98ccc871afa9a8f69215f92)(\.so)( \(deleted\))?$",
                "libasyncProfiler-_.so",
            ),
            (r"^(.+\$\$EnhancerBySpringCGLIB\$\$)(.*)$", "${1}_"),
        ]
        .into_iter()
        .map(|(re, rep)| (Regex::new(re).expect("a valid pattern"), rep))
        .collect()
    });
    let mut out = s.to_owned();
    for (re, rep) in RULES.iter() {
        if re.is_match(&out) {
            out = re.replace_all(&out, *rep).into_owned();
        }
    }
    out
}

/// A sample being accumulated.
struct Acc {
    stack: u32,
    context: i64,
    span_name: i64,
    values: [i64; 2],
}

#[derive(Default)]
struct KindOut {
    samples: Vec<Acc>,
    index: HashMap<(u32, i64, i64), usize>,
}

/// Everything the output pprofs share: strings, functions, locations and
/// stacks, plus the samples per kind.
struct Builder<'l> {
    limits: &'l Limits,
    period: i64,
    strings: Vec<String>,
    string_ix: HashMap<String, i64>,
    functions: Vec<pprof::Function>,
    function_ix: HashMap<String, u64>,
    locations: Vec<pprof::Location>,
    location_ix: HashMap<(u64, i64), u64>,
    stacks: Vec<Vec<u64>>,
    stack_ix: HashMap<Vec<u64>, u32>,
    kinds: Vec<KindOut>,
    samples: usize,
    /// The recording's `event` setting (`cpu`, `itimer`, `wall`, ...).
    event: String,
}

impl<'l> Builder<'l> {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ix.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ix.insert(s.to_owned(), i);
        i
    }

    fn location(&mut self, name: &str, line: i64) -> Result<u64> {
        let f = match self.function_ix.get(name) {
            Some(&f) => f,
            None => {
                if self.functions.len() >= self.limits.max_functions {
                    return Err(JfrError::TooMany {
                        what: "functions",
                        limit: self.limits.max_functions,
                    });
                }
                let id = self.functions.len() as u64 + 1;
                let n = self.string(name);
                // Like Pyroscope, no system name: the name is shown as
                // it is (`go tool pprof` shortens C++-looking names only
                // when they equal the system name).
                self.functions.push(pprof::Function {
                    id,
                    name: n,
                    ..Default::default()
                });
                self.function_ix.insert(name.to_owned(), id);
                id
            }
        };
        if let Some(&l) = self.location_ix.get(&(f, line)) {
            return Ok(l);
        }
        if self.locations.len() >= self.limits.max_locations {
            return Err(JfrError::TooMany {
                what: "locations",
                limit: self.limits.max_locations,
            });
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(pprof::Location {
            id,
            line: vec![pprof::Line {
                function_id: f,
                line,
                ..Default::default()
            }],
            ..Default::default()
        });
        self.location_ix.insert((f, line), id);
        Ok(id)
    }

    fn stack(&mut self, locations: Vec<u64>) -> u32 {
        if let Some(&s) = self.stack_ix.get(&locations) {
            return s;
        }
        let s = self.stacks.len() as u32;
        self.stacks.push(locations.clone());
        self.stack_ix.insert(locations, s);
        s
    }

    fn add(
        &mut self,
        kind: Kind,
        stack: u32,
        context: i64,
        span_name: i64,
        values: [i64; 2],
    ) -> Result<()> {
        let mul = if kind.timed() { self.period } else { 1 };
        let k = &mut self.kinds[kind as usize];
        let key = (stack, context, span_name);
        let i = match k.index.get(&key) {
            Some(&i) => i,
            None => {
                if self.samples >= self.limits.max_samples {
                    return Err(JfrError::TooMany {
                        what: "samples",
                        limit: self.limits.max_samples,
                    });
                }
                self.samples += 1;
                k.samples.push(Acc {
                    stack,
                    context,
                    span_name,
                    values: [0, 0],
                });
                k.index.insert(key, k.samples.len() - 1);
                k.samples.len() - 1
            }
        };
        let acc = &mut k.samples[i].values;
        for (a, v) in acc.iter_mut().zip(values) {
            *a = a.wrapping_add(v.wrapping_mul(mul));
        }
        Ok(())
    }
}

/// The symbols of one chunk's constant pools.
#[derive(Default)]
struct Pools {
    symbols: HashMap<i64, JStr>,
    strings: HashMap<i64, JStr>,
    /// class key → name symbol key
    classes: HashMap<i64, i64>,
    /// method key → (class key, name symbol key)
    methods: HashMap<i64, (i64, i64)>,
    /// stack trace key → [(method key, line)], leaf first
    stacks: HashMap<i64, Vec<(i64, i64)>>,
    states: HashMap<i64, JStr>,
}

impl Pools {
    fn resolve(&self, s: &JStr) -> String {
        match s {
            JStr::Null => String::new(),
            JStr::Inline(s) => s.clone(),
            JStr::Pool(k) => match self.strings.get(k) {
                Some(JStr::Inline(s)) => s.clone(),
                _ => String::new(),
            },
        }
    }
}

fn field_pos(types: &Types, class: usize, name: &str) -> Option<usize> {
    types.classes[class]
        .fields
        .iter()
        .position(|f| f.name == name)
}

fn get_int(rec: &[Scalar], i: Option<usize>) -> Option<i64> {
    i.and_then(|i| rec.get(i)).and_then(Scalar::int)
}

fn get_str(rec: &[Scalar], i: Option<usize>) -> Option<JStr> {
    match i.and_then(|i| rec.get(i)) {
        Some(Scalar::Str(s)) => Some(s.clone()),
        _ => None,
    }
}

fn read_pools(chunk: &Chunk<'_>) -> Result<Pools> {
    let t = &chunk.types;
    let symbol = t.by_name("jdk.types.Symbol");
    let string = t.by_name("java.lang.String");
    let class = t.by_name("java.lang.Class");
    let method = t.by_name("jdk.types.Method");
    let stack = t.by_name("jdk.types.StackTrace");
    let state = t.by_name("jdk.types.ThreadState");
    let frame = t.by_name("jdk.types.StackFrame");
    let sym_string = symbol.and_then(|c| field_pos(t, c, "string"));
    let class_name = class.and_then(|c| field_pos(t, c, "name"));
    let method_type = method.and_then(|c| field_pos(t, c, "type"));
    let method_name = method.and_then(|c| field_pos(t, c, "name"));
    let frames = stack.and_then(|c| field_pos(t, c, "frames"));
    let frame_method = frame.and_then(|c| field_pos(t, c, "method"));
    let frame_line = frame.and_then(|c| field_pos(t, c, "lineNumber"));
    let state_name = state.and_then(|c| field_pos(t, c, "name"));

    let mut p = Pools::default();
    chunk.constant_pools(|class_index, n, b| {
        let c = Some(class_index);
        for _ in 0..n {
            let key = b.key()?;
            if c == stack
                && let Some(fi) = frames
            {
                let (_, elems) = b.record_with_array(t, class_index, fi)?;
                let fr = elems
                    .iter()
                    .map(|e| {
                        (
                            get_int(e, frame_method).unwrap_or(-1),
                            get_int(e, frame_line).unwrap_or(0),
                        )
                    })
                    .collect();
                p.stacks.insert(key, fr);
                continue;
            }
            let rec = b.record(t, class_index)?;
            if c == symbol {
                if let Some(s) = get_str(&rec, sym_string) {
                    p.symbols.insert(key, s);
                }
            } else if c == string {
                if let Some(s) = get_str(&rec, Some(0)) {
                    p.strings.insert(key, s);
                }
            } else if c == class {
                if let Some(n) = get_int(&rec, class_name) {
                    p.classes.insert(key, n);
                }
            } else if c == method {
                if let (Some(ty), Some(n)) =
                    (get_int(&rec, method_type), get_int(&rec, method_name))
                {
                    p.methods.insert(key, (ty, n));
                }
            } else if c == state
                && let Some(s) = get_str(&rec, state_name)
            {
                p.states.insert(key, s);
            }
        }
        Ok(())
    })?;
    Ok(p)
}

/// One chunk's frame names, resolved on demand.
struct ChunkSymbols<'p> {
    pools: &'p Pools,
    names: HashMap<i64, String>,
    stacks: HashMap<i64, Option<u32>>,
}

impl ChunkSymbols<'_> {
    fn symbol(&mut self, key: i64) -> String {
        if let Some(s) = self.names.get(&key) {
            return s.clone();
        }
        let s = self
            .pools
            .symbols
            .get(&key)
            .map(|s| merge_generated_names(&self.pools.resolve(s)))
            .unwrap_or_default();
        self.names.insert(key, s.clone());
        s
    }

    /// The builder's stack for a stack trace key; `None` when the chunk
    /// does not define it (Pyroscope drops such samples too).
    fn stack(&mut self, b: &mut Builder<'_>, key: i64) -> Result<Option<u32>> {
        if let Some(&s) = self.stacks.get(&key) {
            return Ok(s);
        }
        let pools = self.pools;
        let Some(frames) = pools.stacks.get(&key) else {
            self.stacks.insert(key, None);
            return Ok(None);
        };
        let mut locs = Vec::with_capacity(frames.len());
        for &(m, line) in frames {
            // Frames whose method or class is unknown are left out.
            let Some(&(class, name)) = pools.methods.get(&m) else {
                continue;
            };
            let Some(&class_name) = pools.classes.get(&class) else {
                continue;
            };
            let frame = format!("{}.{}", self.symbol(class_name), self.symbol(name));
            locs.push(b.location(&frame, line)?);
        }
        let s = b.stack(locs);
        self.stacks.insert(key, Some(s));
        Ok(Some(s))
    }
}

fn convert_chunk(chunk: &Chunk<'_>, b: &mut Builder<'_>) -> Result<()> {
    let pools = read_pools(chunk)?;
    let mut syms = ChunkSymbols {
        pools: &pools,
        names: HashMap::new(),
        stacks: HashMap::new(),
    };
    let mut layouts: HashMap<i64, Option<(usize, Layout)>> = HashMap::new();
    let t = &chunk.types;
    let mut pos = HEADER_SIZE;
    while pos < chunk.header.size {
        let (ty, mut ev, next) = chunk.event_at(pos)?;
        pos = next;
        if ty == 0 || ty == 1 {
            continue;
        }
        let layout = *layouts.entry(ty).or_insert_with(|| {
            let c = *t.by_id.get(&ty)?;
            Some((c, Layout::of(t, c, event_type(&t.classes[c].name)?)))
        });
        let Some((class, l)) = layout else { continue };
        let rec = ev.record(t, class)?;
        if l.ty == EventType::ActiveSetting {
            if let Some(name) = get_str(&rec, l.name)
                && pools.resolve(&name) == "event"
            {
                b.event = get_str(&rec, l.setting)
                    .map(|v| pools.resolve(&v))
                    .unwrap_or_default();
            }
            continue;
        }
        let Some(stack_key) = get_int(&rec, l.stack) else {
            continue;
        };
        let Some(stack) = syms.stack(b, stack_key)? else {
            continue;
        };
        let context = get_int(&rec, l.context).unwrap_or(0);
        let span_name = get_int(&rec, l.span_name).unwrap_or(0);
        let state = get_int(&rec, l.state)
            .and_then(|k| pools.states.get(&k))
            .map(|s| pools.resolve(s));
        let value = get_int(&rec, l.value).unwrap_or(0);
        let wall_mode = b.event == "wall";
        let mut add = |k: Kind, v: [i64; 2]| b.add(k, stack, context, span_name, v);
        match l.ty {
            EventType::Execution => {
                if state.as_deref() != Some("STATE_SLEEPING") {
                    add(Kind::Cpu, [1, 0])?;
                }
                if wall_mode {
                    add(Kind::Wall, [1, 0])?;
                }
            }
            EventType::WallClock => {
                if wall_mode && state.as_deref() == Some("STATE_RUNNABLE") {
                    add(Kind::Cpu, [value, 0])?;
                }
                add(Kind::Wall, [value, 0])?;
            }
            EventType::InTlab => add(Kind::InTlab, [1, value])?,
            EventType::OutTlab => add(Kind::OutTlab, [1, value])?,
            EventType::AllocSample => add(Kind::AllocSample, [1, value])?,
            EventType::MonitorEnter => add(Kind::Lock, [1, value])?,
            EventType::ThreadPark => add(Kind::Park, [1, value])?,
            EventType::LiveObject => add(Kind::Live, [1, 0])?,
            EventType::Malloc => add(Kind::Malloc, [1, value])?,
            EventType::ActiveSetting => {}
        }
    }
    Ok(())
}

/// Converts a recording to one pprof per event kind present, with the
/// labels of each sample's context as string sample labels (and
/// `span_name`). `labels` is the decoded labels part, if any.
pub fn to_pprof(
    jfr: &[u8],
    labels: Option<&LabelsSnapshot>,
    sample_rate: u32,
    limits: &Limits,
) -> Result<Vec<pprof::Profile>> {
    let mut b = Builder {
        limits,
        period: 1_000_000_000 / i64::from(sample_rate.max(1)),
        strings: Vec::new(),
        string_ix: HashMap::new(),
        functions: Vec::new(),
        function_ix: HashMap::new(),
        locations: Vec::new(),
        location_ix: HashMap::new(),
        stacks: Vec::new(),
        stack_ix: HashMap::new(),
        kinds: KINDS.iter().map(|_| KindOut::default()).collect(),
        samples: 0,
        event: String::new(),
    };
    b.string("");
    if jfr.len() < 4 || &jfr[..4] != b"FLR\0" {
        return Err(JfrError::NotJfr { offset: 0 });
    }
    let mut pos = 0;
    let mut start: Option<i64> = None;
    let mut end: Option<i64> = None;
    while pos < jfr.len() {
        let chunk = Chunk::read(jfr, pos).map_err(|e| e.shifted(pos))?;
        convert_chunk(&chunk, &mut b).map_err(|e| e.shifted(pos))?;
        let h = &chunk.header;
        start = Some(start.map_or(h.start_nanos, |s| s.min(h.start_nanos)));
        let e = h.start_nanos.saturating_add(h.duration_nanos);
        end = Some(end.map_or(e, |x| x.max(e)));
        pos += h.size;
    }

    // Per-context labels, as sample labels.
    let mut context_labels: HashMap<i64, Vec<pprof::Label>> = HashMap::new();
    let mut out = Vec::new();
    let mut kinds = std::mem::take(&mut b.kinds);
    for (kind, k) in KINDS.iter().zip(kinds.iter_mut()) {
        if k.samples.is_empty() {
            continue;
        }
        let (sample_types, pt, pu) = kind.types();
        let sample_type = sample_types
            .iter()
            .map(|(t, u)| pprof::ValueType {
                r#type: b.string(t),
                unit: b.string(u),
            })
            .collect();
        let period_type = Some(pprof::ValueType {
            r#type: b.string(pt),
            unit: b.string(pu),
        });
        let mut samples = Vec::with_capacity(k.samples.len());
        for acc in std::mem::take(&mut k.samples) {
            let mut label = Vec::new();
            if let Some(snap) = labels {
                if acc.context != 0 {
                    if let Entry::Vacant(slot) = context_labels.entry(acc.context) {
                        let mut ls = Vec::new();
                        if let Some(ctx) = snap.contexts.get(&acc.context) {
                            let mut pairs: Vec<(&i64, &i64)> = ctx.labels.iter().collect();
                            pairs.sort();
                            for (k, v) in pairs {
                                let (Some(k), Some(v)) = (snap.strings.get(k), snap.strings.get(v))
                                else {
                                    continue;
                                };
                                ls.push(pprof::Label {
                                    key: b.string(k),
                                    str: b.string(v),
                                    ..Default::default()
                                });
                            }
                        }
                        slot.insert(ls);
                    }
                    label.extend(context_labels[&acc.context].iter().cloned());
                }
                if acc.span_name != 0
                    && let Some(name) = snap.strings.get(&acc.span_name)
                    && !name.is_empty()
                {
                    label.push(pprof::Label {
                        key: b.string("span_name"),
                        str: b.string(name),
                        ..Default::default()
                    });
                }
            }
            samples.push(pprof::Sample {
                location_id: b.stacks[acc.stack as usize].clone(),
                value: acc.values[..sample_types.len()].to_vec(),
                label,
            });
        }
        out.push((samples, sample_type, period_type, *kind));
    }
    let time_nanos = start.unwrap_or(0);
    let duration_nanos = match (start, end) {
        (Some(s), Some(e)) => e.saturating_sub(s).max(0),
        _ => 0,
    };
    Ok(out
        .into_iter()
        .map(|(sample, sample_type, period_type, kind)| pprof::Profile {
            sample_type,
            sample,
            location: b.locations.clone(),
            function: b.functions.clone(),
            string_table: b.strings.clone(),
            time_nanos,
            duration_nanos,
            period_type,
            period: if kind.timed() { b.period } else { 1 },
            ..Default::default()
        })
        .collect())
}

/// Decodes a recording (uncompressed JFR bytes) and its optional labels
/// part (an uncompressed `LabelsSnapshot` protobuf) into Fathom profiles:
/// one per (profile type, label set).
pub fn decode(
    jfr: &[u8],
    labels: Option<&[u8]>,
    opts: &JfrOptions,
    limits: &Limits,
) -> Result<Normalized> {
    let snapshot = labels
        .map(LabelsSnapshot::decode)
        .transpose()
        .map_err(JfrError::Labels)?;
    let profiles = to_pprof(jfr, snapshot.as_ref(), opts.sample_rate, limits)?;
    let nopts = NormalizeOptions {
        labels: opts.labels.clone(),
        name_hint: None,
        time_nanos_override: opts.time_nanos_override,
        duration_nanos_override: opts.duration_nanos_override,
        profile_id_seed: opts.profile_id_seed,
        max_series: opts.max_series,
        held: None,
    };
    let mut out = Normalized::default();
    for p in &profiles {
        let n = fathom_pprof::normalize(p, &nopts)?;
        out.profiles.extend(n.profiles);
        let s = n.symbols;
        out.symbols.stacks.extend(s.stacks);
        out.symbols.locations.extend(s.locations);
        out.symbols.functions.extend(s.functions);
        out.symbols.mappings.extend(s.mappings);
    }
    Ok(out)
}
