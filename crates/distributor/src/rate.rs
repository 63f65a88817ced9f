//! Per-tenant ingestion rate: a token bucket of bytes per tenant. A
//! request takes its received bytes from its tenant's bucket or is refused
//! with 429 and the seconds after which it would fit; one tenant's bucket
//! never touches another's, and the lock is held for a few arithmetic
//! operations only.

use std::collections::HashMap;
use std::time::Instant;

use fathom_api::ApiError;
use fathom_model::TenantId;
use parking_lot::Mutex;

#[derive(Default)]
pub(crate) struct Buckets(Mutex<HashMap<TenantId, Bucket>>);

struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Buckets {
    /// Takes `n` bytes from `tenant`'s bucket (`rate` bytes/s, at most
    /// `burst` bytes).
    pub(crate) fn take(
        &self,
        tenant: &TenantId,
        n: u64,
        rate: u64,
        burst: u64,
    ) -> Result<(), ApiError> {
        self.take_at(tenant, n, rate, burst, Instant::now())
    }

    /// Whether `n` bytes would fit in `tenant`'s bucket now, without taking
    /// them: lets a request over the rate be refused before its body is
    /// read (the write itself still takes its bytes with [`Buckets::take`]).
    pub(crate) fn check(
        &self,
        tenant: &TenantId,
        n: u64,
        rate: u64,
        burst: u64,
    ) -> Result<(), ApiError> {
        let map = self.0.lock();
        let Some(b) = map.get(tenant) else {
            return Ok(());
        };
        let (rate_f, burst_f) = (rate.max(1) as f64, burst as f64);
        let tokens = b.refilled(Instant::now(), rate_f, burst_f);
        let n_f = (n as f64).min(burst_f);
        if tokens >= n_f {
            return Ok(());
        }
        Err(throttled(tenant, rate, burst, (n_f - tokens) / rate_f))
    }

    fn take_at(
        &self,
        tenant: &TenantId,
        n: u64,
        rate: u64,
        burst: u64,
        now: Instant,
    ) -> Result<(), ApiError> {
        if n > burst {
            return Err(ApiError::TooLarge(format!(
                "the request has {n} bytes, more than tenant {tenant}'s ingestion burst of {burst} bytes"
            )));
        }
        let (rate_f, burst_f, n_f) = (rate.max(1) as f64, burst as f64, n as f64);
        let mut map = self.0.lock();
        let b = map.entry(tenant.clone()).or_insert(Bucket {
            tokens: burst_f,
            at: now,
        });
        b.tokens = b.refilled(now, rate_f, burst_f);
        b.at = now;
        if b.tokens >= n_f {
            b.tokens -= n_f;
            return Ok(());
        }
        Err(throttled(tenant, rate, burst, (n_f - b.tokens) / rate_f))
    }
}

impl Bucket {
    /// The tokens the bucket holds at `now`: refilled at `rate` per second
    /// since it was last taken from, at most `burst`.
    fn refilled(&self, now: Instant, rate: f64, burst: f64) -> f64 {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        (self.tokens + dt * rate).min(burst)
    }
}

fn throttled(tenant: &TenantId, rate: u64, burst: u64, wait_secs: f64) -> ApiError {
    let wait = wait_secs.ceil().max(1.0);
    ApiError::Throttled {
        message: format!(
            "tenant {tenant} is over its ingestion rate of {rate} bytes/s (burst {burst}); retry in {wait} s"
        ),
        retry_after_secs: wait as u64,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bucket_refills_at_the_rate_and_tenants_are_separate() {
        let b = Buckets::default();
        let a = TenantId::new("a").unwrap();
        let c = TenantId::new("c").unwrap();
        let t0 = Instant::now();
        b.take_at(&a, 100, 10, 100, t0).unwrap();
        let e = b.take_at(&a, 20, 10, 100, t0).unwrap_err();
        match e {
            ApiError::Throttled {
                retry_after_secs, ..
            } => assert_eq!(retry_after_secs, 2),
            e => panic!("expected a throttle, got {e:?}"),
        }
        // Another tenant's bucket is full.
        b.take_at(&c, 100, 10, 100, t0).unwrap();
        // Two seconds later 20 bytes fit, 1 more does not.
        let t2 = t0 + Duration::from_secs(2);
        b.take_at(&a, 20, 10, 100, t2).unwrap();
        assert!(b.take_at(&a, 1, 10, 100, t2).is_err());
        // `check` takes nothing: a tenant never seen fits, an empty bucket
        // does not (its rate is 1 byte/s here, so it stays empty).
        assert!(b.check(&TenantId::new("new").unwrap(), 50, 10, 100).is_ok());
        b.take(&c, 0, 1, 100).unwrap();
        let e = TenantId::new("e").unwrap();
        b.take(&e, 100, 1, 100).unwrap();
        assert!(matches!(
            b.check(&e, 50, 1, 100),
            Err(ApiError::Throttled { .. })
        ));
        assert!(matches!(
            b.check(&e, 50, 1, 100),
            Err(ApiError::Throttled { .. })
        ));
        // Larger than the burst: never fits, a size refusal.
        assert!(matches!(
            b.take_at(&a, 101, 10, 100, t2),
            Err(ApiError::TooLarge(_))
        ));
    }
}
