//! Symbols on the server: debug info files kept by GNU build id in the
//! object store (uploaded by users, or fetched from debuginfod servers),
//! and symbolization at query time of frames that arrived as (build id,
//! address) only — from the agent in server mode, OTLP, or pprof with
//! mappings and no functions.
//!
//! ```text
//!  PUT /api/v1/debuginfo/<build id> ──► inspect (ELF, build id, size) ──► store: file, then meta.json
//!  query ──► Symbolizer::symbolize(tenant, symbols) ──► address cache ──► store │ debuginfod
//! ```
//!
//! Invariants: a file is stored whole or not at all and only under its own
//! build id; a tenant sees its own uploads and shared debuginfod files,
//! never another tenant's uploads; a query waits for symbols at most a
//! bounded time and never sees a blank frame (what is unresolved keeps its
//! address).

mod debuginfod;
mod elf;
mod gopclntab;
mod http;
mod resolve;
mod store;

pub use debuginfod::{Debuginfod, DebuginfodConfig};
pub use elf::{ElfError, ElfInfo, Kind, Segment, build_id, inspect};
pub use http::router;
pub use resolve::{Frame, Symbolizer, SymbolizerConfig};
pub use store::{DebugInfoMeta, DebugInfoStore, Owner, Source, StoreError, check_build_id};

pub use fathom_model::demangle;
