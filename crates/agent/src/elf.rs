//! ELF symbol tables and build ids, read with `pread` into compact tables.
//!
//! Big shared libraries are the agent's largest memory cost when it reads
//! them the usual way (mmap the file, index its symbol table in place):
//! rustc's `librustc_driver.so` is 150 MB with a 4 MB `.symtab` and a 20 MB
//! `.strtab`, and every page of them the agent touches counts in its RSS.
//! Here a file is never mapped. Its symbol tables are read in chunks and
//! reduced to 12 bytes per code symbol (address, size, offset of the name in
//! the string table); a name is read from the file (page cache, not the
//! agent's memory) only when an address first resolves to it, and cached by
//! the caller. The open file is held with the table, so names come from the
//! same file the table was built from.
//!
//! Lookups follow blazesym's ELF resolver, so that results do not depend on
//! which path a file took: `.symtab` first, then `.dynsym`; among symbols of
//! type `FUNC`, `GNU_IFUNC`, `NOTYPE` and `OBJECT` defined in a section, the
//! one with the highest address at or below the address wins (the largest
//! at equal addresses) when it contains the address; a symbol without a size
//! in `.symtab` extends to the next symbol, one in `.dynsym` names its
//! address only. Unlike blazesym, symbols of sections that hold no code are
//! left out: a code address is never in them, and a Rust debug build has
//! one `GCC_except_table` label per function.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

const SHT_SYMTAB: u32 = 2;
const SHT_NOTE: u32 = 7;
const SHT_NOBITS: u32 = 8;
const SHT_DYNSYM: u32 = 11;
const PT_LOAD: u32 = 1;
const STT_NOTYPE: u8 = 0;
const STT_OBJECT: u8 = 1;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const SHN_UNDEF: u16 = 0;
/// Section indexes from here on are special (`SHN_ABS`, `SHN_COMMON`…).
const SHN_LORESERVE: u16 = 0xff00;
const SHF_EXECINSTR: u64 = 0x4;
const SHF_COMPRESSED: u64 = 0x800;
/// `ch_type` of a zlib-compressed section.
const ELFCOMPRESS_ZLIB: u32 = 1;
/// `e_shstrndx` escape value: the index is in section header 0.
const SHN_XINDEX: u16 = 0xffff;
/// Largest section read into memory whole (a compressed one, decompressed).
const MAX_SECTION: u64 = 256 << 20;
const NT_GNU_BUILD_ID: u32 = 3;
/// `e_phnum` escape value: the count is in section header 0.
const PN_XNUM: u16 = 0xffff;

/// Symbols read per `pread` of a symbol table.
const SYM_CHUNK: usize = 4096;
/// Longest symbol name read (C++ names run to a few KB).
const MAX_NAME: u64 = 1 << 20;
/// Largest note section read when looking for the build id.
const MAX_NOTES: u64 = 1 << 20;
/// Most section and program headers accepted (sanity bound on bad input).
const MAX_HEADERS: usize = 1 << 16;

/// Size stored for a `.symtab` symbol without size: it extends to the next one.
const OPEN: u32 = u32::MAX;
/// Name of an undefined symbol with an address: it names nothing, but an
/// address whose closest symbol it is stays unnamed (as in blazesym).
const NO_NAME: u32 = u32::MAX;

/// 12 bytes: a big debug build has over half a million code symbols.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sym {
    /// Address relative to the lowest loaded address of the file.
    addr: u32,
    /// Size, clamped; `OPEN`: up to the next symbol; 0: the address only.
    size: u32,
    /// Offset of the name in the table's string section.
    name: u32,
}

impl Sym {
    fn contains(&self, addr: u32) -> bool {
        let d = addr - self.addr;
        self.size == OPEN || d < self.size.max(1)
    }
}

/// One symbol table: symbols sorted by address, one per address.
#[derive(Debug, Default)]
struct Table {
    /// What symbol addresses are relative to.
    base: u64,
    syms: Box<[Sym]>,
    /// File offset and size of the string section.
    strtab: (u64, u64),
}

impl Table {
    fn find(&self, addr: u64) -> Option<Sym> {
        let addr = u32::try_from(addr.checked_sub(self.base)?).ok()?;
        let i = self
            .syms
            .partition_point(|s| s.addr <= addr)
            .checked_sub(1)?;
        let s = self.syms[i];
        (s.name != NO_NAME && s.contains(addr)).then_some(s)
    }
}

/// A loadable segment: file range and where it is mapped.
#[derive(Clone, Copy, Debug)]
struct Load {
    offset: u64,
    filesz: u64,
    vaddr: u64,
}

/// The code symbols of one ELF file.
#[derive(Debug)]
pub(crate) struct ElfSymbols {
    file: File,
    loads: Box<[Load]>,
    symtab: Table,
    dynsym: Table,
}

/// Why a file could not be read as ELF.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ElfError {
    #[error("reading the file")]
    Io(#[from] io::Error),
    #[error("not a little-endian ELF file")]
    NotElf,
    #[error("malformed ELF file: {0}")]
    Malformed(&'static str),
}

/// The fields of the ELF header that matter here.
#[derive(Debug)]
struct Header {
    is64: bool,
    phoff: u64,
    phentsize: usize,
    phnum: usize,
    shoff: u64,
    shentsize: usize,
    shnum: usize,
    /// Index of the section holding section names.
    shstrndx: usize,
}

#[derive(Clone, Copy, Debug)]
struct Section {
    /// Offset of the name in the section name table.
    name: u32,
    kind: u32,
    /// `SHF_COMPRESSED`: the contents start with a compression header.
    compressed: bool,
    /// `SHF_EXECINSTR`: code.
    exec: bool,
    offset: u64,
    size: u64,
    link: u32,
    entsize: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |s| {
        u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
    })
}

/// Reads up to `len` bytes at `offset` (fewer at the end of the file).
fn read_at(f: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Reads exactly `len` bytes at `offset`.
fn read_exact_at(f: &File, offset: u64, len: usize) -> Result<Vec<u8>, ElfError> {
    let b = read_at(f, offset, len)?;
    if b.len() < len {
        return Err(ElfError::Malformed("truncated"));
    }
    Ok(b)
}

fn header(f: &File) -> Result<Header, ElfError> {
    let b = read_at(f, 0, 64)?;
    if b.len() < 52 || b[..4] != *b"\x7fELF" {
        return Err(ElfError::NotElf);
    }
    // EI_DATA: 1 = little endian (the only kind on x86_64 and arm64).
    if b[5] != 1 {
        return Err(ElfError::NotElf);
    }
    let is64 = match b[4] {
        1 => false,
        2 if b.len() >= 64 => true,
        _ => return Err(ElfError::NotElf),
    };
    let mut h = if is64 {
        Header {
            is64,
            phoff: u64_at(&b, 32),
            phentsize: usize::from(u16_at(&b, 54)),
            phnum: usize::from(u16_at(&b, 56)),
            shoff: u64_at(&b, 40),
            shentsize: usize::from(u16_at(&b, 58)),
            shnum: usize::from(u16_at(&b, 60)),
            shstrndx: usize::from(u16_at(&b, 62)),
        }
    } else {
        Header {
            is64,
            phoff: u64::from(u32_at(&b, 28)),
            phentsize: usize::from(u16_at(&b, 42)),
            phnum: usize::from(u16_at(&b, 44)),
            shoff: u64::from(u32_at(&b, 32)),
            shentsize: usize::from(u16_at(&b, 46)),
            shnum: usize::from(u16_at(&b, 48)),
            shstrndx: usize::from(u16_at(&b, 50)),
        }
    };
    let (min_sh, min_ph) = if is64 { (64, 56) } else { (40, 32) };
    if h.shoff != 0 && h.shentsize < min_sh {
        return Err(ElfError::Malformed("section header size"));
    }
    if h.phoff != 0 && h.phentsize < min_ph {
        return Err(ElfError::Malformed("program header size"));
    }
    // Many sections or segments: the real counts are in section header 0.
    let escaped_ph = h.phnum == usize::from(PN_XNUM);
    let escaped_str = h.shstrndx == usize::from(SHN_XINDEX);
    if h.shoff != 0 && (h.shnum == 0 || escaped_ph || escaped_str) {
        let s0 = read_exact_at(f, h.shoff, h.shentsize)?;
        if h.shnum == 0 {
            h.shnum = if is64 {
                usize::try_from(u64_at(&s0, 32)).unwrap_or(usize::MAX)
            } else {
                u32_at(&s0, 20) as usize
            };
        }
        if escaped_ph {
            h.phnum = u32_at(&s0, if is64 { 44 } else { 28 }) as usize;
        }
        if escaped_str {
            h.shstrndx = u32_at(&s0, if is64 { 40 } else { 24 }) as usize;
        }
    }
    if h.shoff == 0 {
        h.shnum = 0;
    }
    if h.phoff == 0 {
        h.phnum = 0;
    }
    if h.shnum > MAX_HEADERS || h.phnum > MAX_HEADERS {
        return Err(ElfError::Malformed("too many headers"));
    }
    Ok(h)
}

fn sections(f: &File, h: &Header) -> Result<Vec<Section>, ElfError> {
    if h.shnum == 0 {
        return Ok(Vec::new());
    }
    let b = read_exact_at(f, h.shoff, h.shnum * h.shentsize)?;
    Ok(b.chunks_exact(h.shentsize)
        .map(|s| {
            if h.is64 {
                Section {
                    name: u32_at(s, 0),
                    kind: u32_at(s, 4),
                    compressed: u64_at(s, 8) & SHF_COMPRESSED != 0,
                    exec: u64_at(s, 8) & SHF_EXECINSTR != 0,
                    offset: u64_at(s, 24),
                    size: u64_at(s, 32),
                    link: u32_at(s, 40),
                    entsize: u64_at(s, 56),
                }
            } else {
                Section {
                    name: u32_at(s, 0),
                    kind: u32_at(s, 4),
                    compressed: u32_at(s, 8) & (SHF_COMPRESSED as u32) != 0,
                    exec: u64::from(u32_at(s, 8)) & SHF_EXECINSTR != 0,
                    offset: u64::from(u32_at(s, 16)),
                    size: u64::from(u32_at(s, 20)),
                    link: u32_at(s, 24),
                    entsize: u64::from(u32_at(s, 36)),
                }
            }
        })
        .collect())
}

fn loads(f: &File, h: &Header) -> Result<Box<[Load]>, ElfError> {
    if h.phnum == 0 {
        return Ok(Box::new([]));
    }
    let b = read_exact_at(f, h.phoff, h.phnum * h.phentsize)?;
    Ok(b.chunks_exact(h.phentsize)
        .filter(|p| u32_at(p, 0) == PT_LOAD)
        .map(|p| {
            if h.is64 {
                Load {
                    offset: u64_at(p, 8),
                    vaddr: u64_at(p, 16),
                    filesz: u64_at(p, 32),
                }
            } else {
                Load {
                    offset: u64::from(u32_at(p, 4)),
                    vaddr: u64::from(u32_at(p, 8)),
                    filesz: u64::from(u32_at(p, 16)),
                }
            }
        })
        .collect())
}

/// The code symbols of symbol table `sec` in file order (see the module
/// comment for which), and its string section. `sized_only`: symbols
/// without a size name their address only (`.dynsym`).
fn raw_symbols(
    f: &File,
    secs: &[Section],
    sec: &Section,
    is64: bool,
    sized_only: bool,
    base: u64,
) -> Result<(Vec<Sym>, (u64, u64)), ElfError> {
    let Some(strtab) = secs.get(sec.link as usize) else {
        return Err(ElfError::Malformed("symbol table without string table"));
    };
    if sec.kind == SHT_NOBITS || strtab.kind == SHT_NOBITS {
        return Ok((Vec::new(), (0, 0)));
    }
    let min = if is64 { 24 } else { 16 };
    let stride = usize::try_from(sec.entsize)
        .ok()
        .filter(|&e| e >= min)
        .unwrap_or(min);
    let count = usize::try_from(sec.size).unwrap_or(usize::MAX) / stride;
    let mut syms: Vec<Sym> = Vec::with_capacity(count.min(1 << 24));
    let mut i = 0;
    while i < count {
        let n = SYM_CHUNK.min(count - i);
        let b = read_exact_at(f, sec.offset + (i * stride) as u64, n * stride)?;
        for s in b.chunks_exact(stride) {
            let (name, info, shndx, value, size) = if is64 {
                (
                    u32_at(s, 0),
                    s[4],
                    u16_at(s, 6),
                    u64_at(s, 8),
                    u64_at(s, 16),
                )
            } else {
                (
                    u32_at(s, 0),
                    s[12],
                    u16_at(s, 14),
                    u64::from(u32_at(s, 4)),
                    u64::from(u32_at(s, 8)),
                )
            };
            if !matches!(
                info & 0xf,
                STT_FUNC | STT_GNU_IFUNC | STT_NOTYPE | STT_OBJECT
            ) || u64::from(name) >= strtab.size
            {
                continue;
            }
            let name = match shndx {
                SHN_UNDEF if value == 0 => continue,
                SHN_UNDEF => NO_NAME,
                // Symbols of data sections never name a code address but
                // can be most of a table (a Rust debug build has one
                // `GCC_except_table` label per function): not kept.
                i if i < SHN_LORESERVE && !secs.get(usize::from(i)).is_some_and(|s| s.exec) => {
                    continue;
                }
                _ => name,
            };
            let size = match size {
                0 if !sized_only => OPEN,
                s => u32::try_from(s).unwrap_or(OPEN - 1).min(OPEN - 1),
            };
            // Outside the 4 GB above the first segment: nothing of the
            // file's code (absolute symbols, garbage).
            let Some(addr) = value.checked_sub(base).and_then(|a| u32::try_from(a).ok()) else {
                continue;
            };
            syms.push(Sym { addr, size, name });
        }
        i += n;
    }
    Ok((syms, (strtab.offset, strtab.size)))
}

/// Reads symbol table `sec` into a [`Table`] with addresses relative to
/// `skip.base`, leaving out addresses that `skip` already names.
fn read_table(
    f: &File,
    secs: &[Section],
    sec: &Section,
    is64: bool,
    sized_only: bool,
    skip: &Table,
) -> Result<Table, ElfError> {
    let (mut syms, strtab) = raw_symbols(f, secs, sec, is64, sized_only, skip.base)?;
    // By address, the largest first at equal addresses, undefined ones
    // last; among aliases of one size the name first in the string table
    // (blazesym picks any of them). In place: a stable sort would need a
    // scratch buffer as large as half the table (8 MB for a big debug build).
    syms.sort_unstable_by(|a, b| {
        a.addr
            .cmp(&b.addr)
            .then_with(|| (a.name == NO_NAME).cmp(&(b.name == NO_NAME)))
            .then_with(|| sort_size(b.size).cmp(&sort_size(a.size)))
            .then_with(|| a.name.cmp(&b.name))
    });
    syms.dedup_by(|later, first| {
        if later.addr != first.addr {
            return false;
        }
        // A sizeless alias reaches further than a sized symbol.
        if later.size == OPEN && later.name != NO_NAME {
            first.size = OPEN;
        }
        true
    });
    if !skip.syms.is_empty() {
        syms.retain(
            |s| match skip.syms.binary_search_by_key(&s.addr, |k| k.addr) {
                Ok(i) => skip.syms[i].name == NO_NAME,
                Err(_) => true,
            },
        );
    }
    syms.shrink_to_fit();
    Ok(Table {
        base: skip.base,
        syms: syms.into_boxed_slice(),
        strtab,
    })
}

/// Size order of blazesym: by the ELF size, a sizeless symbol smallest.
fn sort_size(s: u32) -> u32 {
    if s == OPEN { 0 } else { s }
}

impl ElfSymbols {
    /// Reads the symbol tables of an open ELF file, which it keeps for names.
    pub(crate) fn read(file: File) -> Result<ElfSymbols, ElfError> {
        let h = header(&file)?;
        let secs = sections(&file, &h)?;
        let loads = loads(&file, &h)?;
        let find = |kind: u32| secs.iter().find(|s| s.kind == kind);
        // Symbol addresses are stored relative to the lowest segment.
        let empty = Table {
            base: loads.iter().map(|l| l.vaddr).min().unwrap_or(0),
            ..Table::default()
        };
        let symtab = match find(SHT_SYMTAB) {
            Some(s) => read_table(&file, &secs, s, h.is64, false, &empty)?,
            None => empty,
        };
        let dynsym = match find(SHT_DYNSYM) {
            Some(s) => read_table(&file, &secs, s, h.is64, true, &symtab)?,
            None => Table {
                base: symtab.base,
                ..Table::default()
            },
        };
        Ok(ElfSymbols {
            file,
            loads,
            symtab,
            dynsym,
        })
    }

    /// The virtual address that file offset `offset` is loaded at.
    pub(crate) fn file_offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.loads.iter().find_map(|l| {
            (offset >= l.offset && offset - l.offset < l.filesz)
                .then(|| (offset - l.offset).wrapping_add(l.vaddr))
        })
    }

    /// The (raw, mangled) name of the symbol containing virtual address `addr`.
    pub(crate) fn find(&self, addr: u64) -> Option<String> {
        if let Some(s) = self.symtab.find(addr) {
            return self.name(&self.symtab, s.name);
        }
        let s = self.dynsym.find(addr)?;
        self.name(&self.dynsym, s.name)
    }

    /// The symbol name at offset `at` of the table's string section.
    fn name(&self, t: &Table, at: u32) -> Option<String> {
        let (offset, size) = t.strtab;
        let avail = size.checked_sub(u64::from(at))?.min(MAX_NAME);
        let mut want = 256u64.min(avail);
        loop {
            let b = read_at(&self.file, offset + u64::from(at), want as usize).ok()?;
            if let Some(end) = b.iter().position(|&c| c == 0) {
                return std::str::from_utf8(&b[..end]).ok().map(str::to_owned);
            }
            if want >= avail || (b.len() as u64) < want {
                return None;
            }
            want = (want * 8).min(avail);
        }
    }

    /// Symbols kept.
    pub(crate) fn len(&self) -> usize {
        self.symtab.syms.len() + self.dynsym.syms.len()
    }

    /// Heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<Sym>() + self.loads.len() * std::mem::size_of::<Load>()
    }
}

/// A section of an ELF file, by name (for DWARF, read in place).
#[derive(Clone, Debug)]
pub(crate) struct NamedSection {
    pub(crate) name: String,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    /// `SHF_COMPRESSED`: [`ElfLayout::read_section`] decompresses it.
    pub(crate) compressed: bool,
}

/// The sections and loadable segments of an ELF file, without their
/// contents.
#[derive(Debug)]
pub(crate) struct ElfLayout {
    is64: bool,
    sections: Vec<NamedSection>,
    loads: Box<[Load]>,
}

impl ElfLayout {
    pub(crate) fn read(file: &File) -> Result<ElfLayout, ElfError> {
        let h = header(file)?;
        let secs = sections(file, &h)?;
        let names = match secs.get(h.shstrndx) {
            Some(s) if s.kind != SHT_NOBITS && s.size <= MAX_NOTES => {
                read_at(file, s.offset, s.size as usize)?
            }
            _ => Vec::new(),
        };
        let sections = secs
            .iter()
            .filter(|s| s.kind != SHT_NOBITS)
            .filter_map(|s| {
                let b = names.get(s.name as usize..)?;
                let end = b.iter().position(|&c| c == 0)?;
                Some(NamedSection {
                    name: String::from_utf8_lossy(&b[..end]).into_owned(),
                    offset: s.offset,
                    size: s.size,
                    compressed: s.compressed,
                })
            })
            .collect();
        Ok(ElfLayout {
            is64: h.is64,
            sections,
            loads: loads(file, &h)?,
        })
    }

    /// The section named `name`, if the file has it with contents.
    pub(crate) fn section(&self, name: &str) -> Option<&NamedSection> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The virtual address that file offset `offset` is loaded at (as
    /// [`ElfSymbols::file_offset_to_vaddr`]).
    pub(crate) fn file_offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.loads.iter().find_map(|l| {
            (offset >= l.offset && offset - l.offset < l.filesz)
                .then(|| (offset - l.offset).wrapping_add(l.vaddr))
        })
    }

    /// The virtual address a mapping of the file that starts at file offset
    /// `offset` (page-aligned, as in /proc/<pid>/maps) is loaded at: that
    /// of the last loadable segment starting in the same page or before.
    /// Linkers like lld do not align segments to pages in the file, so the
    /// mapping's first page may also hold the end of the previous segment.
    pub(crate) fn mapping_vaddr(&self, offset: u64) -> Option<u64> {
        self.loads
            .iter()
            .filter(|l| l.offset & !0xfff <= offset && offset < l.offset + l.filesz.max(1))
            .max_by_key(|l| l.offset)
            .map(|l| offset.wrapping_sub(l.offset).wrapping_add(l.vaddr))
    }

    /// The contents of section `s`, decompressed if it is compressed.
    pub(crate) fn read_section(&self, file: &File, s: &NamedSection) -> Result<Vec<u8>, ElfError> {
        if s.size > MAX_SECTION {
            return Err(ElfError::Malformed("section too large"));
        }
        let raw = read_exact_at(file, s.offset, s.size as usize)?;
        if !s.compressed {
            return Ok(raw);
        }
        // Elf64_Chdr / Elf32_Chdr: type, (reserved,) size, alignment.
        let (kind, size, skip) = if self.is64 {
            if raw.len() < 24 {
                return Err(ElfError::Malformed("compression header"));
            }
            (u32_at(&raw, 0), u64_at(&raw, 8), 24)
        } else {
            if raw.len() < 12 {
                return Err(ElfError::Malformed("compression header"));
            }
            (u32_at(&raw, 0), u64::from(u32_at(&raw, 4)), 12)
        };
        if kind != ELFCOMPRESS_ZLIB {
            return Err(ElfError::Malformed("unsupported section compression"));
        }
        if size > MAX_SECTION {
            return Err(ElfError::Malformed("section too large"));
        }
        let mut out = Vec::with_capacity(size as usize);
        use std::io::Read;
        flate2::read::ZlibDecoder::new(&raw[skip..])
            .take(size)
            .read_to_end(&mut out)?;
        if out.len() as u64 != size {
            return Err(ElfError::Malformed("truncated compressed section"));
        }
        Ok(out)
    }
}

/// The GNU build id of an ELF file (the first `NT_GNU_BUILD_ID` note of a
/// note section, as blazesym reads it), or `None`.
pub(crate) fn build_id(file: &File) -> Result<Option<Vec<u8>>, ElfError> {
    let h = header(file)?;
    for s in sections(file, &h)? {
        if s.kind != SHT_NOTE {
            continue;
        }
        let notes = read_at(
            file,
            s.offset,
            usize::try_from(s.size.min(MAX_NOTES)).unwrap_or(0),
        )?;
        let mut b = notes.as_slice();
        while b.len() >= 12 {
            let (namesz, descsz, kind) = (u32_at(b, 0), u32_at(b, 4), u32_at(b, 8));
            let name_end = 12 + (namesz as usize).next_multiple_of(4);
            let desc_end = name_end + descsz as usize;
            if desc_end > b.len() {
                break;
            }
            if kind == NT_GNU_BUILD_ID {
                return Ok(Some(b[name_end..desc_end].to_vec()));
            }
            let next = name_end + (descsz as usize).next_multiple_of(4);
            b = b.get(next..).unwrap_or(&[]);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use blazesym::symbolize::source::{Elf, Source};
    use blazesym::symbolize::{Input, Symbolized, Symbolizer};

    #[inline(never)]
    fn marker_function_for_elf_test() -> u64 {
        std::hint::black_box(marker_function_for_elf_test as *const () as u64)
    }

    fn open(p: &Path) -> ElfSymbols {
        ElfSymbols::read(File::open(p).unwrap()).unwrap()
    }

    /// Symbolizes `offsets` of `path` with blazesym's ELF-only resolver and
    /// with [`ElfSymbols`]; the names must agree.
    fn compare_with_blazesym(path: &Path, offsets: &[u64]) -> usize {
        // CPU-heavy: not while the live tests count samples of workloads.
        let _serial = crate::live_tests::serial();
        let ours = open(path);
        let bz = Symbolizer::builder()
            .enable_code_info(false)
            .enable_inlined_fns(false)
            .enable_auto_reload(false)
            .build();
        let mut elf = Elf::new(path);
        elf.debug_syms = false;
        let theirs = bz
            .symbolize(&Source::Elf(elf), Input::FileOffset(offsets))
            .unwrap();
        let aliases = aliases(path);
        let mut named = 0;
        for (off, t) in offsets.iter().zip(theirs) {
            let t = match t {
                Symbolized::Sym(s) => Some(s.name.into_owned()),
                _ => None,
            };
            let o = ours.file_offset_to_vaddr(*off).and_then(|a| ours.find(a));
            if o != t {
                // Aliases (same address and size) are interchangeable:
                // blazesym picks any of them. And it may name a code
                // address after a symbol of a data section, which is not
                // kept here.
                let same = |n: &Option<String>| n.as_ref().and_then(|n| aliases.get(n));
                let data_symbol = o.is_none() && same(&t).is_none();
                assert!(
                    data_symbol || (same(&o).is_some() && same(&o) == same(&t)),
                    "{} at file offset {off:#x}: ours {o:?}, blazesym {t:?}",
                    path.display()
                );
            }
            named += usize::from(o.is_some());
        }
        named
    }

    /// Every kept symbol's name → (address, size), for aliases.
    fn aliases(path: &Path) -> std::collections::HashMap<String, (u32, u32)> {
        let f = File::open(path).unwrap();
        let h = header(&f).unwrap();
        let secs = sections(&f, &h).unwrap();
        let mut out = std::collections::HashMap::new();
        let me = ElfSymbols::read(f.try_clone().unwrap()).unwrap();
        for sec in secs
            .iter()
            .filter(|s| matches!(s.kind, SHT_SYMTAB | SHT_DYNSYM))
        {
            let (syms, strtab) =
                raw_symbols(&f, &secs, sec, h.is64, sec.kind == SHT_DYNSYM, 0).unwrap();
            let t = Table {
                strtab,
                ..Table::default()
            };
            for s in syms {
                if let Some(n) = me.name(&t, s.name) {
                    out.entry(n).or_insert((s.addr, s.size));
                }
            }
        }
        out
    }

    /// File offsets across the executable segments of `path`, every `step`.
    fn offsets(path: &Path, step: u64) -> Vec<u64> {
        let f = File::open(path).unwrap();
        let h = header(&f).unwrap();
        let b = read_at(&f, h.phoff, h.phnum * h.phentsize).unwrap();
        let mut out = Vec::new();
        for p in b.chunks_exact(h.phentsize) {
            // PT_LOAD with PF_X.
            if u32_at(p, 0) == PT_LOAD && u32_at(p, 4) & 1 != 0 {
                let (off, sz) = (u64_at(p, 8), u64_at(p, 32));
                out.extend((off..off + sz).step_by(step as usize));
            }
        }
        out
    }

    #[test]
    fn own_function_by_file_offset() {
        use crate::procfs::{Backing, Proc, find_mapping};
        let addr = marker_function_for_elf_test();
        let maps = Proc::default().maps(std::process::id()).unwrap();
        let m = find_mapping(&maps, addr).unwrap().clone();
        let Backing::File { path, .. } = &m.backing else {
            panic!("own code not file-backed: {m:?}");
        };
        let s = open(Path::new(path));
        assert!(s.len() > 100);
        let vaddr = s.file_offset_to_vaddr(addr - m.start + m.offset).unwrap();
        let name = s.find(vaddr).unwrap();
        assert!(
            crate::symbolize::demangle(&name).ends_with("marker_function_for_elf_test"),
            "{name}"
        );
        assert!(s.file_offset_to_vaddr(u64::MAX / 2).is_none());
    }

    #[test]
    fn same_names_as_blazesym_for_this_test_binary() {
        let exe = std::env::current_exe().unwrap();
        let offs = offsets(&exe, 97);
        let named = compare_with_blazesym(&exe, &offs);
        assert!(named > offs.len() / 2, "{named} of {}", offs.len());
    }

    #[test]
    fn same_names_as_blazesym_for_system_libraries() {
        // libc (stripped: .dynsym only on most distributions) and whatever
        // large libraries this machine has; at least libc must exist.
        let mut checked = 0;
        for p in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib/aarch64-linux-gnu/libc.so.6",
            "/usr/lib64/libc.so.6",
            "/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/lib/x86_64-linux-gnu/libz.so.1",
        ] {
            let p = Path::new(p);
            if p.exists() {
                compare_with_blazesym(p, &offsets(p, 13));
                checked += 1;
            }
        }
        assert!(checked > 0, "no libc found to compare");
    }

    #[test]
    fn same_names_as_blazesym_for_rustc_driver() {
        // The library that motivated this module, when the toolchain is here.
        let Ok(out) = std::process::Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
        else {
            return;
        };
        let lib = Path::new(std::str::from_utf8(&out.stdout).unwrap().trim()).join("lib");
        let Some(driver) = std::fs::read_dir(&lib).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().contains("librustc_driver"))
        }) else {
            return;
        };
        let s = open(&driver);
        // 12 bytes per symbol, names stay in the file.
        assert!(s.heap_bytes() < 8 << 20, "{} bytes", s.heap_bytes());
        compare_with_blazesym(&driver, &offsets(&driver, 16411));
    }

    #[test]
    fn build_id_matches_blazesym() {
        let exe = std::env::current_exe().unwrap();
        let ours = build_id(&File::open(&exe).unwrap()).unwrap();
        let theirs = blazesym::helper::read_elf_build_id(&exe)
            .unwrap()
            .map(|b| b.to_vec());
        assert!(ours.is_some());
        assert_eq!(ours, theirs);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, b"not an elf file at all").unwrap();
        assert!(matches!(
            ElfSymbols::read(File::open(&p).unwrap()),
            Err(ElfError::NotElf)
        ));
        // A real header, then garbage and truncation at every length.
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        for len in [16, 52, 64, 100, 4096] {
            std::fs::write(&p, &exe[..len]).unwrap();
            let f = File::open(&p).unwrap();
            let _ = ElfSymbols::read(f.try_clone().unwrap());
            let _ = build_id(&f);
        }
        let mut junk = exe[..64].to_vec();
        junk.extend(std::iter::repeat_n(0xffu8, 8192));
        std::fs::write(&p, &junk).unwrap();
        let _ = ElfSymbols::read(File::open(&p).unwrap());
        let _ = build_id(&File::open(&p).unwrap());
    }

    #[test]
    fn table_lookup_rules() {
        let t = Table {
            base: 0x1000,
            syms: vec![
                Sym {
                    addr: 0x100,
                    size: 0x10,
                    name: 1,
                },
                Sym {
                    addr: 0x200,
                    size: OPEN,
                    name: 2,
                },
                Sym {
                    addr: 0x300,
                    size: 0,
                    name: 3,
                },
            ]
            .into_boxed_slice(),
            strtab: (0, 0),
        };
        assert_eq!(t.find(0x110f).map(|s| s.name), Some(1));
        assert_eq!(t.find(0x1110), None, "past its size");
        assert_eq!(t.find(0x12ff).map(|s| s.name), Some(2), "sizeless: open");
        assert_eq!(t.find(0x1300).map(|s| s.name), Some(3));
        assert_eq!(t.find(0x1301), None, "dynsym sizeless: exact only");
        assert_eq!(t.find(0x10ff), None);
        assert_eq!(t.find(0xfff), None, "below the base");
        assert_eq!(
            t.find(0x1000 + (1 << 32) + 0x200),
            None,
            "4 GB past the base"
        );
    }
}
