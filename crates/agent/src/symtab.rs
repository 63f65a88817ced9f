//! Compact address → name tables for the kernel (/proc/kallsyms) and for JIT
//! perf maps (/tmp/perf-<pid>.map).
//!
//! Names live in one string arena with u32 offsets, so the ~120k kernel text
//! symbols of a typical kernel cost ~4 MB rather than one heap string each.

use std::io::{self, BufRead};

/// A sorted table of symbols. With sizes (perf maps), an address past the end
/// of the symbol before it resolves to nothing; without (kallsyms), it
/// resolves to the closest symbol below it.
#[derive(Debug, Default)]
pub(crate) struct SymbolTable {
    addrs: Vec<u64>,
    /// End offset of each name in `names`; a name starts where the previous ends.
    ends: Vec<u32>,
    /// Symbol sizes, when the source has them.
    sizes: Option<Vec<u64>>,
    /// Index of the module name (in `modules`) per symbol; 0 = none.
    module: Vec<u16>,
    modules: Vec<String>,
    names: String,
}

/// One resolved symbol.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Found<'a> {
    pub(crate) name: &'a str,
    pub(crate) module: Option<&'a str>,
}

impl SymbolTable {
    fn builder(with_sizes: bool) -> Builder {
        Builder {
            addrs: Vec::new(),
            sizes: Vec::new(),
            ends: Vec::new(),
            module: Vec::new(),
            names: String::new(),
            with_sizes,
            modules: vec![String::new()],
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.addrs.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    /// The symbol containing `addr`.
    pub(crate) fn lookup(&self, addr: u64) -> Option<Found<'_>> {
        let i = self.addrs.partition_point(|&a| a <= addr).checked_sub(1)?;
        if let Some(sizes) = &self.sizes
            && addr - self.addrs[i] >= sizes[i].max(1)
        {
            return None;
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        let name = &self.names[start..self.ends[i] as usize];
        let m = self.module[i];
        Some(Found {
            name,
            module: (m != 0).then(|| self.modules[usize::from(m)].as_str()),
        })
    }

    /// Approximate heap bytes held.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.addrs.capacity() * 8
            + self.ends.capacity() * 4
            + self.module.capacity() * 2
            + self.sizes.as_ref().map_or(0, |s| s.capacity() * 8)
            + self.names.capacity()
    }

    /// Parses /proc/kallsyms text: keeps text symbols (t, T, w, W). Returns an
    /// empty table when addresses are hidden (kptr_restrict: all zero).
    pub(crate) fn parse_kallsyms(r: impl BufRead) -> io::Result<SymbolTable> {
        let mut b = SymbolTable::builder(false);
        let mut nonzero = false;
        let mut r = r;
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                break;
            }
            let mut it = line.split_ascii_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            nonzero |= addr != 0;
            let module = it
                .next()
                .and_then(|m| m.strip_prefix('[').and_then(|m| m.strip_suffix(']')));
            b.push(addr, 0, name, module);
        }
        if !nonzero {
            return Ok(SymbolTable::default());
        }
        Ok(b.build())
    }

    /// Parses a perf map: `START SIZE name` per line, hex without 0x (a 0x
    /// prefix is accepted), the name may contain spaces. Bad lines are skipped.
    pub(crate) fn parse_perf_map(r: impl BufRead) -> io::Result<SymbolTable> {
        let mut b = SymbolTable::builder(true);
        let mut r = r;
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                break;
            }
            let line = line.trim_end_matches(['\n', '\r']);
            let mut it = line.splitn(3, ' ');
            let (Some(start), Some(size), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
            let (Some(start), Some(size)) = (hex(start), hex(size)) else {
                continue;
            };
            b.push(start, size, name.trim_end(), None);
        }
        Ok(b.build())
    }
}

/// Collects symbols in input order: names go straight into one arena (no
/// string per symbol), so reading the ~120k kernel symbols peaks at a few
/// MB over the final table rather than a heap string per line.
struct Builder {
    addrs: Vec<u64>,
    sizes: Vec<u64>,
    /// End offset of each name in `names`, in input order.
    ends: Vec<u32>,
    module: Vec<u16>,
    names: String,
    with_sizes: bool,
    modules: Vec<String>,
}

impl Builder {
    fn push(&mut self, addr: u64, size: u64, name: &str, module: Option<&str>) {
        if self.names.len() + name.len() > u32::MAX as usize {
            return;
        }
        let m = match module {
            None => 0,
            Some(m) => match self.modules.iter().position(|x| x == m) {
                Some(i) => i,
                None => {
                    self.modules.push(m.to_owned());
                    self.modules.len() - 1
                }
            },
        };
        // More than 65k modules does not happen; fold the excess into "none".
        let m = u16::try_from(m).unwrap_or(0);
        self.names.push_str(name);
        self.addrs.push(addr);
        self.ends.push(self.names.len() as u32);
        self.module.push(m);
        if self.with_sizes {
            self.sizes.push(size);
        }
    }

    fn name(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.names[start..self.ends[i] as usize]
    }

    fn build(self) -> SymbolTable {
        // Stable sort keeps the first of several names at one address
        // (kallsyms lists _stext before _text, for example).
        let mut order: Vec<u32> = (0..self.addrs.len() as u32).collect();
        order.sort_by_key(|&i| self.addrs[i as usize]);
        order.dedup_by_key(|i| self.addrs[*i as usize]);
        let n = order.len();
        let mut t = SymbolTable {
            addrs: Vec::with_capacity(n),
            ends: Vec::with_capacity(n),
            sizes: self.with_sizes.then(|| Vec::with_capacity(n)),
            module: Vec::with_capacity(n),
            modules: Vec::new(),
            names: String::with_capacity(order.iter().map(|&i| self.name(i as usize).len()).sum()),
        };
        for i in order {
            let i = i as usize;
            t.names.push_str(self.name(i));
            t.addrs.push(self.addrs[i]);
            t.ends.push(t.names.len() as u32);
            t.module.push(self.module[i]);
            if let Some(s) = &mut t.sizes {
                s.push(self.sizes[i]);
            }
        }
        t.modules = self.modules;
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kallsyms() {
        let text = "\
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000100 t do_syscall_64
ffffffff81000200 D some_data
ffffffff81000300 W weak_fn
garbage line
ffffffffc0001000 t mod_fn\t[e1000]
";
        let t = SymbolTable::parse_kallsyms(text.as_bytes()).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t.lookup(0xffffffff81000000).unwrap().name, "_stext");
        assert_eq!(t.lookup(0xffffffff81000150).unwrap().name, "do_syscall_64");
        // Data symbols are not functions: the text symbol below wins.
        assert_eq!(t.lookup(0xffffffff81000250).unwrap().name, "do_syscall_64");
        let m = t.lookup(0xffffffffc0001010).unwrap();
        assert_eq!(
            m,
            Found {
                name: "mod_fn",
                module: Some("e1000")
            }
        );
        assert!(t.lookup(0x1000).is_none());
    }

    #[test]
    fn hidden_kallsyms_is_empty() {
        let text = "0000000000000000 T _stext\n0000000000000000 t foo\n";
        assert!(
            SymbolTable::parse_kallsyms(text.as_bytes())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn real_kallsyms_if_readable() {
        let Ok(f) = std::fs::File::open("/proc/kallsyms") else {
            return;
        };
        let t = SymbolTable::parse_kallsyms(io::BufReader::new(f)).unwrap();
        if t.is_empty() {
            return; // not root: addresses hidden
        }
        assert!(t.len() > 1000);
        assert!(t.heap_bytes() < 16 << 20, "{} bytes", t.heap_bytes());
    }

    #[test]
    fn perf_map() {
        let text = "\
7f0000001000 40 LazyCompile:~main /app/index.js:1
0x7f0000002000 0x10 Interpreter
zzz 10 bad
7f0000003000
";
        let t = SymbolTable::parse_perf_map(text.as_bytes()).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.lookup(0x7f0000001010).unwrap().name,
            "LazyCompile:~main /app/index.js:1"
        );
        assert!(t.lookup(0x7f0000001040).is_none(), "past the symbol's size");
        assert_eq!(t.lookup(0x7f000000200f).unwrap().name, "Interpreter");
        assert!(t.lookup(0x7f0000000fff).is_none());
    }
}
