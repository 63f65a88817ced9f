//! A block file's 16-byte id columns that are dictionary-encoded and keep
//! no statistics (a sample's `stack_id`, a location's `mapping_id`, a
//! profile's `series_id`, ...), encoded here instead of by parquet-rs's
//! generic column writer.
//!
//! A reader sees what parquet-rs writes for such a column: one
//! dictionary page of the distinct ids (PLAIN, in the order they first
//! come), then data pages of version 2 holding each row's index into it
//! (`RLE_DICTIONARY`: a bit width, then runs of repeats and bit-packed
//! groups), zstd-compressed, with an offset index. What differs is the
//! cost a value: parquet-rs makes every fixed-length value a
//! reference-counted `Bytes` of its own and interns it through a
//! generic table, which was about half of an ingester's head cut
//! (docs/benchmarks.md, "Issue 13, thirty-sixth session"); here a value
//! is one lookup of 16 bytes in a map of [`Id`]s.

use arrow::array::{Array, FixedSizeBinaryArray};
use bytes::Bytes;
use fathom_model::{Id, IdMap};
use parquet::basic::{Compression, Encoding, PageType, ZstdLevel};
use parquet::column::page::{CompressedPage, Page, PageWriter};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::metadata::{ColumnChunkMetaData, PageEncodingStats};
use parquet::file::page_index::offset_index::{OffsetIndexMetaData, PageLocation};
use parquet::file::writer::{SerializedPageWriter, TrackedWrite};
use parquet::schema::types::ColumnDescPtr;

/// Rows a data page, parquet-rs's default page row limit (which the
/// other columns of a file keep).
pub(crate) const PAGE_ROWS: usize = 20_000;

/// Values a bit-packed run holds at most: 63 groups of 8, so that its
/// header is one byte, as every writer makes it.
const PACKED_RUN: usize = 63 * 8;

/// A repeat this long is written as a run of one value.
const MIN_REPEAT: usize = 8;

type Result<T> = std::result::Result<T, ParquetError>;

/// One row group's chunk of a `FIXED_LEN_BYTE_ARRAY(16)` column, without
/// nulls: ids are taken as they come and encoded by [`IdChunk::finish`].
pub(crate) struct IdChunk {
    descr: ColumnDescPtr,
    level: i32,
    /// The dictionary index of each id seen.
    index: IdMap<u32>,
    /// The distinct ids, 16 bytes each, in the order they came.
    dictionary: Vec<u8>,
    /// Each row's dictionary index.
    keys: Vec<u32>,
}

impl IdChunk {
    /// An empty chunk of column `descr`, compressed with zstd at `level`.
    pub(crate) fn new(descr: ColumnDescPtr, level: i32) -> Self {
        IdChunk {
            descr,
            level,
            index: IdMap::default(),
            dictionary: Vec::new(),
            keys: Vec::new(),
        }
    }

    /// Appends every id of `a`, which must be 16 bytes wide and hold no
    /// null; nothing is appended otherwise.
    pub(crate) fn push(&mut self, a: &FixedSizeBinaryArray) -> Result<()> {
        if a.value_size() != 16 || a.null_count() > 0 {
            return Err(ParquetError::General(format!(
                "column {}: ids must be 16 bytes and not null (got {} bytes, {} nulls)",
                self.descr.path(),
                a.value_size(),
                a.null_count()
            )));
        }
        self.keys.reserve(a.len());
        for i in 0..a.len() {
            let Some(id) = Id::from_slice(a.value(i)) else {
                // Checked above: every value is 16 bytes.
                continue;
            };
            let next = self.index.len();
            let key = match self.index.entry(id) {
                std::collections::hash_map::Entry::Occupied(e) => *e.get(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let key = u32::try_from(next).map_err(|_| {
                        ParquetError::General("more than 2^32 distinct ids in a chunk".into())
                    })?;
                    self.dictionary.extend_from_slice(&id.0);
                    *e.insert(key)
                }
            };
            self.keys.push(key);
        }
        Ok(())
    }

    /// The chunk's bytes (its pages, as they go in the file, from offset
    /// 0) and what a row group needs to append them
    /// (`SerializedRowGroupWriter::append_column`). Fails on a chunk
    /// without rows.
    pub(crate) fn finish(self) -> Result<(Bytes, ColumnCloseResult)> {
        if self.keys.is_empty() {
            return Err(ParquetError::General(format!(
                "column {}: a chunk without rows",
                self.descr.path()
            )));
        }
        let entries = self.dictionary.len() / 16;
        // The width of the largest index; 0 for a single entry.
        let width = u32::BITS - (entries.saturating_sub(1) as u32).leading_zeros();
        let mut zstd = zstd::bulk::Compressor::new(self.level)?;
        let mut sink = TrackedWrite::new(Vec::new());
        let mut pages = SerializedPageWriter::new(&mut sink);
        let mut compressed = 0u64;
        let mut uncompressed = 0u64;

        let dictionary = pages.write_page(CompressedPage::new(
            Page::DictionaryPage {
                buf: Bytes::from(zstd.compress(&self.dictionary)?),
                num_values: u32::try_from(entries)
                    .map_err(|_| ParquetError::General("dictionary too large".into()))?,
                encoding: Encoding::PLAIN,
                is_sorted: false,
            },
            self.dictionary.len(),
        ))?;
        compressed += dictionary.compressed_size as u64;
        uncompressed += dictionary.uncompressed_size as u64;

        let mut locations = Vec::with_capacity(self.keys.len().div_ceil(PAGE_ROWS));
        let mut raw = Vec::new();
        for (i, rows) in self.keys.chunks(PAGE_ROWS).enumerate() {
            raw.clear();
            raw.push(width as u8);
            encode_keys(rows, width, &mut raw);
            // At most PAGE_ROWS rows: fits.
            let n = rows.len() as u32;
            let spec = pages.write_page(CompressedPage::new(
                Page::DataPageV2 {
                    buf: Bytes::from(zstd.compress(&raw)?),
                    num_values: n,
                    encoding: Encoding::RLE_DICTIONARY,
                    num_nulls: 0,
                    num_rows: n,
                    def_levels_byte_len: 0,
                    rep_levels_byte_len: 0,
                    is_compressed: true,
                    statistics: None,
                },
                raw.len(),
            ))?;
            compressed += spec.compressed_size as u64;
            uncompressed += spec.uncompressed_size as u64;
            locations.push(PageLocation {
                offset: spec.offset as i64,
                compressed_page_size: i32::try_from(spec.compressed_size)
                    .map_err(|_| ParquetError::General("page too large".into()))?,
                first_row_index: (i * PAGE_ROWS) as i64,
            });
        }
        pages.close()?;
        let bytes = Bytes::from(sink.into_inner()?);
        debug_assert_eq!(bytes.len() as u64, compressed);

        let data_pages = locations.len();
        let metadata = ColumnChunkMetaData::builder(self.descr.clone())
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(self.level)?))
            .set_encodings(vec![
                Encoding::PLAIN,
                Encoding::RLE,
                Encoding::RLE_DICTIONARY,
            ])
            .set_page_encoding_stats(vec![
                PageEncodingStats {
                    page_type: PageType::DICTIONARY_PAGE,
                    encoding: Encoding::PLAIN,
                    count: 1,
                },
                PageEncodingStats {
                    page_type: PageType::DATA_PAGE_V2,
                    encoding: Encoding::RLE_DICTIONARY,
                    count: i32::try_from(data_pages)
                        .map_err(|_| ParquetError::General("too many pages".into()))?,
                },
            ])
            .set_total_compressed_size(compressed as i64)
            .set_total_uncompressed_size(uncompressed as i64)
            .set_num_values(self.keys.len() as i64)
            .set_dictionary_page_offset(Some(dictionary.offset as i64))
            .set_data_page_offset(locations.first().map_or(0, |l| l.offset))
            .build()?;
        Ok((
            bytes,
            ColumnCloseResult {
                bytes_written: compressed,
                rows_written: self.keys.len() as u64,
                metadata,
                bloom_filter: None,
                column_index: None,
                offset_index: Some(OffsetIndexMetaData {
                    page_locations: locations,
                    unencoded_byte_array_data_bytes: None,
                }),
            },
        ))
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
        let mut acc = 0u64;
        let mut bits = 0;
        for j in 0..groups * 8 {
            acc |= u64::from(run.get(j).copied().unwrap_or(0)) << bits;
            bits += width;
            while bits >= 8 {
                out.push(acc as u8);
                acc >>= 8;
                bits -= 8;
            }
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
