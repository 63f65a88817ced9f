//! Java Flight Recorder (JFR) recordings into Fathom profiles, the way
//! Grafana Pyroscope converts what its Java agent (async-profiler) sends
//! to `/ingest?format=jfr`.
//!
//! ```text
//!  JFR bytes ─ reader ─► chunks: metadata (types), constant pools, events
//!                                      │
//!  labels part (LabelsSnapshot) ──────►├─ convert: one pprof per event kind,
//!                                      │  samples keyed by (stack, context)
//!                                      ▼
//!                      fathom_pprof::normalize ─► Normalized { profiles, symbols }
//! ```
//!
//! | JFR event | Fathom profile type(s) |
//! |---|---|
//! | `jdk.ExecutionSample` | `process_cpu:cpu:nanoseconds:cpu:nanoseconds` (× period); also `wall` when the recording's `event` setting is `wall` |
//! | `profiler.WallClockSample` | `wall:wall:nanoseconds:wall:nanoseconds` (`samples` × period); also CPU for `STATE_RUNNABLE` samples when `event` is `wall` |
//! | `jdk.ObjectAllocationInNewTLAB` | `memory:alloc_in_new_tlab_objects:count:space:bytes`, `memory:alloc_in_new_tlab_bytes:bytes:space:bytes` (`tlabSize`) |
//! | `jdk.ObjectAllocationOutsideTLAB` | `memory:alloc_outside_tlab_objects:count:space:bytes`, `memory:alloc_outside_tlab_bytes:bytes:space:bytes` (`allocationSize`) |
//! | `jdk.ObjectAllocationSample` | `memory:alloc_sample_objects:count:space:bytes`, `memory:alloc_sample_bytes:bytes:space:bytes` (`weight`) |
//! | `jdk.JavaMonitorEnter` | `mutex:contentions:count:mutex:count`, `mutex:delay:nanoseconds:mutex:count` (`duration`) |
//! | `jdk.ThreadPark` | `block:contentions:count:block:count`, `block:delay:nanoseconds:block:count` (`duration`) |
//! | `profiler.LiveObject` | `memory:live:count:objects:count` |
//! | `profiler.Malloc` | `memory:malloc_objects:count:space:bytes`, `memory:malloc_bytes:bytes:space:bytes` (`size`) |
//!
//! The period is `1e9 / sample_rate` nanoseconds (the request's
//! `sampleRate`, default 100 Hz). CPU samples of threads in
//! `STATE_SLEEPING` are not CPU time and are dropped. Frames are named
//! `<class>.<method>` from the JFR symbols (`java/lang/Thread.run`), with
//! JVM-generated class names merged as Pyroscope does
//! (`App$$Lambda$14/0x0000000800c03000` → `App$$Lambda_`, see
//! [`merge_generated_names`]). A sample's `contextId` selects its labels in
//! the [`LabelsSnapshot`]; they become series labels (request labels win).
//!
//! # Bounds
//!
//! The reader never trusts a count, size or offset: chunk sizes and
//! offsets must lie inside the input, every count must fit in the bytes
//! left, metadata elements and inline objects nest at most 32 deep, a
//! class may not contain itself inline, and constant pool chains must move
//! backwards. Distinct samples, functions and locations are bounded by
//! [`fathom_pprof::Limits`]. Malformed input is an error naming the byte
//! offset; nothing panics.

mod convert;
pub mod corpus;
mod labels;
mod reader;

pub use convert::{JfrOptions, decode, merge_generated_names, to_pprof};
pub use labels::{Context, LabelsSnapshot};

/// Why a JFR recording (or its labels) could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum JfrError {
    /// The input does not start with a JFR chunk.
    #[error("not a JFR recording: no chunk magic \"FLR\\0\" at byte {offset}")]
    NotJfr { offset: usize },
    /// The input ends inside a structure.
    #[error("truncated JFR recording: it ends inside {what} (byte {offset})")]
    Truncated { what: &'static str, offset: usize },
    /// A structure is inconsistent.
    #[error("invalid JFR recording at byte {offset}: {msg}")]
    Invalid { offset: usize, msg: String },
    /// The labels part is not a `LabelsSnapshot`.
    #[error("the labels part is not a valid LabelsSnapshot protobuf: {0}")]
    Labels(#[source] prost::DecodeError),
    /// More distinct samples, functions or locations than the limits allow.
    #[error("the recording has more than {limit} distinct {what}")]
    TooMany { what: &'static str, limit: usize },
    /// Normalization refused the converted profile.
    #[error(transparent)]
    Normalize(#[from] fathom_pprof::NormalizeError),
}

impl JfrError {
    /// Makes a chunk-relative offset absolute.
    fn shifted(self, by: usize) -> Self {
        match self {
            JfrError::NotJfr { offset } => JfrError::NotJfr {
                offset: offset + by,
            },
            JfrError::Truncated { what, offset } => JfrError::Truncated {
                what,
                offset: offset + by,
            },
            JfrError::Invalid { offset, msg } => JfrError::Invalid {
                offset: offset + by,
                msg,
            },
            e => e,
        }
    }
}

#[cfg(test)]
mod tests;
