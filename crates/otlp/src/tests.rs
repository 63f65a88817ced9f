//! Conversion tests: the real eBPF profiler request against Pyroscope's
//! expected outputs, both layouts, refusals, bounds and garbage.

use std::collections::BTreeMap;
use std::path::PathBuf;

use fathom_model::{Id, Profile as ModelProfile};
use prost::Message;

use crate::wire::*;
use crate::{Encoding, Error, Layout, Limits, Normalized, Request};

fn testdata() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/testdata/other/otlp/grafana+pyroscope/pkg"
    ))
}

fn read(rel: &str) -> Vec<u8> {
    let p = testdata().join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const EBPF_PB: &str = "test/integration/testdata/otel-ebpf-profile.pb.bin";
const EBPF_JSON: &str = "test/integration/testdata/otel-ebpf-profile.pb.json";

fn convert(body: &[u8], enc: Encoding) -> Result<(Layout, Normalized), Error> {
    let limits = Limits::default();
    let r = Request::decode(body, enc, &limits)?;
    let n = r.convert(Id::from_u128(7), &limits)?;
    Ok((r.layout, n))
}

/// Stack (root first, `function@file(build id)` per frame) → value, of
/// the profiles of one type.
fn stacks(n: &Normalized, profile_type: &str) -> BTreeMap<String, i64> {
    stacks_of(n, profile_type, None)
}

/// [`stacks`] of one service only.
fn stacks_of(n: &Normalized, profile_type: &str, service: Option<&str>) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let keep = |p: &&ModelProfile| {
        p.profile_type.to_string() == profile_type
            && service.is_none_or(|s| p.labels.get("service_name") == Some(s))
    };
    for p in n.profiles.iter().filter(keep) {
        for s in &p.samples {
            let st = &n.symbols.stacks[&s.stack];
            let mut frames = Vec::new();
            for l in st.locations.iter().rev() {
                let loc = &n.symbols.locations[l];
                let m = n.symbols.mappings.get(&loc.mapping);
                let map = m.map_or(String::new(), |m| format!("{}({})", m.filename, m.build_id));
                if loc.lines.is_empty() {
                    frames.push(format!("0x{:x}@{map}", loc.address));
                }
                for line in loc.lines.iter().rev() {
                    frames.push(format!(
                        "{}@{map}",
                        n.symbols.functions[&line.function].name
                    ));
                }
            }
            *out.entry(frames.join(";")).or_insert(0) += s.value;
        }
    }
    out
}

/// The same from Pyroscope's compact JSON profile dump.
fn expected(rel: &str) -> BTreeMap<String, i64> {
    let v: serde_json::Value = serde_json::from_slice(&read(rel)).unwrap();
    let mut out = BTreeMap::new();
    for s in v["samples"].as_array().unwrap() {
        let mut frames = Vec::new();
        for l in s["locations"].as_array().unwrap().iter().rev() {
            let map = l["mapping"].as_str().unwrap().split_once(' ').unwrap().1;
            let lines = l["lines"].as_array().unwrap();
            for line in lines.iter().rev() {
                let name = line.as_str().unwrap().split_once('[').unwrap().0;
                frames.push(format!("{name}@{map}"));
            }
        }
        let value: i64 = s["values"].as_str().unwrap().parse().unwrap();
        *out.entry(frames.join(";")).or_insert(0) += value;
    }
    out
}

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const OFF_CPU: &str = "off_cpu:off_cpu:nanoseconds:unknown:count";

#[test]
fn ebpf_profiler_request_matches_pyroscope_expectations() {
    let (layout, n) = convert(&read(EBPF_PB), Encoding::Protobuf).unwrap();
    assert_eq!(layout, Layout::V1_10);
    let types: std::collections::BTreeSet<String> = n
        .profiles
        .iter()
        .map(|p| p.profile_type.to_string())
        .collect();
    assert_eq!(types, [OFF_CPU, CPU].map(String::from).into());
    let mut services = std::collections::BTreeSet::new();
    for p in &n.profiles {
        services.insert(p.labels.get("service_name").unwrap().to_owned());
        assert!(p.labels.get("process_pid").is_some(), "{}", p.labels);
        assert!(p.time_nanos > 1_700_000_000_000_000_000);
    }
    // Resources with process.executable.name are services of their own,
    // as in Pyroscope (whose expectations select `unknown_service`).
    assert_eq!(
        services,
        [
            "unknown_service",
            "unknown_service:containerd",
            "unknown_service:kwin_wayland",
            "unknown_service:xdg-desktop-portal"
        ]
        .map(String::from)
        .into()
    );
    let svc = Some("unknown_service");
    let cpu = stacks_of(&n, CPU, svc);
    assert_eq!(
        cpu,
        expected("test/integration/testdata/otel-ebpf-profile-cpu.out.json")
    );
    assert_eq!(cpu.values().sum::<i64>(), 10 * 50_000_000);
    let off = stacks_of(&n, OFF_CPU, svc);
    assert_eq!(
        off,
        expected("test/integration/testdata/otel-ebpf-profile-offcpu.out.json")
    );
    // xdg-desktop-portal's native frames came without symbols: kept as
    // binary + address.
    let portal = stacks_of(&n, OFF_CPU, Some("unknown_service:xdg-desktop-portal"));
    assert!(
        portal.keys().any(|k| k
            .split(';')
            .any(|f| f.starts_with("0x") && f.contains("@libglib-2.0.so"))),
        "{portal:?}"
    );
}

#[test]
fn json_encoding_reads_the_same() {
    let (_, pb) = convert(&read(EBPF_PB), Encoding::Protobuf).unwrap();
    let (layout, js) = convert(&read(EBPF_JSON), Encoding::Json).unwrap();
    assert_eq!(layout, Layout::V1_10);
    assert_eq!(stacks(&pb, CPU), stacks(&js, CPU));
    assert_eq!(stacks(&pb, OFF_CPU), stacks(&js, OFF_CPU));
    let labels = |n: &Normalized| {
        let mut v: Vec<String> = n.profiles.iter().map(|p| p.labels.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(labels(&pb), labels(&js));
}

/// A small request: two Python-like frames with a string attribute, in
/// either layout, and a resource with `service.name`.
fn small_request(layout: Layout) -> ExportProfilesServiceRequest {
    let strings = [
        "",
        "samples",
        "count",
        "wall",
        "nanoseconds",
        "main",
        "app.py",
        "work",
        "thread.name",
        "MainThread",
        "thread.id",
    ];
    let s = |x: &str| strings.iter().position(|y| *y == x).unwrap() as i32;
    let attr = |k: &str, v: Value| KeyValueAndUnit {
        key_strindex: s(k),
        value: Some(AnyValue { value: Some(v) }),
    };
    let values = vec![3, 4];
    let attrs = vec![0i64, 1];
    let sample = match layout {
        Layout::V1_8 => Sample {
            stack_index: 0,
            field2: values,
            field3: attrs,
            field4: vec![],
            timestamps_unix_nano: vec![10, 20],
        },
        Layout::V1_10 => Sample {
            stack_index: 0,
            field2: attrs,
            field3: vec![],
            field4: values,
            timestamps_unix_nano: vec![10, 20],
        },
    };
    ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![
                    KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            value: Some(Value::StringValue("pyapp".into())),
                        }),
                    },
                    KeyValue {
                        key: "deployment.environment".into(),
                        value: Some(AnyValue {
                            value: Some(Value::StringValue("e2e".into())),
                        }),
                    },
                ],
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: None,
                profiles: vec![Profile {
                    sample_type: Some(ValueType {
                        type_strindex: s("samples"),
                        unit_strindex: s("count"),
                    }),
                    samples: vec![sample],
                    time_unix_nano: 1_700_000_000_000_000_000,
                    duration_nano: 10_000_000_000,
                    period_type: Some(ValueType {
                        type_strindex: s("wall"),
                        unit_strindex: s("nanoseconds"),
                    }),
                    period: 10_000_000,
                }],
            }],
        }],
        dictionary: Some(ProfilesDictionary {
            mapping_table: vec![],
            location_table: vec![
                Location {
                    mapping_index: 0,
                    address: 0,
                    lines: vec![Line {
                        function_index: 0,
                        line: 3,
                    }],
                },
                Location {
                    mapping_index: 0,
                    address: 0,
                    lines: vec![Line {
                        function_index: 1,
                        line: 7,
                    }],
                },
            ],
            // Like the PyPI SDK: no zero entries at index 0.
            function_table: vec![
                Function {
                    name_strindex: s("work"),
                    system_name_strindex: s("work"),
                    filename_strindex: s("app.py"),
                    start_line: 0,
                },
                Function {
                    name_strindex: s("main"),
                    system_name_strindex: s("main"),
                    filename_strindex: s("app.py"),
                    start_line: 0,
                },
            ],
            string_table: strings.iter().map(|x| x.to_string()).collect(),
            attribute_table: vec![
                attr("thread.id", Value::IntValue(140)),
                attr("thread.name", Value::StringValue("MainThread".into())),
            ],
            stack_table: vec![Stack {
                location_indices: vec![0, 1],
            }],
        }),
    }
}

fn only_profile(n: &Normalized) -> &ModelProfile {
    assert_eq!(n.profiles.len(), 1, "{:?}", n.profiles);
    &n.profiles[0]
}

#[test]
fn both_layouts_read_the_same() {
    let mut seen = Vec::new();
    for layout in [Layout::V1_8, Layout::V1_10] {
        let body = small_request(layout).encode_to_vec();
        let (got, n) = convert(&body, Encoding::Protobuf).unwrap();
        assert_eq!(got, layout);
        let p = only_profile(&n);
        assert_eq!(
            p.profile_type.to_string(),
            "wall:samples:count:wall:nanoseconds"
        );
        assert_eq!(p.labels.get("service_name"), Some("pyapp"));
        assert_eq!(p.labels.get("deployment_environment"), Some("e2e"));
        assert_eq!(p.labels.get("thread_name"), Some("MainThread"));
        assert_eq!(
            p.labels.get("thread_id"),
            None,
            "numeric sample attributes are dropped"
        );
        assert_eq!(stacks(&n, "wall:samples:count:wall:nanoseconds"), {
            let mut m = BTreeMap::new();
            m.insert("main@;work@".to_owned(), 7);
            m
        });
        seen.push(n);
    }
    assert_eq!(seen[0], seen[1]);
}

#[test]
fn layout_without_wire_evidence_is_read_from_the_values() {
    // No attributes: only fields 1, 2 (values in v1.8) and 5.
    let mut r = small_request(Layout::V1_8);
    let p = &mut r.resource_profiles[0].scope_profiles[0].profiles[0];
    p.samples[0].field3.clear();
    // 3 and 4 would be valid distinct attribute indices only if the table
    // had five entries: it has two, so this is v1.8.
    let (layout, n) = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap();
    assert_eq!(layout, Layout::V1_8);
    assert_eq!(only_profile(&n).total(), 7);
    // Values without timestamps: v1.8 (a v1.10 sample needs one of them).
    let p = &mut r.resource_profiles[0].scope_profiles[0].profiles[0];
    p.samples[0].timestamps_unix_nano.clear();
    let (layout, _) = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap();
    assert_eq!(layout, Layout::V1_8);
    // The eBPF profiler's CPU shape: attributes and more timestamps, no
    // values: v1.10, each timestamp an event.
    let mut r = small_request(Layout::V1_10);
    let p = &mut r.resource_profiles[0].scope_profiles[0].profiles[0];
    p.samples[0].field4.clear();
    p.samples[0].timestamps_unix_nano = vec![1, 2, 3];
    let (layout, n) = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap();
    assert_eq!(layout, Layout::V1_10);
    assert_eq!(only_profile(&n).total(), 3);
}

#[test]
fn samples_that_disagree_about_the_layout_are_refused() {
    let mut r = small_request(Layout::V1_8);
    let v10 = small_request(Layout::V1_10);
    let p = &mut r.resource_profiles[0].scope_profiles[0].profiles[0];
    p.samples
        .push(v10.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].clone());
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(matches!(e, Error::MixedLayout { .. }), "{e}");
    assert!(e.to_string().contains("disagree"), "{e}");
}

/// Encodes a field key.
fn key(field: u64, wt: u64, out: &mut Vec<u8>) {
    prost::encoding::encode_varint(field << 3 | wt, out);
}

fn len_field(field: u64, body: &[u8], out: &mut Vec<u8>) {
    key(field, 2, out);
    prost::encoding::encode_varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

#[test]
fn layouts_before_v1_8_are_refused_with_a_message() {
    // v1.7: Profile { repeated sample_type = 1; sample = 2 { locations_start_index = 1,
    // locations_length = 2, value = 3 }; location_indices = 3 }.
    let mut sample = Vec::new();
    key(1, 0, &mut sample);
    sample.push(0);
    key(2, 0, &mut sample);
    sample.push(2);
    len_field(3, &[5], &mut sample);
    let mut profile = Vec::new();
    len_field(1, &[8, 1, 16, 2], &mut profile);
    len_field(2, &sample, &mut profile);
    len_field(3, &[0, 1], &mut profile);
    let mut scope = Vec::new();
    len_field(2, &profile, &mut scope);
    let mut rp = Vec::new();
    len_field(2, &scope, &mut rp);
    let mut req = Vec::new();
    len_field(1, &rp, &mut req);
    let e = convert(&req, Encoding::Protobuf).unwrap_err();
    assert!(matches!(e, Error::Legacy(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("v1.7.0 or earlier") && msg.contains("v1.8.0"),
        "{msg}"
    );

    // The same in JSON.
    let json = br#"{"resourceProfiles":[{"scopeProfiles":[{"profiles":[{
        "sampleType":[{"typeStrindex":1,"unitStrindex":2}],
        "sample":[{"locationsStartIndex":0,"locationsLength":2,"value":["5"]}],
        "locationIndices":[0,1]}]}]}],
        "dictionary":{"stringTable":["","cpu","nanoseconds"]}}"#;
    let e = convert(json, Encoding::Json).unwrap_err();
    assert!(matches!(e, Error::Legacy(_)), "{e}");
    // A v1.7 dictionary: KeyValue attributes with string keys.
    let json = br#"{"dictionary":{"attributeTable":[{"key":"a","value":{"stringValue":"b"}}]}}"#;
    let e = convert(json, Encoding::Json).unwrap_err();
    assert!(matches!(e, Error::Legacy(_)), "{e}");
}

#[test]
fn bad_indices_are_refused_naming_the_table() {
    let mut r = small_request(Layout::V1_10);
    r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 9;
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(e.to_string().contains("stack_table entry 9"), "{e}");

    let mut r = small_request(Layout::V1_10);
    r.dictionary.as_mut().unwrap().stack_table[0].location_indices = vec![0, -1];
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(e.to_string().contains("location_table entry -1"), "{e}");

    let mut r = small_request(Layout::V1_10);
    r.dictionary.as_mut().unwrap().function_table[1].name_strindex = 1000;
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(e.to_string().contains("string_table entry 1000"), "{e}");

    let mut r = small_request(Layout::V1_10);
    r.dictionary.as_mut().unwrap().location_table[0].mapping_index = 3;
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(e.to_string().contains("mapping_table entry 3"), "{e}");

    let mut r = small_request(Layout::V1_10);
    r.dictionary = None;
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(e.to_string().contains("no dictionary"), "{e}");
}

#[test]
fn value_overflow_and_empty_samples_are_refused() {
    let mut r = small_request(Layout::V1_10);
    r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].field4 = vec![i64::MAX, 1];
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");

    let mut r = small_request(Layout::V1_10);
    let s = &mut r.resource_profiles[0].scope_profiles[0].profiles[0].samples[0];
    s.field4.clear();
    s.timestamps_unix_nano.clear();
    s.field2.clear();
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(
        e.to_string().contains("neither values nor timestamps"),
        "{e}"
    );
}

#[test]
fn oversized_attribute_sets_are_refused() {
    let mut r = small_request(Layout::V1_10);
    let attrs = &mut r.resource_profiles[0].resource.as_mut().unwrap().attributes;
    for i in 0..100 {
        attrs.push(KeyValue {
            key: format!("k{i}"),
            value: Some(AnyValue {
                value: Some(Value::StringValue("v".into())),
            }),
        });
    }
    let e = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap_err();
    assert!(e.to_string().contains("labels"), "{e}");
}

#[test]
fn unsymbolized_native_frames_keep_binary_and_address() {
    let mut r = small_request(Layout::V1_10);
    let d = r.dictionary.as_mut().unwrap();
    d.string_table.push("libfoo.so".into());
    d.string_table.push(crate::convert::BUILD_ID_GNU.into());
    d.string_table.push("abc123".into());
    let n = d.string_table.len() as i32;
    d.attribute_table.push(KeyValueAndUnit {
        key_strindex: n - 2,
        value: Some(AnyValue {
            value: Some(Value::StringValue("abc123".into())),
        }),
    });
    d.mapping_table = vec![
        Mapping::default(),
        Mapping {
            memory_start: 0x1000,
            memory_limit: 0x9000,
            file_offset: 0,
            filename_strindex: n - 3,
            attribute_indices: vec![2],
        },
    ];
    d.location_table.push(Location {
        mapping_index: 1,
        address: 0x1e0,
        lines: vec![],
    });
    d.stack_table[0].location_indices.insert(0, 2);
    let (_, n) = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap();
    let got = stacks(&n, "wall:samples:count:wall:nanoseconds");
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        ["main@;work@;0x1e0@libfoo.so(abc123)"]
    );
}

#[test]
fn sample_service_name_moves_samples_to_that_service() {
    let mut r = small_request(Layout::V1_10);
    let d = r.dictionary.as_mut().unwrap();
    d.string_table.push("service.name".into());
    let k = d.string_table.len() as i32 - 1;
    d.attribute_table.push(KeyValueAndUnit {
        key_strindex: k,
        value: Some(AnyValue {
            value: Some(Value::StringValue("other".into())),
        }),
    });
    let p = &mut r.resource_profiles[0].scope_profiles[0].profiles[0];
    let mut s2 = p.samples[0].clone();
    s2.field2.push(2);
    p.samples.push(s2);
    let (_, n) = convert(&r.encode_to_vec(), Encoding::Protobuf).unwrap();
    let mut services: Vec<_> = n
        .profiles
        .iter()
        .map(|p| p.labels.get("service_name").unwrap().to_owned())
        .collect();
    services.sort();
    assert_eq!(services, ["other", "pyapp"]);
}

#[test]
fn decoding_is_bounded() {
    // 100,000 empty locations: 200 kB on the wire, several MB decoded.
    let mut dict = Vec::new();
    for _ in 0..100_000 {
        len_field(2, &[], &mut dict);
    }
    let mut req = Vec::new();
    len_field(2, &dict, &mut req);
    let limits = Limits {
        max_decoded_bytes: 1 << 20,
        ..Default::default()
    };
    let e = Request::decode(&req, Encoding::Protobuf, &limits).unwrap_err();
    assert!(matches!(e, Error::TooLarge(_)), "{e}");
    let limits = Limits {
        max_table_entries: 1000,
        ..Default::default()
    };
    let e = Request::decode(&req, Encoding::Protobuf, &limits).unwrap_err();
    assert!(
        e.to_string().contains("location_table has more than 1000"),
        "{e}"
    );

    let json = format!(
        r#"{{"dictionary":{{"locationTable":[{}{{}}]}}}}"#,
        "{},".repeat(100_000)
    );
    let limits = Limits {
        max_decoded_bytes: 1 << 20,
        ..Default::default()
    };
    let e = Request::decode(json.as_bytes(), Encoding::Json, &limits).unwrap_err();
    assert!(matches!(e, Error::TooLarge(_)), "{e}");
    assert!(Request::decode(json.as_bytes(), Encoding::Json, &Limits::default()).is_ok());

    let limits = Limits {
        max_samples: 10,
        ..Default::default()
    };
    let e = Request::decode(&read(EBPF_PB), Encoding::Protobuf, &limits).unwrap_err();
    assert!(e.to_string().contains("more than 10 samples"), "{e}");
}

#[test]
fn garbage_truncation_and_corruption_never_panic() {
    let limits = Limits::default();
    let run = |b: &[u8], enc| {
        if let Ok(r) = Request::decode(b, enc, &limits) {
            let _ = r.convert(Id::ZERO, &limits);
        }
    };
    for g in [
        &b""[..],
        b"\x00",
        b"\xff\xff\xff",
        b"hello world",
        b"{",
        b"[]",
        b"null",
    ] {
        run(g, Encoding::Protobuf);
        run(g, Encoding::Json);
    }
    assert!(matches!(
        Request::decode(b"\x0a\xff\x01", Encoding::Protobuf, &limits),
        Err(Error::Malformed(_))
    ));
    let pb = read(EBPF_PB);
    for cut in (0..pb.len()).step_by(397) {
        run(&pb[..cut], Encoding::Protobuf);
    }
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for _ in 0..300 {
        let mut b = pb.clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % b.len() as u64) as usize;
            b[i] = (x >> 32) as u8;
        }
        run(&b, Encoding::Protobuf);
    }
    let js = read(EBPF_JSON);
    for cut in (0..js.len()).step_by(4999) {
        run(&js[..cut], Encoding::Json);
    }
}

/// `testdata/python-sdk-0.63b4.pb`: the first OTLP/HTTP request of PyPI
/// `opentelemetry-sdk-extension-profiling` 0.63b4 (with its pinned
/// `opentelemetry-proto` 1.40) profiling a small program (`main` calling
/// `hot_loop`) with `OTEL_SERVICE_NAME=pyapp`, captured by a local HTTP
/// server.
#[test]
fn python_sdk_request_is_the_v1_9_layout() {
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/python-sdk-0.63b4.pb"
    ))
    .unwrap();
    let (layout, n) = convert(&body, Encoding::Protobuf).unwrap();
    assert_eq!(layout, Layout::V1_8);
    let t = "wall:samples:count:wall:nanoseconds";
    assert!(!n.profiles.is_empty());
    for p in &n.profiles {
        assert_eq!(p.profile_type.to_string(), t);
        assert_eq!(p.labels.get("service_name"), Some("pyapp"), "{}", p.labels);
        assert!(p.labels.get("thread_name").is_some(), "{}", p.labels);
    }
    let s = stacks(&n, t);
    let hot: i64 = s
        .iter()
        .filter(|(k, _)| k.ends_with("main@;hot_loop@"))
        .map(|(_, v)| v)
        .sum();
    assert!(hot > 0 && hot * 2 > s.values().sum::<i64>(), "{s:?}");
}

proptest::proptest! {
    /// Arbitrary bytes (raw, or spliced into a valid request) are refused
    /// or converted, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        at in 0usize..1500,
    ) {
        let limits = Limits::default();
        let mut spliced = small_request(Layout::V1_8).encode_to_vec();
        let at = at.min(spliced.len());
        spliced.splice(at..at, bytes.iter().copied());
        for b in [&bytes, &spliced] {
            for enc in [Encoding::Protobuf, Encoding::Json] {
                if let Ok(r) = Request::decode(b, enc, &limits) {
                    let _ = r.convert(Id::ZERO, &limits);
                }
            }
        }
    }
}

/// Every protobuf pprof of the corpus, sent as OTLP with [`crate::from_pprof`],
/// gives the same profile types, stacks and values as the pprof itself.
#[test]
fn corpus_pprof_round_trips_through_otlp() {
    let root = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/testdata/pprof"
    ));
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.to_string_lossy().ends_with(".pb.gz") {
                files.push(p);
            }
        }
    }
    files.sort();
    let limits = fathom_pprof::Limits::default();
    let (mut checked, mut refused) = (0, Vec::new());
    for f in &files {
        let Ok(pprof) = fathom_pprof::decode(&std::fs::read(f).unwrap(), &limits) else {
            // Not a pprof Fathom accepts (the corpus holds some on purpose).
            refused.push(f.display().to_string());
            continue;
        };
        let opts = fathom_pprof::NormalizeOptions {
            labels: fathom_model::Labels::from_pairs([("service_name", "rt")]).unwrap(),
            ..Default::default()
        };
        let direct = fathom_pprof::normalize(&pprof, &opts).unwrap();
        let req = crate::from_pprof(&pprof, &[("service.name", "rt")]).unwrap();
        let (layout, via) = convert(&req.encode_to_vec(), Encoding::Protobuf)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(layout, Layout::V1_10, "{}", f.display());
        let types = |n: &Normalized| -> std::collections::BTreeSet<String> {
            n.profiles
                .iter()
                .map(|p| p.profile_type.to_string())
                .collect()
        };
        // What OTLP reads differently, by design: CPU samples counted in a
        // CPU-time period (a known one) with no CPU-time type beside them
        // (the eBPF profiler's shape) become CPU time, each count times the
        // period.
        let mut want: BTreeMap<String, BTreeMap<String, i64>> = types(&direct)
            .into_iter()
            .map(|t| {
                let st = stacks(&direct, &t);
                (t, st)
            })
            .collect();
        const COUNTS: &str = "process_cpu:samples:count:cpu:nanoseconds";
        if pprof.period > 0
            && !want.contains_key(CPU)
            && let Some(counts) = want.remove(COUNTS)
        {
            let times = counts.into_iter().map(|(k, v)| (k, v * pprof.period));
            want.insert(CPU.to_owned(), times.collect());
        }
        let got: BTreeMap<String, BTreeMap<String, i64>> = types(&via)
            .into_iter()
            .map(|t| {
                let st = stacks(&via, &t);
                (t, st)
            })
            .collect();
        assert_eq!(got, want, "{}", f.display());
        checked += 1;
    }
    assert!(
        checked >= 60,
        "only {checked} corpus files checked; refused: {refused:?}"
    );
}

/// A head that holds the stacks of `ids`, and the series it was asked
/// about.
#[derive(Debug, Default)]
struct Held {
    ids: fathom_model::IdSet,
    asked: std::sync::Mutex<Vec<fathom_model::Labels>>,
}

impl fathom_model::HeldStacks for Held {
    fn generation(&self) -> u64 {
        42
    }

    fn holds(&self, series: &fathom_model::Labels, ids: &[Id]) -> Vec<bool> {
        self.asked.lock().unwrap().push(series.clone());
        ids.iter().map(|id| self.ids.contains(id)).collect()
    }
}

/// The stacks every sample of `n` names, with their values, per profile
/// type and series.
fn samples_by_series(n: &Normalized) -> BTreeMap<(String, String), BTreeMap<Id, i64>> {
    let mut out: BTreeMap<(String, String), BTreeMap<Id, i64>> = BTreeMap::new();
    for p in &n.profiles {
        let e = out
            .entry((p.profile_type.to_string(), p.labels.to_string()))
            .or_default();
        for s in &p.samples {
            *e.entry(s.stack).or_default() += s.value;
        }
    }
    out
}

/// With the stacks a head holds, a conversion leaves them out of its
/// table (the samples still name them) and records the head's
/// generation; the head is asked about each series under its final
/// labels, the options' labels included (a cluster places a series on
/// its replicas by them), and those labels win over the resource's.
#[test]
fn held_stacks_are_left_out_and_asked_about_under_the_final_labels() {
    let body = read(EBPF_PB);
    let limits = Limits::default();
    let r = Request::decode(&body, Encoding::Protobuf, &limits).unwrap();
    let labels = fathom_model::Labels::from_pairs([("env", "prod"), ("process_pid", "1")]).unwrap();
    let opts = |held: Option<std::sync::Arc<Held>>| crate::ConvertOptions {
        seed: Id::from_u128(7),
        labels: labels.clone(),
        held: held.map(|h| h as std::sync::Arc<dyn fathom_model::HeldStacks>),
    };
    let whole = r.convert_with(&opts(None), &limits).unwrap();
    assert_eq!(whole.symbols.relies_on, None);
    for p in &whole.profiles {
        assert_eq!(p.labels.get("env"), Some("prod"), "{}", p.labels);
        assert_eq!(p.labels.get("process_pid"), Some("1"), "{}", p.labels);
    }
    // Every other stack held.
    let mut all: Vec<Id> = whole.symbols.stacks.keys().copied().collect();
    all.sort();
    assert!(all.len() > 10, "{} stacks", all.len());
    let held = std::sync::Arc::new(Held {
        ids: all.iter().step_by(2).copied().collect(),
        ..Default::default()
    });
    let part = r.convert_with(&opts(Some(held.clone())), &limits).unwrap();
    assert_eq!(part.symbols.relies_on, Some(42));
    assert_eq!(samples_by_series(&part), samples_by_series(&whole));
    let mut left: Vec<Id> = part.symbols.stacks.keys().copied().collect();
    left.sort();
    let not_held: Vec<Id> = all.iter().skip(1).step_by(2).copied().collect();
    assert_eq!(left, not_held);
    // Asked under the labels the profiles have.
    let series: std::collections::BTreeSet<String> = whole
        .profiles
        .iter()
        .map(|p| p.labels.to_string())
        .collect();
    let asked: std::collections::BTreeSet<String> = held
        .asked
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.to_string())
        .collect();
    assert_eq!(asked, series);
}

/// A request of one profile keeps the normalizer's frame index (the
/// write record's encoder then looks no frame up again); several are
/// merged into one table.
#[test]
fn one_profile_keeps_its_frame_index() {
    let (_, n) = convert(
        &small_request(Layout::V1_10).encode_to_vec(),
        Encoding::Protobuf,
    )
    .unwrap();
    assert_eq!(n.profiles.len(), 1);
    let fi = n.symbols.frame_index.as_ref().expect("a frame index");
    assert!(fi.matches(&n.symbols));
    let (_, many) = convert(&read(EBPF_PB), Encoding::Protobuf).unwrap();
    assert!(many.profiles.len() > 1);
    for p in &many.profiles {
        for s in &p.samples {
            assert!(many.symbols.stacks.contains_key(&s.stack));
        }
    }
}

/// Dense slots (a frame looked up by index) and hash map slots (past the
/// budget) build the same profiles, and a dense table answers no index
/// it was not given.
#[test]
fn dense_and_sparse_slots_convert_the_same() {
    let limits = Limits::default();
    let opts = crate::ConvertOptions {
        seed: Id::from_u128(7),
        ..Default::default()
    };
    for body in [read(EBPF_PB), small_request(Layout::V1_10).encode_to_vec()] {
        let r = Request::decode(&body, Encoding::Protobuf, &limits).unwrap();
        let dense = crate::convert::convert_slots(&r, &opts, &limits, usize::MAX).unwrap();
        let sparse = crate::convert::convert_slots(&r, &opts, &limits, 0).unwrap();
        let some = crate::convert::convert_slots(&r, &opts, &limits, 64).unwrap();
        assert!(!dense.profiles.is_empty());
        assert_eq!(dense, sparse);
        assert_eq!(dense.profiles, sparse.profiles);
        assert_eq!(some, sparse);
        assert_eq!(some.profiles, sparse.profiles);
    }
    let mut budget = 10;
    let mut s = crate::convert::Slots::new(4, &mut budget);
    assert_eq!(budget, 6);
    assert!(matches!(s, crate::convert::Slots::Dense(_)));
    s.insert(2, 9);
    assert_eq!(s.get(2), Some(9));
    for unknown in [0, 3, 4, -1, i32::MAX, i32::MIN] {
        assert_eq!(s.get(unknown), None, "{unknown}");
    }
    s.insert(7, 1);
    assert_eq!(s.get(7), None, "outside the table");
    let s = crate::convert::Slots::new(7, &mut budget);
    assert!(matches!(s, crate::convert::Slots::Sparse(_)));
    assert_eq!(budget, 6);
}
