//! End-to-end tests against the real `fathom` binary: one test binary for
//! the whole crate, one module per area.

#[path = "../../agent/e2e_agent.rs"]
mod agent;
mod auth;
mod bad_input;
mod blocks;
mod bounded;
mod cluster;
mod cluster_secret;
mod corpus;
mod deploy;
mod docs_examples;
mod flight;
mod grafana;
mod import;
mod jfr;
mod otlp;
mod push_v1;
mod pyroscope_client;
mod speedscope;
mod startup;
mod symbols;
mod tracing;
mod ui;
