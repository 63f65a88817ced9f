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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fathom_api::cluster::IngesterAddr;
use fathom_model::{HeldStacks, Id, IdSet, Labels, TenantId};
use parking_lot::{Mutex, RwLock};

use crate::ring::{RingKey, replicas};

/// The most stack ids remembered over every ingester and tenant (about 40
/// bytes each, so ~170 MB at most): past it, everything is forgotten and
/// learned again from the next writes.
pub(crate) const MAX_ACKED_STACKS: usize = 1 << 22;

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
        if head > e.head {
            *ids -= e.stacks.len();
            e.stacks.clear();
            e.head = head;
            remember(&mut e.stacks, ids, limit, named);
        } else {
            remember(&mut e.stacks, ids, limit, sent);
        }
    }

    /// `ingester`'s head no longer holds what it acknowledged for `tenant`.
    pub(crate) fn forget(&self, ingester: &str, tenant: &TenantId) {
        let mut g = self.inner.write();
        if let Some(e) = g.by.remove(&(ingester.to_owned(), tenant.clone())) {
            g.ids -= e.stacks.len();
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
        let entries: Option<Vec<(&str, &Entry)>> = to
            .iter()
            .map(|r| {
                g.by.get(&(r.id.clone(), tenant.clone()))
                    .map(|e| (r.id.as_str(), e))
            })
            .collect();
        match entries {
            Some(es) if !es.is_empty() => {
                let held: Vec<bool> = ids
                    .iter()
                    .map(|id| es.iter().all(|(_, e)| e.stacks.contains(id)))
                    .collect();
                if held.iter().any(|&h| h) {
                    let mut heads = consulted.heads.lock();
                    for (id, e) in &es {
                        heads
                            .entry((*id).to_owned())
                            .and_modify(|h| {
                                if *h != Some(e.head) {
                                    *h = None;
                                }
                            })
                            .or_insert(Some(e.head));
                    }
                }
                held
            }
            _ => vec![false; ids.len()],
        }
    }

    /// How many stack ids are remembered (for tests and the debug log).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.read().ids
    }
}

/// Adds `new` to `stacks`, counting them in `ids`, up to `limit` in all.
fn remember<'a>(
    stacks: &mut IdSet,
    ids: &mut usize,
    limit: usize,
    new: impl IntoIterator<Item = &'a Id>,
) {
    for id in new {
        if *ids >= limit {
            break;
        }
        if stacks.insert(*id) {
            *ids += 1;
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
        assert_eq!(a.len(), 1 + 3);
        a.forget("ingester-1", &t);
        assert_eq!(holds(&a, &t, &to, &all), vec![false; 4]);
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
        assert_eq!(holds(&a, &t, &[addr(0)], &many[..1]), vec![false]);
        assert_eq!(holds(&a, &t, &[addr(1)], &more[..1]), vec![true]);
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
