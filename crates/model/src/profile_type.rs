use std::fmt;
use std::str::FromStr;

/// `name:sample_type:sample_unit:period_type:period_unit`, e.g.
/// `process_cpu:cpu:nanoseconds:cpu:nanoseconds`.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ProfileType {
    pub name: String,
    pub sample_type: String,
    pub sample_unit: String,
    pub period_type: String,
    pub period_unit: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "profile type {0:?} must have five ':'-separated parts: name:sample_type:sample_unit:period_type:period_unit"
)]
pub struct ProfileTypeError(pub String);

impl ProfileType {
    pub fn new(
        name: &str,
        sample_type: &str,
        sample_unit: &str,
        period_type: &str,
        period_unit: &str,
    ) -> Self {
        ProfileType {
            name: name.to_owned(),
            sample_type: sample_type.to_owned(),
            sample_unit: sample_unit.to_owned(),
            period_type: period_type.to_owned(),
            period_unit: period_unit.to_owned(),
        }
    }
}

impl fmt::Display for ProfileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}:{}",
            self.name, self.sample_type, self.sample_unit, self.period_type, self.period_unit
        )
    }
}

impl FromStr for ProfileType {
    type Err = ProfileTypeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        match parts.as_slice() {
            [n, st, su, pt, pu] if !n.is_empty() && !st.is_empty() => {
                Ok(ProfileType::new(n, st, su, pt, pu))
            }
            _ => Err(ProfileTypeError(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
        let t: ProfileType = s.parse().unwrap();
        assert_eq!(t.sample_type, "cpu");
        assert_eq!(t.to_string(), s);
        assert!("a:b:c".parse::<ProfileType>().is_err());
        assert!(":b:c:d:e".parse::<ProfileType>().is_err());
    }
}
