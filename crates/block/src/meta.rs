use serde::{Deserialize, Serialize};

/// The block format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 2;

/// `meta.json`: what a block holds. Written last; its presence makes the
/// block exist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockMeta {
    pub format_version: u32,
    /// A UUIDv7 (time-ordered) string.
    pub id: String,
    pub tenant: String,
    /// Inclusive bounds of the profiles' timestamps, unix nanoseconds.
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
    /// 0 for blocks cut by an ingester; higher after compaction.
    pub level: u32,
    /// Who wrote it (ingester or compactor instance name).
    pub source: String,
    /// Blocks this one replaces (compaction); empty for level 0.
    #[serde(default)]
    pub compacted_from: Vec<String>,
    pub profile_types: Vec<String>,
    pub stats: BlockStats,
    /// Widths of the buckets of `rollup.parquet`, nanoseconds (e.g. an
    /// hour and a day); empty when the block has no rollup (level 0, and
    /// every version 1 block).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollup_widths_nanos: Vec<i64>,
    /// Unix milliseconds when the block was written.
    pub created_at_ms: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockStats {
    pub series: u64,
    pub profiles: u64,
    pub samples: u64,
    pub stacks: u64,
    pub locations: u64,
    pub functions: u64,
    pub mappings: u64,
    /// Bytes of every Parquet file of the block.
    pub bytes: u64,
    /// Bytes of samples.parquet alone.
    pub sample_bytes: u64,
}

impl BlockMeta {
    /// Whether the block may hold data in `[start, end]` (nanoseconds).
    pub fn overlaps(&self, start: i64, end: i64) -> bool {
        self.min_time_nanos <= end && self.max_time_nanos >= start
    }
}
