use crate::ids::Id;
use crate::labels::Labels;
use crate::profile_type::ProfileType;
use crate::symbols::Symbols;
use crate::tenant::TenantId;

/// One (stack, value) pair of a profile. Within a profile, stacks are unique.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub stack: Id,
    pub value: i64,
}

/// One timestamped observation of a series (profile type + labels).
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Unique per observation; replicas of one write share it, which is how
    /// queries and compaction remove duplicates.
    pub id: Id,
    pub profile_type: ProfileType,
    pub labels: Labels,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub period: i64,
    pub samples: Vec<Sample>,
}

impl Profile {
    /// The series id: a hash of the profile type and the label set.
    pub fn series_id(&self) -> Id {
        series_id(&self.profile_type, &self.labels)
    }

    pub fn total(&self) -> i64 {
        self.samples.iter().map(|s| s.value).sum()
    }
}

/// The id of a series, stable across processes.
pub fn series_id(profile_type: &ProfileType, labels: &Labels) -> Id {
    let mut h = crate::ids::IdHasher::new("series");
    h.str(&profile_type.to_string());
    for (k, v) in labels.iter() {
        h.str(k).str(v);
    }
    h.finish()
}

/// What the distributor hands an ingester: profiles of one tenant and the
/// symbols they reference.
#[derive(Clone, Debug, PartialEq)]
pub struct IngestBatch {
    pub tenant: TenantId,
    pub profiles: Vec<Profile>,
    pub symbols: Symbols,
}

impl IngestBatch {
    pub fn sample_count(&self) -> usize {
        self.profiles.iter().map(|p| p.samples.len()).sum()
    }
}
