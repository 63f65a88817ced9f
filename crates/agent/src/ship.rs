//! Shipping profiles to Fathom through `fathom.push.v1.PushService/Push`.
//!
//! ```text
//! collector / scrapers ──enqueue──► Queue (bytes budget) ──► sender ──gRPC──► remote
//!                                     │ over budget: drop oldest, count
//! ```
//!
//! - Batches are pushed oldest first, one request at a time. A transient
//!   failure (unavailable, deadline, resource exhausted, …) is retried with
//!   exponential backoff and jitter; a refusal (invalid argument,
//!   unauthenticated, …) drops the batch and counts it.
//! - Memory is bounded: when the bytes waiting exceed `--max-buffer`, the
//!   oldest queued batches are dropped and counted (batches, profiles, bytes).
//!   The batch in flight is never dropped, so at most one batch above budget
//!   is held.
//! - Every profile carries a random id, kept across retries, so a retry of a
//!   request the remote did store is not stored twice.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fathom_proto::push::push_service_client::PushServiceClient;
use fathom_proto::push::{PushRequest, RawProfile};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::metrics::Metrics;

/// Largest push request the agent builds (the usual gRPC server limit is 4 MiB).
pub(crate) const MAX_REQUEST_BYTES: usize = 2 << 20;

/// Why the push client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("--remote {remote:?} is not a valid http(s) URL")]
    Remote {
        remote: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("--remote {0:?} must start with http:// or https://")]
    Scheme(String),
    #[error("--tenant {0:?} is not a valid header value")]
    Tenant(String),
    #[error("the bearer token is not a valid header value")]
    Token,
    #[error("reading the bearer token file {path}")]
    TokenFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A group of profiles pushed in one request.
#[derive(Debug)]
pub(crate) struct Batch {
    pub(crate) profiles: Vec<RawProfile>,
    pub(crate) bytes: usize,
}

impl Batch {
    /// Splits profiles into batches of at most [`MAX_REQUEST_BYTES`].
    pub(crate) fn split(profiles: Vec<RawProfile>) -> Vec<Batch> {
        let mut out = Vec::new();
        let mut cur = Batch {
            profiles: Vec::new(),
            bytes: 0,
        };
        for p in profiles {
            let n = size_of(&p);
            if !cur.profiles.is_empty() && cur.bytes + n > MAX_REQUEST_BYTES {
                out.push(std::mem::replace(
                    &mut cur,
                    Batch {
                        profiles: Vec::new(),
                        bytes: 0,
                    },
                ));
            }
            cur.bytes += n;
            cur.profiles.push(p);
        }
        if !cur.profiles.is_empty() {
            out.push(cur);
        }
        out
    }
}

fn size_of(p: &RawProfile) -> usize {
    p.pprof.len()
        + p.profile_id.len()
        + p.labels
            .iter()
            .map(|l| l.name.len() + l.value.len() + 8)
            .sum::<usize>()
        + 16
}

struct QueueState {
    queued: VecDeque<Arc<Batch>>,
    in_flight: Option<Arc<Batch>>,
    bytes: usize,
    closed: bool,
}

/// The bounded queue between producers and the sender. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Queue {
    state: Arc<Mutex<QueueState>>,
    notify: Arc<Notify>,
    budget: usize,
    metrics: Arc<Metrics>,
}

impl Queue {
    pub(crate) fn new(budget: usize, metrics: Arc<Metrics>) -> Self {
        Queue {
            state: Arc::new(Mutex::new(QueueState {
                queued: VecDeque::new(),
                in_flight: None,
                bytes: 0,
                closed: false,
            })),
            notify: Arc::new(Notify::new()),
            budget,
            metrics,
        }
    }

    /// Adds profiles (split into request-sized batches), dropping the oldest
    /// queued batches while over budget.
    pub(crate) fn push_profiles(&self, profiles: Vec<RawProfile>) {
        if profiles.is_empty() {
            return;
        }
        let mut s = self.state.lock();
        for b in Batch::split(profiles) {
            s.bytes += b.bytes;
            s.queued.push_back(Arc::new(b));
        }
        while s.bytes > self.budget {
            let Some(old) = s.queued.pop_front() else {
                break;
            };
            s.bytes -= old.bytes;
            self.metrics.dropped_batches.inc();
            self.metrics
                .dropped_profiles
                .inc_by(old.profiles.len() as u64);
            self.metrics.dropped_bytes.inc_by(old.bytes as u64);
            tracing::warn!(
                profiles = old.profiles.len(),
                bytes = old.bytes,
                budget = self.budget,
                "push buffer over budget, dropped the oldest batch"
            );
        }
        self.metrics.queue_bytes.set(s.bytes as i64);
        drop(s);
        self.notify.notify_one();
    }

    /// Stops accepting work; the sender drains what is queued and returns.
    pub(crate) fn close(&self) {
        self.state.lock().closed = true;
        self.notify.notify_one();
    }

    /// Bytes held (queued and in flight).
    pub(crate) fn bytes(&self) -> usize {
        self.state.lock().bytes
    }

    /// Waits for the next batch; `None` once closed and empty.
    async fn next(&self) -> Option<Arc<Batch>> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.state.lock();
                if let Some(b) = s.queued.pop_front() {
                    s.in_flight = Some(b.clone());
                    return Some(b);
                }
                if s.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    fn done(&self, b: &Arc<Batch>) {
        let mut s = self.state.lock();
        if s.in_flight.as_ref().is_some_and(|x| Arc::ptr_eq(x, b)) {
            s.in_flight = None;
        }
        s.bytes = s.bytes.saturating_sub(b.bytes);
        self.metrics.queue_bytes.set(s.bytes as i64);
    }
}

/// Where and how to push.
#[derive(Clone, Debug)]
pub(crate) struct ShipConfig {
    pub(crate) remote: String,
    pub(crate) tenant: Option<String>,
    pub(crate) bearer_token: Option<String>,
    pub(crate) timeout: Duration,
    /// First retry delay; doubles up to `max_backoff`.
    pub(crate) min_backoff: Duration,
    pub(crate) max_backoff: Duration,
}

/// A connected (lazily) push client with its request metadata.
pub(crate) struct Sender {
    client: PushServiceClient<Channel>,
    tenant: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    auth: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    cfg: ShipConfig,
}

impl Sender {
    pub(crate) fn new(cfg: ShipConfig) -> Result<Self, ShipError> {
        let remote = cfg.remote.trim_end_matches('/').to_owned();
        if !(remote.starts_with("http://") || remote.starts_with("https://")) {
            return Err(ShipError::Scheme(cfg.remote.clone()));
        }
        let mut ep = Endpoint::from_shared(remote.clone())
            .map_err(|source| ShipError::Remote {
                remote: remote.clone(),
                source,
            })?
            .connect_timeout(Duration::from_secs(5))
            .timeout(cfg.timeout)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        if remote.starts_with("https://") {
            ep = ep
                .tls_config(ClientTlsConfig::new().with_webpki_roots())
                .map_err(|source| ShipError::Remote {
                    remote: remote.clone(),
                    source,
                })?;
        }
        let channel = ep.connect_lazy();
        let tenant = match &cfg.tenant {
            Some(t) => Some(t.parse().map_err(|_| ShipError::Tenant(t.clone()))?),
            None => None,
        };
        let auth = match &cfg.bearer_token {
            Some(t) => Some(
                format!("Bearer {}", t.trim())
                    .parse()
                    .map_err(|_| ShipError::Token)?,
            ),
            None => None,
        };
        Ok(Sender {
            client: PushServiceClient::new(channel)
                .max_decoding_message_size(1 << 20)
                .max_encoding_message_size(MAX_REQUEST_BYTES * 2),
            tenant,
            auth,
            cfg,
        })
    }

    async fn push(&mut self, b: &Batch) -> Result<(), tonic::Status> {
        let mut req = tonic::Request::new(PushRequest {
            profiles: b.profiles.clone(),
        });
        if let Some(t) = &self.tenant {
            req.metadata_mut().insert("x-scope-orgid", t.clone());
        }
        if let Some(a) = &self.auth {
            req.metadata_mut().insert("authorization", a.clone());
        }
        self.client.push(req).await.map(|_| ())
    }

    /// Pushes queued batches until the queue is closed and drained, or until
    /// `deadline` (set when shutting down) passes.
    pub(crate) async fn run(
        mut self,
        queue: Queue,
        metrics: Arc<Metrics>,
        mut stop_retrying: tokio::sync::watch::Receiver<Option<Instant>>,
    ) {
        while let Some(batch) = queue.next().await {
            let mut backoff = self.cfg.min_backoff;
            loop {
                let t0 = Instant::now();
                let res = self.push(&batch).await;
                metrics.push_seconds.observe(t0.elapsed().as_secs_f64());
                match res {
                    Ok(()) => {
                        metrics.push_result("ok").inc();
                        metrics.pushed_profiles.inc_by(batch.profiles.len() as u64);
                        tracing::debug!(
                            profiles = batch.profiles.len(),
                            bytes = batch.bytes,
                            "pushed"
                        );
                        break;
                    }
                    Err(status) if retryable(status.code()) => {
                        metrics.push_result("retry").inc();
                        let deadline = *stop_retrying.borrow();
                        if deadline.is_some_and(|d| Instant::now() + backoff > d) {
                            drop_batch(&metrics, &batch, "shutting down");
                            break;
                        }
                        tracing::warn!(
                            code = ?status.code(),
                            message = status.message(),
                            retry_in = ?backoff,
                            "push failed, will retry"
                        );
                        let sleep = jitter(backoff);
                        tokio::select! {
                            _ = tokio::time::sleep(sleep) => {}
                            _ = stop_retrying.changed() => {}
                        }
                        backoff = (backoff * 2).min(self.cfg.max_backoff);
                    }
                    Err(status) => {
                        metrics.push_result("rejected").inc();
                        tracing::error!(
                            code = ?status.code(),
                            message = status.message(),
                            profiles = batch.profiles.len(),
                            "remote refused the push; batch dropped"
                        );
                        drop_batch(&metrics, &batch, "refused");
                        break;
                    }
                }
            }
            queue.done(&batch);
        }
    }
}

fn drop_batch(metrics: &Metrics, b: &Batch, why: &str) {
    metrics.dropped_batches.inc();
    metrics.dropped_profiles.inc_by(b.profiles.len() as u64);
    metrics.dropped_bytes.inc_by(b.bytes as u64);
    tracing::debug!(why, profiles = b.profiles.len(), "dropped batch");
}

fn retryable(code: tonic::Code) -> bool {
    use tonic::Code::*;
    matches!(
        code,
        Unavailable
            | DeadlineExceeded
            | ResourceExhausted
            | Aborted
            | Internal
            | Unknown
            | Cancelled
    )
}

/// ±20% jitter, from the clock's low bits (no RNG needed for this).
fn jitter(d: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    let f = 0.8 + f64::from(nanos % 1000) / 1000.0 * 0.4;
    d.mul_f64(f)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fathom_proto::push::push_service_server::{PushService, PushServiceServer};
    use fathom_proto::push::{LabelPair, PushResponse};
    use prometheus_client::registry::Registry;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type Requests = Arc<Mutex<Vec<(Vec<RawProfile>, tonic::metadata::MetadataMap)>>>;

    /// What a fake server saw: each request's profiles and metadata.
    #[derive(Clone, Default)]
    pub(crate) struct Received {
        pub(crate) requests: Requests,
        /// Fail this many requests first with UNAVAILABLE.
        pub(crate) fail_first: Arc<AtomicUsize>,
        pub(crate) reject_all: bool,
    }

    #[tonic::async_trait]
    impl PushService for Received {
        async fn push(
            &self,
            req: tonic::Request<PushRequest>,
        ) -> Result<tonic::Response<PushResponse>, tonic::Status> {
            if self.reject_all {
                return Err(tonic::Status::invalid_argument("bad profile"));
            }
            if self
                .fail_first
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                return Err(tonic::Status::unavailable("not yet"));
            }
            let md = req.metadata().clone();
            let profiles = req.into_inner().profiles;
            let n = profiles.len() as u64;
            self.requests.lock().push((profiles, md));
            Ok(tonic::Response::new(PushResponse {
                profiles: n,
                samples: 0,
            }))
        }
    }

    /// Starts a fake PushService on a free port.
    pub(crate) async fn fake_server(r: Received) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(PushServiceServer::new(r))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        addr
    }

    fn profile(n: usize) -> RawProfile {
        RawProfile {
            labels: vec![LabelPair {
                name: "service_name".into(),
                value: format!("s{n}"),
            }],
            pprof: vec![7; 100],
            profile_id: vec![n as u8; 16],
        }
    }

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new(&mut Registry::default()))
    }

    fn cfg(remote: String) -> ShipConfig {
        ShipConfig {
            remote,
            tenant: Some("team-a".into()),
            bearer_token: Some("s3cret".into()),
            timeout: Duration::from_secs(5),
            min_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
        }
    }

    #[test]
    fn split_respects_request_size() {
        let big = RawProfile {
            pprof: vec![0; MAX_REQUEST_BYTES / 2 - 100],
            ..Default::default()
        };
        let batches = Batch::split(vec![big.clone(), big.clone(), big.clone(), profile(1)]);
        assert_eq!(batches.len(), 2);
        assert!(batches.iter().all(|b| b.bytes <= MAX_REQUEST_BYTES));
        assert_eq!(batches.iter().map(|b| b.profiles.len()).sum::<usize>(), 4);
        // A single profile above the limit still goes, alone.
        let huge = RawProfile {
            pprof: vec![0; MAX_REQUEST_BYTES + 1],
            ..Default::default()
        };
        assert_eq!(Batch::split(vec![huge]).len(), 1);
    }

    #[test]
    fn queue_drops_oldest_over_budget() {
        let m = metrics();
        let q = Queue::new(600, m.clone());
        for i in 0..10 {
            q.push_profiles(vec![profile(i)]);
        }
        assert!(q.bytes() <= 600);
        let dropped = m.dropped_batches.get();
        assert!(dropped >= 5, "dropped {dropped}");
        assert_eq!(m.dropped_profiles.get(), dropped);
        // The newest survive.
        let s = q.state.lock();
        assert_eq!(s.queued.back().unwrap().profiles[0].profile_id[0], 9);
    }

    #[tokio::test]
    async fn pushes_with_headers_and_retries() {
        let r = Received::default();
        r.fail_first.store(2, Ordering::SeqCst);
        let addr = fake_server(r.clone()).await;
        let m = metrics();
        let q = Queue::new(1 << 20, m.clone());
        let sender = Sender::new(cfg(format!("http://{addr}"))).unwrap();
        let (_tx, rx) = tokio::sync::watch::channel(None);
        let h = tokio::spawn(sender.run(q.clone(), m.clone(), rx));
        q.push_profiles(vec![profile(1), profile(2)]);
        q.push_profiles(vec![profile(3)]);
        q.close();
        h.await.unwrap();
        let reqs = r.requests.lock();
        assert_eq!(reqs.len(), 2, "two batches, each stored once");
        assert_eq!(reqs[0].0.len(), 2);
        assert_eq!(reqs[0].1.get("x-scope-orgid").unwrap(), "team-a");
        assert_eq!(reqs[0].1.get("authorization").unwrap(), "Bearer s3cret");
        assert_eq!(m.push_result("retry").get(), 2);
        assert_eq!(m.push_result("ok").get(), 2);
        assert_eq!(m.pushed_profiles.get(), 3);
        assert_eq!(q.bytes(), 0);
    }

    #[tokio::test]
    async fn refused_batches_are_dropped_and_counted() {
        let r = Received {
            reject_all: true,
            ..Default::default()
        };
        let addr = fake_server(r).await;
        let m = metrics();
        let q = Queue::new(1 << 20, m.clone());
        let (_tx, rx) = tokio::sync::watch::channel(None);
        let h = tokio::spawn(Sender::new(cfg(format!("http://{addr}"))).unwrap().run(
            q.clone(),
            m.clone(),
            rx,
        ));
        q.push_profiles(vec![profile(1)]);
        q.close();
        h.await.unwrap();
        assert_eq!(m.push_result("rejected").get(), 1);
        assert_eq!(m.dropped_profiles.get(), 1);
    }

    #[tokio::test]
    async fn backend_down_stays_bounded_and_recovers() {
        // Nothing listens on this port: every push is UNAVAILABLE.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let m = metrics();
        let q = Queue::new(1000, m.clone());
        let (tx, rx) = tokio::sync::watch::channel(None);
        let h = tokio::spawn(Sender::new(cfg(format!("http://{addr}"))).unwrap().run(
            q.clone(),
            m.clone(),
            rx,
        ));
        for i in 0..50 {
            q.push_profiles(vec![profile(i)]);
            tokio::time::sleep(Duration::from_millis(2)).await;
            // Budget plus at most the one batch in flight.
            assert!(q.bytes() <= 1000 + 200, "{} bytes held", q.bytes());
        }
        assert!(m.dropped_batches.get() > 0);
        assert!(m.push_result("retry").get() > 0);
        // Shutting down with the backend still down: gives up by the deadline.
        q.close();
        tx.send(Some(Instant::now() + Duration::from_millis(200)))
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn bad_remote_and_headers_are_refused() {
        assert!(matches!(
            Sender::new(cfg("ftp://x".into())),
            Err(ShipError::Scheme(_))
        ));
        let mut c = cfg("http://127.0.0.1:1".into());
        c.tenant = Some("bad\nvalue".into());
        assert!(matches!(Sender::new(c), Err(ShipError::Tenant(_))));
    }
}
