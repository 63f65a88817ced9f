//! A real S3 server for the tests: a single Garage node (`cargo install
//! garage --locked`) on loopback, with SQLite metadata and replication
//! factor 1, given a bucket and a key.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::free_port;

pub struct Garage {
    dir: PathBuf,
    config: PathBuf,
    child: Option<Child>,
    pub s3_port: u16,
    pub bucket: String,
    pub key_id: String,
    pub secret: String,
}

fn garage_bin() -> Result<PathBuf> {
    let candidates = [
        std::env::var_os("GARAGE").map(PathBuf::from),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin/garage")),
        Some(PathBuf::from("/usr/local/bin/garage")),
    ];
    for c in candidates.into_iter().flatten() {
        if c.exists() {
            return Ok(c);
        }
    }
    which("garage").context(
        "the garage S3 server is required for object-storage tests: cargo install garage --locked (scripts/test-all.sh installs it)",
    )
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.exists())
    })
}

impl Garage {
    /// Starts a node, lays it out, and creates a bucket and a key.
    pub fn start(dir: &Path) -> Result<Garage> {
        let dir = dir.to_owned();
        std::fs::create_dir_all(&dir)?;
        let (s3, rpc, admin) = (free_port(), free_port(), free_port());
        let secret: String = (0..32)
            .map(|i| format!("{:02x}", (i * 37 + 11) as u8))
            .collect();
        let config = dir.join("garage.toml");
        std::fs::write(
            &config,
            format!(
                r#"metadata_dir = "{meta}"
data_dir = "{data}"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:{s3}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{admin}"
"#,
                meta = dir.join("meta").display(),
                data = dir.join("data").display(),
            ),
        )?;
        let mut g = Garage {
            dir,
            config,
            child: None,
            s3_port: s3,
            bucket: "fathom".into(),
            key_id: String::new(),
            secret: String::new(),
        };
        g.run_server()?;
        // Layout: this node holds everything.
        let status = g.cli(&["status"])?;
        let node = status
            .lines()
            .find_map(|l| {
                let id = l.split_whitespace().next()?;
                (id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_owned())
            })
            .with_context(|| format!("no node id in `garage status`:\n{status}"))?;
        g.cli(&["layout", "assign", "-z", "dc1", "-c", "1G", &node])?;
        g.cli(&["layout", "apply", "--version", "1"])?;
        g.cli(&["bucket", "create", "fathom"])?;
        let key = g.cli(&["key", "create", "fathom-key"])?;
        let field = |name: &str| -> Result<String> {
            key.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim().eq_ignore_ascii_case(name)).then(|| v.trim().to_owned())
                })
                .with_context(|| format!("no {name} in `garage key create`:\n{key}"))
        };
        g.key_id = field("Key ID")?;
        g.secret = field("Secret key")?;
        g.cli(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            "fathom",
            "--key",
            "fathom-key",
        ])?;
        Ok(g)
    }

    fn run_server(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("garage.log"))?;
        let child = Command::new(garage_bin()?)
            .arg("-c")
            .arg(&self.config)
            .arg("server")
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting garage")?;
        self.child = Some(child);
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.s3_port)).is_err() {
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("garage did not open its S3 port:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn cli(&self, args: &[&str]) -> Result<String> {
        let t0 = Instant::now();
        loop {
            let out = Command::new(garage_bin()?)
                .arg("-c")
                .arg(&self.config)
                .args(args)
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            if out.status.success() {
                return Ok(text);
            }
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("garage {args:?} failed:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("garage.log")).unwrap_or_default()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    /// The `fathom` flags for this bucket.
    pub fn store_args(&self) -> Vec<String> {
        [
            "--object-store",
            "s3",
            "--s3-endpoint",
            &self.endpoint(),
            "--s3-bucket",
            &self.bucket,
            "--s3-region",
            "garage",
            "--s3-access-key-id",
            &self.key_id,
            "--s3-secret-access-key",
            &self.secret,
            "--s3-allow-http",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// SIGKILL (the S3 endpoint goes away).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the same node again.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.run_server()
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        self.stop();
    }
}
