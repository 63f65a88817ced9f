use arrow::array::{
    Array, AsArray, FixedSizeBinaryArray, Int64Array, ListArray, RecordBatch, StringArray,
    UInt64Array,
};
use arrow::datatypes::Int64Type;
use bytes::Bytes;
use fathom_model::{Function, Id, Labels, Line, Location, Mapping, Stack, Symbols};
use object_store::ObjectStore;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder, RowSelection,
};
use parquet::file::metadata::PageIndexPolicy;

use crate::meta::{BlockMeta, FORMAT_VERSION};
use crate::schema::{ProfileRow, SeriesRow};
use crate::{Error, Result, block_file, files};

/// Reads and checks a block's `meta.json`; `Ok(None)` when it is absent
/// (the block does not exist, or its upload has not finished).
pub async fn read_meta(
    store: &dyn ObjectStore,
    tenant: &str,
    block_id: &str,
) -> Result<Option<BlockMeta>> {
    let bytes = match store.get(&block_file(tenant, block_id, files::META)).await {
        Ok(r) => r.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let meta: BlockMeta = serde_json::from_slice(&bytes).map_err(|e| Error::Meta {
        block: block_id.to_owned(),
        source: e,
    })?;
    if meta.format_version > FORMAT_VERSION {
        return Err(Error::Version {
            block: block_id.to_owned(),
            found: meta.format_version,
        });
    }
    Ok(Some(meta))
}

/// Every complete block of every tenant, by listing the bucket. Used at
/// start-up to build the block index; never on the query path.
pub async fn list_blocks(store: &dyn ObjectStore) -> Result<Vec<BlockMeta>> {
    let mut out = Vec::new();
    let tenants = store.list_with_delimiter(None).await?;
    for t in tenants.common_prefixes {
        let Some(tenant) = t.filename().map(str::to_owned) else {
            continue;
        };
        let blocks = store
            .list_with_delimiter(Some(&Path::from(format!("{tenant}/blocks"))))
            .await?;
        for b in blocks.common_prefixes {
            let Some(id) = b.filename() else { continue };
            if let Some(meta) = read_meta(store, &tenant, id).await? {
                out.push(meta);
            }
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Every row of one of a block's files, in batches of parquet-rs's
/// default size.
async fn read_file(
    store: &dyn ObjectStore,
    meta: &BlockMeta,
    file: &'static str,
) -> Result<Vec<RecordBatch>> {
    let bytes = file_bytes(store, meta, file).await?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
    Ok(reader.collect::<std::result::Result<Vec<_>, _>>()?)
}

/// Rows a batch of samples [`SampleFile::rows`] gives: a block's millions
/// of rows in a few hundred batches, not thousands.
const SAMPLE_ROWS: usize = 1 << 16;

/// The whole of one of a block's files.
async fn file_bytes(
    store: &dyn ObjectStore,
    meta: &BlockMeta,
    file: &'static str,
) -> Result<Bytes> {
    Ok(store
        .get(&block_file(&meta.tenant, &meta.id, file))
        .await?
        .bytes()
        .await?)
}

/// Every sample row of a block, in [`crate::samples_schema`].
pub async fn read_samples(store: &dyn ObjectStore, meta: &BlockMeta) -> Result<Vec<RecordBatch>> {
    SampleFile::fetch(store, meta).await?.rows()?.collect()
}

/// A block's samples file, fetched whole (compressed: a few bytes a
/// row) and decoded a batch at a time as it is read, so that a
/// compaction merges its sources' rows without holding any source
/// decoded whole. Cloning it shares the bytes.
#[derive(Clone)]
pub struct SampleFile {
    block: String,
    bytes: Bytes,
    metadata: ArrowReaderMetadata,
    /// The rows read, or every row.
    selection: Option<RowSelection>,
}

impl SampleFile {
    /// Fetches the samples file of `meta` and reads its footer.
    pub async fn fetch(store: &dyn ObjectStore, meta: &BlockMeta) -> Result<Self> {
        let bytes = file_bytes(store, meta, files::SAMPLES).await?;
        Self::from_bytes(&meta.id, bytes)
    }

    /// The samples file `bytes` of block `block`.
    pub fn from_bytes(block: &str, bytes: Bytes) -> Result<Self> {
        // The page index lets a selection skip the pages it does not
        // hold; a file without one is read page by page.
        let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
        let metadata = ArrowReaderMetadata::load(&bytes, options)?;
        Ok(SampleFile {
            block: block.to_owned(),
            bytes,
            metadata,
            selection: None,
        })
    }

    /// The block the file is of.
    pub fn block(&self) -> &str {
        &self.block
    }

    /// Rows of the file.
    pub fn num_rows(&self) -> usize {
        usize::try_from(self.metadata.metadata().file_metadata().num_rows()).unwrap_or(0)
    }

    /// Only the rows at `ranges` (row numbers, ascending, not
    /// overlapping): pages that hold none of them are not decoded, so a
    /// compaction decodes of a replica only the profiles no earlier
    /// source gave. Ranges beyond the file or out of order are refused.
    pub fn select(mut self, ranges: &[std::ops::Range<usize>]) -> Result<Self> {
        let rows = self.num_rows();
        if ranges.iter().any(|r| r.start > r.end || r.end > rows)
            || ranges.windows(2).any(|w| w[0].end > w[1].start)
        {
            return Err(Error::Corrupt {
                block: self.block,
                file: files::SAMPLES,
                what: format!("row ranges beyond its {rows} rows or out of order"),
            });
        }
        self.selection = Some(RowSelection::from_consecutive_ranges(
            ranges.iter().cloned(),
            rows,
        ));
        Ok(self)
    }

    /// The same file with every row selected.
    pub fn whole(&self) -> Self {
        SampleFile {
            selection: None,
            ..self.clone()
        }
    }

    /// Whether only some rows are selected.
    pub fn is_selection(&self) -> bool {
        self.selection.is_some()
    }

    /// The selected rows, every column, in batches of up to 64 Ki rows.
    pub fn rows(&self) -> Result<SampleRows> {
        self.read(ProjectionMask::all())
    }

    /// The selected rows' columns `names` only (in the file's order).
    pub fn columns(&self, names: &[&str]) -> Result<SampleRows> {
        let schema = self.metadata.schema();
        let mut at = Vec::with_capacity(names.len());
        for n in names {
            at.push(schema.index_of(n).map_err(|_| Error::Corrupt {
                block: self.block.clone(),
                file: files::SAMPLES,
                what: format!("no column {n}"),
            })?);
        }
        self.read(ProjectionMask::roots(self.metadata.parquet_schema(), at))
    }

    fn read(&self, mask: ProjectionMask) -> Result<SampleRows> {
        let mut builder = ParquetRecordBatchReaderBuilder::new_with_metadata(
            self.bytes.clone(),
            self.metadata.clone(),
        )
        .with_projection(mask)
        .with_batch_size(SAMPLE_ROWS);
        if let Some(s) = &self.selection {
            builder = builder.with_row_selection(s.clone());
        }
        Ok(SampleRows(builder.build()?))
    }
}

/// Batches of a [`SampleFile`]'s rows, decoded as they are taken.
pub struct SampleRows(ParquetRecordBatchReader);

impl Iterator for SampleRows {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|r| r.map_err(Error::from))
    }
}

fn corrupt(meta: &BlockMeta, file: &'static str, what: impl Into<String>) -> Error {
    Error::Corrupt {
        block: meta.id.clone(),
        file,
        what: what.into(),
    }
}

fn col<'a, T: 'static>(
    b: &'a RecordBatch,
    i: usize,
    meta: &BlockMeta,
    file: &'static str,
) -> Result<&'a T> {
    b.columns()
        .get(i)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| corrupt(meta, file, format!("column {i} has an unexpected type")))
}

fn id_at(a: &FixedSizeBinaryArray, i: usize) -> Id {
    Id::from_slice(a.value(i)).unwrap_or(Id::ZERO)
}

/// Where row `i`'s items lie in `list`'s values: read from the offsets,
/// without the array of its own that `ListArray::value` makes a row.
fn items(list: &ListArray, i: usize) -> std::ops::Range<usize> {
    let offsets = list.value_offsets();
    let at = |k: usize| {
        offsets
            .get(k)
            .and_then(|&o| usize::try_from(o).ok())
            .unwrap_or(0)
    };
    let (start, end) = (at(i), at(i + 1));
    start..end.max(start)
}

/// The ids of row `i` of a list of ids, copied from the values' bytes.
fn ids_of(list: &ListArray, i: usize) -> Vec<Id> {
    let Some(values) = list
        .values()
        .as_fixed_size_binary_opt()
        .filter(|a| a.value_size() == 16)
    else {
        return Vec::new();
    };
    let r = items(list, i);
    values
        .value_data()
        .get(r.start * 16..r.end * 16)
        .map(|b| {
            b.chunks_exact(16)
                .map(|c| Id::from_slice(c).unwrap_or(Id::ZERO))
                .collect()
        })
        .unwrap_or_default()
}

/// The series of a block.
pub async fn read_series(store: &dyn ObjectStore, meta: &BlockMeta) -> Result<Vec<SeriesRow>> {
    let f = files::SERIES;
    let mut out = Vec::new();
    for b in read_file(store, meta, f).await? {
        let id = col::<FixedSizeBinaryArray>(&b, 0, meta, f)?;
        let pt = col::<StringArray>(&b, 1, meta, f)?;
        let labels = col::<StringArray>(&b, 3, meta, f)?;
        let min = col::<Int64Array>(&b, 4, meta, f)?;
        let max = col::<Int64Array>(&b, 5, meta, f)?;
        for i in 0..b.num_rows() {
            let map: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(labels.value(i))
                    .map_err(|e| corrupt(meta, f, format!("labels: {e}")))?;
            let labels = Labels::from_pairs(
                map.into_iter()
                    .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_owned())),
            )
            .map_err(|e| corrupt(meta, f, e.to_string()))?;
            out.push(SeriesRow {
                series_id: id_at(id, i),
                profile_type: pt
                    .value(i)
                    .parse()
                    .map_err(|e: fathom_model::ProfileTypeError| corrupt(meta, f, e.to_string()))?,
                labels,
                min_time_nanos: min.value(i),
                max_time_nanos: max.value(i),
            });
        }
    }
    Ok(out)
}

/// The profile headers of a block.
pub async fn read_profiles(store: &dyn ObjectStore, meta: &BlockMeta) -> Result<Vec<ProfileRow>> {
    let f = files::PROFILES;
    let mut out = Vec::new();
    for b in read_file(store, meta, f).await? {
        let pid = col::<FixedSizeBinaryArray>(&b, 0, meta, f)?;
        let sid = col::<FixedSizeBinaryArray>(&b, 1, meta, f)?;
        let t = col::<Int64Array>(&b, 2, meta, f)?;
        let d = col::<Int64Array>(&b, 3, meta, f)?;
        let p = col::<Int64Array>(&b, 4, meta, f)?;
        let n = col::<UInt64Array>(&b, 5, meta, f)?;
        for i in 0..b.num_rows() {
            out.push(ProfileRow {
                profile_id: id_at(pid, i),
                series_id: id_at(sid, i),
                time_nanos: t.value(i),
                duration_nanos: d.value(i),
                period: p.value(i),
                samples: n.value(i),
            });
        }
    }
    Ok(out)
}

/// The whole symbol table of a block.
pub async fn read_symbols(store: &dyn ObjectStore, meta: &BlockMeta) -> Result<Symbols> {
    let mut s = Symbols::default();
    let f = files::FUNCTIONS;
    for b in read_file(store, meta, f).await? {
        let id = col::<FixedSizeBinaryArray>(&b, 0, meta, f)?;
        let name = col::<StringArray>(&b, 1, meta, f)?;
        let sys = col::<StringArray>(&b, 2, meta, f)?;
        let file = col::<StringArray>(&b, 3, meta, f)?;
        let line = col::<Int64Array>(&b, 4, meta, f)?;
        for i in 0..b.num_rows() {
            s.functions.insert(
                id_at(id, i),
                Function {
                    name: name.value(i).to_owned(),
                    system_name: sys.value(i).to_owned(),
                    filename: file.value(i).to_owned(),
                    start_line: line.value(i),
                },
            );
        }
    }
    let f = files::MAPPINGS;
    for b in read_file(store, meta, f).await? {
        let id = col::<FixedSizeBinaryArray>(&b, 0, meta, f)?;
        let start = col::<UInt64Array>(&b, 1, meta, f)?;
        let limit = col::<UInt64Array>(&b, 2, meta, f)?;
        let off = col::<UInt64Array>(&b, 3, meta, f)?;
        let file = col::<StringArray>(&b, 4, meta, f)?;
        let build = col::<StringArray>(&b, 5, meta, f)?;
        for i in 0..b.num_rows() {
            s.mappings.insert(
                id_at(id, i),
                Mapping {
                    memory_start: start.value(i),
                    memory_limit: limit.value(i),
                    file_offset: off.value(i),
                    filename: file.value(i).to_owned(),
                    build_id: build.value(i).to_owned(),
                },
            );
        }
    }
    let f = files::LOCATIONS;
    for b in read_file(store, meta, f).await? {
        let id = col::<FixedSizeBinaryArray>(&b, 0, meta, f)?;
        let mapping = col::<FixedSizeBinaryArray>(&b, 1, meta, f)?;
        let addr = col::<UInt64Array>(&b, 2, meta, f)?;
        let fns = col::<ListArray>(&b, 3, meta, f)?;
        let lines = col::<ListArray>(&b, 4, meta, f)?;
        let nums = lines.values().as_primitive_opt::<Int64Type>();
        s.locations.reserve(b.num_rows());
        for i in 0..b.num_rows() {
            let fids = ids_of(fns, i);
            let row = nums.and_then(|n| n.values().get(items(lines, i)));
            let lines = fids
                .iter()
                .enumerate()
                .map(|(j, f)| Line {
                    function: *f,
                    line: row.and_then(|r| r.get(j)).copied().unwrap_or(0),
                })
                .collect();
            s.locations.insert(
                id_at(id, i),
                Location {
                    mapping: id_at(mapping, i),
                    address: addr.value(i),
                    lines,
                },
            );
        }
    }
    let f = files::STACKS;
    for b in read_file(store, meta, f).await? {
        let id = col::<FixedSizeBinaryArray>(&b, 0, meta, f)?;
        let locs = col::<ListArray>(&b, 1, meta, f)?;
        s.stacks.reserve(b.num_rows());
        for i in 0..b.num_rows() {
            s.stacks.insert(
                id_at(id, i),
                Stack {
                    locations: ids_of(locs, i),
                },
            );
        }
    }
    Ok(s)
}
