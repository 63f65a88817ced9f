//! Prometheus-style relabeling of discovered labels.
//!
//! Rules run in order over a label set that holds the visible labels (`node`,
//! `pid`, `comm`, `service_name`, …) and meta labels (`__meta_…`). After the
//! last rule, labels whose name starts with `__` and labels with an empty
//! value are removed. A `keep` that does not match or a `drop` that matches
//! discards the target (the process is then not profiled at all).
//!
//! Semantics follow Prometheus: `source_labels` values are joined with
//! `separator` (default `;`), `regex` (default `(.*)`) is anchored at both
//! ends, `replacement` (default `$1`) expands `$1`, `${1}`, `${name}`.
//! Supported actions: `replace` (default), `keep`, `drop`, `labelmap`,
//! `labeldrop`, `labelkeep`, `lowercase`, `uppercase`.

use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;

/// A label set under relabeling: any names, including `__meta_*`.
pub(crate) type LabelMap = BTreeMap<String, String>;

#[derive(Debug, thiserror::Error)]
pub enum RelabelError {
    #[error("relabel rule {index}: invalid regex {regex:?}")]
    Regex {
        index: usize,
        regex: String,
        #[source]
        source: Box<regex::Error>,
    },
    #[error("relabel rule {index}: action {action} needs target_label")]
    MissingTarget { index: usize, action: &'static str },
    #[error("relabel rule {index}: target_label {label:?} is not a valid label name")]
    BadTarget { index: usize, label: String },
    #[error("relabel config is not valid YAML for relabel_configs")]
    Yaml(#[from] serde_norway::Error),
    #[error("reading relabel config {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Action {
    #[default]
    Replace,
    Keep,
    Drop,
    Labelmap,
    Labeldrop,
    Labelkeep,
    Lowercase,
    Uppercase,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::Replace => "replace",
            Action::Keep => "keep",
            Action::Drop => "drop",
            Action::Labelmap => "labelmap",
            Action::Labeldrop => "labeldrop",
            Action::Labelkeep => "labelkeep",
            Action::Lowercase => "lowercase",
            Action::Uppercase => "uppercase",
        }
    }
}

/// One rule as written in YAML.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleConfig {
    #[serde(default)]
    source_labels: Vec<String>,
    separator: Option<String>,
    regex: Option<String>,
    target_label: Option<String>,
    replacement: Option<String>,
    #[serde(default)]
    action: Action,
}

/// The YAML file: `relabel_configs: [ … ]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RelabelFile {
    #[serde(default)]
    pub(crate) relabel_configs: Vec<RuleConfig>,
}

/// A compiled rule.
#[derive(Clone, Debug)]
pub(crate) struct Rule {
    source_labels: Vec<String>,
    separator: String,
    regex: Regex,
    target_label: Option<String>,
    replacement: String,
    action: Action,
}

/// Compiled rules, applied in order.
#[derive(Clone, Debug, Default)]
pub struct Relabeler {
    rules: Vec<Rule>,
}

fn valid_target(name: &str) -> bool {
    // Targets may be meta labels (`__tmp`) or contain `$1` templates that
    // expand into valid names; check the template's literal shape only.
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '{' | '}'))
}

impl Relabeler {
    pub(crate) fn compile(rules: Vec<RuleConfig>) -> Result<Self, RelabelError> {
        let mut out = Vec::with_capacity(rules.len());
        for (index, r) in rules.into_iter().enumerate() {
            let re = r.regex.unwrap_or_else(|| "(.*)".into());
            let regex =
                Regex::new(&format!("^(?:{re})$")).map_err(|source| RelabelError::Regex {
                    index,
                    regex: re.clone(),
                    source: Box::new(source),
                })?;
            let needs_target = matches!(
                r.action,
                Action::Replace | Action::Lowercase | Action::Uppercase
            );
            if needs_target && r.target_label.is_none() {
                return Err(RelabelError::MissingTarget {
                    index,
                    action: r.action.name(),
                });
            }
            if let Some(t) = &r.target_label
                && !valid_target(t)
            {
                return Err(RelabelError::BadTarget {
                    index,
                    label: t.clone(),
                });
            }
            out.push(Rule {
                source_labels: r.source_labels,
                separator: r.separator.unwrap_or_else(|| ";".into()),
                regex,
                target_label: r.target_label,
                replacement: r.replacement.unwrap_or_else(|| "$1".into()),
                action: r.action,
            });
        }
        Ok(Relabeler { rules: out })
    }

    pub(crate) fn from_yaml(text: &str) -> Result<Self, RelabelError> {
        if text.trim().is_empty() {
            return Ok(Relabeler::default());
        }
        let f: RelabelFile = serde_norway::from_str(text)?;
        Self::compile(f.relabel_configs)
    }

    /// Reads a YAML file with `relabel_configs:`.
    pub fn from_file(path: &std::path::Path) -> Result<Self, RelabelError> {
        let text = std::fs::read_to_string(path).map_err(|source| RelabelError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Applies the rules. `None`: the target is dropped. Otherwise the final
    /// labels, without `__*` names and empty values.
    pub(crate) fn apply(&self, mut labels: LabelMap) -> Option<LabelMap> {
        for r in &self.rules {
            let value = r
                .source_labels
                .iter()
                .map(|n| labels.get(n).map_or("", String::as_str))
                .collect::<Vec<_>>()
                .join(&r.separator);
            match r.action {
                Action::Keep => {
                    if !r.regex.is_match(&value) {
                        return None;
                    }
                }
                Action::Drop => {
                    if r.regex.is_match(&value) {
                        return None;
                    }
                }
                Action::Replace => {
                    let Some(caps) = r.regex.captures(&value) else {
                        continue;
                    };
                    let mut target = String::new();
                    caps.expand(r.target_label.as_deref().unwrap_or(""), &mut target);
                    let mut v = String::new();
                    caps.expand(&r.replacement, &mut v);
                    if !fathom_model::valid_label_name(&target) {
                        continue;
                    }
                    if v.is_empty() {
                        labels.remove(&target);
                    } else {
                        labels.insert(target, v);
                    }
                }
                Action::Lowercase | Action::Uppercase => {
                    let t = r.target_label.clone().unwrap_or_default();
                    let v = if r.action == Action::Lowercase {
                        value.to_lowercase()
                    } else {
                        value.to_uppercase()
                    };
                    labels.insert(t, v);
                }
                Action::Labelmap => {
                    let mapped: Vec<(String, String)> = labels
                        .iter()
                        .filter_map(|(k, v)| {
                            let caps = r.regex.captures(k)?;
                            let mut name = String::new();
                            caps.expand(&r.replacement, &mut name);
                            fathom_model::valid_label_name(&name).then(|| (name, v.clone()))
                        })
                        .collect();
                    labels.extend(mapped);
                }
                Action::Labeldrop => labels.retain(|k, _| !r.regex.is_match(k)),
                Action::Labelkeep => labels.retain(|k, _| r.regex.is_match(k)),
            }
        }
        labels.retain(|k, v| !k.starts_with("__") && !v.is_empty());
        Some(labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> LabelMap {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn base() -> LabelMap {
        labels(&[
            ("comm", "nginx"),
            ("pid", "42"),
            ("service_name", "nginx"),
            ("__meta_process_cgroup", "/system.slice/nginx.service"),
            ("__meta_env_team", "web"),
        ])
    }

    #[test]
    fn no_rules_strips_meta() {
        let r = Relabeler::default();
        let out = r.apply(base()).unwrap();
        assert_eq!(out.len(), 3);
        assert!(!out.contains_key("__meta_process_cgroup"));
    }

    #[test]
    fn keep_and_drop() {
        let r = Relabeler::from_yaml(
            r#"
relabel_configs:
  - source_labels: [comm]
    regex: "ngin.*"
    action: keep
  - source_labels: [pid]
    regex: "4"        # anchored: does not match "42"
    action: drop
"#,
        )
        .unwrap();
        assert!(r.apply(base()).is_some());
        let mut other = base();
        other.insert("comm".into(), "sshd".into());
        assert!(r.apply(other).is_none());
        let drop_all = Relabeler::from_yaml(
            "relabel_configs: [{source_labels: [pid], regex: '4.', action: drop}]",
        )
        .unwrap();
        assert!(drop_all.apply(base()).is_none());
    }

    #[test]
    fn replace_with_groups_and_separator() {
        let r = Relabeler::from_yaml(
            r#"
relabel_configs:
  - source_labels: [__meta_process_cgroup]
    regex: "/system.slice/(.*)\\.service"
    target_label: service_name
    replacement: "unit-$1"
  - source_labels: [comm, pid]
    separator: "/"
    target_label: id
  - source_labels: [missing]
    regex: ""
    target_label: comm
    replacement: ""
"#,
        )
        .unwrap();
        let out = r.apply(base()).unwrap();
        assert_eq!(out["service_name"], "unit-nginx");
        assert_eq!(out["id"], "nginx/42");
        // An empty replacement deletes the target.
        assert!(!out.contains_key("comm"));
    }

    #[test]
    fn labelmap_labeldrop_labelkeep_case() {
        let r = Relabeler::from_yaml(
            r#"
relabel_configs:
  - action: labelmap
    regex: "__meta_env_(.+)"
  - action: labeldrop
    regex: "pid"
  - source_labels: [comm]
    target_label: upper
    action: uppercase
"#,
        )
        .unwrap();
        let out = r.apply(base()).unwrap();
        assert_eq!(out["team"], "web");
        assert!(!out.contains_key("pid"));
        assert_eq!(out["upper"], "NGINX");
        let keep =
            Relabeler::from_yaml("relabel_configs: [{action: labelkeep, regex: 'comm|__.*'}]")
                .unwrap();
        assert_eq!(keep.apply(base()).unwrap().len(), 1);
    }

    #[test]
    fn bad_configs_are_refused() {
        assert!(matches!(
            Relabeler::from_yaml("relabel_configs: [{regex: '(', target_label: x}]"),
            Err(RelabelError::Regex { .. })
        ));
        assert!(matches!(
            Relabeler::from_yaml("relabel_configs: [{action: replace}]"),
            Err(RelabelError::MissingTarget { .. })
        ));
        assert!(matches!(
            Relabeler::from_yaml("relabel_configs: [{action: hashmod, target_label: x}]"),
            Err(RelabelError::Yaml(_))
        ));
        assert!(matches!(
            Relabeler::from_yaml("relabel_configs: [{target_label: 'a b'}]"),
            Err(RelabelError::BadTarget { .. })
        ));
        assert!(Relabeler::from_yaml("{{{").is_err());
        assert!(Relabeler::from_yaml("\n").unwrap().is_empty());
    }

    #[test]
    fn invalid_expanded_names_are_skipped() {
        let r = Relabeler::from_yaml(
            r#"
relabel_configs:
  - action: labelmap
    regex: "(.*)"
    replacement: "9$1"
"#,
        )
        .unwrap();
        // Names like "9comm" are invalid: nothing is added, nothing breaks.
        assert_eq!(r.apply(base()).unwrap().len(), 3);
    }
}
