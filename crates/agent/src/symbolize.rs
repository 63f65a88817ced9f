//! Code objects (ELF files, the kernel, JIT perf maps, the vDSO) and turning
//! an (object, address) frame into function names.
//!
//! - An ELF object is identified by its build id (or, without one, by device,
//!   inode, size and mtime), so every process running the same binary shares
//!   one parsed symbol table and one cache: cost grows with distinct code,
//!   not with samples or processes. It is opened through the process
//!   (`/proc/<pid>/root/<path>`, else `/proc/<pid>/map_files/…`) the first time
//!   a process maps it and stays open while used, so frames of a process that
//!   already exited, or that lives in another mount namespace, still
//!   symbolize. Each file mapping the same build id is remembered (a few
//!   per object), so the code still symbolizes after the copy first seen is
//!   deleted (its container or directory removed) while another runs.
//! - Files up to `--dwarf-max-file-size` are symbolized with DWARF (inlined
//!   functions, lines), read with pread through a small chunk cache
//!   ([`crate::dwarf`]). Larger ones, the big shared libraries that would
//!   cost the most time to parse, from their ELF symbol tables read with
//!   pread into a compact table ([`crate::elf`]): 12 bytes per symbol,
//!   names read from the file when first needed. No file is mapped. Names
//!   are demangled here (Rust, C++).
//! - Frame addresses are file offsets for ELF objects (stable across
//!   processes and ASLR) and absolute addresses for the kernel and JITs.
//! - Frames nobody can name keep their object and address; they become pprof
//!   locations with a mapping and no function.
//!
//! Memory is bounded by eviction: an object no process maps any more and no
//! frame used for `EVICT_AFTER` push intervals is dropped with its cache, and
//! each object's address cache forgets addresses unused for
//! `ADDR_EVICT_AFTER` intervals. At
//! most `MAX_OPEN_DWARF` expensive DWARF resolvers, whose parsed units grow
//! with the addresses they resolve, are open at once.
//!
//! CPU is bounded by resolving the new addresses of a push interval object
//! by object ([`Symbolizer::resolve_all`]), so a file is opened at most once
//! per interval however stacks interleave objects, and by keeping files that
//! are expensive to open (libc's compressed `.debug` file, the symbol table
//! of a big debug binary) open for `KEEP_OPEN` intervals after their last
//! use, as long as all open files hold at most `KEEP_OPEN_BYTES`; cheap
//! ones are closed once the interval's addresses are resolved.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::dwarf::DwarfResolver;
use crate::elf::ElfSymbols;
use crate::symtab::SymbolTable;

/// Files above this size are symbolized from their ELF symbols only: the
/// DWARF of a huge (debug) binary costs more memory and time to parse than
/// the agent's budget allows.
pub(crate) const DEFAULT_DWARF_MAX: u64 = 16 << 20;

/// Push intervals after which unused objects are dropped (with their caches).
const EVICT_AFTER: u64 = 6;

/// Push intervals after which an unused cached address is dropped. Longer
/// than for objects: an address sampled now and then would otherwise be
/// resolved again every minute, and a file perhaps opened again for it; a
/// cached address costs ~100 bytes (2,000–3,000 are cached under the
/// overhead benchmark).
const ADDR_EVICT_AFTER: u64 = 30;

/// Expensive DWARF resolvers kept open at once; opening another drops the
/// least recently used (its resolved addresses stay cached). Cheap ones
/// (see [`EXPENSIVE_OPEN`]) are not counted: they are closed as soon as the
/// addresses of an interval are resolved.
const MAX_OPEN_DWARF: usize = 2;

/// A parsed file whose opening took at least this long (libc's compressed
/// `.debug` file: its sections are decompressed and its ~1,000 unit headers
/// parsed, 150–350 ms; the symbol table of a 260 MB debug binary, 130–230
/// ms) stays open for [`KEEP_OPEN`] push intervals after its last use
/// rather than one, so that an interval with a few new addresses in it does
/// not pay for the whole file again. Cheaper files are reopened when needed.
const EXPENSIVE_OPEN: Duration = Duration::from_millis(10);

/// Push intervals an expensive parsed file stays open after its last use.
const KEEP_OPEN: u64 = 6;

/// Parsed files not used in the interval that ends are closed, the longest
/// unused first, while all open ones hold more than this (estimated:
/// symbol tables, decompressed DWARF sections; see [`ElfFile::heap_bytes`]).
const KEEP_OPEN_BYTES: usize = 16 << 20;

/// One frame of a stack, before symbolization: an object and an address in
/// it (file offset for ELF objects, absolute otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FrameKey {
    pub(crate) object: u32,
    pub(crate) addr: u64,
}

/// One function in a location's inline chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Line {
    pub(crate) function: Rc<str>,
    pub(crate) file: Rc<str>,
    pub(crate) line: i64,
}

/// Where an ELF file is read from when it is first symbolized.
#[derive(Debug)]
enum ElfSource {
    /// A path that stays valid after the process exits (the agent's own view
    /// of a host file).
    Path(PathBuf),
    /// An open handle (a file in another mount namespace, or deleted), read
    /// through /proc/self/fd so it outlives the process that mapped it.
    Held(fs::File),
}

impl ElfSource {
    /// An open handle to the file: the one held, or the path opened now if
    /// it still is the file with inode `inode`.
    fn open(&self, inode: u64) -> std::io::Result<fs::File> {
        match self {
            ElfSource::Path(p) => {
                let f = fs::File::open(p)?;
                if f.metadata()?.ino() != inode {
                    return Err(std::io::Error::other("replaced since it was mapped"));
                }
                Ok(f)
            }
            ElfSource::Held(f) => f.try_clone(),
        }
    }

    /// A path naming the file, stable for as long as the source lives (where
    /// its separate debug file is looked for).
    fn path(&self) -> PathBuf {
        match self {
            ElfSource::Path(p) => p.clone(),
            ElfSource::Held(f) => {
                use std::os::fd::AsRawFd;
                PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))
            }
        }
    }
}

/// An ELF file, parsed only while frames need it: discovery (on the path of
/// a new process) only opens it and reads its build id; symbol tables, DWARF
/// and separate debug files are loaded when a frame first needs them, and
/// dropped after a push interval that did not need them (symbolized
/// addresses stay cached), so the agent does not keep binaries parsed once
/// their hot addresses are known.
#[derive(Debug)]
struct ElfFile {
    /// The files known to hold this code (one build id, mapped from several
    /// files: copies of one binary in different containers or
    /// directories), oldest first. A file that no longer opens (its
    /// directory or container was removed) is dropped and the next one
    /// read, so the code of a live process never depends on a copy that
    /// went away.
    sources: RefCell<Vec<KnownFile>>,
    /// Files up to `--dwarf-max-file-size` are read with DWARF
    /// ([`crate::dwarf`]); larger ones through their ELF symbols only.
    dwarf: bool,
    /// `None`: not open; `Some(None)`: unparsable.
    parsed: RefCell<Option<Option<Parsed>>>,
    /// Push interval in which a frame last needed the parsed file.
    used: Cell<u64>,
    /// How long the last opening took (zero: never opened).
    open_cost: Cell<Duration>,
}

/// A parsed ELF file.
#[derive(Clone, Debug)]
enum Parsed {
    Dwarf(Rc<DwarfResolver>),
    Symbols(Rc<ElfSymbols>),
}

/// One file holding an ELF object's code.
#[derive(Debug)]
struct KnownFile {
    source: ElfSource,
    /// Device (as /proc maps shows it) and inode of the mapped file, to
    /// notice a path that now names another and a file known already.
    dev: u64,
    inode: u64,
}

/// Files kept per ELF object; a new one past this replaces the oldest
/// (after those that no longer open are dropped).
const MAX_SOURCES: usize = 4;

impl ElfFile {
    fn new(source: ElfSource, dev: u64, inode: u64, dwarf: bool) -> Self {
        ElfFile {
            sources: RefCell::new(vec![KnownFile { source, dev, inode }]),
            dwarf,
            parsed: RefCell::new(None),
            used: Cell::new(0),
            open_cost: Cell::new(Duration::ZERO),
        }
    }

    /// Another file holding the same code (same build id); nothing if it
    /// is known already.
    fn add_source(&self, source: ElfSource, dev: u64, inode: u64) {
        let mut sources = self.sources.borrow_mut();
        if sources.iter().any(|k| k.dev == dev && k.inode == inode) {
            return;
        }
        if sources.len() >= MAX_SOURCES {
            sources.retain(|k| k.source.open(k.inode).is_ok());
        }
        if sources.len() >= MAX_SOURCES {
            sources.remove(0);
        }
        sources.push(KnownFile { source, dev, inode });
    }

    /// An open handle to the code and a path naming it (see
    /// [`ElfSource::path`]), from the first known file that still opens;
    /// those that do not are forgotten.
    fn open(&self) -> std::io::Result<(fs::File, PathBuf)> {
        let mut sources = self.sources.borrow_mut();
        let mut last = std::io::Error::other("no file holds it any more");
        while let Some(k) = sources.first() {
            match k.source.open(k.inode) {
                Ok(f) => return Ok((f, k.source.path())),
                Err(e) => {
                    last = e;
                    sources.remove(0);
                }
            }
        }
        Err(last)
    }

    fn parsed(&self, name: &str, interval: u64) -> Option<Parsed> {
        self.used.set(interval);
        if let Some(r) = &*self.parsed.borrow() {
            return r.clone();
        }
        let t0 = Instant::now();
        let r = if self.dwarf {
            self.open()
                .map_err(anyhow::Error::from)
                .and_then(|(f, path)| DwarfResolver::open(f, &path))
                .map(|r| Parsed::Dwarf(Rc::new(r)))
                .map_err(|e| format!("{e:#}"))
        } else {
            self.open()
                .map_err(|e| e.to_string())
                .and_then(|(f, _)| ElfSymbols::read(f).map_err(|e| crate::chain(&e)))
                .map(|s| Parsed::Symbols(Rc::new(s)))
        };
        // Parsing grows the heap transiently (a big symbol table by its raw
        // size): give those pages back.
        crate::mem::release_free_memory();
        self.open_cost.set(t0.elapsed());
        tracing::debug!(path = name, dwarf = self.dwarf, took = ?self.open_cost.get(), "ELF file parsed");
        let r = match r {
            Ok(r) => Some(r),
            Err(error) => {
                tracing::debug!(path = name, %error, "cannot parse ELF file");
                None
            }
        };
        *self.parsed.borrow_mut() = Some(r.clone());
        r
    }

    /// Heap bytes the open file holds, roughly (0 when closed).
    fn heap_bytes(&self) -> usize {
        match &*self.parsed.borrow() {
            Some(Some(Parsed::Symbols(s))) => s.heap_bytes(),
            Some(Some(Parsed::Dwarf(r))) => r.heap_bytes(),
            _ => 0,
        }
    }

    /// Whether the file is read with DWARF and was opened (or found
    /// unparsable) since it was last dropped.
    fn dwarf_open(&self) -> bool {
        self.dwarf && self.parsed.borrow().is_some()
    }

    /// Drops the parsed file (resolved addresses stay cached).
    fn close(&self) {
        self.parsed.borrow_mut().take();
    }

    /// Whether opening the file is expensive enough to keep it open for a
    /// while (see [`EXPENSIVE_OPEN`]); false before the first opening.
    fn expensive(&self) -> bool {
        self.open_cost.get() >= EXPENSIVE_OPEN
    }

    /// Drops the parsed file unless the interval `interval` (which ends)
    /// needed it, or, for an expensive one, one of the [`KEEP_OPEN`] before.
    fn end_interval(&self, interval: u64) {
        let idle = interval.saturating_sub(self.used.get());
        let keep = if self.expensive() {
            idle < KEEP_OPEN
        } else {
            idle == 0
        };
        if !keep {
            self.parsed.borrow_mut().take();
        }
    }
}

#[derive(Debug)]
enum Kind {
    Elf(Option<ElfFile>),
    Kernel,
    PerfMap(SymbolTable),
    Vdso,
    /// Where a user stack was cut because a frame fell outside every mapping.
    Truncated,
    Unknown,
    /// Python frames: the address indexes `Symbolizer::python_frames`.
    Python,
}

/// address → (lines innermost first, empty when unsymbolizable; interval of
/// last use).
type AddrCache = HashMap<u64, (Rc<[Line]>, u64)>;

/// A code object: what a pprof mapping describes.
#[derive(Debug)]
pub(crate) struct Object {
    pub(crate) id: u32,
    /// Mapping file name: a path, `[kernel.kallsyms]`, `[vdso]`, `[jit]`…
    pub(crate) name: String,
    /// Hex build id, or empty.
    pub(crate) build_id: String,
    kind: Kind,
    cache: RefCell<AddrCache>,
    last_used: Cell<u64>,
}

impl Object {
    pub(crate) fn is_kernel(&self) -> bool {
        matches!(self.kind, Kind::Kernel)
    }

    /// Whether a JIT perf map object names the code at `addr` (other kinds:
    /// false).
    pub(crate) fn perf_map_covers(&self, addr: u64) -> bool {
        matches!(&self.kind, Kind::PerfMap(t) if t.lookup(addr).is_some())
    }
}

/// Identity of a file on disk, for files without a build id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    inode: u64,
    size: u64,
    mtime: i64,
}

/// How much the symbolizer holds, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SymbolizerStats {
    pub(crate) objects: usize,
    pub(crate) cached_addresses: usize,
}

/// All code objects, and the kernel symbol table.
pub(crate) struct Symbolizer {
    objects: HashMap<u32, Rc<Object>>,
    by_file: HashMap<FileKey, u32>,
    by_build_id: HashMap<String, u32>,
    kallsyms: SymbolTable,
    kernel: Rc<Object>,
    vdso: Rc<Object>,
    truncated: Rc<Object>,
    python: Rc<Object>,
    /// Python frames seen (function, file, line), by index.
    python_frames: Vec<Line>,
    python_ids: HashMap<(Rc<str>, Rc<str>, i64), u64>,
    next_id: u32,
    /// Push intervals so far; the clock for eviction.
    interval: u64,
    strings: HashMap<Rc<str>, ()>,
    /// Files above this size are symbolized from ELF symbols only.
    dwarf_max_file_size: u64,
    /// Objects whose DWARF resolver is open, least recently used first.
    open_dwarf: Vec<u32>,
}

/// `--symbolize=server`: ELF frames of objects with a GNU build id are sent
/// as (build id, file offset) and symbolized by the server; the kernel,
/// JIT perf maps and objects without a build id are still named here. One
/// setting for the process, set once at start-up.
static SERVER_MODE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn set_server_mode(on: bool) {
    SERVER_MODE.store(on, std::sync::atomic::Ordering::Relaxed);
}

fn server_mode() -> bool {
    SERVER_MODE.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) use fathom_model::demangle;

impl Symbolizer {
    /// A symbolizer with the given kernel symbols (empty: kernel frames stay
    /// unsymbolized).
    pub(crate) fn new(kallsyms: SymbolTable, dwarf_max_file_size: u64) -> Self {
        let mut s = Symbolizer {
            dwarf_max_file_size,
            objects: HashMap::new(),
            by_file: HashMap::new(),
            by_build_id: HashMap::new(),
            kallsyms,
            kernel: Rc::new(new_object(
                0,
                "[kernel.kallsyms]".into(),
                String::new(),
                Kind::Kernel,
            )),
            vdso: Rc::new(new_object(1, "[vdso]".into(), String::new(), Kind::Vdso)),
            truncated: Rc::new(new_object(
                2,
                "[unknown]".into(),
                String::new(),
                Kind::Truncated,
            )),
            python: Rc::new(new_object(
                3,
                "[python]".into(),
                String::new(),
                Kind::Python,
            )),
            python_frames: Vec::new(),
            python_ids: HashMap::new(),
            next_id: 4,
            interval: 0,
            strings: HashMap::new(),
            open_dwarf: Vec::new(),
        };
        for o in [
            s.kernel.clone(),
            s.vdso.clone(),
            s.truncated.clone(),
            s.python.clone(),
        ] {
            s.objects.insert(o.id, o);
        }
        s
    }

    /// Reads /proc/kallsyms; an unreadable or hidden one gives an empty table.
    pub(crate) fn read_kallsyms() -> SymbolTable {
        match fs::File::open("/proc/kallsyms") {
            Ok(f) => SymbolTable::parse_kallsyms(std::io::BufReader::new(f)).unwrap_or_else(|error| {
                tracing::warn!(%error, "reading /proc/kallsyms; kernel frames stay unsymbolized");
                SymbolTable::default()
            }),
            Err(error) => {
                tracing::warn!(%error, "opening /proc/kallsyms; kernel frames stay unsymbolized");
                SymbolTable::default()
            }
        }
    }

    pub(crate) fn kernel(&self) -> &Rc<Object> {
        &self.kernel
    }

    pub(crate) fn vdso(&self) -> &Rc<Object> {
        &self.vdso
    }

    /// The marker frame that ends a user stack cut short (see [`Kind::Truncated`]).
    pub(crate) fn truncated(&self) -> FrameKey {
        FrameKey {
            object: self.truncated.id,
            addr: 0,
        }
    }

    /// The frame of a Python function (a line of it), shared by every
    /// process. After `MAX_PYTHON_FRAMES` distinct lines, new ones are
    /// named by function and file only (line 0).
    pub(crate) fn python_frame(&mut self, function: &str, file: &str, line: i64) -> FrameKey {
        const MAX_PYTHON_FRAMES: usize = 1 << 20;
        let line = if self.python_frames.len() >= MAX_PYTHON_FRAMES {
            0
        } else {
            line
        };
        let f = self.intern(function);
        let file = self.intern(file);
        let key = (f.clone(), file.clone(), line);
        let addr = match self.python_ids.get(&key) {
            Some(&a) => a,
            None => {
                let a = self.python_frames.len() as u64;
                self.python_frames.push(Line {
                    function: f,
                    file,
                    line,
                });
                self.python_ids.insert(key, a);
                a
            }
        };
        FrameKey {
            object: self.python.id,
            addr,
        }
    }

    /// The marker frame (`[truncated]`) that ends a user stack the unwinder
    /// could not walk to its outermost frame.
    pub(crate) fn truncated_unwind(&self) -> FrameKey {
        FrameKey {
            object: self.truncated.id,
            addr: 1,
        }
    }

    pub(crate) fn object(&self, id: u32) -> Option<&Rc<Object>> {
        self.objects.get(&id)
    }

    fn add(&mut self, name: String, build_id: String, kind: Kind) -> Rc<Object> {
        // Ids wrap only after 4 billion objects; skip ones still in use.
        let mut id = self.next_id;
        while self.objects.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_id = id.wrapping_add(1);
        let o = Rc::new(new_object(id, name, build_id, kind));
        o.last_used.set(self.interval);
        self.objects.insert(id, o.clone());
        o
    }

    /// An object for anonymous or special memory (no symbols).
    pub(crate) fn unknown(&mut self, name: &str) -> Rc<Object> {
        self.add(name.to_owned(), String::new(), Kind::Unknown)
    }

    /// An object for a process's JIT perf map.
    pub(crate) fn perf_map(&mut self, name: String, table: SymbolTable) -> Rc<Object> {
        self.add(name, String::new(), Kind::PerfMap(table))
    }

    /// The object for a file that process `pid` maps at `[start, end)`, as
    /// named in its maps. Opens and parses the file on first sight; a file
    /// that cannot be opened still gets an object (frames keep the path and
    /// offset).
    pub(crate) fn elf(
        &mut self,
        pid: u32,
        path: &str,
        dev: u64,
        inode: u64,
        start: u64,
        end: u64,
    ) -> Rc<Object> {
        let shown = path.strip_suffix(" (deleted)").unwrap_or(path);
        let source = open_source(pid, shown, dev, inode, start, end);
        let meta = match &source {
            Some(ElfSource::Path(p)) => fs::metadata(p).ok(),
            Some(ElfSource::Held(f)) => f.metadata().ok(),
            None => None,
        };
        let key = FileKey {
            dev,
            inode,
            size: meta.as_ref().map_or(0, |m| m.size()),
            mtime: meta.as_ref().map_or(0, |m| m.mtime()),
        };
        if let Some(o) = self.by_file.get(&key).and_then(|id| self.objects.get(id)) {
            return o.clone();
        }
        let Some(source) = source.filter(|_| meta.is_some()) else {
            tracing::debug!(
                pid,
                path = shown,
                "cannot open mapped file; its frames stay unsymbolized"
            );
            let o = self.add(shown.to_owned(), String::new(), Kind::Elf(None));
            self.by_file.insert(key, o.id);
            return o;
        };
        let build_id = match source.open(inode).map(|f| crate::elf::build_id(&f)) {
            Ok(Ok(Some(b))) => hex(&b),
            _ => String::new(),
        };
        if !build_id.is_empty()
            && let Some(o) = self
                .by_build_id
                .get(&build_id)
                .and_then(|id| self.objects.get(id))
        {
            let o = o.clone();
            if let Kind::Elf(Some(f)) = &o.kind {
                f.add_source(source, dev, inode);
            }
            self.by_file.insert(key, o.id);
            return o;
        }
        if server_mode() && !build_id.is_empty() {
            crate::upload::offer(|| {
                Some(crate::upload::Candidate {
                    build_id: build_id.clone(),
                    name: shown.rsplit('/').next().unwrap_or(shown).to_owned(),
                    file: source.open(inode).ok()?,
                })
            });
        }
        let size = meta.as_ref().map_or(0, |m| m.size());
        let file = ElfFile::new(source, dev, inode, size <= self.dwarf_max_file_size);
        let o = self.add(shown.to_owned(), build_id.clone(), Kind::Elf(Some(file)));
        self.by_file.insert(key, o.id);
        if !build_id.is_empty() {
            self.by_build_id.insert(build_id, o.id);
        }
        o
    }

    /// The inline chain (innermost first) at `addr` in object `id`, from the
    /// cache or by symbolizing; empty when nothing names it.
    pub(crate) fn lines(&mut self, id: u32, addr: u64) -> Rc<[Line]> {
        let Some(o) = self.objects.get(&id).cloned() else {
            return Rc::from(Vec::new());
        };
        o.last_used.set(self.interval);
        if let Some((lines, used)) = o.cache.borrow_mut().get_mut(&addr) {
            *used = self.interval;
            return lines.clone();
        }
        let lines: Rc<[Line]> = Rc::from(self.resolve(&o, addr));
        o.cache
            .borrow_mut()
            .insert(addr, (lines.clone(), self.interval));
        lines
    }

    /// Symbolizes and caches every frame of `frames` not cached yet, one
    /// object after the other: each parsed file is opened at most once per
    /// call, however the frames of different objects interleave in stacks,
    /// and its addresses are resolved in order. Call once per push interval
    /// before [`Self::lines`] is asked for the frames.
    pub(crate) fn resolve_all<'a>(&mut self, frames: impl IntoIterator<Item = &'a FrameKey>) {
        let mut todo: HashMap<u32, Vec<u64>> = HashMap::new();
        for f in frames {
            let Some(o) = self.objects.get(&f.object) else {
                continue;
            };
            if !o.cache.borrow().contains_key(&f.addr) {
                todo.entry(f.object).or_default().push(f.addr);
            }
        }
        // Files already open first, so that opening others cannot close
        // them before their addresses are resolved.
        let mut ids: Vec<(bool, u32)> = todo.keys().map(|&id| (!self.is_open(id), id)).collect();
        ids.sort_unstable();
        for (_, id) in ids {
            let mut addrs = todo.remove(&id).unwrap_or_default();
            addrs.sort_unstable();
            addrs.dedup();
            for a in addrs {
                self.lines(id, a);
            }
            // A cheap DWARF file is not needed again before the next
            // interval: close it now rather than hold its parsed units.
            if let Some(Kind::Elf(Some(f))) = self.objects.get(&id).map(|o| &o.kind)
                && f.dwarf
                && !f.expensive()
            {
                f.close();
                self.open_dwarf.retain(|&o| o != id);
            }
        }
    }

    /// Whether the parsed file of object `id` is open.
    fn is_open(&self, id: u32) -> bool {
        matches!(self.objects.get(&id).map(|o| &o.kind), Some(Kind::Elf(Some(f))) if f.parsed.borrow().is_some())
    }

    fn intern(&mut self, s: &str) -> Rc<str> {
        if let Some((k, ())) = self.strings.get_key_value(s) {
            return k.clone();
        }
        let k: Rc<str> = Rc::from(s);
        self.strings.insert(k.clone(), ());
        k
    }

    fn line(&mut self, function: &str, file: &str, line: Option<u32>) -> Line {
        Line {
            function: self.intern(function),
            file: self.intern(file),
            line: line.map_or(0, i64::from),
        }
    }

    fn resolve(&mut self, o: &Object, addr: u64) -> Vec<Line> {
        match &o.kind {
            Kind::Kernel => match self.kallsyms.lookup(addr) {
                Some(f) => {
                    let (name, module) = (f.name.to_owned(), f.module.map(|m| format!("[{m}]")));
                    vec![self.line(&name, module.as_deref().unwrap_or(""), None)]
                }
                None => Vec::new(),
            },
            Kind::PerfMap(t) => match t.lookup(addr) {
                Some(f) => {
                    let name = f.name.to_owned();
                    vec![self.line(&name, "", None)]
                }
                None => Vec::new(),
            },
            Kind::Vdso => vec![self.line("[vdso]", "", None)],
            Kind::Truncated if addr == 1 => vec![self.line("[truncated]", "", None)],
            Kind::Truncated => vec![self.line("[unknown]", "", None)],
            Kind::Python => self
                .python_frames
                .get(usize::try_from(addr).unwrap_or(usize::MAX))
                .cloned()
                .into_iter()
                .collect(),
            Kind::Unknown | Kind::Elf(None) => Vec::new(),
            // The server symbolizes it from the build id and the address.
            Kind::Elf(Some(_)) if server_mode() && !o.build_id.is_empty() => Vec::new(),
            Kind::Elf(Some(f)) => match self.parsed(o, f) {
                None => Vec::new(),
                Some(Parsed::Symbols(s)) => {
                    match s.file_offset_to_vaddr(addr).and_then(|a| s.find(a)) {
                        Some(name) => vec![self.line(&demangle(&name), "", None)],
                        None => Vec::new(),
                    }
                }
                Some(Parsed::Dwarf(r)) => self.resolve_dwarf(&r, addr),
            },
        }
    }

    /// The parsed file `f` of object `o`. At most [`MAX_OPEN_DWARF`]
    /// expensive DWARF resolvers are open at once: the least recently used
    /// one is dropped before another that may be expensive (known to be, or
    /// never opened) is opened. Cheap ones are opened beside them.
    fn parsed(&mut self, o: &Object, f: &ElfFile) -> Option<Parsed> {
        if f.dwarf {
            self.open_dwarf.retain(|&id| id != o.id);
            let cheap = !f.expensive() && f.open_cost.get() > Duration::ZERO;
            if !f.dwarf_open() && !cheap {
                while self.open_dwarf.len() >= MAX_OPEN_DWARF {
                    let lru = self.open_dwarf.remove(0);
                    if let Some(Kind::Elf(Some(g))) = self.objects.get(&lru).map(|o| &o.kind) {
                        g.close();
                    }
                }
            }
            let r = f.parsed(&o.name, self.interval);
            if f.expensive() {
                self.open_dwarf.push(o.id);
            }
            return r;
        }
        f.parsed(&o.name, self.interval)
    }

    /// The inline chain at file offset `addr`, from DWARF.
    fn resolve_dwarf(&mut self, r: &DwarfResolver, addr: u64) -> Vec<Line> {
        // Outer function first, each with the location inside it; pprof
        // wants the innermost first.
        let mut raw = r.frames(addr);
        raw.reverse();
        raw.iter()
            .map(|(n, f, l)| (demangle(n), f, *l))
            .filter(|(n, _, _)| !n.is_empty())
            .map(|(n, f, l)| self.line(&n, f, l))
            .collect()
    }

    /// Advances the eviction clock (once per push interval) and drops objects
    /// and cached addresses unused for a while. Objects still referenced
    /// elsewhere (a live process maps them) are kept.
    pub(crate) fn end_interval(&mut self) {
        // Parsed files this interval did not need go; what they resolved
        // stays in the address caches.
        let mut open = Vec::new();
        for o in self.objects.values() {
            if let Kind::Elf(Some(f)) = &o.kind {
                f.end_interval(self.interval);
                let bytes = f.heap_bytes();
                if bytes > 0 {
                    open.push((f.used.get(), std::cmp::Reverse(bytes), o.id));
                }
            }
        }
        // Over the budget: close files the ending interval did not use, the
        // longest unused (then the biggest) first.
        let mut total: usize = open.iter().map(|(_, b, _)| b.0).sum();
        open.sort_unstable();
        for (used, bytes, id) in open {
            if total <= KEEP_OPEN_BYTES || used >= self.interval {
                break;
            }
            if let Some(Kind::Elf(Some(f))) = self.objects.get(&id).map(|o| &o.kind) {
                f.close();
                total -= bytes.0;
            }
        }
        self.interval += 1;
        let now = self.interval;
        let stale = |used: u64| now.saturating_sub(used) > EVICT_AFTER;
        for o in self.objects.values() {
            o.cache
                .borrow_mut()
                .retain(|_, (_, used)| now.saturating_sub(*used) <= ADDR_EVICT_AFTER);
        }
        // The table holds the only reference to an object no process maps;
        // the fixed objects are also held by fields, so they stay.
        self.objects
            .retain(|_, o| !(stale(o.last_used.get()) && Rc::strong_count(o) == 1));
        let objects = &self.objects;
        self.by_file.retain(|_, id| objects.contains_key(id));
        self.by_build_id.retain(|_, id| objects.contains_key(id));
        self.open_dwarf.retain(|id| {
            matches!(objects.get(id).map(|o| &o.kind), Some(Kind::Elf(Some(f))) if f.dwarf_open())
        });
        // Names no cached line refers to any more.
        self.strings.retain(|k, ()| Rc::strong_count(k) > 1);
    }

    pub(crate) fn stats(&self) -> SymbolizerStats {
        SymbolizerStats {
            objects: self.objects.len(),
            cached_addresses: self.objects.values().map(|o| o.cache.borrow().len()).sum(),
        }
    }
}

fn new_object(id: u32, name: String, build_id: String, kind: Kind) -> Object {
    Object {
        id,
        name,
        build_id,
        kind,
        cache: RefCell::new(HashMap::new()),
        last_used: Cell::new(0),
    }
}

/// `st_dev` as the (major << 32 | minor) that /proc/<pid>/maps shows.
fn maps_dev(st_dev: u64) -> u64 {
    let major = ((st_dev >> 8) & 0xfff) | ((st_dev >> 32) & !0xfff);
    let minor = (st_dev & 0xff) | ((st_dev >> 12) & !0xff);
    (major << 32) | minor
}

/// How the agent reads the file a process maps: through its own view of the
/// path when that is the same file (it stays valid after the process exits);
/// else through a handle opened via the process's root (the right mount
/// namespace) or via the kernel's handle to the exact mapping.
fn open_source(
    pid: u32,
    path: &str,
    dev: u64,
    inode: u64,
    start: u64,
    end: u64,
) -> Option<ElfSource> {
    let plain = PathBuf::from(path);
    if fs::metadata(&plain).is_ok_and(|m| m.ino() == inode && maps_dev(m.dev()) == dev) {
        return Some(ElfSource::Path(plain));
    }
    let rooted = Path::new("/proc")
        .join(pid.to_string())
        .join("root")
        .join(path.trim_start_matches('/'));
    if let Ok(f) = fs::File::open(&rooted)
        && f.metadata().is_ok_and(|m| m.ino() == inode)
    {
        return Some(ElfSource::Held(f));
    }
    fs::File::open(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))
        .ok()
        .map(ElfSource::Held)
}

fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::{Backing, Proc, find_mapping};

    #[inline(never)]
    fn marker_function_for_symbolizer_test() -> u64 {
        std::hint::black_box(marker_function_for_symbolizer_test as *const () as u64)
    }

    /// The mapping of this test binary holding `addr`, with its file's
    /// path, device and inode.
    fn own_mapping(addr: u64) -> (crate::procfs::Mapping, String, u64, u64) {
        let maps = Proc::default().maps(std::process::id()).unwrap();
        let m = find_mapping(&maps, addr).unwrap().clone();
        let Backing::File { path, dev, inode } = &m.backing else {
            panic!("own code not file-backed: {m:?}");
        };
        let (path, dev, inode) = (path.clone(), *dev, *inode);
        (m, path, dev, inode)
    }

    #[test]
    fn demangles() {
        assert_eq!(demangle("_ZN3foo3bar17h0123456789abcdefE"), "foo::bar");
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar");
        assert_eq!(demangle("main.hot"), "main.hot");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }

    #[test]
    fn symbolizes_own_function_by_file_offset() {
        let pid = std::process::id();
        let addr = marker_function_for_symbolizer_test();
        let (m, path, dev, inode) = own_mapping(addr);
        let mut s = Symbolizer::new(SymbolTable::default(), DEFAULT_DWARF_MAX);
        let o = s.elf(pid, &path, dev, inode, m.start, m.end);
        assert!(!o.build_id.is_empty(), "rustc emits a build id");
        // Same file again: same object.
        let o2 = s.elf(pid, &path, dev, inode, m.start, m.end);
        assert_eq!(o.id, o2.id);
        let off = addr - m.start + m.offset;
        let lines = s.lines(o.id, off);
        assert!(
            lines
                .last()
                .is_some_and(|l| l.function.ends_with("marker_function_for_symbolizer_test")),
            "{lines:?}"
        );
        // Cached the second time (same Rc).
        let again = s.lines(o.id, off);
        assert!(Rc::ptr_eq(&lines, &again));
        assert_eq!(s.stats().cached_addresses, 1);
        // An address past the text has no symbol but does not fail.
        assert!(s.lines(o.id, u64::MAX / 2).is_empty());
    }

    /// The object of this test binary, and the file offset of `addr` in it.
    fn own_object(s: &mut Symbolizer, addr: u64) -> (Rc<Object>, u64) {
        let pid = std::process::id();
        let (m, path, dev, inode) = own_mapping(addr);
        let o = s.elf(pid, &path, dev, inode, m.start, m.end);
        (o, addr - m.start + m.offset)
    }

    fn elf_file(o: &Object) -> &ElfFile {
        match &o.kind {
            Kind::Elf(Some(f)) => f,
            k => panic!("not an open ELF object: {k:?}"),
        }
    }

    #[test]
    fn resolve_all_gives_what_lines_gives() {
        let k =
            SymbolTable::parse_kallsyms("ffffffff81000000 T start_kernel\n".as_bytes()).unwrap();
        let mut batch = Symbolizer::new(k, DEFAULT_DWARF_MAX);
        let (o, off) = own_object(&mut batch, marker_function_for_symbolizer_test());
        let (_, off2) = own_object(&mut batch, demangles as *const () as u64);
        let kid = batch.kernel().id;
        let frames = [
            FrameKey {
                object: o.id,
                addr: off,
            },
            FrameKey {
                object: kid,
                addr: 0xffffffff81000010,
            },
            FrameKey {
                object: o.id,
                addr: off2,
            },
            FrameKey {
                object: o.id,
                addr: off,
            },
            FrameKey {
                object: 9999,
                addr: 1,
            },
        ];
        batch.resolve_all(&frames);
        assert_eq!(batch.stats().cached_addresses, 3);
        let mut one = Symbolizer::new(
            SymbolTable::parse_kallsyms("ffffffff81000000 T start_kernel\n".as_bytes()).unwrap(),
            DEFAULT_DWARF_MAX,
        );
        let (o1, _) = own_object(&mut one, marker_function_for_symbolizer_test());
        for f in &frames[..4] {
            let id = if f.object == o.id { o1.id } else { f.object };
            assert_eq!(
                batch.lines(f.object, f.addr),
                one.lines(id, f.addr),
                "{f:?}"
            );
        }
        assert!(
            batch.lines(o.id, off)[..]
                .last()
                .is_some_and(|l| l.function.ends_with("marker_function_for_symbolizer_test"))
        );
        // All cached by the batch: nothing new.
        assert_eq!(batch.stats().cached_addresses, 3);
    }

    #[test]
    fn expensive_files_stay_open_longer() {
        let mut s = Symbolizer::new(SymbolTable::default(), DEFAULT_DWARF_MAX);
        let (o, off) = own_object(&mut s, marker_function_for_symbolizer_test());
        assert!(!s.lines(o.id, off).is_empty());
        assert!(s.is_open(o.id));
        // Cheap: closed after the first interval that did not need it.
        elf_file(&o).open_cost.set(Duration::from_micros(1));
        s.end_interval();
        assert!(s.is_open(o.id), "used in the interval that ended");
        s.end_interval();
        assert!(!s.is_open(o.id));
        // Expensive: kept for KEEP_OPEN intervals after its last use.
        assert!(!s.lines(o.id, off + 1).is_empty());
        elf_file(&o).open_cost.set(EXPENSIVE_OPEN);
        for i in 0..KEEP_OPEN {
            s.end_interval();
            assert!(s.is_open(o.id), "closed after {} intervals", i + 1);
        }
        s.end_interval();
        assert!(!s.is_open(o.id));
    }

    #[test]
    fn device_numbers_match_maps() {
        // makedev(0xfe, 0) and makedev(259, 3), as glibc encodes them.
        assert_eq!(maps_dev(0xfe00), 0xfe << 32);
        assert_eq!(maps_dev((259 << 8) | 3), (259 << 32) | 3);
        let m = fs::metadata("/proc/self/exe").unwrap();
        let maps = Proc::default().maps(std::process::id()).unwrap();
        let exe = std::env::current_exe().unwrap();
        let mine = maps
            .iter()
            .find_map(|m| match &m.backing {
                Backing::File { path, dev, .. } if Path::new(path) == exe => Some(*dev),
                _ => None,
            })
            .unwrap();
        assert_eq!(maps_dev(m.dev()), mine);
    }

    #[test]
    fn code_outlives_the_copy_it_was_first_read_from() {
        let pid = std::process::id();
        let addr = marker_function_for_symbolizer_test();
        let (m, path, dev, inode) = own_mapping(addr);
        // A copy of this binary (same build id, another inode) is seen
        // first, then the binary itself; then the copy is deleted.
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy");
        fs::copy(&path, &copy).unwrap();
        let meta = fs::metadata(&copy).unwrap();
        let copy_name = copy.to_str().unwrap();
        let mut s = Symbolizer::new(SymbolTable::default(), DEFAULT_DWARF_MAX);
        let first = s.elf(pid, copy_name, maps_dev(meta.dev()), meta.ino(), 0, 0);
        let own = s.elf(pid, &path, dev, inode, m.start, m.end);
        assert_eq!(first.id, own.id, "one build id, one object");
        assert_eq!(elf_file(&own).sources.borrow().len(), 2);
        // Known already: not added twice.
        s.elf(pid, &path, dev, inode, m.start, m.end);
        assert_eq!(elf_file(&own).sources.borrow().len(), 2);
        drop(dir);
        let lines = s.lines(own.id, addr - m.start + m.offset);
        assert!(
            lines
                .last()
                .is_some_and(|l| l.function.ends_with("marker_function_for_symbolizer_test")),
            "{lines:?}"
        );
        assert_eq!(
            elf_file(&own).sources.borrow().len(),
            1,
            "the deleted copy is forgotten"
        );
    }

    #[test]
    fn missing_file_keeps_an_object() {
        let mut s = Symbolizer::new(SymbolTable::default(), DEFAULT_DWARF_MAX);
        let o = s.elf(std::process::id(), "/nonexistent/bin", 1, 2, 0x1000, 0x2000);
        assert_eq!(o.name, "/nonexistent/bin");
        assert!(s.lines(o.id, 0x10).is_empty());
    }

    #[test]
    fn kernel_and_perf_map_and_eviction() {
        let k =
            SymbolTable::parse_kallsyms("ffffffff81000000 T start_kernel\n".as_bytes()).unwrap();
        let mut s = Symbolizer::new(k, DEFAULT_DWARF_MAX);
        let kid = s.kernel().id;
        assert_eq!(
            &*s.lines(kid, 0xffffffff81000010)[0].function,
            "start_kernel"
        );
        let pm = SymbolTable::parse_perf_map("1000 100 jitted_fn\n".as_bytes()).unwrap();
        let jit = s.perf_map("[jit]".into(), pm);
        let jid = jit.id;
        assert_eq!(&*s.lines(jid, 0x1010)[0].function, "jitted_fn");
        drop(jit);
        for _ in 0..=ADDR_EVICT_AFTER + 1 {
            s.end_interval();
        }
        assert!(s.object(jid).is_none(), "unused object evicted");
        assert!(s.object(kid).is_some(), "kernel stays");
        assert_eq!(s.stats().cached_addresses, 0);
    }
}

#[cfg(test)]
mod probe {
    //! Memory of symbolizing a big binary with DWARF (`/proc/self/status`
    //! before and after), for the figures in docs/agent.md.

    use super::*;

    fn status() -> String {
        let s = fs::read_to_string("/proc/self/status").unwrap();
        s.lines()
            .filter(|l| {
                ["VmHWM", "VmRSS", "RssAnon", "RssFile"]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// FATHOM_DWARF_PROBE=path:text_offset:text_size[:n]
    #[test]
    #[ignore]
    fn dwarf_memory_probe() {
        let spec = std::env::var("FATHOM_DWARF_PROBE").unwrap();
        let parts: Vec<&str> = spec.split(':').collect();
        let path = parts[0];
        let off = u64::from_str_radix(parts[1], 16).unwrap();
        let size = u64::from_str_radix(parts[2], 16).unwrap();
        let n: u64 = parts.get(3).map_or(2000, |s| s.parse().unwrap());
        crate::mem::release_free_memory();
        eprintln!("start: {}", status());
        let m = fs::metadata(path).unwrap();
        let mut s = Symbolizer::new(SymbolTable::default(), 1 << 30);
        let o = s.elf(std::process::id(), path, maps_dev(m.dev()), m.ino(), 0, 0);
        let t = std::time::Instant::now();
        let mut named = 0;
        let mut lines = 0;
        for i in 0..n {
            let a = off + size / n * i + 7;
            let l = s.lines(o.id, a);
            if !l.is_empty() {
                named += 1;
            }
            lines += l.len();
            if i == 0 || i == n / 10 {
                eprintln!("after {i}: {}", status());
            }
        }
        eprintln!(
            "symbolized {n} ({named} named, {lines} lines) in {:?}: {}",
            t.elapsed(),
            status()
        );
        s.end_interval();
        crate::mem::release_free_memory();
        eprintln!("after end_interval: {}", status());
        s.end_interval();
        crate::mem::release_free_memory();
        eprintln!("after 2nd end_interval: {}", status());
    }
}
