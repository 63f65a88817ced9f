//! From ring buffer records to pprof profiles.
//!
//! ```text
//! record ──► process table (pid, start time) ──► frames normalized to (object, offset)
//!                 │ first sight: /proc maps, exe, cgroup → labels → relabel
//!                 ▼
//!        per-process stack counts ──(every push interval)──► symbolize ──► one pprof per label set
//! ```
//!
//! - A process is identified by pid and the start time of its leader, so a
//!   reused pid is a new process. Its memory map is read on its first sample
//!   (the BPF program wakes the agent for exactly that), re-read when an
//!   address falls outside every known mapping (dlopen, JIT), and dropped on
//!   exec. Frames are normalized to (object, file offset) at once, so a
//!   process that exits before the next push is still reported in full.
//! - Stacks are symbolized once per push, through caches keyed by object, so
//!   the cost follows distinct code, not sample count.
//! - A process that relabeling drops is reported for exclusion in the
//!   kernel, so its samples cost nothing after the first.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fathom_agent_ebpf::{Event, EventKind, FLAG_USER_TRUNCATED};
use fathom_model::Labels;
use fathom_proto::push::{LabelPair, RawProfile};

use crate::metrics::Metrics;
use crate::pprof::{PprofBuilder, encode_gzip};
use crate::procfs::{self, Backing, Mapping, Proc};
use crate::python::PyProcess;
use crate::relabel::{LabelMap, Relabeler};
use crate::symbolize::{FrameKey, Object, Symbolizer};
use crate::symtab::SymbolTable;
use crate::unwind::{MappedFile, Rejected, Unwinder};

/// Minimum time between two re-reads of one process's maps on a miss; it
/// doubles, up to `MAPS_REFRESH_MAX`, while re-reads find nothing new (a
/// process without frame pointers misses all the time). Short, because a
/// process first seen while the dynamic loader runs has no libc yet: until
/// the re-read, its libc frames are unknown and have no unwind table.
const MAPS_REFRESH: Duration = Duration::from_millis(100);
const MAPS_REFRESH_MAX: Duration = Duration::from_secs(60);
/// Minimum time between two reads of one process's perf map.
const PERF_MAP_REFRESH: Duration = Duration::from_secs(5);
/// Minimum time between two reads of one process's perf map when it does
/// not name an address and has grown since it was read (the runtime
/// appends a line per function it compiles); it doubles with each such
/// read, up to `PERF_MAP_REFRESH`, so that a runtime compiling all the time
/// is not re-read more than every few seconds (each read is a new table).
const PERF_MAP_MISS_REFRESH: Duration = Duration::from_millis(200);
/// Longest command line kept in `__meta_process_cmdline`.
const CMDLINE_MAX: usize = 512;

/// The profile name (`__name__`) of the agent's CPU profiles.
pub(crate) const PROFILE_NAME: &str = "process_cpu";
/// The profile name of off-CPU profiles (profile type
/// `off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds`).
pub(crate) const OFF_CPU_PROFILE_NAME: &str = "off_cpu";

/// Static settings of the collector.
#[derive(Clone, Debug)]
pub(crate) struct CollectorConfig {
    pub(crate) node: String,
    pub(crate) period_ns: u64,
    pub(crate) relabeler: Relabeler,
    /// Files above this size are symbolized without DWARF.
    pub(crate) dwarf_max_file_size: u64,
}

struct Process {
    pid: u32,
    /// Unique per process incarnation (exec gives a new one).
    serial: u64,
    /// Final labels; `None` when relabeling dropped the process.
    labels: Option<Arc<Labels>>,
    maps: Vec<(Mapping, Rc<Object>)>,
    maps_read: Option<Instant>,
    maps_backoff: Duration,
    perf_map: Option<Rc<Object>>,
    perf_map_read: Option<Instant>,
    /// Size of the perf map file when it was last read.
    perf_map_len: u64,
    /// Current minimum age of the perf map for a re-read on a miss.
    perf_map_backoff: Duration,
    ns_pid: u32,
    /// Push interval in which this process was last sampled.
    last_interval: u64,
    /// A CPython process whose frames the BPF program records.
    py: Option<PyProcess>,
}

#[derive(Default)]
struct Aggregate {
    labels: Option<Arc<Labels>>,
    stacks: HashMap<Box<[FrameKey]>, u64>,
    /// Off-CPU nanoseconds per stack.
    offcpu: HashMap<Box<[FrameKey]>, u64>,
}

/// A process that relabeling dropped and that the kernel should skip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Skip {
    pub(crate) pid: u32,
    pub(crate) start_time: u64,
}

/// The collector: process table, aggregates, symbolizer.
pub(crate) struct Collector {
    cfg: CollectorConfig,
    proc: Proc,
    sym: Symbolizer,
    processes: HashMap<(u32, u64), Process>,
    aggregates: HashMap<u64, Aggregate>,
    /// Shared objects for memory that has no symbols (`[anon]`, `[heap]`, …).
    unknown: HashMap<String, Rc<Object>>,
    window_start: SystemTime,
    interval: u64,
    next_serial: u64,
    new_skips: Vec<Skip>,
    skipped: HashMap<u32, u64>,
    expired_skips: Vec<u32>,
    metrics: Arc<Metrics>,
    /// Unwind tables in the kernel; `None` in tests without BPF.
    unwinder: Option<Unwinder>,
}

impl Collector {
    pub(crate) fn new(cfg: CollectorConfig, kallsyms: SymbolTable, metrics: Arc<Metrics>) -> Self {
        Collector {
            sym: Symbolizer::new(kallsyms, cfg.dwarf_max_file_size),
            cfg,
            proc: Proc::default(),
            processes: HashMap::new(),
            aggregates: HashMap::new(),
            unknown: HashMap::new(),
            window_start: SystemTime::now(),
            interval: 0,
            next_serial: 1,
            new_skips: Vec::new(),
            skipped: HashMap::new(),
            expired_skips: Vec::new(),
            metrics,
            unwinder: None,
        }
    }

    /// Processes to add to the kernel's skip map since the last call.
    pub(crate) fn take_new_skips(&mut self) -> Vec<Skip> {
        std::mem::take(&mut self.new_skips)
    }

    /// Handles one ring buffer record.
    pub(crate) fn on_event(&mut self, ev: &Event<'_>) {
        let h = &ev.header;
        let key = (h.pid, h.start_time);
        match h.kind {
            EventKind::Exec => {
                // A new address space: forget the old one. Samples taken
                // before stay with the old incarnation's aggregate.
                self.processes.remove(&key);
                if let Some(u) = self.unwinder.as_mut() {
                    u.forget_process(h.pid);
                }
                self.metrics.exec_events.inc();
            }
            EventKind::Sample | EventKind::OffCpu => {
                self.metrics.samples.inc();
                if !self.processes.contains_key(&key) {
                    let p = self.discover(h.pid, h.start_time, &h.process_name());
                    let profiled = p.labels.is_some();
                    self.processes.insert(key, p);
                    if profiled {
                        self.read_maps(key);
                    }
                }
                let interval = self.interval;
                let Some(p) = self.processes.get_mut(&key) else {
                    return;
                };
                p.last_interval = interval;
                let Some(labels) = p.labels.clone() else {
                    self.metrics.samples_dropped_by_relabel.inc();
                    return;
                };
                let serial = p.serial;
                let mut frames =
                    Vec::with_capacity(usize::from(h.kframes) + usize::from(h.uframes) + 1);
                let kernel = self.sym.kernel().id;
                for (i, a) in ev.kernel_frames().enumerate() {
                    // Past the leaf, frames are return addresses: look up the call.
                    let addr = if i == 0 { a } else { a.saturating_sub(1) };
                    frames.push(FrameKey {
                        object: kernel,
                        addr,
                    });
                }
                let mut cut = false;
                let mut py = self.python_frames(key, ev).into_iter().peekable();
                for (i, a) in ev.user_frames().enumerate() {
                    let addr = if i == 0 { a } else { a.saturating_sub(1) };
                    if py.peek().is_some() && self.is_eval(key, addr) {
                        // This interpreter call runs Python frames up to
                        // its entry frame.
                        for mut f in py.by_ref() {
                            let entry = f.addr & (1 << 63) != 0;
                            f.addr &= !(1 << 63);
                            frames.push(f);
                            if entry {
                                break;
                            }
                        }
                        continue;
                    }
                    match self.user_frame(key, addr) {
                        Some(f) => frames.push(f),
                        None => {
                            // Outside every mapping: the frame-pointer chain
                            // went astray (code without frame pointers), and
                            // what follows is noise. One marker frame says so.
                            self.metrics.frames_outside_mappings.inc();
                            frames.push(self.sym.truncated());
                            cut = true;
                            break;
                        }
                    }
                }
                for mut f in py {
                    f.addr &= !(1 << 63);
                    frames.push(f);
                }
                if !cut && h.flags & FLAG_USER_TRUNCATED != 0 {
                    // The unwinder stopped before the outermost frame.
                    frames.push(self.sym.truncated_unwind());
                }
                if frames.is_empty() {
                    self.metrics.samples_without_stack.inc();
                    return;
                }
                let agg = self.aggregates.entry(serial).or_default();
                agg.labels.get_or_insert(labels);
                if h.kind == EventKind::OffCpu {
                    *agg.offcpu.entry(frames.into_boxed_slice()).or_default() += h.value;
                } else {
                    *agg.stacks.entry(frames.into_boxed_slice()).or_default() += 1;
                }
            }
        }
    }

    /// Hands the unwind table maps to the collector: from now on every
    /// process's executable files get tables (see `unwind`).
    pub(crate) fn set_unwinder(&mut self, u: Unwinder) {
        self.metrics
            .unwind_table_budget_rows
            .set(i64::try_from(u.stats().rows_budget).unwrap_or(i64::MAX));
        self.unwinder = Some(u);
    }

    /// Gives the BPF unwinder the tables of process `key`'s files.
    fn update_unwind(&mut self, key: (u32, u64)) {
        let Some(u) = self.unwinder.as_mut() else {
            return;
        };
        let Some(p) = self.processes.get(&key) else {
            return;
        };
        let pid = p.pid;
        let opens: Vec<(String, &Mapping)> = p
            .maps
            .iter()
            .filter_map(|(m, o)| match &m.backing {
                Backing::File { path, dev, inode } => Some((
                    if o.build_id.is_empty() {
                        format!("{path}:{dev}:{inode}")
                    } else {
                        o.build_id.clone()
                    },
                    m,
                )),
                _ => None,
            })
            .collect();
        let closures: Vec<Box<dyn Fn() -> Option<std::fs::File>>> = opens
            .iter()
            .map(|(_, m)| {
                let (start, end) = (m.start, m.end);
                let path = match &m.backing {
                    Backing::File { path, .. } => path.clone(),
                    _ => String::new(),
                };
                let f: Box<dyn Fn() -> Option<std::fs::File>> = Box::new(move || {
                    std::fs::File::open(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))
                        .or_else(|_| {
                            std::fs::File::open(format!(
                                "/proc/{pid}/root/{}",
                                path.trim_start_matches('/')
                            ))
                        })
                        .ok()
                });
                f
            })
            .collect();
        let files: Vec<MappedFile<'_>> = opens
            .iter()
            .zip(&closures)
            .map(|((k, m), open)| MappedFile {
                start: m.start,
                end: m.end,
                offset: m.offset,
                key: k,
                open: open.as_ref(),
            })
            .collect();
        u.set_process(pid, &files);
        // A CPython we know: tell the BPF program where its frames are.
        let mut py = None;
        let has_py = p.py.is_some();
        for f in files.iter().filter(|_| !has_py) {
            let Some((_, m)) = opens.iter().find(|(k, m)| k == f.key && m.start == f.start) else {
                continue;
            };
            let Backing::File { path, .. } = &m.backing else {
                continue;
            };
            let Some(off) = crate::python::offsets_for(path) else {
                continue;
            };
            let Some(file) = (f.open)() else { continue };
            let (Some(sym), Ok(layout)) = (
                crate::python::symbols(&file),
                crate::elf::ElfLayout::read(&file),
            ) else {
                continue;
            };
            let Some(vaddr) = layout.mapping_vaddr(m.offset) else {
                continue;
            };
            let bias = m.start.wrapping_sub(vaddr);
            if let Some(mut proc) = PyProcess::open(pid, off) {
                proc.eval = vec![(sym.eval.0.wrapping_add(bias), sym.eval.1.wrapping_add(bias))];
                u.set_python(pid, crate::python::proc_entry(&off, &sym, bias));
                tracing::debug!(pid, path, "CPython 3.11: recording Python frames");
                py = Some(proc);
            }
            break;
        }
        for r in u.take_rejections() {
            let reason = match r {
                Rejected::Budget => "budget",
                Rejected::NoTable => "no_table",
            };
            self.metrics
                .unwind_tables_rejected
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: reason.into(),
                })
                .inc();
        }
        let st = u.stats();
        self.metrics.unwind_tables.set(st.tables as i64);
        self.metrics
            .unwind_table_rows
            .set(i64::try_from(st.rows_used).unwrap_or(i64::MAX));
        drop(files);
        if let Some(py) = py
            && let Some(p) = self.processes.get_mut(&key)
        {
            p.py = Some(py);
        }
    }

    /// The user part of a stack with Python frames interleaved: each
    /// `_PyEval_EvalFrameDefault` frame (leaf first) is replaced by the
    /// Python frames it runs, up to and including the next entry frame.
    /// Python frames left over (the native walk stopped early) go above
    /// the native ones.
    fn python_frames(&mut self, key: (u32, u64), ev: &Event<'_>) -> Vec<FrameKey> {
        let Some(py) = self.processes.get_mut(&key).and_then(|p| p.py.as_mut()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (code, instr) in ev.python_frames() {
            let entry = instr & 1 != 0;
            let (name, file, line) = match py.code(code) {
                Some(c) => (c.name.clone(), c.file.clone(), c.line_at(instr & !1)),
                None => (Rc::from("[unknown python]"), Rc::from(""), 0),
            };
            out.push((name, file, line, entry));
        }
        out.into_iter()
            .map(|(name, file, line, entry)| {
                let mut f = self.sym.python_frame(&name, &file, line);
                // The entry bit rides in the key's top bit until interleaving.
                if entry {
                    f.addr |= 1 << 63;
                }
                f
            })
            .collect()
    }

    fn is_eval(&self, key: (u32, u64), addr: u64) -> bool {
        self.processes
            .get(&key)
            .and_then(|p| p.py.as_ref())
            .is_some_and(|py| py.is_eval(addr))
    }

    fn unknown_object(&mut self, name: &str) -> Rc<Object> {
        if let Some(o) = self.unknown.get(name) {
            return o.clone();
        }
        let o = self.sym.unknown(name);
        self.unknown.insert(name.to_owned(), o.clone());
        o
    }

    /// Normalizes one user address of process `key`; `None` when no mapping
    /// of the process holds it, even after a re-read of its maps.
    fn user_frame(&mut self, key: (u32, u64), addr: u64) -> Option<FrameKey> {
        let mut hit = self.lookup_mapping(key, addr);
        if hit.is_none() {
            let now = Instant::now();
            let due = self.processes.get(&key).is_some_and(|p| {
                p.maps_read
                    .is_none_or(|t| now.duration_since(t) >= p.maps_backoff)
            });
            if due {
                self.read_maps(key);
                hit = self.lookup_mapping(key, addr);
            }
        }
        let (m, obj) = hit?;
        Some(match &m.backing {
            Backing::File { .. } => FrameKey {
                object: obj.id,
                addr: addr - m.start + m.offset,
            },
            Backing::Vdso => FrameKey {
                object: obj.id,
                addr: addr - m.start,
            },
            Backing::Anon(_) => match self.perf_map_object(key, addr) {
                Some(jit) => FrameKey {
                    object: jit.id,
                    addr,
                },
                None => FrameKey {
                    object: obj.id,
                    addr,
                },
            },
        })
    }

    fn lookup_mapping(&self, key: (u32, u64), addr: u64) -> Option<(Mapping, Rc<Object>)> {
        let p = self.processes.get(&key)?;
        let i = p
            .maps
            .partition_point(|(m, _)| m.start <= addr)
            .checked_sub(1)?;
        let (m, o) = &p.maps[i];
        (addr < m.end).then(|| (m.clone(), o.clone()))
    }

    /// The JIT perf map of a process for a frame at `addr`: (re)read at most
    /// every few seconds, and sooner when it does not name `addr` but has
    /// grown (a function compiled since the last read).
    fn perf_map_object(&mut self, key: (u32, u64), addr: u64) -> Option<Rc<Object>> {
        let now = Instant::now();
        let p = self.processes.get(&key)?;
        let (pid, ns_pid) = (p.pid, p.ns_pid);
        let path = self
            .proc
            .root_dir(pid)
            .join(format!("tmp/perf-{ns_pid}.map"));
        let age = p.perf_map_read.map(|t| now.duration_since(t));
        if let Some(age) = age
            && age < PERF_MAP_REFRESH
        {
            let covered = p.perf_map.as_ref().is_some_and(|o| o.perf_map_covers(addr));
            let grown = || std::fs::metadata(&path).is_ok_and(|m| m.len() != p.perf_map_len);
            if covered || age < p.perf_map_backoff || !grown() {
                return p.perf_map.clone();
            }
        }
        let mut len = 0;
        let obj = match std::fs::File::open(&path) {
            Ok(f) => match f.metadata().map(|m| m.len()).and_then(|l| {
                len = l;
                SymbolTable::parse_perf_map(std::io::BufReader::new(f))
            }) {
                Ok(t) if !t.is_empty() => {
                    Some(self.sym.perf_map(format!("/tmp/perf-{ns_pid}.map"), t))
                }
                _ => None,
            },
            Err(_) => None,
        };
        let p = self.processes.get_mut(&key)?;
        p.perf_map_read = Some(now);
        p.perf_map_len = len;
        if age.is_some() {
            p.perf_map_backoff = (p.perf_map_backoff * 2).min(PERF_MAP_REFRESH);
        }
        if obj.is_some() {
            p.perf_map = obj;
        }
        p.perf_map.clone()
    }

    /// (Re-)reads the maps of a process and resolves new files to objects.
    fn read_maps(&mut self, key: (u32, u64)) {
        let (pid, _) = key;
        let now = Instant::now();
        let read = self.proc.maps(pid);
        let Some(p) = self.processes.get_mut(&key) else {
            return;
        };
        p.maps_read = Some(now);
        let maps = match read {
            Ok(m) if !m.is_empty() => m,
            // A kernel thread, a zombie, or a process in the middle of an
            // exec: keep what we had.
            Ok(_) => {
                p.maps_backoff = (p.maps_backoff * 2).min(MAPS_REFRESH_MAX);
                return;
            }
            // Gone.
            Err(_) => {
                p.maps_backoff = (p.maps_backoff * 2).min(MAPS_REFRESH_MAX);
                self.metrics.maps_read_failures.inc();
                return;
            }
        };
        if maps.len() == p.maps.len() && maps.iter().zip(&p.maps).all(|(a, (b, _))| a == b) {
            p.maps_backoff = (p.maps_backoff * 2).min(MAPS_REFRESH_MAX);
            return;
        }
        p.maps_backoff = MAPS_REFRESH;
        let mut resolved = Vec::with_capacity(maps.len());
        for m in maps {
            let obj = match &m.backing {
                Backing::File { path, dev, inode } => {
                    self.sym.elf(pid, path, *dev, *inode, m.start, m.end)
                }
                Backing::Vdso => self.sym.vdso().clone(),
                Backing::Anon(name) => self.unknown_object(name),
            };
            resolved.push((m, obj));
        }
        if let Some(p) = self.processes.get_mut(&key) {
            p.maps = resolved;
        }
        self.update_unwind(key);
    }

    /// Builds the process entry on first sight: labels and relabeling. The
    /// caller reads its maps when it is kept.
    fn discover(&mut self, pid: u32, start_time: u64, comm: &str) -> Process {
        let serial = self.next_serial;
        self.next_serial += 1;
        let labels = self.discover_labels(pid, comm);
        let labels = match self.cfg.relabeler.apply(labels) {
            Some(l) => match Labels::from_pairs(l) {
                Ok(l) => Some(Arc::new(l)),
                Err(error) => {
                    tracing::warn!(pid, %error, "labels after relabeling are invalid; process not profiled");
                    None
                }
            },
            None => None,
        };
        if labels.is_none() {
            self.new_skips.push(Skip { pid, start_time });
            self.skipped.insert(pid, start_time);
        }
        self.metrics.processes_discovered.inc();
        Process {
            pid,
            serial,
            labels,
            maps: Vec::new(),
            maps_read: None,
            maps_backoff: MAPS_REFRESH,
            perf_map: None,
            perf_map_read: None,
            perf_map_len: 0,
            perf_map_backoff: PERF_MAP_MISS_REFRESH,
            ns_pid: self.proc.ns_pid(pid).unwrap_or(pid),
            last_interval: self.interval,
            py: None,
        }
    }

    /// Labels before relabeling: visible ones plus `__meta_*`.
    fn discover_labels(&self, pid: u32, comm: &str) -> LabelMap {
        let mut l = LabelMap::new();
        let mut put = |k: &str, v: &str| {
            if !v.is_empty() {
                l.insert(k.to_owned(), v.to_owned());
            }
        };
        put("node", &self.cfg.node);
        put("pid", &pid.to_string());
        put("comm", comm);
        let exe = self.proc.exe(pid).unwrap_or_default();
        let exe_name = exe.rsplit('/').next().unwrap_or("");
        put("executable", &exe);
        let cmdline = self.proc.cmdline(pid, CMDLINE_MAX).unwrap_or_default();
        let script = script_name(exe_name, &cmdline);
        put(
            fathom_model::SERVICE_NAME,
            match script {
                Some(s) => s,
                None if exe_name.is_empty() => comm,
                None => exe_name,
            },
        );
        put("__meta_process_executable_name", exe_name);
        if let Ok(cg) = self.proc.cgroup(pid) {
            let info = procfs::parse_cgroup_path(&cg);
            put("__meta_process_cgroup", &cg);
            if let Some(c) = &info.container_id {
                put("container_id", c);
            }
            if let Some(u) = &info.systemd_unit {
                put("systemd_unit", u);
            }
            if let Some(uid) = &info.pod_uid {
                put("__meta_kubernetes_pod_uid", uid);
                let k = procfs::read_kube_info(&self.proc.root_dir(pid));
                put("namespace", k.namespace.as_deref().unwrap_or(""));
                put("pod", k.pod.as_deref().unwrap_or(""));
            }
        }
        put("__meta_process_cmdline", &cmdline);
        l
    }

    /// Ends the push interval: one profile per label set, symbolized, then
    /// forgets processes that are gone and unused code objects.
    pub(crate) fn take_profiles(&mut self) -> Vec<RawProfile> {
        let now = SystemTime::now();
        let start = std::mem::replace(&mut self.window_start, now);
        let time_nanos = start
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let duration_nanos = now.duration_since(start).map_or(0, |d| d.as_nanos() as i64);
        let period = i64::try_from(self.cfg.period_ns).unwrap_or(i64::MAX);

        let mut groups: HashMap<(Arc<Labels>, bool), PprofBuilder> = HashMap::new();
        let mut aggregates: Vec<Aggregate> =
            std::mem::take(&mut self.aggregates).into_values().collect();
        // Deterministic merge order.
        aggregates.sort_by(|a, b| a.labels.cmp(&b.labels));
        // Every new address first, object by object: a parsed file is then
        // opened at most once per interval.
        self.sym.resolve_all(
            aggregates
                .iter()
                .flat_map(|a| a.stacks.keys().chain(a.offcpu.keys()).flatten()),
        );
        for agg in aggregates {
            let Some(labels) = agg.labels else { continue };
            // CPU samples (false) and off-CPU time (true), one profile each.
            for (offcpu, stacks) in [(false, agg.stacks), (true, agg.offcpu)] {
                if stacks.is_empty() {
                    continue;
                }
                let b = groups.entry((labels.clone(), offcpu)).or_default();
                let mut stacks: Vec<_> = stacks.into_iter().collect();
                stacks.sort();
                for (frames, n) in stacks {
                    b.add(&mut self.sym, &frames, n);
                }
            }
        }
        let mut out = Vec::with_capacity(groups.len());
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        for ((labels, offcpu), b) in groups {
            if b.is_empty() {
                continue;
            }
            self.metrics
                .unsymbolized_locations
                .inc_by(b.unsymbolized_locations);
            let p = if offcpu {
                b.finish_off_cpu(time_nanos, duration_nanos)
            } else {
                b.finish(time_nanos, duration_nanos, period)
            };
            let mut pairs: Vec<LabelPair> = labels
                .iter()
                .map(|(k, v)| LabelPair {
                    name: k.to_owned(),
                    value: v.to_owned(),
                })
                .collect();
            pairs.push(LabelPair {
                name: "__name__".into(),
                value: if offcpu {
                    OFF_CPU_PROFILE_NAME
                } else {
                    PROFILE_NAME
                }
                .into(),
            });
            out.push(RawProfile {
                labels: pairs,
                pprof: encode_gzip(&p),
                profile_id: uuid::Uuid::new_v4().as_bytes().to_vec(),
            });
        }
        self.metrics.profiles_built.inc_by(out.len() as u64);
        self.housekeeping();
        out
    }

    fn housekeeping(&mut self) {
        let interval = self.interval;
        let proc = &self.proc;
        // A process not sampled during the interval that just ended and no
        // longer alive is forgotten.
        let mut gone = Vec::new();
        self.processes.retain(|_, p| {
            let keep = p.last_interval >= interval || proc.alive(p.pid);
            if !keep {
                gone.push(p.pid);
            }
            keep
        });
        if let Some(u) = self.unwinder.as_mut() {
            for pid in gone {
                // Unless the pid was reused by a process still known.
                if !self.processes.keys().any(|&(p, _)| p == pid) {
                    u.forget_process(pid);
                }
            }
            u.end_interval();
            let st = u.stats();
            self.metrics.unwind_tables.set(st.tables as i64);
            self.metrics
                .unwind_table_rows
                .set(i64::try_from(st.rows_used).unwrap_or(i64::MAX));
        }
        let mut expired = Vec::new();
        self.skipped.retain(|&pid, _| {
            let alive = proc.alive(pid);
            if !alive {
                expired.push(pid);
            }
            alive
        });
        self.expired_skips.extend(expired);
        self.interval += 1;
        self.sym.end_interval();
        // Held here and by the symbolizer only: no process maps it any more.
        self.unknown.retain(|_, o| Rc::strong_count(o) > 2);
        let stats = self.sym.stats();
        self.metrics.processes.set(self.processes.len() as i64);
        self.metrics.symbolizer_objects.set(stats.objects as i64);
        self.metrics
            .symbolizer_cached_addresses
            .set(stats.cached_addresses as i64);
    }

    /// Skipped processes that have exited since the last call, to remove
    /// from the kernel's skip map.
    pub(crate) fn take_expired_skips(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.expired_skips)
    }

    #[cfg(test)]
    pub(crate) fn debug_unwind(&self, pid: u32) -> String {
        let Some(u) = self.unwinder.as_ref() else {
            return "no unwinder".into();
        };
        let maps: Vec<String> = self
            .processes
            .iter()
            .filter(|((p, _), _)| *p == pid)
            .flat_map(|(_, p)| {
                p.maps.iter().map(|(m, o)| {
                    format!(
                        "{:x}-{:x}@{:x} {} {}",
                        m.start, m.end, m.offset, o.name, o.build_id
                    )
                })
            })
            .collect();
        match u.kernel_entry(pid) {
            Some(e) => format!("{:?} {maps:?} {:x?}", u.stats(), &e.maps[..e.len as usize]),
            None => format!("{:?} no entry; maps {maps:?}", u.stats()),
        }
    }

    #[cfg(test)]
    fn process_count(&self) -> usize {
        self.processes.len()
    }
}

/// For an interpreter (`python…`), the file name of the script it runs
/// (or the module of `-m`): what names a Python service.
fn script_name<'a>(exe_name: &str, cmdline: &'a str) -> Option<&'a str> {
    if !exe_name.starts_with("python") {
        return None;
    }
    let mut args = cmdline.split(' ').skip(1);
    while let Some(a) = args.next() {
        match a {
            "-m" => return args.next(),
            // Options that take a value.
            "-W" | "-X" | "-Q" => {
                args.next();
            }
            "-c" | "-" => return None,
            a if a.starts_with('-') => {}
            a => return a.rsplit('/').next(),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{decode, tests::folded};
    use fathom_agent_ebpf::{EventHeader, comm_bytes, encode_event, parse_event};

    fn collector(relabel: &str) -> Collector {
        let mut reg = prometheus_client::registry::Registry::default();
        Collector::new(
            CollectorConfig {
                node: "n1".into(),
                period_ns: 52_631_578,
                relabeler: Relabeler::from_yaml(relabel).unwrap(),
                dwarf_max_file_size: crate::symbolize::DEFAULT_DWARF_MAX,
            },
            SymbolTable::parse_kallsyms(
                "ffffffff81000000 T entry_SYSCALL_64\nffffffff81000100 T do_sys_write\n".as_bytes(),
            )
            .unwrap(),
            Arc::new(Metrics::new(&mut reg)),
        )
    }

    fn header(kind: EventKind, pid: u32, start_time: u64) -> EventHeader {
        EventHeader {
            kind,
            pid,
            tid: pid,
            cpu: 0,
            start_time,
            ktime: 0,
            comm: comm_bytes("t"),
            pcomm: comm_bytes("proc-name"),
            kframes: 0,
            uframes: 0,
            kerr: 0,
            uerr: 0,
            flags: 0,
            pyframes: 0,
            value: 0,
        }
    }

    #[inline(never)]
    fn leaf_for_collector_test() -> u64 {
        std::hint::black_box(leaf_for_collector_test as *const () as u64 + 4)
    }

    #[inline(never)]
    fn caller_for_collector_test() -> u64 {
        std::hint::black_box(caller_for_collector_test as *const () as u64 + 9)
    }

    fn labels_of(r: &RawProfile) -> Vec<(String, String)> {
        r.labels
            .iter()
            .map(|l| (l.name.clone(), l.value.clone()))
            .collect()
    }

    #[test]
    fn own_process_end_to_end() {
        let mut c = collector("");
        let pid = std::process::id();
        let leaf = leaf_for_collector_test();
        let caller = caller_for_collector_test();
        let b = encode_event(
            &header(EventKind::Sample, pid, 77),
            &[0xffffffff81000110, 0xffffffff81000010],
            &[leaf, caller + 1],
        );
        for _ in 0..3 {
            c.on_event(&parse_event(&b).unwrap());
        }
        let out = c.take_profiles();
        assert_eq!(out.len(), 1);
        let labels = labels_of(&out[0]);
        let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("pid"), Some(pid.to_string()));
        assert_eq!(get("node").as_deref(), Some("n1"));
        assert_eq!(get("comm").as_deref(), Some("proc-name"));
        assert_eq!(get("__name__").as_deref(), Some(PROFILE_NAME));
        let exe = std::env::current_exe().unwrap();
        assert_eq!(get("executable"), Some(exe.display().to_string()));
        assert_eq!(
            get("service_name"),
            Some(exe.file_name().unwrap().to_string_lossy().into_owned())
        );
        assert!(
            get("__meta_process_cgroup").is_none(),
            "meta labels are stripped"
        );
        let p = decode(&out[0].pprof, 1 << 24).unwrap();
        let f = folded(&p);
        assert_eq!(f.len(), 1);
        let (stack, n) = &f[0];
        assert_eq!(*n, 3);
        let names: Vec<&str> = stack.split(';').collect();
        assert!(names[0].ends_with("caller_for_collector_test"), "{stack}");
        assert!(names[1].ends_with("leaf_for_collector_test"), "{stack}");
        assert_eq!(&names[2..], ["entry_SYSCALL_64", "do_sys_write"]);
        assert_eq!(p.sample[0].value, vec![3, 3 * 52_631_578]);
        assert_eq!(
            p.period_type
                .as_ref()
                .map(|v| p.string_table[v.r#type as usize].as_str()),
            Some("cpu")
        );
        // The executable's mapping carries its path and build id.
        let exe_map = p
            .mapping
            .iter()
            .find(|m| p.string_table[m.filename as usize] == exe.display().to_string())
            .expect("mapping of the test binary");
        assert!(!p.string_table[exe_map.build_id as usize].is_empty());
        assert!(exe_map.has_functions);
        // Nothing left for the next interval.
        assert!(c.take_profiles().is_empty());
    }

    #[test]
    fn exited_process_is_not_lost_and_pid_reuse_is_a_new_process() {
        let mut c = collector("");
        // A pid that does not exist: the process exited before discovery.
        let pid = u32::MAX - 7;
        let b = encode_event(
            &header(EventKind::Sample, pid, 1),
            &[0xffffffff81000010],
            &[0x401000],
        );
        c.on_event(&parse_event(&b).unwrap());
        let b2 = encode_event(
            &header(EventKind::Sample, pid, 2),
            &[0xffffffff81000010],
            &[],
        );
        c.on_event(&parse_event(&b2).unwrap());
        assert_eq!(c.process_count(), 2);
        let out = c.take_profiles();
        // Two incarnations with identical labels merge into one profile.
        assert_eq!(out.len(), 1);
        let p = decode(&out[0].pprof, 1 << 24).unwrap();
        let f = folded(&p);
        assert_eq!(
            f,
            vec![
                ("[unknown];entry_SYSCALL_64".to_string(), 1),
                ("entry_SYSCALL_64".to_string(), 1)
            ]
        );
        // Dead and unsampled: forgotten after the interval.
        c.take_profiles();
        assert_eq!(c.process_count(), 0);
    }

    #[test]
    fn python_service_name_is_the_script() {
        assert_eq!(
            script_name("python3.11", "python3 -u /srv/app/worker.py --x 1"),
            Some("worker.py")
        );
        assert_eq!(
            script_name("python3.11", "python3 -m http.server"),
            Some("http.server")
        );
        assert_eq!(script_name("python3.11", "python3 -c print(1)"), None);
        assert_eq!(script_name("node", "node app.js"), None);
    }

    #[test]
    fn truncated_unwind_gets_a_root_marker_and_off_cpu_its_own_profile() {
        let mut c = collector("");
        let pid = u32::MAX - 11;
        let mut h = header(EventKind::Sample, pid, 1);
        h.flags = FLAG_USER_TRUNCATED;
        c.on_event(&parse_event(&encode_event(&h, &[0xffffffff81000010], &[])).unwrap());
        let mut off = header(EventKind::OffCpu, pid, 1);
        off.value = 7_000_000;
        for _ in 0..2 {
            c.on_event(&parse_event(&encode_event(&off, &[0xffffffff81000110], &[])).unwrap());
        }
        let out = c.take_profiles();
        assert_eq!(out.len(), 2);
        let name = |r: &RawProfile| {
            labels_of(r)
                .into_iter()
                .find(|(k, _)| k == "__name__")
                .unwrap()
                .1
        };
        let cpu = out.iter().find(|r| name(r) == PROFILE_NAME).unwrap();
        let p = decode(&cpu.pprof, 1 << 24).unwrap();
        assert_eq!(
            folded(&p),
            vec![("[truncated];entry_SYSCALL_64".to_string(), 1)]
        );
        let offcpu = out
            .iter()
            .find(|r| name(r) == OFF_CPU_PROFILE_NAME)
            .unwrap();
        let p = decode(&offcpu.pprof, 1 << 24).unwrap();
        assert_eq!(folded(&p), vec![("do_sys_write".to_string(), 14_000_000)]);
        let st = |v: &fathom_proto::pprof::ValueType| {
            (
                p.string_table[v.r#type as usize].clone(),
                p.string_table[v.unit as usize].clone(),
            )
        };
        assert_eq!(
            p.sample_type.iter().map(st).collect::<Vec<_>>(),
            vec![("off_cpu".to_string(), "nanoseconds".to_string())]
        );
        assert_eq!(
            p.period_type.as_ref().map(st),
            Some(("off_cpu".to_string(), "nanoseconds".to_string()))
        );
    }

    #[test]
    fn relabel_drop_requests_kernel_skip_and_keeps_samples_out() {
        let mut c = collector(
            "relabel_configs: [{source_labels: [comm], regex: 'proc-name', action: drop}]",
        );
        let b = encode_event(
            &header(EventKind::Sample, 4242, 5),
            &[0xffffffff81000010],
            &[],
        );
        c.on_event(&parse_event(&b).unwrap());
        c.on_event(&parse_event(&b).unwrap());
        assert_eq!(
            c.take_new_skips(),
            vec![Skip {
                pid: 4242,
                start_time: 5
            }]
        );
        assert!(c.take_new_skips().is_empty());
        assert!(c.take_profiles().is_empty());
    }

    #[test]
    fn exec_starts_a_new_incarnation() {
        let mut c =
            collector("relabel_configs: [{source_labels: [comm], target_label: service_name}]");
        let pid = u32::MAX - 9;
        let mut h = header(EventKind::Sample, pid, 1);
        c.on_event(&parse_event(&encode_event(&h, &[0xffffffff81000010], &[])).unwrap());
        h.kind = EventKind::Exec;
        h.pcomm = comm_bytes("after-exec");
        c.on_event(&parse_event(&encode_event(&h, &[], &[])).unwrap());
        h.kind = EventKind::Sample;
        c.on_event(&parse_event(&encode_event(&h, &[0xffffffff81000010], &[])).unwrap());
        let out = c.take_profiles();
        let mut names: Vec<String> = out
            .iter()
            .map(|r| {
                labels_of(r)
                    .into_iter()
                    .find(|(k, _)| k == "service_name")
                    .unwrap()
                    .1
            })
            .collect();
        names.sort();
        assert_eq!(names, vec!["after-exec", "proc-name"]);
    }
}
