//! The agent's BPF program and the record layout it shares with user space.
//!
//! The program itself is C, in `src/bpf/` (`profiler.bpf.c`, `profiler.h`,
//! `vmlinux_min.h`); `fathom-agent`'s build script compiles it with clang into
//! a CO-RE object. This crate holds the Rust side of the contract: the names
//! of programs and maps, the counter indices, and a safe parser for the
//! records the program writes into its ring buffer.
//!
//! ```text
//! perf_event (CPU clock, every CPU) ──► on_cpu_sample ──► ring buffer `events` ──► agent
//! raw_tracepoint sched_process_exec ──► on_exec ────────┤
//! tp_btf sched_switch ──► on_switch_out ─┐ (off-CPU)     │
//! raw_tracepoint sys_exit ──► on_switch_in ──────────────┘
//!                                     └─► per-CPU `counters` (samples, idle, lost, stack errors)
//! agent ──► `unwind_rows`, `unwind_procs` (unwind tables), `py_procs` (CPython) ──► the walkers
//! ```
//!
//! Layout invariants: both `profiler.bpf.c` (with `_Static_assert`) and this
//! crate (with `const` assertions) state the same offsets, so a change on one
//! side only fails to build.

use std::fmt;

/// Path of the C sources relative to this crate's manifest directory.
pub const SOURCE_DIR: &str = "src/bpf";
/// The C file the agent's build script compiles.
pub const SOURCE_FILE: &str = "profiler.bpf.c";

/// The CPU-clock perf event program.
pub const PROGRAM_SAMPLE: &str = "on_cpu_sample";
/// The `sched_process_exec` raw tracepoint program.
pub const PROGRAM_EXEC: &str = "on_exec";
/// Raw tracepoint the exec program attaches to.
pub const EXEC_TRACEPOINT: &str = "sched_process_exec";
/// Off-CPU: the `sched_switch` BTF tracepoint program (a task blocks in a
/// system call and leaves its CPU).
pub const PROGRAM_SWITCH_OUT: &str = "on_switch_out";
/// BTF tracepoint [`PROGRAM_SWITCH_OUT`] attaches to.
pub const SWITCH_TRACEPOINT: &str = "sched_switch";
/// Off-CPU: the `sys_exit` raw tracepoint program (the system call returns).
pub const PROGRAM_SWITCH_IN: &str = "on_switch_in";
/// Raw tracepoint [`PROGRAM_SWITCH_IN`] attaches to.
pub const SYS_EXIT_TRACEPOINT: &str = "sys_exit";

/// Ring buffer of [`Event`]s.
pub const MAP_EVENTS: &str = "events";
/// Per-CPU `u64` counters indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "counters";
/// `u32` tgid → `u64` leader start time: processes not to sample.
pub const MAP_SKIP: &str = "skip";
/// `u32` tgid → [`PyProc`]: CPython processes and where their frames are.
pub const MAP_PY_PROCS: &str = "py_procs";
/// Array of [`UnwindRow`]s: every binary's unwind table, one slice each.
pub const MAP_UNWIND_ROWS: &str = "unwind_rows";
/// `u32` tgid → [`UnwindProc`]: the mappings of a process that have a table.
pub const MAP_UNWIND_PROCS: &str = "unwind_procs";

/// Load-time global: the tgid not to sample (0: none).
pub const GLOBAL_EXCLUDE_TGID: &str = "exclude_tgid";
/// Load-time global: wake the agent when this many bytes wait in the ring.
pub const GLOBAL_WAKEUP_BYTES: &str = "wakeup_bytes";
/// Load-time global: shortest off-CPU time recorded, ns (0: off-CPU off).
pub const GLOBAL_OFFCPU_MIN_NS: &str = "offcpu_min_ns";

/// Deepest stack captured per half (kernel, user).
pub const MAX_STACK_DEPTH: usize = 127;
/// Deepest Python stack recorded.
pub const MAX_PY_DEPTH: usize = 64;
/// Size of [`EventHeader`] on the wire.
pub const HEADER_SIZE: usize = 88;
/// Largest record the program writes.
pub const MAX_EVENT_SIZE: usize = HEADER_SIZE + (2 * MAX_STACK_DEPTH + 2 * MAX_PY_DEPTH) * 8;
const COMM_LEN: usize = 16;

// Offsets, as asserted in profiler.bpf.c.
const OFF_KIND: usize = 0;
const OFF_PID: usize = 4;
const OFF_TID: usize = 8;
const OFF_CPU: usize = 12;
const OFF_START_TIME: usize = 16;
const OFF_KTIME: usize = 24;
const OFF_COMM: usize = 32;
const OFF_PCOMM: usize = 48;
const OFF_KFRAMES: usize = 64;
const OFF_UFRAMES: usize = 66;
const OFF_KERR: usize = 68;
const OFF_UERR: usize = 70;
const OFF_FLAGS: usize = 72;
const OFF_PYFRAMES: usize = 76;
const OFF_VALUE: usize = 80;
const _: () = assert!(OFF_VALUE + 8 == HEADER_SIZE);
const _: () = assert!(OFF_PCOMM + COMM_LEN == OFF_KFRAMES);

/// Indices of the per-CPU counters (`enum counter` in `profiler.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Perf events that fired and were considered.
    Samples = 0,
    /// Samples of the idle task, not recorded.
    Idle = 1,
    /// Samples of excluded processes.
    Excluded = 2,
    /// Samples lost because the ring buffer was full.
    RingbufFull = 3,
    /// Failed kernel stack captures.
    KernelStackError = 4,
    /// Failed user stack captures.
    UserStackError = 5,
    /// User tasks whose user stack came back empty.
    UserStackEmpty = 6,
    /// Exec notifications lost because the ring buffer was full.
    ExecLost = 7,
    /// User stacks walked with unwind tables.
    UserStackTables = 8,
    /// User stacks that could not be walked to their end.
    UserStackTruncated = 9,
    /// Off-CPU events recorded.
    OffCpu = 10,
    /// Off-CPU events lost because the ring buffer was full.
    OffCpuLost = 11,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 12] = [
        Counter::Samples,
        Counter::Idle,
        Counter::Excluded,
        Counter::RingbufFull,
        Counter::KernelStackError,
        Counter::UserStackError,
        Counter::UserStackEmpty,
        Counter::ExecLost,
        Counter::UserStackTables,
        Counter::UserStackTruncated,
        Counter::OffCpu,
        Counter::OffCpuLost,
    ];

    pub fn index(self) -> u32 {
        self as u32
    }
}

/// What a ring buffer record reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A CPU-clock sample with stacks.
    Sample,
    /// The process called execve: its address space is new.
    Exec,
    /// A task back on a CPU after at least the off-CPU threshold away:
    /// [`EventHeader::value`] is the time away in ns, the stacks where it
    /// blocked.
    OffCpu,
}

/// [`EventHeader::flags`]: the user stack was walked with unwind tables.
pub const FLAG_USER_TABLES: u32 = 1;
/// [`EventHeader::flags`]: the user stack could not be walked to its end.
pub const FLAG_USER_TRUNCATED: u32 = 2;
/// [`EventHeader::flags`]: the Python stack was cut (too deep, unreadable).
pub const FLAG_PY_TRUNCATED: u32 = 4;

/// The fixed part of every record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventHeader {
    pub kind: EventKind,
    /// Thread group id (the process id) as the host sees it.
    pub pid: u32,
    /// Thread id as the host sees it.
    pub tid: u32,
    pub cpu: u32,
    /// Start time of the thread group leader, ns since boot: with `pid` it
    /// names one process even when pids are reused.
    pub start_time: u64,
    /// `bpf_ktime_get_ns()` when the event was taken.
    pub ktime: u64,
    /// Thread name, NUL-padded.
    pub comm: [u8; COMM_LEN],
    /// Process (leader) name, NUL-padded.
    pub pcomm: [u8; COMM_LEN],
    /// Kernel frames in the record, leaf first.
    pub kframes: u16,
    /// User frames after the kernel ones, leaf first.
    pub uframes: u16,
    /// 0, or the negative errno of the kernel stack capture.
    pub kerr: i16,
    /// 0, or the negative errno of the user stack capture.
    pub uerr: i16,
    /// `FLAG_*` bits.
    pub flags: u32,
    /// Python frames after the user frames.
    pub pyframes: u32,
    /// Off-CPU events: ns away from the CPU; 0 otherwise.
    pub value: u64,
}

impl EventHeader {
    /// Thread name, up to the first NUL, lossily decoded.
    pub fn thread_name(&self) -> String {
        c_str(&self.comm)
    }

    /// Process name, up to the first NUL, lossily decoded.
    pub fn process_name(&self) -> String {
        c_str(&self.pcomm)
    }
}

fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A parsed ring buffer record: the header and its frames.
#[derive(Clone, Debug)]
pub struct Event<'a> {
    pub header: EventHeader,
    frames: &'a [u8],
}

impl<'a> Event<'a> {
    /// Kernel frames, leaf first.
    pub fn kernel_frames(&self) -> impl Iterator<Item = u64> + 'a {
        let k = usize::from(self.header.kframes) * 8;
        words(&self.frames[..k])
    }

    /// User frames, leaf first.
    pub fn user_frames(&self) -> impl Iterator<Item = u64> + 'a {
        let k = usize::from(self.header.kframes) * 8;
        let u = usize::from(self.header.uframes) * 8;
        words(&self.frames[k..k + u])
    }

    /// Python frames, innermost first: (code object address, last
    /// instruction address with bit 0 set on entry frames).
    pub fn python_frames(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        let k = (usize::from(self.header.kframes) + usize::from(self.header.uframes)) * 8;
        let mut w = words(&self.frames[k..]);
        std::iter::from_fn(move || Some((w.next()?, w.next()?)))
    }
}

fn words(b: &[u8]) -> impl Iterator<Item = u64> + '_ {
    b.chunks_exact(8).map(|c| {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        u64::from_ne_bytes(a)
    })
}

/// Why a ring buffer record could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than a header.
    Short { len: usize },
    /// Unknown `kind`.
    Kind(u32),
    /// More frames announced than the record holds or the program writes.
    Frames {
        kframes: u16,
        uframes: u16,
        len: usize,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Short { len } => {
                write!(
                    f,
                    "record of {len} bytes is shorter than the {HEADER_SIZE}-byte header"
                )
            }
            ParseError::Kind(k) => write!(f, "unknown record kind {k}"),
            ParseError::Frames {
                kframes,
                uframes,
                len,
            } => write!(
                f,
                "record of {len} bytes announces {kframes} kernel and {uframes} user frames"
            ),
        }
    }
}

impl std::error::Error for ParseError {}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_ne_bytes(a)
}

/// Parses one ring buffer record. Never panics, whatever the bytes.
pub fn parse_event(b: &[u8]) -> Result<Event<'_>, ParseError> {
    if b.len() < HEADER_SIZE {
        return Err(ParseError::Short { len: b.len() });
    }
    let kind = match u32_at(b, OFF_KIND) {
        1 => EventKind::Sample,
        2 => EventKind::Exec,
        3 => EventKind::OffCpu,
        k => return Err(ParseError::Kind(k)),
    };
    let kframes = u16_at(b, OFF_KFRAMES);
    let uframes = u16_at(b, OFF_UFRAMES);
    let pyframes = u32_at(b, OFF_PYFRAMES);
    let frames = &b[HEADER_SIZE..];
    let py = usize::try_from(pyframes).unwrap_or(usize::MAX);
    let n = usize::from(kframes) + usize::from(uframes) + 2 * py.min(MAX_PY_DEPTH);
    if usize::from(kframes) > MAX_STACK_DEPTH
        || usize::from(uframes) > MAX_STACK_DEPTH
        || py > MAX_PY_DEPTH
        || frames.len() < n * 8
    {
        return Err(ParseError::Frames {
            kframes,
            uframes,
            len: b.len(),
        });
    }
    let mut comm = [0u8; COMM_LEN];
    comm.copy_from_slice(&b[OFF_COMM..OFF_COMM + COMM_LEN]);
    let mut pcomm = [0u8; COMM_LEN];
    pcomm.copy_from_slice(&b[OFF_PCOMM..OFF_PCOMM + COMM_LEN]);
    Ok(Event {
        header: EventHeader {
            kind,
            pid: u32_at(b, OFF_PID),
            tid: u32_at(b, OFF_TID),
            cpu: u32_at(b, OFF_CPU),
            start_time: u64_at(b, OFF_START_TIME),
            ktime: u64_at(b, OFF_KTIME),
            comm,
            pcomm,
            kframes,
            uframes,
            kerr: u16_at(b, OFF_KERR) as i16,
            uerr: u16_at(b, OFF_UERR) as i16,
            flags: u32_at(b, OFF_FLAGS),
            pyframes,
            value: u64_at(b, OFF_VALUE),
        },
        frames: &frames[..n * 8],
    })
}

/// Encodes a record the way the BPF program does; for tests and fakes.
pub fn encode_event(h: &EventHeader, kernel: &[u64], user: &[u64]) -> Vec<u8> {
    encode_event_py(h, kernel, user, &[])
}

/// [`encode_event`] with Python frames (code, instruction) after the user
/// frames.
pub fn encode_event_py(
    h: &EventHeader,
    kernel: &[u64],
    user: &[u64],
    py: &[(u64, u64)],
) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_SIZE];
    let kind: u32 = match h.kind {
        EventKind::Sample => 1,
        EventKind::Exec => 2,
        EventKind::OffCpu => 3,
    };
    b[OFF_KIND..OFF_KIND + 4].copy_from_slice(&kind.to_ne_bytes());
    b[OFF_PID..OFF_PID + 4].copy_from_slice(&h.pid.to_ne_bytes());
    b[OFF_TID..OFF_TID + 4].copy_from_slice(&h.tid.to_ne_bytes());
    b[OFF_CPU..OFF_CPU + 4].copy_from_slice(&h.cpu.to_ne_bytes());
    b[OFF_START_TIME..OFF_START_TIME + 8].copy_from_slice(&h.start_time.to_ne_bytes());
    b[OFF_KTIME..OFF_KTIME + 8].copy_from_slice(&h.ktime.to_ne_bytes());
    b[OFF_COMM..OFF_COMM + COMM_LEN].copy_from_slice(&h.comm);
    b[OFF_PCOMM..OFF_PCOMM + COMM_LEN].copy_from_slice(&h.pcomm);
    let kf = kernel.len().min(MAX_STACK_DEPTH) as u16;
    let uf = user.len().min(MAX_STACK_DEPTH) as u16;
    b[OFF_KFRAMES..OFF_KFRAMES + 2].copy_from_slice(&kf.to_ne_bytes());
    b[OFF_UFRAMES..OFF_UFRAMES + 2].copy_from_slice(&uf.to_ne_bytes());
    b[OFF_KERR..OFF_KERR + 2].copy_from_slice(&h.kerr.to_ne_bytes());
    b[OFF_UERR..OFF_UERR + 2].copy_from_slice(&h.uerr.to_ne_bytes());
    b[OFF_FLAGS..OFF_FLAGS + 4].copy_from_slice(&h.flags.to_ne_bytes());
    let py = &py[..py.len().min(MAX_PY_DEPTH)];
    b[OFF_PYFRAMES..OFF_PYFRAMES + 4].copy_from_slice(&(py.len() as u32).to_ne_bytes());
    b[OFF_VALUE..OFF_VALUE + 8].copy_from_slice(&h.value.to_ne_bytes());
    for a in kernel
        .iter()
        .take(kf.into())
        .chain(user.iter().take(uf.into()))
    {
        b.extend_from_slice(&a.to_ne_bytes());
    }
    for (code, instr) in py {
        b.extend_from_slice(&code.to_ne_bytes());
        b.extend_from_slice(&instr.to_ne_bytes());
    }
    b
}

/// Where the CFA (the caller's stack pointer) is, for one row of an unwind
/// table (`enum cfa_type` in `profiler.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum CfaType {
    /// No CFI covers the address: the stack is truncated there.
    None = 0,
    /// rsp + offset.
    Rsp = 1,
    /// rbp + offset.
    Rbp = 2,
    /// A PLT entry: rsp + 8, + 8 more when `(rip & 15) >= offset`.
    Plt = 3,
    /// The return address is undefined: the outermost frame.
    End = 4,
    /// A rule the BPF unwinder cannot follow (a DWARF expression).
    Unsupported = 5,
}

/// Where the caller's rbp is (`enum rbp_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum RbpType {
    /// Unchanged.
    Same = 0,
    /// Saved at CFA + offset.
    Offset = 1,
    /// Not recoverable.
    Lost = 2,
}

/// One row of an unwind table (`struct unwind_row`): from `pc` (an ELF
/// virtual address) up to the next row's `pc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct UnwindRow {
    pub pc: u32,
    pub cfa_off: i16,
    pub rbp_off: i16,
    pub cfa_type: u8,
    pub rbp_type: u8,
    pub reserved: u16,
}
const _: () = assert!(std::mem::size_of::<UnwindRow>() == 12);

/// Where a CPython process's frames are (`struct py_proc`): the address
/// of the GIL holder's thread state pointer and the field offsets of its
/// version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct PyProc {
    pub tstate_addr: u64,
    pub tstate_tid: u32,
    pub tstate_cframe: u32,
    pub cframe_current: u32,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_prev_instr: u32,
    pub frame_is_entry: u32,
    pub reserved: u32,
}
const _: () = assert!(std::mem::size_of::<PyProc>() == 40);

/// Mappings per process the BPF unwinder searches (`UNWIND_MAX_MAPPINGS`).
pub const UNWIND_MAX_MAPPINGS: usize = 256;

/// One mapping with an unwind table (`struct unwind_mapping`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct UnwindMapping {
    pub start: u64,
    pub end: u64,
    /// address − bias = the table's (ELF virtual) address.
    pub bias: u64,
    pub table_start: u32,
    pub table_len: u32,
}
const _: () = assert!(std::mem::size_of::<UnwindMapping>() == 32);

/// The mappings of one process that have unwind tables (`struct
/// unwind_proc`), sorted by start.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct UnwindProc {
    pub len: u32,
    pub reserved: u32,
    pub maps: [UnwindMapping; UNWIND_MAX_MAPPINGS],
}
const _: () = assert!(std::mem::size_of::<UnwindProc>() == 8 + 32 * UNWIND_MAX_MAPPINGS);

/// A comm field from a string, truncated to 15 bytes plus NUL.
pub fn comm_bytes(s: &str) -> [u8; COMM_LEN] {
    let mut c = [0u8; COMM_LEN];
    let n = s.len().min(COMM_LEN - 1);
    c[..n].copy_from_slice(&s.as_bytes()[..n]);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> EventHeader {
        EventHeader {
            kind: EventKind::Sample,
            pid: 42,
            tid: 43,
            cpu: 1,
            start_time: 7,
            ktime: 9,
            comm: comm_bytes("worker"),
            pcomm: comm_bytes("a-very-long-process-name"),
            kframes: 0,
            uframes: 0,
            kerr: 0,
            uerr: -14,
            flags: FLAG_USER_TRUNCATED,
            pyframes: 0,
            value: 12345,
        }
    }

    #[test]
    fn round_trip() {
        let b = encode_event(&header(), &[0xffff_ffff_8100_0000, 2], &[10, 20, 30]);
        assert_eq!(b.len(), HEADER_SIZE + 5 * 8);
        let e = parse_event(&b).unwrap();
        assert_eq!(e.header.pid, 42);
        assert_eq!(e.header.tid, 43);
        assert_eq!(e.header.uerr, -14);
        assert_eq!(e.header.flags, FLAG_USER_TRUNCATED);
        assert_eq!(e.header.value, 12345);
        assert_eq!(e.header.thread_name(), "worker");
        assert_eq!(e.header.process_name(), "a-very-long-pro");
        assert_eq!(
            e.kernel_frames().collect::<Vec<_>>(),
            vec![0xffff_ffff_8100_0000, 2]
        );
        assert_eq!(e.user_frames().collect::<Vec<_>>(), vec![10, 20, 30]);
        assert_eq!(e.python_frames().count(), 0);
        let b = encode_event_py(&header(), &[1], &[2, 3], &[(100, 201), (300, 400)]);
        let e = parse_event(&b).unwrap();
        assert_eq!(e.user_frames().collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(
            e.python_frames().collect::<Vec<_>>(),
            vec![(100, 201), (300, 400)]
        );
    }

    #[test]
    fn refuses_bad_records() {
        assert_eq!(
            parse_event(&[0; 10]).unwrap_err(),
            ParseError::Short { len: 10 }
        );
        let mut b = encode_event(&header(), &[], &[1]);
        b[0] = 9;
        assert_eq!(parse_event(&b).unwrap_err(), ParseError::Kind(9));
        let mut b = encode_event(&header(), &[1], &[2]);
        b.truncate(b.len() - 1);
        assert!(matches!(parse_event(&b), Err(ParseError::Frames { .. })));
        let mut b = encode_event(&header(), &[], &[]);
        b[OFF_UFRAMES..OFF_UFRAMES + 2].copy_from_slice(&500u16.to_ne_bytes());
        b.resize(HEADER_SIZE + 500 * 8, 0);
        assert!(matches!(parse_event(&b), Err(ParseError::Frames { .. })));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap fuzz: every prefix of a valid record and some noise.
        let b = encode_event(&header(), &[1, 2, 3], &[4, 5]);
        for n in 0..=b.len() {
            let _ = parse_event(&b[..n]);
        }
        let mut x: u32 = 1;
        for _ in 0..2000 {
            let mut v = Vec::new();
            for _ in 0..(x % 300) {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                v.push((x >> 16) as u8);
            }
            let _ = parse_event(&v);
        }
    }
}
