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
    /// Log format: text or json.
    #[arg(long, env = "FATHOM_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(flatten)]
    agent: fathom_agent::AgentArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    fathom_agent::init_logging(cli.log_format == "json");
    fathom_agent::run_until_signal(cli.agent).await
}
