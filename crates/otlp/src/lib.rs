//! OpenTelemetry profiles (OTLP `v1development`) into Fathom's model.
//!
//! ```text
//!  protobuf ─ scan (bounds, layout evidence) ─ prost decode ─┐
//!                                                           ├─ Request { wire types, Layout }
//!  JSON ───── serde (bounded) ──────────────────────────────┘
//!      ─ convert: one pprof per (resource, scope, profile, sample service.name)
//!               ─ fathom_pprof::normalize_columns ─► Normalized { profiles, symbols }
//! ```
//!
//! # Field layouts
//!
//! `v1development` changed on the wire between releases, and today's
//! clients send two layouts, both accepted (see [`Layout`] and
//! [`wire`]): opentelemetry-proto v1.8.0/v1.9.0 (the PyPI
//! `opentelemetry-sdk-extension-profiling`) and v1.10.0+ (the OpenTelemetry
//! eBPF profiler). They differ only in the numbering of `Sample` fields
//! 2–4. A protobuf request's layout is read from the wire types of those
//! fields (a packed list or a single number), then, when no sample says,
//! from what the values can mean ([`Request::decode`] documents the
//! rules); samples that contradict each other refuse the request. The
//! layouts of v1.7.0 and earlier (tables per profile or `KeyValue`
//! attributes, no stack table) are recognized and refused with
//! [`Error::Legacy`], never misread. JSON names its fields, so both
//! releases read the same.
//!
//! # Conversion rules
//!
//! - Labels: resource attributes, then scope attributes (the first value of
//!   a key wins), string, integer and boolean values; `service.name`
//!   becomes `service_name`, other keys have `.` (and any character invalid
//!   in a label name) replaced by `_`. Without `service.name`, the service
//!   is `unknown_service` (`unknown_service:<process.executable.name>` when
//!   that is known), as Pyroscope names it. A sample's own `service.name`
//!   attribute moves it to that service.
//! - String sample attributes become sample labels, which
//!   [`fathom_pprof::normalize`] turns into series labels (numeric ones,
//!   such as `thread.id`, are dropped, as for pprof).
//! - Each OTLP profile has one sample type: it becomes one profile type,
//!   named by [`fathom_pprof::profile_type`] (so `off_cpu` samples get their
//!   own `off_cpu:off_cpu:nanoseconds:…` type). `samples`/`count` sampled
//!   with a `cpu`/`nanoseconds` period (the eBPF profiler's CPU samples)
//!   becomes `cpu`/`nanoseconds`, each count multiplied by the period,
//!   i.e. `process_cpu:cpu:nanoseconds:cpu:nanoseconds`, unless the same
//!   scope also has a `cpu`/`nanoseconds` profile (a Go CPU pprof sent as
//!   OTLP carries both): then the counts stay counts, as in pprof.
//! - [`from_pprof`] goes the other way (pprof into a v1.10 request), so
//!   the same profiles can be sent over OTLP and over `/ingest`; a
//!   round trip gives the same stacks and values.
//! - A sample's value is the sum of its `values`, or the number of its
//!   timestamps when it has no values (each one an event of value 1).
//! - Stacks keep their frames (leaf first), locations their lines (inlined
//!   callee first). A location without lines (a native frame the client
//!   could not symbolize) keeps its mapping's file name and GNU build id
//!   (`process.executable.build_id.gnu`) and its address, for server-side
//!   symbolization later.
//! - Every index into a dictionary table is checked; every count is
//!   bounded by [`Limits`]; arithmetic on values is checked. Nothing
//!   panics on input.

mod convert;
mod encode;
mod json;
mod scan;
#[cfg(test)]
mod tests;
pub mod wire;

pub use encode::{EncodeError, from_pprof};
use fathom_model::Id;
pub use fathom_pprof::Normalized;

/// The two `v1development` field layouts accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// opentelemetry-proto v1.8.0 and v1.9.0: `Sample { stack_index = 1,
    /// values = 2, attribute_indices = 3, link_index = 4 }`.
    V1_8,
    /// opentelemetry-proto v1.10.0 and later: `Sample { stack_index = 1,
    /// attribute_indices = 2, link_index = 3, values = 4 }`.
    V1_10,
}

impl Layout {
    pub fn describe(self) -> &'static str {
        match self {
            Layout::V1_8 => "v1.8/v1.9 (Sample.values = 2)",
            Layout::V1_10 => "v1.10+ (Sample.values = 4)",
        }
    }
}

/// The body encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

/// Bounds on what one request may make the converter allocate.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Samples in the whole request.
    pub max_samples: usize,
    /// Profiles in the whole request.
    pub max_profiles: usize,
    /// Entries in each dictionary table.
    pub max_table_entries: usize,
    /// Stack frames over all samples (what conversion copies).
    pub max_frames: usize,
    /// Series labels made from resource and scope attributes.
    pub max_labels: usize,
    /// Memory the decoded request may take.
    pub max_decoded_bytes: usize,
    /// Series one profile may split into by sample labels.
    pub max_series: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_samples: 500_000,
            max_profiles: 10_000,
            max_table_entries: 1_000_000,
            max_frames: 20_000_000,
            max_labels: 32,
            max_decoded_bytes: 512 << 20,
            max_series: fathom_pprof::DEFAULT_MAX_SERIES,
        }
    }
}

/// Why a request was refused. Every variant is the client's fault except
/// none: all map to 400, [`Error::TooLarge`] to 413.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a valid OTLP ExportProfilesServiceRequest (protobuf): {0}")]
    Malformed(String),
    #[error("not a valid OTLP ExportProfilesServiceRequest (protobuf): {0}")]
    Protobuf(#[from] prost::DecodeError),
    #[error("not a valid OTLP ExportProfilesServiceRequest (JSON): {0}")]
    Json(String),
    #[error(
        "this request uses the OTLP profiles layout of opentelemetry-proto v1.7.0 or earlier ({0}); \
         Fathom accepts the v1development layouts of v1.8.0 and later (a dictionary with a stack table), \
         which current OpenTelemetry SDKs and the eBPF profiler send: upgrade the client"
    )]
    Legacy(&'static str),
    #[error(
        "the samples of this request disagree about the OTLP field layout: {v1_8}, but {v1_10}; \
         Fathom refuses rather than misread it"
    )]
    MixedLayout {
        v1_8: &'static str,
        v1_10: &'static str,
    },
    #[error("{0}")]
    TooLarge(String),
    #[error("{what} refers to {table} entry {index}, but the table has {len} entries")]
    Index {
        what: String,
        table: &'static str,
        index: i64,
        len: usize,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Normalize(#[from] fathom_pprof::NormalizeError),
}

/// A decoded request and the layout its samples are read in.
#[derive(Debug)]
pub struct Request {
    pub message: wire::ExportProfilesServiceRequest,
    pub layout: Layout,
}

impl Request {
    /// Decodes a request body (already decompressed).
    ///
    /// Protobuf: the body is scanned first (malformed protobuf, counts and
    /// the decoded size over [`Limits`] are refused before anything is
    /// allocated), then decoded. The layout is the one the wire types of
    /// `Sample` fields 3 and 4 show (a packed list in field 3 or a number in
    /// field 4: v1.8/v1.9; a number in field 3 or a packed list in field 4:
    /// v1.10). When no sample has field 3 or 4, each sample with field 2
    /// decides by what it can mean: no timestamps → v1.8 (a v1.10 sample
    /// must have values or timestamps); as many field-2 entries as
    /// timestamps and every entry a distinct valid attribute index → either
    /// reading is possible, the current v1.10 is taken; otherwise v1.8 if
    /// the entries cannot be attribute indices, v1.10 if their count differs
    /// from the timestamps'. Contradictions refuse the request.
    pub fn decode(body: &[u8], encoding: Encoding, limits: &Limits) -> Result<Request, Error> {
        match encoding {
            Encoding::Json => {
                let (message, profiles, samples) = json::decode(body, limits)?;
                check_counts(profiles, samples, limits)?;
                Ok(Request {
                    message,
                    layout: Layout::V1_10,
                })
            }
            Encoding::Protobuf => {
                let s = scan::scan(body, limits)?;
                if let Some(why) = s.evidence.legacy {
                    return Err(Error::Legacy(why));
                }
                let message = <wire::ExportProfilesServiceRequest as prost::Message>::decode(body)?;
                let layout = resolve_layout(&message, &s.evidence)?;
                Ok(Request { message, layout })
            }
        }
    }

    /// Converts the request into Fathom profiles and symbols; `seed` makes
    /// the profile ids (the same request gives the same ids).
    pub fn convert(&self, seed: Id, limits: &Limits) -> Result<Normalized, Error> {
        self.convert_with(
            &ConvertOptions {
                seed,
                ..Default::default()
            },
            limits,
        )
    }

    /// [`Request::convert`] with the labels and held stacks of `opts`.
    pub fn convert_with(
        &self,
        opts: &ConvertOptions,
        limits: &Limits,
    ) -> Result<Normalized, Error> {
        convert::convert(self, opts, limits)
    }
}

/// What a conversion takes besides the request.
#[derive(Clone, Debug, Default)]
pub struct ConvertOptions {
    /// Makes the profile ids: the same request and seed give the same ids.
    pub seed: Id,
    /// Labels every profile gets, over its resource's, its scope's and its
    /// samples' (these win).
    pub labels: fathom_model::Labels,
    /// The stacks the head the profiles go to holds already, left out of
    /// the output's table as [`fathom_pprof::NormalizeOptions::held`]
    /// leaves them; `None` builds a table with every stack.
    pub held: Option<std::sync::Arc<dyn fathom_model::HeldStacks>>,
}

fn check_counts(profiles: usize, samples: usize, limits: &Limits) -> Result<(), Error> {
    if profiles > limits.max_profiles {
        return Err(Error::TooLarge(format!(
            "the request has {profiles} profiles; the limit is {}",
            limits.max_profiles
        )));
    }
    if samples > limits.max_samples {
        return Err(Error::TooLarge(format!(
            "the request has {samples} samples; the limit is {}",
            limits.max_samples
        )));
    }
    Ok(())
}

fn resolve_layout(
    m: &wire::ExportProfilesServiceRequest,
    ev: &scan::Evidence,
) -> Result<Layout, Error> {
    match (ev.v1_8, ev.v1_10) {
        (Some(v1_8), Some(v1_10)) => return Err(Error::MixedLayout { v1_8, v1_10 }),
        (Some(_), None) => return Ok(Layout::V1_8),
        (None, Some(_)) => return Ok(Layout::V1_10),
        (None, None) => {}
    }
    let empty = wire::ProfilesDictionary::default();
    let dict = m.dictionary.as_ref().unwrap_or(&empty);
    let (mut v1_8, mut v1_10) = (None, None);
    let samples = m
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .flat_map(|s| &s.profiles)
        .flat_map(|p| &p.samples);
    for s in samples {
        if s.field2.is_empty() {
            continue;
        }
        let ts = s.timestamps_unix_nano.len();
        if ts == 0 {
            v1_8 = Some("a sample has field 2 but no timestamps (v1.8/v1.9 values)");
        } else if s.field2.len() != ts {
            v1_10 = Some(
                "a sample has a different number of field-2 entries than timestamps (v1.10 attribute_indices)",
            );
        } else if !distinct_attribute_indices(&s.field2, dict) {
            v1_8 = Some("a sample's field 2 cannot be attribute indices (v1.8/v1.9 values)");
        }
        if let (Some(v1_8), Some(v1_10)) = (v1_8, v1_10) {
            return Err(Error::MixedLayout { v1_8, v1_10 });
        }
    }
    Ok(if v1_8.is_some() {
        Layout::V1_8
    } else {
        Layout::V1_10
    })
}

/// Whether `idx` are valid, distinct attribute-table indices with
/// distinct keys (what a v1.10 sample's attribute_indices are).
fn distinct_attribute_indices(idx: &[i64], dict: &wire::ProfilesDictionary) -> bool {
    let mut keys = std::collections::HashSet::with_capacity(idx.len());
    for &i in idx {
        let Some(a) = usize::try_from(i)
            .ok()
            .and_then(|i| dict.attribute_table.get(i))
        else {
            return false;
        };
        if !keys.insert(a.key_strindex) {
            return false;
        }
    }
    true
}
