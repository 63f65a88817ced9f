//! A load generator that pushes real profiles from `../shared/testdata/pprof`
//! to distributors at a set rate, over many series and tenants, retrying
//! each write until it is acknowledged (as a real client does), and
//! recording every acknowledged write so a checker can compare query
//! results with exactly what was acknowledged. `cargo run -p
//! fathom-integration --bin loadgen -- --help` runs it outside the tests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::{read_expectation, testdata};

/// What to push.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Distributor base URLs (`http://host:port`), used round robin.
    pub distributors: Vec<String>,
    pub tenants: usize,
    pub services: usize,
    /// Writes per second.
    pub rate: f64,
    pub duration: Duration,
    /// Corpus files (relative to `testdata/pprof`), cycled.
    pub files: Vec<String>,
    /// Unix seconds of the first profile; each series advances 10 s a write.
    pub base_time_s: i64,
    /// Give up on one write after this long.
    pub retry_for: Duration,
}

/// One acknowledged write.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ack {
    pub tenant: String,
    pub service: String,
    pub file: String,
    pub time_s: i64,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub acked: Vec<Ack>,
    /// Writes never acknowledged within `retry_for` (should be none).
    pub failed: Vec<Ack>,
    /// Attempts that were refused and retried.
    pub retries: usize,
    pub bytes: u64,
    pub elapsed: Duration,
}

/// Pushes until `duration` passes or `stop` is set.
pub fn run(opts: &LoadOptions, stop: Arc<AtomicBool>) -> Result<LoadReport> {
    let bodies: Vec<(String, Vec<u8>)> = opts
        .files
        .iter()
        .map(|f| Ok((f.clone(), std::fs::read(testdata().join("pprof").join(f))?)))
        .collect::<Result<_>>()?;
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let mut report = LoadReport::default();
    let t0 = Instant::now();
    let mut seq: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    let mut n = 0usize;
    while t0.elapsed() < opts.duration && !stop.load(Ordering::Relaxed) {
        let due = t0 + Duration::from_secs_f64(n as f64 / opts.rate.max(0.001));
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let t = n % opts.tenants.max(1);
        let s = (n / opts.tenants.max(1)) % opts.services.max(1);
        let k = seq.entry((t, s)).or_default();
        let (file, body) = &bodies[n % bodies.len()];
        let ack = Ack {
            tenant: format!("tenant-{t}"),
            service: format!("svc-{s}"),
            file: file.clone(),
            time_s: opts.base_time_s + *k * 10,
        };
        *k += 1;
        n += 1;
        let started = Instant::now();
        let mut attempt = 0usize;
        loop {
            let url = &opts.distributors[(n + attempt) % opts.distributors.len()];
            let from = ack.time_s.to_string();
            let until = (ack.time_s + 10).to_string();
            let r = http
                .post(format!("{url}/ingest"))
                .header("X-Scope-OrgID", &ack.tenant)
                .query(&[
                    ("name", ack.service.as_str()),
                    ("format", "pprof"),
                    ("from", &from),
                    ("until", &until),
                ])
                .body(body.clone())
                .send();
            match r {
                Ok(r) if r.status().is_success() => {
                    report.bytes += body.len() as u64;
                    report.acked.push(ack.clone());
                    break;
                }
                Ok(r) if r.status().is_client_error() => {
                    anyhow::bail!("write refused as bad input: {}: {}", r.status(), r.text()?);
                }
                _ => {
                    attempt += 1;
                    report.retries += 1;
                    if started.elapsed() > opts.retry_for {
                        report.failed.push(ack.clone());
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
    report.elapsed = t0.elapsed();
    Ok(report)
}

/// Per-stack totals each (tenant, service) must show: the `go tool pprof`
/// expectations of the acknowledged writes, summed.
pub fn expected(
    acked: &[Ack],
    sample_type: &str,
) -> Result<BTreeMap<(String, String), BTreeMap<String, i64>>> {
    let mut cache: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    let mut out: BTreeMap<(String, String), BTreeMap<String, i64>> = BTreeMap::new();
    for a in acked {
        if !cache.contains_key(&a.file) {
            let e = read_expectation(
                &testdata()
                    .join("pprof/expected")
                    .join(format!("{}.folded.tsv.gz", a.file)),
            )?;
            cache.insert(
                a.file.clone(),
                e.get(sample_type).cloned().unwrap_or_default(),
            );
        }
        let series = out
            .entry((a.tenant.clone(), a.service.clone()))
            .or_default();
        for (stack, v) in &cache[&a.file] {
            *series.entry(stack.clone()).or_default() += v;
        }
    }
    Ok(out)
}
