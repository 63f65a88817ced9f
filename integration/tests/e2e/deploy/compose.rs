//! `deploy/docker-compose.yml` from a clean Docker state: every service
//! healthy (the health checks read /ready's HTTP status), the agent's
//! profiles of this host queryable through the querier, a known write read
//! back exactly once, and both still there after `docker-compose restart`.

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fathom_integration::loadgen::Ack;
use fathom_integration::{free_port, testdata};

use super::{TAG, deploy_dir, docker_lock, images, require_docker, run};
use crate::cluster::{BASE_S, CPU, FILES, check_acked, folded_query};

/// The agent's `node` label in this cluster.
const NODE: &str = "compose-e2e";

/// A compose project, taken down (volumes too) on drop.
struct Compose {
    /// `docker-compose` (1.29), or `docker` with the compose plugin.
    program: Vec<&'static str>,
    project: String,
    http_port: u16,
    push_port: u16,
}

impl Compose {
    fn new() -> Compose {
        require_docker();
        let works = |p: &[&str]| {
            Command::new(p[0])
                .args(&p[1..])
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let program = [vec!["docker-compose"], vec!["docker", "compose"]]
            .into_iter()
            .find(|p| works(p))
            .unwrap_or_else(|| {
                panic!(
                    "the compose test needs docker-compose (apt-get install docker-compose) \
                     or the docker compose plugin, and neither runs"
                )
            });
        Compose {
            program,
            project: format!("fathom-e2e-{}", std::process::id()),
            http_port: free_port(),
            push_port: free_port(),
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(self.program[0]);
        c.args(&self.program[1..])
            .arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(deploy_dir().join("docker-compose.yml"))
            .args(args)
            .env("FATHOM_IMAGE_TAG", TAG)
            .env("FATHOM_HTTP_PORT", self.http_port.to_string())
            .env("FATHOM_PUSH_PORT", self.push_port.to_string())
            .env("FATHOM_AGENT_NODE", NODE);
        c
    }

    fn run(&self, args: &[&str]) -> String {
        run(&mut self.cmd(args))
    }

    fn logs(&self) -> String {
        self.cmd(&["logs", "--no-color", "--tail", "30"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// `name status health` of every container of the project.
    fn states(&self) -> Vec<String> {
        let ids: Vec<String> = self.run(&["ps", "-q"]).lines().map(str::to_owned).collect();
        if ids.is_empty() {
            return Vec::new();
        }
        let out = Command::new("docker")
            .args([
                "inspect",
                "-f",
                "{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}no-healthcheck{{end}}",
            ])
            .args(&ids)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits until all `n` containers are running and healthy.
    fn wait_healthy(&self, n: usize, timeout: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let s = self.states();
            if s.len() == n && s.iter().all(|l| l.ends_with(" running healthy")) {
                return t0.elapsed();
            }
            if t0.elapsed() > timeout {
                panic!(
                    "the compose cluster is not healthy after {timeout:?}:\n{}\n{}",
                    s.join("\n"),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn querier(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("compose logs:\n{}", self.logs());
        }
        let _ = self
            .cmd(&["down", "-v", "--remove-orphans", "-t", "5"])
            .output();
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Total CPU of the agent's profiles of this host between `from` and
/// `until` (unix ms), and how many stacks.
fn agent_cpu(querier: &str, from: i64, until: i64) -> Result<(i64, usize), String> {
    let query = format!("{CPU}{{node=\"{NODE}\"}}");
    let stacks = folded_query(querier, None, &query, &from.to_string(), &until.to_string())?;
    Ok((stacks.values().sum(), stacks.len()))
}

#[test]
fn compose_cluster_from_clean_state_serves_the_agent_and_survives_restart() {
    let _one = docker_lock();
    let c = Compose::new();
    images();
    // A clean state: nothing of an earlier run of this project.
    c.run(&["down", "-v", "--remove-orphans", "-t", "5"]);
    let services = c.run(&["config", "--services"]).lines().count();
    assert_eq!(
        services, 12,
        "garage, 3 metastores, 3 ingesters, 2 distributors, querier, compactor, agent"
    );

    let t0 = Instant::now();
    c.run(&["up", "-d"]);
    c.wait_healthy(services, Duration::from_secs(300));
    let ready = t0.elapsed();
    println!(
        "compose cluster: {services} services healthy {:.1} s after `up` from a clean state",
        ready.as_secs_f64()
    );
    let started_ms = now_ms() - 60_000;

    // A write through the published distributor port, read back exactly once.
    let ack = Ack {
        tenant: "compose-e2e".into(),
        service: "svc-0".into(),
        file: FILES[0].into(),
        time_s: BASE_S,
    };
    let body = std::fs::read(testdata().join("pprof").join(&ack.file)).unwrap();
    let http = reqwest::blocking::Client::new();
    let r = http
        .post(format!("http://127.0.0.1:{}/ingest", c.push_port))
        .header("X-Scope-OrgID", &ack.tenant)
        .query(&[
            ("name", ack.service.as_str()),
            ("format", "pprof"),
            ("from", &ack.time_s.to_string()),
            ("until", &(ack.time_s + 10).to_string()),
        ])
        .body(body)
        .send()
        .unwrap();
    assert!(
        r.status().is_success(),
        "push: {} {:?}",
        r.status(),
        r.text()
    );
    check_acked(&c.querier(), std::slice::from_ref(&ack));

    // The agent's profiles of this host's processes.
    let t = Instant::now();
    let (before, stacks) = loop {
        match agent_cpu(&c.querier(), started_ms, now_ms()) {
            Ok((total, n)) if total > 0 => break (total, n),
            other => {
                if t.elapsed() > Duration::from_secs(180) {
                    panic!(
                        "no profile of the agent (node={NODE}) after {:?}: {other:?}\n{}",
                        t.elapsed(),
                        c.logs()
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    let window_end = now_ms();
    println!(
        "agent profiles queryable {:.1} s after ready: {stacks} stacks, {:.2} s of CPU",
        t.elapsed().as_secs_f64(),
        before as f64 / 1e9
    );

    // Restart everything: the data stays (volumes, WALs, the bucket).
    let t = Instant::now();
    c.run(&["restart"]);
    c.wait_healthy(services, Duration::from_secs(300));
    println!(
        "`docker-compose restart`: healthy again after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    check_acked(&c.querier(), std::slice::from_ref(&ack));
    let (after, _) = agent_cpu(&c.querier(), started_ms, window_end).unwrap();
    println!(
        "after restart: the write read back exactly once; agent CPU in the same window {:.2} s (before: {:.2} s)",
        after as f64 / 1e9,
        before as f64 / 1e9
    );
    // Profiles timed inside the window may still have arrived after the
    // first read (the agent pushes every 10 s), never fewer.
    assert!(
        after >= before,
        "agent data lost across the restart: {after} < {before}"
    );
}
