//! CPython frames: which processes run a CPython the agent knows, where
//! their frames are, and the names, files and lines of code objects.
//!
//! ```text
//! maps: python3.11 or libpython3.11.so exporting _PyRuntime ──► py_procs[pid] (BPF)
//! BPF, per sample of the GIL holder: tstate → cframe → _PyInterpreterFrame chain
//!      → (f_code, prev_instr | is_entry) per frame
//! agent: code object → co_qualname, co_filename, line of prev_instr (co_linetable),
//!        read from /proc/<pid>/mem and cached per process
//! ```
//!
//! Offsets are per CPython version (below); both Debian's `/usr/bin/python3`
//! (a static interpreter) and a pyenv build with `libpython3.11.so` have
//! the same 3.11 layout. Other versions are not recognized: their samples
//! keep the interpreter's C frames.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::rc::Rc;

use fathom_agent_ebpf::PyProc;

use crate::elf::ElfLayout;

/// Field offsets of one CPython version (from its headers, built with
/// `Py_BUILD_CORE`; x86_64).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PyOffsets {
    /// `_PyRuntimeState.gilstate.tstate_current`
    pub(crate) runtime_tstate_current: u64,
    /// `PyThreadState.native_thread_id`
    pub(crate) tstate_native_thread_id: u32,
    /// `PyThreadState.cframe`
    pub(crate) tstate_cframe: u32,
    /// `_PyCFrame.current_frame`
    pub(crate) cframe_current_frame: u32,
    /// `_PyInterpreterFrame.f_code`, `.previous`, `.prev_instr`, `.is_entry`
    pub(crate) frame_code: u32,
    pub(crate) frame_previous: u32,
    pub(crate) frame_prev_instr: u32,
    pub(crate) frame_is_entry: u32,
    /// `PyCodeObject.co_filename`, `co_name`, `co_qualname`,
    /// `co_firstlineno`, `co_linetable`, `co_code_adaptive`
    pub(crate) code_filename: u64,
    pub(crate) code_qualname: u64,
    pub(crate) code_firstlineno: u64,
    pub(crate) code_linetable: u64,
    pub(crate) code_code_adaptive: u64,
    /// `PyBytesObject.ob_size` and `ob_sval`
    pub(crate) bytes_size: u64,
    pub(crate) bytes_data: u64,
}

/// CPython 3.11 (x86_64).
pub(crate) const PY311: PyOffsets = PyOffsets {
    runtime_tstate_current: 576,
    tstate_native_thread_id: 160,
    tstate_cframe: 56,
    cframe_current_frame: 8,
    frame_code: 32,
    frame_previous: 48,
    frame_prev_instr: 56,
    frame_is_entry: 68,
    code_filename: 112,
    code_qualname: 128,
    code_firstlineno: 72,
    code_linetable: 136,
    code_code_adaptive: 184,
    bytes_size: 16,
    bytes_data: 32,
};

/// The offsets for an interpreter binary, by its file name
/// (`python3.11`, `libpython3.11.so.1.0`); `None` for other versions.
pub(crate) fn offsets_for(path: &str) -> Option<PyOffsets> {
    let name = path.rsplit('/').next()?;
    let is_311 = name == "python3.11"
        || name.starts_with("python3.11")
            && !name.contains(".so")
            && name.len() <= "python3.11d".len()
        || name.starts_with("libpython3.11");
    is_311.then_some(PY311)
}

/// What an interpreter binary exports: `_PyRuntime` and the range of
/// `_PyEval_EvalFrameDefault` (ELF virtual addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PySymbols {
    pub(crate) runtime: u64,
    pub(crate) eval: (u64, u64),
}

/// Reads the two symbols from `.dynsym` (interpreters export them for
/// extension modules, even when stripped).
pub(crate) fn symbols(file: &File) -> Option<PySymbols> {
    let layout = ElfLayout::read(file).ok()?;
    let dynsym = layout.read_section(file, layout.section(".dynsym")?).ok()?;
    let dynstr = layout.read_section(file, layout.section(".dynstr")?).ok()?;
    let (mut runtime, mut eval) = (None, None);
    for sym in dynsym.chunks_exact(24) {
        let name_off = u32::from_ne_bytes(sym[0..4].try_into().ok()?) as usize;
        let value = u64::from_ne_bytes(sym[8..16].try_into().ok()?);
        let size = u64::from_ne_bytes(sym[16..24].try_into().ok()?);
        let Some(rest) = dynstr.get(name_off..) else {
            continue;
        };
        let name = &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())];
        match name {
            b"_PyRuntime" if value != 0 => runtime = Some(value),
            b"_PyEval_EvalFrameDefault" if value != 0 => eval = Some((value, value + size)),
            _ => {}
        }
    }
    Some(PySymbols {
        runtime: runtime?,
        eval: eval?,
    })
}

/// The BPF map value for a process whose interpreter is loaded with `bias`.
pub(crate) fn proc_entry(off: &PyOffsets, sym: &PySymbols, bias: u64) -> PyProc {
    PyProc {
        tstate_addr: sym
            .runtime
            .wrapping_add(bias)
            .wrapping_add(off.runtime_tstate_current),
        tstate_tid: off.tstate_native_thread_id,
        tstate_cframe: off.tstate_cframe,
        cframe_current: off.cframe_current_frame,
        frame_code: off.frame_code,
        frame_previous: off.frame_previous,
        frame_prev_instr: off.frame_prev_instr,
        frame_is_entry: off.frame_is_entry,
        reserved: 0,
    }
}

/// A code object, as far as naming its frames goes.
#[derive(Debug)]
pub(crate) struct Code {
    pub(crate) name: Rc<str>,
    pub(crate) file: Rc<str>,
    first_line: i64,
    linetable: Vec<u8>,
    /// Address of the first instruction.
    code_start: u64,
}

impl Code {
    /// The line of the instruction at `instr` (an address in the code),
    /// from the 3.11 location table; the first line when unknown.
    pub(crate) fn line_at(&self, instr: u64) -> i64 {
        let Some(index) = instr.checked_sub(self.code_start).map(|b| b / 2) else {
            return self.first_line;
        };
        line_for(&self.linetable, self.first_line, index).unwrap_or(self.first_line)
    }
}

/// Line of code unit `index` in a CPython 3.11 location table
/// (Objects/locations.md): entries of a header byte `1cccclll` (code, length
/// − 1 in code units) and a code-dependent payload.
pub(crate) fn line_for(table: &[u8], first_line: i64, index: u64) -> Option<i64> {
    let mut line = first_line;
    let mut at = 0u64;
    let mut i = 0usize;
    let varint = |i: &mut usize| -> Option<u64> {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let b = *table.get(*i)?;
            *i += 1;
            v |= u64::from(b & 63) << shift;
            if b & 64 == 0 {
                return Some(v);
            }
            shift += 6;
            if shift > 60 {
                return None;
            }
        }
    };
    let svarint = |i: &mut usize| -> Option<i64> {
        let v = varint(i)?;
        let m = (v >> 1) as i64;
        Some(if v & 1 != 0 { -m } else { m })
    };
    while i < table.len() {
        let h = table[i];
        i += 1;
        if h & 0x80 == 0 {
            return None;
        }
        let code = (h >> 3) & 15;
        let len = u64::from(h & 7) + 1;
        let mut this_line = Some(line);
        match code {
            15 => this_line = None,
            14 => {
                line += svarint(&mut i)?;
                this_line = Some(line);
                varint(&mut i)?;
                varint(&mut i)?;
                varint(&mut i)?;
            }
            13 => {
                line += svarint(&mut i)?;
                this_line = Some(line);
            }
            10..=12 => {
                line += i64::from(code - 10);
                this_line = Some(line);
                i += 2;
            }
            _ => i += 1,
        }
        if index < at + len {
            return this_line;
        }
        at += len;
    }
    None
}

/// Reads a process's memory.
pub(crate) struct PyProcess {
    mem: File,
    pub(crate) offsets: PyOffsets,
    /// Absolute ranges of `_PyEval_EvalFrameDefault` in the process.
    pub(crate) eval: Vec<(u64, u64)>,
    codes: HashMap<u64, Option<Rc<Code>>>,
}

/// Longest string, line table read from a code object.
const MAX_READ: usize = 64 << 10;
/// Code objects remembered per process.
const MAX_CODES: usize = 65536;

impl PyProcess {
    pub(crate) fn open(pid: u32, offsets: PyOffsets) -> Option<PyProcess> {
        Some(PyProcess {
            mem: File::open(format!("/proc/{pid}/mem")).ok()?,
            offsets,
            eval: Vec::new(),
            codes: HashMap::new(),
        })
    }

    fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut b = vec![0u8; len];
        self.mem.read_exact_at(&mut b, addr).ok()?;
        Some(b)
    }

    fn u64_at(&self, addr: u64) -> Option<u64> {
        Some(u64::from_ne_bytes(self.read(addr, 8)?.try_into().ok()?))
    }

    /// A `str` object's text (compact ASCII or Latin-1 strings; others
    /// are read as far as their one-byte characters go).
    fn string(&self, obj: u64) -> Option<String> {
        // PyASCIIObject: length at 16, state at 32 (interned:2, kind:3,
        // compact:1, ascii:1), data after the 48-byte struct when compact
        // and ASCII, after PyCompactUnicodeObject (72) when only compact.
        let head = self.read(obj, 48)?;
        let len = usize::try_from(u64::from_ne_bytes(head[16..24].try_into().ok()?)).ok()?;
        let state = head[32];
        let kind = (state >> 2) & 7;
        let compact = state & (1 << 5) != 0;
        let ascii = state & (1 << 6) != 0;
        if !compact || kind != 1 {
            return None;
        }
        let data = obj + if ascii { 48 } else { 72 };
        let b = self.read(data, len.min(MAX_READ))?;
        Some(b.iter().map(|&c| c as char).collect())
    }

    /// The code object at `addr`, read once per process.
    pub(crate) fn code(&mut self, addr: u64) -> Option<Rc<Code>> {
        if let Some(c) = self.codes.get(&addr) {
            return c.clone();
        }
        let c = self.read_code(addr).map(Rc::new);
        if self.codes.len() >= MAX_CODES {
            self.codes.clear();
        }
        self.codes.insert(addr, c.clone());
        c
    }

    fn read_code(&self, addr: u64) -> Option<Code> {
        let o = &self.offsets;
        let name = self.string(self.u64_at(addr + o.code_qualname)?)?;
        let file = self.string(self.u64_at(addr + o.code_filename)?)?;
        let first = self.read(addr + o.code_firstlineno, 4)?;
        let first_line = i64::from(i32::from_ne_bytes(first.try_into().ok()?));
        let lt = self.u64_at(addr + o.code_linetable)?;
        let lt_len = usize::try_from(self.u64_at(lt + o.bytes_size)?).ok()?;
        let linetable = self.read(lt + o.bytes_data, lt_len.min(MAX_READ))?;
        Some(Code {
            name: Rc::from(name),
            file: Rc::from(file),
            first_line,
            linetable,
            code_start: addr + o.code_code_adaptive,
        })
    }

    pub(crate) fn is_eval(&self, addr: u64) -> bool {
        self.eval.iter().any(|&(s, e)| addr >= s && addr < e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_by_file_name() {
        assert!(offsets_for("/usr/bin/python3.11").is_some());
        assert!(offsets_for("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0").is_some());
        assert!(offsets_for("/usr/bin/python3.12").is_none());
        assert!(offsets_for("/usr/lib/libpython3.10.so").is_none());
        assert!(offsets_for("/usr/lib/python3.11/lib-dynload/_json.cpython-311.so").is_none());
    }

    #[test]
    fn location_table_lines() {
        // Short form (code 0, 2 units) on the first line; one-line form
        // code 11 (+1 line, 3 units); no-column form (code 13) with
        // svarint −2 (4 → 0b100 | 1 = 5), 1 unit; no location (15), 1 unit.
        let t = [
            0x80 | 1, // code 0
            0x00,
            0x80 | (11 << 3) | 2,
            1,
            2,
            0x80 | (13 << 3),
            5,
            0x80 | (15 << 3),
        ];
        assert_eq!(line_for(&t, 10, 0), Some(10));
        assert_eq!(line_for(&t, 10, 1), Some(10));
        assert_eq!(line_for(&t, 10, 2), Some(11));
        assert_eq!(line_for(&t, 10, 4), Some(11));
        assert_eq!(line_for(&t, 10, 5), Some(9));
        assert_eq!(line_for(&t, 10, 6), None);
        assert_eq!(line_for(&t, 10, 7), None);
    }
}
