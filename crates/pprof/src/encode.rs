//! Encoding (merged) Fathom samples as a gzip'd pprof for query output.

use std::collections::HashMap;
use std::io::Write;

use fathom_model::{Id, ProfileType, Symbols};
use fathom_proto::pprof;
use prost::Message;

/// Builds the pprof form of `samples` (one sample type, from
/// `profile_type`).
///
/// Functions, locations and mappings are numbered from 1 in order of first
/// use; the string table starts with ""; location lines keep their order
/// (inlined callee first). Ids missing from `symbols` are rendered the way
/// [`Symbols::frames`] renders them: a location or function named `?`. A
/// mapping's `has_*` flags are set when every location in it is symbolized,
/// so `go tool pprof` does not try to re-symbolize it. Samples with equal
/// stacks are kept as given (pprof allows it).
pub fn to_pprof(
    profile_type: &ProfileType,
    samples: &[(Id, i64)],
    symbols: &Symbols,
    time_nanos: i64,
    duration_nanos: i64,
    period: i64,
) -> pprof::Profile {
    let mut b = Builder::default();
    let sample_type = pprof::ValueType {
        r#type: b.string(&profile_type.sample_type),
        unit: b.string(&profile_type.sample_unit),
    };
    let period_type = pprof::ValueType {
        r#type: b.string(&profile_type.period_type),
        unit: b.string(&profile_type.period_unit),
    };
    let mut out_samples = Vec::with_capacity(samples.len());
    for &(stack, value) in samples {
        let location_id = match symbols.stacks.get(&stack) {
            Some(st) => st
                .locations
                .iter()
                .map(|l| b.location(l, symbols))
                .collect(),
            None => vec![b.unknown_location()],
        };
        out_samples.push(pprof::Sample {
            location_id,
            value: vec![value],
            label: Vec::new(),
        });
    }
    // Mapping flags: symbolized iff all its locations are.
    for (m, all) in b.mapping.iter_mut().zip(&b.mapping_symbolized) {
        m.has_functions = *all;
        m.has_filenames = *all;
        m.has_line_numbers = *all;
        m.has_inline_frames = *all;
    }
    pprof::Profile {
        sample_type: vec![sample_type],
        sample: out_samples,
        mapping: b.mapping,
        location: b.location,
        function: b.function,
        string_table: b.strings,
        time_nanos,
        duration_nanos,
        period_type: Some(period_type),
        period,
        ..Default::default()
    }
}

/// [`to_pprof`], serialized and gzip'd: what `go tool pprof` opens and what
/// the query API returns for `format=pprof`.
pub fn encode(
    profile_type: &ProfileType,
    samples: &[(Id, i64)],
    symbols: &Symbols,
    time_nanos: i64,
    duration_nanos: i64,
    period: i64,
) -> Vec<u8> {
    let p = to_pprof(
        profile_type,
        samples,
        symbols,
        time_nanos,
        duration_nanos,
        period,
    );
    gzip(&p.encode_to_vec())
}

/// Gzips `data` (fast compression: query output favors latency).
pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 4 + 64),
        flate2::Compression::fast(),
    );
    // Writing to a Vec cannot fail.
    let _ = e.write_all(data);
    e.finish().unwrap_or_default()
}

struct Builder {
    strings: Vec<String>,
    string_ix: HashMap<String, i64>,
    location: Vec<pprof::Location>,
    location_ix: HashMap<Id, u64>,
    function: Vec<pprof::Function>,
    function_ix: HashMap<Id, u64>,
    mapping: Vec<pprof::Mapping>,
    mapping_ix: HashMap<Id, u64>,
    mapping_symbolized: Vec<bool>,
    unknown_location: Option<u64>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            strings: vec![String::new()],
            string_ix: HashMap::from([(String::new(), 0)]),
            location: Vec::new(),
            location_ix: HashMap::new(),
            function: Vec::new(),
            function_ix: HashMap::new(),
            mapping: Vec::new(),
            mapping_ix: HashMap::new(),
            mapping_symbolized: Vec::new(),
            unknown_location: None,
        }
    }
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ix.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ix.insert(s.to_owned(), i);
        i
    }

    fn function(&mut self, id: &Id, symbols: &Symbols) -> u64 {
        if let Some(&i) = self.function_ix.get(id) {
            return i;
        }
        let pid = self.function.len() as u64 + 1;
        let f = match symbols.functions.get(id) {
            Some(f) => pprof::Function {
                id: pid,
                name: self.string(&f.name),
                system_name: self.string(&f.system_name),
                filename: self.string(&f.filename),
                start_line: f.start_line,
            },
            None => pprof::Function {
                id: pid,
                name: self.string("?"),
                system_name: self.string("?"),
                ..Default::default()
            },
        };
        self.function.push(f);
        self.function_ix.insert(*id, pid);
        pid
    }

    fn mapping(&mut self, id: &Id, symbols: &Symbols) -> u64 {
        if *id == Id::ZERO && !symbols.mappings.contains_key(id) {
            return 0;
        }
        if let Some(&i) = self.mapping_ix.get(id) {
            return i;
        }
        let pid = self.mapping.len() as u64 + 1;
        let m = match symbols.mappings.get(id) {
            Some(m) => pprof::Mapping {
                id: pid,
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                filename: self.string(&m.filename),
                build_id: self.string(&m.build_id),
                ..Default::default()
            },
            None => pprof::Mapping {
                id: pid,
                ..Default::default()
            },
        };
        self.mapping.push(m);
        self.mapping_symbolized.push(true);
        self.mapping_ix.insert(*id, pid);
        pid
    }

    fn location(&mut self, id: &Id, symbols: &Symbols) -> u64 {
        if let Some(&i) = self.location_ix.get(id) {
            return i;
        }
        let Some(l) = symbols.locations.get(id) else {
            let pid = self.unknown_location();
            self.location_ix.insert(*id, pid);
            return pid;
        };
        let mapping_id = self.mapping(&l.mapping, symbols);
        if mapping_id != 0 && l.lines.is_empty() {
            self.mapping_symbolized[mapping_id as usize - 1] = false;
        }
        let line = l
            .lines
            .iter()
            .map(|ln| pprof::Line {
                function_id: self.function(&ln.function, symbols),
                line: ln.line,
                column: 0,
            })
            .collect();
        let pid = self.location.len() as u64 + 1;
        self.location.push(pprof::Location {
            id: pid,
            mapping_id,
            address: l.address,
            line,
            is_folded: false,
        });
        self.location_ix.insert(*id, pid);
        pid
    }

    /// A location for ids the symbol table does not have: one line, `?`.
    fn unknown_location(&mut self) -> u64 {
        if let Some(pid) = self.unknown_location {
            return pid;
        }
        // A function id that cannot collide with a real content hash.
        let fid = {
            let pid = self.function.len() as u64 + 1;
            let name = self.string("?");
            self.function.push(pprof::Function {
                id: pid,
                name,
                system_name: name,
                ..Default::default()
            });
            pid
        };
        let pid = self.location.len() as u64 + 1;
        self.location.push(pprof::Location {
            id: pid,
            line: vec![pprof::Line {
                function_id: fid,
                line: 0,
                column: 0,
            }],
            ..Default::default()
        });
        self.unknown_location = Some(pid);
        pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, NormalizeOptions, decode, folded_lines, normalize};
    use fathom_model::{Function, Line, Location, Mapping, Stack};

    fn symbols() -> (Symbols, Vec<(Id, i64)>) {
        let mut s = Symbols::default();
        let main = s.add_function(Function {
            name: "main".into(),
            filename: "main.go".into(),
            ..Default::default()
        });
        let a = s.add_function(Function {
            name: "a".into(),
            ..Default::default()
        });
        let b = s.add_function(Function {
            name: "b".into(),
            ..Default::default()
        });
        let m = s.add_mapping(Mapping {
            memory_start: 0x1000,
            memory_limit: 0x9000,
            filename: "/bin/app".into(),
            build_id: "abc".into(),
            ..Default::default()
        });
        let l_main = s.add_location(Location {
            mapping: m,
            address: 0x1100,
            lines: vec![Line {
                function: main,
                line: 7,
            }],
        });
        let l_ab = s.add_location(Location {
            mapping: m,
            address: 0x1200,
            lines: vec![
                Line {
                    function: b,
                    line: 3,
                },
                Line {
                    function: a,
                    line: 2,
                },
            ],
        });
        let l_raw = s.add_location(Location {
            mapping: Id::ZERO,
            address: 0xbeef,
            lines: vec![],
        });
        let s1 = s.add_stack(Stack {
            locations: vec![l_ab, l_main],
        });
        let s2 = s.add_stack(Stack {
            locations: vec![l_raw, l_main],
        });
        let s3 = s.add_stack(Stack {
            locations: vec![Id::from_u128(42), l_main],
        });
        (
            s,
            vec![(s1, 10), (s2, 5), (s1, 1), (s3, 2), (Id::from_u128(7), 3)],
        )
    }

    #[test]
    fn round_trip_keeps_folded_lines() {
        let (syms, samples) = symbols();
        let ty: ProfileType = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
            .parse()
            .expect("valid type");
        let bytes = encode(&ty, &samples, &syms, 123, 456, 10);
        let p = decode(&bytes, &Limits::default()).expect("decodes");
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.time_nanos, 123);
        assert_eq!(p.duration_nanos, 456);
        assert_eq!(p.period, 10);
        // Ids are dense from 1.
        for (i, l) in p.location.iter().enumerate() {
            assert_eq!(l.id, i as u64 + 1);
        }
        let n = normalize(&p, &NormalizeOptions::default()).expect("normalizes");
        assert_eq!(n.profiles.len(), 1);
        assert_eq!(n.profiles[0].profile_type, ty);
        let got = folded_lines(
            n.profiles[0].samples.iter().map(|s| (s.stack, s.value)),
            &n.symbols,
        );
        let want = folded_lines(samples.iter().copied(), &syms);
        assert_eq!(got, want);
        assert_eq!(
            want,
            vec![
                ("?".to_string(), 3),
                ("main;0xbeef".to_string(), 5),
                ("main;?".to_string(), 2),
                ("main;a;b".to_string(), 11),
            ]
        );
        // The mapped, symbolized binary is marked as such.
        assert!(p.mapping.iter().all(|m| m.has_functions));
        // Content survives: same symbols (for what the samples use).
        let l = n
            .symbols
            .locations
            .values()
            .find(|l| l.lines.len() == 2)
            .expect("inlined");
        assert_eq!(l.address, 0x1200);
        assert_eq!(
            n.symbols
                .mappings
                .get(&l.mapping)
                .map(|m| m.build_id.as_str()),
            Some("abc")
        );
    }
}
