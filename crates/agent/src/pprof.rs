//! Building pprof profiles from aggregated stacks.
//!
//! One profile per label set per push interval: sample types `samples/count`
//! and `cpu/nanoseconds`, period type `cpu/nanoseconds`, period 1e9/hz. Each
//! code object becomes a mapping; ELF frames carry the file offset as their
//! address (mapping `[0, limit)`, file offset 0, so address = file offset
//! holds in pprof's own arithmetic), kernel and JIT frames their absolute
//! address. A frame nobody could name becomes a location with a mapping and an
//! address but no line, which is how pprof spells "unsymbolized".

use std::collections::HashMap;
use std::io::Write;

use fathom_proto::pprof;
use prost::Message;

use crate::symbolize::{FrameKey, Symbolizer};

/// Accumulates samples of one label set into one pprof `Profile`.
pub(crate) struct PprofBuilder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    mappings: Vec<pprof::Mapping>,
    mapping_ids: HashMap<u32, u64>,
    locations: Vec<pprof::Location>,
    location_ids: HashMap<FrameKey, u64>,
    functions: Vec<pprof::Function>,
    function_ids: HashMap<(i64, i64), u64>,
    samples: HashMap<Vec<u64>, i64>,
    /// Locations created without a function name.
    pub(crate) unsymbolized_locations: u64,
}

impl Default for PprofBuilder {
    fn default() -> Self {
        let mut b = PprofBuilder {
            strings: Vec::new(),
            string_ids: HashMap::new(),
            mappings: Vec::new(),
            mapping_ids: HashMap::new(),
            locations: Vec::new(),
            location_ids: HashMap::new(),
            functions: Vec::new(),
            function_ids: HashMap::new(),
            samples: HashMap::new(),
            unsymbolized_locations: 0,
        };
        b.string(""); // pprof requires string_table[0] == ""
        b
    }
}

impl PprofBuilder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), i);
        i
    }

    fn mapping(&mut self, sym: &Symbolizer, object: u32, addr: u64) -> u64 {
        if let Some(&id) = self.mapping_ids.get(&object) {
            let m = &mut self.mappings[(id - 1) as usize];
            m.memory_limit = m.memory_limit.max(addr.saturating_add(1));
            return id;
        }
        let (name, build_id, kernel) = match sym.object(object) {
            Some(o) => (o.name.clone(), o.build_id.clone(), o.is_kernel()),
            None => ("[unknown]".to_owned(), String::new(), false),
        };
        let id = self.mappings.len() as u64 + 1;
        let filename = self.string(&name);
        let build_id = self.string(&build_id);
        self.mappings.push(pprof::Mapping {
            id,
            memory_start: 0,
            memory_limit: if kernel {
                u64::MAX
            } else {
                addr.saturating_add(1)
            },
            file_offset: 0,
            filename,
            build_id,
            has_functions: false,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        });
        self.mapping_ids.insert(object, id);
        id
    }

    fn location(&mut self, sym: &mut Symbolizer, f: FrameKey) -> u64 {
        if let Some(&id) = self.location_ids.get(&f) {
            return id;
        }
        let mapping_id = self.mapping(sym, f.object, f.addr);
        let lines = sym.lines(f.object, f.addr);
        let mut out = Vec::with_capacity(lines.len());
        for l in lines.iter() {
            let name = self.string(&l.function);
            let file = self.string(&l.file);
            let function_id = match self.function_ids.get(&(name, file)) {
                Some(&id) => id,
                None => {
                    let id = self.functions.len() as u64 + 1;
                    self.functions.push(pprof::Function {
                        id,
                        name,
                        system_name: name,
                        filename: file,
                        start_line: 0,
                    });
                    self.function_ids.insert((name, file), id);
                    id
                }
            };
            out.push(pprof::Line {
                function_id,
                line: l.line,
                column: 0,
            });
        }
        let m = &mut self.mappings[(mapping_id - 1) as usize];
        if out.is_empty() {
            self.unsymbolized_locations += 1;
        } else {
            m.has_functions = true;
            m.has_filenames |= lines.iter().any(|l| !l.file.is_empty());
            m.has_line_numbers |= lines.iter().any(|l| l.line != 0);
            m.has_inline_frames |= lines.len() > 1;
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(pprof::Location {
            id,
            mapping_id,
            address: f.addr,
            line: out,
            is_folded: false,
        });
        self.location_ids.insert(f, id);
        id
    }

    /// Adds `count` samples of a stack given leaf first.
    pub(crate) fn add(&mut self, sym: &mut Symbolizer, frames: &[FrameKey], count: u64) {
        let ids: Vec<u64> = frames.iter().map(|&f| self.location(sym, f)).collect();
        *self.samples.entry(ids).or_default() += i64::try_from(count).unwrap_or(i64::MAX);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The finished profile; values are (count, count × period).
    pub(crate) fn finish(
        mut self,
        time_nanos: i64,
        duration_nanos: i64,
        period_ns: i64,
    ) -> pprof::Profile {
        let samples_s = self.string("samples");
        let count_s = self.string("count");
        let cpu_s = self.string("cpu");
        let ns_s = self.string("nanoseconds");
        let mut samples: Vec<(Vec<u64>, i64)> = self.samples.into_iter().collect();
        samples.sort(); // deterministic output
        pprof::Profile {
            sample_type: vec![
                pprof::ValueType {
                    r#type: samples_s,
                    unit: count_s,
                },
                pprof::ValueType {
                    r#type: cpu_s,
                    unit: ns_s,
                },
            ],
            sample: samples
                .into_iter()
                .map(|(location_id, n)| pprof::Sample {
                    location_id,
                    value: vec![n, n.saturating_mul(period_ns)],
                    label: vec![],
                })
                .collect(),
            mapping: self.mappings,
            location: self.locations,
            function: self.functions,
            string_table: self.strings,
            drop_frames: 0,
            keep_frames: 0,
            time_nanos,
            duration_nanos,
            period_type: Some(pprof::ValueType {
                r#type: cpu_s,
                unit: ns_s,
            }),
            period: period_ns,
            comment: vec![],
            default_sample_type: cpu_s,
            doc_url: 0,
        }
    }
}

impl PprofBuilder {
    /// The finished off-CPU profile: sample type, period type
    /// `off_cpu/nanoseconds`, values the nanoseconds off CPU summed with
    /// [`PprofBuilder::add`].
    pub(crate) fn finish_off_cpu(self, time_nanos: i64, duration_nanos: i64) -> pprof::Profile {
        let mut p = self.finish(time_nanos, duration_nanos, 1);
        let off = p.string_table.len() as i64;
        p.string_table.push("off_cpu".into());
        let ns = p.sample_type[1].unit;
        let t = pprof::ValueType {
            r#type: off,
            unit: ns,
        };
        p.period_type = Some(t);
        p.sample_type = vec![t];
        p.period = 0;
        p.default_sample_type = off;
        for s in &mut p.sample {
            s.value.truncate(1);
        }
        p
    }
}

/// Encodes a profile as gzip'd protobuf, the way pprof files are stored.
pub(crate) fn encode_gzip(p: &pprof::Profile) -> Vec<u8> {
    let raw = p.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(
        Vec::with_capacity(raw.len() / 3),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(&raw);
    gz.finish().unwrap_or(raw)
}

/// Decodes pprof bytes, gzip'd or raw; for validation of scraped profiles and tests.
pub(crate) fn decode(bytes: &[u8], max_decompressed: u64) -> Result<pprof::Profile, DecodeError> {
    use std::io::Read;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .take(max_decompressed + 1)
            .read_to_end(&mut out)
            .map_err(DecodeError::Gzip)?;
        if out.len() as u64 > max_decompressed {
            return Err(DecodeError::TooLarge(max_decompressed));
        }
        Ok(pprof::Profile::decode(out.as_slice())?)
    } else {
        Ok(pprof::Profile::decode(bytes)?)
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("gunzip: {0}")]
    Gzip(#[source] std::io::Error),
    #[error("decompressed profile is larger than {0} bytes")]
    TooLarge(u64),
    #[error("not a pprof protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::symtab::SymbolTable;

    /// Folded stacks (root first, `;`-joined) with their `samples` values;
    /// unsymbolized frames print as `0x<addr>`.
    pub(crate) fn folded(p: &pprof::Profile) -> Vec<(String, i64)> {
        let s = |i: i64| p.string_table[i as usize].clone();
        let loc = |id: u64| p.location.iter().find(|l| l.id == id).unwrap();
        let func = |id: u64| p.function.iter().find(|f| f.id == id).unwrap();
        let mut out: Vec<(String, i64)> = p
            .sample
            .iter()
            .map(|x| {
                let mut names = Vec::new();
                for &id in x.location_id.iter().rev() {
                    let l = loc(id);
                    if l.line.is_empty() {
                        names.push(format!("0x{:x}", l.address));
                    }
                    for line in l.line.iter().rev() {
                        names.push(s(func(line.function_id).name));
                    }
                }
                (names.join(";"), x.value[0])
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn builds_valid_profile() {
        let k = SymbolTable::parse_kallsyms(
            "ffffffff81000000 T do_syscall_64\nffffffff81001000 T ksys_write\n".as_bytes(),
        )
        .unwrap();
        let mut sym = Symbolizer::new(k, crate::symbolize::DEFAULT_DWARF_MAX);
        let kid = sym.kernel().id;
        let anon = sym.unknown("[anon]");
        let stack = [
            FrameKey {
                object: kid,
                addr: 0xffffffff81001010,
            },
            FrameKey {
                object: kid,
                addr: 0xffffffff81000010,
            },
            FrameKey {
                object: anon.id,
                addr: 0x7f00_0000_1234,
            },
        ];
        let mut b = PprofBuilder::default();
        b.add(&mut sym, &stack, 3);
        b.add(&mut sym, &stack, 2);
        b.add(&mut sym, &stack[1..], 1);
        assert_eq!(b.unsymbolized_locations, 1);
        let p = b.finish(1_000, 10_000_000_000, 52_631_578);
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.sample.len(), 2);
        assert_eq!(p.period, 52_631_578);
        let total: i64 = p.sample.iter().map(|s| s.value[1]).sum();
        assert_eq!(total, 6 * 52_631_578);
        assert_eq!(
            folded(&p),
            vec![
                ("0x7f0000001234;do_syscall_64".to_string(), 1),
                ("0x7f0000001234;do_syscall_64;ksys_write".to_string(), 5),
            ]
        );
        // Every reference resolves.
        for l in &p.location {
            assert!(p.mapping.iter().any(|m| m.id == l.mapping_id));
        }
        let names: Vec<&str> = p
            .mapping
            .iter()
            .map(|m| p.string_table[m.filename as usize].as_str())
            .collect();
        assert_eq!(names, vec!["[kernel.kallsyms]", "[anon]"]);
        let bytes = encode_gzip(&p);
        assert_eq!(decode(&bytes, 1 << 20).unwrap(), p);
    }

    #[test]
    fn decode_refuses_bombs_and_garbage() {
        let big = pprof::Profile {
            string_table: vec!["x".repeat(100_000)],
            ..Default::default()
        };
        let gz = encode_gzip(&big);
        assert!(matches!(
            decode(&gz, 1000),
            Err(DecodeError::TooLarge(1000))
        ));
        assert!(decode(&[0x1f, 0x8b, 1, 2, 3], 1000).is_err());
        assert!(decode(b"\xff\xff\xff garbage", 1000).is_err());
    }
}
