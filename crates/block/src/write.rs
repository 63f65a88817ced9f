use std::sync::Arc;

use arrow::array::{
    ArrayBuilder, ArrayRef, AsArray, FixedSizeBinaryArray, FixedSizeBinaryBuilder, Int64Array,
    Int64Builder, ListArray, ListBuilder, RecordBatch, StringArray, UInt64Array,
};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use fathom_model::{Id, Profile, SERVICE_NAME, Sample, Symbols};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::idcol::{IdChunk, Layout, PAGE_ROWS};
use crate::meta::{BlockMeta, BlockStats, FORMAT_VERSION};
use crate::schema::*;
use crate::{Error, Result, block_file, files};

/// Appends samples of profiles as rows in [`samples_schema`] order.
pub struct SamplesBuilder {
    series: FixedSizeBinaryBuilder,
    time: Int64Builder,
    profile: FixedSizeBinaryBuilder,
    stack: FixedSizeBinaryBuilder,
    value: Int64Builder,
}

impl Default for SamplesBuilder {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

impl SamplesBuilder {
    pub fn with_capacity(n: usize) -> Self {
        SamplesBuilder {
            series: FixedSizeBinaryBuilder::with_capacity(n, 16),
            time: Int64Builder::with_capacity(n),
            profile: FixedSizeBinaryBuilder::with_capacity(n, 16),
            stack: FixedSizeBinaryBuilder::with_capacity(n, 16),
            value: Int64Builder::with_capacity(n),
        }
    }

    /// Appends one row.
    pub fn push(&mut self, series: &Id, time: i64, profile: &Id, stack: &Id, value: i64) {
        // The builders are 16 bytes wide and ids are 16 bytes: cannot fail.
        let _ = self.series.append_value(series.0);
        self.time.append_value(time);
        let _ = self.profile.append_value(profile.0);
        let _ = self.stack.append_value(stack.0);
        self.value.append_value(value);
    }

    /// Appends every sample of `p`, stacks in id order.
    pub fn push_profile(&mut self, p: &Profile) {
        let sid = p.series_id();
        let mut samples = p.samples.clone();
        samples.sort_unstable_by_key(|s| s.stack);
        for s in &samples {
            self.push(&sid, p.time_nanos, &p.id, &s.stack, s.value);
        }
    }

    pub fn len(&self) -> usize {
        self.time.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn finish(mut self) -> RecordBatch {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.series.finish()),
            Arc::new(self.time.finish()),
            Arc::new(self.profile.finish()),
            Arc::new(self.stack.finish()),
            Arc::new(self.value.finish()),
        ];
        // Columns match the schema by construction.
        RecordBatch::try_new(samples_schema(), cols).expect("samples batch matches its schema")
    }
}

/// One [`samples_schema`] batch of `rows` rows from runs of samples that
/// share their series, time and profile (`(series, time, profile,
/// samples)`, rows in the runs' order): for a caller that holds samples
/// apart from their profile (the head: a query's snapshot takes them in
/// any order, a cut gives its runs in the block's order so that
/// [`encode_sorted_block`] need not sort them).
/// Writes each column in one pass; `rows` is the runs' samples in all.
pub fn samples_batch<'a>(
    rows: usize,
    runs: impl IntoIterator<Item = (&'a Id, i64, &'a Id, &'a [Sample])>,
) -> RecordBatch {
    let mut series = Vec::with_capacity(rows * 16);
    let mut time = Vec::with_capacity(rows);
    let mut profile = Vec::with_capacity(rows * 16);
    let mut stack = Vec::with_capacity(rows * 16);
    let mut value = Vec::with_capacity(rows);
    for (s, t, p, samples) in runs {
        for x in samples {
            series.extend_from_slice(&s.0);
            profile.extend_from_slice(&p.0);
            stack.extend_from_slice(&x.stack.0);
            value.push(x.value);
        }
        time.resize(time.len() + samples.len(), t);
    }
    let ids = |v: Vec<u8>| -> ArrayRef { Arc::new(id_array(v)) };
    let cols: Vec<ArrayRef> = vec![
        ids(series),
        Arc::new(Int64Array::from(time)),
        ids(profile),
        ids(stack),
        Arc::new(Int64Array::from(value)),
    ];
    // Columns of equal length, matching the schema by construction.
    RecordBatch::try_new(samples_schema(), cols).expect("samples batch matches its schema")
}

/// Everything one block holds, before encoding.
pub struct BlockData {
    pub tenant: String,
    pub source: String,
    pub level: u32,
    pub compacted_from: Vec<String>,
    pub series: Vec<SeriesRow>,
    pub profiles: Vec<ProfileRow>,
    /// Sample rows in [`samples_schema`]; need not be sorted (rows already
    /// in the block's order are written without a sort).
    pub samples: Vec<RecordBatch>,
    /// Shared, so that an ingester's cut encodes its frozen head's
    /// table without a copy.
    pub symbols: Arc<Symbols>,
    /// Bucket widths of the rollup to write beside the samples
    /// (nanoseconds, e.g. [`crate::HOUR_NANOS`]); empty for none.
    pub rollup_widths_nanos: Vec<i64>,
}

/// Rows a block file's row group holds at most.
const ROW_GROUP_ROWS: usize = 1 << 20;

/// The zstd level of every block file.
const ZSTD_LEVEL: i32 = 3;

/// How a block file's rows are laid out, which decides its writer
/// settings ([`props`]).
#[derive(Clone, Copy)]
enum Rows {
    /// Sorted by the first four columns ([`key_columns`]): the samples
    /// and rollup files.
    Sorted,
    /// One row per value of this column, a content id: the series,
    /// profiles and symbol files.
    Keyed(&'static str),
}

/// The writer settings of a block file of `rows`.
///
/// Writer version 2: under version 1 parquet-rs writes a
/// `FIXED_LEN_BYTE_ARRAY` column PLAIN whatever the dictionary setting
/// (version 1 of the format had no dictionary for it), so every 16-byte
/// id was stored whole, row after row. An ingest-like head of 8.8 M
/// samples gave 116 MB of `samples.parquet` that way and 16.6 MB with
/// its ids dictionary-encoded, for about the same encoding time
/// (docs/benchmarks.md, "Issue 13, thirtieth session"). Readers take
/// either version: blocks written before read as they did.
///
/// A file's key column (each id once) stays PLAIN: a dictionary of
/// values that never repeat only adds an index a row.
///
/// Statistics (min and max a page) only where a range can skip pages:
/// the sorted files' leading columns and a keyed file's key. A stack id
/// within a profile's rows, or a stack's location ids, spans the whole
/// range of hashes on every page, and parquet-rs compares each 16-byte
/// value to keep them: a tenth of a cut's encoding (docs/benchmarks.md,
/// "Issue 13, thirty-fourth session"). Nothing reads those.
fn props(rows: Rows) -> WriterProperties {
    let b = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(ZSTD_LEVEL).unwrap_or_default(),
        ))
        .set_dictionary_enabled(true)
        // Large dictionaries keep 16-byte ids dictionary-encoded.
        .set_dictionary_page_size_limit(64 << 20)
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS));
    match rows {
        Rows::Sorted => b
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_column_statistics_enabled(
                ColumnPath::from(columns::STACK_ID),
                EnabledStatistics::None,
            )
            .set_sorting_columns(Some(key_columns())),
        Rows::Keyed(key) => b
            .set_statistics_enabled(EnabledStatistics::None)
            .set_column_statistics_enabled(ColumnPath::from(key), EnabledStatistics::Page)
            .set_column_dictionary_enabled(ColumnPath::from(key), false)
            .set_column_encoding(ColumnPath::from(key), Encoding::PLAIN),
    }
    .build()
}

fn to_parquet(schema: SchemaRef, batches: &[RecordBatch], rows: Rows) -> Result<Bytes> {
    let mut w = FileWriter::new(schema, rows)?;
    for b in batches {
        w.write(b)?;
    }
    w.finish()
}

/// A block file's writer: parquet-rs's Arrow column writers, but for the
/// id columns [`IdChunk`] encodes ([`Layout::of`] the settings), with the
/// settings of [`props`] and row groups of [`ROW_GROUP_ROWS`] rows, as
/// `ArrowWriter` makes them.
struct FileWriter {
    file: SerializedFileWriter<Vec<u8>>,
    columns: ArrowRowGroupWriterFactory,
    schema: SchemaRef,
    /// Rows a row group holds ([`ROW_GROUP_ROWS`]; fewer in tests).
    group_rows: usize,
    /// The row group being written, and how many came before it.
    group: Option<RowGroup>,
    groups: usize,
}

/// The chunks of one row group, a field each.
struct RowGroup {
    chunks: Vec<Chunk>,
    rows: usize,
}

enum Chunk {
    /// The field's leaves, through parquet-rs.
    Arrow(Vec<ArrowColumnWriter>),
    Ids(IdChunk),
}

impl FileWriter {
    fn new(schema: SchemaRef, rows: Rows) -> Result<Self> {
        let (file, columns) = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props(rows)))?
            .into_serialized_writer()?;
        Ok(FileWriter {
            file,
            columns,
            schema,
            group_rows: ROW_GROUP_ROWS,
            group: None,
            groups: 0,
        })
    }

    fn row_group(&self) -> Result<RowGroup> {
        let descr = self.file.schema_descr();
        let mut chunks: Vec<Chunk> = Vec::with_capacity(self.schema.fields().len());
        let mut field = None;
        for (leaf, w) in self
            .columns
            .create_column_writers(self.groups)?
            .into_iter()
            .enumerate()
        {
            let root = descr.get_column_root_idx(leaf);
            let same = field == Some(root);
            field = Some(root);
            let column = descr.column(leaf);
            match chunks.last_mut() {
                Some(Chunk::Arrow(ws)) if same => ws.push(w),
                // A field of ids (or of lists of them) is one leaf.
                _ => match Layout::of(self.file.properties(), &column) {
                    Some(layout) if !same => {
                        chunks.push(Chunk::Ids(IdChunk::new(column, ZSTD_LEVEL, layout)))
                    }
                    _ => chunks.push(Chunk::Arrow(vec![w])),
                },
            }
        }
        Ok(RowGroup { chunks, rows: 0 })
    }

    /// Writes `b`'s rows, which must have the file's schema.
    fn write(&mut self, b: &RecordBatch) -> Result<()> {
        if b.schema().fields() != self.schema.fields() {
            return Err(parquet::errors::ParquetError::General(
                "a batch's schema differs from its file's".into(),
            )
            .into());
        }
        let mut done = 0;
        while done < b.num_rows() {
            let mut group = match self.group.take() {
                Some(g) => g,
                None => self.row_group()?,
            };
            let n = (b.num_rows() - done).min(self.group_rows - group.rows);
            let part = b.slice(done, n);
            for ((field, col), chunk) in self
                .schema
                .fields()
                .iter()
                .zip(part.columns())
                .zip(&mut group.chunks)
            {
                match chunk {
                    Chunk::Arrow(ws) => {
                        for (w, leaf) in ws.iter_mut().zip(compute_leaves(field, col)?) {
                            w.write(&leaf)?;
                        }
                    }
                    Chunk::Ids(ids) => ids.push_array(col)?,
                }
            }
            group.rows += n;
            done += n;
            if group.rows >= self.group_rows {
                self.flush(group)?;
            } else {
                self.group = Some(group);
            }
        }
        Ok(())
    }

    fn flush(&mut self, group: RowGroup) -> Result<()> {
        let mut rg = self.file.next_row_group()?;
        for chunk in group.chunks {
            match chunk {
                Chunk::Arrow(ws) => {
                    for w in ws {
                        w.close()?.append_to_row_group(&mut rg)?;
                    }
                }
                Chunk::Ids(ids) => {
                    let (bytes, close) = ids.finish()?;
                    rg.append_column(&bytes, close)?;
                }
            }
        }
        rg.close()?;
        self.groups += 1;
        Ok(())
    }

    /// The file's bytes, footer and all.
    fn finish(mut self) -> Result<Bytes> {
        if let Some(group) = self.group.take().filter(|g| g.rows > 0) {
            self.flush(group)?;
        }
        Ok(Bytes::from(self.file.into_inner()?))
    }
}

/// 16-byte ids laid end to end in `bytes`, as an array (no nulls).
fn id_array(bytes: Vec<u8>) -> FixedSizeBinaryArray {
    FixedSizeBinaryArray::new(16, Buffer::from_vec(bytes), None)
}

/// A column of ids, written into one buffer: an array builder's checks
/// and null bookkeeping for each id cost a cut's encoding several percent
/// (docs/benchmarks.md, "Issue 13, thirty-first session").
fn ids<'a>(it: impl Iterator<Item = &'a Id>) -> ArrayRef {
    let mut v = Vec::with_capacity(it.size_hint().0 * 16);
    for id in it {
        v.extend_from_slice(&id.0);
    }
    Arc::new(id_array(v))
}

/// A column of lists of ids (a stack's locations, a location's
/// functions), its values and offsets written into one buffer each.
fn id_lists<'a, L: IntoIterator<Item = &'a Id>>(it: impl Iterator<Item = L>) -> Result<ArrayRef> {
    let mut offsets = Vec::with_capacity(it.size_hint().0 + 1);
    offsets.push(0i32);
    let mut values = Vec::new();
    for list in it {
        for id in list {
            values.extend_from_slice(&id.0);
        }
        let end = i32::try_from(values.len() / 16).map_err(|_| {
            arrow::error::ArrowError::InvalidArgumentError(
                "more than 2^31 ids in one list column".into(),
            )
        })?;
        offsets.push(end);
    }
    let item = Arc::new(arrow::datatypes::Field::new("item", ID, false));
    // Offsets start at 0 and never decrease: `OffsetBuffer::new`, which
    // panics on any that do, takes them.
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    Ok(Arc::new(ListArray::try_new(
        item,
        offsets,
        Arc::new(id_array(values)),
        None,
    )?))
}

fn strings<'a>(it: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(it))
}

/// Whether the rows of `batches` ([`samples_schema`]), read in order, are
/// sorted by (series_id, time_nanos, profile_id, stack_id): one pass over
/// the key columns. A batch of another schema is not sorted.
pub fn samples_sorted(batches: &[RecordBatch]) -> bool {
    let mut order = RowOrder::default();
    batches.iter().all(|b| order.extend(b))
}

/// The sort key of a sample row: its ids as big-endian numbers, which
/// order as their bytes do.
type RowKey = (u128, i64, u128, u128);

/// Checks that sample rows come in the block's order, batch after batch.
#[derive(Default)]
struct RowOrder {
    last: Option<RowKey>,
}

/// The ids of `a` as big-endian numbers; `None` unless `a` holds `rows`
/// 16-byte ids.
fn id_numbers(a: &FixedSizeBinaryArray, rows: usize) -> Option<impl Iterator<Item = u128> + '_> {
    let ids = crate::id_values(a).filter(|ids| ids.len() == rows)?;
    Some(ids.iter().map(|&id| u128::from_be_bytes(id)))
}

impl RowOrder {
    /// Whether `b`'s rows come in order, after those seen before.
    fn extend(&mut self, b: &RecordBatch) -> bool {
        let rows = b.num_rows();
        let (Some(series), Some(time), Some(profile), Some(stack)) = (
            b.column(0)
                .as_fixed_size_binary_opt()
                .and_then(|a| id_numbers(a, rows)),
            b.column(1)
                .as_primitive_opt::<arrow::datatypes::Int64Type>(),
            b.column(2)
                .as_fixed_size_binary_opt()
                .and_then(|a| id_numbers(a, rows)),
            b.column(3)
                .as_fixed_size_binary_opt()
                .and_then(|a| id_numbers(a, rows)),
        ) else {
            return false;
        };
        for (((se, t), p), st) in series.zip(time.values().iter()).zip(profile).zip(stack) {
            let key = (se, *t, p, st);
            if self.last.is_some_and(|l| l > key) {
                return false;
            }
            self.last = Some(key);
        }
        true
    }
}

/// Sorts sample batches by (series_id, time_nanos, profile_id, stack_id).
/// Batches already in that order (what an ingester's head gives) are
/// returned as they are: no copy of every row into one batch, no sort of
/// them and no second copy in sorted order, which for a large head held
/// several times its memory during a cut (docs/benchmarks.md).
fn sort_samples(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    if samples_sorted(batches) {
        return Ok(batches.to_vec());
    }
    let schema = samples_schema();
    let all = arrow::compute::concat_batches(&schema, batches)?;
    let cols = [0usize, 1, 2, 3]
        .iter()
        .map(|&i| arrow::compute::SortColumn {
            values: all.column(i).clone(),
            options: None,
        })
        .collect::<Vec<_>>();
    let idx = arrow::compute::lexsort_to_indices(&cols, None)?;
    Ok(vec![arrow::compute::take_record_batch(&all, &idx)?])
}

/// An encoded block: its meta, and its files by name.
pub type EncodedBlock = (BlockMeta, Vec<(&'static str, Bytes)>);

/// The Parquet files of a block, and its meta. CPU-heavy: run it off the
/// I/O runtime.
pub fn encode_block(data: &BlockData) -> Result<EncodedBlock> {
    let samples = sort_samples(&data.samples)?;
    encode_rows(data, samples.into_iter().map(Ok))
}

/// [`encode_block`] of `data` with its sample rows taken from `sorted`,
/// batch by batch, instead of from `data.samples` (not read): each batch
/// is encoded as it comes and then dropped, so a block's wide rows need
/// not all be in memory at once (an ingester's cut builds them from its
/// head as they are written). The rows must come in the block's order
/// ([`samples_sorted`]); a batch out of order fails the encoding with
/// [`Error::Unsorted`], and nothing is returned.
pub fn encode_sorted_block(
    data: &BlockData,
    sorted: impl IntoIterator<Item = RecordBatch>,
) -> Result<(BlockMeta, Vec<(&'static str, Bytes)>)> {
    encode_sorted_rows(data, sorted.into_iter().map(Ok))
}

/// [`encode_sorted_block`] of rows read as they are encoded (a
/// compaction's merge of its sources' files, row group by row group):
/// the first error a batch gives fails the encoding.
pub fn encode_sorted_rows(
    data: &BlockData,
    sorted: impl IntoIterator<Item = Result<RecordBatch>>,
) -> Result<EncodedBlock> {
    let mut order = RowOrder::default();
    encode_rows(
        data,
        sorted.into_iter().map(move |b| {
            let b = b?;
            if order.extend(&b) {
                Ok(b)
            } else {
                Err(Error::Unsorted)
            }
        }),
    )
}

/// The first four columns, ascending: the sort order of the samples and
/// rollup files, as their Parquet metadata declares it.
fn key_columns() -> Vec<SortingColumn> {
    (0..4)
        .map(|i| SortingColumn {
            column_idx: i,
            descending: false,
            nulls_first: false,
        })
        .collect()
}

/// The files of a block whose sample rows `samples` gives in order.
fn encode_rows(
    data: &BlockData,
    samples: impl Iterator<Item = Result<RecordBatch>>,
) -> Result<(BlockMeta, Vec<(&'static str, Bytes)>)> {
    let id = uuid::Uuid::now_v7().to_string();
    let mut rollup_widths: Vec<i64> = data
        .rollup_widths_nanos
        .iter()
        .copied()
        .filter(|w| *w > 0)
        .collect();
    rollup_widths.sort_unstable();
    rollup_widths.dedup();
    // The rollup is built as the rows pass, and each batch dropped once
    // written: a compaction's window of rows is never held whole.
    let mut rollup = crate::rollup::Builder::new(&rollup_widths);
    let mut sample_rows = 0u64;
    let mut w = FileWriter::new(samples_schema(), Rows::Sorted)?;
    for b in samples {
        let b = b?;
        sample_rows += b.num_rows() as u64;
        w.write(&b)?;
        rollup.push(&b)?;
    }
    let samples_pq = w.finish()?;

    let rollup_pq = if rollup.is_empty() {
        None
    } else {
        Some(to_parquet(
            rollup_schema(),
            &[rollup.finish()?],
            Rows::Sorted,
        )?)
    };

    let mut profiles = data.profiles.clone();
    profiles.sort_by_key(|p| (p.series_id, p.time_nanos, p.profile_id));
    let profiles_batch = RecordBatch::try_new(
        profiles_schema(),
        vec![
            ids(profiles.iter().map(|p| &p.profile_id)),
            ids(profiles.iter().map(|p| &p.series_id)),
            Arc::new(Int64Array::from_iter_values(
                profiles.iter().map(|p| p.time_nanos),
            )),
            Arc::new(Int64Array::from_iter_values(
                profiles.iter().map(|p| p.duration_nanos),
            )),
            Arc::new(Int64Array::from_iter_values(
                profiles.iter().map(|p| p.period),
            )),
            Arc::new(UInt64Array::from_iter_values(
                profiles.iter().map(|p| p.samples),
            )),
        ],
    )?;

    let mut series = data.series.clone();
    series.sort_by_key(|s| s.series_id);
    let labels_json: Vec<String> = series
        .iter()
        .map(|s| {
            let m: serde_json::Map<String, serde_json::Value> = s
                .labels
                .iter()
                .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v.to_owned())))
                .collect();
            serde_json::Value::Object(m).to_string()
        })
        .collect();
    let types: Vec<String> = series.iter().map(|s| s.profile_type.to_string()).collect();
    let series_batch = RecordBatch::try_new(
        series_schema(),
        vec![
            ids(series.iter().map(|s| &s.series_id)),
            strings(types.iter().map(String::as_str)),
            strings(
                series
                    .iter()
                    .map(|s| s.labels.get(SERVICE_NAME).unwrap_or("")),
            ),
            strings(labels_json.iter().map(String::as_str)),
            Arc::new(Int64Array::from_iter_values(
                series.iter().map(|s| s.min_time_nanos),
            )),
            Arc::new(Int64Array::from_iter_values(
                series.iter().map(|s| s.max_time_nanos),
            )),
        ],
    )?;

    let sym = &data.symbols;
    // Entries sorted with their ids: no lookup of each id in the table.
    let mut stacks: Vec<_> = sym.stacks.iter().collect();
    stacks.sort_unstable_by_key(|(id, _)| **id);
    let stacks_batch = RecordBatch::try_new(
        stacks_schema(),
        vec![
            ids(stacks.iter().map(|(id, _)| *id)),
            id_lists(stacks.iter().map(|(_, s)| &s.locations))?,
        ],
    )?;

    let mut locations: Vec<_> = sym.locations.iter().collect();
    locations.sort_unstable_by_key(|(id, _)| **id);
    let (loc_ids, locs): (Vec<&Id>, Vec<_>) = locations.into_iter().unzip();
    let mut line_numbers = ListBuilder::new(Int64Builder::new()).with_field(Arc::new(
        arrow::datatypes::Field::new("item", arrow::datatypes::DataType::Int64, false),
    ));
    for l in &locs {
        for line in &l.lines {
            line_numbers.values().append_value(line.line);
        }
        line_numbers.append(true);
    }
    let locations_batch = RecordBatch::try_new(
        locations_schema(),
        vec![
            ids(loc_ids.iter().copied()),
            ids(locs.iter().map(|l| &l.mapping)),
            Arc::new(UInt64Array::from_iter_values(
                locs.iter().map(|l| l.address),
            )),
            id_lists(locs.iter().map(|l| l.lines.iter().map(|x| &x.function)))?,
            Arc::new(line_numbers.finish()),
        ],
    )?;

    let mut functions: Vec<_> = sym.functions.iter().collect();
    functions.sort_unstable_by_key(|(id, _)| **id);
    let (fn_ids, fns): (Vec<&Id>, Vec<_>) = functions.into_iter().unzip();
    let functions_batch = RecordBatch::try_new(
        functions_schema(),
        vec![
            ids(fn_ids.iter().copied()),
            strings(fns.iter().map(|f| f.name.as_str())),
            strings(fns.iter().map(|f| f.system_name.as_str())),
            strings(fns.iter().map(|f| f.filename.as_str())),
            Arc::new(Int64Array::from_iter_values(
                fns.iter().map(|f| f.start_line),
            )),
        ],
    )?;

    let mut mappings: Vec<_> = sym.mappings.iter().collect();
    mappings.sort_unstable_by_key(|(id, _)| **id);
    let (m_ids, ms): (Vec<&Id>, Vec<_>) = mappings.into_iter().unzip();
    let mappings_batch = RecordBatch::try_new(
        mappings_schema(),
        vec![
            ids(m_ids.iter().copied()),
            Arc::new(UInt64Array::from_iter_values(
                ms.iter().map(|m| m.memory_start),
            )),
            Arc::new(UInt64Array::from_iter_values(
                ms.iter().map(|m| m.memory_limit),
            )),
            Arc::new(UInt64Array::from_iter_values(
                ms.iter().map(|m| m.file_offset),
            )),
            strings(ms.iter().map(|m| m.filename.as_str())),
            strings(ms.iter().map(|m| m.build_id.as_str())),
        ],
    )?;

    let mut out = vec![
        (files::SAMPLES, samples_pq),
        (
            files::PROFILES,
            to_parquet(
                profiles_schema(),
                &[profiles_batch],
                Rows::Keyed(columns::PROFILE_ID),
            )?,
        ),
        (
            files::SERIES,
            to_parquet(
                series_schema(),
                &[series_batch],
                Rows::Keyed(columns::SERIES_ID),
            )?,
        ),
        (
            files::STACKS,
            to_parquet(
                stacks_schema(),
                &[stacks_batch],
                Rows::Keyed(columns::STACK_ID),
            )?,
        ),
        (
            files::LOCATIONS,
            to_parquet(
                locations_schema(),
                &[locations_batch],
                Rows::Keyed(columns::LOCATION_ID),
            )?,
        ),
        (
            files::FUNCTIONS,
            to_parquet(
                functions_schema(),
                &[functions_batch],
                Rows::Keyed(columns::FUNCTION_ID),
            )?,
        ),
        (
            files::MAPPINGS,
            to_parquet(
                mappings_schema(),
                &[mappings_batch],
                Rows::Keyed(columns::MAPPING_ID),
            )?,
        ),
    ];
    let sample_bytes = out[0].1.len() as u64;
    if let Some(r) = rollup_pq {
        out.push((files::ROLLUP, r));
    }

    let mut types: Vec<String> = series.iter().map(|s| s.profile_type.to_string()).collect();
    types.sort();
    types.dedup();
    let meta = BlockMeta {
        format_version: FORMAT_VERSION,
        id,
        tenant: data.tenant.clone(),
        min_time_nanos: profiles.iter().map(|p| p.time_nanos).min().unwrap_or(0),
        max_time_nanos: profiles.iter().map(|p| p.time_nanos).max().unwrap_or(0),
        level: data.level,
        source: data.source.clone(),
        compacted_from: data.compacted_from.clone(),
        profile_types: types,
        stats: BlockStats {
            series: series.len() as u64,
            profiles: profiles.len() as u64,
            samples: sample_rows,
            stacks: sym.stacks.len() as u64,
            locations: sym.locations.len() as u64,
            functions: sym.functions.len() as u64,
            mappings: sym.mappings.len() as u64,
            bytes: out.iter().map(|(_, b)| b.len() as u64).sum(),
            sample_bytes,
        },
        rollup_widths_nanos: rollup_widths,
        created_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
    };
    Ok((meta, out))
}

/// Uploads an encoded block: every Parquet file, then `meta.json` last.
pub async fn write_block(
    store: &dyn ObjectStore,
    meta: &BlockMeta,
    files_out: Vec<(&'static str, Bytes)>,
) -> Result<()> {
    for (name, bytes) in files_out {
        store
            .put(
                &block_file(&meta.tenant, &meta.id, name),
                PutPayload::from_bytes(bytes),
            )
            .await?;
    }
    let json = serde_json::to_vec_pretty(meta).map_err(|e| crate::Error::Meta {
        block: meta.id.clone(),
        source: e,
    })?;
    store
        .put(
            &block_file(&meta.tenant, &meta.id, files::META),
            PutPayload::from(json),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass batch holds the rows a row-at-a-time builder makes of
    /// the same runs, in the same order.
    #[test]
    fn samples_batch_matches_the_row_builder() {
        let id = |b: u8| Id([b; 16]);
        let sample = |b: u8, value: i64| Sample {
            stack: id(b),
            value,
        };
        let a = [sample(10, 1), sample(11, -2), sample(12, i64::MAX)];
        let b = [sample(13, 4)];
        let runs = [
            (id(1), 100, id(2), &a[..]),
            (id(3), 200, id(4), &[][..]),
            (id(5), -7, id(6), &b[..]),
        ];
        let mut want = SamplesBuilder::default();
        for (s, t, p, samples) in &runs {
            for x in *samples {
                want.push(s, *t, p, &x.stack, x.value);
            }
        }
        let got = samples_batch(4, runs.iter().map(|(s, t, p, x)| (s, *t, p, *x)));
        assert_eq!(got, want.finish());
        assert_eq!(got.num_rows(), 4);
    }

    /// Rows of (series, time, profile, stack) bytes as given, value 1.
    fn rows(keys: &[(u8, i64, u8, u8)]) -> RecordBatch {
        let mut b = SamplesBuilder::default();
        for &(s, t, p, st) in keys {
            b.push(&Id([s; 16]), t, &Id([p; 16]), &Id([st; 16]), 1);
        }
        b.finish()
    }

    fn block_of(samples: Vec<RecordBatch>) -> BlockData {
        BlockData {
            tenant: "t".into(),
            source: "test".into(),
            level: 0,
            compacted_from: Vec::new(),
            series: Vec::new(),
            profiles: Vec::new(),
            samples,
            symbols: Default::default(),
            rollup_widths_nanos: vec![crate::HOUR_NANOS],
        }
    }

    /// The samples and rollup files of `data`, each read back as one batch.
    fn stored_samples(data: &BlockData) -> (RecordBatch, RecordBatch) {
        let (meta, files) = encode_block(data).unwrap();
        let read = |name: &str, schema: SchemaRef| {
            let (_, bytes) = files.iter().find(|(n, _)| *n == name).unwrap();
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                bytes.clone(),
            )
            .unwrap()
            .build()
            .unwrap();
            let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
            arrow::compute::concat_batches(&schema, &batches).unwrap()
        };
        let samples = read(files::SAMPLES, samples_schema());
        assert_eq!(meta.stats.samples, samples.num_rows() as u64);
        (samples, read(files::ROLLUP, rollup_schema()))
    }

    /// Each key column decides the order only where the ones before it
    /// tie, across batch boundaries too.
    #[test]
    fn sorted_samples_are_recognized_by_every_key() {
        let sorted = [
            (1, 5, 9, 9),
            (2, -3, 9, 9),
            (2, 7, 1, 9),
            (2, 7, 2, 1),
            (2, 7, 2, 3),
            (2, 7, 2, 3),
        ];
        assert!(samples_sorted(&[rows(&sorted)]));
        assert!(samples_sorted(&[rows(&sorted[..3]), rows(&sorted[3..])]));
        assert!(samples_sorted(&[]));
        for i in 0..sorted.len() - 1 {
            if sorted[i] == sorted[i + 1] {
                continue;
            }
            let mut swapped = sorted;
            swapped.swap(i, i + 1);
            assert!(
                !samples_sorted(&[rows(&swapped)]),
                "rows {i} and {} swapped",
                i + 1
            );
            assert!(
                !samples_sorted(&[rows(&swapped[..=i]), rows(&swapped[i + 1..])]),
                "rows {i} and {} swapped, across batches",
                i + 1
            );
        }
    }

    /// A block of rows already in order stores the same rows, in the same
    /// order, as a block of the same rows shuffled (which is sorted), and
    /// its rollup too.
    #[test]
    fn sorted_batches_are_stored_as_a_sort_would_store_them() {
        // 4 series x 2 times x 2 profiles x 3 stacks (the second time an
        // hour later: a rollup bucket of its own), in order.
        let mut keys = Vec::new();
        for series in 0..4u8 {
            for time in [0, crate::HOUR_NANOS] {
                for profile in 0..2u8 {
                    for stack in 0..3u8 {
                        keys.push((series, time, profile, stack));
                    }
                }
            }
        }
        let in_order = vec![rows(&keys[..17]), rows(&keys[17..])];
        assert!(samples_sorted(&in_order));
        let mut shuffled = keys.clone();
        shuffled.reverse();
        shuffled.swap(3, 30);
        let shuffled = vec![rows(&shuffled[..9]), rows(&shuffled[9..])];
        assert!(!samples_sorted(&shuffled));
        let (a, a_rollup) = stored_samples(&block_of(in_order));
        let (b, b_rollup) = stored_samples(&block_of(shuffled));
        assert_eq!(a.num_rows(), 48);
        assert!(samples_sorted(std::slice::from_ref(&a)));
        assert_eq!(a, b);
        assert_eq!(a, rows(&keys));
        assert!(a_rollup.num_rows() > 0);
        assert_eq!(a_rollup, b_rollup);
        // Given a batch at a time as sorted: the same files' rows; out of
        // order, refused.
        let data = block_of(Vec::new());
        let (meta, _) = encode_sorted_block(&data, [rows(&keys[..5]), rows(&keys[5..])]).unwrap();
        assert_eq!(meta.stats.samples, 48);
        let r = encode_sorted_block(&data, [rows(&keys[5..]), rows(&keys[..5])]);
        assert!(
            matches!(r, Err(Error::Unsorted)),
            "{:?}",
            r.map(|(m, _)| m.id)
        );
    }

    /// Samples whose stack ids repeat in runs of 1 to 20 rows (a run of
    /// 8 or more is written as one value, the rest bit-packed, runs
    /// falling at every offset of a group of 8) and are mostly distinct
    /// (more than 2^16 ids: indexes of 17 bits), in batches that do not
    /// end where a row group does.
    fn id_runs(rows: usize) -> Vec<RecordBatch> {
        let mut b = SamplesBuilder::with_capacity(rows);
        let mut k = 0u32;
        while b.len() < rows {
            let mut stack = [0u8; 16];
            stack[..4].copy_from_slice(&k.to_le_bytes());
            for _ in 0..=(k % 20).min((rows - b.len() - 1) as u32) {
                let series = Id([(b.len() / 40_000) as u8; 16]);
                b.push(
                    &series,
                    7,
                    &Id([(k / 100) as u8; 16]),
                    &Id(stack),
                    i64::from(k),
                );
            }
            k += 1;
        }
        let all = b.finish();
        (0..rows)
            .step_by(7_001)
            .map(|at| all.slice(at, 7_001.min(rows - at)))
            .collect()
    }

    fn read_all(bytes: &Bytes, schema: SchemaRef) -> RecordBatch {
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
                .unwrap()
                .build()
                .unwrap();
        let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        arrow::compute::concat_batches(&schema, &batches).unwrap()
    }

    /// `batch` as a file of `rows`, which reads back as `batch`.
    fn written(batch: &RecordBatch, rows: Rows) -> Bytes {
        let bytes = to_parquet(batch.schema(), std::slice::from_ref(batch), rows).unwrap();
        assert_eq!(&read_all(&bytes, batch.schema()), batch);
        bytes
    }

    /// Rows `from..from + n` of the file `b` reads, selected: a reader
    /// with the page index skips the pages before them.
    fn selected(
        b: parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder<Bytes>,
        schema: SchemaRef,
        from: usize,
        n: usize,
    ) -> RecordBatch {
        use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
        let selection = RowSelection::from(vec![RowSelector::skip(from), RowSelector::select(n)]);
        let picked: Vec<RecordBatch> = b
            .with_row_selection(selection)
            .build()
            .unwrap()
            .map(|b| b.unwrap())
            .collect();
        arrow::compute::concat_batches(&schema, &picked).unwrap()
    }

    /// Ids encoded by [`IdChunk`] read back as they were written and as
    /// parquet-rs's own writer stores them, across row groups and pages,
    /// dictionary-encoded, with an offset index that a reader selecting
    /// rows by page follows; the other columns keep their statistics.
    #[test]
    fn id_chunks_read_back_as_parquet_rs_writes_them() {
        use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
        let rows = 130_003;
        let batches = id_runs(rows);
        let mut w = FileWriter::new(samples_schema(), Rows::Sorted).unwrap();
        w.group_rows = 50_000;
        for b in &batches {
            w.write(b).unwrap();
        }
        let ours = w.finish().unwrap();
        let props = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_dictionary_page_size_limit(64 << 20)
            .set_max_row_group_row_count(Some(50_000))
            .build();
        let mut theirs = ArrowWriter::try_new(Vec::new(), samples_schema(), Some(props)).unwrap();
        for b in &batches {
            theirs.write(b).unwrap();
        }
        let theirs = Bytes::from(theirs.into_inner().unwrap());

        let want = arrow::compute::concat_batches(&samples_schema(), &batches).unwrap();
        assert_eq!(read_all(&ours, samples_schema()), want);
        assert_eq!(read_all(&theirs, samples_schema()), want);

        let opts = ArrowReaderOptions::new()
            .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Required);
        let b = ParquetRecordBatchReaderBuilder::try_new_with_options(ours.clone(), opts).unwrap();
        let meta = b.metadata().clone();
        assert_eq!(meta.num_row_groups(), 3);
        let offsets = meta.offset_index().expect("an offset index");
        for (g, rg) in meta.row_groups().iter().enumerate() {
            let stack = rg.column(3);
            assert!(stack.dictionary_page_offset().is_some(), "row group {g}");
            assert!(stack.statistics().is_none(), "row group {g}");
            let encodings: Vec<_> = stack.encodings().collect();
            assert!(
                encodings.contains(&Encoding::RLE_DICTIONARY),
                "{encodings:?}"
            );
            assert!(
                rg.column(0).statistics().is_some(),
                "series ids keep theirs"
            );
            let pages = offsets[g][3].page_locations();
            assert_eq!(pages.len(), (rg.num_rows() as usize).div_ceil(PAGE_ROWS));
            assert_eq!(pages[1].first_row_index, PAGE_ROWS as i64);
        }
        // The leading ids keep the statistics parquet-rs keeps: the
        // chunk's as its writer makes them, a page's from the page's rows.
        let theirs_meta = ParquetRecordBatchReaderBuilder::try_new(theirs.clone())
            .unwrap()
            .metadata()
            .clone();
        let indexes = meta.column_index().expect("a column index");
        let mut first = 0;
        for (g, rg) in meta.row_groups().iter().enumerate() {
            for c in [0, 2] {
                assert_eq!(
                    rg.column(c).statistics(),
                    theirs_meta.row_group(g).column(c).statistics(),
                    "row group {g}, column {c}"
                );
                let parquet::file::page_index::column_index::ColumnIndexMetaData::FIXED_LEN_BYTE_ARRAY(
                    index,
                ) = &indexes[g][c]
                else {
                    panic!("row group {g}, column {c}: {:?}", indexes[g][c]);
                };
                let pages = offsets[g][c].page_locations();
                assert_eq!(index.num_pages(), pages.len() as u64);
                for (p, page) in pages.iter().enumerate() {
                    let from = first + page.first_row_index as usize;
                    let to = pages
                        .get(p + 1)
                        .map_or(first + rg.num_rows() as usize, |n| {
                            first + n.first_row_index as usize
                        });
                    let col = want.column(c).as_fixed_size_binary();
                    let ids: Vec<&[u8]> = (from..to).map(|i| col.value(i)).collect();
                    assert_eq!(index.min_value(p), ids.iter().min().copied());
                    assert_eq!(index.max_value(p), ids.iter().max().copied());
                }
            }
            first += rg.num_rows() as usize;
        }
        assert_eq!(
            indexes[0][0].get_boundary_order(),
            Some(parquet::basic::BoundaryOrder::ASCENDING)
        );
        // Rows from the middle of the second row group's third page on:
        // the reader skips pages by the offset index.
        let from = 50_000 + 2 * PAGE_ROWS + 17;
        assert_eq!(
            selected(b, samples_schema(), from, 1_000),
            want.slice(from, 1_000)
        );
    }

    /// A chunk of one distinct id (indexes of 0 bits) and a keyed file's
    /// other id columns read back as written.
    #[test]
    fn a_single_id_and_keyed_files_read_back() {
        let same = rows(&[(1, 5, 2, 9); 30]);
        let mut w = FileWriter::new(samples_schema(), Rows::Sorted).unwrap();
        w.write(&same).unwrap();
        assert_eq!(read_all(&w.finish().unwrap(), samples_schema()), same);

        let profiles = RecordBatch::try_new(
            profiles_schema(),
            vec![
                ids([Id([1; 16]), Id([2; 16]), Id([3; 16])].iter()),
                ids([Id([9; 16]), Id([9; 16]), Id([8; 16])].iter()),
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(Int64Array::from(vec![4, 5, 6])),
                Arc::new(Int64Array::from(vec![7, 8, 9])),
                Arc::new(UInt64Array::from(vec![10, 11, 12])),
            ],
        )
        .unwrap();
        let bytes = written(&profiles, Rows::Keyed(columns::PROFILE_ID));
        // The key column PLAIN, with the statistics parquet-rs keeps.
        let mut theirs = ArrowWriter::try_new(
            Vec::new(),
            profiles_schema(),
            Some(props(Rows::Keyed(columns::PROFILE_ID))),
        )
        .unwrap();
        theirs.write(&profiles).unwrap();
        let theirs = Bytes::from(theirs.into_inner().unwrap());
        let meta = |b: &Bytes| {
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(b.clone())
                .unwrap()
                .metadata()
                .clone()
        };
        let (ours, theirs) = (meta(&bytes), meta(&theirs));
        let key = ours.row_group(0).column(0);
        assert_eq!(key.dictionary_page_offset(), None);
        assert_eq!(key.statistics(), theirs.row_group(0).column(0).statistics());
        let encodings: Vec<_> = key.encodings().collect();
        assert!(
            !encodings.contains(&Encoding::RLE_DICTIONARY),
            "{encodings:?}"
        );
        assert!(ours.row_group(0).column(1).statistics().is_none());
    }

    /// A chunk of lists that are all empty (locations none of which is
    /// symbolized) reads back as empty lists.
    #[test]
    fn a_chunk_of_empty_lists_reads_back() {
        let none: Vec<Vec<Id>> = vec![Vec::new(); 5];
        let stacks = RecordBatch::try_new(
            stacks_schema(),
            vec![
                ids((0..5u8).map(|b| Id([b; 16])).collect::<Vec<_>>().iter()),
                id_lists(none.iter()).unwrap(),
            ],
        )
        .unwrap();
        written(&stacks, Rows::Keyed(columns::STACK_ID));
    }

    /// Lists of ids encoded by [`IdChunk`] (empty ones, short ones, one
    /// longer than a page's ids) read back as written, across pages cut
    /// by rows and by ids, with an offset index a reader follows.
    #[test]
    fn id_lists_read_back_as_written() {
        use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
        let rows = 60_000u32;
        let id = |k: u32| {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&(k % 70_001).to_le_bytes());
            Id(b)
        };
        let lists: Vec<Vec<Id>> = (0..rows)
            .map(|r| {
                let n = if r == 30_000 {
                    (1 << 19) + 5
                } else {
                    r * 7 % 41
                };
                // Runs of one id now and then (a location repeated).
                (0..n).map(|i| id(r * 13 + i - i % (r % 3 + 1))).collect()
            })
            .collect();
        let stacks = RecordBatch::try_new(
            stacks_schema(),
            vec![
                ids((0..rows).map(id).collect::<Vec<_>>().iter()),
                id_lists(lists.iter()).unwrap(),
            ],
        )
        .unwrap();
        let bytes = to_parquet(
            stacks_schema(),
            &[stacks.slice(0, 25_000), stacks.slice(25_000, 35_000)],
            Rows::Keyed(columns::STACK_ID),
        )
        .unwrap();
        assert_eq!(read_all(&bytes, stacks_schema()), stacks);

        let opts = ArrowReaderOptions::new()
            .with_page_index_policy(parquet::file::metadata::PageIndexPolicy::Required);
        let b = ParquetRecordBatchReaderBuilder::try_new_with_options(bytes, opts).unwrap();
        let meta = b.metadata().clone();
        let chunk = meta.row_group(0).column(1);
        assert!(chunk.dictionary_page_offset().is_some());
        let pages = meta.offset_index().expect("an offset index")[0][1].page_locations();
        assert!(pages.len() > 4, "{} pages", pages.len());
        for w in pages.windows(2) {
            assert!(w[0].first_row_index < w[1].first_row_index);
        }
        let from = pages[pages.len() - 2].first_row_index as usize + 11;
        assert_eq!(
            selected(b, stacks_schema(), from, 500),
            stacks.slice(from, 500)
        );
    }

    /// Every id column of every block file, and of lists of them, is
    /// written by [`IdChunk`], as its file's settings have it: the sorted
    /// files' ids dictionary-encoded with statistics but the stack's, a
    /// keyed file's key PLAIN with statistics, its other ids
    /// dictionary-encoded without.
    #[test]
    fn every_id_column_is_written_by_id_chunks() {
        let files = [
            (samples_schema(), Rows::Sorted),
            (rollup_schema(), Rows::Sorted),
            (profiles_schema(), Rows::Keyed(columns::PROFILE_ID)),
            (series_schema(), Rows::Keyed(columns::SERIES_ID)),
            (stacks_schema(), Rows::Keyed(columns::STACK_ID)),
            (locations_schema(), Rows::Keyed(columns::LOCATION_ID)),
            (functions_schema(), Rows::Keyed(columns::FUNCTION_ID)),
            (mappings_schema(), Rows::Keyed(columns::MAPPING_ID)),
        ];
        let mut ids = 0;
        for (schema, rows) in files {
            let parquet = parquet::arrow::ArrowSchemaConverter::new()
                .convert(&schema)
                .unwrap();
            let props = props(rows);
            for column in parquet.columns() {
                let name = &column.path().parts()[0];
                let is_id = column.physical_type() == parquet::basic::Type::FIXED_LEN_BYTE_ARRAY;
                let got = Layout::of(&props, column).map(|l| (l.dictionary, l.statistics));
                let want = match rows {
                    Rows::Sorted => (true, name != columns::STACK_ID),
                    Rows::Keyed(key) => (name != key, name == key),
                };
                assert_eq!(got, is_id.then_some(want), "{}", column.path());
                ids += usize::from(is_id);
            }
        }
        assert_eq!(ids, 15);
    }
}
