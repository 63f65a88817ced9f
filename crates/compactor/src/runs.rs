//! The sample rows of a compaction's sources merged in the block's order.
//!
//! Every block keeps its samples sorted by series, time, profile and
//! stack, so a profile's rows are one run in each source that holds it.
//! The merge takes whole runs, smallest (series, time, profile) first,
//! and drops a run whose profile an earlier source holds: each profile
//! once, and rows already in the order the merged block stores them, so
//! the encoder does not sort them again. A run's profile is looked up
//! once, not each of its rows' ids, and rows are copied only once, into
//! the output.

use arrow::array::{Array, AsArray, FixedSizeBinaryArray, RecordBatch};
use arrow::datatypes::Int64Type;
use arrow::error::ArrowError;
use fathom_model::{Id, IdSet};

/// Rows of an output batch, at least (a batch ends with a run).
const OUT_ROWS: usize = 1 << 16;

/// One source block's sample rows, and the profiles in it that an
/// earlier source holds (left out).
pub(crate) struct Source {
    pub(crate) batches: Vec<RecordBatch>,
    pub(crate) dup: IdSet,
}

/// The key columns of one batch: 16-byte ids as their bytes.
struct Keys<'a> {
    series: &'a [u8],
    time: &'a [i64],
    profile: &'a [u8],
    rows: usize,
}

/// A profile's place in the order: series, time, profile (ids as their
/// bytes, the order the block's sort declares).
type RunKey<'a> = (&'a [u8], i64, &'a [u8]);

fn id_bytes(a: &FixedSizeBinaryArray, rows: usize) -> Option<&[u8]> {
    let ids = fathom_block::id_values(a).filter(|ids| ids.len() == rows)?;
    Some(ids.as_flattened())
}

/// The bytes of the id at `row`.
fn id_at(ids: &[u8], row: usize) -> &[u8] {
    &ids[row * 16..row * 16 + 16]
}

impl<'a> Keys<'a> {
    /// `None` unless `b` has the samples schema's key columns.
    fn of(b: &'a RecordBatch) -> Option<Self> {
        let rows = b.num_rows();
        let series = id_bytes(b.column(0).as_fixed_size_binary_opt()?, rows)?;
        let time = b.column(1).as_primitive_opt::<Int64Type>()?;
        let profile = id_bytes(b.column(2).as_fixed_size_binary_opt()?, rows)?;
        if time.null_count() != 0 || time.len() != rows {
            return None;
        }
        Some(Keys {
            series,
            time: time.values(),
            profile,
            rows,
        })
    }

    fn key(&self, row: usize) -> RunKey<'a> {
        (
            id_at(self.series, row),
            self.time[row],
            id_at(self.profile, row),
        )
    }

    /// The end of the run that starts at `row`.
    fn run_end(&self, row: usize) -> usize {
        let key = self.key(row);
        let mut end = row + 1;
        while end < self.rows && self.key(end) == key {
            end += 1;
        }
        end
    }
}

/// The rows of `sources` in the block's order, each profile once (the
/// first source that holds it wins), or `None` when a source's rows are
/// not in that order or not in the samples schema (the caller then
/// filters and sorts them as a whole).
pub(crate) fn merge_sorted(sources: &[Source]) -> Result<Option<Vec<RecordBatch>>, ArrowError> {
    if !sources
        .iter()
        .all(|s| fathom_block::samples_sorted(&s.batches))
    {
        return Ok(None);
    }
    let mut keys: Vec<Vec<Keys<'_>>> = Vec::with_capacity(sources.len());
    for s in sources {
        let Some(k) = s.batches.iter().map(Keys::of).collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        keys.push(k);
    }
    // Each source's next row: (batch, row), past its empty batches.
    let mut at: Vec<(usize, usize)> = vec![(0, 0); sources.len()];
    let settle = |keys: &[Keys<'_>], (mut b, mut r): (usize, usize)| {
        while b < keys.len() && r >= keys[b].rows {
            (b, r) = (b + 1, 0);
        }
        (b, r)
    };
    for (s, k) in keys.iter().enumerate() {
        at[s] = settle(k, at[s]);
    }
    let mut out = Output::default();
    let mut last: Option<(RunKey<'_>, usize)> = None;
    loop {
        let mut next: Option<(usize, RunKey<'_>)> = None;
        for (s, &(b, r)) in at.iter().enumerate() {
            if let Some(k) = keys[s].get(b).map(|k| k.key(r))
                && next.is_none_or(|(_, best)| k < best)
            {
                next = Some((s, k));
            }
        }
        let Some((s, key)) = next else { break };
        let (b, r) = at[s];
        let end = keys[s][b].run_end(r);
        // A profile an earlier source holds; or, in a source that does
        // not list it, a run of a profile another source gave already.
        let dup = (!sources[s].dup.is_empty()
            && Id::from_slice(key.2).is_some_and(|id| sources[s].dup.contains(&id)))
            || last.is_some_and(|(k, from)| k == key && from != s);
        if !dup {
            out.take(sources, s, b, r, end)?;
            last = Some((key, s));
        }
        at[s] = settle(&keys[s], (b, end));
    }
    out.flush(sources)?;
    Ok(Some(out.batches))
}

/// The merged rows: finished batches, and the slices of source batches
/// (source, batch, start, rows) that make the next one.
#[derive(Default)]
struct Output {
    batches: Vec<RecordBatch>,
    pending: Vec<(usize, usize, usize, usize)>,
    rows: usize,
}

impl Output {
    fn take(
        &mut self,
        sources: &[Source],
        s: usize,
        b: usize,
        start: usize,
        end: usize,
    ) -> Result<(), ArrowError> {
        let len = end - start;
        match self.pending.last_mut() {
            Some(p) if p.0 == s && p.1 == b && p.2 + p.3 == start => p.3 += len,
            _ => self.pending.push((s, b, start, len)),
        }
        self.rows += len;
        if self.rows >= OUT_ROWS {
            self.flush(sources)?;
        }
        Ok(())
    }

    fn flush(&mut self, sources: &[Source]) -> Result<(), ArrowError> {
        let slices: Vec<RecordBatch> = self
            .pending
            .drain(..)
            .map(|(s, b, start, len)| sources[s].batches[b].slice(start, len))
            .collect();
        self.rows = 0;
        match slices.as_slice() {
            [] => {}
            [one] => self.batches.push(one.clone()),
            [first, ..] => self
                .batches
                .push(arrow::compute::concat_batches(&first.schema(), &slices)?),
        }
        Ok(())
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
        let of = |bytes: &[u8]| Id::from_slice(bytes).unwrap();
        let mut out = Vec::new();
        for b in batches {
            let k = Keys::of(b).unwrap();
            let stack = id_bytes(b.column(3).as_fixed_size_binary(), b.num_rows()).unwrap();
            let value = b.column(4).as_primitive::<Int64Type>();
            for r in 0..b.num_rows() {
                let (se, t, p) = k.key(r);
                out.push((of(se), t, of(p), of(id_at(stack, r)), value.value(r)));
            }
        }
        out
    }

    #[test]
    fn runs_merge_in_order_each_profile_once() {
        // Profile 3 is in both sources (the second's copy is a
        // duplicate), and its run in the first crosses a batch boundary.
        let a = Source {
            batches: vec![
                batch(&[(1, 10, 1, &[1, 2]), (1, 30, 3, &[1])]),
                batch(&[(1, 30, 3, &[5, 9]), (2, 5, 7, &[2])]),
            ],
            dup: IdSet::default(),
        };
        let b = Source {
            batches: vec![batch(&[
                (1, 20, 2, &[4]),
                (1, 30, 3, &[2, 5]),
                (2, 1, 6, &[3, 4]),
            ])],
            dup: [id(3)].into_iter().collect(),
        };
        let merged = merge_sorted(&[a, b]).unwrap().unwrap();
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
        let a = Source {
            batches: vec![batch(&[(1, 1, 4, &[1, 3])])],
            dup: IdSet::default(),
        };
        let b = Source {
            batches: vec![batch(&[(1, 1, 4, &[2])])],
            dup: IdSet::default(),
        };
        let got = rows(&merge_sorted(&[a, b]).unwrap().unwrap());
        assert_eq!(
            got.iter().map(|r| r.3).collect::<Vec<_>>(),
            vec![id(1), id(3)]
        );
    }

    #[test]
    fn unsorted_sources_are_left_to_the_caller() {
        let a = Source {
            batches: vec![batch(&[(2, 1, 1, &[1])]), batch(&[(1, 1, 2, &[1])])],
            dup: IdSet::default(),
        };
        assert!(merge_sorted(&[a]).unwrap().is_none());
    }

    #[test]
    fn many_runs_make_batches_of_the_output_size() {
        let profiles: Vec<(u8, i64, u8, &[u8])> = (0..200u8)
            .map(|p| (1, i64::from(p), p, &[1u8, 2, 3][..]))
            .collect();
        // Two sources of alternate profiles, in batches of 7 profiles.
        let source = |parity: u8| Source {
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
        let merged = merge_sorted(&[source(0), source(1)]).unwrap().unwrap();
        assert!(fathom_block::samples_sorted(&merged));
        assert_eq!(rows(&merged).len(), 600);
        assert_eq!(merged.len(), 1, "600 rows fit in one output batch");
    }
}
