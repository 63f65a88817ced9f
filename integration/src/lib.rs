//! A harness that starts the real `fathom` binary as a child process (the
//! way IOx's MiniCluster does), waits until it is ready, and talks to it
//! over HTTP and gRPC. Shared by every end-to-end test.

pub mod cluster;
pub mod garage;
pub mod loadgen;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("integration/ has a parent")
        .to_path_buf()
}

/// `../shared/testdata` relative to the workspace.
pub fn testdata() -> PathBuf {
    workspace().join("../shared/testdata")
}

/// The `fathom` binary: `$FATHOM_BIN`, else the one of the running test or
/// bench binary's profile, else `target/debug/fathom`.
pub fn fathom_bin() -> PathBuf {
    if let Some(b) = std::env::var_os("FATHOM_BIN") {
        return PathBuf::from(b);
    }
    // Next to the running test or bench binary (`<target>/<profile>/deps/`):
    // the `fathom` of the same profile.
    if let Ok(exe) = std::env::current_exe()
        && let Some(profile) = exe.parent().and_then(|deps| deps.parent())
        && profile.join("fathom").exists()
    {
        return profile.join("fathom");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    target.join("debug").join("fathom")
}

/// `type/unit` of a profile type (`name:type:unit:period_type:period_unit`):
/// how `go tool pprof` expectations name a sample type.
pub fn sample_type_key(profile_type: &str) -> String {
    let p: Vec<&str> = profile_type.split(':').collect();
    match (p.get(1), p.get(2)) {
        (Some(t), Some(u)) => format!("{t}/{u}"),
        _ => profile_type.to_owned(),
    }
}

/// `None` when two folded profiles are equal; otherwise a message naming
/// `what`, the stack counts and a few stacks that differ on each side.
pub fn folded_differs(
    what: &str,
    got: &BTreeMap<String, i64>,
    want: &BTreeMap<String, i64>,
) -> Option<String> {
    if got == want {
        return None;
    }
    let differ = |a: &BTreeMap<String, i64>, b: &BTreeMap<String, i64>| -> Vec<String> {
        a.iter()
            .filter(|(s, v)| b.get(*s) != Some(v))
            .take(3)
            .map(|(s, v)| format!("{s} {v}"))
            .collect()
    };
    Some(format!(
        "{what}: {} stacks vs {} expected; got-only {:?}; expected-only {:?}",
        got.len(),
        want.len(),
        differ(got, want),
        differ(want, got)
    ))
}

/// Runs `python3 -c script args...`; panics with its stderr when it
/// fails; returns its stdout.
pub fn python3_script<I, S>(script: &str, args: I) -> Vec<u8>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running python3: {e}"));
    assert!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Fails loudly, naming `what` is needed and how to get it, unless the
/// system `python3` imports `modules` (e.g. `"pyroscope, pyarrow"`).
pub fn require_python(modules: &str, what: &str) {
    let check = std::process::Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output()
        .unwrap_or_else(|e| panic!("python3 is required ({what}): {e}"));
    assert!(
        check.status.success(),
        "{what} is required (scripts/test-all.sh installs it): {}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// A free TCP port on loopback, for a process the test starts next.
///
/// The port is not held until that process binds it, so it is taken below
/// the kernel's ephemeral range: a port from binding to port 0 comes from
/// that range, from which every outgoing connection also draws its local
/// port, and a connection opened in between could take it (the process
/// then fails with "address in use"). Each call in this process gets a
/// port no earlier call got; processes start at different places.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&low| low > LOW + 1_000)
        .unwrap_or(32_768);
    let span = ephemeral_low - LOW;
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (start + n) % span;
        let port = u16::try_from(port).expect("ports below the ephemeral range fit in u16");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on loopback below {ephemeral_low}")
}

/// A running `fathom all`, killed on drop.
pub struct Fathom {
    child: Option<Child>,
    pub port: u16,
    pub data_dir: PathBuf,
    pub http: reqwest::blocking::Client,
    log: PathBuf,
    extra: Vec<String>,
    /// `RUST_LOG` for the process; `None` leaves it unset (the default
    /// filter a user gets).
    rust_log: Option<String>,
}

impl Fathom {
    /// Starts `fathom all` on a free loopback port with `data_dir`.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Result<Fathom> {
        Self::start_logging(data_dir, extra, Some("info"))
    }

    /// As [`Fathom::start`], with `RUST_LOG` set to `rust_log`, or unset.
    pub fn start_logging(
        data_dir: &Path,
        extra: &[&str],
        rust_log: Option<&str>,
    ) -> Result<Fathom> {
        let mut f = Fathom {
            child: None,
            port: free_port(),
            data_dir: data_dir.to_owned(),
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
            log: data_dir.join("fathom.log"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            rust_log: rust_log.map(str::to_owned),
        };
        f.spawn()?;
        Ok(f)
    }

    fn spawn(&mut self) -> Result<()> {
        std::fs::create_dir_all(&self.data_dir)?;
        let bin = fathom_bin();
        if !bin.exists() {
            bail!(
                "{} is missing: build it with cargo build -p fathom",
                bin.display()
            );
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new(&bin);
        match &self.rust_log {
            Some(l) => cmd.env("RUST_LOG", l),
            None => cmd.env_remove("RUST_LOG"),
        };
        // Traces only where the test's flags say.
        for k in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "FATHOM_OTLP_TRACES_ENDPOINT",
        ] {
            cmd.env_remove(k);
        }
        let child = cmd
            .arg("all")
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.extra)
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(60))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let t0 = Instant::now();
        loop {
            if let Some(c) = self.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                bail!("fathom exited with {status} before ready:\n{}", self.log());
            }
            if let Ok(r) = self.http.get(self.url("/ready")).send()
                && r.status().is_success()
            {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                bail!("fathom not ready after {timeout:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits for a clean exit (the heads are flushed).
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            let pid = c.id().to_string();
            Command::new("kill").args(["-TERM", &pid]).status()?;
            let t0 = Instant::now();
            loop {
                if let Some(s) = c.try_wait()? {
                    if !s.success() {
                        bail!("fathom exited with {s}:\n{}", self.log());
                    }
                    return Ok(());
                }
                if t0.elapsed() > Duration::from_secs(90) {
                    let _ = c.kill();
                    bail!("fathom did not stop after SIGTERM:\n{}", self.log());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// SIGKILL: no flush.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops (SIGTERM) and starts again on the same port and data.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.spawn()
    }

    /// Starts again after [`Fathom::kill`].
    pub fn start_again(&mut self) -> Result<()> {
        self.spawn()
    }

    /// POST /ingest; returns (status, body).
    pub fn ingest(
        &self,
        tenant: Option<&str>,
        query: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<(u16, String)> {
        let mut rb = self.http.post(self.url("/ingest")).query(query).body(body);
        if let Some(t) = tenant {
            rb = rb.header("X-Scope-OrgID", t);
        }
        let r = rb.send()?;
        Ok((r.status().as_u16(), r.text()?))
    }

    /// GET with query parameters; returns (status, body).
    pub fn get(
        &self,
        tenant: Option<&str>,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<(u16, Vec<u8>)> {
        let mut rb = self.http.get(self.url(path)).query(query);
        if let Some(t) = tenant {
            rb = rb.header("X-Scope-OrgID", t);
        }
        let r = rb.send()?;
        Ok((r.status().as_u16(), r.bytes()?.to_vec()))
    }

    /// GET that must succeed, as JSON.
    pub fn get_json(
        &self,
        tenant: Option<&str>,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<serde_json::Value> {
        let (s, b) = self.get(tenant, path, query)?;
        if s != 200 {
            bail!("GET {path} {query:?}: {s}: {}", String::from_utf8_lossy(&b));
        }
        Ok(serde_json::from_slice(&b)?)
    }

    /// The series of one service between `start` and `end`
    /// (`/api/v1/series`), as JSON objects of their labels.
    pub fn series(
        &self,
        tenant: Option<&str>,
        service: &str,
        start: &str,
        end: &str,
    ) -> Result<Vec<serde_json::Value>> {
        let query = format!("{{service_name=\"{service}\"}}");
        let v = self.get_json(
            tenant,
            "/api/v1/series",
            &[("query", &query), ("start", start), ("end", end)],
        )?;
        match v["series"].as_array() {
            Some(a) => Ok(a.clone()),
            None => bail!("/api/v1/series answered without a series list: {v}"),
        }
    }

    /// A merged profile in folded form: stack → value.
    pub fn folded(
        &self,
        tenant: Option<&str>,
        query: &str,
        start: &str,
        end: &str,
    ) -> Result<BTreeMap<String, i64>> {
        let (s, b) = self.get(
            tenant,
            "/api/v1/query",
            &[
                ("query", query),
                ("start", start),
                ("end", end),
                ("format", "folded"),
            ],
        )?;
        if s != 200 {
            bail!("query {query}: {s}: {}", String::from_utf8_lossy(&b));
        }
        parse_folded(&String::from_utf8(b)?)
    }

    /// A metric's value from /metrics (first sample whose name matches).
    pub fn metric(&self, name: &str) -> Result<f64> {
        let text = self.http.get(self.url("/metrics")).send()?.text()?;
        metric_value(&text, name)
    }
}

impl Drop for Fathom {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The first sample of metric `name` in an OpenMetrics text.
pub fn metric_value(text: &str, name: &str) -> Result<f64> {
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(name)
            && (rest.starts_with(' ') || rest.starts_with('{'))
            && let Some(v) = rest.rsplit(' ').next()
        {
            return Ok(v.parse()?);
        }
    }
    bail!("metric {name} not found")
}

/// Parses `stack value` lines (value after the last space).
pub fn parse_folded(text: &str) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (stack, v) = line
            .rsplit_once(' ')
            .with_context(|| format!("folded line without a value: {line:?}"))?;
        *out.entry(stack.to_owned()).or_insert(0) += v.parse::<i64>()?;
    }
    Ok(out)
}

/// An expectation file: `(sample_type/unit) → stack → value`.
pub fn read_expectation(path: &Path) -> Result<BTreeMap<String, BTreeMap<String, i64>>> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path)?).read_to_string(&mut text)?;
    let mut out: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        // Function names may hold tabs: the type is the first field and the
        // value the last.
        let (Some((t, rest)), true) = (line.split_once('\t'), line.matches('\t').count() >= 2)
        else {
            bail!("bad expectation line {line:?} in {}", path.display());
        };
        let Some((stack, v)) = rest.rsplit_once('\t') else {
            bail!("bad expectation line {line:?} in {}", path.display());
        };
        *out.entry(t.to_owned())
            .or_default()
            .entry(stack.to_owned())
            .or_insert(0) += v.parse::<i64>()?;
    }
    Ok(out)
}

/// One row of `pprof/MANIFEST.tsv`.
#[derive(Clone, Debug)]
pub struct CorpusFile {
    pub file: String,
    pub path: PathBuf,
    pub expected: Option<PathBuf>,
}

/// Every file of the pprof corpus.
pub fn corpus() -> Result<Vec<CorpusFile>> {
    let dir = testdata().join("pprof");
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv"))
        .with_context(|| format!("reading {}/MANIFEST.tsv", dir.display()))?;
    let mut lines = manifest.lines();
    let header: Vec<&str> = lines
        .next()
        .context("empty manifest")?
        .split('\t')
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (fi, ei) = (
        col("file").context("file column")?,
        col("expected").context("expected column")?,
    );
    let mut out = Vec::new();
    for l in lines {
        let f: Vec<&str> = l.split('\t').collect();
        let file = f.get(fi).copied().unwrap_or_default().to_owned();
        let expected = f.get(ei).filter(|e| !e.is_empty()).map(|e| dir.join(e));
        out.push(CorpusFile {
            path: dir.join(&file),
            file,
            expected,
        });
    }
    Ok(out)
}

/// A unary gRPC call of raw bytes (an encoded request message) to `path`
/// with `metadata`, gzip-compressed if asked; the reply's bytes are
/// dropped. For tests that send what a generated client cannot (bad
/// messages, other protocols' layouts) or that need no generated code.
pub fn grpc_raw(
    url: &str,
    path: &'static str,
    metadata: &[(&'static str, String)],
    body: Vec<u8>,
    gzip: bool,
) -> Result<(), tonic::Status> {
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    #[derive(Clone, Copy, Default)]
    struct Raw;
    impl Codec for Raw {
        type Encode = Vec<u8>;
        type Decode = ();
        type Encoder = Raw;
        type Decoder = Raw;
        fn encoder(&mut self) -> Raw {
            Raw
        }
        fn decoder(&mut self) -> Raw {
            Raw
        }
    }
    impl Encoder for Raw {
        type Item = Vec<u8>;
        type Error = tonic::Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
            use bytes::BufMut;
            dst.put_slice(&item);
            Ok(())
        }
    }
    impl Decoder for Raw {
        type Item = ();
        type Error = tonic::Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
            use bytes::Buf;
            src.advance(src.remaining());
            Ok(Some(()))
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| tonic::Status::internal(format!("a runtime for the call: {e}")))?;
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(|e| tonic::Status::invalid_argument(format!("{url}: {e}")))?
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("connecting to {url}: {e}")))?;
        let mut g = tonic::client::Grpc::new(ch);
        if gzip {
            g = g.send_compressed(tonic::codec::CompressionEncoding::Gzip);
        }
        g.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("{url}: {e}")))?;
        let mut req = tonic::Request::new(body);
        for (k, v) in metadata {
            let v = v
                .parse()
                .map_err(|_| tonic::Status::invalid_argument(format!("metadata {k}: {v:?}")))?;
            req.metadata_mut().insert(*k, v);
        }
        g.unary::<Vec<u8>, (), Raw>(
            req,
            tonic::codegen::http::uri::PathAndQuery::from_static(path),
            Raw,
        )
        .await
        .map(|_| ())
    })
}
