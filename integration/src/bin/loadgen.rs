//! `loadgen`: pushes real corpus profiles at a set rate and prints what was
//! acknowledged. Example:
//!
//! ```text
//! cargo run -p fathom-integration --bin loadgen -- \
//!     --distributor http://127.0.0.1:7400 --tenants 4 --services 8 --rate 20 --seconds 60
//! ```

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::Parser;
use fathom_integration::loadgen::{LoadOptions, run};

#[derive(Parser)]
struct Args {
    /// Distributor base URL; repeat for several.
    #[arg(long, required = true)]
    distributor: Vec<String>,
    #[arg(long, default_value_t = 2)]
    tenants: usize,
    #[arg(long, default_value_t = 4)]
    services: usize,
    /// Writes per second.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Corpus file under ../shared/testdata/pprof; repeat for several.
    #[arg(
        long,
        default_value = "google+pprof/internal/report/testdata/sample.cpu"
    )]
    file: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let opts = LoadOptions {
        distributors: a.distributor,
        tenants: a.tenants,
        services: a.services,
        rate: a.rate,
        duration: Duration::from_secs(a.seconds),
        files: a.file,
        base_time_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs() as i64
            - a.seconds as i64 * 10,
        retry_for: Duration::from_secs(60),
    };
    let r = run(&opts, Arc::new(AtomicBool::new(false)))?;
    println!(
        "acknowledged {} writes ({:.1} MB) in {:.1} s, {} retries, {} never acknowledged",
        r.acked.len(),
        r.bytes as f64 / 1e6,
        r.elapsed.as_secs_f64(),
        r.retries,
        r.failed.len()
    );
    Ok(())
}
