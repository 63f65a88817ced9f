//! A bound on the write requests a distributor works on at once, so that
//! many large requests arriving together cannot exhaust its memory.
//!
//! Each request takes one of `max_requests` slots and reserves its body
//! size (`Content-Length`, or the largest body allowed when it is not
//! given) from a budget of `max_bytes`, before its body is read. Both are
//! given back when the response is sent. A request that finds no slot or
//! not enough budget is refused at once, not queued: HTTP 503 with
//! `Retry-After`, or gRPC `UNAVAILABLE`. The memory a request drives is
//! bounded by [`crate::Limits`]; these bounds multiply it by at most
//! `max_requests`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;

/// Seconds a refused client is asked to wait.
const RETRY_AFTER_SECS: &str = "1";

/// The reservation unit of the byte budget.
const UNIT: usize = 1024;

/// How many write requests, and how many bytes of their bodies, a
/// distributor works on at once.
#[derive(Clone, Debug)]
pub struct InflightConfig {
    pub max_requests: usize,
    pub max_bytes: usize,
}

impl Default for InflightConfig {
    fn default() -> Self {
        InflightConfig {
            max_requests: 32,
            max_bytes: 256 << 20,
        }
    }
}

/// The bound itself; cheap to clone. See the module documentation.
#[derive(Clone)]
pub struct Inflight {
    requests: Arc<Semaphore>,
    units: Arc<Semaphore>,
    max_units: usize,
    /// Reserved for a request without `Content-Length`.
    unknown_units: usize,
    in_flight: Gauge,
    refused: Counter,
}

impl Inflight {
    /// `max_body_bytes` is what a request without `Content-Length` reserves.
    pub fn new(cfg: &InflightConfig, max_body_bytes: usize, registry: &mut Registry) -> Self {
        let max_units = cfg
            .max_bytes
            .div_ceil(UNIT)
            .clamp(1, Semaphore::MAX_PERMITS);
        let s = Inflight {
            requests: Arc::new(Semaphore::new(
                cfg.max_requests.clamp(1, Semaphore::MAX_PERMITS),
            )),
            units: Arc::new(Semaphore::new(max_units)),
            max_units,
            unknown_units: max_body_bytes.div_ceil(UNIT).max(1),
            in_flight: Gauge::default(),
            refused: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("fathom_distributor");
        r.register(
            "inflight_requests",
            "Write requests being worked on",
            s.in_flight.clone(),
        );
        r.register(
            "inflight_refusals",
            "Write requests refused (503) because too many, or too many bytes, were in flight",
            s.refused.clone(),
        );
        s
    }

    /// `router` with every route behind the bound (routes merged later are
    /// not).
    pub fn layer(&self, router: axum::Router) -> axum::Router {
        router.layer(axum::middleware::from_fn_with_state(self.clone(), limit))
    }
}

async fn limit(State(l): State<Inflight>, req: Request, next: Next) -> Response {
    let units = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(l.unknown_units, |n| n.div_ceil(UNIT).max(1))
        .min(l.max_units);
    let grpc = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let permits = l.requests.clone().try_acquire_owned().ok().and_then(|r| {
        let u = u32::try_from(units).ok()?;
        Some((r, l.units.clone().try_acquire_many_owned(u).ok()?))
    });
    let Some(_permits) = permits else {
        l.refused.inc();
        tracing::debug!(path = %req.uri().path(), "refused a write: too many in flight");
        let msg = "the distributor is busy with other writes; retry in a second";
        let mut resp = if grpc {
            tonic::Status::unavailable(msg).into_http::<axum::body::Body>()
        } else {
            fathom_api::ApiError::Unavailable(msg.into()).into_response()
        };
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
        );
        return resp;
    };
    l.in_flight.inc();
    let resp = next.run(req).await;
    l.in_flight.dec();
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use tower::ServiceExt;

    /// A route that holds each request until `release` gives it a permit.
    fn app(l: &Inflight, release: Arc<Semaphore>) -> axum::Router {
        l.layer(axum::Router::new().route(
            "/ingest",
            post(move |body: axum::body::Bytes| {
                let release = release.clone();
                async move {
                    release.acquire().await.unwrap().forget();
                    format!("{}", body.len())
                }
            }),
        ))
    }

    fn req(len: usize) -> Request {
        Request::post("/ingest")
            .header(axum::http::header::CONTENT_LENGTH, len)
            .body(axum::body::Body::from(vec![0u8; len]))
            .unwrap()
    }

    async fn wait_in_flight(l: &Inflight, n: i64) {
        for _ in 0..1000 {
            if l.in_flight.get() == n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        panic!("{} in flight, not {n}", l.in_flight.get());
    }

    #[tokio::test]
    async fn too_many_requests_are_refused_with_retry_after_then_accepted() {
        let cfg = InflightConfig {
            max_requests: 2,
            max_bytes: 1 << 20,
        };
        let l = Inflight::new(&cfg, 1 << 20, &mut Registry::default());
        let release = Arc::new(Semaphore::new(0));
        let a = app(&l, release.clone());
        let held: Vec<_> = (0..2)
            .map(|_| tokio::spawn(a.clone().oneshot(req(10))))
            .collect();
        wait_in_flight(&l, 2).await;
        let r = a.clone().oneshot(req(10)).await.unwrap();
        assert_eq!(r.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[axum::http::header::RETRY_AFTER], "1");
        assert_eq!(l.refused.get(), 1);
        // A gRPC caller gets UNAVAILABLE.
        let g = Request::post("/push.v1.PusherService/Push")
            .header(axum::http::header::CONTENT_TYPE, "application/grpc")
            .body(axum::body::Body::empty())
            .unwrap();
        let r = a.clone().oneshot(g).await.unwrap();
        assert_eq!(r.headers()["grpc-status"], "14");
        // Once the held requests finish, new ones are served again.
        release.add_permits(2);
        for h in held {
            assert_eq!(
                h.await.unwrap().unwrap().status(),
                axum::http::StatusCode::OK
            );
        }
        wait_in_flight(&l, 0).await;
        let next = tokio::spawn(a.clone().oneshot(req(10)));
        wait_in_flight(&l, 1).await;
        release.add_permits(1);
        assert_eq!(
            next.await.unwrap().unwrap().status(),
            axum::http::StatusCode::OK
        );
    }

    #[tokio::test]
    async fn the_byte_budget_bounds_large_bodies() {
        let cfg = InflightConfig {
            max_requests: 100,
            max_bytes: 100 * 1024,
        };
        let l = Inflight::new(&cfg, 1 << 20, &mut Registry::default());
        let release = Arc::new(Semaphore::new(0));
        let a = app(&l, release.clone());
        // 60 KiB in flight: another 60 KiB does not fit, 30 KiB does.
        let big = tokio::spawn(a.clone().oneshot(req(60 * 1024)));
        wait_in_flight(&l, 1).await;
        let r = a.clone().oneshot(req(60 * 1024)).await.unwrap();
        assert_eq!(r.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        let small = tokio::spawn(a.clone().oneshot(req(30 * 1024)));
        wait_in_flight(&l, 2).await;
        // Without Content-Length a request reserves the largest body (1
        // MiB, capped to the whole budget): it waits for an empty budget.
        let chunked = Request::post("/ingest")
            .body(axum::body::Body::from("x"))
            .unwrap();
        let r = a.clone().oneshot(chunked).await.unwrap();
        assert_eq!(r.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        release.add_permits(2);
        big.await.unwrap().unwrap();
        small.await.unwrap().unwrap();
        wait_in_flight(&l, 0).await;
        assert_eq!(l.units.available_permits(), 100);
    }
}
