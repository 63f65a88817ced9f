//! The protobuf messages of `opentelemetry.proto.collector.profiles.v1development`
//! that Fathom reads, written from the public definitions in
//! opentelemetry-proto (v1.8.0 to v1.11.0): only the fields the conversion
//! uses are declared, so every other field (links, array and kvlist
//! attribute values, original payloads, ...) is skipped while decoding
//! without being allocated.
//!
//! One message differs between the releases clients send today:
//! `Sample`. v1.8.0 and v1.9.0 (the PyPI SDK's `opentelemetry-proto` 1.40)
//! number its fields `stack_index = 1, values = 2, attribute_indices = 3,
//! link_index = 4, timestamps_unix_nano = 5`; v1.10.0 and later (the eBPF
//! profiler) number them `stack_index = 1, attribute_indices = 2,
//! link_index = 3, values = 4, timestamps_unix_nano = 5`. [`Sample`] keeps
//! fields 2, 3 and 4 as they are on the wire (a `repeated int64` accepts a
//! packed list and a single number alike); [`crate::Layout`], which
//! [`crate::Request::decode`] finds from the request, says what they mean.
//! Every other message has the same numbering in all these releases (for
//! `Profile`, up to field 6, the last one read here).

/// `ExportProfilesServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportProfilesServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_profiles: Vec<ResourceProfiles>,
    #[prost(message, optional, tag = "2")]
    pub dictionary: Option<ProfilesDictionary>,
}

/// `ExportProfilesServiceResponse`: an empty one means all accepted.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportProfilesServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportProfilesPartialSuccess>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportProfilesPartialSuccess {
    #[prost(int64, tag = "1")]
    pub rejected_profiles: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// The tables that samples refer to by index, shared by the whole request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProfilesDictionary {
    #[prost(message, repeated, tag = "1")]
    pub mapping_table: Vec<Mapping>,
    #[prost(message, repeated, tag = "2")]
    pub location_table: Vec<Location>,
    #[prost(message, repeated, tag = "3")]
    pub function_table: Vec<Function>,
    #[prost(string, repeated, tag = "5")]
    pub string_table: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub attribute_table: Vec<KeyValueAndUnit>,
    #[prost(message, repeated, tag = "7")]
    pub stack_table: Vec<Stack>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceProfiles {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_profiles: Vec<ScopeProfiles>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeProfiles {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub profiles: Vec<Profile>,
}

/// One sample type's observations.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, optional, tag = "1")]
    pub sample_type: Option<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    #[prost(uint64, tag = "4")]
    pub duration_nano: u64,
    #[prost(message, optional, tag = "5")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "6")]
    pub period: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int32, tag = "1")]
    pub type_strindex: i32,
    #[prost(int32, tag = "2")]
    pub unit_strindex: i32,
}

/// A sample with fields 2 to 4 as sent (see the module docs); read it
/// through [`Sample::view`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(int32, tag = "1")]
    pub stack_index: i32,
    /// v1.8/v1.9 `values`; v1.10 `attribute_indices`.
    #[prost(int64, repeated, tag = "2")]
    pub field2: Vec<i64>,
    /// v1.8/v1.9 `attribute_indices`; v1.10 `link_index`.
    #[prost(int64, repeated, tag = "3")]
    pub field3: Vec<i64>,
    /// v1.8/v1.9 `link_index`; v1.10 `values`.
    #[prost(int64, repeated, tag = "4")]
    pub field4: Vec<i64>,
    #[prost(fixed64, repeated, tag = "5")]
    pub timestamps_unix_nano: Vec<u64>,
}

/// What a [`Sample`]'s fields mean in one layout.
#[derive(Clone, Copy, Debug)]
pub struct SampleView<'a> {
    pub values: &'a [i64],
    pub attribute_indices: &'a [i64],
    pub timestamps: usize,
}

impl Sample {
    pub fn view(&self, layout: crate::Layout) -> SampleView<'_> {
        match layout {
            crate::Layout::V1_8 => SampleView {
                values: &self.field2,
                attribute_indices: &self.field3,
                timestamps: self.timestamps_unix_nano.len(),
            },
            crate::Layout::V1_10 => SampleView {
                values: &self.field4,
                attribute_indices: &self.field2,
                timestamps: self.timestamps_unix_nano.len(),
            },
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub memory_start: u64,
    #[prost(uint64, tag = "2")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    #[prost(int32, tag = "4")]
    pub filename_strindex: i32,
    #[prost(int32, repeated, tag = "5")]
    pub attribute_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Stack {
    /// Leaf first.
    #[prost(int32, repeated, tag = "1")]
    pub location_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(int32, tag = "1")]
    pub mapping_index: i32,
    #[prost(uint64, tag = "2")]
    pub address: u64,
    /// Inlined callee first, as in pprof.
    #[prost(message, repeated, tag = "3")]
    pub lines: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(int32, tag = "1")]
    pub function_index: i32,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(int32, tag = "1")]
    pub name_strindex: i32,
    #[prost(int32, tag = "2")]
    pub system_name_strindex: i32,
    #[prost(int32, tag = "3")]
    pub filename_strindex: i32,
    #[prost(int64, tag = "4")]
    pub start_line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValueAndUnit {
    #[prost(int32, tag = "1")]
    pub key_strindex: i32,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `opentelemetry.proto.resource.v1.Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

/// `opentelemetry.proto.common.v1.InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InstrumentationScope {
    #[prost(message, repeated, tag = "3")]
    pub attributes: Vec<KeyValue>,
}

/// `opentelemetry.proto.common.v1.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `opentelemetry.proto.common.v1.AnyValue`, scalar kinds only: arrays,
/// key-value lists and bytes are skipped (they never become labels).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3")]
    pub value: Option<Value>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(string, tag = "1")]
    StringValue(String),
    #[prost(bool, tag = "2")]
    BoolValue(bool),
    #[prost(int64, tag = "3")]
    IntValue(i64),
}

impl AnyValue {
    /// The value as a label value: strings as they are, integers and
    /// booleans in decimal/`true`/`false`; `None` for anything else.
    pub fn as_label_value(&self) -> Option<String> {
        match &self.value {
            Some(Value::StringValue(s)) => Some(s.clone()),
            Some(Value::IntValue(i)) => Some(i.to_string()),
            Some(Value::BoolValue(b)) => Some(b.to_string()),
            None => None,
        }
    }
}
