use std::collections::HashMap;

use crate::ids::{Id, IdHasher};

/// A function as pprof describes it. Its id hashes every field.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Function {
    pub name: String,
    pub system_name: String,
    pub filename: String,
    pub start_line: i64,
}

impl Function {
    pub fn id(&self) -> Id {
        IdHasher::new("function")
            .str(&self.name)
            .str(&self.system_name)
            .str(&self.filename)
            .i64(self.start_line)
            .finish()
    }
}

/// A mapped binary. Its id hashes the fields that identify the binary and
/// where it was loaded.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Mapping {
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub filename: String,
    pub build_id: String,
}

impl Mapping {
    pub fn id(&self) -> Id {
        IdHasher::new("mapping")
            .u64(self.memory_start)
            .u64(self.memory_limit)
            .u64(self.file_offset)
            .str(&self.filename)
            .str(&self.build_id)
            .finish()
    }
}

/// One line of a location: a function and a line number. A location with
/// several lines is an inlined call chain, callee first (pprof's order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    pub function: Id,
    pub line: i64,
}

/// A program counter with its symbolization. `mapping` is [`Id::ZERO`] when
/// the profile had no mapping for it; `lines` is empty when unsymbolized.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Location {
    pub mapping: Id,
    pub address: u64,
    pub lines: Vec<Line>,
}

impl Location {
    pub fn id(&self) -> Id {
        let mut h = IdHasher::new("location");
        h.id(&self.mapping)
            .u64(self.address)
            .u64(self.lines.len() as u64);
        for l in &self.lines {
            h.id(&l.function).i64(l.line);
        }
        h.finish()
    }
}

/// A call stack: location ids, leaf first (pprof's order).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    pub locations: Vec<Id>,
}

impl Stack {
    pub fn id(&self) -> Id {
        let mut h = IdHasher::new("stack");
        h.u64(self.locations.len() as u64);
        for l in &self.locations {
            h.id(l);
        }
        h.finish()
    }
}

/// A symbol table: everything a set of samples refers to, keyed by
/// content-addressed ids. Merging two tables is a union by id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Symbols {
    pub stacks: HashMap<Id, Stack>,
    pub locations: HashMap<Id, Location>,
    pub functions: HashMap<Id, Function>,
    pub mappings: HashMap<Id, Mapping>,
}

impl Symbols {
    pub fn add_function(&mut self, f: Function) -> Id {
        let id = f.id();
        self.functions.entry(id).or_insert(f);
        id
    }

    pub fn add_mapping(&mut self, m: Mapping) -> Id {
        let id = m.id();
        self.mappings.entry(id).or_insert(m);
        id
    }

    pub fn add_location(&mut self, l: Location) -> Id {
        let id = l.id();
        self.locations.entry(id).or_insert(l);
        id
    }

    pub fn add_stack(&mut self, s: Stack) -> Id {
        let id = s.id();
        self.stacks.entry(id).or_insert(s);
        id
    }

    /// Adds every entry of `other` (a union by id).
    pub fn merge(&mut self, other: &Symbols) {
        for (k, v) in &other.stacks {
            self.stacks.entry(*k).or_insert_with(|| v.clone());
        }
        for (k, v) in &other.locations {
            self.locations.entry(*k).or_insert_with(|| v.clone());
        }
        for (k, v) in &other.functions {
            self.functions.entry(*k).or_insert_with(|| v.clone());
        }
        for (k, v) in &other.mappings {
            self.mappings.entry(*k).or_insert_with(|| v.clone());
        }
    }

    /// The frame names of a stack, root first and leaf last, inlined
    /// functions expanded (caller before callee). A location without lines
    /// prints as its address, `0x<hex>`. Unknown ids print as `?`.
    pub fn frames(&self, stack: &Id) -> Vec<String> {
        self.frames_by(stack, |f| f.name.clone())
    }

    /// [`Symbols::frames`] with each function's name chosen by `name`.
    pub fn frames_by(&self, stack: &Id, name: impl Fn(&Function) -> String) -> Vec<String> {
        let mut out = Vec::new();
        let Some(s) = self.stacks.get(stack) else {
            out.push("?".to_owned());
            return out;
        };
        for loc_id in s.locations.iter().rev() {
            match self.locations.get(loc_id) {
                None => out.push("?".to_owned()),
                Some(loc) if loc.lines.is_empty() => out.push(format!("0x{:x}", loc.address)),
                Some(loc) => {
                    for line in loc.lines.iter().rev() {
                        out.push(
                            self.functions
                                .get(&line.function)
                                .map(&name)
                                .unwrap_or_else(|| "?".to_owned()),
                        );
                    }
                }
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// The part of this table that `stacks` need: those stacks and every
    /// location, function and mapping they reach. Unknown stacks are skipped.
    pub fn subset<'a>(&self, stacks: impl IntoIterator<Item = &'a Id>) -> Symbols {
        let mut out = Symbols::default();
        for sid in stacks {
            let Some(st) = self.stacks.get(sid) else {
                continue;
            };
            if out.stacks.insert(*sid, st.clone()).is_some() {
                continue;
            }
            for lid in &st.locations {
                let Some(loc) = self.locations.get(lid) else {
                    continue;
                };
                if out.locations.contains_key(lid) {
                    continue;
                }
                if let Some(m) = self.mappings.get(&loc.mapping) {
                    out.mappings.entry(loc.mapping).or_insert_with(|| m.clone());
                }
                for line in &loc.lines {
                    if let Some(f) = self.functions.get(&line.function) {
                        out.functions
                            .entry(line.function)
                            .or_insert_with(|| f.clone());
                    }
                }
                out.locations.insert(*lid, loc.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_symbols() -> (Symbols, Id) {
        let mut s = Symbols::default();
        let main = s.add_function(Function {
            name: "main".into(),
            ..Default::default()
        });
        let a = s.add_function(Function {
            name: "a".into(),
            ..Default::default()
        });
        let b = s.add_function(Function {
            name: "b".into(),
            ..Default::default()
        });
        let l_main = s.add_location(Location {
            address: 1,
            lines: vec![Line {
                function: main,
                line: 1,
            }],
            ..Default::default()
        });
        // b inlined into a: callee first.
        let l_ab = s.add_location(Location {
            address: 2,
            lines: vec![
                Line {
                    function: b,
                    line: 3,
                },
                Line {
                    function: a,
                    line: 2,
                },
            ],
            ..Default::default()
        });
        let l_raw = s.add_location(Location {
            address: 0xbeef,
            ..Default::default()
        });
        let st = s.add_stack(Stack {
            locations: vec![l_raw, l_ab, l_main],
        });
        (s, st)
    }

    #[test]
    fn frames_root_first_with_inlines() {
        let (s, st) = sample_symbols();
        assert_eq!(s.frames(&st), vec!["main", "a", "b", "0xbeef"]);
    }

    #[test]
    fn merge_is_union_by_id() {
        let (s, st) = sample_symbols();
        let mut m = Symbols::default();
        m.merge(&s);
        m.merge(&s);
        assert_eq!(m, s);
        assert_eq!(m.frames(&st), s.frames(&st));
    }
}
