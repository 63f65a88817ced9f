//! A Rust workload with a known hot function for the agent's end-to-end
//! tests. Built with frame pointers:
//! `rustc -C force-frame-pointers=yes -C opt-level=2 -g hot.rs -o hotrs`.
//!
//! `hotrs <seconds>` spins in `rust_hot`, called as
//! `main -> rust_outer -> rust_middle -> rust_hot`, until the process has
//! had <seconds> of CPU time (not wall time: the samples a profiler takes
//! follow the CPU a process gets, so a loaded machine only makes it slower).

use std::hint::black_box;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

unsafe extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Linux's `CLOCK_PROCESS_CPUTIME_ID`.
const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;

/// The CPU time this process has had, in seconds.
fn cpu_seconds() -> f64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (x86_64/aarch64 Linux
    // layout: two 64-bit fields).
    let rc = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

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
    // Relative to now: a process's CPU time carries over an exec.
    let until = cpu_seconds() + secs;
    let mut n = 1;
    while cpu_seconds() < until {
        n = rust_outer(n);
    }
    black_box(n);
}
