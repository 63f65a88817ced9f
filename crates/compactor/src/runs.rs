//! The sample rows of a compaction's sources merged in the block's order,
//! as they are read.
//!
//! Every block keeps its samples sorted by series, time, profile and
//! stack, so a profile's rows are one run in each source that holds it.
//! The merge takes whole runs, smallest (series, time, profile) first,
//! and drops a run whose profile an earlier source holds: each profile
//! once, and rows already in the order the merged block stores them, so
//! the encoder does not sort them again. A run's profile is looked up
//! once, not each of its rows' ids, and rows are copied only once, into
//! the output.
//!
//! Each source is decoded a batch at a time as the merge reaches it, and
//! the merged rows leave a batch at a time: a compaction holds its
//! sources' files (compressed) and a batch or two of each, not its
//! window's rows decoded (10 GB for 90 s of ingest at 150 MB/s before,
//! docs/benchmarks.md, "Issue 13, forty-seventh session").

use arrow::array::{Array, AsArray, FixedSizeBinaryArray, RecordBatch};
use arrow::buffer::ScalarBuffer;
use arrow::datatypes::Int64Type;
use fathom_block::{Error, SampleFile};
use fathom_model::{Id, IdSet};

/// Rows of an output batch, at least (a batch ends with a run).
const OUT_ROWS: usize = 1 << 16;

/// One source block's samples file, and the profiles in it that an
/// earlier source holds (left out).
pub(crate) struct Source {
    pub(crate) file: SampleFile,
    pub(crate) dup: IdSet,
}

/// A profile's place in the order: series, time, profile (ids as their
/// bytes, the order the block's sort declares).
type RunKey = ([u8; 16], i64, [u8; 16]);

/// The batch a source's merge is in: its key columns and the next row.
struct Current {
    batch: RecordBatch,
    /// Which of its source's batches it is.
    seq: u64,
    series: FixedSizeBinaryArray,
    time: ScalarBuffer<i64>,
    profile: FixedSizeBinaryArray,
    row: usize,
}

impl Current {
    /// `None` unless `batch` has the samples schema's key columns.
    fn of(batch: RecordBatch, seq: u64) -> Option<Self> {
        let rows = batch.num_rows();
        let ids = |i: usize| {
            let a = batch.column(i).as_fixed_size_binary_opt()?;
            fathom_block::id_values(a)
                .is_some_and(|v| v.len() == rows)
                .then(|| a.clone())
        };
        let (series, profile) = (ids(0)?, ids(2)?);
        let time = batch.column(1).as_primitive_opt::<Int64Type>()?;
        if time.null_count() != 0 || time.len() != rows {
            return None;
        }
        let time = time.values().clone();
        Some(Current {
            batch,
            seq,
            series,
            time,
            profile,
            row: 0,
        })
    }

    /// The key columns, one entry a row (checked when it was made).
    fn keys(&self) -> (&[[u8; 16]], &[i64], &[[u8; 16]]) {
        (
            fathom_block::id_values(&self.series).unwrap_or_default(),
            &self.time,
            fathom_block::id_values(&self.profile).unwrap_or_default(),
        )
    }

    fn key(&self, row: usize) -> Option<RunKey> {
        let (series, time, profile) = self.keys();
        Some((*series.get(row)?, *time.get(row)?, *profile.get(row)?))
    }

    /// The end of the run that starts at the next row.
    fn run_end(&self) -> usize {
        let (series, time, profile) = self.keys();
        let r = self.row;
        let mut end = r + 1;
        while end < self.time.len()
            && profile[end] == profile[r]
            && time[end] == time[r]
            && series[end] == series[r]
        {
            end += 1;
        }
        end
    }
}

/// Batches of a source's rows.
type Batches<'a> = Box<dyn Iterator<Item = Result<RecordBatch, Error>> + Send + 'a>;

/// A source's rows as the merge reads them.
struct Cursor<'a> {
    rows: Batches<'a>,
    block: String,
    /// The batch with the source's next row; `None` once it has none.
    at: Option<Current>,
    read: u64,
}

impl<'a> Cursor<'a> {
    fn new(rows: Batches<'a>, block: &str) -> Result<Self, Error> {
        let mut c = Cursor {
            rows,
            block: block.to_owned(),
            at: None,
            read: 0,
        };
        c.settle()?;
        Ok(c)
    }

    /// Moves past the end of the current batch, and past empty ones.
    fn settle(&mut self) -> Result<(), Error> {
        while self.at.as_ref().is_none_or(|c| c.row >= c.time.len()) {
            let Some(batch) = self.rows.next().transpose()? else {
                self.at = None;
                return Ok(());
            };
            self.read += 1;
            self.at = Some(Current::of(batch, self.read).ok_or_else(|| Error::Corrupt {
                block: self.block.clone(),
                file: fathom_block::files::SAMPLES,
                what: "sample rows not in the samples schema".into(),
            })?);
        }
        Ok(())
    }

    fn key(&self) -> Option<RunKey> {
        self.at.as_ref().and_then(|c| c.key(c.row))
    }
}

/// The rows of `sources` in the block's order, each profile once (the
/// first source that holds it wins), in batches of about [`OUT_ROWS`].
/// Sources whose rows are not in that order give rows out of order (each
/// source's rows keep their order), which the encoder refuses
/// ([`Error::Unsorted`]); the caller then filters and sorts them whole.
pub(crate) struct Merge<'a> {
    /// Each source's profiles that an earlier source holds.
    dups: Vec<&'a IdSet>,
    cursors: Vec<Cursor<'a>>,
    /// The last run taken, and its source.
    last: Option<(RunKey, usize)>,
    out: Output,
    done: bool,
}

impl<'a> Merge<'a> {
    pub(crate) fn new(sources: &'a [Source]) -> Result<Self, Error> {
        let mut inputs = Vec::with_capacity(sources.len());
        for s in sources {
            let rows: Batches<'a> = Box::new(s.file.rows()?);
            inputs.push((rows, s.file.block(), &s.dup));
        }
        Self::over(inputs)
    }

    /// The merge of sources given as their batches, block names and
    /// duplicate profiles.
    fn over(inputs: Vec<(Batches<'a>, &str, &'a IdSet)>) -> Result<Self, Error> {
        let mut cursors = Vec::with_capacity(inputs.len());
        let mut dups = Vec::with_capacity(inputs.len());
        for (rows, block, dup) in inputs {
            cursors.push(Cursor::new(rows, block)?);
            dups.push(dup);
        }
        Ok(Merge {
            dups,
            cursors,
            last: None,
            out: Output::default(),
            done: false,
        })
    }

    /// The next batch of merged rows; `None` after the last.
    fn step(&mut self) -> Result<Option<RecordBatch>, Error> {
        loop {
            let mut next: Option<(usize, RunKey)> = None;
            for (s, c) in self.cursors.iter().enumerate() {
                if let Some(k) = c.key()
                    && next.is_none_or(|(_, best)| k < best)
                {
                    next = Some((s, k));
                }
            }
            let Some((s, key)) = next else {
                return self.out.flush();
            };
            let cursor = &mut self.cursors[s];
            let Some(at) = cursor.at.as_mut() else {
                return self.out.flush();
            };
            let end = at.run_end();
            // A profile an earlier source holds; or, in a source that
            // does not list it, a run of a profile another source gave
            // already.
            let dup = (!self.dups[s].is_empty() && self.dups[s].contains(&Id(key.2)))
                || self.last.is_some_and(|(k, from)| k == key && from != s);
            if !dup {
                self.out.take(s, at, end);
                self.last = Some((key, s));
            }
            at.row = end;
            cursor.settle()?;
            if self.out.rows >= OUT_ROWS {
                return self.out.flush();
            }
        }
    }
}

impl Iterator for Merge<'_> {
    type Item = Result<RecordBatch, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step().transpose();
        self.done = !matches!(r, Some(Ok(_)));
        r
    }
}

/// The slices of source batches that make the next output batch:
/// (source, which batch, the batch, start, rows).
#[derive(Default)]
struct Output {
    pending: Vec<(usize, u64, RecordBatch, usize, usize)>,
    rows: usize,
}

impl Output {
    /// Rows `at.row..end` of `at`'s batch, of source `s`.
    fn take(&mut self, s: usize, at: &Current, end: usize) {
        let (start, len) = (at.row, end - at.row);
        match self.pending.last_mut() {
            Some(p) if p.0 == s && p.1 == at.seq && p.3 + p.4 == start => p.4 += len,
            _ => self.pending.push((s, at.seq, at.batch.clone(), start, len)),
        }
        self.rows += len;
    }

    fn flush(&mut self) -> Result<Option<RecordBatch>, Error> {
        let slices: Vec<RecordBatch> = self
            .pending
            .drain(..)
            .map(|(_, _, b, start, len)| b.slice(start, len))
            .collect();
        self.rows = 0;
        Ok(match slices.as_slice() {
            [] => None,
            [one] => Some(one.clone()),
            [first, ..] => Some(arrow::compute::concat_batches(&first.schema(), &slices)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_block::samples_batch;
    use fathom_model::Sample;

    fn id(n: u8) -> Id {
        let mut b = [0u8; 16];
        b[0] = n;
        Id(b)
    }

    /// A sorted batch of profiles (series, time, profile, stacks).
    fn batch(profiles: &[(u8, i64, u8, &[u8])]) -> RecordBatch {
        let rows: Vec<(Id, i64, Id, Vec<Sample>)> = profiles
            .iter()
            .map(|&(se, t, p, stacks)| {
                let samples = stacks
                    .iter()
                    .map(|&st| Sample {
                        stack: id(st),
                        value: i64::from(st) * 10 + i64::from(p),
                    })
                    .collect();
                (id(se), t, id(p), samples)
            })
            .collect();
        let n = rows.iter().map(|r| r.3.len()).sum();
        samples_batch(n, rows.iter().map(|(s, t, p, x)| (s, *t, p, &x[..])))
    }

    /// (series, time, profile, stack, value) of every row.
    fn rows(batches: &[RecordBatch]) -> Vec<(Id, i64, Id, Id, i64)> {
        let mut out = Vec::new();
        for b in batches {
            let c = Current::of(b.clone(), 0).unwrap();
            let stack = fathom_block::id_values(b.column(3).as_fixed_size_binary()).unwrap();
            let value = b.column(4).as_primitive::<Int64Type>();
            for (r, st) in stack.iter().enumerate() {
                let (se, t, p) = c.key(r).unwrap();
                out.push((Id(se), t, Id(p), Id(*st), value.value(r)));
            }
        }
        out
    }

    /// A source of these batches, and the profiles it leaves out.
    struct Given {
        batches: Vec<RecordBatch>,
        dup: IdSet,
    }

    /// Every batch the merge of `sources` gives.
    fn merge_sorted(sources: &[Given]) -> Result<Vec<RecordBatch>, Error> {
        let inputs = sources
            .iter()
            .map(|s| {
                let rows: Batches<'_> = Box::new(s.batches.iter().cloned().map(Ok));
                (rows, "test", &s.dup)
            })
            .collect();
        Merge::over(inputs)?.collect()
    }

    #[test]
    fn runs_merge_in_order_each_profile_once() {
        // Profile 3 is in both sources (the second's copy is a
        // duplicate), and its run in the first crosses a batch boundary.
        let a = Given {
            batches: vec![
                batch(&[(1, 10, 1, &[1, 2]), (1, 30, 3, &[1])]),
                batch(&[(1, 30, 3, &[5, 9]), (2, 5, 7, &[2])]),
            ],
            dup: IdSet::default(),
        };
        let b = Given {
            batches: vec![batch(&[
                (1, 20, 2, &[4]),
                (1, 30, 3, &[2, 5]),
                (2, 1, 6, &[3, 4]),
            ])],
            dup: [id(3)].into_iter().collect(),
        };
        let merged = merge_sorted(&[a, b]).unwrap();
        assert!(fathom_block::samples_sorted(&merged));
        let got = rows(&merged);
        let profiles: Vec<(Id, usize)> = [1u8, 2, 3, 6, 7]
            .iter()
            .map(|&n| (id(n), got.iter().filter(|r| r.2 == id(n)).count()))
            .collect();
        assert_eq!(
            profiles,
            vec![(id(1), 2), (id(2), 1), (id(3), 3), (id(6), 2), (id(7), 1)]
        );
        // Profile 3's rows are the first source's (values carry it).
        let three: Vec<i64> = got.iter().filter(|r| r.2 == id(3)).map(|r| r.4).collect();
        assert_eq!(three, vec![13, 53, 93]);
    }

    #[test]
    fn a_profile_no_source_lists_twice_is_taken_once() {
        // Neither source's profiles name profile 4 as a duplicate: the
        // first source's run is kept, the second's left out.
        let a = Given {
            batches: vec![batch(&[(1, 1, 4, &[1, 3])])],
            dup: IdSet::default(),
        };
        let b = Given {
            batches: vec![batch(&[(1, 1, 4, &[2])])],
            dup: IdSet::default(),
        };
        let got = rows(&merge_sorted(&[a, b]).unwrap());
        assert_eq!(
            got.iter().map(|r| r.3).collect::<Vec<_>>(),
            vec![id(1), id(3)]
        );
    }

    #[test]
    fn unsorted_sources_give_unsorted_rows() {
        // Each source's rows keep their order: the encoder refuses them,
        // and the caller falls back to a sort.
        let a = Given {
            batches: vec![batch(&[(2, 1, 1, &[1])]), batch(&[(1, 1, 2, &[1])])],
            dup: IdSet::default(),
        };
        let b = Given {
            batches: vec![batch(&[(1, 5, 3, &[1])])],
            dup: IdSet::default(),
        };
        let merged = merge_sorted(&[a, b]).unwrap();
        assert!(!fathom_block::samples_sorted(&merged));
        assert_eq!(rows(&merged).len(), 3);
    }

    #[test]
    fn rows_of_another_schema_are_refused() {
        let other = RecordBatch::try_from_iter([(
            "x",
            std::sync::Arc::new(arrow::array::Int64Array::from(vec![1])) as arrow::array::ArrayRef,
        )])
        .unwrap();
        let a = Given {
            batches: vec![other],
            dup: IdSet::default(),
        };
        let err = merge_sorted(&[a]).unwrap_err();
        assert!(
            err.to_string().contains("not in the samples schema"),
            "{err}"
        );
    }

    #[test]
    fn many_runs_make_batches_of_the_output_size() {
        let profiles: Vec<(u8, i64, u8, &[u8])> = (0..200u8)
            .map(|p| (1, i64::from(p), p, &[1u8, 2, 3][..]))
            .collect();
        // Two sources of alternate profiles, in batches of 7 profiles.
        let source = |parity: u8| Given {
            batches: profiles
                .iter()
                .filter(|p| p.2 % 2 == parity)
                .copied()
                .collect::<Vec<_>>()
                .chunks(7)
                .map(batch)
                .collect(),
            dup: IdSet::default(),
        };
        let merged = merge_sorted(&[source(0), source(1)]).unwrap();
        assert!(fathom_block::samples_sorted(&merged));
        assert_eq!(rows(&merged).len(), 600);
        assert_eq!(merged.len(), 1, "600 rows fit in one output batch");
    }
}
