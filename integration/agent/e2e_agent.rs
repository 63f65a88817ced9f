//! End-to-end tests of the agent: `fathom all` and `fathom agent` as real
//! processes, real workloads (C, Rust, Node, Go) built from
//! `integration/agent/`, results read back through the query API.
//!
//! Include from the e2e test binary with
//! `#[path = "../../agent/e2e_agent.rs"] mod agent;`.
//!
//! They need root (or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN for
//! /proc/<pid>/map_files), clang, rustc, node and golang-go. When the agent
//! cannot load its BPF program the tests fail with the agent's own error,
//! never pass quietly.
//!
//! The agent runs as `<target>/debug/fathom agent`; set FATHOM_AGENT_BIN to
//! a standalone binary that takes the same flags (e.g. the `agent` example
//! of fathom-agent) to test the agent before `fathom agent` exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fathom_integration::{Fathom, fathom_bin, free_port, workspace};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// A running agent, killed on drop.
pub(crate) struct Agent {
    pub(crate) child: Child,
    metrics_port: u16,
    log: PathBuf,
}

fn agent_command() -> Command {
    match std::env::var_os("FATHOM_AGENT_BIN") {
        Some(bin) => Command::new(bin),
        None => {
            let mut c = Command::new(fathom_bin());
            c.arg("agent");
            c
        }
    }
}

impl Agent {
    /// Starts the agent against `f` and waits until it is ready: its BPF
    /// program is loaded and attached, or it failed and the test fails with
    /// its log.
    pub(crate) fn start(f: &Fathom, dir: &Path, extra: &[&str]) -> Agent {
        let metrics_port = free_port();
        let log = dir.join(format!("agent-{metrics_port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = agent_command()
            .arg("--remote")
            .arg(f.url(""))
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("starting the agent (build fathom, or set FATHOM_AGENT_BIN)");
        let mut a = Agent {
            child,
            metrics_port,
            log,
        };
        let http = reqwest::blocking::Client::new();
        let t0 = Instant::now();
        loop {
            if let Some(status) = a.child.try_wait().unwrap() {
                panic!(
                    "the agent exited with {status} before it was ready:\n{}",
                    a.log()
                );
            }
            let ready = http
                .get(format!("http://127.0.0.1:{}/ready", a.metrics_port))
                .send()
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return a;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the agent is not ready after 60 s:\n{}",
                a.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A metric from the agent's /metrics (sum over label sets).
    fn metric(&self, name: &str) -> f64 {
        let text =
            reqwest::blocking::get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
                .and_then(|r| r.text())
                .unwrap_or_default();
        text.lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A workload process, killed on drop.
pub(crate) struct Workload(Child);

impl Workload {
    pub(crate) fn spawn(cmd: &mut Command) -> Workload {
        Workload(
            cmd.stdout(Stdio::null())
                .spawn()
                .expect("starting a workload"),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sources() -> PathBuf {
    workspace().join("integration/agent")
}

fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// hot.c with full frame pointers. clang, because GCC 12 drops the frame
/// pointer of leaf functions even with -mno-omit-leaf-frame-pointer.
fn build_c(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    run_ok(
        Command::new("clang")
            .args([
                "-O2",
                "-g",
                "-fno-omit-frame-pointer",
                "-mno-omit-leaf-frame-pointer",
                "-fno-optimize-sibling-calls",
            ])
            .arg(sources().join("hot.c"))
            .arg("-o")
            .arg(&out),
        "building hot.c",
    );
    out
}

fn build_rust(dir: &Path) -> PathBuf {
    let out = dir.join("hotrs");
    run_ok(
        Command::new("rustc")
            .args(["-C", "force-frame-pointers=yes", "-C", "opt-level=2", "-g"])
            .args(["--edition", "2021", "--crate-name", "hot"])
            .arg(sources().join("hot.rs"))
            .arg("-o")
            .arg(&out),
        "building hot.rs",
    );
    out
}

/// nofp.c and nofp.rs: no frame pointers, as most code is built.
fn build_nofp(dir: &Path) -> (PathBuf, PathBuf) {
    let c = dir.join("nofpc");
    run_ok(
        Command::new("clang")
            .args(["-O2", "-g", "-fomit-frame-pointer"])
            .arg(sources().join("nofp.c"))
            .arg("-o")
            .arg(&c),
        "building nofp.c",
    );
    let rs = dir.join("nofprs");
    run_ok(
        Command::new("rustc")
            .args(["-C", "opt-level=2", "-g", "--edition", "2021"])
            .arg(sources().join("nofp.rs"))
            .arg("-o")
            .arg(&rs),
        "building nofp.rs",
    );
    (c, rs)
}

/// Stack completeness from `perf script` output: of the samples whose
/// stack (leaf first) contains `leaf`, the share whose frames from the
/// leaf toward the root continue with `callers` in order.
fn perf_completeness(script: &str, leaf: &str, callers: &[&str]) -> (usize, usize) {
    let (mut hit, mut total) = (0, 0);
    for sample in script.split("\n\n") {
        let syms: Vec<&str> = sample
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1))
            .map(|s| s.split('+').next().unwrap_or(s))
            .collect();
        let Some(i) = syms.iter().position(|s| s.contains(leaf)) else {
            continue;
        };
        total += 1;
        let rest = &syms[i + 1..];
        if rest.len() >= callers.len() && rest.iter().zip(callers).all(|(s, c)| s.contains(c)) {
            hit += 1;
        }
    }
    (hit, total)
}

/// `perf record --call-graph dwarf` of `pid` for `secs` at 19 Hz: the
/// `perf script` text.
fn perf_dwarf(dir: &Path, pid: u32, secs: u64) -> String {
    let data = dir.join(format!("perf-{pid}.data"));
    let out = Command::new("perf")
        .args(["record", "-F", "19", "--call-graph", "dwarf", "-q", "-o"])
        .arg(&data)
        .args(["-p", &pid.to_string(), "--", "sleep", &secs.to_string()])
        .output()
        .expect("running perf (apt-get install linux-perf)");
    assert!(
        out.status.success(),
        "perf record: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = Command::new("perf")
        .args(["script", "-F", "comm,ip,sym", "-i"])
        .arg(&data)
        .output()
        .expect("running perf script");
    String::from_utf8_lossy(&script.stdout).into_owned()
}

fn build_go(dir: &Path) -> PathBuf {
    let out = dir.join("gosvc");
    let src = dir.join("gosvc-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::copy(sources().join("gosvc.go"), src.join("main.go")).unwrap();
    std::fs::write(src.join("go.mod"), "module gosvc\n\ngo 1.19\n").unwrap();
    run_ok(
        Command::new("go")
            .arg("build")
            .arg("-o")
            .arg(&out)
            .arg(".")
            .current_dir(&src)
            .env("GOCACHE", dir.join("gocache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GOPROXY", "off"),
        "building gosvc.go (apt-get install golang-go)",
    );
    out
}

/// The merged folded stacks (root first) of a selector over the last hour.
fn folded(f: &Fathom, selector: &str) -> BTreeMap<String, i64> {
    f.folded(None, selector, "now-1h", "now")
        .unwrap_or_default()
}

fn total(stacks: &BTreeMap<String, i64>) -> i64 {
    stacks.values().sum()
}

fn share(stacks: &BTreeMap<String, i64>, pred: impl Fn(&str) -> bool) -> i64 {
    stacks.iter().filter(|(s, _)| pred(s)).map(|(_, v)| v).sum()
}

/// How long a test waits for the agent's data to become queryable. Not a
/// latency target: the agent's first collection symbolizes every process
/// on the host, and on a CI machine running other tests (dozens of rustc
/// and debug `fathom` processes, hundreds of MB of DWARF each) that takes
/// tens of seconds. The end-to-end delay is measured, and printed, by
/// `agent_overhead_benchmark`, never asserted by a timed test.
const AGENT_WAIT: Duration = Duration::from_secs(180);

/// Polls `check` until it returns `Ok`, or fails with its last error.
pub(crate) fn eventually<T>(timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let t0 = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(e) if t0.elapsed() > timeout => panic!("not true after {timeout:?}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// The labels of the series matching `selector`.
fn series(f: &Fathom, selector: &str) -> Vec<BTreeMap<String, String>> {
    let v = f
        .get_json(
            None,
            "/api/v1/series",
            &[("query", selector), ("start", "now-1h"), ("end", "now")],
        )
        .unwrap_or(serde_json::Value::Null);
    v["series"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    s.as_object()
                        .map(|o| {
                            o.iter()
                                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The selector of one process incarnation: its pid and its `comm`, since
/// a sample of the forked parent before the exec has the same pid.
fn process(pid: u32, comm: &str) -> String {
    format!("{CPU}{{pid=\"{pid}\",comm=\"{comm}\"}}")
}

/// The hot function holds at least 80% of its process's CPU samples, with
/// its callers in order below it.
fn assert_hot(
    f: &Fathom,
    (pid, comm): (u32, &str),
    leaf: &str,
    chain: &str,
    within: Duration,
) -> BTreeMap<String, i64> {
    let sel = process(pid, comm);
    eventually(within, || {
        let s = folded(f, &sel);
        let t = total(&s);
        let hot = share(&s, |x| x.contains(leaf));
        let chained = share(&s, |x| x.contains(chain));
        if t > 0 && hot * 100 >= t * 80 && chained * 100 >= t * 80 {
            Ok(s)
        } else {
            Err(format!(
                "{leaf}: {hot} and chain {chain}: {chained} of {t} ns for pid {pid}: {s:#?}"
            ))
        }
    })
}

#[test]
fn agent_profiles_c_and_rust_hot_functions_with_callers_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let hotc = build_c(dir.path(), "hotc");
    let hotrs = build_rust(dir.path());
    let dropped = build_c(dir.path(), "hotdrop");
    let relabel = dir.path().join("relabel.yaml");
    std::fs::write(
        &relabel,
        r#"
relabel_configs:
  - source_labels: [comm]
    regex: hotdrop
    action: drop
  - source_labels: [comm]
    regex: "hot(c|rs)"
    target_label: team
    replacement: "e2e-$1"
"#,
    )
    .unwrap();
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let agent = Agent::start(
        &f,
        dir.path(),
        &[
            "--push-interval",
            "5s",
            "--node",
            "e2e-node",
            "--relabel-config",
            relabel.to_str().unwrap(),
        ],
    );
    let t0 = Instant::now();
    let c = Workload::spawn(Command::new(&hotc).args(["cpu", "60"]));
    let rs = Workload::spawn(Command::new(&hotrs).arg("60"));
    let d = Workload::spawn(Command::new(&dropped).args(["cpu", "60"]));

    // At 19 Hz, the default rate.
    let budget = AGENT_WAIT;
    assert_hot(
        &f,
        (c.pid(), "hotc"),
        ";hot_function",
        "main;outer_caller;middle_caller;hot_function",
        budget.saturating_sub(t0.elapsed()),
    );
    assert_hot(
        &f,
        (rs.pid(), "hotrs"),
        ";hot::rust_hot",
        "hot::main;hot::rust_outer;hot::rust_middle;hot::rust_hot",
        budget.saturating_sub(t0.elapsed()),
    );

    let labels = series(&f, &process(c.pid(), "hotc"));
    assert_eq!(labels.len(), 1, "{labels:?}");
    let l = &labels[0];
    assert_eq!(l.get("node").map(String::as_str), Some("e2e-node"));
    assert_eq!(l.get("pid"), Some(&c.pid().to_string()));
    assert_eq!(l.get("comm").map(String::as_str), Some("hotc"));
    assert_eq!(l.get("service_name").map(String::as_str), Some("hotc"));
    assert_eq!(l.get("executable").map(String::as_str), hotc.to_str());
    assert_eq!(l.get("team").map(String::as_str), Some("e2e-c"));

    // The dropped process is not there at all, and the kernel skipped it.
    assert!(series(&f, &process(d.pid(), "hotdrop")).is_empty());
    assert!(agent.metric("fathom_agent_bpf_excluded_total") > 0.0);
    assert_eq!(agent.metric("fathom_agent_samples_lost_total"), 0.0);
}

#[test]
fn agent_shows_kernel_frames_of_a_syscall_heavy_process() {
    let dir = tempfile::tempdir().unwrap();
    let hotc = build_c(dir.path(), "hotsys");
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let _agent = Agent::start(&f, dir.path(), &["--push-interval", "5s"]);
    let w = Workload::spawn(Command::new(&hotc).args(["syscall", "60"]));
    let sel = process(w.pid(), "hotsys");
    eventually(AGENT_WAIT, || {
        let s = folded(&f, &sel);
        let t = total(&s);
        // User frames below, kernel frames above them.
        let kernel = share(&s, |x| {
            x.contains("main;") && x.contains("entry_SYSCALL_64")
        });
        if t > 0 && kernel * 2 >= t {
            Ok(())
        } else {
            Err(format!("kernel frames in {kernel} of {t}: {s:#?}"))
        }
    });
}

#[test]
fn agent_keeps_a_process_that_exits_between_pushes() {
    let dir = tempfile::tempdir().unwrap();
    let hotc = build_c(dir.path(), "hotshort");
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    // The default 10 s push interval: the process lives 2 s of it.
    let _agent = Agent::start(&f, dir.path(), &[]);
    // First a copy of the same binary (same build id) runs other code of
    // it from another directory, which is removed once it exited: a
    // container that went away while another runs the same image. The
    // agent must read the code it has not named yet from the file that is
    // still there.
    let gone = tempfile::tempdir().unwrap();
    let copy = build_c(gone.path(), "hotshort");
    let first = Workload::spawn(Command::new(&copy).args(["syscall", "60"]));
    let sel = process(first.pid(), "hotshort");
    eventually(AGENT_WAIT, || {
        let s = folded(&f, &sel);
        if share(&s, |x| x.contains("main;syscall_loop")) > 0 {
            Ok(())
        } else {
            Err(format!("no main;syscall_loop in the copy's {s:#?}"))
        }
    });
    drop(first);
    drop(gone);
    let mut w = Workload::spawn(Command::new(&hotc).args(["cpu", "2"]));
    let pid = w.pid();
    assert!(w.0.wait().unwrap().success());
    assert_hot(
        &f,
        (pid, "hotshort"),
        ";hot_function",
        "main;outer_caller;middle_caller;hot_function",
        AGENT_WAIT,
    );
}

#[test]
fn agent_symbolizes_node_jit_frames_from_the_perf_map() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let _agent = Agent::start(&f, dir.path(), &["--push-interval", "5s"]);
    // V8 writes isolate logs into its working directory.
    let w = Workload::spawn(
        Command::new("node")
            .arg("--perf-basic-prof")
            .arg(sources().join("hot.js"))
            .arg("60")
            .current_dir(dir.path()),
    );
    let perf_map = format!("/tmp/perf-{}.map", w.pid());
    let sel = process(w.pid(), "node");
    eventually(AGENT_WAIT, || {
        let s = folded(&f, &sel);
        let t = total(&s);
        let js = share(&s, |x| x.contains("hotJsFunction"));
        if t > 0 && js * 2 >= t {
            Ok(())
        } else {
            Err(format!("hotJsFunction in {js} of {t}: {s:#?}"))
        }
    });
    drop(w);
    let _ = std::fs::remove_file(perf_map);
}

#[test]
fn agent_scrapes_go_pprof_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let gosvc = build_go(dir.path());
    let port = free_port();
    let _go = Workload::spawn(Command::new(&gosvc).arg(format!("127.0.0.1:{port}")));
    let config = dir.path().join("scrape.yaml");
    std::fs::write(
        &config,
        format!(
            r#"
scrape_configs:
  - job_name: gosvc
    scrape_interval: 5s
    profile_seconds: 3s
    static_configs:
      - targets: ["127.0.0.1:{port}"]
        labels: {{env: e2e}}
"#
        ),
    )
    .unwrap();
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let agent = Agent::start(
        &f,
        dir.path(),
        &[
            "--no-cpu-profiling",
            "--scrape-config",
            config.to_str().unwrap(),
        ],
    );
    let within = AGENT_WAIT;
    let has = |sel: &str, func: &str| {
        let s = folded(&f, sel);
        let hit = share(&s, |x| x.contains(func));
        if hit > 0 {
            Ok(())
        } else {
            Err(format!("{func} not in {sel}: {s:#?}"))
        }
    };
    eventually(within, || {
        has(
            &format!("{CPU}{{service_name=\"gosvc\", env=\"e2e\", job=\"gosvc\"}}"),
            "main.burnCPU",
        )
    });
    eventually(within, || {
        has(
            "memory:alloc_space:bytes:space:bytes{service_name=\"gosvc\"}",
            "main.allocate",
        )
    });
    eventually(within, || {
        let types = f
            .get_json(
                None,
                "/api/v1/profile_types",
                &[("start", "now-1h"), ("end", "now")],
            )
            .map_err(|e| e.to_string())?;
        let text = types.to_string();
        for t in ["goroutine", "contentions", "inuse_space"] {
            if !text.contains(t) {
                return Err(format!("no {t} profile type in {text}"));
            }
        }
        Ok(())
    });
    assert!(agent.metric("fathom_agent_scrapes_total") >= 5.0);
    assert_eq!(agent.metric("fathom_agent_dropped_batches_total"), 0.0);
}

#[test]
fn agent_without_privileges_fails_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    let port = free_port();
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ]);
    let agent = agent_command();
    cmd.arg(agent.get_program()).args(agent.get_args());
    let out = cmd
        .arg("--remote")
        .arg(f.url(""))
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{port}"))
        .output()
        .expect("setpriv (util-linux) runs the agent as nobody");
    let err =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "an unprivileged agent must not pretend to run: {err}"
    );
    assert!(
        err.contains("BPF") || err.contains("perf_event_open") || err.contains("BTF"),
        "the error names the cause: {err}"
    );
}

/// Work for [`agent_overhead_benchmark`]: run as a child process of this
/// test binary (FATHOM_BENCH_SPIN_SECS set), it keeps a CPU busy in varied
/// Rust code (sorting, hashing, formatting) for that long, so the agent has
/// to symbolize many addresses of a big debug binary. Does nothing in a
/// normal test run.
#[test]
#[ignore = "helper process of agent_overhead_benchmark"]
fn bench_spin_helper() {
    let Some(secs) = std::env::var("FATHOM_BENCH_SPIN_SECS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return;
    };
    let t0 = Instant::now();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sink = 0usize;
    while t0.elapsed() < Duration::from_secs(secs) {
        let mut v: Vec<u64> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect();
        v.sort_unstable();
        let m: std::collections::HashMap<u64, String> =
            v.iter().take(512).map(|k| (*k, format!("{k:x}"))).collect();
        let t: BTreeMap<&String, u64> = m.iter().map(|(k, v)| (v, *k)).collect();
        sink = sink.wrapping_add(t.len() + v.binary_search(&x).unwrap_or(0));
    }
    std::hint::black_box(sink);
}

/// Macro benchmark: the agent's overhead at 19 Hz with every CPU busy, and
/// the delay from a sample to its query result. Prints a table; run with
/// `cargo test -p fathom-integration --test e2e agent_overhead -- --ignored --nocapture`
/// (FATHOM_BENCH_SECS, default 180, sets the duration; use a release build
/// of the agent for representative figures).
///
/// Every CPU runs a C loop, and one more process is this test binary
/// itself running [`bench_spin_helper`]: a debug build of ~28 MB (above
/// the old 16 MiB DWARF limit), so the figures include the agent reading
/// the DWARF of a big binary. The table also gives the agent's `RssAnon`
/// and `RssFile` when its RSS was highest (polled every 0.5 s) and the
/// DWARF limit used (FATHOM_AGENT_DWARF_MAX_FILE_SIZE, else the default).
#[test]
#[ignore = "benchmark: minutes long"]
fn agent_overhead_benchmark() {
    let secs: u64 = std::env::var("FATHOM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    let dir = tempfile::tempdir().unwrap();
    let hotc = build_c(dir.path(), "hotbench");
    let (nofpc, nofprs) = build_nofp(dir.path());
    let f = Fathom::start(&dir.path().join("data"), &[]).unwrap();
    // FATHOM_BENCH_OFF_CPU=1ms measures with off-CPU profiling on.
    let off_cpu = std::env::var("FATHOM_BENCH_OFF_CPU").ok();
    let mut extra = Vec::new();
    if let Some(t) = &off_cpu {
        extra.extend(["--off-cpu-threshold", t.as_str()]);
    }
    let agent = Agent::start(&f, dir.path(), &extra);
    let apid = agent.child.id();
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let long = (secs + 60).to_string();
    let mut busy: Vec<Workload> = (0..cpus)
        .map(|_| Workload::spawn(Command::new(&hotc).args(["cpu", &long])))
        .collect();
    // Code without frame pointers (unwound with tables), Python, and a
    // process that sleeps (off-CPU) next to them.
    let nofp_c = Workload::spawn(Command::new(&nofpc).args(["cpu", &long]));
    let nofp_rs = Workload::spawn(Command::new(&nofprs).arg(&long));
    let py = Workload::spawn(
        Command::new("/usr/bin/python3")
            .arg(sources().join("hot.py"))
            .arg(&long),
    );
    busy.push(Workload::spawn(Command::new(&nofpc).args(["sleep", &long])));
    let exe = std::env::current_exe().unwrap();
    let exe_mb = std::fs::metadata(&exe).map_or(0, |m| m.len()) >> 20;
    let big = Workload::spawn(
        Command::new(&exe)
            .args(["--ignored", "--exact", "bench_spin_helper"])
            .env("FATHOM_BENCH_SPIN_SECS", (secs + 60).to_string()),
    );
    // (VmRSS, RssAnon, RssFile) in kB at the highest VmRSS seen.
    let peak = std::sync::Arc::new(std::sync::Mutex::new((0u64, 0u64, 0u64)));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{apid}/status")) {
                    let get = |key: &str| -> u64 {
                        s.lines()
                            .find(|l| l.starts_with(key))
                            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                            .unwrap_or(0)
                    };
                    let now = (get("VmRSS:"), get("RssAnon:"), get("RssFile:"));
                    let mut p = peak.lock().unwrap();
                    if now.0 > p.0 {
                        *p = now;
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };

    let ticks = |pid: u32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split(' ').collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let status = |pid: u32, key: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    let hz = 100.0; // USER_HZ
    let c0 = ticks(apid);
    let t0 = Instant::now();

    // End-to-end delay: a fresh process's first samples, until queryable.
    let mut delays = Vec::new();
    while t0.elapsed() < Duration::from_secs(secs) {
        let w = Workload::spawn(Command::new(&hotc).args(["cpu", "30"]));
        let started = Instant::now();
        let sel = format!("{CPU}{{pid=\"{}\"}}", w.pid());
        let found = eventually(Duration::from_secs(60), || {
            if total(&folded(&f, &sel)) > 0 {
                Ok(started.elapsed())
            } else {
                Err(format!("pid {} not queryable", w.pid()))
            }
        });
        delays.push(found.as_secs_f64());
        drop(w);
        let rest = Duration::from_secs(secs).saturating_sub(t0.elapsed());
        std::thread::sleep(rest.min(Duration::from_secs(20)));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (ticks(apid) - c0) as f64 / hz;
    // perf's DWARF unwinding of the same workload, as the peer: 30 s.
    let perf_secs = 30;
    let perf_script = perf_dwarf(dir.path(), nofp_c.pid(), perf_secs);
    let perf_c = perf_completeness(
        &perf_script,
        "c_hot",
        &["c_level4", "c_level3", "c_level2", "c_level1", "main"],
    );
    let perf_script_rs = perf_dwarf(dir.path(), nofp_rs.pid(), perf_secs);
    let perf_rs = perf_completeness(
        &perf_script_rs,
        "rs_hot",
        &["rs_level4", "rs_level3", "rs_level2", "rs_level1", "main"],
    );
    let agent_share = |pid: u32, leaf: &str, chain: &str| -> (i64, i64) {
        let st = folded(&f, &format!("{CPU}{{pid=\"{pid}\"}}"));
        (
            share(&st, |s| {
                s.contains(leaf) && s.contains(chain) && s.contains("__libc_start")
            }),
            share(&st, |s| s.contains(leaf)),
        )
    };
    let agent_c = agent_share(
        nofp_c.pid(),
        ";c_hot",
        "main;c_level1;c_level2;c_level3;c_level4;c_hot",
    );
    let agent_rs = agent_share(
        nofp_rs.pid(),
        ";nofp::rs_hot",
        "nofp::main;nofp::rs_level1;nofp::rs_level2;nofp::rs_level3;nofp::rs_level4;nofp::rs_hot",
    );
    let agent_py = agent_share(
        py.pid(),
        ";py_hot",
        "main;py_outer;py_middle;py_inner;py_hot",
    );
    // The query gives CPU nanoseconds: samples are that over the period.
    let samples_of = |ns: i64| (ns as f64 / (1e9 / 19.0)).round() as i64;
    let pct = |(a, b): (i64, i64)| {
        if b > 0 {
            a as f64 * 100.0 / b as f64
        } else {
            0.0
        }
    };
    let pctu = |(a, b): (usize, usize)| {
        if b > 0 {
            a as f64 * 100.0 / b as f64
        } else {
            0.0
        }
    };
    let tables = agent.metric("fathom_agent_unwind_tables");
    let rows = agent.metric("fathom_agent_unwind_table_rows");
    let truncated = agent.metric("fathom_agent_user_stacks_truncated_total");
    let tabled = agent.metric("fathom_agent_user_stacks_unwound_with_tables_total");
    let offcpu_events = agent.metric("fathom_agent_offcpu_events_total");
    let cpu_pct = cpu / wall * 100.0;
    let rss_mb = status(apid, "VmHWM:") as f64 / 1024.0;
    delays.sort_by(|a, b| a.total_cmp(b));
    let median = delays[delays.len() / 2];
    let max = delays.last().copied().unwrap_or(0.0);
    let samples = agent.metric("fathom_agent_samples_total");
    let lost = agent.metric("fathom_agent_samples_lost_total");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poller.join().unwrap();
    let (peak_rss, peak_anon, peak_file) = *peak.lock().unwrap();
    let mb = |kb: u64| kb as f64 / 1024.0;
    let dwarf =
        std::env::var("FATHOM_AGENT_DWARF_MAX_FILE_SIZE").unwrap_or_else(|_| "default".into());
    println!();
    println!("agent overhead at 19 Hz, {cpus} CPUs busy, {wall:.0} s");
    println!("| what                         | measured  | target   |");
    println!("|------------------------------|-----------|----------|");
    println!("| CPU, % of one core           | {cpu_pct:>8.3}% | <= 0.5%  |");
    println!("| peak RSS (VmHWM)             | {rss_mb:>6.1} MB | <= 64 MB |");
    println!("| sample -> query, median      | {median:>7.1} s | <= 15 s  |");
    println!("| sample -> query, max         | {max:>7.1} s | <= 15 s  |");
    println!("| samples received / lost      | {samples:>6} / {lost} |          |");
    println!(
        "| highest VmRSS polled: anon + file | {:.1} + {:.1} = {:.1} MB | |",
        mb(peak_anon),
        mb(peak_file),
        mb(peak_rss)
    );
    println!("| DWARF limit / big binary     | {dwarf} / {exe_mb} MB |          |");
    println!(
        "| off-CPU                      | {} ({offcpu_events} events) | |",
        off_cpu.as_deref().unwrap_or("off")
    );
    println!(
        "| unwind tables / rows         | {tables} / {rows} ({:.1} MB) | |",
        rows * 12.0 / 1048576.0
    );
    println!("| user stacks by tables / truncated | {tabled} / {truncated} | |");
    println!();
    println!("stack completeness (share of the leaf's samples with the full chain to main)");
    println!("| workload                     | agent                 | perf --call-graph dwarf |");
    println!("|------------------------------|-----------------------|-------------------------|");
    println!(
        "| C -O2 -fomit-frame-pointer   | {:>5.1}% of {:>5} | {:>5.1}% of {:>5} |",
        pct(agent_c),
        samples_of(agent_c.1),
        pctu(perf_c),
        perf_c.1
    );
    println!(
        "| Rust release, no frame ptrs  | {:>5.1}% of {:>5} | {:>5.1}% of {:>5} |",
        pct(agent_rs),
        samples_of(agent_rs.1),
        pctu(perf_rs),
        perf_rs.1
    );
    println!(
        "| Python 3.11 (py_hot chain)   | {:>5.1}% of {:>5} | (perf has no Python frames) |",
        pct(agent_py),
        samples_of(agent_py.1)
    );
    drop(py);
    drop(nofp_rs);
    drop(nofp_c);
    drop(big);
    drop(busy);
}
