//! The querier's edges: every protocol through which users ask the query
//! engine (`fathom-querier`) something. The engine knows nothing of them;
//! they know only its public API ([`fathom_querier::Querier`]'s queries,
//! its renderers and its SQL catalog) and map its errors to HTTP and gRPC
//! through [`fathom_api::ApiError`], the one mapping.
//!
//! ```text
//!  HTTP /api/v1/* (http.rs) ────────────────┐
//!  Pyroscope query API: Connect             │
//!    querier.v1.QuerierService/*,           ├──► fathom_querier::Querier
//!    /pyroscope/render[-diff] (pyroscope/)  │      plan, merge, range, diff,
//!  Arrow Flight (JSON tickets) and          │      series, SQL (DataFusion),
//!    Flight SQL (flight.rs) ────────────────┘      render (folded, flame graph, top)
//! ```
//!
//! `crates/server` mounts [`router`] and [`flight_service`] on the querier's
//! (and `fathom all`'s) port, behind authentication.
//!
//! Invariants: every request names one tenant (`X-Scope-OrgID` /
//! `x-scope-orgid`), validated before it reaches the engine; bad input is a
//! 4xx naming the problem; every query runs under the engine's memory limit
//! and timeout.

#[cfg(test)]
mod cancel_tests;
mod flight;
mod http;
mod pyroscope;

pub use flight::{FathomFlight, flight_service};
pub use http::router;
