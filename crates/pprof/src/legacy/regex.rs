//! A tiny regular-expression engine, just big enough to transcribe the
//! patterns of Go's `profile/legacy_profile.go` verbatim.
//!
//! It has Go's RE2 leftmost-first submatch semantics (the match a
//! backtracking engine would report) and runs in O(program × text) time
//! thanks to a visited set over (instruction, position) pairs, the same
//! technique as RE2's "BitState" engine: a state reached a second time can
//! only lead where the first, higher-priority visit already failed to go.
//!
//! It works on bytes. For the patterns used here that is equivalent to Go's
//! rune-based matching: every class that accepts non-ASCII input (`.`,
//! `\S`, negated sets) accepts all bytes of a multi-byte character, and
//! `\s`, `\d`, `\w` and POSIX classes are ASCII-only in Go as well.
//!
//! Supported syntax: literals, `.`, `\s \S \d \D \w \W`, escaped
//! punctuation, `[...]` and `[^...]` with ranges, escapes and
//! `[:digit:]`/`[:xdigit:]`/`[:alpha:]`/`[:alnum:]`/`[:space:]`, groups
//! `(...)` and `(?:...)`, greedy `* + ?`, alternation `|`, and the anchors
//! `^ $ \A \z` (without multi-line mode, `^`/`$` are `\A`/`\z`, as in Go).
//! Patterns are compiled from string literals in this crate; a bad pattern
//! is a programming error caught by the unit tests, reported as `None`.

/// A set of bytes.
#[derive(Clone, Copy, Default)]
struct ByteSet([u64; 4]);

impl ByteSet {
    fn add(&mut self, b: u8) {
        self.0[usize::from(b >> 6)] |= 1u64 << (b & 63);
    }

    fn add_range(&mut self, lo: u8, hi: u8) {
        for b in lo..=hi {
            self.add(b);
        }
    }

    fn add_set(&mut self, o: &ByteSet) {
        for i in 0..4 {
            self.0[i] |= o.0[i];
        }
    }

    fn negate(&mut self) {
        for w in &mut self.0 {
            *w = !*w;
        }
    }

    fn contains(&self, b: u8) -> bool {
        self.0[usize::from(b >> 6)] & (1u64 << (b & 63)) != 0
    }

    fn of(f: impl Fn(u8) -> bool) -> ByteSet {
        let mut s = ByteSet::default();
        for b in 0..=255u8 {
            if f(b) {
                s.add(b);
            }
        }
        s
    }
}

fn is_space(b: u8) -> bool {
    // Go's \s: [\t\n\f\r ].
    matches!(b, b'\t' | b'\n' | 0x0c | b'\r' | b' ')
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

enum Node {
    Set(ByteSet),
    Concat(Vec<Node>),
    Alt(Vec<Node>),
    Star(Box<Node>),
    Plus(Box<Node>),
    Quest(Box<Node>),
    Capture(usize, Box<Node>),
    Start,
    End,
}

struct Parser<'a> {
    p: &'a [u8],
    i: usize,
    ncap: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.p.get(self.i).copied()
    }

    fn alt(&mut self) -> Option<Node> {
        let mut alts = vec![self.concat()?];
        while self.peek() == Some(b'|') {
            self.i += 1;
            alts.push(self.concat()?);
        }
        Some(if alts.len() == 1 {
            alts.pop()?
        } else {
            Node::Alt(alts)
        })
    }

    fn concat(&mut self) -> Option<Node> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == b'|' || c == b')' {
                break;
            }
            let mut atom = self.atom()?;
            while let Some(q) = self.peek() {
                atom = match q {
                    b'*' => Node::Star(Box::new(atom)),
                    b'+' => Node::Plus(Box::new(atom)),
                    b'?' => Node::Quest(Box::new(atom)),
                    _ => break,
                };
                self.i += 1;
                // Non-greedy quantifiers are not needed and not supported.
                if self.peek() == Some(b'?') {
                    return None;
                }
            }
            items.push(atom);
        }
        Some(Node::Concat(items))
    }

    fn atom(&mut self) -> Option<Node> {
        let c = self.peek()?;
        self.i += 1;
        Some(match c {
            b'(' => {
                let cap = if self.p[self.i..].starts_with(b"?:") {
                    self.i += 2;
                    None
                } else {
                    self.ncap += 1;
                    Some(self.ncap)
                };
                let inner = self.alt()?;
                if self.peek() != Some(b')') {
                    return None;
                }
                self.i += 1;
                match cap {
                    Some(n) => Node::Capture(n, Box::new(inner)),
                    None => inner,
                }
            }
            b'[' => Node::Set(self.class()?),
            b'.' => Node::Set(ByteSet::of(|b| b != b'\n')),
            b'^' => Node::Start,
            b'$' => Node::End,
            b'\\' => {
                let e = self.peek()?;
                self.i += 1;
                match e {
                    b'A' => Node::Start,
                    b'z' => Node::End,
                    _ => Node::Set(escape_set(e)?),
                }
            }
            b'*' | b'+' | b'?' | b')' => return None,
            _ => {
                let mut s = ByteSet::default();
                s.add(c);
                Node::Set(s)
            }
        })
    }

    /// Parses a bracket expression after its `[`.
    fn class(&mut self) -> Option<ByteSet> {
        let mut set = ByteSet::default();
        let negate = self.peek() == Some(b'^');
        if negate {
            self.i += 1;
        }
        let mut first = true;
        loop {
            let c = self.peek()?;
            if c == b']' && !first {
                self.i += 1;
                break;
            }
            first = false;
            if self.p[self.i..].starts_with(b"[:") {
                let rest = &self.p[self.i + 2..];
                let end = rest.windows(2).position(|w| w == b":]")?;
                let name = &rest[..end];
                let named = match name {
                    b"digit" => ByteSet::of(|b| b.is_ascii_digit()),
                    b"xdigit" => ByteSet::of(|b| b.is_ascii_hexdigit()),
                    b"alpha" => ByteSet::of(|b| b.is_ascii_alphabetic()),
                    b"alnum" => ByteSet::of(|b| b.is_ascii_alphanumeric()),
                    b"space" => ByteSet::of(|b| b.is_ascii_whitespace() || b == 0x0b),
                    _ => return None,
                };
                set.add_set(&named);
                self.i += 2 + end + 2;
                continue;
            }
            self.i += 1;
            let lo = if c == b'\\' {
                let e = self.peek()?;
                self.i += 1;
                let s = escape_set(e)?;
                if e.is_ascii_alphabetic() {
                    // A class escape such as \s or \w: not a range endpoint.
                    set.add_set(&s);
                    continue;
                }
                e
            } else {
                c
            };
            // A range `lo-hi`, unless the '-' is the last char of the class.
            if self.peek() == Some(b'-') && self.p.get(self.i + 1).is_some_and(|&n| n != b']') {
                self.i += 1;
                let mut hi = self.peek()?;
                self.i += 1;
                if hi == b'\\' {
                    hi = self.peek()?;
                    self.i += 1;
                }
                if hi < lo {
                    return None;
                }
                set.add_range(lo, hi);
            } else {
                set.add(lo);
            }
        }
        if negate {
            set.negate();
        }
        Some(set)
    }
}

fn escape_set(e: u8) -> Option<ByteSet> {
    Some(match e {
        b's' => ByteSet::of(is_space),
        b'S' => ByteSet::of(|b| !is_space(b)),
        b'd' => ByteSet::of(|b| b.is_ascii_digit()),
        b'D' => ByteSet::of(|b| !b.is_ascii_digit()),
        b'w' => ByteSet::of(is_word),
        b'W' => ByteSet::of(|b| !is_word(b)),
        b'n' => ByteSet::of(|b| b == b'\n'),
        b't' => ByteSet::of(|b| b == b'\t'),
        _ if e.is_ascii_punctuation() => ByteSet::of(|b| b == e),
        _ => return None,
    })
}

#[derive(Clone, Copy)]
enum Inst {
    Set(ByteSet),
    /// Try the first target, then the second.
    Split(usize, usize),
    Jmp(usize),
    Save(usize),
    Start,
    End,
    Match,
}

fn compile(n: &Node, prog: &mut Vec<Inst>) {
    match n {
        Node::Set(s) => prog.push(Inst::Set(*s)),
        Node::Concat(items) => {
            for it in items {
                compile(it, prog);
            }
        }
        Node::Alt(alts) => {
            let mut jumps = Vec::new();
            for (k, a) in alts.iter().enumerate() {
                if k + 1 < alts.len() {
                    let split = prog.len();
                    prog.push(Inst::Split(split + 1, 0));
                    compile(a, prog);
                    jumps.push(prog.len());
                    prog.push(Inst::Jmp(0));
                    let next = prog.len();
                    prog[split] = Inst::Split(split + 1, next);
                } else {
                    compile(a, prog);
                }
            }
            let end = prog.len();
            for j in jumps {
                prog[j] = Inst::Jmp(end);
            }
        }
        Node::Star(e) => {
            let split = prog.len();
            prog.push(Inst::Split(split + 1, 0));
            compile(e, prog);
            prog.push(Inst::Jmp(split));
            let end = prog.len();
            prog[split] = Inst::Split(split + 1, end);
        }
        Node::Plus(e) => {
            let start = prog.len();
            compile(e, prog);
            let end = prog.len() + 1;
            prog.push(Inst::Split(start, end));
        }
        Node::Quest(e) => {
            let split = prog.len();
            prog.push(Inst::Split(split + 1, 0));
            compile(e, prog);
            let end = prog.len();
            prog[split] = Inst::Split(split + 1, end);
        }
        Node::Capture(k, e) => {
            prog.push(Inst::Save(2 * k));
            compile(e, prog);
            prog.push(Inst::Save(2 * k + 1));
        }
        Node::Start => prog.push(Inst::Start),
        Node::End => prog.push(Inst::End),
    }
}

/// A compiled pattern.
pub(crate) struct Regex {
    prog: Vec<Inst>,
    ncap: usize,
    anchored: bool,
}

/// The submatches of a successful match: `get(0)` is the whole match.
pub(crate) struct Captures<'t> {
    text: &'t [u8],
    slots: Vec<Option<usize>>,
}

impl<'t> Captures<'t> {
    /// Group `i`, or `None` when it did not participate in the match.
    pub(crate) fn get(&self, i: usize) -> Option<&'t [u8]> {
        let s = (*self.slots.get(2 * i)?)?;
        let e = (*self.slots.get(2 * i + 1)?)?;
        self.text.get(s..e)
    }

    /// Group `i`, or the empty slice when it did not participate (Go's
    /// `FindStringSubmatch` reports such groups as "").
    pub(crate) fn str(&self, i: usize) -> &'t [u8] {
        self.get(i).unwrap_or(&[])
    }

    /// The end offset of the whole match.
    pub(crate) fn end(&self) -> usize {
        self.slots.get(1).copied().flatten().unwrap_or(0)
    }
}

enum Job {
    Explore(usize, usize),
    Restore(usize, Option<usize>),
}

impl Regex {
    /// Compiles `pattern`; `None` if it uses unsupported syntax.
    pub(crate) fn new(pattern: &str) -> Option<Regex> {
        let mut p = Parser {
            p: pattern.as_bytes(),
            i: 0,
            ncap: 0,
        };
        let node = p.alt()?;
        if p.i != p.p.len() {
            return None;
        }
        let mut prog = vec![Inst::Save(0)];
        compile(&node, &mut prog);
        prog.push(Inst::Save(1));
        prog.push(Inst::Match);
        let anchored = matches!(prog.get(1), Some(Inst::Start));
        Some(Regex {
            prog,
            ncap: p.ncap,
            anchored,
        })
    }

    /// A pattern that matches nothing (the fallback for a pattern that
    /// failed to compile; unit tests make sure none does).
    pub(crate) fn never() -> Regex {
        Regex {
            prog: vec![Inst::Set(ByteSet::default()), Inst::Match],
            ncap: 0,
            anchored: true,
        }
    }

    /// Whether this is [`Regex::never`].
    #[cfg(test)]
    pub(crate) fn is_never(&self) -> bool {
        matches!(self.prog.as_slice(), [Inst::Set(s), Inst::Match] if s.0 == [0; 4])
    }

    /// The leftmost-first match in `text` with its submatches (Go's
    /// `FindSubmatch`).
    pub(crate) fn captures<'t>(&self, text: &'t [u8]) -> Option<Captures<'t>> {
        let n = text.len() + 1;
        let bits = self.prog.len().checked_mul(n)?;
        let mut visited = vec![0u64; bits.div_ceil(64)];
        let mut slots = vec![None; 2 * (self.ncap + 1)];
        let mut stack = Vec::new();
        let last_start = if self.anchored { 0 } else { text.len() };
        for start in 0..=last_start {
            stack.push(Job::Explore(0, start));
            while let Some(job) = stack.pop() {
                let (mut pc, mut pos) = match job {
                    Job::Restore(slot, v) => {
                        slots[slot] = v;
                        continue;
                    }
                    Job::Explore(pc, pos) => (pc, pos),
                };
                loop {
                    let bit = pc * n + pos;
                    let (w, b) = (bit / 64, 1u64 << (bit % 64));
                    if visited[w] & b != 0 {
                        break;
                    }
                    visited[w] |= b;
                    match self.prog[pc] {
                        Inst::Set(ref s) => {
                            if pos < text.len() && s.contains(text[pos]) {
                                pc += 1;
                                pos += 1;
                            } else {
                                break;
                            }
                        }
                        Inst::Split(a, b) => {
                            stack.push(Job::Explore(b, pos));
                            pc = a;
                        }
                        Inst::Jmp(a) => pc = a,
                        Inst::Save(slot) => {
                            stack.push(Job::Restore(slot, slots[slot]));
                            slots[slot] = Some(pos);
                            pc += 1;
                        }
                        Inst::Start => {
                            if pos == 0 {
                                pc += 1;
                            } else {
                                break;
                            }
                        }
                        Inst::End => {
                            if pos == text.len() {
                                pc += 1;
                            } else {
                                break;
                            }
                        }
                        Inst::Match => return Some(Captures { text, slots }),
                    }
                }
            }
        }
        None
    }

    /// Whether the pattern matches anywhere in `text`.
    pub(crate) fn is_match(&self, text: &[u8]) -> bool {
        self.captures(text).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(re: &str, text: &str) -> Option<Vec<String>> {
        let r = Regex::new(re).expect("pattern compiles");
        let c = r.captures(text.as_bytes())?;
        Some(
            (0..=r.ncap)
                .map(|i| String::from_utf8_lossy(c.str(i)).into_owned())
                .collect(),
        )
    }

    #[test]
    fn leftmost_first_backtracking() {
        // Go: (\d+) *(\d+) @ on "12345 @" backtracks into the first group.
        assert_eq!(
            caps(r"(\d+) *(\d+) @([ x0-9a-f]*)", "12345 @ 0x1"),
            Some(vec![
                "12345 @ 0x1".into(),
                "1234".into(),
                "5".into(),
                " 0x1".into()
            ])
        );
        // Greedy (.*) takes the last '(' preceded by a space.
        assert_eq!(
            caps(r"^(.*)\s+\((.+):(-?[[:digit:]]+)\)$", "a (b) c (F.java:12)"),
            Some(vec![
                "a (b) c (F.java:12)".into(),
                "a (b) c".into(),
                "F.java".into(),
                "12".into()
            ])
        );
        assert_eq!(
            caps(r"\A(\S+) profile: total \d+\z", "x profile: total 1 "),
            None
        );
        assert_eq!(caps(r"a|b(c)", "zbc"), Some(vec!["bc".into(), "c".into()]));
    }

    #[test]
    fn optional_groups_report_empty() {
        let r = Regex::new(r"^(a)?(b)").expect("compiles");
        let c = r.captures(b"b").expect("matches");
        assert_eq!(c.get(1), None);
        assert_eq!(c.str(1), b"");
        assert_eq!(c.str(2), b"b");
    }

    #[test]
    fn classes() {
        assert!(Regex::new(r"[-rwxp]+").is_some_and(|r| r.is_match(b"r-xp")));
        assert!(Regex::new(r"^[\s-]?x$").is_some_and(|r| r.is_match(b"-x")));
        assert!(Regex::new(r"^[^\[\]]+:[0-9]+]\s").is_some_and(|r| r.is_match(b"a.cc:12] x")));
        assert!(Regex::new(r"[[:xdigit:]]+").is_some_and(|r| r.is_match(b"F")));
        assert!(Regex::new(r"a??").is_none());
        assert!(Regex::new(r"(a").is_none());
    }

    #[test]
    fn linear_time_on_pathological_input() {
        let r = Regex::new(r"^(.*)\s+\((.+):(-?[[:digit:]]+)\)$").expect("compiles");
        let text = "( :".repeat(20_000);
        assert!(r.captures(text.as_bytes()).is_none());
    }
}
