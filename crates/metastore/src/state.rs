//! The replicated state machine: a pure function of the log.
//!
//! Nothing here reads a clock or does I/O: the proposing leader stamps its
//! clock into every [`Request`], so every node that applies the same log
//! reaches the same state.

use std::collections::BTreeMap;

use fathom_block::BlockMeta;
use serde::{Deserialize, Serialize};

use crate::types::{Command, Member, PendingDeletion, Request, Response};

/// A compaction job lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub(crate) owner: String,
    pub(crate) expires_at_ms: i64,
}

/// Everything the metastore replicates. Serialized as JSON for snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct State {
    /// Registered members by id.
    pub(crate) members: BTreeMap<String, Member>,
    /// Blocks by tenant, then id.
    pub(crate) blocks: BTreeMap<String, BTreeMap<String, BlockMeta>>,
    /// Removed blocks awaiting deletion of their files, by tenant, then id.
    pub(crate) pending: BTreeMap<String, BTreeMap<String, PendingDeletion>>,
    /// Compaction job leases by job name.
    pub(crate) leases: BTreeMap<String, Lease>,
}

impl State {
    pub(crate) fn apply(&mut self, req: &Request) -> Response {
        let now = req.now_ms;
        match &req.cmd {
            Command::Register { member } => {
                let mut m = member.clone();
                m.registered_at_ms = now;
                m.left = false;
                self.members.insert(m.id.clone(), m);
                Response::Done
            }
            Command::Leave { id } => match self.members.get_mut(id) {
                Some(m) => {
                    m.left = true;
                    Response::Done
                }
                None => Response::Rejected(format!("member {id:?} is not registered")),
            },
            Command::AddBlock { block } => {
                let removed = self
                    .pending
                    .get(&block.tenant)
                    .is_some_and(|p| p.contains_key(&block.id));
                // A retried add of a block that was added and has since been
                // replaced must not bring it back.
                if !removed {
                    self.blocks
                        .entry(block.tenant.clone())
                        .or_default()
                        .insert(block.id.clone(), block.clone());
                }
                Response::Done
            }
            Command::ReplaceBlocks {
                tenant,
                add,
                remove,
            } => self.replace(tenant, add, remove, now),
            Command::Purge { tenant, ids } => {
                if let Some(p) = self.pending.get_mut(tenant) {
                    for id in ids {
                        p.remove(id);
                    }
                    if p.is_empty() {
                        self.pending.remove(tenant);
                    }
                }
                Response::Done
            }
            Command::AcquireLease { job, owner, ttl_ms } => {
                let free = match self.leases.get(job) {
                    None => true,
                    Some(l) => l.owner == *owner || l.expires_at_ms <= now,
                };
                if free {
                    let ttl = i64::try_from(*ttl_ms).unwrap_or(i64::MAX);
                    self.leases.insert(
                        job.clone(),
                        Lease {
                            owner: owner.clone(),
                            expires_at_ms: now.saturating_add(ttl),
                        },
                    );
                }
                Response::Lease { granted: free }
            }
            Command::ReleaseLease { job, owner } => {
                if self.leases.get(job).is_some_and(|l| l.owner == *owner) {
                    self.leases.remove(job);
                }
                Response::Done
            }
        }
    }

    /// All or nothing: either every source is in the index (they move to
    /// pending deletion and `add` is added), or the command is refused. A
    /// retry of a replacement that was already applied is accepted as is.
    fn replace(
        &mut self,
        tenant: &str,
        add: &[BlockMeta],
        remove: &[String],
        now: i64,
    ) -> Response {
        let live = self.blocks.get(tenant);
        let missing: Vec<&String> = remove
            .iter()
            .filter(|id| !live.is_some_and(|m| m.contains_key(*id)))
            .collect();
        if !missing.is_empty() {
            let pending = self.pending.get(tenant);
            let already_applied = missing.len() == remove.len()
                && missing
                    .iter()
                    .all(|id| pending.is_some_and(|p| p.contains_key(*id)))
                && add
                    .iter()
                    .all(|b| live.is_some_and(|m| m.get(&b.id) == Some(b)));
            if already_applied {
                return Response::Done;
            }
            let shown: Vec<&str> = missing.iter().take(5).map(|s| s.as_str()).collect();
            return Response::Rejected(format!(
                "{} of the blocks to replace are not in the index of tenant {tenant} \
                 (already replaced or never added): {}{}",
                missing.len(),
                shown.join(", "),
                if missing.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            ));
        }
        let blocks = self.blocks.entry(tenant.to_owned()).or_default();
        let mut gone = Vec::with_capacity(remove.len());
        for id in remove {
            if let Some(b) = blocks.remove(id) {
                gone.push(b);
            }
        }
        for b in add {
            blocks.insert(b.id.clone(), b.clone());
        }
        if blocks.is_empty() {
            self.blocks.remove(tenant);
        }
        if !gone.is_empty() {
            let pending = self.pending.entry(tenant.to_owned()).or_default();
            for block in gone {
                pending.insert(
                    block.id.clone(),
                    PendingDeletion {
                        block,
                        removed_at_ms: now,
                    },
                );
            }
        }
        Response::Done
    }

    /// Blocks of `tenant` that may hold data in `[start, end]`.
    pub(crate) fn blocks(&self, tenant: &str, start: i64, end: i64) -> Vec<BlockMeta> {
        self.blocks
            .get(tenant)
            .map(|m| {
                m.values()
                    .filter(|b| b.overlaps(start, end))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(crate) fn all_blocks(&self) -> Vec<BlockMeta> {
        self.blocks
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// The tenants that have blocks.
    pub(crate) fn tenants(&self) -> Vec<String> {
        self.blocks
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(t, _)| t.clone())
            .collect()
    }

    pub(crate) fn pending_deletions(&self) -> Vec<PendingDeletion> {
        self.pending
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    pub(crate) fn block_count(&self) -> usize {
        self.blocks.values().map(|m| m.len()).sum()
    }

    pub(crate) fn pending_count(&self) -> usize {
        self.pending.values().map(|m| m.len()).sum()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::types::Role;

    pub(crate) fn block(tenant: &str, id: &str, min: i64, max: i64) -> BlockMeta {
        BlockMeta {
            format_version: fathom_block::FORMAT_VERSION,
            id: id.into(),
            tenant: tenant.into(),
            min_time_nanos: min,
            max_time_nanos: max,
            level: 0,
            source: "test".into(),
            compacted_from: Vec::new(),
            profile_types: vec!["process_cpu:cpu:nanoseconds:cpu:nanoseconds".into()],
            stats: Default::default(),
            created_at_ms: 0,
            rollup_widths_nanos: Vec::new(),
        }
    }

    fn req(now_ms: i64, cmd: Command) -> Request {
        Request { now_ms, cmd }
    }

    #[test]
    fn blocks_are_found_by_tenant_and_overlap() {
        let mut s = State::default();
        for b in [
            block("a", "1", 0, 10),
            block("a", "2", 20, 30),
            block("b", "3", 0, 30),
        ] {
            assert_eq!(
                s.apply(&req(0, Command::AddBlock { block: b })),
                Response::Done
            );
        }
        let ids = |v: Vec<BlockMeta>| v.into_iter().map(|b| b.id).collect::<Vec<_>>();
        assert_eq!(ids(s.blocks("a", 5, 25)), ["1", "2"]);
        assert_eq!(ids(s.blocks("a", 11, 19)), Vec::<String>::new());
        assert_eq!(ids(s.blocks("a", 10, 10)), ["1"]);
        assert_eq!(ids(s.blocks("b", 30, 40)), ["3"]);
        assert_eq!(s.block_count(), 3);
    }

    #[test]
    fn replace_is_all_or_nothing_and_idempotent() {
        let mut s = State::default();
        for id in ["1", "2"] {
            s.apply(&req(
                0,
                Command::AddBlock {
                    block: block("a", id, 0, 10),
                },
            ));
        }
        let compacted = block("a", "c", 0, 10);
        let cmd = Command::ReplaceBlocks {
            tenant: "a".into(),
            add: vec![compacted.clone()],
            remove: vec!["1".into(), "2".into()],
        };
        assert_eq!(s.apply(&req(7, cmd.clone())), Response::Done);
        assert_eq!(s.all_blocks(), vec![compacted.clone()]);
        let pending = s.pending_deletions();
        assert_eq!(pending.len(), 2);
        assert!(pending.iter().all(|p| p.removed_at_ms == 7));
        // A retry of the same replacement changes nothing and succeeds.
        let before = s.clone();
        assert_eq!(s.apply(&req(9, cmd)), Response::Done);
        assert_eq!(s, before);
        // A replacement of a source that is gone is refused as a whole.
        let other = Command::ReplaceBlocks {
            tenant: "a".into(),
            add: vec![block("a", "d", 0, 10)],
            remove: vec!["c".into(), "1".into()],
        };
        match s.apply(&req(10, other)) {
            Response::Rejected(m) => assert!(m.contains("1") && m.contains("tenant a"), "{m}"),
            r => panic!("expected a rejection, got {r:?}"),
        }
        assert_eq!(s, before);
        // A retried add of a replaced block does not bring it back.
        s.apply(&req(
            11,
            Command::AddBlock {
                block: block("a", "1", 0, 10),
            },
        ));
        assert_eq!(s, before);
        // Purge forgets pending deletions.
        s.apply(&req(
            12,
            Command::Purge {
                tenant: "a".into(),
                ids: vec!["1".into()],
            },
        ));
        assert_eq!(s.pending_count(), 1);
        s.apply(&req(
            12,
            Command::Purge {
                tenant: "a".into(),
                ids: vec!["2".into()],
            },
        ));
        assert_eq!(s.pending_count(), 0);
        assert!(s.pending.is_empty());
    }

    #[test]
    fn leases_are_exclusive_renewable_and_expire() {
        let mut s = State::default();
        let acquire = |s: &mut State, now, owner: &str| {
            s.apply(&req(
                now,
                Command::AcquireLease {
                    job: "j".into(),
                    owner: owner.into(),
                    ttl_ms: 100,
                },
            ))
        };
        assert_eq!(acquire(&mut s, 0, "x"), Response::Lease { granted: true });
        assert_eq!(acquire(&mut s, 50, "y"), Response::Lease { granted: false });
        assert_eq!(acquire(&mut s, 90, "x"), Response::Lease { granted: true });
        // Renewed at 90: still held at 150.
        assert_eq!(
            acquire(&mut s, 150, "y"),
            Response::Lease { granted: false }
        );
        assert_eq!(acquire(&mut s, 190, "y"), Response::Lease { granted: true });
        // Only the owner releases.
        s.apply(&req(
            200,
            Command::ReleaseLease {
                job: "j".into(),
                owner: "x".into(),
            },
        ));
        assert_eq!(
            acquire(&mut s, 200, "x"),
            Response::Lease { granted: false }
        );
        s.apply(&req(
            200,
            Command::ReleaseLease {
                job: "j".into(),
                owner: "y".into(),
            },
        ));
        assert_eq!(acquire(&mut s, 201, "x"), Response::Lease { granted: true });
    }

    #[test]
    fn registration_is_stamped_by_the_leader_clock() {
        let mut s = State::default();
        let mut m = Member::new("i1", Role::Ingester, "h:1");
        m.registered_at_ms = 999_999;
        s.apply(&req(42, Command::Register { member: m }));
        assert_eq!(s.members["i1"].registered_at_ms, 42);
        assert_eq!(s.members["i1"].role, Role::Ingester);
    }

    #[test]
    fn leave_marks_a_member_and_registration_clears_it() {
        let mut s = State::default();
        let left = s.apply(&req(1, Command::Leave { id: "i1".into() }));
        assert!(matches!(left, Response::Rejected(m) if m.contains("i1")));
        let m = Member::new("i1", Role::Ingester, "h:1");
        s.apply(&req(2, Command::Register { member: m.clone() }));
        assert_eq!(
            s.apply(&req(3, Command::Leave { id: "i1".into() })),
            Response::Done
        );
        assert!(s.members["i1"].left);
        s.apply(&req(4, Command::Register { member: m }));
        assert!(!s.members["i1"].left);
        // A snapshot written before members could leave reads as "not left".
        let old: State = serde_json::from_str(
            r#"{"members":{"i1":{"id":"i1","role":"Ingester","addr":"h:1","registered_at_ms":5}},"blocks":{},"pending":{},"leases":{}}"#,
        )
        .unwrap();
        assert!(!old.members["i1"].left);
        assert_eq!(old.members["i1"].registered_at_ms, 5);
    }
}
