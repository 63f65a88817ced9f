use std::fmt;

/// A validated tenant id: 1–150 characters of `[A-Za-z0-9_.-]`, and neither
/// `.` nor `..` (so it is safe in paths and object keys).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TenantError {
    #[error("tenant id is empty")]
    Empty,
    #[error("tenant id is {0} characters long; the limit is 150")]
    TooLong(usize),
    #[error("tenant id contains {0:?}; only [A-Za-z0-9_.-] are allowed")]
    BadChar(char),
    #[error("tenant id may not be '.' or '..'")]
    Dots,
}

impl TenantId {
    /// The tenant used when multi-tenancy is off or no header was sent.
    pub const ANONYMOUS: &'static str = "anonymous";

    pub fn new(s: &str) -> Result<Self, TenantError> {
        if s.is_empty() {
            return Err(TenantError::Empty);
        }
        let n = s.chars().count();
        if n > 150 {
            return Err(TenantError::TooLong(n));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
        {
            return Err(TenantError::BadChar(c));
        }
        if s == "." || s == ".." {
            return Err(TenantError::Dots);
        }
        Ok(TenantId(s.to_owned()))
    }

    pub fn anonymous() -> Self {
        TenantId(Self::ANONYMOUS.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates() {
        assert!(TenantId::new("team-a_1.prod").is_ok());
        assert_eq!(TenantId::new(""), Err(TenantError::Empty));
        assert_eq!(TenantId::new("a/b"), Err(TenantError::BadChar('/')));
        assert_eq!(TenantId::new(".."), Err(TenantError::Dots));
        assert_eq!(
            TenantId::new(&"a".repeat(151)),
            Err(TenantError::TooLong(151))
        );
        assert!(TenantId::new(&"a".repeat(150)).is_ok());
    }
}
