//! Fathom's edge for profile data: everything that turns bytes a client
//! sends into Fathom's model, and merged query results back into pprof.
//!
//! ```text
//!  pprof protobuf (raw / gzip)  ─┐
//!  legacy pprof formats         ─┼─ decode ─► pprof::Profile ─ normalize ─┐
//!                                │                                          ├─► Normalized { profiles, symbols }
//!  folded text (format=folded)  ─┼──────────────── parse_folded ───────────┤
//!  speedscope JSON               ─┴── parse_speedscope (pprof + normalize) ──┘
//!
//!  (stack, value) samples + Symbols ─ encode ─► gzip'd pprof   (query format=pprof)
//!                                   ─ folded_lines ─► "a;b;c" + value (tests, tools)
//! ```
//!
//! - [`decode`] accepts what `go tool pprof` accepts: pprof protobuf, raw
//!   or gzip'd, and the legacy formats (gperftools CPU binary in all four
//!   word layouts, heapz/heap/growth/fragmentation/jemalloc text, Go
//!   debug=1 heap/goroutine/threadcreate text, threadz, contentionz and
//!   Go mutex/block text, Java CPU/heap/contention). It enforces
//!   [`Limits`] (a gzip bomb stops at the decompressed-size limit), repairs
//!   invalid UTF-8 and validates every cross-reference. It never panics.
//! - [`normalize`] maps one pprof to one Fathom [`Profile`] per (sample
//!   type, series): see [`profile_type`] for the naming rules and
//!   [`normalize`] for labels, merging and ids.
//! - [`parse_folded`] reads Pyroscope/FlameGraph folded stacks; see
//!   [`folded_profile_type`] for the units mapping.
//! - [`parse_speedscope`] reads speedscope JSON (sampled and evented
//!   profiles), as Pyroscope's `format=speedscope` does.
//! - [`encode`] renders query results as pprof; [`folded_lines`] is the
//!   one-profile folded form the corpus tests compare (the query API's
//!   folded, top and flame graph output, one or two columns, is rendered by
//!   the querier).
//!
//! `docs/ingest-formats.md` in the repository describes the formats and
//! rules for users.
//!
//! # Normalization rules
//!
//! - A pprof with N sample types yields up to N profile types; sample types
//!   that map to the same profile type are summed into one.
//! - String sample labels become series labels: samples are split into one
//!   profile per distinct label set (like Pyroscope). Keys are sanitized
//!   ([`sanitize_label_name`]); a sample label never overrides a series
//!   label given in [`NormalizeOptions::labels`]; for a key repeated within
//!   a sample the first value wins; empty values, keys starting with `__`
//!   and the per-sample ids in [`IGNORED_SAMPLE_LABELS`] (`span_id`,
//!   `profile_id`) are dropped. Numeric labels are dropped.
//! - Within one profile, samples with the same stack are summed; a value of
//!   0 (or a sum of 0) drops the sample from that profile; a sample without
//!   locations is dropped (it has no stack to attribute its value to); a
//!   (type, series) pair with no samples left produces no profile.
//! - Stacks, locations, functions and mappings go into [`Symbols`] under
//!   content-addressed ids, computed once per pprof location, function and
//!   mapping. A location without a mapping gets mapping [`Id::ZERO`]; a
//!   line without a function (function id 0) is dropped, so a location with
//!   only such lines is unsymbolized and prints as its address. Lines keep
//!   pprof's order (callee first). Names are stored as sent
//!   ([`go_pprof_display_name`] gives `go tool pprof`'s short form). `drop_frames` and
//!   `keep_frames` are ignored.
//! - Each profile's id is
//!   `IdHasher::new("profile").id(seed).str(profile_type).str(labels)`;
//!   its time is the override, else the pprof's `time_nanos` (0 if unset:
//!   the caller fills in the receive time); duration likewise; the period
//!   is the pprof's.
//!
//! [`Profile`]: fathom_model::Profile
//! [`Symbols`]: fathom_model::Symbols
//! [`Id::ZERO`]: fathom_model::Id::ZERO

mod decode;
mod encode;
mod folded;
mod gzip;
mod index;
mod legacy;
mod normalize;
mod speedscope;
mod wire;

pub use decode::{DecodeError, DecodeNormalizeError, decode, decode_and_normalize, validate};
pub use encode::{encode, to_pprof};
pub use folded::{
    Aggregation, DEFAULT_SAMPLE_RATE, FoldedError, FoldedOptions, folded_lines,
    folded_profile_type, parse_folded,
};
pub use legacy::LegacyError;

/// The legacy (pre-protobuf) text and binary formats alone, without
/// trying protobuf first as [`decode`] does: for tests and fuzzing. Never
/// panics, whatever the input.
pub fn decode_legacy(
    bytes: &[u8],
    limits: &Limits,
) -> Result<fathom_proto::pprof::Profile, LegacyError> {
    legacy::parse(bytes, limits)
}
pub use normalize::{
    DEFAULT_MAX_SERIES, IGNORED_SAMPLE_LABELS, NormalizeError, NormalizeOptions, Normalized,
    SampleColumns, display_name, go_pprof_display_name, normalize, normalize_columns, profile_type,
    sanitize_label_name,
};
pub use speedscope::{SPEEDSCOPE_SCHEMA, SpeedscopeError, SpeedscopeOptions, parse_speedscope};

/// The protobuf profiles of the shared corpus (`shared/testdata/pprof`,
/// as its manifest lists them): each file's name and bytes, as stored.
#[cfg(test)]
pub(crate) fn protobuf_corpus() -> Vec<(String, Vec<u8>)> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/pprof");
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    manifest
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            (f.len() >= 5 && f[4].starts_with("pprof-proto")).then(|| f[0].to_owned())
        })
        .map(|name| {
            let bytes = std::fs::read(dir.join(&name))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.join(&name).display()));
            (name, bytes)
        })
        .collect()
}

/// Size limits for untrusted input. Every limit is checked before the
/// corresponding memory is allocated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most bytes a profile may have, after gzip decompression (raw
    /// input larger than this is refused too). Default 64 MiB.
    pub max_decompressed_bytes: usize,
    /// The most samples in a pprof (lines in folded text). Default 1,000,000.
    pub max_samples: usize,
    /// The most locations. Default 1,000,000.
    pub max_locations: usize,
    /// The most functions (distinct frames in folded text). Default 1,000,000.
    pub max_functions: usize,
    /// The most mappings. Default 65,536.
    pub max_mappings: usize,
    /// The most string-table entries. Default 2,000,000.
    pub max_strings: usize,
    /// The most sample types. Default 64.
    pub max_sample_types: usize,
    /// The most memory a decoded protobuf profile may take, counted from
    /// the sizes of the decoded structs as decoding proceeds: small
    /// messages expand (a 2-byte empty label becomes a 32-byte struct), so
    /// this bounds what a hostile profile under the byte limit can cost.
    /// Real profiles take up to about 8× their encoded size. Default 512 MiB.
    pub max_decoded_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_decompressed_bytes: 64 << 20,
            max_samples: 1_000_000,
            max_locations: 1_000_000,
            max_functions: 1_000_000,
            max_mappings: 65_536,
            max_strings: 2_000_000,
            max_sample_types: 64,
            max_decoded_bytes: 512 << 20,
        }
    }
}
