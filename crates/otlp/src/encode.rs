//! pprof into an OTLP request: the inverse of [`crate::Request::convert`]
//! for what pprof can say, so that benchmarks and tests can send the same
//! profiles over OTLP as over `/ingest`.
//!
//! The request is in the v1.10 layout, with one OTLP profile per pprof
//! sample type and the dictionary's index 0 of every table the zero value,
//! as the spec reserves it. String sample labels become sample attributes;
//! numeric labels (which Fathom drops from pprof too) are left out.

use std::collections::HashMap;

use fathom_proto::pprof;

use crate::wire::{self, AnyValue, KeyValue, Value};

/// Builds a dictionary whose every table starts with its zero value.
struct Dict {
    d: wire::ProfilesDictionary,
    strings: HashMap<String, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, String), i32>,
}

impl Dict {
    fn new() -> Self {
        let mut d = Dict {
            d: wire::ProfilesDictionary {
                mapping_table: vec![wire::Mapping::default()],
                location_table: vec![wire::Location::default()],
                function_table: vec![wire::Function::default()],
                string_table: Vec::new(),
                attribute_table: vec![wire::KeyValueAndUnit::default()],
                stack_table: vec![wire::Stack::default()],
            },
            strings: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
        };
        d.str("");
        d
    }

    fn str(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = index(self.d.string_table.len());
        self.d.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: &str) -> i32 {
        let key = self.str(key);
        if let Some(&i) = self.attributes.get(&(key, value.to_owned())) {
            return i;
        }
        let i = index(self.d.attribute_table.len());
        self.d.attribute_table.push(wire::KeyValueAndUnit {
            key_strindex: key,
            value: Some(string_value(value)),
        });
        self.attributes.insert((key, value.to_owned()), i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = index(self.d.stack_table.len());
        self.d.stack_table.push(wire::Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }
}

/// A table index; tables are built from a pprof that fits in memory, far
/// below `i32::MAX` entries.
fn index(len: usize) -> i32 {
    i32::try_from(len).expect("an OTLP dictionary table over i32::MAX entries")
}

fn string_value(s: &str) -> AnyValue {
    AnyValue {
        value: Some(Value::StringValue(s.to_owned())),
    }
}

/// Why a pprof could not be expressed as OTLP.
#[derive(Debug, thiserror::Error)]
#[error("this pprof cannot be sent as OTLP: {0}")]
pub struct EncodeError(String);

/// `p` as one OTLP request from a resource with `resource` attributes
/// (for example `service.name`). `p` is expected to be valid
/// ([`fathom_pprof::validate`]); dangling ids are refused.
pub fn from_pprof(
    p: &pprof::Profile,
    resource: &[(&str, &str)],
) -> Result<wire::ExportProfilesServiceRequest, EncodeError> {
    let s = |i: i64| -> Result<&str, EncodeError> {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .map(String::as_str)
            .ok_or_else(|| EncodeError(format!("string index {i} is out of the string table")))
    };
    let mut d = Dict::new();

    let mut mappings = HashMap::new();
    for m in &p.mapping {
        let mut attribute_indices = Vec::new();
        let build_id = s(m.build_id)?;
        if !build_id.is_empty() {
            attribute_indices.push(d.attribute(crate::convert::BUILD_ID_GNU, build_id));
        }
        let filename_strindex = d.str(s(m.filename)?);
        mappings.insert(m.id, index(d.d.mapping_table.len()));
        d.d.mapping_table.push(wire::Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex,
            attribute_indices,
        });
    }
    let mut functions = HashMap::new();
    for f in &p.function {
        let function = wire::Function {
            name_strindex: d.str(s(f.name)?),
            system_name_strindex: d.str(s(f.system_name)?),
            filename_strindex: d.str(s(f.filename)?),
            start_line: f.start_line,
        };
        functions.insert(f.id, index(d.d.function_table.len()));
        d.d.function_table.push(function);
    }
    let mut locations = HashMap::new();
    for l in &p.location {
        let mapping_index = match l.mapping_id {
            0 => 0,
            id => *mappings
                .get(&id)
                .ok_or_else(|| EncodeError(format!("location {} has no mapping {id}", l.id)))?,
        };
        let mut lines = Vec::with_capacity(l.line.len());
        for line in &l.line {
            let function_index = *functions.get(&line.function_id).ok_or_else(|| {
                EncodeError(format!(
                    "location {} has no function {}",
                    l.id, line.function_id
                ))
            })?;
            lines.push(wire::Line {
                function_index,
                line: line.line,
            });
        }
        locations.insert(l.id, index(d.d.location_table.len()));
        d.d.location_table.push(wire::Location {
            mapping_index,
            address: l.address,
            lines,
        });
    }

    // The samples once: their stacks and attributes are shared by every
    // sample type.
    let mut shared = Vec::with_capacity(p.sample.len());
    for (k, sample) in p.sample.iter().enumerate() {
        let mut stack = Vec::with_capacity(sample.location_id.len());
        for id in &sample.location_id {
            stack.push(
                *locations
                    .get(id)
                    .ok_or_else(|| EncodeError(format!("sample {k} has no location {id}")))?,
            );
        }
        let mut attributes = Vec::new();
        for label in &sample.label {
            if label.str != 0 {
                attributes.push(i64::from(d.attribute(s(label.key)?, s(label.str)?)));
            }
        }
        shared.push((d.stack(stack), attributes));
    }

    let period_type = match &p.period_type {
        Some(v) => Some(wire::ValueType {
            type_strindex: d.str(s(v.r#type)?),
            unit_strindex: d.str(s(v.unit)?),
        }),
        None => None,
    };
    let mut profiles = Vec::with_capacity(p.sample_type.len());
    for (t, st) in p.sample_type.iter().enumerate() {
        let sample_type = wire::ValueType {
            type_strindex: d.str(s(st.r#type)?),
            unit_strindex: d.str(s(st.unit)?),
        };
        let samples = p
            .sample
            .iter()
            .zip(&shared)
            .filter_map(|(sample, (stack_index, attributes))| {
                let value = *sample.value.get(t)?;
                Some(wire::Sample {
                    stack_index: *stack_index,
                    field2: attributes.clone(),
                    field3: Vec::new(),
                    field4: vec![value],
                    timestamps_unix_nano: Vec::new(),
                })
            })
            .collect();
        profiles.push(wire::Profile {
            sample_type: Some(sample_type),
            samples,
            time_unix_nano: u64::try_from(p.time_nanos).unwrap_or(0),
            duration_nano: u64::try_from(p.duration_nanos).unwrap_or(0),
            period_type: period_type.clone(),
            period: p.period,
        });
    }

    Ok(wire::ExportProfilesServiceRequest {
        resource_profiles: vec![wire::ResourceProfiles {
            resource: Some(wire::Resource {
                attributes: resource
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: (*k).to_owned(),
                        value: Some(string_value(v)),
                    })
                    .collect(),
            }),
            scope_profiles: vec![wire::ScopeProfiles {
                scope: None,
                profiles,
            }],
        }],
        dictionary: Some(d.d),
    })
}
