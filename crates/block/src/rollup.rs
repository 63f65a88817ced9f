//! Pre-aggregated stack totals per series and time bucket (`rollup.parquet`).
//!
//! Buckets are aligned to the Unix epoch (so hour and day buckets are UTC
//! hours and days) and half-open: `[bucket_start, bucket_start + width)`.
//! A block's rollup row for a bucket is the sum of *that block's* samples
//! in the bucket, so a reader may mix rollups and raw samples of different
//! blocks freely: each block contributes either its rollup rows or its raw
//! rows for a given time, never both.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, FixedSizeBinaryArray, FixedSizeBinaryBuilder, Int64Array, Int64Builder,
    RecordBatch,
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

/// The rollup rows of `samples` (in `samples_schema`, sorted by series_id
/// then time_nanos) for each of `widths`, in `rollup_schema` order.
pub(crate) fn build(samples: &RecordBatch, widths: &[i64]) -> Result<RecordBatch> {
    let series = samples
        .column(0)
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>();
    let time = samples.column(1).as_any().downcast_ref::<Int64Array>();
    let stack = samples
        .column(3)
        .as_any()
        .downcast_ref::<FixedSizeBinaryArray>();
    let value = samples.column(4).as_any().downcast_ref::<Int64Array>();
    let (Some(series), Some(time), Some(stack), Some(value)) = (series, time, stack, value) else {
        return Err(crate::Error::Corrupt {
            block: String::new(),
            file: crate::files::SAMPLES,
            what: "samples batch does not match its schema".into(),
        });
    };
    let mut widths: Vec<i64> = widths.iter().copied().filter(|w| *w > 0).collect();
    widths.sort_unstable();
    widths.dedup();

    let mut out_series = FixedSizeBinaryBuilder::new(16);
    let mut out_width = Int64Builder::new();
    let mut out_start = Int64Builder::new();
    let mut out_stack = FixedSizeBinaryBuilder::new(16);
    let mut out_value = Int64Builder::new();

    // Rows of one series are contiguous; within it time ascends, so each
    // width's buckets close in order.
    let n = samples.num_rows();
    let mut i = 0;
    while i < n {
        let sid = series.value(i);
        let mut j = i;
        while j < n && series.value(j) == sid {
            j += 1;
        }
        for &w in &widths {
            let mut k = i;
            while k < j {
                // A bucket below i64::MIN is keyed at i64::MIN: no range
                // ever holds it whole, so readers never use its row.
                let b = bucket_start(time.value(k), w).unwrap_or(i64::MIN);
                let mut totals: HashMap<&[u8], i64> = HashMap::new();
                while k < j && bucket_start(time.value(k), w).unwrap_or(i64::MIN) == b {
                    let e = totals.entry(stack.value(k)).or_insert(0);
                    // Wrapping like the raw merge's SUM, so both agree.
                    *e = e.wrapping_add(value.value(k));
                    k += 1;
                }
                let mut rows: Vec<(&[u8], i64)> = totals.into_iter().collect();
                rows.sort_unstable();
                for (st, v) in rows {
                    out_series.append_value(sid)?;
                    out_width.append_value(w);
                    out_start.append_value(b);
                    out_stack.append_value(st)?;
                    out_value.append_value(v);
                }
            }
        }
        i = j;
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(out_series.finish()),
        Arc::new(out_width.finish()),
        Arc::new(out_start.finish()),
        Arc::new(out_stack.finish()),
        Arc::new(out_value.finish()),
    ];
    Ok(RecordBatch::try_new(rollup_schema(), cols)?)
}

#[cfg(test)]
mod tests {
    use super::*;

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
