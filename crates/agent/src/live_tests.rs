//! Tests against the real kernel: they load the BPF program and sample this
//! very test process. They need root (or CAP_BPF + CAP_PERFMON) and a kernel
//! with BTF, and fail with the loader's reason when those are missing: a CI
//! that cannot load BPF must not pass quietly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fathom_agent_ebpf::{Counter, EventKind, parse_event};
use prometheus_client::registry::Registry;

use crate::bpf::{BpfConfig, Profiler};
use crate::collector::{Collector, CollectorConfig};
use crate::metrics::Metrics;
use crate::pprof::{decode, tests::folded};
use crate::relabel::Relabeler;
use crate::symbolize::Symbolizer;

/// The tests that count samples of a workload run one at a time: on a
/// 2-core machine, parallel CPU-bound workloads starve each other (other
/// CPU-heavy tests take it too).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn load(hz: u64, exclude_pid: Option<u32>) -> Profiler {
    match Profiler::load(&BpfConfig {
        exclude_pid,
        ..BpfConfig::cpu(hz)
    }) {
        Ok(p) => p,
        Err(e) => panic!(
            "cannot load the BPF profiler (these tests need root and a kernel with BTF): {e}\n{e:?}"
        ),
    }
}

/// The CPU time (user and system) the calling thread has had, in seconds.
/// The spinners below run for an amount of CPU time, not of wall time: a
/// profiler samples a thread in proportion to the CPU it gets, so counting
/// CPU time gives the same number of samples on an idle and on a loaded
/// machine (where it only takes longer).
#[allow(unsafe_code)] // clock_gettime into a timespec owned here.
pub(crate) fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Spins until this thread has had `cpu_secs` of CPU time or `stop` is set.
#[inline(never)]
fn spin_in_known_function(cpu_secs: f64, stop: &AtomicBool) -> u64 {
    let mut x = 1u64;
    while !stop.load(Ordering::Relaxed) && thread_cpu_secs() < cpu_secs {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    x
}

/// Writes to /dev/null until this thread has had `cpu_secs` of CPU time
/// (mostly in the kernel) or `stop` is set.
#[inline(never)]
fn syscall_heavy(cpu_secs: f64, stop: &AtomicBool) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap();
    while !stop.load(Ordering::Relaxed) && thread_cpu_secs() < cpu_secs {
        for _ in 0..1000 {
            let _ = f.write(&[0u8; 64]);
        }
    }
}

#[test]
fn bpf_samples_this_process_with_user_and_kernel_stacks() {
    let _serial = serial();
    let mut p = load(499, None);
    assert!(!p.control.attached_cpus().is_empty());
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = [0, 1]
        .into_iter()
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                if i == 0 {
                    spin_in_known_function(1.5, &stop);
                } else {
                    syscall_heavy(1.5, &stop);
                }
            })
        })
        .collect();
    // A short-lived child, for the exec notification.
    let child = std::process::Command::new("/bin/true").spawn().unwrap();
    let child_pid = child.id();

    let mut reg = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut reg));
    let mut c = Collector::new(
        CollectorConfig {
            node: "test".into(),
            period_ns: 1_000_000_000 / 499,
            relabeler: Relabeler::default(),
            dwarf_max_file_size: crate::symbolize::DEFAULT_DWARF_MAX,
        },
        Symbolizer::read_kallsyms(),
        metrics.clone(),
    );
    let me = std::process::id();
    let mut mine = 0;
    let mut exec_seen = false;
    // Until both threads have had their CPU time (1.5 s each: about 1,500
    // samples at 499 Hz), however long a loaded machine takes to give it.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut drained_after_done = false;
    while !drained_after_done {
        assert!(
            Instant::now() < deadline,
            "the spinning threads did not get 1.5 s of CPU each in 120 s"
        );
        drained_after_done = threads.iter().all(|t| t.is_finished());
        if drained_after_done {
            // What the kernel still holds for them.
            std::thread::sleep(Duration::from_millis(100));
        }
        while let Some(item) = p.ring.next() {
            let ev = parse_event(&item).expect("records from the kernel parse");
            if ev.header.kind == EventKind::Exec && ev.header.pid == child_pid {
                exec_seen = true;
            }
            if ev.header.pid == me && ev.header.kind == EventKind::Sample {
                mine += 1;
                assert_ne!(ev.header.start_time, 0);
            }
            c.on_event(&ev);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let _ = child.wait_with_output();
    assert!(
        mine > 100,
        "only {mine} samples of this process at 499 Hz over 3 s of its CPU time"
    );
    assert!(
        exec_seen,
        "no exec notification for /bin/true (pid {child_pid})"
    );

    let counters = p.control.read_counters().unwrap();
    assert!(counters[Counter::Samples.index() as usize] >= mine);
    assert_eq!(
        counters[Counter::RingbufFull.index() as usize],
        0,
        "ring buffer overflowed"
    );

    let profiles = c.take_profiles();
    let ours = profiles
        .iter()
        .find(|r| {
            r.labels
                .iter()
                .any(|l| l.name == "pid" && l.value == me.to_string())
        })
        .expect("a profile for this process");
    let prof = decode(&ours.pprof, 1 << 26).unwrap();
    let stacks = folded(&prof);
    let total: i64 = stacks.iter().map(|(_, n)| n).sum();
    let spin: i64 = stacks
        .iter()
        .filter(|(s, _)| s.contains("spin_in_known_function"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        spin * 4 > total,
        "spin function has {spin} of {total} samples: {stacks:#?}"
    );
    // Its caller chain is there, root first: the thread's closure calls it.
    assert!(
        stacks.iter().any(|(s, _)| s
            .contains("bpf_samples_this_process_with_user_and_kernel_stacks")
            && s.ends_with("spin_in_known_function")),
        "no stack with the test as caller: {stacks:#?}"
    );
    // The syscall thread shows kernel frames on top of its user frames.
    let kernel_names = ["write", "sys_", "entry_SYSCALL", "do_syscall"];
    assert!(
        stacks.iter().any(|(s, _)| s.contains("syscall_heavy")
            && kernel_names.iter().any(|k| s
                .rsplit(';')
                .next()
                .is_some_and(|leaf| leaf.contains(k))
                || s.contains(k))),
        "no kernel frames above syscall_heavy: {stacks:#?}"
    );
}

#[test]
fn bpf_excludes_a_process_in_the_kernel() {
    let _serial = serial();
    let me = std::process::id();
    let mut p = load(499, Some(me));
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    // 1 s of CPU: ~500 chances to be sampled, each one refused.
    let t = std::thread::spawn(move || spin_in_known_function(1.0, &s2));
    t.join().unwrap();
    let mut mine = 0;
    while let Some(item) = p.ring.next() {
        let ev = parse_event(&item).unwrap();
        if ev.header.pid == me && ev.header.kind == EventKind::Sample {
            mine += 1;
        }
    }
    assert_eq!(mine, 0, "excluded process was sampled");
    let counters = p.control.read_counters().unwrap();
    assert!(counters[Counter::Excluded.index() as usize] > 0);
}

#[test]
fn cpu_set_can_be_refreshed() {
    // Not while the hotplug test takes a CPU offline.
    let _serial = serial();
    let mut p = load(19, None);
    let before = p.control.attached_cpus();
    // No hotplug happened: nothing changes, nothing fails.
    assert_eq!(p.control.refresh_cpus().unwrap(), (0, 0));
    assert_eq!(p.control.attached_cpus(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole tests across the test threads; it is
// meant to be held for the test, awaits included.
#[allow(clippy::await_holding_lock)]
async fn run_pushes_cpu_profiles_to_a_push_service() {
    use crate::ship::tests::{Received, fake_server};
    let _serial = serial();
    let received = Received::default();
    let addr = fake_server(received.clone()).await;
    let args = crate::AgentArgs {
        remote: format!("http://{addr}"),
        tenant: Some("agent-test".into()),
        sampling_hz: 199,
        push_interval: Duration::from_secs(1),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        node: Some("node-a".into()),
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    let agent = tokio::spawn(crate::run(args, rx));
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    // 2 s of CPU (~400 samples at 199 Hz), two pushes or more.
    let spinner = std::thread::spawn(move || spin_in_known_function(2.0, &s2));
    let deadline = Instant::now() + Duration::from_secs(120);
    while !spinner.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the spinning thread did not get 2 s of CPU in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    spinner.join().unwrap();
    tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(60), agent)
        .await
        .expect("agent stops on shutdown")
        .unwrap()
        .expect("agent ran without error");

    let me = std::process::id().to_string();
    let reqs = received.requests.lock();
    assert!(!reqs.is_empty(), "nothing pushed");
    assert!(
        reqs.iter()
            .all(|(_, md)| md.get("x-scope-orgid").unwrap() == "agent-test")
    );
    let mut spin = 0;
    let mut total = 0;
    for (profiles, _) in reqs.iter() {
        for r in profiles {
            assert_eq!(r.profile_id.len(), 16);
            let get = |k: &str| {
                r.labels
                    .iter()
                    .find(|l| l.name == k)
                    .map(|l| l.value.as_str())
            };
            assert_eq!(get("__name__"), Some("process_cpu"));
            assert_eq!(get("node"), Some("node-a"));
            assert!(get("service_name").is_some() && get("comm").is_some());
            if get("pid") != Some(me.as_str()) {
                continue;
            }
            let p = decode(&r.pprof, 1 << 26).unwrap();
            for (s, n) in folded(&p) {
                total += n;
                if s.ends_with("spin_in_known_function") || s.contains(";spin_in_known_function;") {
                    spin += n;
                }
            }
        }
    }
    assert!(total > 0, "no profile of this process");
    assert!(
        spin > 0,
        "spin function not in this process's profiles ({total} samples)"
    );
}

/// Builds a workload from integration/agent into a temp dir.
fn build_workload(dir: &std::path::Path, what: &str) -> std::path::PathBuf {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/agent");
    let (out, status) = match what {
        "c" => {
            let out = dir.join("hotc");
            let s = std::process::Command::new("clang")
                .args([
                    "-O2",
                    "-g",
                    "-fno-omit-frame-pointer",
                    "-mno-omit-leaf-frame-pointer",
                    "-fno-optimize-sibling-calls",
                ])
                .arg(src.join("hot.c"))
                .arg("-o")
                .arg(&out)
                .status();
            (out, s)
        }
        "rust" => {
            let out = dir.join("hotrs");
            let s = std::process::Command::new("rustc")
                .args([
                    "-C",
                    "force-frame-pointers=yes",
                    "-C",
                    "opt-level=2",
                    "-g",
                    "--edition",
                    "2021",
                ])
                .arg(src.join("hot.rs"))
                .arg("-o")
                .arg(&out)
                .status();
            (out, s)
        }
        // The same without frame pointers, as most C and Rust is built.
        "nofp-c" => {
            let out = dir.join("nofpc");
            let s = std::process::Command::new("clang")
                .args(["-O2", "-g", "-fomit-frame-pointer"])
                .arg(src.join("nofp.c"))
                .arg("-o")
                .arg(&out)
                .status();
            (out, s)
        }
        "nofp-rust" => {
            let out = dir.join("nofprs");
            let s = std::process::Command::new("rustc")
                .args(["-C", "opt-level=2", "-g", "--edition", "2021"])
                .arg(src.join("nofp.rs"))
                .arg("-o")
                .arg(&out)
                .status();
            (out, s)
        }
        other => panic!("unknown workload {other}"),
    };
    assert!(status.unwrap().success(), "building the {what} workload");
    out
}

/// Folded stacks and the labels of one process's profile.
type ChildProfile = (Vec<(String, i64)>, Vec<(String, String)>);

/// One incarnation of a process (a pid between two execs): its `comm`,
/// its folded stacks and its profile's labels.
#[derive(Debug)]
struct Incarnation {
    comm: String,
    /// `__name__`: `process_cpu` or `off_cpu`.
    name: String,
    /// (function, file name) of every function in the profile.
    functions: Vec<(String, String)>,
    stacks: Vec<(String, i64)>,
    labels: Vec<(String, String)>,
}

/// Every incarnation of the child's pid that was sampled: the forked copy
/// of the test process before its exec may be sampled too (a 98 MB `node`
/// takes long enough to exec for a 199 Hz sample to land in `execve`).
#[derive(Debug)]
struct ChildProfiles(Vec<Incarnation>);

impl ChildProfiles {
    /// The incarnation whose `comm` is `comm` (the program the test ran),
    /// or an empty one when that program was never sampled.
    fn of(&self, comm: &str) -> ChildProfile {
        self.named(comm, crate::collector::PROFILE_NAME)
    }

    /// The off-CPU profile of the incarnation whose `comm` is `comm`.
    fn off_cpu_of(&self, comm: &str) -> ChildProfile {
        self.named(comm, crate::collector::OFF_CPU_PROFILE_NAME)
    }

    fn named(&self, comm: &str, name: &str) -> ChildProfile {
        match self.0.iter().find(|i| i.comm == comm && i.name == name) {
            Some(i) => (i.stacks.clone(), i.labels.clone()),
            None => {
                let seen: Vec<_> = self.0.iter().map(|i| i.comm.as_str()).collect();
                eprintln!("no profile with comm {comm:?}; the pid's profiles have {seen:?}");
                (Vec::new(), Vec::new())
            }
        }
    }
}

/// Samples the whole host at `hz` while `cmd` runs, and returns the
/// profiles of the child's pid, one per incarnation.
fn profile_child(cmd: std::process::Command, hz: u64) -> ChildProfiles {
    profile_child_with(cmd, BpfConfig::cpu(hz))
}

/// [`profile_child`] with other BPF settings (off-CPU, unwind budget).
fn profile_child_with(mut cmd: std::process::Command, cfg: BpfConfig) -> ChildProfiles {
    let _serial = serial();
    let hz = cfg.sampling_hz;
    let mut p = match Profiler::load(&cfg) {
        Ok(p) => p,
        Err(e) => panic!(
            "cannot load the BPF profiler (these tests need root and a kernel with BTF): {e}\n{e:?}"
        ),
    };
    let mut reg = Registry::default();
    let mut c = Collector::new(
        CollectorConfig {
            node: "test".into(),
            period_ns: 1_000_000_000 / hz,
            relabeler: Relabeler::default(),
            dwarf_max_file_size: crate::symbolize::DEFAULT_DWARF_MAX,
        },
        Symbolizer::read_kallsyms(),
        Arc::new(Metrics::new(&mut reg)),
    );
    if let Some(u) = p.unwinder.take() {
        c.set_unwinder(u);
    }
    // Steady state first: the processes already running are discovered in
    // the first drains, as an agent that has been up for a while has.
    let warm = Instant::now() + Duration::from_millis(600);
    while Instant::now() < warm {
        while let Some(item) = p.ring.next() {
            c.on_event(&parse_event(&item).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().to_string();
    loop {
        while let Some(item) = p.ring.next() {
            c.on_event(&parse_event(&item).unwrap());
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Whatever the kernel still holds for it.
    std::thread::sleep(Duration::from_millis(100));
    if std::env::var_os("FATHOM_DEBUG_UNWIND").is_some() {
        eprintln!("{:?}", c.debug_unwind(child.id()));
    }
    while let Some(item) = p.ring.next() {
        c.on_event(&parse_event(&item).unwrap());
    }
    let incarnations = c
        .take_profiles()
        .iter()
        .filter(|r| r.labels.iter().any(|l| l.name == "pid" && l.value == pid))
        .map(|r| {
            let labels: Vec<(String, String)> = r
                .labels
                .iter()
                .map(|l| (l.name.clone(), l.value.clone()))
                .collect();
            let get = |name: &str| {
                labels
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            let p = decode(&r.pprof, 1 << 26).unwrap();
            let functions = p
                .function
                .iter()
                .map(|f| {
                    (
                        p.string_table[f.name as usize].clone(),
                        p.string_table[f.filename as usize].clone(),
                    )
                })
                .collect();
            Incarnation {
                comm: get("comm"),
                name: get("__name__"),
                functions,
                stacks: folded(&decode(&r.pprof, 1 << 26).unwrap()),
                labels,
            }
        })
        .collect();
    ChildProfiles(incarnations)
}

fn share(stacks: &[(String, i64)], pred: impl Fn(&str) -> bool) -> (i64, i64) {
    let total = stacks.iter().map(|(_, n)| n).sum();
    let hit = stacks.iter().filter(|(s, _)| pred(s)).map(|(_, n)| n).sum();
    (hit, total)
}

#[test]
fn c_workload_hot_function_with_callers_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload(dir.path(), "c");
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["cpu", "3"]);
    let (stacks, labels) = profile_child(cmd, 199).of("hotc");
    let (hot, total) = share(&stacks, |s| s.ends_with(";hot_function"));
    assert!(total > 150, "{total} samples: {stacks:#?}");
    assert!(
        hot * 100 >= total * 80,
        "hot_function {hot} of {total}: {stacks:#?}"
    );
    let (chain, _) = share(&stacks, |s| {
        s.contains("main;outer_caller;middle_caller;hot_function")
    });
    assert!(
        chain * 100 >= total * 80,
        "callers in order in {chain} of {total}: {stacks:#?}"
    );
    let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("comm"), Some("hotc"));
    assert_eq!(get("service_name"), Some("hotc"));
    assert_eq!(get("executable"), Some(bin.to_str().unwrap()));
}

#[test]
fn rust_workload_hot_function_with_callers_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload(dir.path(), "rust");
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("3");
    let (stacks, _) = profile_child(cmd, 199).of("hotrs");
    // rust_hot on the stack, called by rust_middle; frames inlined into it
    // (black_box, the range iterator) may follow.
    let (hot, total) = share(&stacks, |s| s.contains(";hot::rust_middle;hot::rust_hot"));
    assert!(total > 150, "{total} samples: {stacks:#?}");
    assert!(
        hot * 100 >= total * 80,
        "rust_hot {hot} of {total}: {stacks:#?}"
    );
    let (chain, _) = share(&stacks, |s| {
        s.contains("hot::main;hot::rust_outer;hot::rust_middle;hot::rust_hot")
    });
    assert!(
        chain * 100 >= total * 80,
        "callers in order in {chain} of {total}: {stacks:#?}"
    );
}

#[test]
fn syscall_workload_shows_kernel_frames() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload(dir.path(), "c");
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["syscall", "3"]);
    let (stacks, _) = profile_child(cmd, 199).of("hotc");
    // libc's write has no frame pointer, so its caller (syscall_loop) is
    // skipped by frame-pointer unwinding: main is the frame below it.
    let (kernel, total) = share(&stacks, |s| {
        s.contains("main;") && s.contains("entry_SYSCALL_64")
    });
    assert!(total > 100, "{total} samples: {stacks:#?}");
    assert!(
        kernel * 2 >= total,
        "kernel frames in {kernel} of {total}: {stacks:#?}"
    );
}

#[test]
fn short_lived_process_is_symbolized() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload(dir.path(), "c");
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["cpu", "0.3"]);
    // The collector only looks at the process after it exited.
    let (stacks, _) = profile_child(cmd, 199).of("hotc");
    let (hot, total) = share(&stacks, |s| s.ends_with(";hot_function"));
    assert!(total > 10, "{total} samples: {stacks:#?}");
    assert!(
        hot * 100 >= total * 70,
        "hot_function {hot} of {total}: {stacks:#?}"
    );
}

#[test]
fn exec_keeps_both_incarnations_of_a_pid() {
    let dir = tempfile::tempdir().unwrap();
    let hotc = build_workload(dir.path(), "c");
    // The same program under another name: its comm tells the incarnation
    // before the exec from the one after.
    let before = dir.path().join("hotpre");
    std::fs::copy(&hotc, &before).unwrap();
    let mut cmd = std::process::Command::new(&before);
    cmd.args(["exec", "1.5"]).arg(&hotc).args(["cpu", "1.5"]);
    let profiles = profile_child(cmd, 199);
    // 199 Hz for 1.5 s is about 300 samples each; a quarter of that is
    // what a loaded 2-core machine still gives.
    for comm in ["hotpre", "hotc"] {
        let (stacks, labels) = profiles.of(comm);
        let (hot, total) = share(&stacks, |s| s.ends_with(";hot_function"));
        assert!(total > 75, "{comm}: {total} samples: {profiles:#?}");
        assert!(
            hot * 100 >= total * 80,
            "{comm}: hot_function {hot} of {total}: {stacks:#?}"
        );
        let exe = labels
            .iter()
            .find(|(k, _)| k == "executable")
            .map(|(_, v)| v.as_str());
        let want = if comm == "hotc" { &hotc } else { &before };
        assert_eq!(exe, want.to_str(), "{comm}: {labels:?}");
    }
}

#[test]
fn c_without_frame_pointers_full_chain() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload(dir.path(), "nofp-c");
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["cpu", "3"]);
    let cfg = match std::env::var("FATHOM_DEBUG_BUDGET") {
        Ok(b) => BpfConfig {
            unwind_budget: b.parse().unwrap(),
            ..BpfConfig::cpu(199)
        },
        Err(_) => BpfConfig::cpu(199),
    };
    let (stacks, _) = profile_child_with(cmd, cfg).of("nofpc");
    let (leaf, total) = share(&stacks, |s| s.ends_with(";c_hot"));
    assert!(total > 150, "{total} samples: {stacks:#?}");
    assert!(
        leaf * 100 >= total * 80,
        "c_hot {leaf} of {total}: {stacks:#?}"
    );
    // The whole chain, in order, from libc's start code down to the leaf.
    let (chain, _) = share(&stacks, |s| {
        s.ends_with(";main;c_level1;c_level2;c_level3;c_level4;c_hot")
            && s.contains("__libc_start")
            && !s.contains("[truncated]")
    });
    assert!(
        chain * 100 >= leaf * 90,
        "full chain in {chain} of {leaf} samples of c_hot: {stacks:#?}"
    );
}

#[test]
fn rust_without_frame_pointers_full_chain() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload(dir.path(), "nofp-rust");
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("3");
    let (stacks, _) = profile_child(cmd, 199).of("nofprs");
    let (leaf, total) = share(&stacks, |s| s.contains(";nofp::rs_hot"));
    assert!(total > 150, "{total} samples: {stacks:#?}");
    assert!(
        leaf * 100 >= total * 80,
        "rs_hot {leaf} of {total}: {stacks:#?}"
    );
    // From _start (the outermost frame) through std's runtime to the leaf.
    let (chain, _) = share(&stacks, |s| {
        s.starts_with("_start;")
            && s.contains(
                ";nofp::main;nofp::rs_level1;nofp::rs_level2;nofp::rs_level3;nofp::rs_level4;nofp::rs_hot",
            )
            && !s.contains("[truncated]")
    });
    assert!(
        chain * 100 >= leaf * 90,
        "full chain in {chain} of {leaf} samples of rs_hot: {stacks:#?}"
    );
}

#[test]
fn hot_loop_in_libc_shows_the_callers_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload(dir.path(), "nofp-c");
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["memcpy", "3"]);
    let (stacks, _) = profile_child(cmd, 199).of("nofpc");
    // Debian's libc has no frame pointers; its memcpy is the leaf.
    let in_libc = |s: &str| {
        let leaf = s.rsplit(';').next().unwrap_or("");
        leaf.contains("memcpy") || leaf.contains("memmove")
    };
    let (leaf, total) = share(&stacks, in_libc);
    assert!(total > 150, "{total} samples: {stacks:#?}");
    assert!(
        leaf * 100 >= total * 50,
        "memcpy {leaf} of {total}: {stacks:#?}"
    );
    let (chain, _) = share(&stacks, |s| {
        in_libc(s) && s.contains(";main;copy_outer;copy_middle;copy_inner;")
    });
    assert!(
        chain * 100 >= leaf * 90,
        "callers above libc's memcpy in {chain} of {leaf}: {stacks:#?}"
    );
}

#[test]
fn off_cpu_time_under_the_blocking_call() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_workload(dir.path(), "nofp-c");
    let mut cmd = std::process::Command::new(&bin);
    // 50 sleeps of 20 ms.
    cmd.args(["sleep", "1"]);
    let cfg = BpfConfig {
        offcpu_min_ns: 1_000_000,
        ..BpfConfig::cpu(99)
    };
    let (stacks, labels) = profile_child_with(cmd, cfg).off_cpu_of("nofpc");
    let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("service_name"), Some("nofpc"));
    let (blocked, total) = share(&stacks, |s| {
        s.contains(";main;wait_outer;wait_middle;") && s.contains("nanosleep")
    });
    // Values are nanoseconds off CPU: about 1 s in all.
    assert!(total >= 800_000_000, "{total} ns off CPU: {stacks:#?}");
    assert!(
        blocked * 100 >= total * 90,
        "{blocked} of {total} ns under wait_middle's nanosleep: {stacks:#?}"
    );
}

/// Runs integration/agent/hot.py with `python` and checks its Python
/// frames: in order, with the script's file, under service_name = hot.py.
fn python_frames_in_order(python: &str) {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/agent/hot.py");
    let mut cmd = std::process::Command::new(python);
    cmd.arg(&script).arg("3");
    let profiles = profile_child(cmd, 199);
    // The interpreter's incarnation: exec names it after the file run. The
    // forked copy of the test process may be sampled before its exec and
    // discovered after it, with the script's service_name but the test
    // thread's comm (one sample in a page fault, seen in CI).
    let comm = std::path::Path::new(python)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(python);
    let inc = profiles
        .0
        .iter()
        .find(|i| {
            i.name == crate::collector::PROFILE_NAME
                && i.comm == comm
                && i.labels
                    .iter()
                    .any(|(k, v)| k == "service_name" && v == "hot.py")
        })
        .unwrap_or_else(|| {
            panic!("no profile with comm {comm} and service_name hot.py: {profiles:#?}")
        });
    let stacks = &inc.stacks;
    let (hot, total) = share(stacks, |s| s.contains(";py_hot"));
    assert!(total > 150, "{total} samples: {stacks:#?}");
    assert!(
        hot * 100 >= total * 80,
        "py_hot {hot} of {total}: {stacks:#?}"
    );
    // In order, the interpreter's own C frames between them replaced.
    let (chain, _) = share(stacks, |s| {
        s.contains("main;py_outer;py_middle;py_inner;py_hot")
    });
    assert!(
        chain * 100 >= hot * 90,
        "the Python chain in {chain} of {hot}: {stacks:#?}"
    );
    for f in ["py_hot", "py_inner", "py_middle", "py_outer", "main"] {
        assert!(
            inc.functions
                .iter()
                .any(|(n, file)| n == f && file.ends_with("integration/agent/hot.py")),
            "{f} with hot.py as its file: {:?}",
            inc.functions
        );
    }
    // Native frames of the interpreter stay below (toward the root).
    let (native, _) = share(stacks, |s| {
        s.contains("Py_RunMain") || s.contains("Py_BytesMain")
    });
    assert!(
        native * 2 >= hot,
        "interpreter frames below Python's in {native} of {hot}"
    );
}

/// Python frames on both sides of C ones: `py_sort` calls the builtin
/// `sorted`, which calls `py_key` back. Each `_PyEval_EvalFrameDefault`
/// is replaced by its own Python frames, so the C frames of the sort stay
/// between them.
#[test]
fn python_frames_interleave_with_c_frames() {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/agent/hot.py");
    let mut cmd = std::process::Command::new("/usr/bin/python3");
    cmd.arg(&script).args(["3", "sorted"]);
    let (stacks, _) = profile_child(cmd, 199).of("python3");
    let (key, total) = share(&stacks, |s| s.contains(";py_key"));
    assert!(total > 150, "{total} samples: {stacks:#?}");
    assert!(
        key * 100 >= total * 70,
        "py_key in {key} of {total}: {stacks:#?}"
    );
    // main;py_sort;<C frames of sorted and of the call>;py_key
    let interleaved = |s: &str| {
        let Some(a) = s.find("main;py_sort;") else {
            return false;
        };
        let Some(b) = s[a..].find(";py_key") else {
            return false;
        };
        let between = &s[a + "main;py_sort;".len()..a + b];
        // sorted's own functions are static, unnamed in Debian's stripped
        // python3.11 (0x…); the call back into Python is exported.
        between.split(';').count() >= 2
            && between.ends_with("_PyFunction_Vectorcall")
            && !between.split(';').any(|f| f.starts_with("py_"))
    };
    let (good, _) = share(&stacks, |s| interleaved(s));
    assert!(
        good * 100 >= key * 90,
        "main;py_sort;<C frames>;py_key in {good} of {key}: {stacks:#?}"
    );
}

#[test]
fn python_frames_debian_python3() {
    python_frames_in_order("/usr/bin/python3");
}

/// The other CPython 3.11 build of this machine: pyenv's (under
/// `$PYENV_ROOT`, default `~/.pyenv`).
#[test]
fn python_frames_pyenv_python3() {
    let root = std::env::var_os("PYENV_ROOT")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".pyenv")))
        .unwrap_or_else(|| "/root/.pyenv".into());
    let found = std::fs::read_dir(root.join("versions"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("3.11"))
        .map(|e| e.path().join("bin/python3.11"))
        .find(|p| p.exists());
    let Some(python) = found else {
        panic!(
            "this test runs a second CPython 3.11 build, from pyenv ({}/versions/3.11.*), and there is none",
            root.display()
        );
    };
    python_frames_in_order(python.to_str().unwrap());
}

#[test]
fn node_jit_frames_come_from_the_perf_map() {
    let Ok(out) = std::process::Command::new("node").arg("--version").output() else {
        panic!("node is required for the JIT perf map test (apt-get install nodejs)");
    };
    assert!(out.status.success());
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/agent/hot.js");
    // V8 writes isolate logs into its working directory.
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new("node");
    cmd.arg("--perf-basic-prof").arg(&script).arg("4");
    cmd.current_dir(dir.path());
    cmd.stdout(std::process::Stdio::null());
    let (stacks, labels) = profile_child(cmd, 199).of("node");
    if let Some((_, pid)) = labels.iter().find(|(k, _)| k == "pid") {
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    }
    let (js, total) = share(&stacks, |s| s.contains("hotJsFunction"));
    assert!(total > 100, "{total} samples: {stacks:#?}");
    assert!(
        js * 2 >= total,
        "hotJsFunction in {js} of {total}: {stacks:#?}"
    );
}

/// The CPU taken offline by the hotplug test.
const HOTPLUG_CPU: u32 = 1;

fn cpu_online_path(cpu: u32) -> String {
    format!("/sys/devices/system/cpu/cpu{cpu}/online")
}

/// Writes `0` or `1` to a CPU's `online` file; the error says why hotplug
/// is refused (no such file: not hotpluggable; EPERM, EBUSY, EINVAL…).
fn set_cpu_online(cpu: u32, online: bool) -> std::io::Result<()> {
    std::fs::write(cpu_online_path(cpu), if online { "1" } else { "0" })
}

/// Takes a CPU offline for its lifetime and brings it back online when
/// dropped, also when the test panics.
struct OfflineCpu(u32);

impl OfflineCpu {
    fn take(cpu: u32) -> OfflineCpu {
        let path = cpu_online_path(cpu);
        match std::fs::read_to_string(&path) {
            Ok(s) if s.trim() == "1" => {}
            Ok(s) => panic!("{path} reads {s:?}: cpu {cpu} must be online before the test"),
            Err(e) => panic!("cpu {cpu} is not hotpluggable on this machine ({path}: {e})"),
        }
        // The guard exists before the write, so that a write that took
        // effect and then reported an error is still undone.
        let guard = OfflineCpu(cpu);
        if let Err(e) = set_cpu_online(cpu, false) {
            panic!("the kernel refused to take cpu {cpu} offline (echo 0 > {path}): {e}");
        }
        guard
    }
}

impl Drop for OfflineCpu {
    fn drop(&mut self) {
        for _ in 0..50 {
            match set_cpu_online(self.0, true) {
                Ok(()) => return,
                Err(e) => {
                    eprintln!("bringing cpu {} back online: {e}; retrying", self.0);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        eprintln!(
            "CPU {} IS STILL OFFLINE: run `echo 1 > {}`",
            self.0,
            cpu_online_path(self.0)
        );
    }
}

/// Pins the calling thread to one CPU.
#[allow(unsafe_code)] // sched_setaffinity on a cpu_set_t built here.
fn pin_to_cpu(cpu: u32) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data, initialized by CPU_ZERO; the calls
    // only read and write it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu as usize, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[inline(never)]
#[allow(unsafe_code)] // sched_getcpu, which has no arguments.
fn spin_pinned_to_hotplugged_cpu(cpu_secs: f64, stop: &AtomicBool) -> (u64, bool) {
    let mut x = 1u64;
    let mut always_there = true;
    while !stop.load(Ordering::Relaxed) && thread_cpu_secs() < cpu_secs {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
        // SAFETY: no arguments, no memory.
        always_there &= unsafe { libc::sched_getcpu() } == HOTPLUG_CPU as i32;
    }
    (x, always_there)
}

/// The value of an unlabeled gauge in the agent's /metrics.
async fn gauge(http: &reqwest::Client, port: u16, name: &str) -> Option<i64> {
    let text = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits until the agent's attached-CPU gauge reads `want` (the sampler
/// re-reads the online CPUs every 5 s).
async fn wait_attached(http: &reqwest::Client, port: u16, want: i64, what: &str) {
    let t0 = Instant::now();
    let mut last = None;
    while t0.elapsed() < Duration::from_secs(30) {
        last = gauge(http, port, "fathom_agent_attached_cpus").await;
        if last == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what}: fathom_agent_attached_cpus is {last:?} after 30 s, want {want}");
}

/// Real CPU hotplug under the running agent: a CPU that goes offline is
/// detached, and when it comes back the agent attaches to it again and
/// samples a process pinned to it. Takes CPU 1 offline for a few seconds
/// (brought back by a drop guard, also on failure); fails with the kernel's
/// reason when the machine refuses hotplug.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The guard serializes whole tests across the test threads; it is
// meant to be held for the test, awaits included.
#[allow(clippy::await_holding_lock)]
async fn cpu_hotplug_detaches_and_reattaches() {
    use crate::ship::tests::{Received, fake_server};
    let _serial = serial();
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "the hotplug test needs cpu {HOTPLUG_CPU} and another one (online: {online:?})"
    );
    let received = Received::default();
    let addr = fake_server(received.clone()).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let args = crate::AgentArgs {
        remote: format!("http://{addr}"),
        sampling_hz: 199,
        push_interval: Duration::from_secs(1),
        metrics_listen: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        ..Default::default()
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    let agent = tokio::spawn(crate::run(args, rx));
    let http = reqwest::Client::new();
    let all = i64::try_from(cpus).unwrap();
    wait_attached(&http, port, all, "at start").await;

    {
        let _offline = OfflineCpu::take(HOTPLUG_CPU);
        wait_attached(&http, port, all - 1, "after cpu 1 went offline").await;
        // Dropping the guard brings it back.
    }
    assert_eq!(
        std::fs::read_to_string(cpu_online_path(HOTPLUG_CPU))
            .unwrap()
            .trim(),
        "1"
    );
    wait_attached(&http, port, all, "after cpu 1 came back").await;

    // A thread that can only run on the CPU that came back: its samples can
    // only come from the perf event attached to that CPU after it returned.
    let pushed_before = received.requests.lock().len();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let spinner = std::thread::spawn(move || {
        pin_to_cpu(HOTPLUG_CPU).expect("pinning a thread to the cpu that came back");
        spin_pinned_to_hotplugged_cpu(2.0, &s2)
    });
    // Until it has had 2 s of that CPU, however loaded the machine is.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !spinner.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the pinned thread did not get 2 s of cpu {HOTPLUG_CPU} in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (_, stayed) = spinner.join().unwrap();
    assert!(stayed, "the pinned thread ran on another cpu");
    tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(60), agent)
        .await
        .expect("agent stops on shutdown")
        .unwrap()
        .expect("agent ran without error");

    let me = std::process::id().to_string();
    let reqs = received.requests.lock();
    let mut pinned = 0;
    for (profiles, _) in reqs.iter().skip(pushed_before) {
        for r in profiles {
            if !r.labels.iter().any(|l| l.name == "pid" && l.value == me) {
                continue;
            }
            let p = decode(&r.pprof, 1 << 26).unwrap();
            pinned += folded(&p)
                .iter()
                .filter(|(s, _)| s.contains("spin_pinned_to_hotplugged_cpu"))
                .map(|(_, n)| n)
                .sum::<i64>();
        }
    }
    // 2 s of CPU at 199 Hz: ~400 samples.
    assert!(
        pinned > 50,
        "only {pinned} samples of the thread pinned to cpu {HOTPLUG_CPU} after it came back online"
    );
}
