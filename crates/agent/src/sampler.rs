//! The sampling thread: owns the BPF profiler and the collector, drains the
//! ring buffer, and hands one interval's profiles to the push queue.
//!
//! It runs on its own OS thread with a single-threaded runtime: symbolizing
//! and encoding are CPU work that must not stall the async runtime the agent
//! shares with other roles, and the symbolizer's caches need no locks when
//! one thread owns them.
//!
//! Wakeups: the ring buffer's fd becomes readable only when the BPF program
//! forces a wakeup (a new process, or the buffer a quarter full); otherwise
//! the thread drains every `DRAIN_EVERY`. It also re-checks the online CPUs
//! every `CPU_CHECK_EVERY` (hotplug) and copies the kernel counters into
//! metrics at each push.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::bpf::{BpfConfig, BpfError, Profiler};
use crate::collector::{Collector, CollectorConfig};
use crate::metrics::Metrics;
use crate::ship::Queue;
use fathom_agent_ebpf as shared;

const DRAIN_EVERY: Duration = Duration::from_secs(1);
const CPU_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Settings of the sampling thread.
#[derive(Clone, Debug)]
pub(crate) struct SamplerConfig {
    pub(crate) bpf: BpfConfig,
    pub(crate) collector: CollectorConfig,
    pub(crate) push_interval: Duration,
}

/// Starts the thread. Returns once the BPF program is loaded and attached (or
/// failed to), so that a failure is reported to the caller, not only logged.
pub(crate) fn start(
    cfg: SamplerConfig,
    queue: Queue,
    metrics: Arc<Metrics>,
    shutdown: watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<()>, BpfError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), BpfError>>();
    let handle = std::thread::Builder::new()
        .name("fathom-sampler".into())
        .spawn(move || {
            let profiler = match Profiler::load(&cfg.bpf) {
                Ok(p) => p,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(BpfError::Io {
                        what: "building the sampler runtime",
                        source: e,
                    }));
                    return;
                }
            };
            rt.block_on(run(cfg, profiler, queue, metrics, shutdown, ready_tx));
        })
        .map_err(|source| BpfError::Io {
            what: "spawning the sampler thread",
            source,
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => {
            let _ = handle.join();
            Err(BpfError::Io {
                what: "the sampler thread",
                source: std::io::Error::other("exited before reporting"),
            })
        }
    }
}

/// Counter values at the previous read, to turn totals into increments.
const COUNTERS: usize = shared::Counter::ALL.len();

struct KernelCounters {
    last: [u64; COUNTERS],
}

impl KernelCounters {
    fn publish(&mut self, now: [u64; COUNTERS], m: &Metrics) {
        use shared::Counter as C;
        let d = |c: C| now[c.index() as usize].saturating_sub(self.last[c.index() as usize]);
        m.bpf_events.inc_by(d(C::Samples));
        m.bpf_idle.inc_by(d(C::Idle));
        m.bpf_excluded.inc_by(d(C::Excluded));
        m.lost("ringbuf_full").inc_by(d(C::RingbufFull));
        m.stack_error("kernel", "capture_failed")
            .inc_by(d(C::KernelStackError));
        m.stack_error("user", "capture_failed")
            .inc_by(d(C::UserStackError));
        m.stack_error("user", "empty").inc_by(d(C::UserStackEmpty));
        m.exec_events_lost.inc_by(d(C::ExecLost));
        m.user_stacks_tables.inc_by(d(C::UserStackTables));
        m.user_stacks_truncated.inc_by(d(C::UserStackTruncated));
        m.offcpu_events.inc_by(d(C::OffCpu));
        m.lost("offcpu_ringbuf_full").inc_by(d(C::OffCpuLost));
        if d(C::RingbufFull) > 0 {
            tracing::warn!(lost = d(C::RingbufFull), "samples lost: ring buffer full");
        }
        self.last = now;
    }
}

async fn run(
    cfg: SamplerConfig,
    profiler: Profiler,
    queue: Queue,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<Result<(), BpfError>>,
) {
    let Profiler {
        ring,
        mut control,
        unwinder,
    } = profiler;
    let mut ring = match crate::bpf::async_ring(ring) {
        Ok(r) => r,
        Err(source) => {
            let _ = ready.send(Err(BpfError::Io {
                what: "registering the ring buffer with the reactor",
                source,
            }));
            return;
        }
    };
    metrics
        .attached_cpus
        .set(control.attached_cpus().len() as i64);
    tracing::info!(
        cpus = ?control.attached_cpus(),
        hz = cfg.bpf.sampling_hz,
        period_ns = control.period_ns(),
        "cpu profiler attached"
    );
    let _ = ready.send(Ok(()));

    let kallsyms = crate::symbolize::Symbolizer::read_kallsyms();
    if kallsyms.is_empty() {
        tracing::warn!(
            "no kernel symbols (/proc/kallsyms hidden?); kernel frames stay unsymbolized"
        );
    }
    let mut collector = Collector::new(cfg.collector.clone(), kallsyms, metrics.clone());
    if let Some(u) = unwinder {
        collector.set_unwinder(u);
    }
    // Loading the program parsed the kernel's BTF (~20 MB, all freed now);
    // do not keep those pages as the floor the agent runs on.
    crate::mem::release_free_memory();
    let mut counters = KernelCounters {
        last: [0; COUNTERS],
    };
    let mut drain_tick = tokio::time::interval(DRAIN_EVERY);
    let mut cpu_tick = tokio::time::interval(CPU_CHECK_EVERY);
    let mut push_tick = tokio::time::interval_at(
        tokio::time::Instant::now() + cfg.push_interval,
        cfg.push_interval,
    );
    for t in [&mut drain_tick, &mut cpu_tick, &mut push_tick] {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }

    loop {
        tokio::select! {
            guard = ring.readable_mut() => {
                match guard {
                    Ok(mut g) => {
                        drain(g.get_inner_mut(), &mut collector, &metrics);
                        g.clear_ready();
                    }
                    Err(error) => {
                        tracing::error!(%error, "ring buffer poll failed; draining on the timer only");
                        tokio::time::sleep(DRAIN_EVERY).await;
                    }
                }
                apply_skips(&mut collector, &mut control);
            }
            _ = drain_tick.tick() => {
                drain(ring.get_mut(), &mut collector, &metrics);
                apply_skips(&mut collector, &mut control);
            }
            _ = cpu_tick.tick() => {
                match control.refresh_cpus() {
                    Ok((0, 0)) => {}
                    Ok((attached, detached)) => {
                        tracing::info!(attached, detached, cpus = ?control.attached_cpus(), "cpu hotplug");
                        metrics.attached_cpus.set(control.attached_cpus().len() as i64);
                    }
                    Err(error) => tracing::warn!(error = %crate::chain(&error), "re-attaching to online cpus"),
                }
            }
            _ = push_tick.tick() => {
                drain(ring.get_mut(), &mut collector, &metrics);
                flush(&mut collector, &mut control, &queue, &metrics, &mut counters);
            }
            _ = shutdown.changed() => {
                if *shutdown.borrow() {
                    break;
                }
            }
        }
    }
    // Last interval, so that a short run loses nothing.
    drain(ring.get_mut(), &mut collector, &metrics);
    flush(
        &mut collector,
        &mut control,
        &queue,
        &metrics,
        &mut counters,
    );
    tracing::info!("cpu profiler stopped");
}

fn drain(ring: &mut aya::maps::RingBuf<aya::maps::MapData>, c: &mut Collector, m: &Metrics) {
    while let Some(item) = ring.next() {
        match shared::parse_event(&item) {
            Ok(ev) => c.on_event(&ev),
            Err(error) => {
                m.lost("parse_error").inc();
                tracing::debug!(%error, "bad ring buffer record");
            }
        }
    }
}

fn apply_skips(c: &mut Collector, control: &mut crate::bpf::Control) {
    for s in c.take_new_skips() {
        if let Err(error) = control.skip_process(s.pid, s.start_time) {
            tracing::debug!(pid = s.pid, error = %crate::chain(&error), "adding to the kernel skip map");
        }
    }
    for pid in c.take_expired_skips() {
        control.unskip_process(pid);
    }
}

fn flush(
    c: &mut Collector,
    control: &mut crate::bpf::Control,
    queue: &Queue,
    m: &Metrics,
    counters: &mut KernelCounters,
) {
    let t0 = Instant::now();
    let profiles = c.take_profiles();
    // Symbolizing and encoding an interval allocate and free a few MB;
    // hand the freed pages back rather than keep them as the new floor.
    crate::mem::release_free_memory();
    m.collect_seconds.observe(t0.elapsed().as_secs_f64());
    tracing::debug!(profiles = profiles.len(), took = ?t0.elapsed(), "interval collected");
    queue.push_profiles(profiles);
    apply_skips(c, control);
    match control.read_counters() {
        Ok(now) => counters.publish(now, m),
        Err(error) => tracing::warn!(error = %crate::chain(&error), "reading kernel counters"),
    }
}
