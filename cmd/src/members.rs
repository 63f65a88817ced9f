//! `fathom members`: the cluster's members as the metastore knows them,
//! and forgetting one that is gone for good (`docs/operations.md`,
//! "Members").

use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use fathom_api::secret::ClusterSecret;
use fathom_metastore::{ClientOptions, Member, MemberState, MetastoreClient, Role};

use crate::cluster::SecretArgs;

#[derive(Args)]
pub(crate) struct MembersArgs {
    #[command(subcommand)]
    command: MembersCommand,
}

/// Where the metastore is, and the secret its calls carry.
#[derive(Args)]
struct Target {
    /// Metastore nodes, `host:port,host:port,…` (one reachable node is
    /// enough).
    #[arg(long, env = "FATHOM_METASTORE", value_delimiter = ',', required = true)]
    metastore: Vec<String>,
    #[command(flatten)]
    secret: SecretArgs,
}

#[derive(Subcommand)]
enum MembersCommand {
    /// Lists every registered member with its state: `live` (heartbeating),
    /// `left` (stopped after handing over its work, or forgotten) or `down`
    /// (neither: killed, crashed or cut off).
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Marks a member that is down as gone for good. For an ingester, head
    /// reads then stop counting it as a missed replica: writes that only it
    /// and replicas since lost acknowledged are given up. Refused for a live
    /// member (stop it instead: an ingester stopped with SIGTERM flushes its
    /// heads and leaves by itself). A process that registers under the name
    /// again is a member again, and one still running (forgotten while cut
    /// off) registers again at its next heartbeat.
    Forget {
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

impl Target {
    fn client(&self) -> anyhow::Result<MetastoreClient> {
        let secret = self.secret.given()?.unwrap_or_else(ClusterSecret::none);
        MetastoreClient::with_options(
            self.metastore.clone(),
            ClientOptions {
                secret,
                deadline: Duration::from_secs(10),
                ..ClientOptions::default()
            },
        )
        .context("--metastore")
    }
}

/// A member's state, given the live members.
fn state(m: &Member, live: &[Member]) -> MemberState {
    m.state(live.iter().any(|l| l.id == m.id))
}

pub(crate) async fn run(a: MembersArgs) -> anyhow::Result<()> {
    match a.command {
        MembersCommand::List { target } => {
            let (all, live) = listing(&target.client()?).await?;
            print!("{}", table(&all, &live));
        }
        MembersCommand::Forget { name, target } => {
            let client = target.client()?;
            let (all, live) = listing(&client).await?;
            let Some(m) = all.iter().find(|m| m.id == name) else {
                bail!(
                    "no member is registered as {name:?} (`fathom members list` shows the names)"
                );
            };
            match state(m, &live) {
                MemberState::Live => bail!(
                    "{name} is live (it heartbeats): stop it instead; an ingester stopped \
                     with SIGTERM flushes its heads and leaves by itself"
                ),
                MemberState::Left => println!("{name} has already left"),
                MemberState::Down => {
                    client
                        .leave(&name)
                        .await
                        .with_context(|| format!("forgetting {name}"))?;
                    if m.role == Role::Ingester {
                        println!(
                            "forgot ingester {name}: head reads no longer wait for it; \
                             writes only it and replicas since lost held are given up"
                        );
                    } else {
                        println!("forgot {} {name}", m.role);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every registered member, and the live ones.
async fn listing(client: &MetastoreClient) -> anyhow::Result<(Vec<Member>, Vec<Member>)> {
    let mut all = client.all_members(None).await.context("listing members")?;
    let live = client.members(None).await.context("listing members")?;
    all.sort_by(|a, b| (a.role.as_str(), &a.id).cmp(&(b.role.as_str(), &b.id)));
    Ok((all, live))
}

/// The listing as a table, one member a line.
fn table(all: &[Member], live: &[Member]) -> String {
    let mut out = format!(
        "{:<32} {:<12} {:<24} {:<5} REGISTERED\n",
        "NAME", "ROLE", "ADDRESS", "STATE"
    );
    for m in all {
        // 0 (or less): never stamped by a leader.
        let at = u64::try_from(m.registered_at_ms)
            .ok()
            .filter(|&ms| ms > 0)
            .map(|ms| humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)))
            .map_or_else(|| "?".to_owned(), |t| t.to_string());
        out.push_str(&format!(
            "{:<32} {:<12} {:<24} {:<5} {at}\n",
            m.id,
            m.role.as_str(),
            m.addr,
            state(m, live).as_str()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, role: Role, left: bool) -> Member {
        Member {
            registered_at_ms: 1_767_225_600_000,
            left,
            ..Member::new(id, role, "10.0.0.1:7400")
        }
    }

    #[test]
    fn a_member_is_live_left_or_down() {
        let all = [
            member("i-1", Role::Ingester, false),
            member("i-2", Role::Ingester, true),
            member("i-3", Role::Ingester, false),
            member("q-1", Role::Querier, false),
        ];
        let live = [all[2].clone(), all[3].clone()];
        let states: Vec<MemberState> = all.iter().map(|m| state(m, &live)).collect();
        assert_eq!(
            states,
            [
                MemberState::Down,
                MemberState::Left,
                MemberState::Live,
                MemberState::Live
            ]
        );
        let t = table(&all, &live);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(lines[0].starts_with("NAME"), "{t}");
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "i-1",
                "ingester",
                "10.0.0.1:7400",
                "down",
                "2026-01-01T00:00:00Z"
            ]
        );
        assert!(lines[2].contains(" left "), "{t}");
        // A stamp no leader set shows as unknown, not as 1970.
        let never = Member {
            registered_at_ms: 0,
            ..member("d-1", Role::Distributor, false)
        };
        assert!(table(&[never], &[]).lines().nth(1).unwrap().ends_with(" ?"));
    }
}
