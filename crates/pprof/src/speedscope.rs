//! speedscope JSON (`https://www.speedscope.app/file-format-schema.json`),
//! as Pyroscope's `/ingest?format=speedscope` accepts it: sampled and
//! evented profiles over a shared frame table.
//!
//! Each speedscope profile becomes samples labelled `profile_name=<name>`
//! (profiles with the same name and unit are one series, as Pyroscope
//! merges them). Time units become `process_cpu:cpu:nanoseconds:cpu:nanoseconds`
//! with values converted to nanoseconds (`none` counts samples at the
//! sample rate, 100 Hz by default, like Pyroscope); `bytes` becomes
//! `memory:inuse_space:bytes:space:bytes`.

use std::collections::HashMap;

use fathom_model::{Id, Labels};
use fathom_proto::pprof;
use serde::Deserialize;

use crate::normalize::{NormalizeOptions, Normalized, normalize};
use crate::{DEFAULT_SAMPLE_RATE, Limits, NormalizeError};

/// The schema URL every speedscope file names.
pub const SPEEDSCOPE_SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// How to interpret a speedscope upload.
#[derive(Clone, Debug, Default)]
pub struct SpeedscopeOptions {
    /// Series labels for every profile, including `service_name`.
    pub labels: Labels,
    /// Samples per second for unit `none` (default 100).
    pub sample_rate: Option<u32>,
    /// The profile's timestamp; 0 leaves it for the caller to fill.
    pub time_nanos: i64,
    /// How long the profile covers, in nanoseconds (0 if unknown).
    pub duration_nanos: i64,
    /// Seeds the profile ids (see [`NormalizeOptions::profile_id_seed`]).
    pub profile_id_seed: Id,
}

/// Why a speedscope file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpeedscopeError {
    /// Not JSON of the speedscope shape.
    #[error("not a speedscope file: {0}")]
    Json(#[source] serde_json::Error),
    /// `$schema` is missing or not speedscope's.
    #[error("\"$schema\" is {0:?}, not {SPEEDSCOPE_SCHEMA:?}")]
    Schema(String),
    /// A profile's `type` is neither `sampled` nor `evented`.
    #[error("profile {profile}: type {ty:?} is not sampled or evented")]
    UnknownType { profile: usize, ty: String },
    /// A profile's `unit` is not one speedscope defines.
    #[error(
        "profile {profile}: unit {unit:?} is not none, nanoseconds, microseconds, milliseconds, seconds or bytes"
    )]
    UnknownUnit { profile: usize, unit: String },
    /// A frame index outside `shared.frames`.
    #[error("profile {profile}: frame {frame} does not exist (shared.frames has {len})")]
    Frame {
        profile: usize,
        frame: i64,
        len: usize,
    },
    /// `samples` and `weights` differ in length.
    #[error("profile {profile}: {samples} samples but {weights} weights")]
    Lengths {
        profile: usize,
        samples: usize,
        weights: usize,
    },
    /// A weight or time that is negative, not finite or too large.
    #[error("profile {profile}: {what} {value} is not a valid value")]
    Value {
        profile: usize,
        what: &'static str,
        value: f64,
    },
    /// Evented profiles: events must not go back in time, and close the
    /// innermost open frame.
    #[error("profile {profile}, event {event}: {msg}")]
    Event {
        profile: usize,
        event: usize,
        msg: String,
    },
    /// More samples or frames than the limits allow.
    #[error("the speedscope file has more than {limit} {what}")]
    LimitExceeded { what: &'static str, limit: usize },
    /// Normalization refused the result.
    #[error(transparent)]
    Normalize(#[from] NormalizeError),
}

#[derive(Deserialize)]
struct File {
    #[serde(rename = "$schema", default)]
    schema: String,
    shared: Shared,
    #[serde(default)]
    profiles: Vec<Profile>,
}

#[derive(Deserialize)]
struct Shared {
    frames: Vec<Frame>,
}

#[derive(Deserialize)]
struct Frame {
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Profile {
    #[serde(rename = "type")]
    ty: String,
    #[serde(default)]
    name: String,
    unit: String,
    #[serde(default)]
    start_value: f64,
    #[serde(default)]
    samples: Vec<Vec<i64>>,
    #[serde(default)]
    weights: Vec<f64>,
    #[serde(default)]
    events: Vec<Event>,
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    ty: String,
    frame: i64,
    at: f64,
}

/// Accumulates (stack, profile name) → value for one output pprof.
#[derive(Default)]
struct Out {
    samples: HashMap<(Vec<u64>, i64), i64>,
}

/// Parses a speedscope file into Fathom profiles (see the module docs).
pub fn parse_speedscope(
    body: &[u8],
    opts: &SpeedscopeOptions,
    limits: &Limits,
) -> Result<Normalized, SpeedscopeError> {
    if body.len() > limits.max_decompressed_bytes {
        return Err(SpeedscopeError::LimitExceeded {
            what: "bytes",
            limit: limits.max_decompressed_bytes,
        });
    }
    // Each sample is a JSON array that decodes to a heap-allocated vector
    // (~12× its smallest text, `[0],`): bound them before decoding. `[`
    // inside names counts too, so this can only over-count.
    let arrays = body.iter().filter(|&&c| c == b'[').count();
    if arrays > limits.max_samples.saturating_add(16) {
        return Err(SpeedscopeError::LimitExceeded {
            what: "samples",
            limit: limits.max_samples,
        });
    }
    let file: File = serde_json::from_slice(body).map_err(SpeedscopeError::Json)?;
    if file.schema != SPEEDSCOPE_SCHEMA {
        return Err(SpeedscopeError::Schema(file.schema));
    }
    let nframes = file.shared.frames.len();
    if nframes > limits.max_functions {
        return Err(SpeedscopeError::LimitExceeded {
            what: "frames",
            limit: limits.max_functions,
        });
    }
    // Strings: "" then frame names (index i + 1), then labels and types.
    let mut strings: Vec<String> = vec![String::new()];
    strings.extend(file.shared.frames.iter().map(|f| f.name.clone()));
    let mut string_ix: HashMap<String, i64> = HashMap::from([(String::new(), 0)]);
    let mut intern = |strings: &mut Vec<String>, s: &str| -> i64 {
        if let Some(&i) = string_ix.get(s) {
            return i;
        }
        strings.push(s.to_owned());
        let i = strings.len() as i64 - 1;
        string_ix.insert(s.to_owned(), i);
        i
    };
    let rate = f64::from(opts.sample_rate.unwrap_or(DEFAULT_SAMPLE_RATE).max(1));
    // [time, bytes]
    let mut outs = [Out::default(), Out::default()];
    let mut total = 0usize;
    for (pi, p) in file.profiles.iter().enumerate() {
        let (slot, scale) = match p.unit.as_str() {
            "none" => (0, 1e9 / rate),
            "nanoseconds" => (0, 1.0),
            "microseconds" => (0, 1e3),
            "milliseconds" => (0, 1e6),
            "seconds" => (0, 1e9),
            "bytes" => (1, 1.0),
            u => {
                return Err(SpeedscopeError::UnknownUnit {
                    profile: pi,
                    unit: u.to_owned(),
                });
            }
        };
        let name = intern(&mut strings, &p.name);
        let out = &mut outs[slot];
        let value = |what, v: f64| -> Result<i64, SpeedscopeError> {
            let x = (v * scale).round();
            if !x.is_finite() || x < 0.0 || x >= i64::MAX as f64 {
                return Err(SpeedscopeError::Value {
                    profile: pi,
                    what,
                    value: v,
                });
            }
            Ok(x as i64)
        };
        let location = |f: i64| -> Result<u64, SpeedscopeError> {
            usize::try_from(f)
                .ok()
                .filter(|&i| i < nframes)
                .map(|i| i as u64 + 1)
                .ok_or(SpeedscopeError::Frame {
                    profile: pi,
                    frame: f,
                    len: nframes,
                })
        };
        let mut add = |out: &mut Out, root_first: &[u64], v: i64| -> Result<(), SpeedscopeError> {
            if v == 0 || root_first.is_empty() {
                return Ok(());
            }
            let key = (root_first.iter().rev().copied().collect::<Vec<u64>>(), name);
            if !out.samples.contains_key(&key) {
                total += 1;
                if total > limits.max_samples {
                    return Err(SpeedscopeError::LimitExceeded {
                        what: "samples",
                        limit: limits.max_samples,
                    });
                }
            }
            let e = out.samples.entry(key).or_default();
            *e = e.saturating_add(v);
            Ok(())
        };
        match p.ty.as_str() {
            "sampled" => {
                if p.samples.len() != p.weights.len() {
                    return Err(SpeedscopeError::Lengths {
                        profile: pi,
                        samples: p.samples.len(),
                        weights: p.weights.len(),
                    });
                }
                let mut stack = Vec::new();
                for (s, &w) in p.samples.iter().zip(&p.weights) {
                    stack.clear();
                    for &f in s {
                        stack.push(location(f)?);
                    }
                    add(out, &stack, value("weight", w)?)?;
                }
            }
            "evented" => {
                let mut last = p.start_value;
                let mut open: Vec<u64> = Vec::new();
                for (ei, ev) in p.events.iter().enumerate() {
                    let bad = |msg: String| SpeedscopeError::Event {
                        profile: pi,
                        event: ei,
                        msg,
                    };
                    if !ev.at.is_finite() || ev.at < last {
                        return Err(bad(format!(
                            "events out of order: at {} is before {last}",
                            ev.at
                        )));
                    }
                    let loc = location(ev.frame)?;
                    add(out, &open, value("time", ev.at - last)?)?;
                    match ev.ty.as_str() {
                        "O" => open.push(loc),
                        "C" => match open.last() {
                            Some(&top) if top == loc => {
                                open.pop();
                            }
                            Some(&top) => {
                                return Err(bad(format!(
                                    "closes frame {} but frame {} is the innermost open one",
                                    ev.frame,
                                    top - 1
                                )));
                            }
                            None => {
                                return Err(bad(format!(
                                    "closes frame {} but no frame is open",
                                    ev.frame
                                )));
                            }
                        },
                        t => return Err(bad(format!("event type {t:?} is not O or C"))),
                    }
                    last = ev.at;
                }
                if let Some(&top) = open.last() {
                    return Err(SpeedscopeError::Event {
                        profile: pi,
                        event: p.events.len(),
                        msg: format!("frame {} is opened but never closed", top - 1),
                    });
                }
            }
            t => {
                return Err(SpeedscopeError::UnknownType {
                    profile: pi,
                    ty: t.to_owned(),
                });
            }
        }
    }

    let function: Vec<pprof::Function> = (1..=nframes as u64)
        .map(|id| pprof::Function {
            id,
            name: id as i64,
            system_name: id as i64,
            ..Default::default()
        })
        .collect();
    let location: Vec<pprof::Location> = (1..=nframes as u64)
        .map(|id| pprof::Location {
            id,
            line: vec![pprof::Line {
                function_id: id,
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    let label_key = intern(&mut strings, "profile_name");
    let nopts = NormalizeOptions {
        labels: opts.labels.clone(),
        time_nanos_override: Some(opts.time_nanos),
        duration_nanos_override: Some(opts.duration_nanos),
        profile_id_seed: opts.profile_id_seed,
        ..Default::default()
    };
    let mut result = Normalized::default();
    for (slot, out) in outs.into_iter().enumerate() {
        if out.samples.is_empty() {
            continue;
        }
        let (st, su, pt, pu, period) = if slot == 0 {
            (
                "cpu",
                "nanoseconds",
                "cpu",
                "nanoseconds",
                (1e9 / rate) as i64,
            )
        } else {
            ("inuse_space", "bytes", "space", "bytes", 1)
        };
        let mut strings = strings.clone();
        let mut s = |x: &str| {
            strings.push(x.to_owned());
            strings.len() as i64 - 1
        };
        let sample_type = vec![pprof::ValueType {
            r#type: s(st),
            unit: s(su),
        }];
        let period_type = Some(pprof::ValueType {
            r#type: s(pt),
            unit: s(pu),
        });
        let mut samples: Vec<((Vec<u64>, i64), i64)> = out.samples.into_iter().collect();
        samples.sort();
        let p = pprof::Profile {
            sample_type,
            sample: samples
                .into_iter()
                .map(|((stack, name), v)| pprof::Sample {
                    location_id: stack,
                    value: vec![v],
                    label: if strings_is_empty(name) {
                        Vec::new()
                    } else {
                        vec![pprof::Label {
                            key: label_key,
                            str: name,
                            ..Default::default()
                        }]
                    },
                })
                .collect(),
            location: location.clone(),
            function: function.clone(),
            string_table: strings,
            period_type,
            period,
            ..Default::default()
        };
        let n = normalize(&p, &nopts)?;
        result.profiles.extend(n.profiles);
        let sy = n.symbols;
        result.symbols.stacks.extend(sy.stacks);
        result.symbols.locations.extend(sy.locations);
        result.symbols.functions.extend(sy.functions);
        result.symbols.mappings.extend(sy.mappings);
    }
    Ok(result)
}

/// String 0 is the empty name: no `profile_name` label.
fn strings_is_empty(index: i64) -> bool {
    index == 0
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

    fn folded(n: &Normalized) -> BTreeMap<(String, String, String), i64> {
        let mut out = BTreeMap::new();
        for p in &n.profiles {
            for s in &p.samples {
                let stack = n.symbols.frames_by(&s.stack, |f| f.name.clone()).join(";");
                *out.entry((
                    p.profile_type.to_string(),
                    p.labels.get("profile_name").unwrap_or("").to_owned(),
                    stack,
                ))
                .or_default() += s.value;
            }
        }
        out
    }

    fn file(rel: &str) -> Vec<u8> {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/testdata/other/speedscope")
            .join(rel);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

    #[test]
    fn evented_profiles_attribute_time_between_events() {
        let n = parse_speedscope(
            &file("grafana+pyroscope/pkg/og/convert/speedscope/testdata/simple.speedscope.json"),
            &SpeedscopeOptions::default(),
            &Limits::default(),
        )
        .unwrap();
        // Pyroscope: a;b 500, a;b;c 500, a;b;d 400 samples at 10,000 Hz
        // (unit none is 100 Hz samples × 100): 1e5 ns each.
        let f = folded(&n);
        let get = |s: &str| f[&(CPU.to_owned(), "simple.txt".to_owned(), s.to_owned())];
        assert_eq!(get("a;b"), 500 * 100_000);
        assert_eq!(get("a;b;c"), 500 * 100_000);
        assert_eq!(get("a;b;d"), 400 * 100_000);
        assert_eq!(f.len(), 3);
    }

    #[test]
    fn sampled_profiles_split_by_name_and_merge_duplicates() {
        let n = parse_speedscope(
            &file(
                "grafana+pyroscope/pkg/og/convert/speedscope/testdata/two-sampled.speedscope.json",
            ),
            &SpeedscopeOptions::default(),
            &Limits::default(),
        )
        .unwrap();
        let f = folded(&n);
        for name in ["one", "two"] {
            let get = |s: &str| f[&(CPU.to_owned(), name.to_owned(), s.to_owned())];
            // Pyroscope: a;b 500, a;b;c 500, a;b;d 400 samples at 100 Hz.
            assert_eq!(get("a;b"), 5_000_000_000);
            assert_eq!(get("a;b;c"), 5_000_000_000);
            assert_eq!(get("a;b;d"), 4_000_000_000);
        }
        assert_eq!(n.profiles.len(), 2);

        let n = parse_speedscope(
            &file(
                "grafana+pyroscope/pkg/og/convert/speedscope/testdata/duplicates.speedscope.json",
            ),
            &SpeedscopeOptions::default(),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(n.profiles.len(), 1);
        let f = folded(&n);
        let total: i64 = f.values().sum();
        // Pyroscope: 1500 + 1500 + 1200 samples of 10 ms.
        assert_eq!(total, 4200 * 10_000_000);

        let n = parse_speedscope(
            &file("grafana+pyroscope/pkg/og/convert/speedscope/testdata/two-sampled-bytes.speedscope.json"),
            &SpeedscopeOptions::default(),
            &Limits::default(),
        )
        .unwrap();
        assert!(
            n.profiles
                .iter()
                .all(|p| p.profile_type.to_string() == "memory:inuse_space:bytes:space:bytes")
        );
    }

    #[test]
    fn speedscope_samples_agree_across_versions() {
        let a = parse_speedscope(
            &file("jlfwong+speedscope/sample/profiles/speedscope/0.0.1/simple.speedscope.json"),
            &SpeedscopeOptions::default(),
            &Limits::default(),
        )
        .unwrap();
        let b = parse_speedscope(
            &file("jlfwong+speedscope/sample/profiles/speedscope/0.0.1/simple-no-pretty-print.speedscope.json"),
            &SpeedscopeOptions::default(),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!(folded(&a), folded(&b));
        assert!(!a.profiles.is_empty());
        let c = parse_speedscope(
            &file("jlfwong+speedscope/sample/profiles/speedscope/0.1.2/simple-sampled.speedscope.json"),
            &SpeedscopeOptions::default(),
            &Limits::default(),
        )
        .unwrap();
        let total: i64 = folded(&c).values().sum();
        assert_eq!(total, 14_000_000_000);
    }

    #[test]
    fn invalid_files_name_the_problem() {
        let l = Limits::default();
        let o = SpeedscopeOptions::default();
        let e = parse_speedscope(
            &file("jlfwong+speedscope/sample/profiles/speedscope/invalid/out-of-order-events.json"),
            &o,
            &l,
        )
        .unwrap_err();
        assert!(e.to_string().contains("innermost open"), "{e}");
        let e = parse_speedscope(
            &file("jlfwong+speedscope/sample/profiles/speedscope/invalid/incomplete-trace.json"),
            &o,
            &l,
        )
        .unwrap_err();
        assert!(e.to_string().contains("never closed"), "{e}");
        for (body, needle) in [
            (&b"{"[..], "not a speedscope file"),
            (br#"{"$schema":"x","shared":{"frames":[]},"profiles":[]}"#, "$schema"),
            (
                br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"a"}]},"profiles":[{"type":"sampled","unit":"parsecs","samples":[[0]],"weights":[1]}]}"#,
                "unit",
            ),
            (
                br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"a"}]},"profiles":[{"type":"sampled","unit":"none","samples":[[3]],"weights":[1]}]}"#,
                "frame 3 does not exist",
            ),
            (
                br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"a"}]},"profiles":[{"type":"sampled","unit":"none","samples":[[0]],"weights":[-1]}]}"#,
                "weight -1",
            ),
            (
                br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"a"}]},"profiles":[{"type":"sampled","unit":"none","samples":[[0]],"weights":[]}]}"#,
                "1 samples but 0 weights",
            ),
        ] {
            let e = parse_speedscope(body, &o, &l).unwrap_err();
            assert!(e.to_string().contains(needle), "{needle}: {e}");
        }
        let limits = Limits {
            max_samples: 1,
            ..Limits::default()
        };
        let many = format!(
            r#"{{"$schema":"{SPEEDSCOPE_SCHEMA}","shared":{{"frames":[{{"name":"a"}}]}},"profiles":[{{"type":"sampled","unit":"none","samples":[{}[0]],"weights":[1]}}]}}"#,
            "[0],".repeat(100)
        );
        let e = parse_speedscope(many.as_bytes(), &o, &limits).unwrap_err();
        assert!(e.to_string().contains("more than 1 samples"), "{e}");
        let e = parse_speedscope(
            &file(
                "grafana+pyroscope/pkg/og/convert/speedscope/testdata/two-sampled.speedscope.json",
            ),
            &o,
            &limits,
        )
        .unwrap_err();
        assert!(matches!(e, SpeedscopeError::LimitExceeded { .. }), "{e}");
    }
}
