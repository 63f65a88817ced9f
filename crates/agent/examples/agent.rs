//! Runs the agent standalone, as `fathom agent` will:
//!
//! ```sh
//! cargo run -p fathom-agent --example agent -- --remote http://127.0.0.1:7400
//! ```

use clap::Parser;

#[derive(Parser)]
#[command(about = "The Fathom agent (standalone example)")]
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
