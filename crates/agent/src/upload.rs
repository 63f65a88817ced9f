//! `--upload-debuginfo` (with `--symbolize=server`): the binaries the agent
//! finds mapped on the host that carry their own symbols (DWARF, `.symtab`
//! or a Go `.gopclntab`) are uploaded to the server's debug info store
//! (`PUT /api/v1/debuginfo/<build id>`) when the server does not have
//! their build id yet, so their frames are named without anyone uploading
//! by hand.
//!
//! Bounded: each build id is considered once per agent run, whatever its
//! outcome; one upload at a time, at most `rate` bytes per second, files
//! above `max_size` skipped; the queue of candidates is bounded and drops
//! (and counts) what does not fit.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::elf::ElfLayout;

/// A mapped binary with a build id.
pub(crate) struct Candidate {
    pub(crate) build_id: String,
    pub(crate) name: String,
    pub(crate) file: File,
}

static QUEUE: OnceLock<tokio::sync::mpsc::Sender<Candidate>> = OnceLock::new();

/// Offers a newly seen binary for upload; a no-op unless uploads are on.
pub(crate) fn offer(c: impl FnOnce() -> Option<Candidate>) {
    if let Some(q) = QUEUE.get()
        && let Some(c) = c()
        && q.try_send(c).is_err()
    {
        tracing::debug!("debug info upload queue full; a binary was skipped");
    }
}

/// Upload settings.
#[derive(Clone, Debug)]
pub(crate) struct UploadConfig {
    pub(crate) remote: String,
    pub(crate) tenant: Option<String>,
    pub(crate) bearer_token: Option<String>,
    /// Bytes per second.
    pub(crate) rate: u64,
    pub(crate) max_size: u64,
}

/// Starts the uploader; binaries offered from now on are considered.
pub(crate) fn start(cfg: UploadConfig) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    QUEUE
        .set(tx)
        .map_err(|_| anyhow::anyhow!("the debug info uploader runs already"))?;
    let http = reqwest::Client::builder()
        .user_agent(concat!("fathom-agent/", env!("CARGO_PKG_VERSION")))
        .timeout(Duration::from_secs(3600))
        .build()?;
    Ok(tokio::spawn(run(cfg, http, rx)))
}

async fn run(
    cfg: UploadConfig,
    http: reqwest::Client,
    mut rx: tokio::sync::mpsc::Receiver<Candidate>,
) {
    let mut seen: HashSet<String> = HashSet::new();
    while let Some(c) = rx.recv().await {
        if !seen.insert(c.build_id.clone()) {
            continue;
        }
        match upload(&cfg, &http, c).await {
            Ok(Some((name, bytes))) => {
                tracing::info!(binary = %name, bytes, "uploaded debug info to the server")
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "uploading debug info failed; not retried"),
        }
    }
}

fn request(cfg: &UploadConfig, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let r = match &cfg.tenant {
        Some(t) => r.header("X-Scope-OrgID", t),
        None => r,
    };
    match &cfg.bearer_token {
        Some(t) => r.bearer_auth(t),
        None => r,
    }
}

/// Uploads one binary if it has symbols, fits and the server lacks it:
/// `Some((name, bytes))` when uploaded.
async fn upload(
    cfg: &UploadConfig,
    http: &reqwest::Client,
    c: Candidate,
) -> anyhow::Result<Option<(String, u64)>> {
    let Candidate {
        build_id,
        name,
        file,
    } = c;
    let size = file.metadata()?.len();
    if size > cfg.max_size {
        tracing::debug!(binary = %name, size, "too large to upload");
        return Ok(None);
    }
    let (file, useful) = tokio::task::spawn_blocking(move || {
        let useful = ElfLayout::read(&file).is_ok_and(|l| {
            [".debug_info", ".symtab", ".gopclntab"]
                .iter()
                .any(|s| l.section(s).is_some_and(|s| s.size > 0))
        });
        (file, useful)
    })
    .await?;
    if !useful {
        return Ok(None);
    }
    let url = format!(
        "{}/api/v1/debuginfo/{build_id}",
        cfg.remote.trim_end_matches('/')
    );
    let has = request(cfg, http.get(&url)).send().await?.status();
    if has.is_success() {
        return Ok(None);
    }
    if has != reqwest::StatusCode::NOT_FOUND {
        anyhow::bail!("{url} answered {has}");
    }
    let rate = cfg.rate.max(1);
    let started = Instant::now();
    // 64 KiB chunks, each sent no earlier than the rate allows.
    // After a read error the stream ends (state `None`).
    let body = futures::stream::unfold(Some((file, 0u64)), move |state| async move {
        let (file, at) = state?;
        if at >= size {
            return None;
        }
        let due = Duration::from_secs_f64(at as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let len = (size - at).min(64 << 10) as usize;
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; len];
            file.read_exact_at(&mut buf, at).map(|()| (file, buf))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        match read {
            Ok((file, buf)) => Some((Ok(buf), Some((file, at + len as u64)))),
            Err(e) => Some((Err(e), None)),
        }
    });
    let resp = request(cfg, http.put(&url))
        .query(&[("name", name.as_str())])
        .header(reqwest::header::CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await?;
    let status = resp.status();
    if !status.is_success() {
        let msg = resp.text().await.unwrap_or_default();
        anyhow::bail!("uploading {name}: {status}: {}", msg.trim());
    }
    Ok(Some((name, size)))
}
