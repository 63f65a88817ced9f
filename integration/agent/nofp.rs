//! A Rust workload WITHOUT frame pointers (a plain release build) for the
//! agent's unwinding tests: `rustc -C opt-level=2 -g nofp.rs -o nofprs`.
//!
//! `nofprs <seconds>` spins in `rs_hot`, called as
//! main -> rs_level1 -> rs_level2 -> rs_level3 -> rs_level4 -> rs_hot,
//! for <seconds> of the process's CPU time (see hot.c).

use std::hint::black_box;

fn cpu_now() -> f64 {
    // /proc/self/stat: utime and stime in clock ticks (100 Hz).
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

#[inline(never)]
fn rs_hot(n: u64) -> u64 {
    let mut x = n;
    for i in 0..20_000_000u64 {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

macro_rules! level {
    ($name:ident, $next:ident) => {
        #[inline(never)]
        fn $name(n: u64) -> u64 {
            let r = $next(black_box(n + 1));
            black_box(r) ^ n
        }
    };
}

level!(rs_level4, rs_hot);
level!(rs_level3, rs_level4);
level!(rs_level2, rs_level3);
level!(rs_level1, rs_level2);

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .expect("usage: nofprs <seconds>");
    let until = cpu_now() + secs;
    let mut n = 1u64;
    while cpu_now() < until {
        n = rs_level1(n);
    }
    black_box(n);
}
