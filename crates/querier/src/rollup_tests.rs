//! Merges answered from rollups equal merges of the raw profiles, exactly,
//! on the real corpus, for ranges that start and end mid-bucket.

use std::collections::BTreeMap;
use std::sync::Arc;

use fathom_block::{DAY_NANOS, HOUR_NANOS, MemoryIndex};
use fathom_model::{Id, Profile, Selector, TenantId};
use object_store::ObjectStore;
use object_store::memory::InMemory;

use crate::test_util::history;
use crate::{Config, test_querier_on};

/// The merge of the raw profiles, summed here without any query engine.
fn expected(all: &[Profile], pt: &str, start: i64, end: i64) -> Vec<(Id, i64)> {
    let mut m: BTreeMap<Id, i64> = BTreeMap::new();
    for p in all {
        if p.profile_type.to_string() == pt && p.time_nanos >= start && p.time_nanos <= end {
            for s in &p.samples {
                let e = m.entry(s.stack).or_insert(0);
                *e = e.wrapping_add(s.value);
            }
        }
    }
    m.into_iter().filter(|(_, v)| *v != 0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollup_merges_equal_raw_merges_on_the_corpus() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (metas, all) = history(store.as_ref()).await;
    assert_eq!(metas.len(), 3, "the history spans three UTC days");
    let index = Arc::new(MemoryIndex::new(metas));
    let rollups = test_querier_on(Config::default(), index.clone(), store.clone());
    let raw = test_querier_on(
        Config {
            use_rollups: false,
            ..Config::default()
        },
        index,
        store,
    );
    let tenant = TenantId::new("t").unwrap();
    let day1 = 20_000 * DAY_NANOS;
    let min = 60_000_000_000i64;
    // Every range starts and ends mid-bucket (mid-hour and mid-day).
    let ranges = [
        // Two full days with hour and raw edges.
        (
            day1 - HOUR_NANOS - 17 * min,
            day1 + DAY_NANOS + 3 * HOUR_NANOS + 7 * min,
        ),
        // Inside one day: hours only.
        (
            day1 + 2 * HOUR_NANOS + 31 * min,
            day1 + 9 * HOUR_NANOS + 2 * min,
        ),
        // Inside one hour: raw only.
        (
            day1 + 5 * HOUR_NANOS + 10 * min,
            day1 + 5 * HOUR_NANOS + 50 * min,
        ),
        // The whole history and more.
        (day1 - 3 * DAY_NANOS + 11, day1 + 3 * DAY_NANOS - 13),
    ];
    let mut types: Vec<String> = all.iter().map(|p| p.profile_type.to_string()).collect();
    types.sort();
    types.dedup();
    let mut compared = 0;
    for pt in &types {
        let sel = Selector::parse(&format!("{pt}{{service_name=\"svc\"}}")).unwrap();
        for &(start, end) in &ranges {
            let want = expected(&all, pt, start, end);
            let got = rollups.merge(&tenant, &sel, start, end).await.unwrap();
            let plain = raw.merge(&tenant, &sel, start, end).await.unwrap();
            let got_s: Vec<(Id, i64)> = got.samples.iter().copied().filter(|s| s.1 != 0).collect();
            let plain_s: Vec<(Id, i64)> =
                plain.samples.iter().copied().filter(|s| s.1 != 0).collect();
            assert_eq!(got_s, want, "{pt} [{start}, {end}] from rollups");
            assert_eq!(plain_s, want, "{pt} [{start}, {end}] from raw samples");
            assert_eq!(got.profiles, plain.profiles);
            compared += 1;
        }
    }
    assert!(compared >= 4 * 5, "only {compared} comparisons");
    let reads = rollups.inner.metrics.rollup_reads.get();
    assert!(reads > 0, "the rollups were never read");
    assert_eq!(raw.inner.metrics.rollup_reads.get(), 0);
}

/// Waits (bounded) until no running query holds memory.
async fn memory_released(q: &crate::Querier) -> i64 {
    for _ in 0..200 {
        if q.inner.metrics.memory.get() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    q.inner.metrics.memory.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_over_their_limits_fail_clearly_and_the_querier_keeps_serving() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (metas, all) = history(store.as_ref()).await;
    let index = Arc::new(MemoryIndex::new(metas));
    // Raw samples only: the most work per query.
    let q = test_querier_on(
        Config {
            use_rollups: false,
            ..Config::default()
        },
        index,
        store,
    );
    let tenant = TenantId::new("t").unwrap();
    let pt = all[0].profile_type.to_string();
    let sel = Selector::parse(&format!("{pt}{{service_name=\"svc\"}}")).unwrap();
    let (start, end) = (0, i64::MAX - 1);
    let limits = |memory: Option<usize>, timeout: Option<std::time::Duration>| {
        fathom_api::auth::TenantLimits {
            query_memory: memory,
            query_timeout: timeout,
            ..Default::default()
        }
    };

    // Over the memory limit: a clear error, mapped to 429.
    let e = fathom_api::auth::with_request_limits(
        limits(Some(64), None),
        q.merge(&tenant, &sel, start, end),
    )
    .await
    .err()
    .expect("64 bytes are not enough for a merge");
    assert!(
        matches!(e, crate::QueryError::ResourcesExhausted(_)),
        "{e:?}"
    );
    assert!(e.to_string().contains("query memory limit"), "{e}");
    let api = fathom_api::ApiError::from(e);
    assert!(matches!(api, fathom_api::ApiError::RateLimited(_)));
    assert_eq!(q.inner.metrics.over_memory.get(), 1);
    assert_eq!(memory_released(&q).await, 0);

    // Past the timeout: a clear error; the work is stopped.
    let e = fathom_api::auth::with_request_limits(
        limits(None, Some(std::time::Duration::from_nanos(1))),
        q.merge(&tenant, &sel, start, end),
    )
    .await
    .err()
    .expect("a merge takes more than a nanosecond");
    assert!(matches!(e, crate::QueryError::Timeout(_)), "{e:?}");
    assert!(e.to_string().contains("timeout of 1ns"), "{e}");
    assert_eq!(q.inner.metrics.timed_out.get(), 1);
    assert_eq!(memory_released(&q).await, 0);

    // A caller that goes away (an HTTP client disconnecting drops the
    // request's future) cancels the query, which gives its memory back.
    let gone = tokio::time::timeout(
        std::time::Duration::from_millis(1),
        q.merge(&tenant, &sel, start, end),
    )
    .await;
    assert!(gone.is_err(), "the merge finished within 1 ms");
    assert_eq!(q.inner.metrics.cancelled.get(), 1);
    assert_eq!(memory_released(&q).await, 0);

    // And the querier still answers, exactly.
    let m = q.merge(&tenant, &sel, start, end).await.unwrap();
    let got: Vec<(Id, i64)> = m.samples.iter().copied().filter(|s| s.1 != 0).collect();
    assert_eq!(got, expected(&all, &pt, start, end));
}

/// `(leaf, sum)` rows of a SQL answer, sorted, zero sums dropped.
fn leaf_sums(batches: &[arrow::array::RecordBatch]) -> Vec<(String, i64)> {
    use arrow::array::AsArray;
    use arrow::datatypes::Int64Type;
    let mut out = Vec::new();
    for b in batches {
        let names = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
        let names = names.as_string::<i32>();
        let sums = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            if sums.value(i) != 0 {
                out.push((names.value(i).to_owned(), sums.value(i)));
            }
        }
    }
    out.sort();
    out
}

/// Per-function SQL sums are answered from rollups (whole hours and days)
/// and equal the same SQL over raw rows, exactly, for ranges that start and
/// end mid-bucket; queries that need raw rows are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_sums_from_rollups_equal_sums_of_raw_rows() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (metas, all) = history(store.as_ref()).await;
    let index = Arc::new(MemoryIndex::new(metas));
    let q = test_querier_on(Config::default(), index, store);
    let tenant = TenantId::new("t").unwrap();
    let day1 = 20_000 * DAY_NANOS;
    let min = 60_000_000_000i64;
    let ranges = [
        (
            day1 - HOUR_NANOS - 17 * min,
            day1 + DAY_NANOS + 3 * HOUR_NANOS + 7 * min,
        ),
        (
            day1 + 2 * HOUR_NANOS + 31 * min,
            day1 + 9 * HOUR_NANOS + 2 * min,
        ),
    ];
    let mut types: Vec<String> = all.iter().map(|p| p.profile_type.to_string()).collect();
    types.sort();
    types.dedup();
    let mut compared = 0;
    for pt in &types {
        for &(start, end) in &ranges {
            let filter = format!(
                "service_name = 'svc' AND profile_type = '{pt}' \
                 AND time >= to_timestamp_nanos({start}) AND time <= to_timestamp_nanos({end})"
            );
            let scans = q.inner.metrics.sql_rollup_scans.get();
            let fast = q
                .sql_collect(
                    &tenant,
                    &format!(
                        "SELECT leaf, sum(value) AS flat FROM profiles WHERE {filter} GROUP BY leaf"
                    ),
                )
                .await
                .unwrap();
            assert_eq!(
                q.inner.metrics.sql_rollup_scans.get(),
                scans + 1,
                "{pt}: the rule did not apply"
            );
            // A series column in the answer: totals per (series, stack),
            // the same sums.
            let per_series = q
                .sql_collect(
                    &tenant,
                    &format!(
                        "SELECT leaf, sum(value) AS flat, service_name FROM profiles \
                         WHERE {filter} GROUP BY leaf, service_name"
                    ),
                )
                .await
                .unwrap();
            assert_eq!(
                q.inner.metrics.sql_rollup_scans.get(),
                scans + 2,
                "{pt}: the rule did not apply with a series column"
            );
            assert_eq!(leaf_sums(&per_series), leaf_sums(&fast), "{pt}");
            // Counting rows keeps the scan on raw rows.
            let raw = q
                .sql_collect(
                    &tenant,
                    &format!(
                        "SELECT leaf, sum(value) AS flat, count(*) AS n FROM profiles \
                         WHERE {filter} GROUP BY leaf"
                    ),
                )
                .await
                .unwrap();
            assert_eq!(
                q.inner.metrics.sql_rollup_scans.get(),
                scans + 2,
                "{pt}: raw query rewritten"
            );
            // The service and type equalities are the scan's (its
            // selector's), so it reads no series column and sums per stack.
            let explain = q
                .sql_collect(
                    &tenant,
                    &format!(
                        "EXPLAIN SELECT leaf, sum(value) AS flat FROM profiles WHERE {filter} GROUP BY leaf"
                    ),
                )
                .await
                .unwrap();
            let text = arrow::util::pretty::pretty_format_batches(&explain)
                .unwrap()
                .to_string();
            assert!(
                text.contains("TableScan: profiles projection=[leaf, value], full_filters=")
                    && !text.contains("Filter:"),
                "{text}"
            );
            let (fast, raw) = (leaf_sums(&fast), leaf_sums(&raw));
            if raw.is_empty() {
                continue;
            }
            assert_eq!(fast, raw, "{pt} [{start}, {end}]");
            // The total equals the merge of the raw profiles.
            let total: i64 = fast.iter().map(|r| r.1).sum();
            let want: i64 = expected(&all, pt, start, end).iter().map(|s| s.1).sum();
            assert_eq!(total, want);
            compared += 1;
        }
    }
    assert!(compared >= 2, "only {compared} comparisons");
    assert!(
        q.inner.metrics.rollup_reads.get() > 0,
        "the rule's scans never read a rollup"
    );

    // Counting rows, grouping by time or profile, or a time predicate the
    // scan cannot enforce exactly: raw rows, same answers as before.
    let pt = &types[0];
    let (start, end) = ranges[0];
    let before = q.inner.metrics.sql_rollup_scans.get();
    for sql in [
        format!(
            "SELECT leaf, sum(value), count(*) FROM profiles WHERE profile_type = '{pt}' \
             AND time >= to_timestamp_nanos({start}) AND time <= to_timestamp_nanos({end}) GROUP BY leaf"
        ),
        format!(
            "SELECT date_trunc('hour', time) AS h, sum(value) FROM profiles \
             WHERE profile_type = '{pt}' GROUP BY h"
        ),
        format!(
            "SELECT leaf, sum(value) FROM profiles WHERE profile_type = '{pt}' \
             AND date_trunc('hour', time) >= to_timestamp_nanos({start}) GROUP BY leaf"
        ),
        format!("SELECT leaf, avg(value) FROM profiles WHERE profile_type = '{pt}' GROUP BY leaf"),
    ] {
        q.sql_collect(&tenant, &sql).await.unwrap();
    }
    assert_eq!(q.inner.metrics.sql_rollup_scans.get(), before);
    // BETWEEN is an exact bound too.
    let between = q
        .sql_collect(
            &tenant,
            &format!(
                "SELECT leaf, sum(value) FROM profiles WHERE profile_type = '{pt}' \
                 AND time BETWEEN to_timestamp_nanos({start}) AND to_timestamp_nanos({end}) GROUP BY leaf"
            ),
        )
        .await
        .unwrap();
    assert_eq!(q.inner.metrics.sql_rollup_scans.get(), before + 1);
    let total: i64 = leaf_sums(&between).iter().map(|r| r.1).sum();
    let want: i64 = expected(&all, pt, start, end).iter().map(|s| s.1).sum();
    assert_eq!(total, want);
}

/// Range queries sum whole rollup buckets that lie inside one step and
/// raw samples for the rest: exactly the raw answer for steps that are and
/// are not multiples of an hour, from mid-bucket starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_queries_from_rollups_equal_raw_ranges() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (metas, all) = history(store.as_ref()).await;
    let index = Arc::new(MemoryIndex::new(metas));
    let rollups = test_querier_on(Config::default(), index.clone(), store.clone());
    let raw = test_querier_on(
        Config {
            use_rollups: false,
            ..Config::default()
        },
        index,
        store,
    );
    let tenant = TenantId::new("t").unwrap();
    let day1 = 20_000 * DAY_NANOS;
    let min = 60_000_000_000i64;
    let (start, end) = (
        day1 - HOUR_NANOS - 17 * min,
        day1 + DAY_NANOS + 3 * HOUR_NANOS + 7 * min,
    );
    let pt = all[0].profile_type.to_string();
    let sel = Selector::parse(&format!("{pt}{{service_name=\"svc\"}}")).unwrap();
    let mut compared = 0;
    for step in [
        7 * min,
        HOUR_NANOS,
        90 * min,
        2 * HOUR_NANOS,
        DAY_NANOS,
        DAY_NANOS + 13 * min,
    ] {
        let before = rollups.inner.metrics.rollup_reads.get();
        let got = rollups
            .range(&tenant, &sel, start, end, step, vec!["instance".into()])
            .await
            .unwrap();
        let used = rollups.inner.metrics.rollup_reads.get() > before;
        assert_eq!(
            used,
            step >= HOUR_NANOS,
            "step {step}: rollups used: {used}"
        );
        let want = raw
            .range(&tenant, &sel, start, end, step, vec!["instance".into()])
            .await
            .unwrap();
        assert_eq!(got.len(), 2, "two instances");
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.labels, w.labels);
            assert_eq!(g.points, w.points, "step {step}, {:?}", g.labels);
            // And both equal the profiles summed here, per step.
            let inst = g.labels.get("instance").unwrap();
            let mut by: BTreeMap<i64, i64> = BTreeMap::new();
            for p in all.iter().filter(|p| {
                p.profile_type.to_string() == pt
                    && p.labels.get("instance") == Some(inst)
                    && p.time_nanos >= start
                    && p.time_nanos <= end
            }) {
                let t_ms = (start + (p.time_nanos - start) / step * step) / 1_000_000;
                *by.entry(t_ms).or_insert(0) += p.total();
            }
            let mine: Vec<(i64, i64)> = by.into_iter().collect();
            assert_eq!(g.points, mine, "step {step}");
            compared += 1;
        }
    }
    assert_eq!(compared, 12);
    assert_eq!(raw.inner.metrics.rollup_reads.get(), 0);
}
