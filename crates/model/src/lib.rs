//! Fathom's shared vocabulary, with no I/O.
//!
//! Every other crate speaks in these types: a [`TenantId`] scopes all data, a
//! [`ProfileType`] names what a value measures, a [`Labels`] set plus a
//! profile type is a series, and a [`Profile`] is one timestamped observation
//! of a series: a list of (stack, value) samples. Stacks, locations,
//! functions and mappings live in a [`Symbols`] table under content-addressed
//! 128-bit ids ([`Id`]) that every process computes identically, so
//! ingesters, blocks and queriers agree without coordination and merging
//! symbol tables is a union by id.
//!
//! ```text
//! pprof / folded ──► (fathom-pprof) ──► IngestBatch { profiles, symbols } ──► ingester ──► blocks
//! ```
//!
//! Invariants kept by constructors here:
//! - a `TenantId` matches `[A-Za-z0-9_.-]{1,150}`;
//! - a `Labels` set is sorted by name with unique names;
//! - an [`Id`] depends only on the content it names (xxh3-128).

mod demangle;
mod ids;
mod labels;
mod profile;
mod profile_type;
mod selector;
mod symbols;
mod tenant;

pub use demangle::demangle;
pub use ids::{Id, IdHashState, IdHasher, IdMap, IdSet};
pub use labels::{LabelError, Labels, SERVICE_NAME, valid_label_name};
pub use profile::{IngestBatch, Profile, Sample, series_id};
pub use profile_type::{ProfileType, ProfileTypeError};
pub use selector::{MatchOp, Matcher, Selector, SelectorError};
pub use symbols::{
    FrameIndex, Function, HeldStacks, Line, Location, Mapping, ResolvedIndex, Stack, StackHasher,
    Symbols,
};
pub use tenant::{TenantError, TenantId};
