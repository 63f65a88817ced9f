//! A block file's columns of 16-byte ids, and of lists of them (a
//! sample's series, profile and stack, a stack's locations, a keyed
//! file's key, ...), encoded here instead of by parquet-rs's generic
//! column writer.
//!
//! A reader sees what parquet-rs writes for such a column with the
//! block's writer settings: a dictionary page of the distinct ids
//! (PLAIN, in the order they first come), then data pages of version 2
//! holding each row's index into it (`RLE_DICTIONARY`: a bit width, then
//! runs of repeats and bit-packed groups), or the ids themselves for a
//! PLAIN key column; a list's repetition and definition levels; zstd;
//! minimum and maximum for the chunk and each page where the settings
//! keep statistics; an offset index. What differs is the cost a value:
//! parquet-rs makes every fixed-length value a reference-counted `Bytes`
//! of its own and interns it through a generic table, which was about
//! half of an ingester's head cut (docs/benchmarks.md, "Issue 13,
//! thirty-sixth session"); here a value is one lookup of 16 bytes in a
//! map of [`Id`]s.

use arrow::array::{Array, AsArray, FixedSizeBinaryArray, ListArray};
use bytes::Bytes;
use fathom_model::{Id, IdMap};
use parquet::basic::BoundaryOrder;
use parquet::basic::{Compression, Encoding, PageType, ZstdLevel};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, ColumnIndexBuilder, PageEncodingStats};
use parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

/// Rows a data page, parquet-rs's default page row limit (which the
/// other columns of a file keep).
pub(crate) const PAGE_ROWS: usize = 20_000;

/// Ids a data page of a list column holds at most (about 1 MiB of
/// indexes, parquet-rs's default page size), so that a page of long
/// lists stays small enough to skip.
const PAGE_VALUES: usize = 1 << 19;

/// Values a bit-packed run holds at most: 63 groups of 8, so that its
/// header is one byte, as every writer makes it.
const PACKED_RUN: usize = 63 * 8;

/// A repeat this long is written as a run of one value.
const MIN_REPEAT: usize = 8;

type Result<T> = std::result::Result<T, ParquetError>;

/// Whether [`IdChunk`] can encode column `descr`: 16-byte ids, not
/// null, alone (no levels) or as the items of a list that is not null
/// (repetition and definition levels of at most 1).
fn encodes(descr: &ColumnDescPtr) -> bool {
    descr.physical_type() == parquet::basic::Type::FIXED_LEN_BYTE_ARRAY
        && descr.type_length() == 16
        && matches!(
            (descr.max_def_level(), descr.max_rep_level()),
            (0, 0) | (1, 1)
        )
}

/// How [`IdChunk`] lays a column out: what the file's writer settings
/// ask of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Dictionary-encoded (`RLE_DICTIONARY` indexes), or PLAIN (each id
    /// whole: a file's key column, whose ids never repeat).
    pub dictionary: bool,
    /// Minimum and maximum kept for the chunk and for each page (the
    /// column index), where a reader can skip by them.
    pub statistics: bool,
}

impl Layout {
    /// The layout `props` ask of column `descr`, if [`IdChunk`] writes
    /// it as parquet-rs would: a column that is dictionary-encoded or
    /// PLAIN, with statistics for each page or none. `None` for anything
    /// else, which parquet-rs writes itself.
    pub(crate) fn of(props: &WriterProperties, descr: &ColumnDescPtr) -> Option<Layout> {
        let path = descr.path();
        let dictionary = props.dictionary_enabled(path);
        let statistics = match props.statistics_enabled(path) {
            EnabledStatistics::None => false,
            EnabledStatistics::Page => true,
            EnabledStatistics::Chunk => return None,
        };
        (encodes(descr) && (dictionary || props.encoding(path) == Some(Encoding::PLAIN))).then_some(
            Layout {
                dictionary,
                statistics,
            },
        )
    }
}

/// One row group's chunk of a `FIXED_LEN_BYTE_ARRAY(16)` column (or of
/// the items of a list column of them, [`encodes`]), without nulls: ids
/// are taken as they come and encoded by [`IdChunk::finish`].
pub(crate) struct IdChunk {
    descr: ColumnDescPtr,
    level: i32,
    layout: Layout,
    /// The dictionary index of each id seen (dictionary-encoded only).
    index: IdMap<u32>,
    /// The distinct ids, 16 bytes each, in the order they came; every
    /// id, for a PLAIN column.
    ids: Vec<u8>,
    /// Each id's dictionary index, row after row (dictionary-encoded
    /// only).
    keys: Vec<u32>,
    /// For a list column, the ids of each row.
    lens: Option<Vec<u32>>,
}

impl IdChunk {
    /// An empty chunk of column `descr` ([`encodes`]), compressed with
    /// zstd at `level`.
    pub(crate) fn new(descr: ColumnDescPtr, level: i32, layout: Layout) -> Self {
        let lens = (descr.max_rep_level() > 0).then(Vec::new);
        IdChunk {
            descr,
            level,
            layout,
            index: IdMap::default(),
            ids: Vec::new(),
            keys: Vec::new(),
            lens,
        }
    }

    /// Appends the rows of `a`: an array of 16-byte ids, or of lists of
    /// them, as the column is; without nulls. Nothing is appended from
    /// an array of another type.
    pub(crate) fn push_array(&mut self, a: &dyn Array) -> Result<()> {
        let wrong = || {
            ParquetError::General(format!(
                "column {}: an array of {} where {} are written",
                self.descr.path(),
                a.data_type(),
                if self.lens.is_some() {
                    "lists of ids"
                } else {
                    "ids"
                }
            ))
        };
        match &self.lens {
            None => self.push(a.as_fixed_size_binary_opt().ok_or_else(wrong)?),
            Some(_) => {
                let list = a.as_list_opt::<i32>().ok_or_else(wrong)?;
                self.push_lists(list)
            }
        }
    }

    fn push_lists(&mut self, list: &ListArray) -> Result<()> {
        if list.null_count() > 0 {
            return Err(ParquetError::General(format!(
                "column {}: {} null lists",
                self.descr.path(),
                list.null_count()
            )));
        }
        let offsets = list.value_offsets();
        let (Some(first), Some(last)) = (offsets.first(), offsets.last()) else {
            return Ok(());
        };
        let items = list
            .values()
            .as_fixed_size_binary_opt()
            .ok_or_else(|| ParquetError::General("list items are not ids".into()))?;
        // Offsets of a valid list array never decrease and stay within
        // its values.
        let (first, last) = (*first as usize, *last as usize);
        self.push(&items.slice(first, last - first))?;
        if let Some(lens) = &mut self.lens {
            lens.extend(offsets.windows(2).map(|w| (w[1] - w[0]) as u32));
        }
        Ok(())
    }

    /// Appends every id of `a`, which must be 16 bytes wide and hold no
    /// null; nothing is appended otherwise.
    fn push(&mut self, a: &FixedSizeBinaryArray) -> Result<()> {
        let ids = crate::id_values(a).ok_or_else(|| {
            ParquetError::General(format!(
                "column {}: ids must be 16 bytes and not null (got {} bytes, {} nulls)",
                self.descr.path(),
                a.value_size(),
                a.null_count()
            ))
        })?;
        if !self.layout.dictionary {
            self.ids.extend_from_slice(ids.as_flattened());
            return Ok(());
        }
        self.keys.reserve(ids.len());
        // The last id and its index: a run of one id (a sample's series
        // and profile come in runs) is looked up once.
        let mut last: Option<(Id, u32)> = None;
        for &id in ids {
            let id = Id(id);
            if let Some((_, key)) = last.filter(|(l, _)| *l == id) {
                self.keys.push(key);
                continue;
            }
            let next = self.index.len();
            let key = match self.index.entry(id) {
                std::collections::hash_map::Entry::Occupied(e) => *e.get(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let key = u32::try_from(next).map_err(|_| {
                        ParquetError::General("more than 2^32 distinct ids in a chunk".into())
                    })?;
                    self.ids.extend_from_slice(&id.0);
                    *e.insert(key)
                }
            };
            last = Some((id, key));
            self.keys.push(key);
        }
        Ok(())
    }

    /// The chunk's ids, row after row.
    fn id_count(&self) -> usize {
        if self.layout.dictionary {
            self.keys.len()
        } else {
            self.ids.len() / 16
        }
    }

    /// The least and greatest of ids `from..to` (bytes compared as
    /// unsigned, Parquet's order for fixed-length bytes: as big-endian
    /// numbers).
    fn min_max(&self, from: usize, to: usize) -> Option<([u8; 16], [u8; 16])> {
        let number = |at: usize| {
            let id = self.ids.get(at..at + 16).unwrap_or_default();
            u128::from_be_bytes(id.try_into().unwrap_or_default())
        };
        let (lo, hi) = if self.layout.dictionary {
            // A run of one index is one id.
            let keys = self.keys.get(from..to)?;
            let first = number(*keys.first()? as usize * 16);
            let mut last = keys[0];
            keys.iter().fold((first, first), |(lo, hi), &k| {
                if k == last {
                    return (lo, hi);
                }
                last = k;
                let id = number(k as usize * 16);
                (lo.min(id), hi.max(id))
            })
        } else {
            let mut ids = (from..to).map(|i| number(i * 16));
            let first = ids.next()?;
            ids.fold((first, first), |(lo, hi), id| (lo.min(id), hi.max(id)))
        };
        Some((lo.to_be_bytes(), hi.to_be_bytes()))
    }

    /// The chunk's bytes (its pages, as they go in the file, from offset
    /// 0) and what a row group needs to append them
    /// (`SerializedRowGroupWriter::append_column`). Fails on a chunk
    /// without rows.
    pub(crate) fn finish(self) -> Result<(Bytes, ColumnCloseResult)> {
        if self.rows() == 0 {
            return Err(ParquetError::General(format!(
                "column {}: a chunk without rows",
                self.descr.path()
            )));
        }
        let too_large = |what: &str| ParquetError::General(format!("{what} too large"));
        let count = |n: usize| u32::try_from(n).map_err(|_| too_large("page"));
        // A chunk of lists that are all empty has no id to index: its
        // pages are PLAIN, with no values.
        let dictionary = self.layout.dictionary && !self.keys.is_empty();
        let data_encoding = if dictionary {
            Encoding::RLE_DICTIONARY
        } else {
            Encoding::PLAIN
        };
        let entries = self.ids.len() / 16;
        // The width of the largest index; 0 for a single entry.
        let width = u32::BITS - (entries.saturating_sub(1) as u32).leading_zeros();
        let mut zstd = zstd::bulk::Compressor::new(self.level)?;
        let mut sink = TrackedWrite::new(Vec::new());
        let mut pages = SerializedPageWriter::new(&mut sink);
        let mut compressed = 0u64;
        let mut uncompressed = 0u64;

        let mut dictionary_offset = None;
        if dictionary {
            let spec = pages.write_page(CompressedPage::new(
                Page::DictionaryPage {
                    buf: Bytes::from(zstd.compress(&self.ids)?),
                    num_values: u32::try_from(entries).map_err(|_| too_large("dictionary"))?,
                    encoding: Encoding::PLAIN,
                    is_sorted: false,
                },
                self.ids.len(),
            ))?;
            compressed += spec.compressed_size as u64;
            uncompressed += spec.uncompressed_size as u64;
            dictionary_offset = Some(spec.offset as i64);
        }

        let mut locations = Vec::new();
        let mut column_index = self
            .layout
            .statistics
            .then(|| ColumnIndexBuilder::new(parquet::basic::Type::FIXED_LEN_BYTE_ARRAY));
        let (mut ascending, mut descending) = (true, true);
        let mut last: Option<([u8; 16], [u8; 16])> = None;
        // The chunk's least and greatest id: the pages'.
        let mut bounds: Option<([u8; 16], [u8; 16])> = None;
        let mut raw = Vec::new();
        let mut levels = Vec::new();
        let (mut row, mut at) = (0, 0);
        for page in self.pages() {
            raw.clear();
            if dictionary {
                raw.push(width as u8);
                encode_keys(&self.keys[at..at + page.ids], width, &mut raw);
            } else {
                raw.extend_from_slice(&self.ids[at * 16..(at + page.ids) * 16]);
            }
            let values = Bytes::from(zstd.compress(&raw)?);
            // Levels (a list column's): each row's first id at
            // repetition 0 and the others at 1; an id at definition 1,
            // an empty list a 0 at both.
            let (buf, rep, def, entries) = match &self.lens {
                None => (values, 0, 0, page.ids),
                Some(lens) => {
                    let lens = &lens[row..row + page.rows];
                    levels.clear();
                    for &n in lens {
                        levels.push(0);
                        levels.extend(std::iter::repeat_n(1, (n as usize).saturating_sub(1)));
                    }
                    let entries = levels.len();
                    let mut buf = Vec::with_capacity(values.len() + entries / 4);
                    encode_keys(&levels, 1, &mut buf);
                    let rep = buf.len();
                    levels.clear();
                    for &n in lens {
                        levels.extend(std::iter::repeat_n(u32::from(n > 0), (n as usize).max(1)));
                    }
                    encode_keys(&levels, 1, &mut buf);
                    let def = buf.len() - rep;
                    buf.extend_from_slice(&values);
                    (Bytes::from(buf), rep, def, entries)
                }
            };
            if let Some(index) = &mut column_index {
                match self.min_max(at, at + page.ids) {
                    Some((lo, hi)) => {
                        if let Some((last_lo, last_hi)) = last {
                            ascending &= last_lo <= lo && last_hi <= hi;
                            descending &= last_lo >= lo && last_hi >= hi;
                        }
                        last = Some((lo, hi));
                        bounds = Some(bounds.map_or((lo, hi), |(l, h)| (l.min(lo), h.max(hi))));
                        index.append(false, lo.to_vec(), hi.to_vec(), 0);
                    }
                    None => index.append(true, Vec::new(), Vec::new(), count(entries)?.into()),
                }
            }
            let spec = pages.write_page(CompressedPage::new(
                Page::DataPageV2 {
                    num_values: count(entries)?,
                    encoding: data_encoding,
                    num_nulls: count(entries - page.ids)?,
                    num_rows: count(page.rows)?,
                    def_levels_byte_len: count(def)?,
                    rep_levels_byte_len: count(rep)?,
                    is_compressed: true,
                    statistics: None,
                    buf,
                },
                rep + def + raw.len(),
            ))?;
            compressed += spec.compressed_size as u64;
            uncompressed += spec.uncompressed_size as u64;
            locations.push(PageLocation {
                offset: spec.offset as i64,
                compressed_page_size: i32::try_from(spec.compressed_size)
                    .map_err(|_| too_large("page"))?,
                first_row_index: row as i64,
            });
            row += page.rows;
            at += page.ids;
        }
        pages.close()?;
        let bytes = Bytes::from(sink.into_inner()?);
        debug_assert_eq!(bytes.len() as u64, compressed);

        let data_pages = i32::try_from(locations.len()).map_err(|_| too_large("chunk"))?;
        // Level entries: an empty list counts one.
        let values = self.lens.as_ref().map_or(self.id_count(), |lens| {
            lens.iter().map(|&n| (n as usize).max(1)).sum()
        });
        let mut encodings = vec![Encoding::PLAIN, Encoding::RLE];
        let mut encoding_stats = Vec::new();
        if dictionary {
            encodings.push(Encoding::RLE_DICTIONARY);
            encoding_stats.push(PageEncodingStats {
                page_type: PageType::DICTIONARY_PAGE,
                encoding: Encoding::PLAIN,
                count: 1,
            });
        }
        encoding_stats.push(PageEncodingStats {
            page_type: PageType::DATA_PAGE_V2,
            encoding: data_encoding,
            count: data_pages,
        });
        let mut metadata = ColumnChunkMetaData::builder(self.descr.clone())
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(self.level)?))
            .set_encodings(encodings)
            .set_page_encoding_stats(encoding_stats)
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size(uncompressed as i64)
            .set_num_values(values as i64)
            .set_dictionary_page_offset(dictionary_offset)
            .set_data_page_offset(locations.first().map_or(0, |l| l.offset));
        if self.layout.statistics {
            let (lo, hi) = match bounds {
                Some((lo, hi)) => (Some(lo.to_vec().into()), Some(hi.to_vec().into())),
                None => (None, None),
            };
            metadata = metadata.set_statistics(Statistics::fixed_len_byte_array(
                lo,
                hi,
                None,
                Some((values - self.id_count()) as u64),
                false,
            ));
        }
        let column_index = match column_index {
            Some(mut index) => {
                index.set_boundary_order(match (ascending, descending) {
                    (true, _) => BoundaryOrder::ASCENDING,
                    (false, true) => BoundaryOrder::DESCENDING,
                    (false, false) => BoundaryOrder::UNORDERED,
                });
                Some(index.build()?)
            }
            None => None,
        };
        Ok((
            bytes,
            ColumnCloseResult {
                bytes_written: compressed,
                rows_written: self.rows() as u64,
                metadata: metadata.build()?,
                bloom_filter: None,
                column_index,
                offset_index: Some(OffsetIndexMetaData {
                    page_locations: locations,
                    unencoded_byte_array_data_bytes: None,
                }),
            },
        ))
    }
}

/// The rows and ids of a data page.
struct PageSpan {
    rows: usize,
    ids: usize,
}

impl IdChunk {
    fn rows(&self) -> usize {
        self.lens.as_ref().map_or(self.id_count(), Vec::len)
    }

    /// The chunk's data pages: [`PAGE_ROWS`] rows each, and for a list
    /// column no more rows than make [`PAGE_VALUES`] ids (a row more than
    /// that alone).
    fn pages(&self) -> Vec<PageSpan> {
        let Some(lens) = &self.lens else {
            let n = self.id_count();
            return (0..n)
                .step_by(PAGE_ROWS)
                .map(|from| {
                    let rows = PAGE_ROWS.min(n - from);
                    PageSpan { rows, ids: rows }
                })
                .collect();
        };
        let mut out = Vec::new();
        let mut page = PageSpan { rows: 0, ids: 0 };
        for &n in lens {
            let n = n as usize;
            if page.rows > 0 && (page.rows == PAGE_ROWS || page.ids + n > PAGE_VALUES) {
                out.push(std::mem::replace(&mut page, PageSpan { rows: 0, ids: 0 }));
            }
            page.rows += 1;
            page.ids += n;
        }
        if page.rows > 0 {
            out.push(page);
        }
        out
    }
}

/// Appends `keys` as Parquet's RLE / bit-packing hybrid of `width` bits a
/// value (no length prefix): a repeat of [`MIN_REPEAT`] or more as a run
/// of one value, everything else bit-packed in groups of 8. Bit-packed
/// values before a repeat are made a whole number of groups by taking
/// the repeat's first values into them; the last group is padded with
/// zeros (a reader takes the page's value count).
fn encode_keys(keys: &[u32], width: u32, out: &mut Vec<u8>) {
    let value_bytes = (width as usize).div_ceil(8);
    let mut literal = 0;
    let mut i = 0;
    while i < keys.len() {
        let v = keys[i];
        let end = keys[i..]
            .iter()
            .position(|k| *k != v)
            .map_or(keys.len(), |n| i + n);
        let pad = (MIN_REPEAT - (i - literal) % MIN_REPEAT) % MIN_REPEAT;
        if end - i >= pad + MIN_REPEAT {
            bit_pack(&keys[literal..i + pad], width, out);
            uleb128(((end - i - pad) as u64) << 1, out);
            out.extend_from_slice(&v.to_le_bytes()[..value_bytes]);
            literal = end;
        }
        i = end;
    }
    bit_pack(&keys[literal..], width, out);
}

/// Bit-packed runs of `keys`, LSB first; the last group padded with zeros.
fn bit_pack(keys: &[u32], width: u32, out: &mut Vec<u8>) {
    for run in keys.chunks(PACKED_RUN) {
        let groups = run.len().div_ceil(8);
        // At most 63 groups: one byte.
        out.push(((groups << 1) | 1) as u8);
        for group in run.chunks(8) {
            let mut padded = [0u32; 8];
            padded[..group.len()].copy_from_slice(group);
            // Eight values of `width` bits: whole bytes. At most 64 bits
            // are held at once before the next value's 32.
            let mut acc = 0u128;
            let mut bits = 0;
            for v in padded {
                acc |= u128::from(v) << bits;
                bits += width;
                if bits >= 64 {
                    out.extend_from_slice(&(acc as u64).to_le_bytes());
                    acc >>= 64;
                    bits -= 64;
                }
            }
            out.extend_from_slice(&acc.to_le_bytes()[..(bits / 8) as usize]);
        }
    }
}

fn uleb128(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}
