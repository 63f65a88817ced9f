//! Loading the BPF profiler and attaching it to every online CPU.
//!
//! The object is compiled by `build.rs` from `crates/agent-ebpf/src/bpf` and
//! embedded. Loading fails loudly: no kernel BTF, a verifier refusal (with the
//! verifier's log) or a perf_event_open refusal (with the errno and what it
//! usually means) is an error, never a silently idle agent.
#![allow(unsafe_code)] // getrlimit/setrlimit in raise_limits, and the ring buffer fd's registration in async_ring.

use std::collections::BTreeMap;
use std::io;

use aya::maps::Array;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{
    PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use aya::programs::{BtfTracePoint, PerfEvent, ProgramError, RawTracePoint};
use aya::{Btf, Ebpf, EbpfLoader};
use fathom_agent_ebpf as shared;

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler.bpf.o"));

/// Why the profiler could not be loaded or attached.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error(
        "kernel BTF is not available at /sys/kernel/btf/vmlinux (a kernel built with CONFIG_DEBUG_INFO_BTF=y is required for CO-RE)"
    )]
    Btf(#[source] aya::BtfError),
    #[error(
        "loading the BPF object failed (are you root, or do you have CAP_BPF and CAP_PERFMON?)"
    )]
    Load(#[source] aya::EbpfError),
    #[error("the BPF object has no program {0:?}")]
    MissingProgram(&'static str),
    #[error("the BPF object has no map {0:?}")]
    MissingMap(&'static str),
    #[error("BPF program {name} was refused")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("BPF map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error(
        "perf_event_open on CPU {cpu} failed (needs root or CAP_PERFMON; kernel.perf_event_paranoid may forbid it)"
    )]
    Attach {
        cpu: u32,
        #[source]
        source: ProgramError,
    },
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("reading the online CPUs from {what}")]
    OnlineCpus {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Load-time settings.
#[derive(Clone, Debug)]
pub(crate) struct BpfConfig {
    /// Samples per second per CPU.
    pub(crate) sampling_hz: u64,
    /// A process not to sample (the agent itself, when excluded).
    pub(crate) exclude_pid: Option<u32>,
    /// Bytes of kernel memory for unwind tables; 0: frame pointers only.
    pub(crate) unwind_budget: u64,
    /// Shortest off-CPU time recorded, ns; 0: no off-CPU profiling.
    pub(crate) offcpu_min_ns: u64,
}

impl BpfConfig {
    /// CPU sampling at `hz`, unwind tables with the default budget, no
    /// off-CPU profiling.
    #[cfg(test)]
    pub(crate) fn cpu(hz: u64) -> Self {
        BpfConfig {
            sampling_hz: hz,
            exclude_pid: None,
            unwind_budget: crate::unwind::DEFAULT_BUDGET,
            offcpu_min_ns: 0,
        }
    }
}

/// The loaded profiler: the ring buffer to drain, and the rest.
pub(crate) struct Profiler {
    pub(crate) ring: RingBuf<MapData>,
    pub(crate) control: Control,
    /// The unwind table and Python maps (taken by the collector).
    pub(crate) unwinder: Option<crate::unwind::Unwinder>,
}

/// The programs, their per-CPU links and the maps other than the ring.
pub(crate) struct Control {
    ebpf: Ebpf,
    counters: PerCpuArray<MapData, u64>,
    skip: BpfHashMap<MapData, u32, u64>,
    links: BTreeMap<u32, PerfEventLinkId>,
    period_ns: u64,
}

/// Ring buffer size: room for ~2 s of samples at an average half-full record,
/// at least 256 KiB, a power of two as the kernel requires.
pub(crate) fn ring_size(cpus: usize, hz: u64) -> u32 {
    let per_sec = cpus as u64 * hz * (shared::MAX_EVENT_SIZE as u64 / 2);
    let want = (per_sec * 2).clamp(256 << 10, 256 << 20);
    u32::try_from(want.next_power_of_two()).unwrap_or(256 << 20)
}

impl Profiler {
    /// Loads the object, attaches the exec tracepoint and one CPU-clock perf
    /// event per online CPU.
    pub(crate) fn load(cfg: &BpfConfig) -> Result<Self, BpfError> {
        raise_limits();
        let btf = Btf::from_sys_fs().map_err(BpfError::Btf)?;
        let cpus = online_cpus()?;
        let hz = cfg.sampling_hz.clamp(1, 10_000);
        let ring = ring_size(cpus.len().max(1), hz);
        let exclude: u32 = cfg.exclude_pid.unwrap_or(0);
        let wakeup: u64 = u64::from(ring / 4);
        let rows = u32::try_from(cfg.unwind_budget / crate::unwind::ROW_BYTES)
            .unwrap_or(u32::MAX)
            .clamp(1, 1 << 24);
        let offcpu_min_ns = cfg.offcpu_min_ns;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .override_global(shared::GLOBAL_EXCLUDE_TGID, &exclude, true)
            .override_global(shared::GLOBAL_WAKEUP_BYTES, &wakeup, true)
            .override_global(shared::GLOBAL_OFFCPU_MIN_NS, &offcpu_min_ns, true)
            .map_max_entries(shared::MAP_EVENTS, ring)
            .map_max_entries(shared::MAP_UNWIND_ROWS, rows)
            .load(OBJECT)
            .map_err(BpfError::Load)?;

        let exec: &mut RawTracePoint = ebpf
            .program_mut(shared::PROGRAM_EXEC)
            .ok_or(BpfError::MissingProgram(shared::PROGRAM_EXEC))?
            .try_into()
            .map_err(|source| BpfError::Program {
                name: shared::PROGRAM_EXEC,
                source,
            })?;
        exec.load().map_err(|source| BpfError::Program {
            name: shared::PROGRAM_EXEC,
            source,
        })?;
        exec.attach(shared::EXEC_TRACEPOINT)
            .map_err(|source| BpfError::Program {
                name: shared::PROGRAM_EXEC,
                source,
            })?;

        let sample: &mut PerfEvent = ebpf
            .program_mut(shared::PROGRAM_SAMPLE)
            .ok_or(BpfError::MissingProgram(shared::PROGRAM_SAMPLE))?
            .try_into()
            .map_err(|source| BpfError::Program {
                name: shared::PROGRAM_SAMPLE,
                source,
            })?;
        sample.load().map_err(|source| BpfError::Program {
            name: shared::PROGRAM_SAMPLE,
            source,
        })?;

        let ring = RingBuf::try_from(
            ebpf.take_map(shared::MAP_EVENTS)
                .ok_or(BpfError::MissingMap(shared::MAP_EVENTS))?,
        )
        .map_err(|source| BpfError::Map {
            name: shared::MAP_EVENTS,
            source,
        })?;
        let counters = PerCpuArray::try_from(
            ebpf.take_map(shared::MAP_COUNTERS)
                .ok_or(BpfError::MissingMap(shared::MAP_COUNTERS))?,
        )
        .map_err(|source| BpfError::Map {
            name: shared::MAP_COUNTERS,
            source,
        })?;
        let skip = BpfHashMap::try_from(
            ebpf.take_map(shared::MAP_SKIP)
                .ok_or(BpfError::MissingMap(shared::MAP_SKIP))?,
        )
        .map_err(|source| BpfError::Map {
            name: shared::MAP_SKIP,
            source,
        })?;

        let unwinder = {
            let rows_map = Array::try_from(
                ebpf.take_map(shared::MAP_UNWIND_ROWS)
                    .ok_or(BpfError::MissingMap(shared::MAP_UNWIND_ROWS))?,
            )
            .map_err(|source| BpfError::Map {
                name: shared::MAP_UNWIND_ROWS,
                source,
            })?;
            let procs = BpfHashMap::try_from(
                ebpf.take_map(shared::MAP_UNWIND_PROCS)
                    .ok_or(BpfError::MissingMap(shared::MAP_UNWIND_PROCS))?,
            )
            .map_err(|source| BpfError::Map {
                name: shared::MAP_UNWIND_PROCS,
                source,
            })?;
            let py = BpfHashMap::try_from(
                ebpf.take_map(shared::MAP_PY_PROCS)
                    .ok_or(BpfError::MissingMap(shared::MAP_PY_PROCS))?,
            )
            .map_err(|source| BpfError::Map {
                name: shared::MAP_PY_PROCS,
                source,
            })?;
            let capacity = if cfg.unwind_budget >= crate::unwind::ROW_BYTES {
                rows
            } else {
                0
            };
            Some(crate::unwind::Unwinder::new(rows_map, procs, py, capacity))
        };
        if offcpu_min_ns > 0 {
            attach_offcpu(&mut ebpf, &btf)?;
        }

        let mut control = Control {
            ebpf,
            counters,
            skip,
            links: BTreeMap::new(),
            period_ns: 1_000_000_000 / hz,
        };
        control.sync_cpus(&cpus)?;
        if control.links.is_empty() {
            return Err(BpfError::OnlineCpus {
                what: "/sys/devices/system/cpu/online",
                source: io::Error::other("no online CPU"),
            });
        }
        Ok(Profiler {
            ring,
            control,
            unwinder,
        })
    }
}

impl Control {
    /// The sampling period in nanoseconds (1e9 / hz).
    pub(crate) fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// CPUs with an attached sampler.
    pub(crate) fn attached_cpus(&self) -> Vec<u32> {
        self.links.keys().copied().collect()
    }

    /// Re-reads the online CPUs and attaches to new ones, detaching from CPUs
    /// that went away (a CPU that comes back gets a fresh event). Returns
    /// (attached, detached) CPU counts.
    pub(crate) fn refresh_cpus(&mut self) -> Result<(usize, usize), BpfError> {
        let cpus = online_cpus()?;
        self.sync_cpus(&cpus)
    }

    fn sync_cpus(&mut self, online: &[u32]) -> Result<(usize, usize), BpfError> {
        let (attach, detach) = cpu_diff(self.links.keys().copied(), online);
        let prog: &mut PerfEvent = self
            .ebpf
            .program_mut(shared::PROGRAM_SAMPLE)
            .ok_or(BpfError::MissingProgram(shared::PROGRAM_SAMPLE))?
            .try_into()
            .map_err(|source| BpfError::Program {
                name: shared::PROGRAM_SAMPLE,
                source,
            })?;
        for cpu in &detach {
            if let Some(id) = self.links.remove(cpu) {
                // The CPU is gone; its event may already be dead. Either way
                // the link is released.
                if let Err(error) = prog.detach(id) {
                    tracing::debug!(cpu, error = %crate::chain(&error), "detaching from offline cpu");
                }
            }
        }
        let mut attached = 0;
        for &cpu in &attach {
            match prog.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Period(self.period_ns),
                false,
            ) {
                Ok(id) => {
                    self.links.insert(cpu, id);
                    attached += 1;
                }
                // A CPU that went offline between reading the list and the
                // attach: skip it, the next refresh retries.
                Err(ProgramError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENODEV) =>
                {
                    tracing::debug!(cpu, "cpu went offline while attaching");
                }
                Err(source) => return Err(BpfError::Attach { cpu, source }),
            }
        }
        Ok((attached, detach.len()))
    }

    /// Sum over CPUs of every counter, in [`shared::Counter::ALL`] order.
    pub(crate) fn read_counters(&self) -> Result<[u64; shared::Counter::ALL.len()], BpfError> {
        let mut out = [0u64; shared::Counter::ALL.len()];
        for c in shared::Counter::ALL {
            let v = self
                .counters
                .get(&c.index(), 0)
                .map_err(|source| BpfError::Map {
                    name: shared::MAP_COUNTERS,
                    source,
                })?;
            out[c.index() as usize] = v.iter().copied().fold(0u64, u64::wrapping_add);
        }
        Ok(out)
    }

    /// Stops sampling `pid` (with this leader start time) in the kernel.
    pub(crate) fn skip_process(&mut self, pid: u32, start_time: u64) -> Result<(), BpfError> {
        self.skip
            .insert(pid, start_time, 0)
            .map_err(|source| BpfError::Map {
                name: shared::MAP_SKIP,
                source,
            })
    }

    /// Forgets a skipped process (it exited).
    pub(crate) fn unskip_process(&mut self, pid: u32) {
        // Missing keys are fine: exec already removed it.
        let _ = self.skip.remove(&pid);
    }
}

/// Attaches the two off-CPU programs: `sched_switch` (a task blocks in a
/// system call) and `sys_exit` (the call returns).
fn attach_offcpu(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), BpfError> {
    let out: &mut BtfTracePoint = ebpf
        .program_mut(shared::PROGRAM_SWITCH_OUT)
        .ok_or(BpfError::MissingProgram(shared::PROGRAM_SWITCH_OUT))?
        .try_into()
        .map_err(|source| BpfError::Program {
            name: shared::PROGRAM_SWITCH_OUT,
            source,
        })?;
    out.load(shared::SWITCH_TRACEPOINT, btf)
        .and_then(|()| out.attach().map(drop))
        .map_err(|source| BpfError::Program {
            name: shared::PROGRAM_SWITCH_OUT,
            source,
        })?;
    let inp: &mut RawTracePoint = ebpf
        .program_mut(shared::PROGRAM_SWITCH_IN)
        .ok_or(BpfError::MissingProgram(shared::PROGRAM_SWITCH_IN))?
        .try_into()
        .map_err(|source| BpfError::Program {
            name: shared::PROGRAM_SWITCH_IN,
            source,
        })?;
    inp.load()
        .and_then(|()| inp.attach(shared::SYS_EXIT_TRACEPOINT).map(drop))
        .map_err(|source| BpfError::Program {
            name: shared::PROGRAM_SWITCH_IN,
            source,
        })?;
    Ok(())
}

/// Registers the ring buffer's fd with the tokio reactor (must be called
/// inside a runtime).
pub(crate) fn async_ring(
    ring: RingBuf<MapData>,
) -> io::Result<tokio::io::unix::AsyncFd<RingBuf<MapData>>> {
    // SAFETY: RingBuf owns its map's fd: it stays open, refers to the same
    // ring buffer map, and `as_raw_fd` returns it unchanged for as long as the
    // RingBuf lives, which is the AsyncFd's lifetime (it owns the RingBuf).
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// CPUs to attach to and to detach from, given the attached and online sets.
pub(crate) fn cpu_diff(
    attached: impl Iterator<Item = u32>,
    online: &[u32],
) -> (Vec<u32>, Vec<u32>) {
    let attached: Vec<u32> = attached.collect();
    let attach = online
        .iter()
        .copied()
        .filter(|c| !attached.contains(c))
        .collect();
    let detach = attached
        .iter()
        .copied()
        .filter(|c| !online.contains(c))
        .collect();
    (attach, detach)
}

fn online_cpus() -> Result<Vec<u32>, BpfError> {
    aya::util::online_cpus().map_err(|(what, source)| BpfError::OnlineCpus { what, source })
}

/// BPF maps are charged against RLIMIT_MEMLOCK on kernels before 5.11 (memcg
/// accounting replaced it): raise it, harmless on newer kernels. And raise
/// the soft RLIMIT_NOFILE to the hard one: the symbolizer holds a handle to
/// each binary of another mount namespace (containers) until it is parsed.
fn raise_limits() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a fully initialized rlimit struct and has no
    // other memory effects.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        tracing::debug!(
            error = %io::Error::last_os_error(),
            "could not raise RLIMIT_MEMLOCK (fine on kernels >= 5.11)"
        );
    }
    let mut files = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut files) } == 0
        && files.rlim_cur < files.rlim_max
    {
        files.rlim_cur = files.rlim_max;
        // SAFETY: as above, setrlimit only reads the struct.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &files) } != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "could not raise RLIMIT_NOFILE");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_cpus() {
        let (a, d) = cpu_diff([0, 1, 2].into_iter(), &[0, 2, 3]);
        assert_eq!(a, vec![3]);
        assert_eq!(d, vec![1]);
        let (a, d) = cpu_diff(std::iter::empty(), &[0, 1]);
        assert_eq!(a, vec![0, 1]);
        assert!(d.is_empty());
    }

    #[test]
    fn ring_sizes() {
        assert_eq!(ring_size(2, 19), 256 << 10);
        let big = ring_size(256, 19);
        assert!(big.is_power_of_two());
        assert!(u64::from(big) >= 256 * 19 * (shared::MAX_EVENT_SIZE as u64 / 2));
        assert!(ring_size(100_000, 10_000) <= 256 << 20);
    }
}
