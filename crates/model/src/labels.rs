use std::fmt;

/// The conventional primary label.
pub const SERVICE_NAME: &str = "service_name";

/// A label set, sorted by name with unique names.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Labels(Vec<(String, String)>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LabelError {
    #[error("label name {0:?} is not valid: use [a-zA-Z_][a-zA-Z0-9_.]*")]
    BadName(String),
    #[error("label name {name:?} appears twice")]
    Duplicate { name: String },
    #[error("label name {name:?} is {len} bytes long; the limit is {limit}")]
    NameTooLong {
        name: String,
        len: usize,
        limit: usize,
    },
    #[error("value of label {name:?} is {len} bytes long; the limit is {limit}")]
    ValueTooLong {
        name: String,
        len: usize,
        limit: usize,
    },
    #[error("the series has {count} labels; the limit is {limit}")]
    TooMany { count: usize, limit: usize },
}

/// Whether `name` is a valid label name (Prometheus rules, plus `.`).
pub fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

impl Labels {
    pub fn new() -> Self {
        Labels(Vec::new())
    }

    /// Builds a set from pairs, refusing invalid or duplicate names.
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Self, LabelError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let mut v: Vec<(String, String)> = pairs
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        for (k, _) in &v {
            if !valid_label_name(k) {
                return Err(LabelError::BadName(k.clone()));
            }
        }
        v.sort();
        for w in v.windows(2) {
            if w[0].0 == w[1].0 {
                return Err(LabelError::Duplicate {
                    name: w[0].0.clone(),
                });
            }
        }
        Ok(Labels(v))
    }

    /// Sets `name` to `value`, replacing any earlier value.
    pub fn insert(&mut self, name: &str, value: &str) {
        match self.0.binary_search_by(|(k, _)| k.as_str().cmp(name)) {
            Ok(i) => self.0[i].1 = value.to_owned(),
            Err(i) => self.0.insert(i, (name.to_owned(), value.to_owned())),
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| self.0[i].1.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks the set against per-series limits.
    pub fn check_limits(
        &self,
        max_labels: usize,
        max_name_len: usize,
        max_value_len: usize,
    ) -> Result<(), LabelError> {
        if self.0.len() > max_labels {
            return Err(LabelError::TooMany {
                count: self.0.len(),
                limit: max_labels,
            });
        }
        for (k, v) in &self.0 {
            if k.len() > max_name_len {
                return Err(LabelError::NameTooLong {
                    name: k.clone(),
                    len: k.len(),
                    limit: max_name_len,
                });
            }
            if v.len() > max_value_len {
                return Err(LabelError::ValueTooLong {
                    name: k.clone(),
                    len: v.len(),
                    limit: max_value_len,
                });
            }
        }
        Ok(())
    }

    /// Only the labels named in `names`, in the set's order.
    pub fn keep(&self, names: &[String]) -> Labels {
        Labels(
            self.0
                .iter()
                .filter(|(k, _)| names.iter().any(|n| n == k))
                .cloned()
                .collect(),
        )
    }
}

impl fmt::Display for Labels {
    /// `{a="1", b="2"}`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}={v:?}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_and_unique() {
        let l = Labels::from_pairs([("b", "2"), ("a", "1")]).unwrap();
        assert_eq!(l.iter().next(), Some(("a", "1")));
        assert!(matches!(
            Labels::from_pairs([("a", "1"), ("a", "2")]),
            Err(LabelError::Duplicate { .. })
        ));
        assert!(matches!(
            Labels::from_pairs([("1a", "1")]),
            Err(LabelError::BadName(_))
        ));
    }

    #[test]
    fn insert_replaces() {
        let mut l = Labels::new();
        l.insert("z", "1");
        l.insert("a", "1");
        l.insert("z", "2");
        assert_eq!(l.get("z"), Some("2"));
        assert_eq!(l.len(), 2);
        assert_eq!(l.to_string(), "{a=\"1\", z=\"2\"}");
    }

    #[test]
    fn limits() {
        let l = Labels::from_pairs([("a", "xxxx")]).unwrap();
        assert!(l.check_limits(1, 10, 4).is_ok());
        assert!(matches!(
            l.check_limits(1, 10, 3),
            Err(LabelError::ValueTooLong { .. })
        ));
        assert!(matches!(
            l.check_limits(0, 10, 4),
            Err(LabelError::TooMany { .. })
        ));
    }
}
