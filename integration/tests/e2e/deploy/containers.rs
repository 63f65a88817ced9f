//! The cluster as containers (testcontainers) on a private Docker network,
//! from the same images as the compose cluster: Garage, 3 metastore nodes,
//! 3 ingesters (RF=3), 2 distributors, a querier and a compactor. One
//! cluster, five faults in sequence, each while the load generator pushes
//! through the distributors' published ports on loopback:
//!
//! 1. an ingester killed (`docker kill`), then started again;
//! 2. an ingester paused (`docker pause`) for 10 s;
//! 3. an ingester cut off the network (`docker network disconnect`) for 10 s;
//! 4. the metastore leader's container restarted;
//! 5. Garage stopped for 30 s.
//!
//! After each: every acknowledged write is in query results exactly once
//! (per-stack totals equal the `go tool pprof` expectations summed over the
//! acknowledged writes of every phase so far), reads made during the fault
//! are complete or fail (never a partial answer), and the cluster heals
//! (three live ingesters, every role ready); the time that takes is printed.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fathom_integration::free_port;
use fathom_integration::loadgen::{self, Ack, LoadOptions, LoadReport};
use testcontainers::core::{CmdWaitFor, ContainerPort, ExecCommand, WaitFor};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

use super::{TAG, docker_lock, images, run};
use crate::cluster::{BASE_S, FILES, check_acked, folded_between};

const KEY_ID: &str = "GK8b72ae0651d0d51e12c222f4";
const SECRET: &str = "c9e4e82058d491c29be90808c7b77c0a5301f20a051817b18c628fed998b307b";
/// Every container's cluster secret (internal calls carry it).
const CLUSTER_SECRET: &str = "containers-e2e-cluster-secret";

/// One fathom container with its port published on loopback.
struct Node {
    name: String,
    /// Host port of the container's HTTP/gRPC port.
    port: u16,
    c: Container<GenericImage>,
}

impl Node {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn ready(&self) -> bool {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
            .get(self.url("/ready"))
            .send()
            .is_ok_and(|r| r.status().is_success())
    }

    fn wait_ready(&self, timeout: Duration) {
        let t0 = Instant::now();
        while !self.ready() {
            if t0.elapsed() > timeout {
                panic!(
                    "{} not ready after {timeout:?}; its log:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let text = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .ok()?
            .get(self.url("/metrics"))
            .send()
            .ok()?
            .text()
            .ok()?;
        fathom_integration::metric_value(&text, name).ok()
    }

    fn log(&self) -> String {
        let tail = |v: Vec<u8>| {
            let s = String::from_utf8_lossy(&v).into_owned();
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        tail(self.c.stderr_to_vec().unwrap_or_default())
            + &tail(self.c.stdout_to_vec().unwrap_or_default())
    }
}

struct TcCluster {
    network: String,
    garage: Container<GenericImage>,
    metastores: Vec<Node>,
    ingesters: Vec<Node>,
    distributors: Vec<Node>,
    querier: Node,
    compactor: Node,
}

fn fathom(network: &str, name: &str, port: u16, cmd: Vec<String>, s3: bool) -> Node {
    let mut req = GenericImage::new("fathom", TAG)
        .with_network(network)
        .with_container_name(name)
        .with_mapped_port(port, ContainerPort::Tcp(port_inside(&cmd)))
        .with_env_var("RUST_LOG", "info")
        .with_env_var("FATHOM_CLUSTER_SECRET", CLUSTER_SECRET)
        .with_cmd(cmd);
    if s3 {
        for (k, v) in [
            ("FATHOM_OBJECT_STORE", "s3".to_owned()),
            (
                "FATHOM_S3_ENDPOINT",
                format!("http://{network}-garage:3900"),
            ),
            ("FATHOM_S3_BUCKET", "fathom".into()),
            ("FATHOM_S3_REGION", "garage".into()),
            ("FATHOM_S3_ALLOW_HTTP", "true".into()),
            ("FATHOM_S3_ACCESS_KEY_ID", KEY_ID.into()),
            ("FATHOM_S3_SECRET_ACCESS_KEY", SECRET.into()),
        ] {
            req = req.with_env_var(k, v);
        }
    }
    let c = req
        .start()
        .unwrap_or_else(|e| panic!("starting container {name}: {e}"));
    Node {
        name: name.to_owned(),
        port,
        c,
    }
}

fn port_inside(cmd: &[String]) -> u16 {
    if cmd[0] == "metastore" { 9095 } else { 7400 }
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl TcCluster {
    fn start() -> TcCluster {
        let network = format!("fathom-tc-{}", std::process::id());
        let garage = GenericImage::new("fathom-garage", TAG)
            .with_wait_for(WaitFor::healthcheck())
            .with_network(&network)
            .with_container_name(format!("{network}-garage"))
            .with_env_var("GARAGE_ACCESS_KEY_ID", KEY_ID)
            .with_env_var("GARAGE_SECRET_ACCESS_KEY", SECRET)
            .with_startup_timeout(Duration::from_secs(120))
            .start()
            .expect("starting the garage container");
        let ms: Vec<String> = (1..=3)
            .map(|i| format!("{network}-metastore-{i}"))
            .collect();
        let peers = ms
            .iter()
            .enumerate()
            .map(|(i, m)| format!("{}={m}:9095", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let meta_list = ms
            .iter()
            .map(|m| format!("{m}:9095"))
            .collect::<Vec<_>>()
            .join(",");
        let metastores: Vec<Node> = ms
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut a = args(&["metastore", "--node-id"]);
                a.push((i + 1).to_string());
                a.extend(args(&[
                    "--advertise",
                    &format!("{m}:9095"),
                    "--peers",
                    &peers,
                    "--member-timeout",
                    "6s",
                ]));
                fathom(&network, m, free_port(), a, false)
            })
            .collect();
        let role = |role: &str, name: &str, extra: &[&str]| {
            let full = format!("{network}-{name}");
            let mut a = args(&[
                role,
                "--name",
                name,
                "--advertise",
                &format!("{full}:7400"),
                "--metastore",
                &meta_list,
                "--heartbeat-interval",
                "1s",
            ]);
            a.extend(args(extra));
            fathom(&network, &full, free_port(), a, role != "distributor")
        };
        let ingesters: Vec<Node> = (1..=3)
            .map(|i| {
                role(
                    "ingester",
                    &format!("ingester-{i}"),
                    &["--flush-interval", "10s"],
                )
            })
            .collect();
        let distributors: Vec<Node> = (1..=2)
            .map(|i| role("distributor", &format!("distributor-{i}"), &[]))
            .collect();
        let querier = role("querier", "querier", &[]);
        let compactor = role("compactor", "compactor", &[]);
        let c = TcCluster {
            network,
            garage,
            metastores,
            ingesters,
            distributors,
            querier,
            compactor,
        };
        for n in c.nodes() {
            n.wait_ready(Duration::from_secs(120));
        }
        c.wait_live_ingesters(3, Duration::from_secs(60));
        c
    }

    fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.metastores
            .iter()
            .chain(&self.ingesters)
            .chain(&self.distributors)
            .chain([&self.querier, &self.compactor])
    }

    fn leader_index(&self) -> Option<usize> {
        self.metastores
            .iter()
            .position(|m| m.metric("fathom_metastore_is_leader") == Some(1.0))
    }

    /// Ingesters the metastore leader counts as live (asked at its
    /// published port: the group's own addresses are Docker DNS names).
    fn live_ingesters(&self) -> Option<usize> {
        let leader = &self.metastores[self.leader_index()?];
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let addr = format!("127.0.0.1:{}", leader.port);
        rt.block_on(async move {
            let opts = fathom_metastore::ClientOptions {
                secret: fathom_api::secret::ClusterSecret::new(CLUSTER_SECRET).ok()?,
                ..Default::default()
            };
            let c = fathom_metastore::MetastoreClient::with_options(vec![addr], opts).ok()?;
            let m = tokio::time::timeout(
                Duration::from_secs(5),
                c.members(Some(fathom_metastore::Role::Ingester)),
            )
            .await
            .ok()?
            .ok()?;
            Some(m.len())
        })
    }

    fn wait_live_ingesters(&self, n: usize, timeout: Duration) {
        let t0 = Instant::now();
        while self.live_ingesters() != Some(n) {
            if t0.elapsed() > timeout {
                panic!(
                    "the metastore does not count {n} live ingesters after {timeout:?}: {:?}",
                    self.live_ingesters()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the metastore counts one ingester fewer (the fault took
    /// effect; printed), then until `hold` has passed since `since`.
    fn fault_noticed(&self, since: Instant, hold: Duration) {
        self.wait_live_ingesters(2, Duration::from_secs(30));
        println!(
            "  the ingester left the ring {:.1} s after the fault",
            since.elapsed().as_secs_f64()
        );
        std::thread::sleep(hold.saturating_sub(since.elapsed()));
    }

    /// Healed: three live ingesters and every published role ready.
    fn wait_healed(&self, timeout: Duration) -> Duration {
        let t0 = Instant::now();
        self.wait_live_ingesters(3, timeout);
        for n in self
            .metastores
            .iter()
            .chain(&self.distributors)
            .chain([&self.querier, &self.compactor])
        {
            n.wait_ready(timeout.saturating_sub(t0.elapsed()));
        }
        t0.elapsed()
    }

    fn load(&self, phase: i64, duration: Duration) -> std::thread::JoinHandle<LoadReport> {
        let opts = LoadOptions {
            distributors: self.distributors.iter().map(|d| d.url("")).collect(),
            tenants: 2,
            services: 3,
            rate: 5.0,
            duration,
            files: FILES.iter().map(|s| s.to_string()).collect(),
            base_time_s: phase_start(phase),
            retry_for: Duration::from_secs(90),
        };
        std::thread::spawn(move || loadgen::run(&opts, Arc::new(AtomicBool::new(false))).unwrap())
    }

    fn garage_ready(&self) -> bool {
        let Ok(mut r) = self.garage.exec(
            ExecCommand::new(["garage-entrypoint", "ready"])
                .with_cmd_ready_condition(CmdWaitFor::exit()),
        ) else {
            return false;
        };
        let _ = r.stdout_to_vec();
        r.exit_code().ok().flatten() == Some(0)
    }
}

/// Reads of `acked` (writes of earlier phases, all before `before_s`, the
/// current phase's first profile) in a loop until `stop`: each must be
/// complete or fail, never partial. Returns (complete, failed).
fn reader(
    querier: String,
    acked: Vec<Ack>,
    before_s: i64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, usize)> {
    std::thread::spawn(move || {
        let want = loadgen::expected(&acked, "cpu/nanoseconds").unwrap();
        let end = ((before_s - 1) * 1000).to_string();
        let (mut ok, mut failed) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            for ((tenant, service), stacks) in &want {
                match folded_between(&querier, tenant, service, "2023-12-31T00:00:00Z", &end) {
                    Ok(got) => {
                        let total =
                            |m: &std::collections::BTreeMap<String, i64>| m.values().sum::<i64>();
                        assert!(
                            &got == stacks,
                            "a read during the fault was partial: {tenant}/{service} total {} over {} stacks, want {} over {}",
                            total(&got),
                            got.len(),
                            total(stacks),
                            stacks.len()
                        );
                        ok += 1;
                    }
                    Err(_) => failed += 1,
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        (ok, failed)
    })
}

/// A day per phase: each phase's writes are new profiles, after every
/// earlier phase's.
fn phase_start(phase: i64) -> i64 {
    BASE_S + phase * 86_400
}

/// `docker pause`, asked again when the runtime gives up freezing. With
/// cgroup v1, runc tries to freeze for a few hundred milliseconds and then
/// thaws the container and fails ("unable to freeze"): a thread in
/// uninterruptible sleep (an fdatasync waiting for a busy disk) freezes
/// only when that sleep ends. The container runs on after such a refusal,
/// so the fault is only late, not different.
fn pause(c: &Container<GenericImage>) {
    let t0 = Instant::now();
    let mut refusals = 0;
    loop {
        match futures::executor::block_on(c.pause()) {
            Ok(()) => break,
            Err(e) if format!("{e:?}").contains("unable to freeze") && refusals < 20 => {
                refusals += 1;
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("docker pause ({refusals} refusals before): {e:?}"),
        }
    }
    if refusals > 0 {
        println!(
            "  docker pause refused {refusals} time(s) (runc: unable to freeze), paused after {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }
}

fn docker(args: &[&str]) {
    run(Command::new("docker").args(args));
}

#[test]
fn containers_cluster_survives_kill_pause_partition_leader_restart_and_s3_outage() {
    let _one = docker_lock();
    images();
    let t0 = Instant::now();
    let c = TcCluster::start();
    println!(
        "container cluster (11 containers) ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // Phase 0: a baseline every later read during a fault must return whole.
    let mut acked: Vec<Ack> = Vec::new();
    let base = c.load(0, Duration::from_secs(5)).join().unwrap();
    assert!(base.failed.is_empty(), "{:?}", base.failed);
    assert!(base.acked.len() >= 10, "the baseline load ran");
    acked.extend(base.acked);
    check_acked(&c.querier.url(""), &acked);

    type Fault<'a> = (&'a str, u64, Box<dyn Fn(&TcCluster) -> Instant + 'a>);
    let faults: Vec<Fault<'_>> = vec![
        (
            "kill ingester-1 (docker kill), start it again",
            40,
            Box::new(|c: &TcCluster| {
                docker(&["kill", c.ingesters[0].c.id()]);
                c.fault_noticed(Instant::now(), Duration::ZERO);
                c.ingesters[0].c.start().expect("start ingester-1 again");
                Instant::now()
            }),
        ),
        (
            "pause ingester-2 (docker pause) for 10 s",
            40,
            Box::new(|c: &TcCluster| {
                pause(&c.ingesters[1].c);
                c.fault_noticed(Instant::now(), Duration::from_secs(10));
                futures::executor::block_on(c.ingesters[1].c.unpause()).expect("unpause");
                Instant::now()
            }),
        ),
        (
            "disconnect ingester-3 from the network for 10 s",
            40,
            Box::new(|c: &TcCluster| {
                let id = c.ingesters[2].c.id().to_owned();
                docker(&["network", "disconnect", &c.network, &id]);
                c.fault_noticed(Instant::now(), Duration::from_secs(10));
                docker(&["network", "connect", &c.network, &id]);
                Instant::now()
            }),
        ),
        (
            "restart the metastore leader's container",
            40,
            Box::new(|c: &TcCluster| {
                let old = c.leader_index().expect("a metastore leader");
                c.metastores[old].c.stop().expect("stop the leader");
                let t = Instant::now();
                let new = loop {
                    if let Some(i) = c.leader_index()
                        && i != old
                    {
                        break i;
                    }
                    assert!(t.elapsed() < Duration::from_secs(30), "no new leader");
                    std::thread::sleep(Duration::from_millis(100));
                };
                println!(
                    "  metastore-{} was leader; metastore-{} leads after {:.1} s",
                    old + 1,
                    new + 1,
                    t.elapsed().as_secs_f64()
                );
                c.metastores[old].c.start().expect("start the old leader");
                Instant::now()
            }),
        ),
        (
            "stop Garage for 30 s",
            55,
            Box::new(|c: &TcCluster| {
                c.garage.stop().expect("stop garage");
                std::thread::sleep(Duration::from_secs(30));
                let failures: f64 = c
                    .ingesters
                    .iter()
                    .filter_map(|i| i.metric("fathom_ingester_block_upload_failures_total"))
                    .sum();
                assert!(
                    failures > 0.0,
                    "block uploads were attempted and failed while Garage was down"
                );
                c.garage.start().expect("start garage");
                let t = Instant::now();
                while !c.garage_ready() {
                    assert!(
                        t.elapsed() < Duration::from_secs(60),
                        "garage not ready again"
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
                Instant::now()
            }),
        ),
    ];

    let mut figures = Vec::new();
    for (phase, (what, secs, fault)) in faults.iter().enumerate() {
        let phase = phase as i64 + 1;
        let load = c.load(phase, Duration::from_secs(*secs));
        let stop = Arc::new(AtomicBool::new(false));
        let reads = reader(
            c.querier.url(""),
            acked.clone(),
            phase_start(phase),
            stop.clone(),
        );
        std::thread::sleep(Duration::from_secs(8));
        let lifted = fault(&c);
        let heal = lifted.elapsed() + c.wait_healed(Duration::from_secs(120));
        let report = load.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        let (reads_ok, reads_failed) = reads.join().expect("reads during the fault were whole");
        assert!(
            report.failed.is_empty(),
            "{what}: writes never acknowledged: {:?}",
            report.failed
        );
        assert!(
            report.acked.len() >= 50,
            "{what}: the load ran: {}",
            report.acked.len()
        );
        let n = report.acked.len();
        acked.extend(report.acked);
        check_acked(&c.querier.url(""), &acked);
        let line = format!(
            "{what}: writes acknowledged {n} ({} retries), lost: 0, duplicated: 0, \
             reads during the fault {reads_ok} whole / {reads_failed} failed / 0 partial, \
             time to heal {:.1} s",
            report.retries,
            heal.as_secs_f64()
        );
        println!("{line}");
        figures.push(line);
    }
    println!(
        "container fault tests: {} writes acknowledged in all, every one exactly once, {:.0} s\n{}",
        acked.len(),
        t0.elapsed().as_secs_f64(),
        figures.join("\n")
    );
}
