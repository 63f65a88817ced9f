//! A Rust workload with a known hot function for the agent's end-to-end
//! tests. Built with frame pointers:
//! `rustc -C force-frame-pointers=yes -C opt-level=2 -g hot.rs -o hotrs`.
//!
//! `hotrs <seconds>` spins in `rust_hot`, called as
//! `main -> rust_outer -> rust_middle -> rust_hot`.

use std::hint::black_box;
use std::time::{Duration, Instant};

#[inline(never)]
fn rust_hot(n: u64) -> u64 {
    let mut x = n;
    for i in 0..20_000_000u64 {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

#[inline(never)]
fn rust_middle(n: u64) -> u64 {
    black_box(rust_hot(n)).wrapping_add(1)
}

#[inline(never)]
fn rust_outer(n: u64) -> u64 {
    black_box(rust_middle(n)).wrapping_add(1)
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut n = 1;
    while Instant::now() < until {
        n = rust_outer(n);
    }
    black_box(n);
}
