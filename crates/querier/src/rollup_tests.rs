//! Merges answered from rollups equal merges of the raw profiles, exactly,
//! on the real corpus, for ranges that start and end mid-bucket.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use fathom_block::{BlockData, DAY_NANOS, HOUR_NANOS, MemoryIndex, ProfileRow, SamplesBuilder};
use fathom_model::{Id, IdHasher, Labels, Profile, Selector, Symbols, TenantId};
use object_store::ObjectStore;
use object_store::memory::InMemory;

use crate::{Config, test_querier_on};

const TESTDATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/testdata/pprof"
);

/// Small pprof files of the corpus, normalized (each may hold several
/// profile types).
fn corpus() -> Vec<(Vec<Profile>, Symbols)> {
    let manifest = std::fs::read_to_string(format!("{TESTDATA}/MANIFEST.tsv"))
        .expect("the corpus manifest (shared/testdata)");
    let mut out = Vec::new();
    for line in manifest.lines().skip(1) {
        let f: Vec<&str> = line.split('\t').collect();
        if f.len() < 17 || !f[4].starts_with("pprof-proto") || !f[16].is_empty() {
            continue;
        }
        let Ok(size) = f[3].parse::<u64>() else {
            continue;
        };
        if size > 40_000 {
            continue;
        }
        let Ok(bytes) = std::fs::read(format!("{TESTDATA}/{}", f[0])) else {
            continue;
        };
        let Ok(p) = fathom_pprof::decode(&bytes, &fathom_pprof::Limits::default()) else {
            continue;
        };
        let Ok(n) = fathom_pprof::normalize(&p, &Default::default()) else {
            continue;
        };
        if !n.profiles.is_empty() {
            out.push((n.profiles, n.symbols));
        }
    }
    assert!(out.len() >= 20, "only {} corpus files", out.len());
    out
}

/// The corpus replayed as two instances of one service every 5 minutes
/// for 50 hours from 22:00 on day 0, written as one compacted block per
/// UTC day with hour and day rollups.
async fn history(store: &dyn ObjectStore) -> (Vec<fathom_block::BlockMeta>, Vec<Profile>) {
    let files = corpus();
    let t0 = 20_000 * DAY_NANOS - 2 * HOUR_NANOS;
    let step = 5 * 60 * 1_000_000_000i64;
    let mut all: Vec<Profile> = Vec::new();
    let mut symbols = Symbols::default();
    for (_, s) in &files {
        symbols.merge(s);
    }
    for k in 0..600i64 {
        for instance in ["a", "b"] {
            let (profiles, _) = &files[(k as usize * 7 + instance.len()) % files.len()];
            for p in profiles {
                let mut p = p.clone();
                // Mid-second times, so no profile sits on a bucket edge.
                p.time_nanos = t0 + k * step + 1_234_567;
                let mut labels = Labels::new();
                labels.insert("service_name", "svc");
                labels.insert("instance", instance);
                p.labels = labels;
                p.id = IdHasher::new("test-profile")
                    .i64(p.time_nanos)
                    .str(instance)
                    .str(&p.profile_type.to_string())
                    .finish();
                all.push(p);
            }
        }
    }
    let mut by_day: BTreeMap<i64, Vec<&Profile>> = BTreeMap::new();
    for p in &all {
        by_day
            .entry(p.time_nanos.div_euclid(DAY_NANOS))
            .or_default()
            .push(p);
    }
    let mut metas = Vec::new();
    for profiles in by_day.values() {
        let mut sb = SamplesBuilder::default();
        let mut series: HashMap<Id, fathom_block::SeriesRow> = HashMap::new();
        let mut rows = Vec::new();
        for p in profiles {
            sb.push_profile(p);
            let sid = p.series_id();
            series
                .entry(sid)
                .or_insert_with(|| fathom_block::SeriesRow::of(p))
                .include(p.time_nanos);
            rows.push(ProfileRow::of(p, sid));
        }
        let data = BlockData {
            tenant: "t".into(),
            source: "test".into(),
            level: 2,
            compacted_from: Vec::new(),
            series: series.into_values().collect(),
            profiles: rows,
            samples: vec![sb.finish()],
            symbols: symbols.clone(),
            rollup_widths_nanos: vec![HOUR_NANOS, DAY_NANOS],
        };
        let (meta, files) = fathom_block::encode_block(&data).unwrap();
        assert!(files.iter().any(|f| f.0 == fathom_block::files::ROLLUP));
        fathom_block::write_block(store, &meta, files)
            .await
            .unwrap();
        metas.push(meta);
    }
    (metas, all)
}

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
