//! `fathom-agent`: the agent alone, with the flags of `fathom agent`.
//!
//! ```sh
//! cargo run -p fathom-agent --bin fathom-agent -- --remote http://127.0.0.1:7400
//! ```
//!
//! The same agent as `fathom agent`, in a binary without the server
//! roles: a tenth of the size, so less of it is mapped and relocated in
//! every host's memory (docs/agent.md, Overhead).

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "fathom-agent",
    version,
    about = "The Fathom agent: profiles every process on this host and pushes to --remote"
)]
struct Cli {
    #[command(flatten)]
    agent: fathom_agent::AgentArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = tx.send(true);
    });
    fathom_agent::run(cli.agent, rx).await
}
