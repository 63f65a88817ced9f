//! Function names, files and lines of Go binaries from `.gopclntab`, the
//! table the Go runtime itself symbolizes with: it survives `-ldflags=-s
//! -w` and `strip`, so stripped Go binaries need no separate debug info.
//!
//! Formats of Go 1.18 and later (the fields read here are laid out alike
//! in 1.18–1.19 and 1.20+, whose function records only add a field after
//! them). Inlined frames are not expanded: their tree is reached through
//! `go:func.*`, which a stripped binary does not name, so an inlined call
//! reads as its outermost function with the line of the code executing.

/// A parsed `.gopclntab`, borrowing the section's bytes.
pub(crate) struct GoTable<'a> {
    data: &'a [u8],
    quantum: u64,
    nfunc: usize,
    text_start: u64,
    funcnames: usize,
    cutab: usize,
    filetab: usize,
    pctab: usize,
    functab: usize,
}

const GO118: u32 = 0xffff_fff0;
const GO120: u32 = 0xffff_fff1;

impl<'a> GoTable<'a> {
    /// Parses the header; `None` for an unknown or damaged table.
    pub(crate) fn parse(data: &'a [u8]) -> Option<Self> {
        let magic = u32::from_le_bytes(data.get(0..4)?.try_into().ok()?);
        if magic != GO118 && magic != GO120 {
            return None;
        }
        let quantum = u64::from(*data.get(6)?);
        let ptr = usize::from(*data.get(7)?);
        if ptr != 4 && ptr != 8 {
            return None;
        }
        let word = |i: usize| -> Option<u64> {
            let at = 8usize.checked_add(i.checked_mul(ptr)?)?;
            let b = data.get(at..at.checked_add(ptr)?)?;
            Some(if ptr == 8 {
                u64::from_le_bytes(b.try_into().ok()?)
            } else {
                u64::from(u32::from_le_bytes(b.try_into().ok()?))
            })
        };
        let off = |i: usize| -> Option<usize> { usize::try_from(word(i)?).ok() };
        let t = GoTable {
            data,
            quantum: quantum.max(1),
            nfunc: off(0)?,
            text_start: word(2)?,
            funcnames: off(3)?,
            cutab: off(4)?,
            filetab: off(5)?,
            pctab: off(6)?,
            functab: off(7)?,
        };
        // The function table must fit.
        let end = t
            .nfunc
            .checked_add(1)?
            .checked_mul(8)?
            .checked_add(t.functab)?;
        (end <= data.len()).then_some(t)
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        Some(u32::from_le_bytes(
            self.data.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    }

    fn cstr(&self, at: usize) -> Option<&'a str> {
        let rest = self.data.get(at..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// The entry of function `i` (an address) and its record's offset.
    fn entry(&self, i: usize) -> Option<(u64, usize)> {
        let at = self.functab.checked_add(i.checked_mul(8)?)?;
        let entry = self.text_start.checked_add(u64::from(self.u32_at(at)?))?;
        let func = self
            .functab
            .checked_add(usize::try_from(self.u32_at(at + 4)?).ok()?)?;
        Some((entry, func))
    }

    /// (function, file, line) at virtual address `pc`.
    pub(crate) fn lookup(&self, pc: u64) -> Option<(String, String, i64)> {
        // The last function whose entry is at or below `pc` (binary search
        // over the sorted entries; entry `nfunc` is the end of the text).
        let (mut lo, mut hi) = (0usize, self.nfunc);
        let (end, _) = self.entry(self.nfunc)?;
        if pc < self.entry(0)?.0 || pc >= end {
            return None;
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.entry(mid)?.0 <= pc {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (entry, func) = self.entry(lo)?;
        let field = |i: usize| self.u32_at(func.checked_add(i * 4)?);
        let name_off = usize::try_from(field(1)?).ok()?;
        let pcfile = field(5)?;
        let pcln = field(6)?;
        let cu = usize::try_from(field(8)?).ok()?;
        let name = self.cstr(self.funcnames.checked_add(name_off)?)?.to_owned();
        let line = self.pcvalue(pcln, entry, pc).unwrap_or(0);
        let file = self
            .pcvalue(pcfile, entry, pc)
            .and_then(|f| usize::try_from(f).ok())
            .and_then(|f| {
                let at = self.cutab.checked_add(cu.checked_add(f)?.checked_mul(4)?)?;
                let off = usize::try_from(self.u32_at(at)?).ok()?;
                self.cstr(self.filetab.checked_add(off)?)
            })
            .unwrap_or("")
            .to_owned();
        Some((name, file, line))
    }

    /// The value of pc-value table `off` at `pc` in the function at `entry`.
    fn pcvalue(&self, off: u32, entry: u64, pc: u64) -> Option<i64> {
        if off == 0 {
            return None;
        }
        let mut at = self.pctab.checked_add(usize::try_from(off).ok()?)?;
        let mut val: i64 = -1;
        let mut cur = entry;
        let mut first = true;
        loop {
            let (uv, n) = varint(self.data.get(at..)?)?;
            at += n;
            if uv == 0 && !first {
                return None;
            }
            first = false;
            let delta = if uv & 1 != 0 {
                -((uv >> 1) as i64) - 1
            } else {
                (uv >> 1) as i64
            };
            val = val.checked_add(delta)?;
            let (pcd, n) = varint(self.data.get(at..)?)?;
            at += n;
            cur = cur.checked_add(pcd.checked_mul(self.quantum)?)?;
            if pc < cur {
                return Some(val);
            }
        }
    }
}

fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_none_not_a_panic() {
        assert!(GoTable::parse(b"").is_none());
        assert!(GoTable::parse(&[0xf0, 0xff, 0xff, 0xff, 0, 0, 1, 8]).is_none());
        let mut h = vec![0xf0, 0xff, 0xff, 0xff, 0, 0, 1, 8];
        h.extend_from_slice(&u64::MAX.to_le_bytes());
        h.resize(100, 0);
        assert!(GoTable::parse(&h).is_none());
        assert_eq!(varint(&[0x80, 0x01]), Some((128, 2)));
        assert_eq!(varint(&[0x80]), None);
    }
}
