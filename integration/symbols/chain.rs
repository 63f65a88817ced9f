//! A Rust workload with a known call chain for the server-side symbols
//! tests: `main -> rust_outer -> rust_inlined (always inlined) -> rust_leaf`.
//! `chainrs <seconds>` spins until the process has had <seconds> of CPU.

use std::hint::black_box;
use std::time::Instant;

#[inline(never)]
fn rust_leaf(n: u64) -> u64 {
    let mut x = n;
    for i in 0..5_000_000u64 {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

#[inline(always)]
fn rust_inlined(n: u64) -> u64 {
    black_box(rust_leaf(n)) ^ n
}

#[inline(never)]
fn rust_outer(n: u64) -> u64 {
    black_box(rust_inlined(n)).wrapping_add(1)
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(30.0);
    // Wall time: the workload only needs to run while it is sampled.
    let t0 = Instant::now();
    let mut acc = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        acc = acc.wrapping_add(rust_outer(acc));
    }
    black_box(acc);
}
