//! Latency histograms shared by the roles' metrics.

use std::time::{Duration, Instant};

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// A histogram of durations in seconds, with buckets from 50 µs doubling
/// to about 1.6 s: a write path's stages (a decode, a WAL commit, a
/// replicated write) on a healthy server fall well inside it, and a stall
/// of a second still shows in its own bucket.
#[derive(Clone, Debug)]
pub struct Seconds(Histogram);

impl Default for Seconds {
    fn default() -> Self {
        Seconds(Histogram::new(exponential_buckets(50e-6, 2.0, 16)))
    }
}

impl Seconds {
    /// For work that takes seconds (a head cut): buckets from 10 ms
    /// doubling to about 5 minutes.
    pub fn slow() -> Self {
        Seconds(Histogram::new(exponential_buckets(0.01, 2.0, 16)))
    }

    /// Records the time since `start`.
    pub fn since(&self, start: Instant) {
        self.observe(start.elapsed());
    }

    /// Records `d`.
    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }

    /// The histogram, to register.
    pub fn histogram(&self) -> Histogram {
        self.0.clone()
    }
}
