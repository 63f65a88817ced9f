//! OTLP/JSON: the protobuf JSON mapping of the same messages
//! (lowerCamelCase names, the proto names accepted too; 64-bit integers as
//! strings or numbers; unknown fields ignored), decoded into the
//! [`crate::wire`] types with the v1.10 meaning of `Sample` (JSON names the
//! fields, so both layouts read the same).
//!
//! Decoding is bounded: every list element is charged against a budget of
//! decoded bytes, so a small JSON document cannot expand into a large
//! allocation. Fields of layouts before v1.8 (`locationsStartIndex`,
//! `locationIndices`, several sample types, ...) are recognized and refused.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::size_of;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, SeqAccess, Visitor};

use crate::wire;
use crate::{Error, Limits};

thread_local! {
    /// Bytes that decoding may still allocate on this thread.
    static BUDGET: Cell<usize> = const { Cell::new(0) };
    /// Set when the budget ran out (to tell that error from bad JSON).
    static EXHAUSTED: Cell<bool> = const { Cell::new(false) };
}

fn charge<E: de::Error>(n: usize) -> Result<(), E> {
    BUDGET.with(|b| {
        let left = b.get();
        if left < n {
            EXHAUSTED.with(|e| e.set(true));
            Err(E::custom("decoded request over the memory limit"))
        } else {
            b.set(left - n);
            Ok(())
        }
    })
}

/// A list whose elements are charged to the budget as they are decoded.
struct Seq<T>(Vec<T>);

impl<T> Default for Seq<T> {
    fn default() -> Self {
        Seq(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Seq<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Seq<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Seq::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element()? {
                    charge::<A::Error>(size_of::<T>())?;
                    v.push(x);
                }
                Ok(Seq(v))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// An integer sent as a JSON number or a decimal string.
#[derive(Default, Clone, Copy)]
struct Num<T>(T);

impl<'de, T> Deserialize<'de> for Num<T>
where
    T: TryFrom<i64> + TryFrom<u64> + std::str::FromStr + Default,
{
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<T> Visitor<'_> for V<T>
        where
            T: TryFrom<i64> + TryFrom<u64> + std::str::FromStr + Default,
        {
            type Value = Num<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer (a number or a decimal string)")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                T::try_from(v)
                    .map(Num)
                    .map_err(|_| E::custom(format!("integer {v} out of range")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                T::try_from(v)
                    .map(Num)
                    .map_err(|_| E::custom(format!("integer {v} out of range")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                if v.fract() == 0.0 && v.abs() < 9.0e15 {
                    self.visit_i64(v as i64)
                } else {
                    Err(E::custom(format!("{v} is not an integer")))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                v.parse::<T>()
                    .map(Num)
                    .map_err(|_| E::custom(format!("{v:?} is not an integer")))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Num(T::default()))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

fn nums<T: Copy>(s: Seq<Num<T>>) -> Vec<T> {
    s.0.into_iter().map(|n| n.0).collect()
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Request {
    #[serde(alias = "resource_profiles")]
    resource_profiles: Seq<ResourceProfiles>,
    dictionary: Option<Dictionary>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Dictionary {
    #[serde(alias = "mapping_table")]
    mapping_table: Seq<Mapping>,
    #[serde(alias = "location_table")]
    location_table: Seq<Location>,
    #[serde(alias = "function_table")]
    function_table: Seq<Function>,
    #[serde(alias = "string_table")]
    string_table: Seq<Option<String>>,
    #[serde(alias = "attribute_table")]
    attribute_table: Seq<KeyValueAndUnit>,
    #[serde(alias = "stack_table")]
    stack_table: Seq<Stack>,
    #[serde(alias = "attribute_units")]
    attribute_units: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ResourceProfiles {
    resource: Option<Attributes>,
    #[serde(alias = "scope_profiles")]
    scope_profiles: Seq<ScopeProfiles>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ScopeProfiles {
    scope: Option<Attributes>,
    profiles: Seq<Profile>,
}

/// A resource or an instrumentation scope: only the attributes are read.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Attributes {
    attributes: Seq<KeyValue>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct KeyValue {
    key: Option<String>,
    value: Option<AnyValue>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct AnyValue {
    #[serde(alias = "string_value")]
    string_value: Option<String>,
    #[serde(alias = "bool_value")]
    bool_value: Option<bool>,
    #[serde(alias = "int_value")]
    int_value: Option<Num<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Profile {
    /// One value type; a list is the layout before v1.8.
    #[serde(alias = "sample_type")]
    sample_type: Option<serde_json::Value>,
    /// `sample` before v1.9.
    #[serde(alias = "sample")]
    samples: Seq<Sample>,
    #[serde(alias = "time_unix_nano")]
    time_unix_nano: Num<u64>,
    #[serde(alias = "duration_nano")]
    duration_nano: Num<u64>,
    #[serde(alias = "period_type")]
    period_type: Option<ValueType>,
    period: Num<i64>,
    // Fields of the layouts before v1.8.
    #[serde(alias = "location_indices")]
    location_indices: Option<IgnoredAny>,
    #[serde(alias = "time_nanos")]
    time_nanos: Option<IgnoredAny>,
    #[serde(alias = "string_table")]
    string_table: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ValueType {
    #[serde(alias = "type_strindex")]
    type_strindex: Num<i32>,
    #[serde(alias = "unit_strindex")]
    unit_strindex: Num<i32>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Sample {
    #[serde(alias = "stack_index")]
    stack_index: Num<i32>,
    values: Seq<Num<i64>>,
    #[serde(alias = "attribute_indices")]
    attribute_indices: Seq<Num<i32>>,
    #[serde(alias = "link_index")]
    link_index: Num<i32>,
    #[serde(alias = "timestamps_unix_nano")]
    timestamps_unix_nano: Seq<Num<u64>>,
    // Fields of the layouts before v1.8.
    #[serde(alias = "locations_start_index")]
    locations_start_index: Option<IgnoredAny>,
    #[serde(alias = "locations_length")]
    locations_length: Option<IgnoredAny>,
    value: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Mapping {
    #[serde(alias = "memory_start")]
    memory_start: Num<u64>,
    #[serde(alias = "memory_limit")]
    memory_limit: Num<u64>,
    #[serde(alias = "file_offset")]
    file_offset: Num<u64>,
    #[serde(alias = "filename_strindex")]
    filename_strindex: Num<i32>,
    #[serde(alias = "attribute_indices")]
    attribute_indices: Seq<Num<i32>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Stack {
    #[serde(alias = "location_indices")]
    location_indices: Seq<Num<i32>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Location {
    #[serde(alias = "mapping_index")]
    mapping_index: Num<i32>,
    address: Num<u64>,
    /// `line` before v1.9.
    #[serde(alias = "line")]
    lines: Seq<Line>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Line {
    #[serde(alias = "function_index")]
    function_index: Num<i32>,
    line: Num<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Function {
    #[serde(alias = "name_strindex")]
    name_strindex: Num<i32>,
    #[serde(alias = "system_name_strindex")]
    system_name_strindex: Num<i32>,
    #[serde(alias = "filename_strindex")]
    filename_strindex: Num<i32>,
    #[serde(alias = "start_line")]
    start_line: Num<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct KeyValueAndUnit {
    #[serde(alias = "key_strindex")]
    key_strindex: Num<i32>,
    value: Option<AnyValue>,
    /// The string key of v1.7's `KeyValue`.
    key: Option<IgnoredAny>,
}

fn legacy(why: &'static str) -> Error {
    Error::Legacy(why)
}

impl AnyValue {
    fn into_wire(self) -> wire::AnyValue {
        let value = if let Some(s) = self.string_value {
            Some(wire::Value::StringValue(s))
        } else if let Some(i) = self.int_value {
            Some(wire::Value::IntValue(i.0))
        } else {
            self.bool_value.map(wire::Value::BoolValue)
        };
        wire::AnyValue { value }
    }
}

fn key_values(a: Option<Attributes>) -> Vec<wire::KeyValue> {
    a.map(|a| a.attributes.0)
        .unwrap_or_default()
        .into_iter()
        .map(|kv| wire::KeyValue {
            key: kv.key.unwrap_or_default(),
            value: kv.value.map(AnyValue::into_wire),
        })
        .collect()
}

fn value_type(v: ValueType) -> wire::ValueType {
    wire::ValueType {
        type_strindex: v.type_strindex.0,
        unit_strindex: v.unit_strindex.0,
    }
}

fn profile(p: Profile) -> Result<wire::Profile, Error> {
    if p.location_indices.is_some() || p.time_nanos.is_some() || p.string_table.is_some() {
        return Err(legacy(
            "a Profile has locationIndices, timeNanos or its own tables, fields of v1.7 and earlier",
        ));
    }
    let sample_type = match p.sample_type {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Array(_)) => {
            return Err(legacy(
                "a Profile has a list of sample types, where v1.8+ has exactly one",
            ));
        }
        Some(v) => Some(value_type(
            ValueType::deserialize(v).map_err(|e| Error::Json(format!("sampleType: {e}")))?,
        )),
    };
    let mut samples = Vec::with_capacity(p.samples.0.len());
    for s in p.samples.0 {
        if s.locations_start_index.is_some() || s.locations_length.is_some() || s.value.is_some() {
            return Err(legacy(
                "a Sample has locationsStartIndex, locationsLength or value, fields of v1.7 and earlier",
            ));
        }
        let link = s.link_index.0;
        samples.push(wire::Sample {
            stack_index: s.stack_index.0,
            field2: nums(s.attribute_indices)
                .into_iter()
                .map(i64::from)
                .collect(),
            field3: if link == 0 {
                Vec::new()
            } else {
                vec![i64::from(link)]
            },
            field4: nums(s.values),
            timestamps_unix_nano: nums(s.timestamps_unix_nano),
        });
    }
    Ok(wire::Profile {
        sample_type,
        samples,
        time_unix_nano: p.time_unix_nano.0,
        duration_nano: p.duration_nano.0,
        period_type: p.period_type.map(value_type),
        period: p.period.0,
    })
}

fn dictionary(d: Dictionary) -> Result<wire::ProfilesDictionary, Error> {
    if d.attribute_units.is_some() {
        return Err(legacy(
            "the dictionary has attributeUnits, a field of v1.7 and earlier",
        ));
    }
    let mut attribute_table = Vec::with_capacity(d.attribute_table.0.len());
    for a in d.attribute_table.0 {
        if a.key.is_some() {
            return Err(legacy(
                "attributeTable entries have a string key, where v1.8+ has keyStrindex",
            ));
        }
        attribute_table.push(wire::KeyValueAndUnit {
            key_strindex: a.key_strindex.0,
            value: a.value.map(AnyValue::into_wire),
        });
    }
    Ok(wire::ProfilesDictionary {
        mapping_table: d
            .mapping_table
            .0
            .into_iter()
            .map(|m| wire::Mapping {
                memory_start: m.memory_start.0,
                memory_limit: m.memory_limit.0,
                file_offset: m.file_offset.0,
                filename_strindex: m.filename_strindex.0,
                attribute_indices: nums(m.attribute_indices),
            })
            .collect(),
        location_table: d
            .location_table
            .0
            .into_iter()
            .map(|l| wire::Location {
                mapping_index: l.mapping_index.0,
                address: l.address.0,
                lines: l
                    .lines
                    .0
                    .into_iter()
                    .map(|ln| wire::Line {
                        function_index: ln.function_index.0,
                        line: ln.line.0,
                    })
                    .collect(),
            })
            .collect(),
        function_table: d
            .function_table
            .0
            .into_iter()
            .map(|f| wire::Function {
                name_strindex: f.name_strindex.0,
                system_name_strindex: f.system_name_strindex.0,
                filename_strindex: f.filename_strindex.0,
                start_line: f.start_line.0,
            })
            .collect(),
        string_table: d
            .string_table
            .0
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect(),
        attribute_table,
        stack_table: d
            .stack_table
            .0
            .into_iter()
            .map(|s| wire::Stack {
                location_indices: nums(s.location_indices),
            })
            .collect(),
    })
}

/// Decodes an OTLP/JSON `ExportProfilesServiceRequest` into the wire
/// types, with `Sample` fields in their v1.10 places.
pub(crate) fn decode(
    body: &[u8],
    limits: &Limits,
) -> Result<(wire::ExportProfilesServiceRequest, usize, usize), Error> {
    BUDGET.with(|b| b.set(limits.max_decoded_bytes));
    EXHAUSTED.with(|e| e.set(false));
    let parsed: Result<Request, _> = serde_json::from_slice(body);
    let exhausted = EXHAUSTED.with(|e| e.replace(false));
    let req = match parsed {
        Ok(r) => r,
        Err(_) if exhausted => {
            return Err(Error::TooLarge(format!(
                "the request would take more than {} bytes of memory decoded",
                limits.max_decoded_bytes
            )));
        }
        Err(e) => return Err(Error::Json(e.to_string())),
    };
    let mut profiles = 0usize;
    let mut samples = 0usize;
    let mut resource_profiles = Vec::with_capacity(req.resource_profiles.0.len());
    for rp in req.resource_profiles.0 {
        let mut scope_profiles = Vec::with_capacity(rp.scope_profiles.0.len());
        for sp in rp.scope_profiles.0 {
            let mut ps = Vec::with_capacity(sp.profiles.0.len());
            for p in sp.profiles.0 {
                profiles += 1;
                samples += p.samples.0.len();
                ps.push(profile(p)?);
            }
            scope_profiles.push(wire::ScopeProfiles {
                scope: Some(wire::InstrumentationScope {
                    attributes: key_values(sp.scope),
                }),
                profiles: ps,
            });
        }
        resource_profiles.push(wire::ResourceProfiles {
            resource: Some(wire::Resource {
                attributes: key_values(rp.resource),
            }),
            scope_profiles,
        });
    }
    let dictionary = req.dictionary.map(dictionary).transpose()?;
    Ok((
        wire::ExportProfilesServiceRequest {
            resource_profiles,
            dictionary,
        },
        profiles,
        samples,
    ))
}
