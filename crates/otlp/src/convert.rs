//! OTLP profiles → one pprof per (resource, scope, profile, sample service),
//! its samples as columns → [`fathom_pprof::normalize_columns`]. See the
//! crate docs for the rules.

use std::borrow::Cow;

use fathom_model::{Id, IdHasher, Labels, SERVICE_NAME};
use fathom_pprof::{NormalizeOptions, Normalized, SampleColumns};
use fathom_proto::pprof;

use crate::wire::{self, ProfilesDictionary, SampleView, Value};
use crate::{ConvertOptions, Error, Limits, Request};

/// The mapping attribute whose value is the build id Fathom keeps.
pub(crate) const BUILD_ID_GNU: &str = "process.executable.build_id.gnu";
const SERVICE_NAME_ATTR: &str = "service.name";
const EXECUTABLE_NAME_ATTR: &str = "process.executable.name";
/// The service of a resource without `service.name` (Pyroscope's name).
pub(crate) const UNKNOWN_SERVICE: &str = "unknown_service";

/// The label name of an attribute key: `service.name` → `service_name`,
/// `.` and other characters invalid in a label name → `_`; `None` for an
/// empty key or a reserved (`__`) one.
pub(crate) fn label_name(key: &str) -> Option<String> {
    if key == SERVICE_NAME_ATTR {
        return Some(SERVICE_NAME.to_owned());
    }
    let name = fathom_pprof::sanitize_label_name(&key.replace('.', "_"))?;
    (!name.starts_with("__")).then_some(name)
}

fn get<'t, T>(
    table: &'t [T],
    name: &'static str,
    index: i64,
    what: &dyn Fn() -> String,
) -> Result<&'t T, Error> {
    usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i))
        .ok_or_else(|| Error::Index {
            what: what(),
            table: name,
            index,
            len: table.len(),
        })
}

struct Dict<'a>(&'a ProfilesDictionary);

impl<'a> Dict<'a> {
    fn string(&self, index: i32, what: &dyn Fn() -> String) -> Result<&'a str, Error> {
        if index == 0 && self.0.string_table.is_empty() {
            return Ok("");
        }
        get(&self.0.string_table, "string_table", index.into(), what).map(String::as_str)
    }

    /// An attribute's key and value.
    fn attribute(
        &self,
        index: i64,
        what: &dyn Fn() -> String,
    ) -> Result<(&'a str, Option<&'a Value>), Error> {
        let a = get(&self.0.attribute_table, "attribute_table", index, what)?;
        let key = self.string(a.key_strindex, &|| {
            format!("{} (attribute {index})", what())
        })?;
        Ok((key, a.value.as_ref().and_then(|v| v.value.as_ref())))
    }
}

/// The series labels of a resource and scope.
fn series_labels<'a>(
    attributes: impl Iterator<Item = &'a wire::KeyValue>,
    resource: usize,
    limits: &Limits,
) -> Result<Vec<(String, String)>, Error> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut executable = None;
    for kv in attributes {
        let Some(value) = kv.value.as_ref().and_then(wire::AnyValue::as_label_value) else {
            continue;
        };
        if value.is_empty() {
            continue;
        }
        if kv.key == EXECUTABLE_NAME_ATTR && executable.is_none() {
            executable = Some(value.clone());
        }
        let Some(name) = label_name(&kv.key) else {
            continue;
        };
        if out.iter().any(|(k, _)| *k == name) {
            continue;
        }
        out.push((name, value));
        // One more than the limit: the service name may still come.
        if out.len() > limits.max_labels {
            return Err(Error::Invalid(format!(
                "resource {resource}: its resource and scope attributes make more than {} labels \
                 (the limit of labels per series)",
                limits.max_labels
            )));
        }
    }
    if !out.iter().any(|(k, _)| k == SERVICE_NAME) {
        let service = match executable {
            Some(e) => format!("{UNKNOWN_SERVICE}:{e}"),
            None => UNKNOWN_SERVICE.to_owned(),
        };
        out.push((SERVICE_NAME.to_owned(), service));
    }
    if out.len() > limits.max_labels {
        return Err(Error::Invalid(format!(
            "resource {resource}: its attributes and service_name make {} labels; the limit is {}",
            out.len(),
            limits.max_labels
        )));
    }
    Ok(out)
}

/// A sample's value: the sum of its values, or its number of timestamps.
fn sample_value(v: &SampleView<'_>, multiplier: i64) -> Result<i64, String> {
    let raw = if v.values.is_empty() {
        if v.timestamps == 0 {
            return Err("has neither values nor timestamps".into());
        }
        i64::try_from(v.timestamps).map_err(|_| "has too many timestamps".to_owned())?
    } else {
        if v.timestamps != 0 && v.timestamps != v.values.len() {
            return Err(format!(
                "has {} values but {} timestamps (they must pair up)",
                v.values.len(),
                v.timestamps
            ));
        }
        v.values
            .iter()
            .try_fold(0i64, |a, &x| a.checked_add(x))
            .ok_or_else(|| "values overflow a 64-bit sum".to_owned())?
    };
    raw.checked_mul(multiplier)
        .ok_or_else(|| "value times the period overflows 64 bits".to_owned())
}

/// The conversion's lookups: a request's own indexes and strings, so
/// foldhash (seeded per process) rather than the standard SipHash, which
/// took about a tenth of an OTLP write's CPU in the ingest benchmark.
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// Entries of dense [`Slots`] one OTLP profile's builders may take
/// together (8 bytes each): past them, a builder's slots are a hash map.
/// A profile's samples of one service (the common case) then look each
/// frame up by index, where a hash map lookup a frame was most of the
/// conversion's own time.
const DENSE_SLOTS: usize = 1 << 22;

/// Entries of dense [`Slots`] a profile may take per sample it has: a
/// dense table is zeroed whole, so a profile that uses a small part of a
/// large dictionary (one process of the eBPF profiler's request, whose
/// dictionary all its resources share) looks its entries up in hash
/// maps instead of zeroing tables for the whole dictionary.
const DENSE_SLOTS_PER_SAMPLE: usize = 64;

/// Where each dictionary entry a builder copied went: its id in the pprof
/// being built (ids start at 1), by its index in its dictionary table.
pub(crate) enum Slots {
    /// By index: 0 where none was copied yet.
    Dense(Vec<u64>),
    Sparse(HashMap<i32, u64>),
}

impl Slots {
    /// Slots for a table of `len` entries: dense while `budget` (entries
    /// of [`DENSE_SLOTS`] left) has room for them.
    pub(crate) fn new(len: usize, budget: &mut usize) -> Self {
        match budget.checked_sub(len) {
            Some(left) => {
                *budget = left;
                Slots::Dense(vec![0; len])
            }
            None => Slots::Sparse(HashMap::default()),
        }
    }

    #[inline]
    pub(crate) fn get(&self, index: i32) -> Option<u64> {
        match self {
            Slots::Dense(v) => usize::try_from(index)
                .ok()
                .and_then(|i| v.get(i))
                .copied()
                .filter(|&id| id != 0),
            Slots::Sparse(m) => m.get(&index).copied(),
        }
    }

    /// Records `id` for `index`, an index of the table (checked by the
    /// caller, which read the entry).
    pub(crate) fn insert(&mut self, index: i32, id: u64) {
        match self {
            Slots::Dense(v) => {
                if let Some(slot) = usize::try_from(index).ok().and_then(|i| v.get_mut(i)) {
                    *slot = id;
                }
            }
            Slots::Sparse(m) => {
                m.insert(index, id);
            }
        }
    }
}

/// Builds one pprof from OTLP samples, copying only the dictionary
/// entries they use: its tables (in `p`), its strings (borrowed from the
/// request where the dictionary has them) and its samples as columns for
/// [`fathom_pprof::normalize_columns`], so that no sample needs a
/// `pprof::Sample` and its three vectors.
struct Builder<'a> {
    p: pprof::Profile,
    strings: Vec<Cow<'a, str>>,
    string_ids: HashMap<Cow<'a, str>, i64>,
    samples: SampleColumns,
    locations: Slots,
    functions: Slots,
    mappings: Slots,
}

impl<'a> Builder<'a> {
    /// A builder for samples of `d`, its slots dense while `budget` lasts.
    fn new(d: &Dict<'a>, budget: &mut usize) -> Self {
        let mut b = Builder {
            p: pprof::Profile::default(),
            strings: Vec::new(),
            string_ids: HashMap::default(),
            samples: SampleColumns::default(),
            locations: Slots::new(d.0.location_table.len(), budget),
            functions: Slots::new(d.0.function_table.len(), budget),
            mappings: Slots::new(d.0.mapping_table.len(), budget),
        };
        b.str("");
        b
    }

    /// The position of `s` in the string table, added if new.
    fn str(&mut self, s: &'a str) -> i64 {
        self.string(s, Cow::Borrowed)
    }

    /// [`Builder::str`] of a string the request does not hold (a label
    /// name made from an attribute key), copied if new.
    fn str_owned(&mut self, s: &str) -> i64 {
        self.string(s, |s| Cow::Owned(s.to_owned()))
    }

    fn string<'s>(&mut self, s: &'s str, keep: impl Fn(&'s str) -> Cow<'a, str>) -> i64 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(keep(s));
        self.string_ids.insert(keep(s), i);
        i
    }

    fn mapping(&mut self, d: &Dict<'a>, index: i32) -> Result<u64, Error> {
        // Index 0 is "no mapping" when the table has none or its first
        // entry is the zero value, as the spec reserves it.
        if index == 0
            && d.0
                .mapping_table
                .first()
                .is_none_or(|m| *m == wire::Mapping::default())
        {
            return Ok(0);
        }
        if let Some(id) = self.mappings.get(index) {
            return Ok(id);
        }
        let what = || format!("location with mapping {index}");
        let m = get(&d.0.mapping_table, "mapping_table", index.into(), &what)?;
        let filename = d.string(m.filename_strindex, &|| format!("mapping {index}"))?;
        let mut build_id = "";
        for &a in &m.attribute_indices {
            let (key, value) = d.attribute(a.into(), &|| format!("mapping {index}"))?;
            if let (BUILD_ID_GNU, Some(Value::StringValue(s))) = (key, value) {
                build_id = s;
            }
        }
        let id = self.p.mapping.len() as u64 + 1;
        let mapping = pprof::Mapping {
            id,
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: self.str(filename),
            build_id: self.str(build_id),
            ..Default::default()
        };
        self.p.mapping.push(mapping);
        self.mappings.insert(index, id);
        Ok(id)
    }

    fn function(&mut self, d: &Dict<'a>, index: i32) -> Result<u64, Error> {
        if let Some(id) = self.functions.get(index) {
            return Ok(id);
        }
        let what = || format!("a line (function {index})");
        let f = get(&d.0.function_table, "function_table", index.into(), &what)?;
        let fw = || format!("function {index}");
        let name = d.string(f.name_strindex, &fw)?;
        let system_name = d.string(f.system_name_strindex, &fw)?;
        let filename = d.string(f.filename_strindex, &fw)?;
        let id = self.p.function.len() as u64 + 1;
        let function = pprof::Function {
            id,
            name: self.str(name),
            system_name: self.str(system_name),
            filename: self.str(filename),
            start_line: f.start_line,
        };
        self.p.function.push(function);
        self.functions.insert(index, id);
        Ok(id)
    }

    fn location(&mut self, d: &Dict<'a>, index: i32) -> Result<u64, Error> {
        if let Some(id) = self.locations.get(index) {
            return Ok(id);
        }
        let what = || format!("a stack (location {index})");
        let loc = get(&d.0.location_table, "location_table", index.into(), &what)?;
        let mapping_id = self.mapping(d, loc.mapping_index)?;
        let mut line = Vec::with_capacity(loc.lines.len());
        for l in &loc.lines {
            line.push(pprof::Line {
                function_id: self.function(d, l.function_index)?,
                line: l.line,
                ..Default::default()
            });
        }
        let id = self.p.location.len() as u64 + 1;
        self.p.location.push(pprof::Location {
            id,
            mapping_id,
            address: loc.address,
            line,
            ..Default::default()
        });
        self.locations.insert(index, id);
        Ok(id)
    }
}

struct ProfileCtx<'a> {
    d: Dict<'a>,
    layout: crate::Layout,
    place: String,
    /// Another profile of the same scope already counts CPU time in
    /// `cpu`/`nanoseconds` (a Go CPU pprof sent as OTLP has both types), so
    /// `samples`/`count` stays a count rather than becoming a second copy.
    scope_has_cpu_nanoseconds: bool,
    /// Entries of dense [`Slots`] the profile's builders may take.
    dense_slots: usize,
}

/// Whether `p`'s sample type is `type`/`unit` (false when its indices do
/// not resolve: the profile's own conversion reports that).
fn sample_type_is(d: &Dict<'_>, p: &wire::Profile, r#type: &str, unit: &str) -> bool {
    let Some(st) = &p.sample_type else {
        return false;
    };
    let s = |i: i32| d.string(i, &String::new).ok();
    s(st.type_strindex) == Some(r#type) && s(st.unit_strindex) == Some(unit)
}

pub(crate) fn convert(
    req: &Request,
    opts: &ConvertOptions,
    limits: &Limits,
) -> Result<Normalized, Error> {
    convert_slots(req, opts, limits, DENSE_SLOTS)
}

/// [`convert`] with each OTLP profile's builders taking at most
/// `dense_slots` entries of dense [`Slots`] (tests compare with none).
pub(crate) fn convert_slots(
    req: &Request,
    opts: &ConvertOptions,
    limits: &Limits,
    dense_slots: usize,
) -> Result<Normalized, Error> {
    let mut out = Normalized::default();
    let mut frames_left = limits.max_frames;
    let m = &req.message;
    for (ri, rp) in m.resource_profiles.iter().enumerate() {
        for (si, sp) in rp.scope_profiles.iter().enumerate() {
            if sp.profiles.iter().all(|p| p.samples.is_empty()) {
                continue;
            }
            let dict = m.dictionary.as_ref().ok_or_else(|| {
                Error::Invalid(
                    "the request has samples but no dictionary (ExportProfilesServiceRequest.dictionary)"
                        .into(),
                )
            })?;
            let attrs = rp
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .chain(sp.scope.iter().flat_map(|s| &s.attributes));
            let labels = series_labels(attrs, ri, limits)?;
            let scope_has_cpu_nanoseconds = sp
                .profiles
                .iter()
                .any(|p| sample_type_is(&Dict(dict), p, "cpu", "nanoseconds"));
            for (pi, p) in sp.profiles.iter().enumerate() {
                if p.samples.is_empty() {
                    continue;
                }
                let ctx = ProfileCtx {
                    d: Dict(dict),
                    layout: req.layout,
                    place: format!("resource {ri}, scope {si}, profile {pi}"),
                    scope_has_cpu_nanoseconds,
                    dense_slots,
                };
                let seed = IdHasher::new("otlp-profile")
                    .id(&opts.seed)
                    .u64(ri as u64)
                    .u64(si as u64)
                    .u64(pi as u64)
                    .finish();
                let to = Output {
                    labels: &labels,
                    seed,
                    opts,
                };
                convert_profile(&ctx, p, &to, limits, &mut frames_left, &mut out)?;
            }
        }
    }
    Ok(out)
}

/// Where one OTLP profile's profiles go: its resource's and scope's
/// labels, the seed of its ids and the conversion's options.
struct Output<'a> {
    labels: &'a [(String, String)],
    seed: Id,
    opts: &'a ConvertOptions,
}

fn convert_profile(
    ctx: &ProfileCtx<'_>,
    p: &wire::Profile,
    to: &Output<'_>,
    limits: &Limits,
    frames_left: &mut usize,
    out: &mut Normalized,
) -> Result<(), Error> {
    let d = &ctx.d;
    let place = &ctx.place;
    let st = p
        .sample_type
        .as_ref()
        .ok_or_else(|| Error::Invalid(format!("{place}: sample_type is missing")))?;
    let what = || format!("{place}: a value type");
    let (mut stype, mut sunit) = (
        d.string(st.type_strindex, &what)?,
        d.string(st.unit_strindex, &what)?,
    );
    let (ptype, punit) = match &p.period_type {
        Some(v) => (
            d.string(v.type_strindex, &what)?,
            d.string(v.unit_strindex, &what)?,
        ),
        None => ("", ""),
    };
    // The eBPF profiler's CPU samples: counts of a fixed CPU-time period.
    let mut multiplier = 1;
    if (stype, sunit, ptype, punit) == ("samples", "count", "cpu", "nanoseconds")
        && p.period > 0
        && !ctx.scope_has_cpu_nanoseconds
    {
        (stype, sunit, multiplier) = ("cpu", "nanoseconds", p.period);
    }
    let time_nanos = i64::try_from(p.time_unix_nano)
        .map_err(|_| Error::Invalid(format!("{place}: time_unix_nano is out of range")))?;
    let duration_nanos = i64::try_from(p.duration_nano)
        .map_err(|_| Error::Invalid(format!("{place}: duration_nano is out of range")))?;

    // One builder per sample-level service name (None: the resource's).
    let mut groups: HashMap<Option<&str>, Builder<'_>> = HashMap::default();
    let mut dense = ctx
        .dense_slots
        .min(p.samples.len().saturating_mul(DENSE_SLOTS_PER_SAMPLE));
    let mut sample_labels: Vec<(String, &str)> = Vec::new();
    // A sample's location ids and labels, until its builder takes them.
    let mut location_ids: Vec<u64> = Vec::new();
    let mut labels: Vec<pprof::Label> = Vec::new();
    for (k, s) in p.samples.iter().enumerate() {
        let v = s.view(ctx.layout);
        let value = sample_value(&v, multiplier)
            .map_err(|e| Error::Invalid(format!("{place}: sample {k} {e}")))?;
        let what = || format!("{place}: sample {k}");
        let mut service = None;
        sample_labels.clear();
        for &a in v.attribute_indices {
            let (key, value) = d.attribute(a, &what)?;
            let Some(Value::StringValue(s)) = value else {
                continue;
            };
            if s.is_empty() {
                continue;
            }
            if key == SERVICE_NAME_ATTR {
                service = Some(s.as_str());
            } else if let Some(name) = label_name(key) {
                sample_labels.push((name, s.as_str()));
            }
        }
        if !groups.contains_key(&service) && groups.len() >= limits.max_series {
            return Err(Error::Invalid(format!(
                "{place}: samples name more than {} services",
                limits.max_series
            )));
        }
        let b = groups
            .entry(service)
            .or_insert_with(|| Builder::new(d, &mut dense));
        let stack = get(&d.0.stack_table, "stack_table", s.stack_index.into(), &what)?;
        *frames_left = frames_left
            .checked_sub(stack.location_indices.len())
            .ok_or_else(|| {
                Error::TooLarge(format!(
                    "the request's stacks have more than {} frames in all",
                    limits.max_frames
                ))
            })?;
        location_ids.clear();
        for &l in &stack.location_indices {
            location_ids.push(b.location(d, l)?);
        }
        labels.clear();
        for (key, value) in &sample_labels {
            labels.push(pprof::Label {
                key: b.str_owned(key),
                str: b.str(value),
                ..Default::default()
            });
        }
        b.samples
            .push(location_ids.iter().copied(), &[value], labels.drain(..));
    }

    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    for (service, mut b) in groups {
        b.p.sample_type = vec![pprof::ValueType {
            r#type: b.str(stype),
            unit: b.str(sunit),
        }];
        if p.period_type.is_some() {
            b.p.period_type = Some(pprof::ValueType {
                r#type: b.str(ptype),
                unit: b.str(punit),
            });
        }
        b.p.period = p.period;
        b.p.time_nanos = time_nanos;
        b.p.duration_nanos = duration_nanos;
        let mut pairs = to.labels.to_vec();
        if let Some(svc) = service {
            for (k, v) in &mut pairs {
                if k == SERVICE_NAME {
                    *v = svc.to_owned();
                }
            }
        }
        let mut labels = Labels::from_pairs(pairs)
            .map_err(|e| Error::Invalid(format!("{place}: labels: {e}")))?;
        for (k, v) in to.opts.labels.iter() {
            labels.insert(k, v);
        }
        let strings: Vec<&str> = b.strings.iter().map(|s| s.as_ref()).collect();
        let n = fathom_pprof::normalize_columns(
            &b.p,
            &strings,
            &b.samples,
            &NormalizeOptions {
                labels,
                profile_id_seed: IdHasher::new("otlp-service")
                    .id(&to.seed)
                    .str(service.unwrap_or(""))
                    .finish(),
                max_series: limits.max_series,
                held: to.opts.held.clone(),
                ..Default::default()
            },
        )?;
        out.profiles.extend(n.profiles);
        out.symbols.merge_owned(n.symbols);
    }
    Ok(())
}
