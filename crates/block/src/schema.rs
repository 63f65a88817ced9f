use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use fathom_model::{Id, Labels, Profile, ProfileType};

pub(crate) const ID: DataType = DataType::FixedSizeBinary(16);

fn id_field(name: &str) -> Field {
    Field::new(name, ID, false)
}

/// `samples`: one row per (profile, stack, value); sorted by series_id,
/// time_nanos, profile_id, stack_id.
pub fn samples_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field("series_id"),
        Field::new("time_nanos", DataType::Int64, false),
        id_field("profile_id"),
        id_field("stack_id"),
        Field::new("value", DataType::Int64, false),
    ]))
}

/// `rollup`: the total value per (series, bucket, stack) of the block's
/// samples, for every bucket width of the block's meta; sorted by
/// series_id, bucket_width_nanos, bucket_start_nanos, stack_id.
pub fn rollup_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field("series_id"),
        Field::new("bucket_width_nanos", DataType::Int64, false),
        Field::new("bucket_start_nanos", DataType::Int64, false),
        id_field("stack_id"),
        Field::new("value", DataType::Int64, false),
    ]))
}

/// `profiles`: one row per profile.
pub fn profiles_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field("profile_id"),
        id_field("series_id"),
        Field::new("time_nanos", DataType::Int64, false),
        Field::new("duration_nanos", DataType::Int64, false),
        Field::new("period", DataType::Int64, false),
        Field::new("samples", DataType::UInt64, false),
    ]))
}

/// `series`: one row per series present in the block.
pub fn series_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field("series_id"),
        Field::new("profile_type", DataType::Utf8, false),
        Field::new("service_name", DataType::Utf8, false),
        Field::new("labels", DataType::Utf8, false),
        Field::new("min_time_nanos", DataType::Int64, false),
        Field::new("max_time_nanos", DataType::Int64, false),
    ]))
}

pub fn stacks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field("stack_id"),
        Field::new(
            "location_ids",
            DataType::List(Arc::new(Field::new("item", ID, false))),
            false,
        ),
    ]))
}

pub(crate) fn locations_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field("location_id"),
        id_field("mapping_id"),
        Field::new("address", DataType::UInt64, false),
        Field::new(
            "line_function_ids",
            DataType::List(Arc::new(Field::new("item", ID, false))),
            false,
        ),
        Field::new(
            "line_numbers",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, false))),
            false,
        ),
    ]))
}

pub(crate) fn functions_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field("function_id"),
        Field::new("name", DataType::Utf8, false),
        Field::new("system_name", DataType::Utf8, false),
        Field::new("filename", DataType::Utf8, false),
        Field::new("start_line", DataType::Int64, false),
    ]))
}

pub(crate) fn mappings_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field("mapping_id"),
        Field::new("memory_start", DataType::UInt64, false),
        Field::new("memory_limit", DataType::UInt64, false),
        Field::new("file_offset", DataType::UInt64, false),
        Field::new("filename", DataType::Utf8, false),
        Field::new("build_id", DataType::Utf8, false),
    ]))
}

/// A series and the time span of its profiles in one block or head.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SeriesRow {
    pub series_id: Id,
    pub profile_type: ProfileType,
    pub labels: Labels,
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
}

/// One profile's header.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProfileRow {
    pub profile_id: Id,
    pub series_id: Id,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub period: i64,
    pub samples: u64,
}

impl SeriesRow {
    /// The series of profile `p`, its time span `p`'s time.
    pub fn of(p: &Profile) -> SeriesRow {
        SeriesRow {
            series_id: p.series_id(),
            profile_type: p.profile_type.clone(),
            labels: p.labels.clone(),
            min_time_nanos: p.time_nanos,
            max_time_nanos: p.time_nanos,
        }
    }

    /// Widens the time span to hold `time_nanos`.
    pub fn include(&mut self, time_nanos: i64) {
        self.min_time_nanos = self.min_time_nanos.min(time_nanos);
        self.max_time_nanos = self.max_time_nanos.max(time_nanos);
    }
}

impl ProfileRow {
    /// The header of profile `p` (of series `series_id`).
    pub fn of(p: &Profile, series_id: Id) -> ProfileRow {
        ProfileRow {
            profile_id: p.id,
            series_id,
            time_nanos: p.time_nanos,
            duration_nanos: p.duration_nanos,
            period: p.period,
            samples: p.samples.len() as u64,
        }
    }
}
