//! Profiles a hot function with the Rust Pyroscope SDK and pushes to the
//! server given as the first argument for the seconds given as the second,
//! as tenant the third.

use std::time::{Duration, Instant};

use pyroscope::backend::{pprof_backend, BackendConfig, PprofConfig};
use pyroscope::pyroscope::PyroscopeAgentBuilder;

#[inline(never)]
fn fathom_hot_function(n: u64) -> u64 {
    let mut x = 0u64;
    for i in 0..n {
        x = x.wrapping_add(i.wrapping_mul(i) ^ (x >> 3));
    }
    x
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).ok_or("usage: pyroscope-rs-app <url> <seconds> <tenant>")?;
    let secs: u64 = args.get(2).ok_or("seconds")?.parse()?;
    let tenant = args.get(3).ok_or("tenant")?;
    let agent = PyroscopeAgentBuilder::new(
        url,
        "rustapp",
        100,
        "pyroscope-rs",
        "e2e",
        pprof_backend(PprofConfig::default(), BackendConfig::default()),
    )
    .tags(vec![("env", "e2e")])
    .tenant_id(tenant.clone())
    .basic_auth("user", "secret")
    .upload_interval(Duration::from_secs(2))
    .build()?;
    let running = agent.start()?;
    let t0 = Instant::now();
    let mut sink = 0u64;
    while t0.elapsed() < Duration::from_secs(secs) {
        sink = sink.wrapping_add(fathom_hot_function(std::hint::black_box(5_000_000)));
    }
    println!("{sink}");
    running.stop()?.shutdown();
    Ok(())
}
