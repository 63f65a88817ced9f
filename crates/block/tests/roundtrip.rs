//! Writes a block to an in-memory store and reads it back.

use std::sync::Arc;

use fathom_block::*;
use fathom_model::*;
use object_store::memory::InMemory;
use object_store::{ObjectStore, ObjectStoreExt};

fn symbols_and_stacks() -> (Symbols, Vec<Id>) {
    let mut s = Symbols::default();
    let m = s.add_mapping(Mapping {
        filename: "/bin/app".into(),
        build_id: "abc".into(),
        memory_start: 0x1000,
        memory_limit: 0x9000,
        ..Default::default()
    });
    let mut stacks = Vec::new();
    for i in 0..5u64 {
        let f = s.add_function(Function {
            name: format!("fn{i}"),
            filename: "a.rs".into(),
            ..Default::default()
        });
        let g = s.add_function(Function {
            name: format!("inl{i}"),
            ..Default::default()
        });
        let l = s.add_location(Location {
            mapping: m,
            address: 0x1000 + i,
            lines: vec![
                Line {
                    function: g,
                    line: 7,
                },
                Line {
                    function: f,
                    line: i as i64,
                },
            ],
        });
        let raw = s.add_location(Location {
            mapping: Id::ZERO,
            address: 0xdead + i,
            lines: vec![],
        });
        stacks.push(s.add_stack(Stack {
            locations: vec![raw, l],
        }));
    }
    (s, stacks)
}

#[tokio::test]
async fn block_round_trip() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (symbols, stacks) = symbols_and_stacks();
    let pt: ProfileType = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
        .parse()
        .unwrap();
    let labels = Labels::from_pairs([("service_name", "api"), ("env", "prod")]).unwrap();
    let mut b = SamplesBuilder::default();
    let mut profiles = Vec::new();
    for t in 0..3i64 {
        let p = Profile {
            id: IdHasher::new("p").i64(t).finish(),
            profile_type: pt.clone(),
            labels: labels.clone(),
            time_nanos: 1000 + t,
            duration_nanos: 10,
            period: 1,
            samples: stacks
                .iter()
                .map(|s| Sample {
                    stack: *s,
                    value: t + 1,
                })
                .collect(),
        };
        b.push_profile(&p);
        profiles.push(ProfileRow {
            profile_id: p.id,
            series_id: p.series_id(),
            time_nanos: p.time_nanos,
            duration_nanos: 10,
            period: 1,
            samples: p.samples.len() as u64,
        });
    }
    let series = vec![SeriesRow {
        series_id: series_id(&pt, &labels),
        profile_type: pt.clone(),
        labels: labels.clone(),
        min_time_nanos: 1000,
        max_time_nanos: 1002,
    }];
    let data = BlockData {
        tenant: "t1".into(),
        source: "test".into(),
        level: 0,
        compacted_from: vec![],
        series: series.clone(),
        profiles: profiles.clone(),
        samples: vec![b.finish()],
        symbols: std::sync::Arc::new(symbols.clone()),
        rollup_widths_nanos: Vec::new(),
    };
    let (meta, files) = encode_block(&data).unwrap();
    assert_eq!(meta.stats.samples, 15);
    assert_eq!((meta.min_time_nanos, meta.max_time_nanos), (1000, 1002));
    // Not visible before meta.json.
    assert!(list_blocks(store.as_ref()).await.unwrap().is_empty());
    write_block(store.as_ref(), &meta, files).await.unwrap();

    let listed = list_blocks(store.as_ref()).await.unwrap();
    assert_eq!(listed, vec![meta.clone()]);
    assert_eq!(read_series(store.as_ref(), &meta).await.unwrap(), series);
    let mut got = read_profiles(store.as_ref(), &meta).await.unwrap();
    got.sort_by_key(|p| p.time_nanos);
    assert_eq!(got, profiles);
    let back = read_symbols(store.as_ref(), &meta).await.unwrap();
    assert_eq!(back, symbols);
    assert_eq!(back.frames(&stacks[1]), symbols.frames(&stacks[1]));
}

#[tokio::test]
async fn newer_format_is_refused() {
    let store = InMemory::new();
    let meta = serde_json::json!({
        "format_version": FORMAT_VERSION + 1, "id": "b1", "tenant": "t",
        "min_time_nanos": 0, "max_time_nanos": 0, "level": 0, "source": "x",
        "profile_types": [], "stats": BlockStats::default(), "created_at_ms": 0
    });
    store
        .put(
            &block_file("t", "b1", files::META),
            serde_json::to_vec(&meta).unwrap().into(),
        )
        .await
        .unwrap();
    let err = read_meta(&store, "t", "b1").await.unwrap_err();
    assert!(err.to_string().contains("format version"), "{err}");
}
