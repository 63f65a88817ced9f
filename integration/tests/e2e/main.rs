//! End-to-end tests against the real `fathom` binary: one test binary for
//! the whole crate, one module per area.

mod bad_input;
mod blocks;
mod corpus;
mod pyroscope_client;
