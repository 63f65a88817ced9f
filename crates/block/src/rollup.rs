//! Pre-aggregated stack totals per series and time bucket (`rollup.parquet`).
//!
//! Buckets are aligned to the Unix epoch (so hour and day buckets are UTC
//! hours and days) and half-open: `[bucket_start, bucket_start + width)`.
//! A block's rollup row for a bucket is the sum of *that block's* samples
//! in the bucket, so a reader may mix rollups and raw samples of different
//! blocks freely: each block contributes either its rollup rows or its raw
//! rows for a given time, never both.

use std::sync::Arc;

use fathom_model::{Id, IdMap};

use arrow::array::{
    Array, ArrayRef, FixedSizeBinaryBuilder, Int64Array, Int64Builder, RecordBatch,
};

use crate::Result;
use crate::schema::rollup_schema;

/// One hour in nanoseconds.
pub const HOUR_NANOS: i64 = 3_600_000_000_000;
/// One day in nanoseconds.
pub const DAY_NANOS: i64 = 24 * HOUR_NANOS;

/// The start of the bucket of width `width` (> 0) that holds `t`; `None`
/// when it is below `i64::MIN`.
pub fn bucket_start(t: i64, width: i64) -> Option<i64> {
    t.checked_sub(t.rem_euclid(width.max(1)))
}

/// The bucket starts `[from, to)` of the buckets of `width` that lie
/// entirely inside `[start, end]` (inclusive nanoseconds); `None` when no
/// whole bucket does.
pub fn full_buckets(start: i64, end: i64, width: i64) -> Option<(i64, i64)> {
    if width <= 0 || end < start {
        return None;
    }
    let from = if start.rem_euclid(width) == 0 {
        start
    } else {
        bucket_start(start, width)?.checked_add(width)?
    };
    // The buckets starting before the one that holds `end + 1` end at or
    // before `end`.
    let to = bucket_start(end.checked_add(1)?, width)?;
    (from < to).then_some((from, to))
}

/// How a reader covers `[start, end]` from a block with rollups of
/// `widths`: whole buckets from the coarsest width that fits, then finer
/// ones, then raw samples for what is left.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cover {
    /// (width, from, to): read rollup rows of `width` with
    /// `from <= bucket_start < to`.
    pub rollups: Vec<(i64, i64, i64)>,
    /// Inclusive time intervals to read from raw samples.
    pub raw: Vec<(i64, i64)>,
}

impl Cover {
    /// Plans `[start, end]` over `widths` (any order; each width should
    /// divide the larger ones, as an hour divides a day).
    pub fn plan(start: i64, end: i64, widths: &[i64]) -> Cover {
        let mut w: Vec<i64> = widths.iter().copied().filter(|w| *w > 0).collect();
        w.sort_unstable_by(|a, b| b.cmp(a));
        w.dedup();
        let mut out = Cover::default();
        out.fill(start, end, &w);
        out
    }

    fn fill(&mut self, start: i64, end: i64, widths: &[i64]) {
        if end < start {
            return;
        }
        let Some((&w, rest)) = widths.split_first() else {
            self.raw.push((start, end));
            return;
        };
        match full_buckets(start, end, w) {
            None => self.fill(start, end, rest),
            Some((from, to)) => {
                // from > start or from == start; to - 1 <= end: no overflow.
                if from > start {
                    self.fill(start, from - 1, rest);
                }
                self.rollups.push((w, from, to));
                if to <= end {
                    self.fill(to, end, rest);
                }
            }
        }
    }
}

/// The rollup rows of the samples of `batches` (in `samples_schema`, one
/// batch after another sorted by series_id then time_nanos) for each of
/// `widths`, in `rollup_schema` order.
#[cfg(test)]
pub(crate) fn build(batches: &[RecordBatch], widths: &[i64]) -> Result<RecordBatch> {
    build_with(batches, widths, Limits::default())
}

/// [`build`] with `limits` (small ones in tests, to change ways often).
#[cfg(test)]
fn build_with(batches: &[RecordBatch], widths: &[i64], limits: Limits) -> Result<RecordBatch> {
    let mut b = Builder::new(widths);
    for o in &mut b.open {
        o.limits = limits;
    }
    for batch in batches {
        b.push(batch)?;
    }
    b.finish()
}

/// A rollup built as sample rows stream past: batch after batch in
/// `samples_schema`, sorted by series_id then time_nanos, none of them
/// kept. It holds the open series' buckets and the rollup rows built so
/// far, so its memory is the rollup's size, not the samples'.
pub(crate) struct Builder {
    widths: Vec<i64>,
    /// Each width's buckets of the open series.
    open: Vec<Buckets>,
    /// The series whose rows come now.
    current: Option<[u8; 16]>,
    out: Out,
}

impl Builder {
    /// A rollup of `widths` (nanoseconds; those not above 0 ignored).
    pub(crate) fn new(widths: &[i64]) -> Self {
        let mut widths: Vec<i64> = widths.iter().copied().filter(|w| *w > 0).collect();
        widths.sort_unstable();
        widths.dedup();
        let mut open: Vec<Buckets> = widths.iter().map(|&w| Buckets::new(w)).collect();
        for i in 1..open.len() {
            open[i].nested = widths[i] % widths[i - 1] == 0;
        }
        Builder {
            open,
            widths,
            current: None,
            out: Out::new(),
        }
    }

    /// Whether the rollup has any width: without one it has no rows.
    pub(crate) fn is_empty(&self) -> bool {
        self.widths.is_empty()
    }

    /// Adds the rows of `batch`, which come after those pushed before.
    pub(crate) fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if self.widths.is_empty() {
            return Ok(());
        }
        let (series, time, stack, value) =
            key_columns(batch).ok_or_else(|| crate::Error::Corrupt {
                block: String::new(),
                file: crate::files::SAMPLES,
                what: "samples batch does not match its schema".into(),
            })?;
        // Rows of one series are contiguous, however the batches cut
        // them; within it time ascends, so each width's buckets close in
        // order. A series' rows are written width by width once it ends.
        let rows = series.iter().zip(time).zip(stack).zip(value.iter());
        for (((sid, &t), st), &v) in rows {
            if self.current.as_ref() != Some(sid)
                && let Some(done) = self.current.replace(*sid)
            {
                self.out.series(&done, &mut self.open)?;
            }
            let st = Id(*st);
            for b in self.open.iter_mut().filter(|b| !b.nested) {
                b.add(t, st, v);
            }
        }
        Ok(())
    }

    /// The rollup rows, width by width within each series.
    pub(crate) fn finish(mut self) -> Result<RecordBatch> {
        if let Some(done) = self.current.take() {
            self.out.series(&done, &mut self.open)?;
        }
        self.out.finish()
    }
}

/// The columns of a samples batch that a rollup reads, as slices: series
/// ids, times, stack ids and values, one entry a row.
type KeyColumns<'a> = (&'a [[u8; 16]], &'a [i64], &'a [[u8; 16]], &'a [i64]);

fn key_columns(b: &RecordBatch) -> Option<KeyColumns<'_>> {
    let ids = |i: usize| crate::id_values(b.column(i).as_any().downcast_ref()?);
    let ints = |i: usize| -> Option<&[i64]> {
        let a: &Int64Array = b.column(i).as_any().downcast_ref()?;
        (a.null_count() == 0).then(|| a.values().as_ref())
    };
    let cols = (ids(0)?, ints(1)?, ids(3)?, ints(4)?);
    let n = cols.0.len();
    (cols.1.len() == n && cols.2.len() == n && cols.3.len() == n).then_some(cols)
}

/// When a bucket's stacks are summed by sorting instead of in a map.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// Distinct stacks beyond which the map is left for sorting: a map
    /// this size stays in the caches (about 30 ns a row on the
    /// benchmark machine), a larger one misses them on most rows (about
    /// 210 ns a row with 120,000 stacks), where sorting the rows costs
    /// 60-75 ns a row at any size (docs/benchmarks.md, "Issue 13,
    /// forty-eighth session").
    map_stacks: usize,
    /// Rows gathered before they are sorted and folded into the sorted
    /// totals: the memory a width's bucket holds beyond its totals.
    fold_rows: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            map_stacks: 1 << 15,
            fold_rows: 1 << 18,
        }
    }
}

/// One width's buckets of the current series: the totals of the open
/// bucket by stack, and the closed buckets' rows (start, stack, total).
struct Buckets {
    width: i64,
    /// The next finer width divides this one (as an hour divides a day):
    /// each of its buckets lies in one of this width's, so this width
    /// sums that width's closed rows when the series ends instead of
    /// every sample row (a row's stack looked up once, not once a width).
    nested: bool,
    start: Option<i64>,
    /// The open bucket's times, `[start, start + width)`, when it has
    /// them: a row inside needs no division to find its bucket (a
    /// series' rows come in time order, most of them in the open bucket).
    range: Option<(i64, i64)>,
    /// The open bucket's slot of each stack, and each slot's stack and
    /// total.
    slots: IdMap<u32>,
    stacks: Vec<Id>,
    totals: Vec<i64>,
    /// The open bucket's runs of ascending stacks (a profile's rows),
    /// as (stack as a big-endian number, slot): the run before and the
    /// one being added. A series' profiles mostly repeat each other's
    /// stacks, so a row finds its stack's slot by walking the run
    /// before alongside its own, in order, and looks it up in `slots`
    /// only when that run did not have it.
    before: Vec<(u128, u32)>,
    run: Vec<(u128, u32)>,
    /// Where in `before` the walk is.
    at: usize,
    /// Past [`Limits::map_stacks`], the open bucket's totals by stack
    /// (a big-endian number), sorted, one a stack; `rows` the rows
    /// since they were last folded in, each (stack, value).
    by_sort: bool,
    sorted: Vec<(u128, i64)>,
    rows: Vec<(u128, i64)>,
    limits: Limits,
    closed: Vec<(i64, Id, i64)>,
}

impl Buckets {
    fn new(width: i64) -> Self {
        Buckets {
            width,
            nested: false,
            start: None,
            range: None,
            slots: IdMap::default(),
            stacks: Vec::new(),
            totals: Vec::new(),
            before: Vec::new(),
            run: Vec::new(),
            at: 0,
            by_sort: false,
            sorted: Vec::new(),
            rows: Vec::new(),
            limits: Limits::default(),
            closed: Vec::new(),
        }
    }

    fn add(&mut self, t: i64, stack: Id, value: i64) {
        if !self.range.is_some_and(|(from, to)| from <= t && t < to) {
            // A bucket below i64::MIN is keyed at i64::MIN: no range ever
            // holds it whole, so readers never use its row.
            let b = bucket_start(t, self.width);
            let key = b.unwrap_or(i64::MIN);
            if self.start != Some(key) {
                self.close();
                self.start = Some(key);
            }
            self.range = b.and_then(|from| Some((from, from.checked_add(self.width)?)));
        }
        if self.by_sort {
            self.rows.push((u128::from_be_bytes(stack.0), value));
            if self.rows.len() >= self.limits.fold_rows {
                self.fold();
            }
            return;
        }
        let slot = self.slot(stack);
        let e = &mut self.totals[slot as usize];
        // Wrapping like the raw merge's SUM, so both agree.
        *e = e.wrapping_add(value);
        if self.stacks.len() > self.limits.map_stacks {
            self.leave_map();
        }
    }

    /// Moves the open bucket's totals from the map to the sorted ones.
    fn leave_map(&mut self) {
        self.slots.clear();
        self.before.clear();
        self.run.clear();
        self.at = 0;
        self.sorted.clear();
        self.sorted.extend(
            self.stacks
                .drain(..)
                .zip(self.totals.drain(..))
                .map(|(st, v)| (u128::from_be_bytes(st.0), v)),
        );
        self.sorted.sort_unstable_by_key(|r| r.0);
        self.by_sort = true;
    }

    /// Sorts the gathered rows and sums them into the sorted totals. A
    /// profile's rows come sorted by stack: the stable sort merges such
    /// runs.
    fn fold(&mut self) {
        self.rows.sort_by_key(|r| r.0);
        let mut out: Vec<(u128, i64)> = Vec::with_capacity(self.sorted.len() + self.rows.len() / 4);
        let mut old = self.sorted.iter().copied().peekable();
        for &(k, v) in &self.rows {
            while let Some(o) = old.next_if(|o| o.0 < k) {
                out.push(o);
            }
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = last.1.wrapping_add(v),
                _ => {
                    let before = old.next_if(|o| o.0 == k).map_or(0, |o| o.1);
                    out.push((k, before.wrapping_add(v)));
                }
            }
        }
        out.extend(old);
        self.sorted = out;
        self.rows.clear();
    }

    /// The open bucket's slot of `stack`, a new one if it has none.
    fn slot(&mut self, stack: Id) -> u32 {
        let key = u128::from_be_bytes(stack.0);
        if self.run.last().is_some_and(|&(last, _)| last >= key) {
            // Not above the last stack: another run begins.
            std::mem::swap(&mut self.before, &mut self.run);
            self.run.clear();
            self.at = 0;
        }
        while self.before.get(self.at).is_some_and(|&(k, _)| k < key) {
            self.at += 1;
        }
        let slot = match self.before.get(self.at) {
            Some(&(k, slot)) if k == key => slot,
            _ => {
                let next = self.stacks.len() as u32;
                let slot = *self.slots.entry(stack).or_insert(next);
                if slot == next {
                    self.stacks.push(stack);
                    self.totals.push(0);
                }
                slot
            }
        };
        self.run.push((key, slot));
        slot
    }

    /// Moves the open bucket's totals, by stack, to the closed rows.
    fn close(&mut self) {
        self.range = None;
        let by_sort = std::mem::take(&mut self.by_sort);
        if by_sort {
            self.fold();
        }
        self.slots.clear();
        self.before.clear();
        self.run.clear();
        self.at = 0;
        let Some(b) = self.start.take() else {
            self.stacks.clear();
            self.totals.clear();
            self.sorted.clear();
            return;
        };
        if by_sort {
            // In stack order already.
            let rows = self.sorted.drain(..);
            self.closed
                .extend(rows.map(|(k, v)| (b, Id(k.to_be_bytes()), v)));
            return;
        }
        let first = self.closed.len();
        self.closed.extend(
            self.stacks
                .drain(..)
                .zip(self.totals.drain(..))
                .map(|(st, v)| (b, st, v)),
        );
        self.closed[first..].sort_unstable();
    }
}

/// The rollup's columns as they are built.
struct Out {
    series: FixedSizeBinaryBuilder,
    width: Int64Builder,
    start: Int64Builder,
    stack: FixedSizeBinaryBuilder,
    value: Int64Builder,
}

impl Out {
    fn new() -> Self {
        Out {
            series: FixedSizeBinaryBuilder::new(16),
            width: Int64Builder::new(),
            start: Int64Builder::new(),
            stack: FixedSizeBinaryBuilder::new(16),
            value: Int64Builder::new(),
        }
    }

    /// Appends the rows of series `sid`, width by width, and empties
    /// `open` for the next series.
    fn series(&mut self, sid: &[u8], open: &mut [Buckets]) -> Result<()> {
        // Finest first: a nested width sums the closed rows of the width
        // before it (in time order, so its buckets close in order). A
        // bucket's start falls in the coarser bucket of all its times,
        // and the bucket below `i64::MIN` (keyed at it) in the coarser
        // bucket that `i64::MIN` names, the one its times fall in.
        for i in 0..open.len() {
            let (finer, rest) = open.split_at_mut(i);
            let Some(b) = rest.first_mut() else { break };
            if let Some(finer) = finer.last()
                && b.nested
            {
                for &(start, st, v) in &finer.closed {
                    b.add(start, st, v);
                }
            }
            b.close();
        }
        for b in open {
            for (start, st, v) in b.closed.drain(..) {
                self.series.append_value(sid)?;
                self.width.append_value(b.width);
                self.start.append_value(start);
                self.stack.append_value(st.0)?;
                self.value.append_value(v);
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<RecordBatch> {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(self.series.finish()),
            Arc::new(self.width.finish()),
            Arc::new(self.start.finish()),
            Arc::new(self.stack.finish()),
            Arc::new(self.value.finish()),
        ];
        Ok(RecordBatch::try_new(rollup_schema(), cols)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::FixedSizeBinaryArray;

    /// (series, width, bucket start, stack)
    type Key = ([u8; 16], i64, i64, [u8; 16]);

    /// A rollup's rows in order, each its key and value.
    fn keyed_rows(rollup: &RecordBatch) -> Vec<(Key, i64)> {
        let col = |i: usize| rollup.column(i).as_any();
        let series = col(0).downcast_ref::<FixedSizeBinaryArray>().unwrap();
        let width = col(1).downcast_ref::<Int64Array>().unwrap();
        let start = col(2).downcast_ref::<Int64Array>().unwrap();
        let stack = col(3).downcast_ref::<FixedSizeBinaryArray>().unwrap();
        let value = col(4).downcast_ref::<Int64Array>().unwrap();
        (0..rollup.num_rows())
            .map(|i| {
                let key = (
                    series.value(i).try_into().unwrap(),
                    width.value(i),
                    start.value(i),
                    stack.value(i).try_into().unwrap(),
                );
                (key, value.value(i))
            })
            .collect()
    }

    /// A rollup of rows cut into batches anywhere (inside a series, inside
    /// a bucket) is the rollup of the same rows in one batch, and each of
    /// its rows is the total of its series, bucket and stack.
    #[test]
    fn batches_cut_anywhere_give_the_rollup_of_their_rows() {
        use std::collections::BTreeMap;
        let h = HOUR_NANOS;
        let id = |n: u8| fathom_model::Id([n; 16]);
        // (series, time, stack, value), sorted by series then time.
        let mut rows = Vec::new();
        for s in 1..=3u8 {
            for i in 0..40i64 {
                let t = 5 * h + i * h / 7;
                rows.push((id(s), t, id((i % 4) as u8), i + i64::from(s)));
            }
        }
        let batch = |r: &[(fathom_model::Id, i64, fathom_model::Id, i64)]| {
            let mut b = crate::SamplesBuilder::with_capacity(r.len());
            for (s, t, st, v) in r {
                b.push(s, *t, &id(9), st, *v);
            }
            b.finish()
        };
        let whole = build(&[batch(&rows)], &[h, DAY_NANOS]).unwrap();
        for cuts in [vec![1, 2, 40, 41, 79, 80, 119], vec![17], vec![60, 61, 62]] {
            let mut batches = Vec::new();
            let mut from = 0;
            for c in cuts.into_iter().chain([rows.len()]) {
                batches.push(batch(&rows[from..c]));
                from = c;
            }
            assert_eq!(build(&batches, &[DAY_NANOS, h]).unwrap(), whole);
        }
        // Batches that are slices of one (their columns start at an
        // offset into shared buffers) read as their own rows.
        let one = batch(&rows);
        for c in [1, 40, 119] {
            let parts = [one.slice(0, c), one.slice(c, rows.len() - c)];
            assert_eq!(build(&parts, &[DAY_NANOS, h]).unwrap(), whole);
        }
        let mut want: BTreeMap<Key, i64> = BTreeMap::new();
        for &(s, t, st, v) in &rows {
            for w in [h, DAY_NANOS] {
                *want
                    .entry((s.0, w, bucket_start(t, w).unwrap(), st.0))
                    .or_default() += v;
            }
        }
        let got = keyed_rows(&whole);
        assert_eq!(got, want.into_iter().collect::<Vec<_>>());
    }

    /// Profiles whose stacks the one before has in part, in full, in
    /// another order or twice: each stack's total is the sum of its
    /// rows, found through the run before, the map or by sorting alike
    /// (small limits: the map left early, rows folded in often).
    #[test]
    fn runs_of_stacks_sum_like_rows() {
        let h = HOUR_NANOS;
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut b = crate::SamplesBuilder::with_capacity(0);
        let mut want = std::collections::BTreeMap::new();
        let mut t = 0;
        for series in 1..=2u8 {
            for profile in 0..60u8 {
                t += h / 5;
                let mut stacks: Vec<u8> = (0..24).filter(|_| next(3) > 0).collect();
                match profile % 5 {
                    // Out of order: runs of one or two stacks.
                    3 => stacks.reverse(),
                    // A stack twice in a row (it ends the run).
                    4 => stacks.extend(stacks.last().copied()),
                    _ => {}
                }
                for st in stacks {
                    // Big-endian order differs from the first byte's.
                    let mut stack = [st; 16];
                    stack[15] = 255 - st;
                    let v = next(100) as i64 + 1;
                    b.push(&Id([series; 16]), t, &Id([profile; 16]), &Id(stack), v);
                    for w in [h, DAY_NANOS] {
                        *want
                            .entry(([series; 16], w, bucket_start(t, w).unwrap(), stack))
                            .or_insert(0i64) += v;
                    }
                }
            }
        }
        let batch = b.finish();
        let small = [
            Limits::default(),
            Limits {
                map_stacks: 5,
                fold_rows: 7,
            },
            Limits {
                map_stacks: 0,
                fold_rows: 1,
            },
        ];
        for limits in small {
            let parts = [
                batch.slice(0, 500),
                batch.slice(500, batch.num_rows() - 500),
            ];
            let got = build_with(&parts, &[h, DAY_NANOS], limits).unwrap();
            let rows = keyed_rows(&got);
            let keys: Vec<Key> = rows.iter().map(|r| r.0).collect();
            // Rows come in order: series, width, bucket, stack.
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "{limits:?}");
            let got: std::collections::BTreeMap<_, _> = rows.into_iter().collect();
            assert!(got.len() > 300, "{} rollup rows", got.len());
            assert_eq!(got, want, "{limits:?}");
        }
    }

    /// Rows at the ends of time (a bucket below `i64::MIN`, a bucket
    /// whose end is past `i64::MAX`) fall in the buckets `bucket_start`
    /// names, found without dividing for rows inside the open bucket; a
    /// width that the next finer one divides (summed from its buckets)
    /// and one it does not (summed from the rows) give the same totals.
    #[test]
    fn buckets_at_the_ends_of_time() {
        let id = |n: u8| fathom_model::Id([n; 16]);
        let times = [
            i64::MIN,
            i64::MIN + 1,
            i64::MIN + 7,
            -HOUR_NANOS - 1,
            -1,
            0,
            1,
            3,
            HOUR_NANOS,
            i64::MAX - 7,
            i64::MAX - 1,
            i64::MAX,
        ];
        let mut b = crate::SamplesBuilder::with_capacity(times.len());
        for (i, t) in times.iter().enumerate() {
            b.push(&id(1), *t, &id(9), &id((i % 2) as u8), i as i64 + 1);
        }
        let batch = b.finish();
        for widths in [vec![3, HOUR_NANOS, DAY_NANOS], vec![2, 3, 6, HOUR_NANOS]] {
            let limits = Limits {
                map_stacks: 1,
                fold_rows: 2,
            };
            let got = build(std::slice::from_ref(&batch), &widths).unwrap();
            let by_sort = build_with(std::slice::from_ref(&batch), &widths, limits).unwrap();
            assert_eq!(by_sort, got);
            let mut want = std::collections::BTreeMap::new();
            for (i, &t) in times.iter().enumerate() {
                for &w in &widths {
                    let start = bucket_start(t, w).unwrap_or(i64::MIN);
                    *want.entry((w, start, (i % 2) as u8)).or_insert(0i64) += i as i64 + 1;
                }
            }
            let col = |i: usize| got.column(i).as_any();
            let width = col(1).downcast_ref::<Int64Array>().unwrap();
            let start = col(2).downcast_ref::<Int64Array>().unwrap();
            let stack = col(3).downcast_ref::<FixedSizeBinaryArray>().unwrap();
            let value = col(4).downcast_ref::<Int64Array>().unwrap();
            let rows: Vec<((i64, i64, u8), i64)> = (0..got.num_rows())
                .map(|i| {
                    let key = (width.value(i), start.value(i), stack.value(i)[0]);
                    (key, value.value(i))
                })
                .collect();
            assert_eq!(rows, want.into_iter().collect::<Vec<_>>(), "{widths:?}");
        }
    }

    #[test]
    fn full_buckets_inside_a_range() {
        let h = HOUR_NANOS;
        assert_eq!(full_buckets(0, h - 1, h), Some((0, h)));
        assert_eq!(full_buckets(1, h - 1, h), None);
        assert_eq!(full_buckets(1, 3 * h, h), Some((h, 3 * h)));
        assert_eq!(full_buckets(-h, 0, h), Some((-h, 0)));
        assert_eq!(full_buckets(0, i64::MAX, h), None);
        assert_eq!(full_buckets(i64::MIN, i64::MIN + 5, h), None);
        assert_eq!(full_buckets(5, 4, h), None);
    }

    #[test]
    fn cover_uses_days_then_hours_then_raw() {
        let (h, d) = (HOUR_NANOS, DAY_NANOS);
        let start = d - 2 * h - 7;
        let end = 3 * d + h + 5;
        let c = Cover::plan(start, end, &[h, d]);
        assert_eq!(
            c.rollups,
            vec![(h, d - 2 * h, d), (d, d, 3 * d), (h, 3 * d, 3 * d + h)]
        );
        assert_eq!(c.raw, vec![(start, d - 2 * h - 1), (3 * d + h, end)]);
        // Without widths everything is raw.
        assert_eq!(Cover::plan(start, end, &[]).raw, vec![(start, end)]);
    }

    #[test]
    fn cover_covers_every_nanosecond_once() {
        let (h, d) = (HOUR_NANOS, DAY_NANOS);
        for (start, end) in [(0, 5), (3, d * 2 + 1), (h + 1, 2 * h), (-d - 3, d + h)] {
            let c = Cover::plan(start, end, &[h, d]);
            let mut parts: Vec<(i64, i64)> = c.raw.clone();
            parts.extend(c.rollups.iter().map(|&(_, f, t)| (f, t - 1)));
            parts.sort_unstable();
            assert_eq!(parts.first().map(|p| p.0), Some(start));
            assert_eq!(parts.last().map(|p| p.1), Some(end));
            for w in parts.windows(2) {
                assert_eq!(w[0].1 + 1, w[1].0, "gap or overlap in {parts:?}");
            }
        }
    }
}
