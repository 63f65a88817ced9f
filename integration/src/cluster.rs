//! A real cluster on loopback: every role its own `fathom` process (3
//! metastore nodes, 2 distributors, 3 ingesters, a querier, a compactor)
//! sharing one filesystem bucket (or an S3 endpoint), started, killed and
//! restarted by the tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{fathom_bin, free_port};

/// One `fathom <role>` process.
pub struct Proc {
    pub name: String,
    pub port: u16,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Starts `fathom <args…> --listen 127.0.0.1:<port>` with the cluster
    /// secret `secret` in its environment; does not wait.
    pub fn spawn(
        name: &str,
        port: u16,
        args: Vec<String>,
        secret: &str,
        log: PathBuf,
    ) -> Result<Proc> {
        let mut p = Proc {
            name: name.to_owned(),
            port,
            args,
            env: vec![("FATHOM_CLUSTER_SECRET".into(), secret.to_owned())],
            log,
            child: None,
        };
        p.start()?;
        Ok(p)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// (Re)starts with the same arguments.
    pub fn start(&mut self) -> Result<()> {
        let bin = fathom_bin();
        if !bin.exists() {
            bail!("{} is missing: build it with cargo build", bin.display());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&bin)
            .args(&self.args)
            .arg("--listen")
            .arg(self.addr())
            .env("RUST_LOG", "info")
            .env_remove("FATHOM_CLUSTER_SECRET")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // Traces go where the test says (ClusterOptions::all_args), not
            // where the caller's environment points.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("FATHOM_OTLP_TRACES_ENDPOINT")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", self.name))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits for `GET /ready` to answer 200.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let t0 = Instant::now();
        loop {
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!("{} exited with {status}:\n{}", self.name, self.log());
            }
            if let Ok(r) = http.get(self.url("/ready")).send()
                && r.status().is_success()
            {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                bail!("{} not ready after {timeout:?}:\n{}", self.name, self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (ingesters flush their heads).
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status()?;
            let t0 = Instant::now();
            loop {
                if let Some(s) = c.try_wait()? {
                    if !s.success() {
                        bail!("{} exited with {s}:\n{}", self.name, self.log());
                    }
                    return Ok(());
                }
                if t0.elapsed() > Duration::from_secs(120) {
                    let _ = c.kill();
                    bail!("{} did not stop after SIGTERM", self.name);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// A metric's value from /metrics (the first sample of that name).
    pub fn metric(&self, name: &str) -> Result<f64> {
        let text = reqwest::blocking::get(self.url("/metrics"))?.text()?;
        crate::metric_value(&text, name)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The whole cluster.
pub struct Cluster {
    pub dir: PathBuf,
    /// The cluster secret every process gets (in `FATHOM_CLUSTER_SECRET`).
    pub secret: String,
    pub metastores: Vec<Proc>,
    pub ingesters: Vec<Proc>,
    pub distributors: Vec<Proc>,
    pub querier: Proc,
    pub compactor: Proc,
}

/// Settings of a test cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Extra flags of every role but the metastore (e.g. an S3 store).
    pub store_args: Vec<String>,
    pub member_timeout: Duration,
    pub compaction_interval: Duration,
    /// Ingesters cut blocks this often.
    pub flush_interval: Duration,
    /// Extra flags of every process, metastores included (e.g.
    /// `--otlp-traces-endpoint`).
    pub all_args: Vec<String>,
    /// Also wait, after every process reports ready, until the metastore
    /// lists the three ingesters as live (off: trust `/ready` alone, as a
    /// user or an orchestrator does).
    pub wait_ring: bool,
    /// Extra flags of the compactor.
    pub compactor_args: Vec<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            store_args: Vec::new(),
            member_timeout: Duration::from_secs(6),
            compaction_interval: Duration::from_secs(3600),
            flush_interval: Duration::from_secs(3600),
            all_args: Vec::new(),
            wait_ring: true,
            compactor_args: Vec::new(),
        }
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

impl Cluster {
    /// Starts everything and waits until each process is ready and the
    /// distributors see the three ingesters.
    pub fn start(dir: &Path, opts: &ClusterOptions) -> Result<Cluster> {
        let dir = dir.to_owned();
        std::fs::create_dir_all(&dir)?;
        let secret = format!(
            "test-secret-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
        );
        let log = |n: &str| dir.join(format!("{n}.log"));
        let mports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let peers = mports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let meta_list = mports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let member_timeout = format!("{}ms", opts.member_timeout.as_millis());
        let mut metastores = Vec::new();
        for (i, p) in mports.iter().enumerate() {
            let name = format!("metastore-{}", i + 1);
            let mut args = s(&["metastore", "--node-id"]);
            args.push((i + 1).to_string());
            args.extend(s(&["--peers", &peers, "--member-timeout", &member_timeout]));
            args.push("--data-dir".into());
            args.push(dir.join(&name).display().to_string());
            args.extend(opts.all_args.clone());
            metastores.push(Proc::spawn(&name, *p, args, &secret, log(&name))?);
        }
        let bucket = dir.join("bucket");
        let common = s(&["--metastore", &meta_list, "--heartbeat-interval", "1s"]);
        let store = if opts.store_args.is_empty() {
            s(&["--store-path", &bucket.display().to_string()])
        } else {
            opts.store_args.clone()
        };
        let role = |role: &str, name: &str, extra: &[&str]| -> Result<Proc> {
            let mut args = s(&[role, "--name", name]);
            args.extend(common.clone());
            if role != "distributor" {
                args.extend(store.clone());
                args.push("--data-dir".into());
                args.push(dir.join(name).display().to_string());
            }
            args.extend(s(extra));
            args.extend(opts.all_args.clone());
            Proc::spawn(name, free_port(), args, &secret, log(name))
        };
        let mut ingesters = Vec::new();
        let flush = format!("{}ms", opts.flush_interval.as_millis());
        for i in 0..3 {
            ingesters.push(role(
                "ingester",
                &format!("ingester-{i}"),
                &["--flush-interval", &flush],
            )?);
        }
        let mut distributors = Vec::new();
        for i in 0..2 {
            distributors.push(role("distributor", &format!("distributor-{i}"), &[])?);
        }
        let querier = role("querier", "querier", &[])?;
        let interval = format!("{}ms", opts.compaction_interval.as_millis());
        // Replaced blocks' files outlive their replacement by a few
        // seconds (15 minutes by default): a query that listed them just
        // before a compaction still reads them, as it would in production.
        // With no delay it would fail, naming the file.
        let mut compactor_args = vec!["--compaction-interval", &interval, "--delete-delay", "5s"];
        compactor_args.extend(opts.compactor_args.iter().map(String::as_str));
        let compactor = role("compactor", "compactor", &compactor_args)?;
        let mut c = Cluster {
            dir,
            secret,
            metastores,
            ingesters,
            distributors,
            querier,
            compactor,
        };
        for p in c.all_mut() {
            p.wait_ready(Duration::from_secs(60))?;
        }
        if opts.wait_ring {
            c.wait_ingesters(3, Duration::from_secs(30))?;
            // A distributor is ready once it knows a quorum (2), and lists
            // the ingesters about once a second: a write right after start
            // could still go to two replicas.
            c.wait_views(3, Duration::from_secs(30))?;
        }
        Ok(c)
    }

    fn all_mut(&mut self) -> impl Iterator<Item = &mut Proc> {
        self.metastores
            .iter_mut()
            .chain(self.ingesters.iter_mut())
            .chain(self.distributors.iter_mut())
            .chain(std::iter::once(&mut self.querier))
            .chain(std::iter::once(&mut self.compactor))
    }

    /// Stops (SIGTERM: heads flushed) or kills (SIGKILL: WAL replay) every
    /// ingester, starts them again, and waits until all three are live.
    pub fn restart_ingesters(&mut self, graceful: bool) -> Result<()> {
        for i in &mut self.ingesters {
            if graceful {
                i.stop()?;
            } else {
                i.kill();
            }
        }
        for i in &mut self.ingesters {
            i.start()?;
        }
        for i in &mut self.ingesters {
            i.wait_ready(Duration::from_secs(60))?;
        }
        self.wait_ingesters(3, Duration::from_secs(30))
    }

    /// Metastore addresses, comma-separated.
    pub fn metastore_list(&self) -> String {
        self.metastores
            .iter()
            .map(Proc::addr)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A metastore client (blocking calls run on their own runtime).
    fn call<T>(
        &self,
        f: impl AsyncFnOnce(fathom_metastore::MetastoreClient) -> Result<T>,
    ) -> Result<T> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let addrs: Vec<String> = self.metastores.iter().map(Proc::addr).collect();
        let opts = fathom_metastore::ClientOptions {
            secret: fathom_api::secret::ClusterSecret::new(&self.secret)?,
            ..Default::default()
        };
        rt.block_on(async move {
            let c = fathom_metastore::MetastoreClient::with_options(addrs, opts)?;
            f(c).await
        })
    }

    /// Ingesters the metastore considers live.
    pub fn live_ingesters(&self) -> Result<Vec<String>> {
        self.call(async |c| {
            let mut ids: Vec<String> = c
                .members(Some(fathom_metastore::Role::Ingester))
                .await?
                .into_iter()
                .map(|m| m.id)
                .collect();
            ids.sort();
            Ok(ids)
        })
    }

    /// Blocks in the index for `tenant`.
    pub fn blocks(&self, tenant: &str) -> Result<Vec<fathom_block::BlockMeta>> {
        let tenant = tenant.to_owned();
        self.call(async move |c| Ok(c.blocks(&tenant, i64::MIN, i64::MAX).await?))
    }

    /// Waits until the metastore reports `n` live ingesters.
    pub fn wait_ingesters(&self, n: usize, timeout: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if self.live_ingesters().map(|v| v.len()).unwrap_or(usize::MAX) == n {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                bail!(
                    "the metastore does not report {n} live ingesters after {timeout:?}: {:?}",
                    self.live_ingesters()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until every distributor's and the querier's ring view holds
    /// `n` ingesters (the last "ingester ring changed" line of its log).
    pub fn wait_views(&self, n: usize, timeout: Duration) -> Result<()> {
        let t0 = Instant::now();
        let want = format!("ingesters={n}");
        for p in self
            .distributors
            .iter()
            .chain(std::iter::once(&self.querier))
        {
            loop {
                let log = p.log();
                let last = log.lines().rfind(|l| l.contains("ingester ring changed"));
                if last.is_some_and(|l| l.contains(&want)) {
                    break;
                }
                if t0.elapsed() > timeout {
                    bail!(
                        "{} does not see {n} ingesters after {timeout:?}: {last:?}",
                        p.name
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The metastore node that reports itself leader.
    pub fn leader(&self) -> Result<&Proc> {
        self.metastores
            .iter()
            .find(|m| m.metric("fathom_metastore_is_leader").unwrap_or(0.0) == 1.0)
            .context("no metastore leader")
    }

    pub fn leader_index(&self) -> Option<usize> {
        self.metastores
            .iter()
            .position(|m| m.metric("fathom_metastore_is_leader").unwrap_or(0.0) == 1.0)
    }
}
