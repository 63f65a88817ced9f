//! What each ingester's head holds, as far as this distributor knows: per
//! tenant, the stacks each ingester acknowledged under the head number its
//! answers carry (`WriteResponse.head`, which grows with every cut and
//! across restarts), as one set of stacks with a bit per ingester. A
//! write leaves out the stacks that every replica of its series holds
//! (record format 5): the pprof normalizer does not build them and the
//! replicas neither read nor store them again, as a single process's
//! ingester does for its own head.
//!
//! What is remembered may be stale: a head cut or an ingester restarted
//! since. The replica then refuses the record (`FAILED_PRECONDITION`),
//! this record of it is dropped, and the write is built again whole
//! ([`crate::WriteError::LeftOut`]). Nothing here decides what is stored,
//! only how much of it a write carries.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fathom_api::cluster::IngesterAddr;
use fathom_model::{HeldStacks, Id, IdMap, Labels, TenantId};
use parking_lot::{Mutex, RwLock};

use crate::ring::{RingKey, replicas};

/// The most stack ids remembered over every tenant (about 30 bytes each,
/// so ~130 MB at most): past it, everything is forgotten and learned again
/// from the next writes.
pub(crate) const MAX_ACKED_STACKS: usize = 1 << 22;

/// The most replicas remembered per tenant: one bit of a stack's mask
/// each. A further replica takes the bit of the one acknowledged least
/// recently (an ingester that left the ring stops answering), whose
/// stacks are forgotten.
const MAX_REPLICAS_PER_TENANT: usize = u64::BITS as usize;

/// Writes whose reliances ([`Consulted`]) are kept for their sending at
/// most: a write that left stacks out but was refused before it was sent
/// (a limit) leaves its entry behind, and the oldest go first. A write
/// whose entry went is sent without `held_under`, and its replicas look
/// its stacks up.
const MAX_PENDING_WRITES: usize = 4096;

/// See the module documentation.
pub(crate) struct Acked {
    inner: RwLock<Inner>,
    /// [`MAX_ACKED_STACKS`], but for tests.
    limit: usize,
    /// What each write being built relied on, by its token
    /// ([`HeldStacks::generation`] of its [`ReplicaStacks`]).
    pending: Mutex<BTreeMap<u64, Arc<Consulted>>>,
    next_token: AtomicU64,
}

impl Default for Acked {
    fn default() -> Self {
        Acked {
            inner: RwLock::default(),
            limit: MAX_ACKED_STACKS,
            pending: Mutex::default(),
            next_token: AtomicU64::new(1),
        }
    }
}

/// The head number of every replica whose acknowledged stacks one write's
/// answers came from, so that the replica can take the stacks the write
/// leaves out without looking them up while its head keeps that number
/// (`Record.held_under`). `None` for a replica seen under two numbers
/// within the write (a cut answered in between): it looks them up.
#[derive(Debug)]
pub(crate) struct Consulted {
    /// The ring view the write was built for: sent on another, a group
    /// may reach a replica that was not asked about its stacks.
    live: Arc<Vec<IngesterAddr>>,
    heads: Mutex<HashMap<String, Option<u64>>>,
}

#[derive(Default)]
struct Inner {
    by: HashMap<TenantId, Tenant>,
    /// Stack ids over every tenant.
    ids: usize,
    /// Counts acknowledgements: when each replica was last heard from.
    clock: u64,
}

/// What the replicas of one tenant's series acknowledged: one set of
/// stacks with a bit per replica, so that whether every replica of a
/// series holds a stack is one lookup, however many replicas it has.
#[derive(Default)]
struct Tenant {
    /// The replicas, by bit: at most [`MAX_REPLICAS_PER_TENANT`].
    replicas: Vec<Replica>,
    /// Per stack, the replicas that acknowledged it under their current
    /// head (never 0: a stack no replica holds is removed).
    stacks: IdMap<u64>,
}

struct Replica {
    ingester: String,
    /// The head number its stacks were acknowledged under; 0: none
    /// (forgotten).
    head: u64,
    /// [`Inner::clock`] at its last acknowledgement.
    last: u64,
}

impl Tenant {
    /// The position (and bit) of `ingester`, if it has one.
    fn slot(&self, ingester: &str) -> Option<usize> {
        self.replicas.iter().position(|r| r.ingester == ingester)
    }

    /// The position of `ingester`, given one: a new bit while there are
    /// bits left, else the least recently acknowledged replica's, its
    /// stacks forgotten.
    fn slot_for(&mut self, ingester: &str, ids: &mut usize) -> usize {
        if let Some(i) = self.slot(ingester) {
            return i;
        }
        let fresh = Replica {
            ingester: ingester.to_owned(),
            head: 0,
            last: 0,
        };
        if self.replicas.len() < MAX_REPLICAS_PER_TENANT {
            self.replicas.push(fresh);
            return self.replicas.len() - 1;
        }
        let i = (0..self.replicas.len())
            .min_by_key(|&i| self.replicas[i].last)
            .unwrap_or(0);
        self.clear(1 << i, ids);
        self.replicas[i] = fresh;
        i
    }

    /// Takes `bit` off every stack, counting those removed off `ids`.
    fn clear(&mut self, bit: u64, ids: &mut usize) {
        let before = self.stacks.len();
        self.stacks.retain(|_, held| {
            *held &= !bit;
            *held != 0
        });
        *ids -= before - self.stacks.len();
    }
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
        if g.ids >= self.limit {
            g.by.clear();
            g.ids = 0;
        }
        let limit = self.limit;
        let Inner { by, ids, clock } = &mut *g;
        *clock += 1;
        let t = by.entry(tenant.clone()).or_default();
        let i = t.slot_for(ingester, ids);
        let bit = 1u64 << i;
        t.replicas[i].last = *clock;
        let known = t.replicas[i].head;
        if head < known {
            // Answered before a cut that a later answer already showed.
            return;
        }
        if head > known {
            if known != 0 {
                t.clear(bit, ids);
            }
            t.replicas[i].head = head;
            remember(&mut t.stacks, bit, ids, limit, named);
        } else {
            remember(&mut t.stacks, bit, ids, limit, sent);
        }
    }

    /// `ingester`'s head no longer holds what it acknowledged for `tenant`.
    pub(crate) fn forget(&self, ingester: &str, tenant: &TenantId) {
        let mut g = self.inner.write();
        let Inner { by, ids, .. } = &mut *g;
        let Some(t) = by.get_mut(tenant) else {
            return;
        };
        if let Some(i) = t.slot(ingester) {
            t.clear(1 << i, ids);
            t.replicas[i].head = 0;
        }
    }

    /// A write of `tenant` about to be built for the ring view `live`: its
    /// answers, and a token under which the writer finds what they relied
    /// on ([`Acked::relied_on`]).
    pub(crate) fn stacks_for(
        self: &Arc<Self>,
        tenant: &TenantId,
        live: Arc<Vec<IngesterAddr>>,
        replication_factor: usize,
    ) -> ReplicaStacks {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let consulted = Arc::new(Consulted {
            live: live.clone(),
            heads: Mutex::default(),
        });
        ReplicaStacks {
            acked: self.clone(),
            live,
            tenant: tenant.clone(),
            replication_factor,
            token,
            consulted,
        }
    }

    /// Keeps what the write `token` relied on for its sending, once it
    /// leaves a stack out (a write that leaves none out keeps nothing).
    fn register(&self, token: u64, consulted: &Arc<Consulted>) {
        let mut p = self.pending.lock();
        p.entry(token).or_insert_with(|| consulted.clone());
        while p.len() > MAX_PENDING_WRITES {
            p.pop_first();
        }
    }

    /// The head number, per replica, under which the write built with
    /// `token` found the stacks it leaves out acknowledged, when it is sent
    /// on the ring view it was built for (else none: every replica looks
    /// them up). Once per write: the entry is taken.
    pub(crate) fn relied_on(&self, token: u64, live: &[IngesterAddr]) -> HashMap<String, u64> {
        let Some(c) = self.pending.lock().remove(&token) else {
            return HashMap::new();
        };
        if *c.live != live {
            return HashMap::new();
        }
        let heads = c.heads.lock();
        heads
            .iter()
            .filter_map(|(id, head)| Some((id.clone(), (*head)?)))
            .collect()
    }

    /// Whether every ingester of `to` holds each of `ids` for `tenant`;
    /// the head numbers the answers came from go in `consulted`.
    fn holds(
        &self,
        tenant: &TenantId,
        to: &[IngesterAddr],
        ids: &[Id],
        consulted: &Consulted,
    ) -> Vec<bool> {
        let g = self.inner.read();
        let t = g.by.get(tenant);
        // The bits of every replica of `to`, if each has one.
        let all = t.and_then(|t| {
            to.iter()
                .try_fold(0u64, |all, r| Some(all | 1 << t.slot(&r.id)?))
                .filter(|&all| all != 0)
        });
        let (Some(t), Some(all)) = (t, all) else {
            return vec![false; ids.len()];
        };
        let held: Vec<bool> = ids
            .iter()
            .map(|id| t.stacks.get(id).is_some_and(|&h| h & all == all))
            .collect();
        if held.contains(&true) {
            let mut heads = consulted.heads.lock();
            // Every replica of `to` has a slot: `all` has its bit.
            for replica in to.iter().filter_map(|r| Some(&t.replicas[t.slot(&r.id)?])) {
                heads
                    .entry(replica.ingester.clone())
                    .and_modify(|h| {
                        if *h != Some(replica.head) {
                            *h = None;
                        }
                    })
                    .or_insert(Some(replica.head));
            }
        }
        held
    }

    /// How many stack ids are remembered (for tests and the debug log).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.read().ids
    }
}

/// Marks `new` held by `bit` in `stacks`, counting the stacks added in
/// `ids`, up to `limit` in all.
fn remember<'a>(
    stacks: &mut IdMap<u64>,
    bit: u64,
    ids: &mut usize,
    limit: usize,
    new: impl IntoIterator<Item = &'a Id>,
) {
    for id in new {
        match stacks.get_mut(id) {
            Some(held) => *held |= bit,
            None if *ids < limit => {
                stacks.insert(*id, bit);
                *ids += 1;
            }
            None => break,
        }
    }
}

/// The stacks every replica of a series holds, for one write of `tenant`
/// placed on the ring view `live` ([`HeldStacks`]). Its "generation" is
/// the write's token: a batch that leaves stacks out carries it
/// ([`fathom_model::Symbols::relies_on`]), and the writer finds by it the
/// head numbers to send each replica ([`Acked::relied_on`]); each replica
/// checks them against its own head.
pub(crate) struct ReplicaStacks {
    acked: Arc<Acked>,
    live: Arc<Vec<IngesterAddr>>,
    tenant: TenantId,
    replication_factor: usize,
    token: u64,
    consulted: Arc<Consulted>,
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
        self.token
    }

    fn holds(&self, series: &Labels, ids: &[Id]) -> Vec<bool> {
        let key = RingKey::of(&self.tenant, series);
        let to = replicas(&self.live, &key, self.replication_factor);
        let held = self.acked.holds(&self.tenant, &to, ids, &self.consulted);
        if held.contains(&true) {
            self.acked.register(self.token, &self.consulted);
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(r: std::ops::Range<u64>) -> Vec<Id> {
        r.map(|i| Id::from_u128(u128::from(i) + 1)).collect()
    }

    /// [`Acked::holds`] for a write whose reliances are not looked at.
    fn holds(a: &Acked, t: &TenantId, to: &[IngesterAddr], ids: &[Id]) -> Vec<bool> {
        let c = Consulted {
            live: Arc::new(to.to_vec()),
            heads: Mutex::default(),
        };
        a.holds(t, to, ids, &c)
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
        assert_eq!(holds(&a, &t, &to, &all), vec![false; 4], "nothing known");
        a.acknowledged("ingester-0", &t, 10, &all[..3], &all[..3]);
        assert_eq!(holds(&a, &t, &to, &all), vec![false; 4], "one replica only");
        a.acknowledged("ingester-1", &t, 20, &all[1..], &all[1..]);
        assert_eq!(holds(&a, &t, &to, &all), vec![false, true, true, false]);
        assert_eq!(
            holds(&a, &TenantId::new("u").unwrap(), &to, &all),
            vec![false; 4],
            "per tenant"
        );
        // An answer from before a cut that a later one showed: ignored.
        a.acknowledged("ingester-0", &t, 9, &all[3..], &all[3..]);
        assert_eq!(holds(&a, &t, &to, &all), vec![false, true, true, false]);
        // A cut: the new head holds only what it took since.
        a.acknowledged("ingester-0", &t, 11, &all[..1], &all[2..3]);
        assert_eq!(holds(&a, &t, &to, &all), vec![false, false, true, false]);
        // Under the same head only what the record carried is new: the
        // stacks it named but left out were already there.
        a.acknowledged("ingester-0", &t, 11, &all[..0], &all[3..]);
        assert_eq!(holds(&a, &t, &to, &all), vec![false, false, true, false]);
        // Distinct stacks: ingester-0 holds 2, ingester-1 holds 1 to 3.
        assert_eq!(a.len(), 3);
        a.forget("ingester-1", &t);
        assert_eq!(holds(&a, &t, &to, &all), vec![false; 4]);
        assert_eq!(a.len(), 1);
        a.forget("ingester-9", &t);
        assert_eq!(a.len(), 1, "an ingester never seen: nothing to forget");
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
        assert_eq!(holds(&a, &t, &[addr(0)], &many[..1]), vec![false]);
        assert_eq!(holds(&a, &t, &[addr(1)], &more[..1]), vec![true]);
    }

    /// Past the bits of a stack's mask, a new replica takes the bit of
    /// the one acknowledged least recently, whose stacks are forgotten;
    /// a cut of one replica leaves the others' bits.
    #[test]
    fn a_new_replica_past_the_mask_takes_the_least_recent_bit() {
        let t = TenantId::new("t").unwrap();
        let a = Acked::default();
        let all = ids(0..2);
        let name = |i: usize| format!("ingester-{i}");
        for i in 0..MAX_REPLICAS_PER_TENANT {
            a.acknowledged(&name(i), &t, 1, &all, &all);
        }
        // ingester-0 answers again: ingester-1 is now the least recent.
        a.acknowledged(&name(0), &t, 1, &all[..0], &all);
        let last = MAX_REPLICAS_PER_TENANT - 1;
        assert_eq!(holds(&a, &t, &[addr(1), addr(last)], &all), vec![true; 2]);
        let new = MAX_REPLICAS_PER_TENANT;
        a.acknowledged(&name(new), &t, 1, &all[..1], &all[..1]);
        assert_eq!(holds(&a, &t, &[addr(new)], &all), vec![true, false]);
        assert_eq!(holds(&a, &t, &[addr(1)], &all), vec![false; 2], "evicted");
        assert_eq!(holds(&a, &t, &[addr(0), addr(2)], &all), vec![true; 2]);
        // A cut of one replica leaves the others' bits.
        a.acknowledged(&name(last), &t, 2, &all[..1], &all[..1]);
        assert_eq!(holds(&a, &t, &[addr(last)], &all), vec![true, false]);
        assert_eq!(holds(&a, &t, &[addr(0)], &all), vec![true; 2]);
        assert_eq!(a.len(), 2);
    }

    /// A write finds the head number each replica's answers came from,
    /// once, on the ring view it was built for; a replica seen under two
    /// numbers within one write gets none, and so does every replica of a
    /// write sent on another view.
    #[test]
    fn a_write_finds_the_heads_its_answers_came_from() {
        let t = TenantId::new("t").unwrap();
        let a = Arc::new(Acked::default());
        let live = Arc::new(vec![addr(0), addr(1)]);
        let series = Labels::from_pairs([("service_name", "svc")]).unwrap();
        let all = ids(0..4);
        a.acknowledged("ingester-0", &t, 10, &all, &all);
        a.acknowledged("ingester-1", &t, 20, &all, &all);
        let heads = |pairs: &[(&str, u64)]| -> HashMap<String, u64> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };

        let w = a.stacks_for(&t, live.clone(), 2);
        assert_eq!(w.holds(&series, &all), vec![true; 4]);
        assert_eq!(
            a.relied_on(w.generation(), &live),
            heads(&[("ingester-0", 10), ("ingester-1", 20)])
        );
        assert_eq!(a.relied_on(w.generation(), &live), heads(&[]), "taken once");

        // A cut of ingester-0 answered between two questions of a write.
        let w = a.stacks_for(&t, live.clone(), 2);
        assert_eq!(w.holds(&series, &all[..2]), vec![true; 2]);
        a.acknowledged("ingester-0", &t, 11, &all, &all);
        assert_eq!(w.holds(&series, &all[2..]), vec![true; 2]);
        assert_eq!(
            a.relied_on(w.generation(), &live),
            heads(&[("ingester-1", 20)])
        );

        // Nothing held: nothing relied on, nothing kept.
        let w = a.stacks_for(&TenantId::new("u").unwrap(), live.clone(), 2);
        assert_eq!(w.holds(&series, &all), vec![false; 4]);
        assert!(a.pending.lock().is_empty());
        assert_eq!(a.relied_on(w.generation(), &live), heads(&[]));

        // Sent on another ring view: none.
        let w = a.stacks_for(&t, live.clone(), 2);
        assert_eq!(w.holds(&series, &all), vec![true; 4]);
        assert_eq!(a.relied_on(w.generation(), &[addr(0)]), heads(&[]));

        // Writes never sent are forgotten past the bound, oldest first.
        let first = a.stacks_for(&t, live.clone(), 2);
        first.holds(&series, &all);
        let rest: Vec<_> = (0..MAX_PENDING_WRITES)
            .map(|_| {
                let w = a.stacks_for(&t, live.clone(), 2);
                w.holds(&series, &all);
                w
            })
            .collect();
        assert_eq!(a.pending.lock().len(), MAX_PENDING_WRITES);
        assert_eq!(a.relied_on(first.generation(), &live), heads(&[]));
        let last = rest.last().unwrap();
        assert_eq!(a.relied_on(last.generation(), &live).len(), 2);
    }
}
