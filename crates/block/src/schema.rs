use std::sync::Arc;

use arrow::array::{Array, FixedSizeBinaryArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use fathom_model::{Id, Labels, Profile, ProfileType};

/// The column names of the block files (the schemas below are built from
/// them): readers that name a column (DataFusion expressions,
/// `column_by_name`) use these, never a string of their own.
pub mod columns {
    pub const SERIES_ID: &str = "series_id";
    pub const TIME_NANOS: &str = "time_nanos";
    pub const PROFILE_ID: &str = "profile_id";
    pub const STACK_ID: &str = "stack_id";
    pub const VALUE: &str = "value";
    pub const BUCKET_WIDTH_NANOS: &str = "bucket_width_nanos";
    pub const BUCKET_START_NANOS: &str = "bucket_start_nanos";
    pub const DURATION_NANOS: &str = "duration_nanos";
    pub const PERIOD: &str = "period";
    pub const SAMPLES: &str = "samples";
    pub const PROFILE_TYPE: &str = "profile_type";
    pub const SERVICE_NAME: &str = "service_name";
    pub const LABELS: &str = "labels";
    pub const MIN_TIME_NANOS: &str = "min_time_nanos";
    pub const MAX_TIME_NANOS: &str = "max_time_nanos";
    pub const LOCATION_IDS: &str = "location_ids";
    pub const LOCATION_ID: &str = "location_id";
    pub const MAPPING_ID: &str = "mapping_id";
    pub const ADDRESS: &str = "address";
    pub const LINE_FUNCTION_IDS: &str = "line_function_ids";
    pub const LINE_NUMBERS: &str = "line_numbers";
    pub const FUNCTION_ID: &str = "function_id";
    pub const NAME: &str = "name";
    pub const SYSTEM_NAME: &str = "system_name";
    pub const FILENAME: &str = "filename";
    pub const START_LINE: &str = "start_line";
    pub const MEMORY_START: &str = "memory_start";
    pub const MEMORY_LIMIT: &str = "memory_limit";
    pub const FILE_OFFSET: &str = "file_offset";
    pub const BUILD_ID: &str = "build_id";
}

pub(crate) const ID: DataType = DataType::FixedSizeBinary(16);

fn id_field(name: &str) -> Field {
    Field::new(name, ID, false)
}

/// The ids of an id column, end to end, read in place (its values start
/// at its offset); `None` unless the column is 16 bytes wide and holds
/// no null.
pub fn id_values(a: &FixedSizeBinaryArray) -> Option<&[[u8; 16]]> {
    if a.value_size() != 16 || a.null_count() > 0 {
        return None;
    }
    let data = a.value_data().get(..a.len().checked_mul(16)?)?;
    Some(data.as_chunks::<16>().0)
}

/// `samples`: one row per (profile, stack, value); sorted by series_id,
/// time_nanos, profile_id, stack_id.
pub fn samples_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field(columns::SERIES_ID),
        Field::new(columns::TIME_NANOS, DataType::Int64, false),
        id_field(columns::PROFILE_ID),
        id_field(columns::STACK_ID),
        Field::new(columns::VALUE, DataType::Int64, false),
    ]))
}

/// `rollup`: the total value per (series, bucket, stack) of the block's
/// samples, for every bucket width of the block's meta; sorted by
/// series_id, bucket_width_nanos, bucket_start_nanos, stack_id.
pub fn rollup_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field(columns::SERIES_ID),
        Field::new(columns::BUCKET_WIDTH_NANOS, DataType::Int64, false),
        Field::new(columns::BUCKET_START_NANOS, DataType::Int64, false),
        id_field(columns::STACK_ID),
        Field::new(columns::VALUE, DataType::Int64, false),
    ]))
}

/// `profiles`: one row per profile.
pub fn profiles_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field(columns::PROFILE_ID),
        id_field(columns::SERIES_ID),
        Field::new(columns::TIME_NANOS, DataType::Int64, false),
        Field::new(columns::DURATION_NANOS, DataType::Int64, false),
        Field::new(columns::PERIOD, DataType::Int64, false),
        Field::new(columns::SAMPLES, DataType::UInt64, false),
    ]))
}

/// `series`: one row per series present in the block.
pub fn series_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field(columns::SERIES_ID),
        Field::new(columns::PROFILE_TYPE, DataType::Utf8, false),
        Field::new(columns::SERVICE_NAME, DataType::Utf8, false),
        Field::new(columns::LABELS, DataType::Utf8, false),
        Field::new(columns::MIN_TIME_NANOS, DataType::Int64, false),
        Field::new(columns::MAX_TIME_NANOS, DataType::Int64, false),
    ]))
}

pub fn stacks_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field(columns::STACK_ID),
        Field::new(
            columns::LOCATION_IDS,
            DataType::List(Arc::new(Field::new("item", ID, false))),
            false,
        ),
    ]))
}

pub(crate) fn locations_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field(columns::LOCATION_ID),
        id_field(columns::MAPPING_ID),
        Field::new(columns::ADDRESS, DataType::UInt64, false),
        Field::new(
            columns::LINE_FUNCTION_IDS,
            DataType::List(Arc::new(Field::new("item", ID, false))),
            false,
        ),
        Field::new(
            columns::LINE_NUMBERS,
            DataType::List(Arc::new(Field::new("item", DataType::Int64, false))),
            false,
        ),
    ]))
}

pub(crate) fn functions_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field(columns::FUNCTION_ID),
        Field::new(columns::NAME, DataType::Utf8, false),
        Field::new(columns::SYSTEM_NAME, DataType::Utf8, false),
        Field::new(columns::FILENAME, DataType::Utf8, false),
        Field::new(columns::START_LINE, DataType::Int64, false),
    ]))
}

pub(crate) fn mappings_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        id_field(columns::MAPPING_ID),
        Field::new(columns::MEMORY_START, DataType::UInt64, false),
        Field::new(columns::MEMORY_LIMIT, DataType::UInt64, false),
        Field::new(columns::FILE_OFFSET, DataType::UInt64, false),
        Field::new(columns::FILENAME, DataType::Utf8, false),
        Field::new(columns::BUILD_ID, DataType::Utf8, false),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The names readers use are the names the files are written with,
    /// in the documented order.
    #[test]
    fn column_names_are_the_schemas_names() {
        let names =
            |s: SchemaRef| -> Vec<String> { s.fields().iter().map(|f| f.name().clone()).collect() };
        assert_eq!(
            names(samples_schema()),
            [
                columns::SERIES_ID,
                columns::TIME_NANOS,
                columns::PROFILE_ID,
                columns::STACK_ID,
                columns::VALUE
            ]
        );
        assert_eq!(
            names(rollup_schema()),
            [
                columns::SERIES_ID,
                columns::BUCKET_WIDTH_NANOS,
                columns::BUCKET_START_NANOS,
                columns::STACK_ID,
                columns::VALUE
            ]
        );
        assert_eq!(
            names(samples_schema()),
            ["series_id", "time_nanos", "profile_id", "stack_id", "value"],
            "a renamed column is a format change (docs/block-format.md)"
        );
    }
}
