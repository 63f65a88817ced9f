use std::fmt;

use regex::Regex;

use crate::labels::{Labels, valid_label_name};
use crate::profile_type::ProfileType;

/// A Prometheus-style matcher operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchOp {
    Eq,
    NotEq,
    Re,
    NotRe,
}

impl fmt::Display for MatchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MatchOp::Eq => "=",
            MatchOp::NotEq => "!=",
            MatchOp::Re => "=~",
            MatchOp::NotRe => "!~",
        })
    }
}

/// One `name op "value"` term. Regexes are fully anchored, as in Prometheus.
#[derive(Clone, Debug)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    re: Option<Regex>,
}

impl Matcher {
    pub fn new(name: &str, op: MatchOp, value: &str) -> Result<Self, SelectorError> {
        let re = match op {
            MatchOp::Re | MatchOp::NotRe => Some(
                regex::RegexBuilder::new(&format!("^(?:{value})$"))
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| SelectorError::BadRegex {
                        regex: value.to_owned(),
                        reason: e.to_string(),
                    })?,
            ),
            _ => None,
        };
        Ok(Matcher {
            name: name.to_owned(),
            op,
            value: value.to_owned(),
            re,
        })
    }

    /// Whether `value` (empty when the label is absent) matches.
    pub fn matches(&self, value: &str) -> bool {
        match self.op {
            MatchOp::Eq => value == self.value,
            MatchOp::NotEq => value != self.value,
            MatchOp::Re => self.re.as_ref().is_some_and(|r| r.is_match(value)),
            MatchOp::NotRe => !self.re.as_ref().is_some_and(|r| r.is_match(value)),
        }
    }
}

impl PartialEq for Matcher {
    fn eq(&self, o: &Self) -> bool {
        self.name == o.name && self.op == o.op && self.value == o.value
    }
}

/// `<profile type>{label="v", other=~"re.*"}`; the profile type and the
/// braces are each optional, but not both absent.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Selector {
    pub profile_type: Option<ProfileType>,
    pub matchers: Vec<Matcher>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectorError {
    #[error("selector is empty")]
    Empty,
    #[error("selector is {0} bytes long; the limit is 16384")]
    TooLong(usize),
    #[error("bad profile type in selector: {0}")]
    ProfileType(String),
    #[error("selector: {msg} at byte {pos}")]
    Syntax { msg: String, pos: usize },
    #[error("selector: regex {regex:?} is invalid: {reason}")]
    BadRegex { regex: String, reason: String },
}

impl Selector {
    /// Parses a selector; see the type's documentation for the syntax.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        if s.len() > 16384 {
            return Err(SelectorError::TooLong(s.len()));
        }
        let s = s.trim();
        if s.is_empty() {
            return Err(SelectorError::Empty);
        }
        let (head, body) = match s.find('{') {
            Some(i) => (&s[..i], Some(i)),
            None => (s, None),
        };
        let head = head.trim();
        let profile_type = if head.is_empty() {
            None
        } else {
            Some(
                head.parse::<ProfileType>()
                    .map_err(|e| SelectorError::ProfileType(e.to_string()))?,
            )
        };
        let matchers = match body {
            Some(start) => Parser {
                s: s.as_bytes(),
                src: s,
                pos: start + 1,
            }
            .matchers()?,
            None => Vec::new(),
        };
        Ok(Selector {
            profile_type,
            matchers,
        })
    }

    /// Whether a series of this profile type and labels matches.
    pub fn matches(&self, profile_type: &ProfileType, labels: &Labels) -> bool {
        if self
            .profile_type
            .as_ref()
            .is_some_and(|t| t != profile_type)
        {
            return false;
        }
        self.matches_labels(labels)
    }

    pub fn matches_labels(&self, labels: &Labels) -> bool {
        self.matchers
            .iter()
            .all(|m| m.matches(labels.get(&m.name).unwrap_or("")))
    }
}

struct Parser<'a> {
    s: &'a [u8],
    src: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn err<T>(&self, msg: &str) -> Result<T, SelectorError> {
        Err(SelectorError::Syntax {
            msg: msg.to_owned(),
            pos: self.pos,
        })
    }

    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn matchers(&mut self) -> Result<Vec<Matcher>, SelectorError> {
        let mut out = Vec::new();
        loop {
            self.skip_ws();
            match self.s.get(self.pos) {
                None => return self.err("missing '}'"),
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => {}
            }
            let name = self.name()?;
            self.skip_ws();
            let op = self.op()?;
            self.skip_ws();
            let value = self.string()?;
            out.push(Matcher::new(&name, op, &value)?);
            self.skip_ws();
            match self.s.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                None => return self.err("missing '}'"),
                _ => return self.err("expected ',' or '}'"),
            }
        }
        self.skip_ws();
        if self.pos != self.s.len() {
            return self.err("unexpected text after '}'");
        }
        Ok(out)
    }

    fn name(&mut self) -> Result<String, SelectorError> {
        let start = self.pos;
        while self.pos < self.s.len()
            && (self.s[self.pos].is_ascii_alphanumeric() || matches!(self.s[self.pos], b'_' | b'.'))
        {
            self.pos += 1;
        }
        let name = &self.src[start..self.pos];
        if !valid_label_name(name) {
            self.pos = start;
            return self.err("expected a label name");
        }
        Ok(name.to_owned())
    }

    fn op(&mut self) -> Result<MatchOp, SelectorError> {
        let rest = &self.s[self.pos..];
        let (op, n) = if rest.starts_with(b"=~") {
            (MatchOp::Re, 2)
        } else if rest.starts_with(b"!~") {
            (MatchOp::NotRe, 2)
        } else if rest.starts_with(b"!=") {
            (MatchOp::NotEq, 2)
        } else if rest.starts_with(b"=") {
            (MatchOp::Eq, 1)
        } else {
            return self.err("expected one of =, !=, =~, !~");
        };
        self.pos += n;
        Ok(op)
    }

    fn string(&mut self) -> Result<String, SelectorError> {
        let quote = match self.s.get(self.pos) {
            Some(q @ (b'"' | b'\'' | b'`')) => *q,
            _ => return self.err("expected a quoted value"),
        };
        self.pos += 1;
        let mut out = String::new();
        let rest = &self.src[self.pos..];
        let mut chars = rest.char_indices();
        while let Some((i, c)) = chars.next() {
            if c as u32 == quote as u32 {
                self.pos += i + 1;
                return Ok(out);
            }
            if c == '\\' && quote != b'`' {
                match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, 't')) => out.push('\t'),
                    Some((_, c2)) => out.push(c2),
                    None => break,
                }
            } else {
                out.push(c);
            }
        }
        self.pos = self.s.len();
        self.err("unterminated string")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_full_selector() {
        let s = Selector::parse(
            r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="api", env!="dev", pod=~"api-.*", zone!~'eu.*'}"#,
        )
        .unwrap();
        assert_eq!(s.profile_type.as_ref().unwrap().name, "process_cpu");
        assert_eq!(s.matchers.len(), 4);
        let t = s.profile_type.clone().unwrap();
        let ok = Labels::from_pairs([
            ("service_name", "api"),
            ("env", "prod"),
            ("pod", "api-1"),
            ("zone", "us"),
        ])
        .unwrap();
        assert!(s.matches(&t, &ok));
        let bad = Labels::from_pairs([("service_name", "api"), ("pod", "xapi-1")]).unwrap();
        assert!(!s.matches(&t, &bad));
    }

    #[test]
    fn regex_is_anchored_and_absent_label_is_empty() {
        let s = Selector::parse(r#"{a=~"b"}"#).unwrap();
        assert!(!s.matches_labels(&Labels::from_pairs([("a", "abc")]).unwrap()));
        let s = Selector::parse(r#"{a=""}"#).unwrap();
        assert!(s.matches_labels(&Labels::new()));
    }

    #[test]
    fn errors_name_the_problem() {
        for bad in [
            "",
            "{",
            "{a}",
            "{a=b}",
            r#"{a="b"} x"#,
            r#"{a=~"("}"#,
            r#"{a="b}"#,
            "a:b{}",
            r#"{1a="x"}"#,
        ] {
            let e = Selector::parse(bad).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        assert!(matches!(
            Selector::parse(r#"{a=~"("}"#),
            Err(SelectorError::BadRegex { .. })
        ));
    }

    proptest! {
        #[test]
        fn never_panics(s in ".{0,64}") {
            let _ = Selector::parse(&s);
        }

        #[test]
        fn equality_round_trips(name in "[a-z_][a-z0-9_]{0,10}", value in "[ -~]{0,20}") {
            let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
            let s = Selector::parse(&format!("{{{name}=\"{escaped}\"}}")).unwrap();
            prop_assert_eq!(&s.matchers[0].value, &value);
            let labels = Labels::from_pairs([(name.clone(), value.clone())]).unwrap();
            prop_assert!(s.matches_labels(&labels));
        }
    }
}
