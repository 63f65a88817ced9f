//! A debuginfod client: `GET <url>/buildid/<build id>/debuginfo` on each
//! upstream in turn, with a timeout per request, a bound on concurrent
//! fetches and on the size of an answer, and metrics. What it fetches is
//! stored as shared debug info (the same for every tenant); what no server
//! has is remembered as missing by the [`crate::Symbolizer`] for a while.
//! With no upstream configured nothing is ever fetched.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Settings of the debuginfod client.
#[derive(Clone, Debug)]
pub struct DebuginfodConfig {
    /// Upstream servers, tried in order.
    pub urls: Vec<String>,
    /// Longest time one request may take, body included.
    pub timeout: Duration,
    /// Most fetches at once.
    pub concurrency: usize,
    /// Largest file accepted.
    pub max_size: u64,
}

impl DebuginfodConfig {
    /// The URLs of `DEBUGINFOD_URLS` (separated by spaces), as elfutils
    /// reads them.
    pub fn urls_from_env_value(v: &str) -> Vec<String> {
        v.split_whitespace()
            .map(|u| u.trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .collect()
    }
}

#[derive(Clone)]
struct Metrics {
    hits: Counter,
    misses: Counter,
    errors: Counter,
    bytes: Counter,
    fetch_seconds: Histogram,
}

/// The client; cheap to clone.
#[derive(Clone)]
pub struct Debuginfod {
    cfg: Arc<DebuginfodConfig>,
    http: reqwest::Client,
    slots: Arc<tokio::sync::Semaphore>,
    metrics: Metrics,
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("status {0}")]
    Status(reqwest::StatusCode),
    #[error("the answer is larger than {0} bytes")]
    TooLarge(u64),
    #[error("timed out")]
    Timeout,
}

impl Debuginfod {
    /// A client, or `None` when no upstream is configured.
    pub fn new(cfg: DebuginfodConfig, registry: &mut Registry) -> Option<Self> {
        if cfg.urls.is_empty() {
            return None;
        }
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout)
            .build()
            .ok()?;
        let metrics = Metrics {
            hits: Counter::default(),
            misses: Counter::default(),
            errors: Counter::default(),
            bytes: Counter::default(),
            fetch_seconds: Histogram::new([0.01, 0.1, 0.5, 1.0, 5.0, 30.0]),
        };
        registry.register(
            "fathom_debuginfod_hits",
            "Build ids a debuginfod server had",
            metrics.hits.clone(),
        );
        registry.register(
            "fathom_debuginfod_misses",
            "Build ids no debuginfod server had",
            metrics.misses.clone(),
        );
        registry.register(
            "fathom_debuginfod_errors",
            "debuginfod requests that failed (timeouts, errors, unusable answers)",
            metrics.errors.clone(),
        );
        registry.register(
            "fathom_debuginfod_fetched_bytes",
            "Bytes of debug info fetched from debuginfod servers",
            metrics.bytes.clone(),
        );
        registry.register(
            "fathom_debuginfod_fetch_seconds",
            "Time to fetch one build id from the debuginfod servers",
            metrics.fetch_seconds.clone(),
        );
        Some(Debuginfod {
            slots: Arc::new(tokio::sync::Semaphore::new(cfg.concurrency.max(1))),
            cfg: Arc::new(cfg),
            http,
            metrics,
        })
    }

    /// Counts an answer that turned out unusable (not ELF, wrong build id).
    pub(crate) fn refused(&self) {
        self.metrics.errors.inc();
    }

    /// The debug info of `build_id` from the first upstream that has it.
    pub async fn fetch(&self, build_id: &str) -> Option<Bytes> {
        let _slot = self.slots.acquire().await.ok()?;
        let started = Instant::now();
        let mut found = None;
        for url in &self.cfg.urls {
            let u = format!("{url}/buildid/{build_id}/debuginfo");
            let got = tokio::time::timeout(self.cfg.timeout, self.get(&u))
                .await
                .unwrap_or(Err(FetchError::Timeout));
            match got {
                Ok(b) => {
                    found = Some(b);
                    break;
                }
                Err(FetchError::NotFound) => {}
                Err(e) => {
                    self.metrics.errors.inc();
                    tracing::warn!(url = %u, error = %e, "debuginfod request failed");
                }
            }
        }
        self.metrics
            .fetch_seconds
            .observe(started.elapsed().as_secs_f64());
        match &found {
            Some(b) => {
                self.metrics.hits.inc();
                self.metrics.bytes.inc_by(b.len() as u64);
                tracing::info!(
                    build_id,
                    bytes = b.len(),
                    "fetched debug info from debuginfod"
                );
            }
            None => {
                self.metrics.misses.inc();
            }
        }
        found
    }

    async fn get(&self, url: &str) -> Result<Bytes, FetchError> {
        let resp = self.http.get(url).send().await?;
        match resp.status() {
            s if s.is_success() => {}
            reqwest::StatusCode::NOT_FOUND => return Err(FetchError::NotFound),
            s => return Err(FetchError::Status(s)),
        }
        let limit = self.cfg.max_size;
        if resp.content_length().is_some_and(|n| n > limit) {
            return Err(FetchError::TooLarge(limit));
        }
        let mut resp = resp;
        let mut out = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            if (out.len() as u64).saturating_add(chunk.len() as u64) > limit {
                return Err(FetchError::TooLarge(limit));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(out))
    }
}
