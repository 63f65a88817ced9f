//! Pull mode: scraping `/debug/pprof/*` of static targets, the way Conprof
//! and Parca scrape Go services, and pushing what comes back through the
//! same queue as the CPU profiles.
//!
//! ```yaml
//! scrape_interval: 15s            # default for every job
//! scrape_timeout: 10s             # added to the profile duration for CPU and delta profiles
//! scrape_configs:
//!   - job_name: checkout
//!     scrape_interval: 10s
//!     scheme: http                # or https
//!     path_prefix: ""             # e.g. /admin when pprof is mounted under it
//!     profiles: [profile, heap, allocs, block, mutex, goroutine]   # the default
//!     profile_seconds: 10s        # ?seconds= for CPU (default: min(interval, 10s))
//!     delta: true                 # allocs, block, mutex as deltas over profile_seconds
//!     static_configs:
//!       - targets: ["127.0.0.1:6060"]
//!         labels: {env: dev}
//! ```
//!
//! Each scraped profile is pushed with the target's labels plus `job`,
//! `instance`, `service_name` (default: the job name) and `__name__` (the
//! Pyroscope convention for the profile name): `process_cpu` (profile),
//! `memory` (heap, allocs), `block`, `mutex`, `goroutines`. Go's heap and
//! allocs endpoints both carry all four memory sample types; the agent keeps
//! the in-use ones from heap and, with deltas on, the allocation ones from
//! allocs, so the two never count the same thing twice. A response that is
//! not a pprof profile, or that decompresses past 64 MiB, is refused and
//! counted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fathom_proto::push::{LabelPair, RawProfile};
use serde::Deserialize;

use crate::metrics::Metrics;
use crate::pprof;
use crate::ship::Queue;

/// Largest response body accepted, compressed or not.
const MAX_BODY: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ScrapeConfigError {
    #[error("reading scrape config {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("scrape config is not valid YAML for scrape_configs")]
    Yaml(#[from] serde_norway::Error),
    #[error("scrape config: {0}")]
    Invalid(String),
}

/// The pprof endpoints a target can serve.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    Profile,
    Heap,
    Allocs,
    Block,
    Mutex,
    Goroutine,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Profile,
        Kind::Heap,
        Kind::Allocs,
        Kind::Block,
        Kind::Mutex,
        Kind::Goroutine,
    ];

    fn path(self) -> &'static str {
        match self {
            Kind::Profile => "profile",
            Kind::Heap => "heap",
            Kind::Allocs => "allocs",
            Kind::Block => "block",
            Kind::Mutex => "mutex",
            Kind::Goroutine => "goroutine",
        }
    }

    /// `__name__` of the pushed profile.
    fn profile_name(self) -> &'static str {
        match self {
            Kind::Profile => "process_cpu",
            Kind::Heap => "memory",
            Kind::Allocs => "memory",
            Kind::Block => "block",
            Kind::Mutex => "mutex",
            Kind::Goroutine => "goroutines",
        }
    }

    /// Go's heap and allocs endpoints return the same four sample types;
    /// only some are meaningful from each: the in-use ones from the heap
    /// snapshot, the allocation ones from the allocs delta. Keeping only
    /// those means the two never double count.
    fn keep_sample_type(self, name: &str, delta: bool) -> bool {
        match self {
            Kind::Heap => name.starts_with("inuse"),
            Kind::Allocs if delta => name.starts_with("alloc"),
            _ => true,
        }
    }

    /// Whether the endpoint takes `?seconds=` (CPU always; the cumulative
    /// ones when deltas are on).
    fn seconds(self, delta: bool) -> bool {
        match self {
            Kind::Profile => true,
            Kind::Allocs | Kind::Block | Kind::Mutex => delta,
            Kind::Heap | Kind::Goroutine => false,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default, with = "humantime_serde_opt")]
    scrape_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    scrape_timeout: Option<Duration>,
    #[serde(default)]
    scrape_configs: Vec<JobConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobConfig {
    job_name: String,
    #[serde(default, with = "humantime_serde_opt")]
    scrape_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    scrape_timeout: Option<Duration>,
    #[serde(default)]
    scheme: Option<String>,
    #[serde(default)]
    path_prefix: Option<String>,
    #[serde(default)]
    profiles: Option<Vec<Kind>>,
    #[serde(default, with = "humantime_serde_opt")]
    profile_seconds: Option<Duration>,
    #[serde(default)]
    delta: Option<bool>,
    #[serde(default)]
    static_configs: Vec<StaticConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StaticConfig {
    targets: Vec<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// Human durations (`10s`) in YAML.
mod humantime_serde_opt {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// One thing to scrape on a schedule: a target's endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScrapeTarget {
    pub(crate) job: String,
    pub(crate) kind: Kind,
    pub(crate) url: String,
    pub(crate) interval: Duration,
    /// Whole request timeout (profile duration + scrape timeout).
    pub(crate) timeout: Duration,
    /// Labels pushed with each profile (without `__name__`).
    pub(crate) labels: BTreeMap<String, String>,
    /// Whether cumulative profiles are fetched as deltas.
    pub(crate) delta: bool,
}

/// Parses and validates a scrape config into targets.
pub(crate) fn parse_config(text: &str) -> Result<Vec<ScrapeTarget>, ScrapeConfigError> {
    let f: FileConfig = serde_norway::from_str(text)?;
    let bad = |m: String| ScrapeConfigError::Invalid(m);
    let default_interval = f.scrape_interval.unwrap_or(Duration::from_secs(15));
    let default_timeout = f.scrape_timeout.unwrap_or(Duration::from_secs(10));
    let mut out = Vec::new();
    for job in f.scrape_configs {
        if job.job_name.is_empty() {
            return Err(bad("a job has an empty job_name".into()));
        }
        let interval = job.scrape_interval.unwrap_or(default_interval);
        if interval < Duration::from_secs(1) {
            return Err(bad(format!(
                "job {}: scrape_interval must be at least 1s",
                job.job_name
            )));
        }
        let timeout = job.scrape_timeout.unwrap_or(default_timeout);
        let scheme = job.scheme.clone().unwrap_or_else(|| "http".into());
        if scheme != "http" && scheme != "https" {
            return Err(bad(format!(
                "job {}: scheme must be http or https",
                job.job_name
            )));
        }
        let seconds = job
            .profile_seconds
            .unwrap_or_else(|| interval.min(Duration::from_secs(10)))
            .max(Duration::from_secs(1));
        if seconds > interval {
            return Err(bad(format!(
                "job {}: profile_seconds ({seconds:?}) must not exceed scrape_interval ({interval:?})",
                job.job_name
            )));
        }
        let delta = job.delta.unwrap_or(true);
        let prefix = job.path_prefix.clone().unwrap_or_default();
        let prefix = prefix.trim_end_matches('/');
        let kinds = job.profiles.clone().unwrap_or_else(|| Kind::ALL.to_vec());
        for sc in &job.static_configs {
            for k in sc.labels.keys() {
                if !fathom_model::valid_label_name(k) || k.starts_with("__") {
                    return Err(bad(format!(
                        "job {}: label name {k:?} is not valid",
                        job.job_name
                    )));
                }
            }
            for target in &sc.targets {
                if target.is_empty() || target.contains('/') || target.contains(char::is_whitespace)
                {
                    return Err(bad(format!(
                        "job {}: target {target:?} must be host:port",
                        job.job_name
                    )));
                }
                for &kind in &kinds {
                    let mut url =
                        format!("{scheme}://{target}{prefix}/debug/pprof/{}", kind.path());
                    let takes_seconds = kind.seconds(delta);
                    if takes_seconds {
                        url.push_str(&format!("?seconds={}", seconds.as_secs()));
                    }
                    let mut labels = sc.labels.clone();
                    labels.insert("job".into(), job.job_name.clone());
                    labels.insert("instance".into(), target.clone());
                    labels
                        .entry(fathom_model::SERVICE_NAME.into())
                        .or_insert_with(|| job.job_name.clone());
                    out.push(ScrapeTarget {
                        job: job.job_name.clone(),
                        kind,
                        url,
                        interval,
                        timeout: timeout
                            + if takes_seconds {
                                seconds
                            } else {
                                Duration::ZERO
                            },
                        labels,
                        delta,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Reads a scrape config file.
pub(crate) fn read_config(path: &std::path::Path) -> Result<Vec<ScrapeTarget>, ScrapeConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScrapeConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_config(&text)
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ScrapeError {
    #[error("request: {0}")]
    Http(#[from] reqwest::Error),
    #[error("status {0}")]
    Status(reqwest::StatusCode),
    #[error("response larger than {MAX_BODY} bytes")]
    TooLarge,
    #[error("response is not a pprof profile: {0}")]
    Decode(#[from] pprof::DecodeError),
}

/// Fetches one profile, checks that it is one, and keeps only the sample
/// types that are meaningful from this endpoint (see [`Kind`]).
pub(crate) async fn scrape_once(
    client: &reqwest::Client,
    t: &ScrapeTarget,
) -> Result<Vec<u8>, ScrapeError> {
    let mut resp = client.get(&t.url).timeout(t.timeout).send().await?;
    if !resp.status().is_success() {
        return Err(ScrapeError::Status(resp.status()));
    }
    if resp.content_length().is_some_and(|n| n > MAX_BODY) {
        return Err(ScrapeError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() as u64 + chunk.len() as u64 > MAX_BODY {
            return Err(ScrapeError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    let p = pprof::decode(&body, MAX_BODY)?;
    Ok(match filter_sample_types(p, t.kind, t.delta) {
        Some(p) => pprof::encode_gzip(&p),
        None => body,
    })
}

/// The profile without the sample types `kind` does not keep; `None` when
/// nothing is to be removed (or everything would be: a non-Go profile).
fn filter_sample_types(
    mut p: fathom_proto::pprof::Profile,
    kind: Kind,
    delta: bool,
) -> Option<fathom_proto::pprof::Profile> {
    let name = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .map_or("", String::as_str)
    };
    let keep: Vec<bool> = p
        .sample_type
        .iter()
        .map(|st| kind.keep_sample_type(name(st.r#type), delta))
        .collect();
    if keep.iter().all(|&k| k) || !keep.iter().any(|&k| k) {
        return None;
    }
    let default_name = name(p.default_sample_type).to_owned();
    let mut i = 0;
    p.sample_type.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    for s in &mut p.sample {
        let mut j = 0;
        s.value.retain(|_| {
            j += 1;
            keep.get(j - 1).copied().unwrap_or(false)
        });
    }
    if !kind.keep_sample_type(&default_name, delta) {
        p.default_sample_type = 0;
    }
    // Samples that are zero in every kept type carry nothing.
    p.sample.retain(|s| s.value.iter().any(|&v| v != 0));
    Some(p)
}

fn raw_profile(t: &ScrapeTarget, body: Vec<u8>) -> RawProfile {
    let mut labels: Vec<LabelPair> = t
        .labels
        .iter()
        .map(|(k, v)| LabelPair {
            name: k.clone(),
            value: v.clone(),
        })
        .collect();
    labels.push(LabelPair {
        name: "__name__".into(),
        value: t.kind.profile_name().into(),
    });
    RawProfile {
        labels,
        pprof: body,
        profile_id: uuid::Uuid::new_v4().as_bytes().to_vec(),
    }
}

/// Scrapes `t` every interval until shutdown, pushing into `queue`.
pub(crate) async fn run_target(
    t: ScrapeTarget,
    client: reqwest::Client,
    queue: Queue,
    metrics: Arc<Metrics>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(t.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let kind = t.kind.path();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        let res = tokio::select! {
            r = scrape_once(&client, &t) => r,
            _ = shutdown.changed() => return,
        };
        match res {
            Ok(body) => {
                metrics.scrape(&t.job, kind, "ok").inc();
                tracing::debug!(url = %t.url, bytes = body.len(), "scraped");
                queue.push_profiles(vec![raw_profile(&t, body)]);
            }
            Err(error) => {
                metrics.scrape(&t.job, kind, "error").inc();
                tracing::warn!(url = %t.url, %error, "scrape failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    const CONFIG: &str = r#"
scrape_interval: 20s
scrape_configs:
  - job_name: app
    profile_seconds: 5s
    static_configs:
      - targets: ["127.0.0.1:6060", "10.0.0.1:8080"]
        labels: {env: dev}
  - job_name: other
    scrape_interval: 3s
    profiles: [heap, profile]
    delta: false
    path_prefix: /admin/
    static_configs:
      - targets: ["h:1"]
        labels: {service_name: custom}
"#;

    #[test]
    fn parses_targets() {
        let t = parse_config(CONFIG).unwrap();
        assert_eq!(t.len(), 2 * 6 + 2);
        let cpu = t
            .iter()
            .find(|x| x.kind == Kind::Profile && x.job == "app")
            .unwrap();
        assert_eq!(
            cpu.url,
            "http://127.0.0.1:6060/debug/pprof/profile?seconds=5"
        );
        assert_eq!(cpu.interval, Duration::from_secs(20));
        assert_eq!(cpu.timeout, Duration::from_secs(15));
        assert_eq!(cpu.labels["service_name"], "app");
        assert_eq!(cpu.labels["env"], "dev");
        assert_eq!(cpu.labels["instance"], "127.0.0.1:6060");
        let allocs = t.iter().find(|x| x.kind == Kind::Allocs).unwrap();
        assert!(allocs.url.ends_with("/debug/pprof/allocs?seconds=5"));
        let heap = t
            .iter()
            .find(|x| x.kind == Kind::Heap && x.job == "app")
            .unwrap();
        assert!(heap.url.ends_with("/debug/pprof/heap"));
        let other: Vec<_> = t.iter().filter(|x| x.job == "other").collect();
        assert_eq!(other.len(), 2);
        assert_eq!(other[0].url, "http://h:1/admin/debug/pprof/heap");
        assert_eq!(
            other[1].url,
            "http://h:1/admin/debug/pprof/profile?seconds=3"
        );
        assert_eq!(other[0].labels["service_name"], "custom");
    }

    #[test]
    fn refuses_bad_configs() {
        for bad in [
            "scrape_configs: [{job_name: '', static_configs: []}]",
            "scrape_configs: [{job_name: a, scrape_interval: 10ms}]",
            "scrape_configs: [{job_name: a, scheme: ftp}]",
            "scrape_configs: [{job_name: a, scrape_interval: 5s, profile_seconds: 10s}]",
            "scrape_configs: [{job_name: a, static_configs: [{targets: ['http://x/']}]}]",
            "scrape_configs: [{job_name: a, static_configs: [{targets: [x], labels: {'1bad': v}}]}]",
            "scrape_configs: [{job_name: a, profiles: [trace]}]",
            "scrape_configs: [{job_name: a, unknown_field: 1}]",
            "scrape_interval: forever",
            "[[[",
        ] {
            assert!(parse_config(bad).is_err(), "accepted {bad}");
        }
    }

    /// Serves canned bodies on /debug/pprof/*.
    async fn fake_target(body: Vec<u8>, status: u16) -> std::net::SocketAddr {
        use axum::routing::get;
        let app = axum::Router::new().route(
            "/debug/pprof/{kind}",
            get(move || {
                let body = body.clone();
                async move { (axum::http::StatusCode::from_u16(status).unwrap(), body) }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        addr
    }

    fn target(addr: std::net::SocketAddr) -> ScrapeTarget {
        parse_config(&format!(
            "scrape_configs: [{{job_name: j, scrape_interval: 1s, profiles: [heap], static_configs: [{{targets: ['{addr}']}}]}}]"
        ))
        .unwrap()
        .remove(0)
    }

    #[tokio::test]
    async fn scrapes_and_validates() {
        let p = fathom_proto::pprof::Profile {
            string_table: vec!["".into(), "inuse_space".into(), "bytes".into()],
            sample_type: vec![fathom_proto::pprof::ValueType { r#type: 1, unit: 2 }],
            ..Default::default()
        };
        let good = pprof::encode_gzip(&p);
        let addr = fake_target(good.clone(), 200).await;
        let c = reqwest::Client::new();
        assert_eq!(scrape_once(&c, &target(addr)).await.unwrap(), good);

        let addr = fake_target(b"<html>not pprof</html>".to_vec(), 200).await;
        assert!(matches!(
            scrape_once(&c, &target(addr)).await,
            Err(ScrapeError::Decode(_))
        ));
        let addr = fake_target(good.clone(), 500).await;
        assert!(matches!(
            scrape_once(&c, &target(addr)).await,
            Err(ScrapeError::Status(_))
        ));

        // The loop pushes what it scrapes, labeled.
        let addr = fake_target(good.clone(), 200).await;
        let m = Arc::new(Metrics::new(&mut Registry::default()));
        let q = Queue::new(1 << 20, m.clone());
        let (tx, rx) = tokio::sync::watch::channel(false);
        let h = tokio::spawn(run_target(target(addr), c, q.clone(), m.clone(), rx));
        for _ in 0..100 {
            if m.scrape("j", "heap", "ok").get() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tx.send(true).unwrap();
        h.await.unwrap();
        assert!(m.scrape("j", "heap", "ok").get() >= 1);
        assert!(q.bytes() >= good.len());
    }

    fn go_heap() -> fathom_proto::pprof::Profile {
        use fathom_proto::pprof::{Profile, Sample, ValueType};
        let strings = [
            "",
            "alloc_objects",
            "count",
            "alloc_space",
            "bytes",
            "inuse_objects",
            "inuse_space",
            "space",
        ];
        let vt = |t: i64, u: i64| ValueType { r#type: t, unit: u };
        Profile {
            string_table: strings.iter().map(|s| s.to_string()).collect(),
            sample_type: vec![vt(1, 2), vt(3, 4), vt(5, 2), vt(6, 4)],
            sample: vec![
                Sample {
                    location_id: vec![],
                    value: vec![1, 100, 0, 0],
                    label: vec![],
                },
                Sample {
                    location_id: vec![],
                    value: vec![2, 200, 1, 64],
                    label: vec![],
                },
            ],
            period_type: Some(vt(7, 4)),
            default_sample_type: 6,
            ..Default::default()
        }
    }

    #[test]
    fn heap_keeps_inuse_and_allocs_keeps_alloc() {
        let heap = filter_sample_types(go_heap(), Kind::Heap, true).unwrap();
        let names: Vec<&str> = heap
            .sample_type
            .iter()
            .map(|v| heap.string_table[v.r#type as usize].as_str())
            .collect();
        assert_eq!(names, ["inuse_objects", "inuse_space"]);
        assert_eq!(heap.sample.len(), 1, "all-zero sample dropped");
        assert_eq!(heap.sample[0].value, vec![1, 64]);
        assert_eq!(heap.default_sample_type, 6);
        let allocs = filter_sample_types(go_heap(), Kind::Allocs, true).unwrap();
        assert_eq!(allocs.sample_type.len(), 2);
        assert_eq!(allocs.sample[1].value, vec![2, 200]);
        assert_eq!(allocs.default_sample_type, 0);
        // Cumulative allocs (no delta) and other kinds are left alone.
        assert!(filter_sample_types(go_heap(), Kind::Allocs, false).is_none());
        assert!(filter_sample_types(go_heap(), Kind::Goroutine, true).is_none());
    }

    #[test]
    fn raw_profile_labels() {
        let t = ScrapeTarget {
            job: "j".into(),
            kind: Kind::Allocs,
            url: String::new(),
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            labels: [("service_name".to_string(), "s".to_string())].into(),
            delta: true,
        };
        let r = raw_profile(&t, vec![1]);
        assert!(
            r.labels
                .iter()
                .any(|l| l.name == "__name__" && l.value == "memory")
        );
        assert_eq!(r.profile_id.len(), 16);
    }
}
