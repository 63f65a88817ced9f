//! The cluster under faults, as separate processes on loopback: 3
//! metastore nodes, 2 distributors, 3 ingesters (RF=3), a querier, a
//! compactor. Every acknowledged profile is in query results exactly once
//! (per-stack totals equal the `go tool pprof` expectations summed over the
//! acknowledged writes), whatever dies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use fathom_integration::cluster::{Cluster, ClusterOptions};
use fathom_integration::loadgen::{self, Ack, LoadOptions, LoadReport};
use fathom_integration::parse_folded;

pub(crate) const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
pub(crate) const FILES: [&str; 2] = [
    "google+pprof/internal/report/testdata/sample.cpu",
    "google+pprof/internal/driver/testdata/cppbench.cpu",
];
/// 2024-01-01T00:00:00Z
pub(crate) const BASE_S: i64 = 1_704_067_200;

fn secs(var: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

fn load_options(c: &Cluster, duration: Duration) -> LoadOptions {
    LoadOptions {
        distributors: c.distributors.iter().map(|d| d.url("")).collect(),
        tenants: 2,
        services: 3,
        rate: 5.0,
        duration,
        files: FILES.iter().map(|s| s.to_string()).collect(),
        base_time_s: BASE_S,
        retry_for: Duration::from_secs(60),
    }
}

/// Runs the load generator in a thread.
fn load(c: &Cluster, duration: Duration) -> std::thread::JoinHandle<LoadReport> {
    let opts = load_options(c, duration);
    std::thread::spawn(move || loadgen::run(&opts, Arc::new(AtomicBool::new(false))).unwrap())
}

fn folded(c: &Cluster, tenant: &str, service: &str) -> Result<BTreeMap<String, i64>, String> {
    folded_at(&c.querier.url(""), tenant, service)
}

/// Per-stack totals of one load-generator series, as the querier at
/// `querier` (a base URL) answers them over the load generator's days.
pub(crate) fn folded_at(
    querier: &str,
    tenant: &str,
    service: &str,
) -> Result<BTreeMap<String, i64>, String> {
    folded_between(
        querier,
        tenant,
        service,
        "2023-12-31T00:00:00Z",
        "2024-01-10T00:00:00Z",
    )
}

/// As [`folded_at`], between `start` and `end` (API times).
pub(crate) fn folded_between(
    querier: &str,
    tenant: &str,
    service: &str,
    start: &str,
    end: &str,
) -> Result<BTreeMap<String, i64>, String> {
    let query = format!("{CPU}{{service_name=\"{service}\"}}");
    folded_query(querier, Some(tenant), &query, start, end)
}

/// The merge of `query` between `start` and `end` (API times) from the
/// querier at `querier`, in folded form; an error names the status and body.
pub(crate) fn folded_query(
    querier: &str,
    tenant: Option<&str>,
    query: &str,
    start: &str,
    end: &str,
) -> Result<BTreeMap<String, i64>, String> {
    let mut rb = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
        .get(format!("{querier}/api/v1/query"))
        .query(&[
            ("query", query),
            ("start", start),
            ("end", end),
            ("format", "folded"),
        ]);
    if let Some(t) = tenant {
        rb = rb.header("X-Scope-OrgID", t);
    }
    let r = rb.send().map_err(|e| e.to_string())?;
    let status = r.status();
    let text = r.text().map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {text}"));
    }
    parse_folded(&text).map_err(|e| e.to_string())
}

/// Every acknowledged write exactly once.
fn check(c: &Cluster, report: &LoadReport) {
    assert!(
        report.failed.is_empty(),
        "writes never acknowledged: {:?}",
        report.failed
    );
    assert!(
        report.acked.len() >= 10,
        "the load ran: {}",
        report.acked.len()
    );
    check_acked(&c.querier.url(""), &report.acked);
}

/// The querier at `querier` shows exactly the acknowledged writes `acked`:
/// per-stack totals of every (tenant, service) equal the `go tool pprof`
/// expectations summed over them (a lost write is missing, a duplicated one
/// counts twice).
pub(crate) fn check_acked(querier: &str, acked: &[Ack]) {
    let want = loadgen::expected(acked, "cpu/nanoseconds").unwrap();
    for ((tenant, service), stacks) in &want {
        let got = folded_at(querier, tenant, service).unwrap();
        if &got != stacks {
            let total = |m: &BTreeMap<String, i64>| m.values().sum::<i64>();
            panic!(
                "{tenant}/{service}: got total {} over {} stacks, want {} over {} ({} writes acknowledged)",
                total(&got),
                got.len(),
                total(stacks),
                stacks.len(),
                acked
                    .iter()
                    .filter(|a: &&Ack| &a.tenant == tenant && &a.service == service)
                    .count()
            );
        }
    }
}

#[test]
fn cluster_kill_one_ingester_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let mut c = Cluster::start(dir.path(), &ClusterOptions::default()).unwrap();
    let cold = t0.elapsed();
    println!(
        "cold start to ready with 3 live ingesters: {:.1} s",
        cold.as_secs_f64()
    );
    assert!(cold < Duration::from_secs(60), "cold start took {cold:?}");

    let duration = secs("FATHOM_CLUSTER_LOAD_SECS", 60);
    let h = load(&c, duration);
    std::thread::sleep(duration / 3);
    c.ingesters[0].kill();
    let killed = Instant::now();
    // The dead member leaves the ring within the heartbeat timeout.
    c.wait_ingesters(2, Duration::from_secs(30)).unwrap();
    let gone = killed.elapsed();
    println!(
        "killed ingester left the ring after {:.1} s",
        gone.as_secs_f64()
    );
    assert!(gone < Duration::from_secs(15), "{gone:?}");
    let report = h.join().unwrap();
    println!(
        "acknowledged {} writes in {:.0} s, {} retries",
        report.acked.len(),
        report.elapsed.as_secs_f64(),
        report.retries
    );
    check(&c, &report);

    // With one ingester down (killed, its heads not flushed), a head read
    // needs every live one. One stopped with SIGTERM flushes its heads and
    // leaves the ring, so it is not missed: the answers stay whole from
    // the last live ingester and the blocks. Losing that one too is a 503
    // naming the ingester that is down, never an answer without the writes
    // only it and a replica since gone acknowledged.
    c.ingesters[1].stop().unwrap();
    assert!(
        c.ingesters[1]
            .log()
            .contains("left the ring: heads flushed"),
        "{}",
        c.ingesters[1].log()
    );
    c.wait_views(1, Duration::from_secs(30)).unwrap();
    check(&c, &report);
    c.ingesters[2].kill();
    let e = folded(&c, "tenant-0", "svc-0").unwrap_err();
    let down = format!("1 is down with heads not flushed ({})", c.ingesters[0].name);
    assert!(e.starts_with("503") && e.contains(&down), "{e}");

    // An ingester lost for good is forgotten with `fathom members forget`:
    // head reads then stop waiting for it. The listing shows each member's
    // state; a live member or an unknown name is refused.
    c.wait_ingesters(0, Duration::from_secs(30)).unwrap();
    let list = members(&c, &["list"]).unwrap();
    println!("fathom members list:\n{list}");
    for (i, state) in [(0, "down"), (1, "left"), (2, "down")] {
        let name = &c.ingesters[i].name;
        assert!(
            list.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.first() == Some(&name.as_str()) && f.get(3) == Some(&state)
            }),
            "{name} {state}:\n{list}"
        );
    }
    let live = members(&c, &["forget", &c.querier.name]).unwrap_err();
    assert!(live.contains("is live"), "{live}");
    let unknown = members(&c, &["forget", "no-such-member"]).unwrap_err();
    assert!(unknown.contains("no member is registered"), "{unknown}");
    let forgot = members(&c, &["forget", &c.ingesters[0].name]).unwrap();
    assert!(forgot.contains("forgot ingester"), "{forgot}");
    // With one ingester down (the third), replication tolerates it: the
    // querier answers once its ring view has the change.
    let t = Instant::now();
    while let Err(e) = folded(&c, "tenant-0", "svc-0") {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "after forgetting: {e}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `fathom members <args> --metastore …` with the cluster secret: its
/// stdout, or its stderr when it fails.
fn members(c: &Cluster, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(fathom_integration::fathom_bin())
        .arg("members")
        .args(args)
        .args(["--metastore", &c.metastore_list()])
        .env("FATHOM_CLUSTER_SECRET", &c.secret)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `clients` load generators at once, each on its own stretch of time
/// (so that their writes never collide), every one sending as fast as it is
/// acknowledged; returns their reports.
fn load_clients(c: &Cluster, clients: usize, duration: Duration) -> Vec<LoadReport> {
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let mut opts = load_options(c, duration);
            opts.rate = 1000.0;
            opts.base_time_s = BASE_S + i as i64 * 30 * 86_400;
            opts.retry_for = Duration::from_secs(30);
            std::thread::spawn(move || {
                loadgen::run(&opts, Arc::new(AtomicBool::new(false))).unwrap()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Refusals (retried attempts) and acknowledged writes over `reports`.
fn refusals(reports: &[LoadReport]) -> (usize, usize) {
    let refused = reports.iter().map(|r| r.retries + r.failed.len()).sum();
    let acked = reports.iter().map(|r| r.acked.len()).sum();
    (refused, acked)
}

/// Started as docs/operations.md starts it and loaded by 8 clients as
/// soon as every process reports ready: no write is refused while a quorum
/// of ingesters is alive, neither at start (a distributor is ready only
/// once it knows a quorum) nor after one ingester is killed.
#[test]
fn cluster_refuses_no_write_once_ready() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ClusterOptions {
        wait_ring: false,
        ..Default::default()
    };
    let mut c = Cluster::start(dir.path(), &opts).unwrap();
    let (refused, acked) = refusals(&load_clients(&c, 8, Duration::from_secs(4)));
    println!("at start: {acked} writes acknowledged, {refused} refused");
    assert!(acked >= 40, "the load ran: {acked} writes");
    assert_eq!(refused, 0, "writes refused right after ready");

    c.ingesters[0].kill();
    let (refused, acked) = refusals(&load_clients(&c, 8, Duration::from_secs(4)));
    println!("one ingester killed: {acked} writes acknowledged, {refused} refused");
    assert!(acked >= 40, "the load ran: {acked} writes");
    assert_eq!(refused, 0, "writes refused with 2 of 3 ingesters alive");
}

#[test]
fn cluster_kill_all_ingesters_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), &ClusterOptions::default()).unwrap();
    let report = load(&c, secs("FATHOM_CLUSTER_LOAD_SECS", 60) / 4)
        .join()
        .unwrap();
    c.restart_ingesters(false).unwrap();
    check(&c, &report);
}

#[test]
fn cluster_metastore_leader_dies() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), &ClusterOptions::default()).unwrap();
    let duration = secs("FATHOM_CLUSTER_LOAD_SECS", 60) / 2;
    let h = load(&c, duration);
    std::thread::sleep(duration / 3);
    let old = c.leader_index().expect("a leader");
    c.metastores[old].kill();
    let t = Instant::now();
    let new = loop {
        if let Some(i) = c.leader_index()
            && i != old
        {
            break i;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no new leader");
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "new metastore leader (node {}) after {:.1} s",
        new + 1,
        t.elapsed().as_secs_f64()
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    let report = h.join().unwrap();
    check(&c, &report);
    // The old leader rejoins from its disk.
    c.metastores[old].start().unwrap();
    c.metastores[old]
        .wait_ready(Duration::from_secs(60))
        .unwrap();
    c.wait_ingesters(3, Duration::from_secs(30)).unwrap();
}

#[test]
fn cluster_compaction_keeps_answers_and_shrinks_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ClusterOptions {
        compaction_interval: Duration::from_secs(2),
        ..Default::default()
    };
    let mut c = Cluster::start(dir.path(), &opts).unwrap();
    // Stop the compactor while level-0 blocks pile up.
    c.compactor.stop().unwrap();
    let report = load(&c, Duration::from_secs(10)).join().unwrap();
    // Flush every head (SIGTERM), restart empty: blocks alone.
    c.restart_ingesters(true).unwrap();
    check(&c, &report);
    let before: Vec<_> = c.blocks("tenant-0").unwrap();
    let bytes = |b: &[fathom_block::BlockMeta]| b.iter().map(|m| m.stats.bytes).sum::<u64>();
    assert!(
        before.len() >= 3,
        "three replicas' level-0 blocks: {}",
        before.len()
    );
    c.compactor.start().unwrap();
    c.compactor.wait_ready(Duration::from_secs(60)).unwrap();
    let t = Instant::now();
    let after = loop {
        let b = c.blocks("tenant-0").unwrap();
        if b.len() == 1 && b[0].level >= 1 {
            break b;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "not compacted: {b:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    println!(
        "compaction: {} blocks, {} bytes -> {} block, {} bytes",
        before.len(),
        bytes(&before),
        after.len(),
        bytes(&after)
    );
    assert!(bytes(&after) < bytes(&before));
    check(&c, &report);
}

#[test]
fn cluster_tenants_are_isolated() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), &ClusterOptions::default()).unwrap();
    let report = load(&c, Duration::from_secs(5)).join().unwrap();
    check(&c, &report);
    let http = reqwest::blocking::Client::new();
    // tenant-1's services are invisible to tenant-0 and to a third tenant.
    for (tenant, other) in [("tenant-0", "tenant-1"), ("stranger", "tenant-0")] {
        let v: serde_json::Value = http
            .get(c.querier.url("/api/v1/label/service_name/values"))
            .header("X-Scope-OrgID", tenant)
            .query(&[
                ("start", "2023-12-31T00:00:00Z"),
                ("end", "2024-01-10T00:00:00Z"),
            ])
            .send()
            .unwrap()
            .json()
            .unwrap();
        // The label values are exactly the tenant's own services.
        let mut own: Vec<String> = report
            .acked
            .iter()
            .filter(|a| a.tenant == tenant)
            .map(|a| a.service.clone())
            .collect();
        own.sort();
        own.dedup();
        let mut seen: Vec<String> = v["values"]
            .as_array()
            .unwrap_or_else(|| panic!("no values: {v}"))
            .iter()
            .map(|x| x.as_str().unwrap().to_owned())
            .collect();
        seen.sort();
        assert_eq!(seen, own, "{tenant}'s service_name values");
        let theirs = folded(&c, tenant, "svc-0").unwrap();
        let want = loadgen::expected(&report.acked, "cpu/nanoseconds").unwrap();
        let mine = want
            .get(&(tenant.to_owned(), "svc-0".to_owned()))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            theirs, mine,
            "{tenant} sees only its own svc-0, not {other}'s"
        );
    }
}

/// Garage (a real S3 server) stops for 30 s under load: ingest keeps
/// acknowledging into the WALs, block uploads retry, nothing is lost once
/// it is back.
///
/// Ingesters cut a block every 5 s, so uploads are attempted (and fail,
/// counted by `fathom_ingester_block_upload_failures_total`) while Garage
/// is down; one ingester is also killed and restarted during the outage
/// (WAL replay with the bucket gone).
#[test]
fn cluster_object_store_outage() {
    let dir = tempfile::tempdir().unwrap();
    let mut garage = fathom_integration::garage::Garage::start(&dir.path().join("garage")).unwrap();
    let opts = ClusterOptions {
        store_args: garage.store_args(),
        flush_interval: Duration::from_secs(5),
        ..Default::default()
    };
    let mut c = Cluster::start(dir.path(), &opts).unwrap();
    let outage = secs("FATHOM_S3_OUTAGE_SECS", 30);
    let h = load(&c, outage + Duration::from_secs(15));
    std::thread::sleep(Duration::from_secs(7));
    let before = c.blocks("tenant-0").unwrap().len();
    assert!(before > 0, "blocks reach Garage before the outage");
    garage.stop();
    let t = Instant::now();
    c.ingesters[0].kill();
    c.ingesters[0].start().unwrap();
    c.ingesters[0].wait_ready(Duration::from_secs(60)).unwrap();
    std::thread::sleep(outage.saturating_sub(t.elapsed()));
    let failures: f64 = c
        .ingesters
        .iter()
        .map(|i| {
            i.metric("fathom_ingester_block_upload_failures_total")
                .unwrap()
        })
        .sum();
    assert!(
        failures > 0.0,
        "uploads were attempted and failed while Garage was down"
    );
    garage.restart().unwrap();
    let report = h.join().unwrap();
    assert!(
        report.failed.is_empty(),
        "ingest kept acknowledging during the outage: {:?}",
        report.failed
    );
    // The retried uploads land once Garage is back.
    let t = Instant::now();
    while c.blocks("tenant-0").unwrap().len() <= before {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "no block uploaded after Garage came back"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    check(&c, &report);
    // Flush everything into the bucket and read it from blocks alone.
    c.restart_ingesters(true).unwrap();
    check(&c, &report);
}
