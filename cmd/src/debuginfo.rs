//! `fathom debuginfo`: upload, list and delete the debug info a Fathom
//! server symbolizes stripped binaries with (`docs/symbols.md`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

#[derive(Args)]
pub(crate) struct DebuginfoArgs {
    /// The Fathom server (a querier, or `fathom all`).
    #[arg(
        long,
        env = "FATHOM_URL",
        default_value = "http://localhost:7400",
        global = true
    )]
    url: String,
    /// Tenant (sent as X-Scope-OrgID); unset: the anonymous tenant.
    #[arg(long, env = "FATHOM_TENANT", global = true)]
    tenant: Option<String>,
    #[command(subcommand)]
    command: DebuginfoCommand,
}

#[derive(Subcommand)]
enum DebuginfoCommand {
    /// Uploads ELF files (separate debug files or unstripped binaries) by
    /// their GNU build id; files the server already has are skipped.
    Upload {
        /// Upload even when the server already has the build id.
        #[arg(long)]
        force: bool,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Lists the tenant's debug info files.
    List,
    /// Deletes debug info files by build id.
    Delete {
        #[arg(required = true)]
        build_ids: Vec<String>,
    },
}

/// Files above this size show upload progress.
const PROGRESS_ABOVE: usize = 8 << 20;
const CHUNK: usize = 1 << 20;

pub(crate) async fn run(a: DebuginfoArgs) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let base = format!("{}/api/v1/debuginfo", a.url.trim_end_matches('/'));
    let with_tenant = |r: reqwest::RequestBuilder| match &a.tenant {
        Some(t) => r.header("X-Scope-OrgID", t),
        None => r,
    };
    match a.command {
        DebuginfoCommand::Upload { force, files } => {
            let mut failed = 0;
            for path in &files {
                if let Err(e) = upload(&http, &base, &with_tenant, path, force).await {
                    eprintln!("{}: {e:#}", path.display());
                    failed += 1;
                }
            }
            if failed > 0 {
                bail!("{failed} of {} files failed", files.len());
            }
        }
        DebuginfoCommand::List => {
            let resp = with_tenant(http.get(&base)).send().await?;
            let body = answer(resp).await?;
            let v: serde_json::Value = serde_json::from_str(&body)?;
            println!(
                "{:<42} {:>12} {:<7} {:<10} {:<21} NAME",
                "BUILD ID", "SIZE", "KIND", "SOURCE", "STORED"
            );
            for f in v["files"].as_array().into_iter().flatten() {
                println!(
                    "{:<42} {:>12} {:<7} {:<10} {:<21} {}",
                    f["build_id"].as_str().unwrap_or("?"),
                    f["size"].as_u64().unwrap_or(0),
                    f["kind"].as_str().unwrap_or("?"),
                    f["source"].as_str().unwrap_or("?"),
                    f["stored_at"].as_str().unwrap_or("?"),
                    f["name"].as_str().unwrap_or(""),
                );
            }
        }
        DebuginfoCommand::Delete { build_ids } => {
            for b in build_ids {
                let resp = with_tenant(http.delete(format!("{base}/{b}")))
                    .send()
                    .await?;
                answer(resp)
                    .await
                    .with_context(|| format!("deleting {b}"))?;
                println!("deleted {b}");
            }
        }
    }
    Ok(())
}

async fn upload(
    http: &reqwest::Client,
    base: &str,
    with_tenant: &impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    path: &PathBuf,
    force: bool,
) -> anyhow::Result<()> {
    let data = tokio::fs::read(path).await.context("reading")?;
    let info = fathom_symbols::inspect(&data)?;
    let url = format!("{base}/{}", info.build_id);
    if !force {
        let resp = with_tenant(http.get(&url)).send().await?;
        if resp.status().is_success() {
            println!(
                "{}: {} already on the server, skipped",
                path.display(),
                info.build_id
            );
            return Ok(());
        }
    }
    let size = data.len();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let started = Instant::now();
    let body = if size > PROGRESS_ABOVE {
        let shown = path.display().to_string();
        let bytes = bytes::Bytes::from(data);
        let chunks: Vec<bytes::Bytes> = (0..size)
            .step_by(CHUNK)
            .map(|at| bytes.slice(at..(at + CHUNK).min(size)))
            .collect();
        let mut sent = 0usize;
        let mut last_tenth = 0;
        let stream = futures::stream::iter(chunks.into_iter().map(move |c| {
            sent += c.len();
            let tenth = sent * 10 / size;
            if tenth > last_tenth {
                last_tenth = tenth;
                eprintln!("{shown}: {}% of {size} bytes", tenth * 10);
            }
            Ok::<_, std::io::Error>(c)
        }));
        reqwest::Body::wrap_stream(stream)
    } else {
        reqwest::Body::from(data)
    };
    let resp = with_tenant(http.put(&url))
        .query(&[("name", name.as_str())])
        .header(reqwest::header::CONTENT_LENGTH, size)
        .body(body)
        .send()
        .await?;
    answer(resp).await?;
    println!(
        "{}: uploaded {} ({:?}, {size} bytes) in {:.1?}",
        path.display(),
        info.build_id,
        info.kind,
        started.elapsed()
    );
    Ok(())
}

/// The body of a successful answer, else an error with the server's message.
async fn answer(resp: reqwest::Response) -> anyhow::Result<String> {
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if !status.is_success() {
        let msg = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or(body);
        bail!("server answered {status}: {}", msg.trim());
    }
    Ok(body)
}
