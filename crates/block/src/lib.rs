//! Fathom's block format, owned here and only here: the ingester writes
//! blocks through this crate, the compactor rewrites them through it and the
//! querier reads them through it.
//!
//! A block is one tenant's data for a time range, stored under
//! `<tenant>/blocks/<block id>/` in the object store:
//!
//! ```text
//! samples.parquet    series_id, time_nanos, profile_id, stack_id, value   (sorted in that order)
//! profiles.parquet   profile_id, series_id, time_nanos, duration_nanos, period, samples
//! series.parquet     series_id, profile_type, service_name, labels (JSON), min/max time
//! stacks.parquet     stack_id, location_ids (leaf first)
//! locations.parquet  location_id, mapping_id, address, line_function_ids, line_numbers
//! functions.parquet  function_id, name, system_name, filename, start_line
//! mappings.parquet   mapping_id, memory_start, memory_limit, file_offset, filename, build_id
//! rollup.parquet     series_id, bucket_width_nanos, bucket_start_nanos, stack_id, value
//!                    (compacted blocks: stack totals per series and hour / day)
//! meta.json          written last: a block without it does not exist
//! ```
//!
//! Ids are the content-addressed 128-bit ids of `fathom-model`, stored as
//! 16-byte fixed-size binary. `docs/block-format.md` is the user-facing
//! description; [`FORMAT_VERSION`] changes whenever a reader of the previous
//! version could misread a block.
//!
//! Failure modes: a writer that dies before `meta.json` leaves orphan files
//! that no reader sees (the compactor deletes them later); a reader that
//! finds a newer format version refuses the block with an error.

mod idcol;
mod index;
mod meta;
mod read;
mod rollup;
mod schema;
mod write;

pub use index::{BlockIndex, IndexError, MemoryIndex};
pub use meta::{BlockMeta, BlockStats, FORMAT_VERSION};
pub use read::{
    SampleFile, SampleRows, list_blocks, read_meta, read_profiles, read_samples, read_series,
    read_symbols,
};
pub use rollup::{Cover, DAY_NANOS, HOUR_NANOS, bucket_start, full_buckets};
pub use schema::{
    ProfileRow, SeriesRow, columns, id_values, profiles_schema, rollup_schema, samples_schema,
    series_schema, stacks_schema,
};
pub use write::{
    BlockData, EncodedBlock, SamplesBuilder, encode_block, encode_sorted_block, encode_sorted_rows,
    samples_batch, samples_sorted, write_block,
};

use object_store::path::Path;

/// File names inside a block directory.
pub mod files {
    pub const SAMPLES: &str = "samples.parquet";
    pub const PROFILES: &str = "profiles.parquet";
    pub const SERIES: &str = "series.parquet";
    pub const STACKS: &str = "stacks.parquet";
    pub const LOCATIONS: &str = "locations.parquet";
    pub const FUNCTIONS: &str = "functions.parquet";
    pub const MAPPINGS: &str = "mappings.parquet";
    /// Stack totals per series and time bucket (compacted blocks only).
    pub const ROLLUP: &str = "rollup.parquet";
    pub const META: &str = "meta.json";
}

/// `<tenant>/blocks/<block id>`
pub fn block_dir(tenant: &str, block_id: &str) -> Path {
    Path::from(format!("{tenant}/blocks/{block_id}"))
}

/// `<tenant>/blocks/<block id>/<file>`
pub fn block_file(tenant: &str, block_id: &str, file: &str) -> Path {
    Path::from(format!("{tenant}/blocks/{block_id}/{file}"))
}

/// Errors reading or writing blocks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("block {block}: meta.json is invalid: {source}")]
    Meta {
        block: String,
        source: serde_json::Error,
    },
    #[error("block {block} has format version {found}; this build reads up to {FORMAT_VERSION}")]
    Version { block: String, found: u32 },
    #[error("sample rows given as sorted come out of order")]
    Unsorted,
    #[error("block {block}: {file}: {what}")]
    Corrupt {
        block: String,
        file: &'static str,
        what: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
