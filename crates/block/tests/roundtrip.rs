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

/// A block of 3 profiles of one series, 5 samples each, its symbols and
/// its stack ids.
fn test_block() -> (BlockData, Symbols, Vec<Id>) {
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
    (data, symbols, stacks)
}

#[tokio::test]
async fn block_round_trip() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (data, symbols, stacks) = test_block();
    let (series, profiles) = (data.series.clone(), data.profiles.clone());
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

/// (column, encodings) of every 16-byte id column chunk of a Parquet file.
/// A samples file read a batch at a time: every row, a selection of
/// rows, one column alone; a selection beyond the file and a column it
/// lacks are refused, naming the problem.
#[tokio::test]
async fn sample_file_reads_selections_and_columns() {
    use arrow::array::{Array, AsArray};
    let store = InMemory::new();
    let (data, _, stacks) = test_block();
    let (meta, files) = encode_block(&data).unwrap();
    write_block(&store, &meta, files).await.unwrap();
    let file = SampleFile::fetch(&store, &meta).await.unwrap();
    assert_eq!(file.num_rows(), 15);
    assert!(!file.is_selection());
    let all: Vec<_> = file.rows().unwrap().map(Result::unwrap).collect();
    assert_eq!(all, read_samples(&store, &meta).await.unwrap());

    // Rows 5..10 are the second profile's (time 1001, each value 2),
    // asked for in two adjacent ranges.
    let picked = file.clone().select(&[5..7, 7..10]).unwrap();
    assert!(picked.is_selection());
    let rows: Vec<_> = picked.rows().unwrap().map(Result::unwrap).collect();
    let ints = |col: usize| -> Vec<i64> {
        rows.iter()
            .flat_map(|b| {
                b.column(col)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .to_vec()
            })
            .collect()
    };
    assert_eq!(ints(1), vec![1001; 5], "times");
    assert_eq!(ints(4), vec![2; 5], "values");
    let only: Vec<_> = picked
        .columns(&[columns::STACK_ID])
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(only.iter().all(|b| b.num_columns() == 1));
    let mut got: Vec<Id> = only
        .iter()
        .flat_map(|b| {
            let a = b.column(0).as_fixed_size_binary();
            (0..a.len())
                .map(|i| Id::from_slice(a.value(i)).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    got.sort();
    let mut want = stacks.clone();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(
        picked
            .whole()
            .rows()
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        all
    );

    let err = file.clone().select(&[0..1, 10..20]).err().unwrap();
    assert!(err.to_string().contains("beyond its 15 rows"), "{err}");
    let err = file.columns(&["nope"]).err().unwrap();
    assert!(err.to_string().contains("no column nope"), "{err}");
}

fn id_column_encodings(bytes: &bytes::Bytes) -> Vec<(String, Vec<parquet::basic::Encoding>)> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let r = SerializedFileReader::new(bytes.clone()).unwrap();
    r.metadata()
        .row_groups()
        .iter()
        .flat_map(|rg| rg.columns())
        .filter(|c| c.column_type() == parquet::basic::Type::FIXED_LEN_BYTE_ARRAY)
        .map(|c| (c.column_path().string(), c.encodings().collect()))
        .collect()
}

/// The rows of a Parquet file.
fn parquet_rows(bytes: &bytes::Bytes) -> Vec<arrow::array::RecordBatch> {
    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes.clone())
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// Every 16-byte id column is dictionary-encoded where ids repeat, and a
/// file's key column (each id once) is PLAIN.
#[test]
fn repeated_ids_are_dictionary_encoded_keys_plain() {
    use parquet::basic::Encoding;

    let (data, _, _) = test_block();
    let (_, files) = encode_block(&data).unwrap();
    let key = |file: &str| match file {
        files::PROFILES => Some(columns::PROFILE_ID),
        files::SERIES => Some(columns::SERIES_ID),
        files::STACKS => Some(columns::STACK_ID),
        files::LOCATIONS => Some(columns::LOCATION_ID),
        files::FUNCTIONS => Some(columns::FUNCTION_ID),
        files::MAPPINGS => Some(columns::MAPPING_ID),
        _ => None,
    };
    let mut checked = 0;
    for (name, bytes) in &files {
        for (column, e) in id_column_encodings(bytes) {
            let dictionary = e.contains(&Encoding::RLE_DICTIONARY);
            if key(name) == Some(column.as_str()) {
                assert!(
                    !dictionary && e.contains(&Encoding::PLAIN),
                    "{name} {column}: {e:?}"
                );
            } else {
                assert!(dictionary, "{name} {column}: {e:?}");
            }
            checked += 1;
        }
    }
    // samples 3, profiles 2, series 1, stacks 2 (the list's items too),
    // locations 3, functions 1, mappings 1: none left unchecked.
    assert_eq!(checked, 13);
}

/// A block written before the writer's version 2 (its ids PLAIN, data
/// pages of version 1) reads as it did: the samples and stacks files of a
/// block re-encoded with parquet-rs's default (version 1) settings give
/// the same rows and symbols.
#[tokio::test]
async fn blocks_of_writer_version_1_still_read() {
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Encoding;

    let (data, symbols, _) = test_block();
    let (meta, mut files) = encode_block(&data).unwrap();
    let dictionary = |bytes: &bytes::Bytes| {
        id_column_encodings(bytes)
            .iter()
            .any(|(_, e)| e.contains(&Encoding::RLE_DICTIONARY))
    };
    let mut want_samples = Vec::new();
    for (name, bytes) in files.iter_mut() {
        if *name != files::SAMPLES && *name != files::STACKS {
            continue;
        }
        assert!(dictionary(bytes), "{name}");
        let batches = parquet_rows(bytes);
        let mut w = ArrowWriter::try_new(Vec::new(), batches[0].schema(), None).unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        let v1 = bytes::Bytes::from(w.into_inner().unwrap());
        // Version 1 leaves the 16-byte ids PLAIN: no dictionary for them.
        assert!(!dictionary(&v1), "{name}");
        *bytes = v1;
        if *name == files::SAMPLES {
            want_samples = batches;
        }
    }
    assert!(!want_samples.is_empty());
    let store = InMemory::new();
    write_block(&store, &meta, files).await.unwrap();
    assert_eq!(read_samples(&store, &meta).await.unwrap(), want_samples);
    assert_eq!(read_symbols(&store, &meta).await.unwrap(), symbols);
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
