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
//! raw_tracepoint sched_process_exec ──► on_exec ────────┘
//!                                     └─► per-CPU `counters` (samples, idle, lost, stack errors)
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

/// Ring buffer of [`Event`]s.
pub const MAP_EVENTS: &str = "events";
/// Per-CPU `u64` counters indexed by [`Counter`].
pub const MAP_COUNTERS: &str = "counters";
/// `u32` tgid → `u64` leader start time: processes not to sample.
pub const MAP_SKIP: &str = "skip";

/// Load-time global: the tgid not to sample (0: none).
pub const GLOBAL_EXCLUDE_TGID: &str = "exclude_tgid";
/// Load-time global: wake the agent when this many bytes wait in the ring.
pub const GLOBAL_WAKEUP_BYTES: &str = "wakeup_bytes";

/// Deepest stack captured per half (kernel, user).
pub const MAX_STACK_DEPTH: usize = 127;
/// Size of [`EventHeader`] on the wire.
pub const HEADER_SIZE: usize = 72;
/// Largest record the program writes.
pub const MAX_EVENT_SIZE: usize = HEADER_SIZE + 2 * MAX_STACK_DEPTH * 8;
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
const _: () = assert!(OFF_UERR + 2 == HEADER_SIZE);
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
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; 8] = [
        Counter::Samples,
        Counter::Idle,
        Counter::Excluded,
        Counter::RingbufFull,
        Counter::KernelStackError,
        Counter::UserStackError,
        Counter::UserStackEmpty,
        Counter::ExecLost,
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
}

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
        words(&self.frames[k..])
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
        k => return Err(ParseError::Kind(k)),
    };
    let kframes = u16_at(b, OFF_KFRAMES);
    let uframes = u16_at(b, OFF_UFRAMES);
    let frames = &b[HEADER_SIZE..];
    let n = usize::from(kframes) + usize::from(uframes);
    if usize::from(kframes) > MAX_STACK_DEPTH
        || usize::from(uframes) > MAX_STACK_DEPTH
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
        },
        frames: &frames[..n * 8],
    })
}

/// Encodes a record the way the BPF program does; for tests and fakes.
pub fn encode_event(h: &EventHeader, kernel: &[u64], user: &[u64]) -> Vec<u8> {
    let mut b = vec![0u8; HEADER_SIZE];
    let kind: u32 = match h.kind {
        EventKind::Sample => 1,
        EventKind::Exec => 2,
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
    for a in kernel
        .iter()
        .take(kf.into())
        .chain(user.iter().take(uf.into()))
    {
        b.extend_from_slice(&a.to_ne_bytes());
    }
    b
}

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
        assert_eq!(e.header.thread_name(), "worker");
        assert_eq!(e.header.process_name(), "a-very-long-pro");
        assert_eq!(
            e.kernel_frames().collect::<Vec<_>>(),
            vec![0xffff_ffff_8100_0000, 2]
        );
        assert_eq!(e.user_frames().collect::<Vec<_>>(), vec![10, 20, 30]);
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
