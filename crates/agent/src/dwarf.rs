//! DWARF symbolization (inlined functions, files and lines) without mapping
//! the file.
//!
//! blazesym maps a whole file to read its DWARF, and every page a lookup
//! touches then counts in the agent's RSS until the file is dropped: a
//! 28 MB debug test binary cost 19 MB of mapped pages and 6–10 MB of parsed
//! units. Here the DWARF sections are read in place with `pread`, through a
//! small cache of fixed-size chunks per file ([`CHUNK`] × [`CACHE_CHUNKS`]),
//! so the file's pages stay in the page cache, not in the agent's memory.
//! Only compressed sections (distribution `.debug` files) are read whole
//! and decompressed. Lookups are addr2line's (the same algorithm blazesym
//! uses); tests compare the two.
//!
//! Separate debug files are found as blazesym finds them: from
//! `.gnu_debuglink`, by build id under `/usr/lib/debug/.build-id` and
//! `/lib/debug/.build-id`, then by name in those directories, next to the
//! file and under its directory in them; a candidate must match the link's
//! CRC. Supplementary files (`.gnu_debugaltlink`, dwz) and DWARF packages
//! are not followed.

use std::borrow::Cow;
use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::elf::{ElfLayout, ElfSymbols};

/// Bytes read per `pread` of a DWARF section.
const CHUNK: usize = 16 << 10;
/// Chunks cached per file (512 KiB).
const CACHE_CHUNKS: usize = 32;
/// Directories searched for separate debug files (as blazesym).
const DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

/// The sections addr2line reads (the rest stay empty).
const SECTIONS: [gimli::SectionId; 10] = [
    gimli::SectionId::DebugAbbrev,
    gimli::SectionId::DebugAddr,
    gimli::SectionId::DebugAranges,
    gimli::SectionId::DebugInfo,
    gimli::SectionId::DebugLine,
    gimli::SectionId::DebugLineStr,
    gimli::SectionId::DebugRanges,
    gimli::SectionId::DebugRngLists,
    gimli::SectionId::DebugStr,
    gimli::SectionId::DebugStrOffsets,
];

/// A file read in chunks, the most recently used ones kept.
#[derive(Debug)]
struct Chunks {
    file: File,
    inner: RefCell<ChunkCache>,
}

#[derive(Debug, Default)]
struct ChunkCache {
    /// (chunk index, last use, bytes; shorter at the end of the file).
    slots: Vec<(u64, u64, Box<[u8]>)>,
    by_index: HashMap<u64, usize>,
    /// Slot of the last chunk read: most reads continue in it.
    last: usize,
    tick: u64,
}

impl ChunkCache {
    /// The slot holding chunk `idx`, read from `file` if needed.
    fn slot(&mut self, file: &File, idx: u64) -> io::Result<usize> {
        if self.slots.get(self.last).is_some_and(|s| s.0 == idx) {
            return Ok(self.last);
        }
        self.tick += 1;
        if let Some(&i) = self.by_index.get(&idx) {
            self.slots[i].1 = self.tick;
            self.last = i;
            return Ok(i);
        }
        let mut buf = vec![0u8; CHUNK];
        let mut done = 0;
        while done < CHUNK {
            match file.read_at(&mut buf[done..], idx * CHUNK as u64 + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(done);
        let entry = (idx, self.tick, buf.into_boxed_slice());
        let i = if self.slots.len() < CACHE_CHUNKS {
            self.slots.push(entry);
            self.slots.len() - 1
        } else {
            let (i, _) = self
                .slots
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.1)
                .expect("cache is full");
            self.by_index.remove(&self.slots[i].0);
            self.slots[i] = entry;
            i
        };
        self.by_index.insert(idx, i);
        self.last = i;
        Ok(i)
    }
}

impl Chunks {
    /// Copies the bytes at file offset `pos` into `buf`.
    fn read(&self, mut pos: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut c = self.inner.borrow_mut();
        let mut done = 0;
        while done < buf.len() {
            let i = c.slot(&self.file, pos / CHUNK as u64)?;
            let chunk = &c.slots[i].2;
            let at = (pos % CHUNK as u64) as usize;
            let n = chunk.len().saturating_sub(at).min(buf.len() - done);
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            buf[done..done + n].copy_from_slice(&chunk[at..at + n]);
            done += n;
            pos += n as u64;
        }
        Ok(())
    }

    /// Index of the first `byte` in `[pos, pos + len)`.
    fn find(&self, pos: u64, len: u64, byte: u8) -> io::Result<Option<u64>> {
        let mut c = self.inner.borrow_mut();
        let mut off = 0;
        while off < len {
            let p = pos + off;
            let i = c.slot(&self.file, p / CHUNK as u64)?;
            let chunk = &c.slots[i].2;
            let at = (p % CHUNK as u64) as usize;
            let n = (chunk.len().saturating_sub(at) as u64).min(len - off) as usize;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if let Some(k) = chunk[at..at + n].iter().position(|&b| b == byte) {
                return Ok(Some(off + k as u64));
            }
            off += n as u64;
        }
        Ok(None)
    }
}

/// Where a section's bytes are.
#[derive(Debug)]
enum Data {
    /// In the file, at offsets of the file.
    File(Rc<Chunks>),
    /// In memory (a decompressed section), at offsets of the buffer.
    Mem(Box<[u8]>),
}

/// A gimli reader over part of a section, read on demand.
#[derive(Clone, Debug)]
pub(crate) struct Section {
    data: Rc<Data>,
    /// Position of the first byte (a file offset for [`Data::File`]).
    start: u64,
    len: u64,
}

fn io_error(_: io::Error) -> gimli::Error {
    gimli::Error::Io
}

impl Section {
    fn empty() -> Section {
        Section {
            data: Rc::new(Data::Mem(Box::new([]))),
            start: 0,
            len: 0,
        }
    }

    fn eof(&self) -> gimli::Error {
        gimli::Error::UnexpectedEof(gimli::ReaderOffsetId(self.start))
    }

    fn copy(&self, buf: &mut [u8]) -> gimli::Result<()> {
        match &*self.data {
            Data::File(c) => c.read(self.start, buf).map_err(io_error),
            Data::Mem(m) => {
                let s = self.start as usize;
                buf.copy_from_slice(&m[s..s + buf.len()]);
                Ok(())
            }
        }
    }

    fn bytes(&self) -> gimli::Result<Vec<u8>> {
        let mut v = vec![0u8; self.len as usize];
        self.copy(&mut v)?;
        Ok(v)
    }
}

impl gimli::Reader for Section {
    type Endian = gimli::LittleEndian;
    type Offset = usize;

    fn endian(&self) -> gimli::LittleEndian {
        gimli::LittleEndian
    }

    fn len(&self) -> usize {
        self.len as usize
    }

    fn empty(&mut self) {
        self.len = 0;
    }

    fn truncate(&mut self, len: usize) -> gimli::Result<()> {
        if len as u64 > self.len {
            return Err(self.eof());
        }
        self.len = len as u64;
        Ok(())
    }

    fn offset_from(&self, base: &Section) -> usize {
        (self.start - base.start) as usize
    }

    fn offset_id(&self) -> gimli::ReaderOffsetId {
        gimli::ReaderOffsetId(self.start)
    }

    fn lookup_offset_id(&self, id: gimli::ReaderOffsetId) -> Option<usize> {
        (id.0 >= self.start && id.0 <= self.start + self.len).then(|| (id.0 - self.start) as usize)
    }

    fn find(&self, byte: u8) -> gimli::Result<usize> {
        let found = match &*self.data {
            Data::File(c) => c.find(self.start, self.len, byte).map_err(io_error)?,
            Data::Mem(m) => {
                let s = self.start as usize;
                m[s..s + self.len as usize]
                    .iter()
                    .position(|&b| b == byte)
                    .map(|p| p as u64)
            }
        };
        found.map(|p| p as usize).ok_or_else(|| self.eof())
    }

    fn skip(&mut self, len: usize) -> gimli::Result<()> {
        if len as u64 > self.len {
            return Err(self.eof());
        }
        self.start += len as u64;
        self.len -= len as u64;
        Ok(())
    }

    fn split(&mut self, len: usize) -> gimli::Result<Section> {
        let mut head = self.clone();
        head.truncate(len)?;
        self.skip(len)?;
        Ok(head)
    }

    fn to_slice(&self) -> gimli::Result<Cow<'_, [u8]>> {
        Ok(Cow::Owned(self.bytes()?))
    }

    fn to_string(&self) -> gimli::Result<Cow<'_, str>> {
        String::from_utf8(self.bytes()?)
            .map(Cow::Owned)
            .map_err(|_| gimli::Error::BadUtf8)
    }

    fn to_string_lossy(&self) -> gimli::Result<Cow<'_, str>> {
        Ok(Cow::Owned(
            String::from_utf8_lossy(&self.bytes()?).into_owned(),
        ))
    }

    fn read_slice(&mut self, buf: &mut [u8]) -> gimli::Result<()> {
        if buf.len() as u64 > self.len {
            return Err(self.eof());
        }
        self.copy(buf)?;
        self.start += buf.len() as u64;
        self.len -= buf.len() as u64;
        Ok(())
    }
}

/// One frame of an inline chain: function (raw, mangled), file, line.
pub(crate) type RawFrame = (String, String, Option<u32>);

/// The DWARF of one ELF file (or of its separate debug file).
pub(crate) struct DwarfResolver {
    /// Program headers of the mapped file, for file offset → address.
    layout: ElfLayout,
    ctx: addr2line::Context<Section>,
    /// ELF symbols of the file holding the DWARF, for addresses outside
    /// every DWARF function (as blazesym falls back to them).
    symbols_file: File,
    symbols: OnceCell<Option<ElfSymbols>>,
    /// Decompressed sections and the chunk cache, in bytes.
    section_bytes: usize,
}

impl std::fmt::Debug for DwarfResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DwarfResolver").finish_non_exhaustive()
    }
}

impl DwarfResolver {
    /// Reads the DWARF of `file`, or of its separate debug file. `path`
    /// names it for finding that debug file.
    pub(crate) fn open(file: File, path: &Path) -> anyhow::Result<DwarfResolver> {
        let layout = ElfLayout::read(&file)?;
        let (dfile, dlayout) = match debug_file(&file, &layout, path) {
            Some((f, l)) => (f, Some(l)),
            None => (file.try_clone()?, None),
        };
        let dl = dlayout.as_ref().unwrap_or(&layout);
        let chunks = Rc::new(Chunks {
            file: dfile.try_clone()?,
            inner: RefCell::default(),
        });
        let mut sections: HashMap<gimli::SectionId, Section> = HashMap::new();
        let mut section_bytes = CHUNK * CACHE_CHUNKS;
        for id in SECTIONS {
            let Some(s) = dl.section(id.name()) else {
                continue;
            };
            let sec = if s.compressed {
                let b = dl.read_section(&dfile, s)?;
                section_bytes += b.len();
                Section {
                    len: b.len() as u64,
                    data: Rc::new(Data::Mem(b.into_boxed_slice())),
                    start: 0,
                }
            } else {
                Section {
                    data: Rc::new(Data::File(chunks.clone())),
                    start: s.offset,
                    len: s.size,
                }
            };
            sections.insert(id, sec);
        }
        let mut dwarf = gimli::Dwarf::load(|id| {
            Ok::<_, gimli::Error>(sections.get(&id).cloned().unwrap_or_else(Section::empty))
        })?;
        // Units that share an abbreviation table (most of a Rust binary's)
        // share one parsed copy, as in blazesym.
        dwarf.populate_abbreviations_cache(gimli::AbbreviationsCacheStrategy::Duplicates);
        let ctx = addr2line::Context::from_dwarf(dwarf)?;
        Ok(DwarfResolver {
            layout,
            ctx,
            symbols_file: dfile,
            symbols: OnceCell::new(),
            section_bytes,
        })
    }

    /// Heap bytes held, roughly: decompressed sections, the chunk cache and
    /// the ELF symbols if loaded; not the units parsed so far.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.section_bytes
            + self
                .symbols
                .get()
                .and_then(Option::as_ref)
                .map_or(0, ElfSymbols::heap_bytes)
    }

    /// The inline chain at file offset `offset`, outermost function first
    /// (as blazesym gives it); empty when nothing names it.
    pub(crate) fn frames(&self, offset: u64) -> Vec<RawFrame> {
        let Some(addr) = self.layout.file_offset_to_vaddr(offset) else {
            return Vec::new();
        };
        self.frames_at(addr).unwrap_or_default()
    }

    fn frames_at(&self, addr: u64) -> Result<Vec<RawFrame>, gimli::Error> {
        let loc = |l: Option<addr2line::Location<'_>>| match l {
            Some(l) => (l.file.unwrap_or("").to_owned(), l.line),
            None => (String::new(), None),
        };
        // Without a line for the address blazesym names the function only.
        let here = self.ctx.find_location(addr)?;
        let has_line = here.is_some();
        let mut frames = self.ctx.find_frames(addr).skip_all_loads()?;
        let mut out = Vec::new();
        while let Some(f) = frames.next()? {
            match f.function {
                Some(name) => {
                    let (file, line) = loc(f.location);
                    out.push((name.raw_name()?.into_owned(), file, line));
                }
                None => {
                    // No DWARF function: the ELF symbol, with the line.
                    let Some(name) = self.elf_symbol(addr) else {
                        return Ok(Vec::new());
                    };
                    let (file, line) = loc(f.location);
                    out.push((name, file, line));
                }
            }
        }
        if out.is_empty() {
            // Neither a function nor a line: the ELF symbol alone.
            return Ok(self
                .elf_symbol(addr)
                .map(|n| vec![(n, String::new(), None)])
                .unwrap_or_default());
        }
        out.reverse();
        if !has_line {
            out.truncate(1);
            out[0].1.clear();
            out[0].2 = None;
        }
        Ok(out)
    }

    fn elf_symbol(&self, addr: u64) -> Option<String> {
        self.symbols
            .get_or_init(|| {
                self.symbols_file
                    .try_clone()
                    .ok()
                    .and_then(|f| ElfSymbols::read(f).ok())
            })
            .as_ref()?
            .find(addr)
    }
}

/// The separate debug file of `file`, from its `.gnu_debuglink`, if one is
/// found whose CRC matches.
fn debug_file(file: &File, layout: &ElfLayout, path: &Path) -> Option<(File, ElfLayout)> {
    if layout.section(".debug_info").is_some() {
        return None;
    }
    let link = layout
        .read_section(file, layout.section(".gnu_debuglink")?)
        .ok()?;
    let end = link.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&link[..end]).ok()?;
    let crc_at = (end + 1).next_multiple_of(4);
    let crc = u32::from_le_bytes(link.get(crc_at..crc_at + 4)?.try_into().ok()?);
    let canonical = std::fs::canonicalize(path).ok();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(Some(id)) = crate::elf::build_id(file)
        && id.len() >= 8
    {
        let rest: String = id[1..].iter().map(|b| format!("{b:02x}")).collect();
        for d in DEBUG_DIRS {
            candidates.push(
                Path::new(d)
                    .join(".build-id")
                    .join(format!("{:02x}", id[0]))
                    .join(format!("{rest}.debug")),
            );
        }
    }
    for d in DEBUG_DIRS {
        candidates.push(Path::new(d).join(name));
    }
    if let Some(dir) = canonical.as_deref().and_then(Path::parent) {
        candidates.push(dir.join(name));
        candidates.push(dir.join(".debug").join(name));
        let rel = dir.strip_prefix("/").unwrap_or(dir);
        for d in DEBUG_DIRS {
            candidates.push(Path::new(d).join(rel).join(name));
        }
    }
    candidates
        .into_iter()
        .filter(|c| Some(c.as_path()) != canonical.as_deref())
        .find_map(|c| {
            let f = File::open(&c).ok()?;
            if file_crc(&f).ok()? != crc {
                tracing::debug!(path = %c.display(), "debug link CRC mismatch");
                return None;
            }
            let l = ElfLayout::read(&f).ok()?;
            Some((f, l))
        })
}

/// CRC-32 of a whole file, read in chunks (not mapped).
fn file_crc(f: &File) -> io::Result<u32> {
    let mut crc = flate2::Crc::new();
    let mut buf = vec![0u8; 256 << 10];
    let mut pos = 0u64;
    loop {
        let n = match f.read_at(&mut buf, pos) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(crc.sum());
        }
        crc.update(&buf[..n]);
        pos += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use blazesym::helper::ElfResolver;
    use blazesym::symbolize::{FindSymOpts, Symbolize, TranslateFileOffset};

    /// The inline chain blazesym gives for file offset `off`, outermost
    /// first (what the agent used before this module).
    fn blazesym_frames(r: &ElfResolver, off: u64) -> Vec<RawFrame> {
        let Ok(Some(vaddr)) = r.file_offset_to_virt_offset(off) else {
            return Vec::new();
        };
        let Ok(Ok(sym)) = r.find_sym(vaddr, &FindSymOpts::CodeInfoAndInlined) else {
            return Vec::new();
        };
        let file_of = |ci: Option<&blazesym::symbolize::CodeInfo<'_>>| {
            ci.map(|c| c.to_path().to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let mut raw = vec![(
            sym.name.to_string(),
            file_of(sym.code_info.as_deref()),
            sym.code_info.as_ref().and_then(|c| c.line),
        )];
        for f in sym.inlined.iter() {
            raw.push((
                f.name.to_string(),
                file_of(f.code_info.as_ref()),
                f.code_info.as_ref().and_then(|c| c.line),
            ));
        }
        raw
    }

    /// `n` file offsets spread over the executable sections of `path`.
    fn code_offsets(path: &Path, n: u64) -> Vec<u64> {
        let f = File::open(path).unwrap();
        let l = ElfLayout::read(&f).unwrap();
        let text = l.section(".text").expect(".text");
        (0..n)
            .map(|i| text.offset + text.size / n * i + (i * 7) % 61)
            .collect()
    }

    /// Resolves `offsets` of `path` with [`DwarfResolver`] and with
    /// blazesym; the chains must be identical. Returns (addresses named,
    /// frames with a line, inlined frames).
    fn compare(path: &Path, offsets: &[u64]) -> (usize, usize, usize) {
        let _serial = crate::live_tests::serial();
        let ours = DwarfResolver::open(File::open(path).unwrap(), path).unwrap();
        let theirs = ElfResolver::open(path).unwrap();
        let inspector = blazesym::inspect::Inspector::new();
        let (mut named, mut lines, mut inlined) = (0, 0, 0);
        let mut diffs = Vec::new();
        for &off in offsets {
            let (o, t) = (ours.frames(off), blazesym_frames(&theirs, off));
            // The agent records no line as 0: blazesym's `Some(0)` (a call
            // site without a line) is addr2line's `None`.
            let no_zero = |v: &[RawFrame]| -> Vec<RawFrame> {
                v.iter()
                    .map(|(n, f, l)| (n.clone(), f.clone(), l.filter(|&l| l != 0)))
                    .collect()
            };
            // Of ELF symbols that alias one address and size (same name but
            // for the hash, `_f` and `f`) the agent may pick another one
            // (see `crate::elf`).
            let same = |x: &str, y: &str| {
                let (x, y) = (crate::symbolize::demangle(x), crate::symbolize::demangle(y));
                x.trim_start_matches('_') == y.trim_start_matches('_')
            };
            // Nor of functions folded into one (identical code folding:
            // `drop_in_place` of two types), which a change elsewhere in
            // the binary brings and goes: different names, one address.
            let folded = |x: &str, y: &str| {
                let src = blazesym::inspect::source::Source::Elf(
                    blazesym::inspect::source::Elf::new(path),
                );
                let found = inspector.lookup(&src, &[x, y]).unwrap_or_default();
                let addrs = |i: usize| -> Vec<u64> {
                    found
                        .get(i)
                        .map_or(Vec::new(), |v| v.iter().map(|s| s.addr).collect())
                };
                let ys = addrs(1);
                addrs(0).iter().any(|a| ys.contains(a))
            };
            let alias = |a: &[RawFrame], b: &[RawFrame]| matches!((a, b), ([x], [y]) if x.1.is_empty() && y.1.is_empty() && (same(&x.0, &y.0) || folded(&x.0, &y.0)));
            if no_zero(&o) != no_zero(&t) && !alias(&o, &t) {
                diffs.push(format!("{off:#x}:\n  ours {o:?}\n  blazesym {t:?}"));
            }
            named += usize::from(!o.is_empty());
            lines += o.iter().filter(|f| f.2.is_some()).count();
            inlined += o.len().saturating_sub(1);
        }
        assert!(
            diffs.is_empty(),
            "{} of {} differ:\n{}",
            diffs.len(),
            offsets.len(),
            diffs[..diffs.len().min(10)].join("\n")
        );
        (named, lines, inlined)
    }

    #[test]
    fn same_frames_as_blazesym_on_own_binary() {
        let exe = std::env::current_exe().unwrap();
        let (named, lines, inlined) = compare(&exe, &code_offsets(&exe, 3000));
        // Dependencies are built without debug info: only names there.
        assert!(
            named > 2500 && lines > 1000 && inlined > 0,
            "{named} {lines} {inlined}"
        );
    }

    /// libc's DWARF is in a separate, compressed `.debug` file (libc6-dbg).
    #[test]
    fn same_frames_as_blazesym_on_libc_debug_file() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        if !libc.exists() {
            return;
        }
        let f = File::open(libc).unwrap();
        let l = ElfLayout::read(&f).unwrap();
        assert!(
            debug_file(&f, &l, libc).is_some(),
            "no debug file for libc (install libc6-dbg)"
        );
        let (named, lines, _) = compare(libc, &code_offsets(libc, 3000));
        assert!(named > 2500 && lines > 2500, "{named} {lines}");
    }

    /// A big debug binary: `FATHOM_DWARF_COMPARE=<path>`.
    #[test]
    #[ignore]
    fn same_frames_as_blazesym_on_given_binary() {
        let p = PathBuf::from(std::env::var("FATHOM_DWARF_COMPARE").unwrap());
        let r = compare(&p, &code_offsets(&p, 20_000));
        eprintln!("{r:?}");
    }
}
