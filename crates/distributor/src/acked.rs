//! What each ingester's head holds, as far as this distributor knows: per
//! (ingester, tenant), the stacks it acknowledged under the head number its
//! answers carry (`WriteResponse.head`, which grows with every cut and
//! across restarts). A write leaves out the stacks that every replica of
//! its series holds (record format 5): the pprof normalizer does not build
//! them and the replicas neither read nor store them again, as a single
//! process's ingester does for its own head.
//!
//! What is remembered may be stale: a head cut or an ingester restarted
//! since. The replica then refuses the record (`FAILED_PRECONDITION`),
//! this record of it is dropped, and the write is built again whole
//! ([`crate::WriteError::LeftOut`]). Nothing here decides what is stored,
//! only how much of it a write carries.

use std::collections::HashMap;
use std::sync::Arc;

use fathom_api::cluster::IngesterAddr;
use fathom_model::{HeldStacks, Id, IdSet, Labels, TenantId};
use parking_lot::RwLock;

use crate::ring::{RingKey, replicas};

/// The most stack ids remembered over every ingester and tenant (about 40
/// bytes each, so ~170 MB at most): past it, everything is forgotten and
/// learned again from the next writes.
pub(crate) const MAX_ACKED_STACKS: usize = 1 << 22;

/// See the module documentation.
pub(crate) struct Acked {
    inner: RwLock<Inner>,
    /// [`MAX_ACKED_STACKS`], but for tests.
    limit: usize,
}

impl Default for Acked {
    fn default() -> Self {
        Acked {
            inner: RwLock::default(),
            limit: MAX_ACKED_STACKS,
        }
    }
}

#[derive(Default)]
struct Inner {
    by: HashMap<(String, TenantId), Entry>,
    /// Stack ids over every entry.
    ids: usize,
}

struct Entry {
    head: u64,
    stacks: IdSet,
}

impl Acked {
    /// `ingester` took a write of `tenant` into the head numbered `head`:
    /// `sent`, the stacks its record carried, and `named`, every stack its
    /// samples name (those it left out too). Under the head already
    /// remembered only `sent` can be new; a later head starts over from
    /// `named`. Only the iterator needed is read.
    pub(crate) fn acknowledged<'a>(
        &self,
        ingester: &str,
        tenant: &TenantId,
        head: u64,
        sent: impl IntoIterator<Item = &'a Id>,
        named: impl IntoIterator<Item = &'a Id>,
    ) {
        if head == 0 {
            // An ingester that predates head numbers.
            return;
        }
        let mut g = self.inner.write();
        let key = (ingester.to_owned(), tenant.clone());
        if g.by.get(&key).is_some_and(|e| head < e.head) {
            // Answered before a cut that a later answer already showed.
            return;
        }
        if g.ids >= self.limit {
            g.by.clear();
            g.ids = 0;
        }
        let limit = self.limit;
        let Inner { by, ids } = &mut *g;
        let e = by.entry(key).or_insert_with(|| Entry {
            head: 0,
            stacks: IdSet::default(),
        });
        let stacks: Box<dyn Iterator<Item = &Id>> = if head > e.head {
            *ids -= e.stacks.len();
            e.stacks.clear();
            e.head = head;
            Box::new(named.into_iter())
        } else {
            Box::new(sent.into_iter())
        };
        for id in stacks {
            if *ids >= limit {
                break;
            }
            if e.stacks.insert(*id) {
                *ids += 1;
            }
        }
    }

    /// `ingester`'s head no longer holds what it acknowledged for `tenant`.
    pub(crate) fn forget(&self, ingester: &str, tenant: &TenantId) {
        let mut g = self.inner.write();
        if let Some(e) = g.by.remove(&(ingester.to_owned(), tenant.clone())) {
            g.ids -= e.stacks.len();
        }
    }

    /// Whether every ingester of `to` holds each of `ids` for `tenant`.
    fn holds(&self, tenant: &TenantId, to: &[IngesterAddr], ids: &[Id]) -> Vec<bool> {
        let g = self.inner.read();
        let entries: Option<Vec<&Entry>> = to
            .iter()
            .map(|r| g.by.get(&(r.id.clone(), tenant.clone())))
            .collect();
        match entries {
            Some(es) if !es.is_empty() => ids
                .iter()
                .map(|id| es.iter().all(|e| e.stacks.contains(id)))
                .collect(),
            _ => vec![false; ids.len()],
        }
    }

    /// How many stack ids are remembered (for tests and the debug log).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.read().ids
    }
}

/// The stacks every replica of a series holds, for one write of `tenant`
/// placed on the ring view `live` ([`HeldStacks`]; the generation is
/// always 0: each replica checks the record against its own head).
pub(crate) struct ReplicaStacks {
    pub(crate) acked: Arc<Acked>,
    pub(crate) live: Arc<Vec<IngesterAddr>>,
    pub(crate) tenant: TenantId,
    pub(crate) replication_factor: usize,
}

impl std::fmt::Debug for ReplicaStacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaStacks")
            .field("tenant", &self.tenant)
            .field("live", &self.live.len())
            .finish()
    }
}

impl HeldStacks for ReplicaStacks {
    fn generation(&self) -> u64 {
        0
    }

    fn holds(&self, series: &Labels, ids: &[Id]) -> Vec<bool> {
        let key = RingKey::of(&self.tenant, series);
        let to = replicas(&self.live, &key, self.replication_factor);
        self.acked.holds(&self.tenant, &to, ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(r: std::ops::Range<u64>) -> Vec<Id> {
        r.map(|i| Id::from_u128(u128::from(i) + 1)).collect()
    }

    fn addr(i: usize) -> IngesterAddr {
        IngesterAddr {
            id: format!("ingester-{i}"),
            addr: format!("127.0.0.1:{}", 9000 + i),
        }
    }

    /// A stack counts as held only when every replica acknowledged it
    /// under its current head; a later head starts over, an earlier
    /// answer changes nothing, and a refusal forgets the replica.
    #[test]
    fn held_means_acknowledged_by_every_replica_under_its_head() {
        let t = TenantId::new("t").unwrap();
        let a = Acked::default();
        let to = [addr(0), addr(1)];
        let all = ids(0..4);
        assert_eq!(a.holds(&t, &to, &all), vec![false; 4], "nothing known");
        a.acknowledged("ingester-0", &t, 10, &all[..3], &all[..3]);
        assert_eq!(a.holds(&t, &to, &all), vec![false; 4], "one replica only");
        a.acknowledged("ingester-1", &t, 20, &all[1..], &all[1..]);
        assert_eq!(a.holds(&t, &to, &all), vec![false, true, true, false]);
        assert_eq!(
            a.holds(&TenantId::new("u").unwrap(), &to, &all),
            vec![false; 4],
            "per tenant"
        );
        // An answer from before a cut that a later one showed: ignored.
        a.acknowledged("ingester-0", &t, 9, &all[3..], &all[3..]);
        assert_eq!(a.holds(&t, &to, &all), vec![false, true, true, false]);
        // A cut: the new head holds only what it took since.
        a.acknowledged("ingester-0", &t, 11, &all[..1], &all[2..3]);
        assert_eq!(a.holds(&t, &to, &all), vec![false, false, true, false]);
        // Under the same head only what the record carried is new: the
        // stacks it named but left out were already there.
        a.acknowledged("ingester-0", &t, 11, &all[..0], &all[3..]);
        assert_eq!(a.holds(&t, &to, &all), vec![false, false, true, false]);
        assert_eq!(a.len(), 1 + 3);
        a.forget("ingester-1", &t);
        assert_eq!(a.holds(&t, &to, &all), vec![false; 4]);
        assert_eq!(a.len(), 1);
        // Head 0 (an ingester without head numbers) is never remembered.
        a.acknowledged("ingester-1", &t, 0, &all, &all);
        assert_eq!(a.len(), 1);
    }

    /// The record is bounded: past the limit it starts over.
    #[test]
    fn the_record_of_acknowledged_stacks_is_bounded() {
        let t = TenantId::new("t").unwrap();
        let a = Acked {
            limit: 100,
            ..Acked::default()
        };
        let many = ids(0..100);
        a.acknowledged("ingester-0", &t, 1, &many, &many);
        assert_eq!(a.len(), 100);
        let more = ids(100..105);
        a.acknowledged("ingester-1", &t, 1, &more, &more);
        assert_eq!(a.len(), 5, "started over");
        assert_eq!(a.holds(&t, &[addr(0)], &many[..1]), vec![false]);
        assert_eq!(a.holds(&t, &[addr(1)], &more[..1]), vec![true]);
    }
}
