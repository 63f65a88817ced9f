//! Where a series lives: each (tenant, label set) is placed on
//! ingesters by rendezvous hashing over the live ones, best first. The
//! distributors send a series' writes to its first `replication_factor`
//! ingesters; an ingester cutting its head leaves a series whose first
//! ingester is another live one to that ingester's block
//! (`fathom_ingester`).
//!
//! The hash is xxh3-64 over the ingester's id and the series key, written
//! byte by byte (never through std's `DefaultHasher`, which may change
//! between builds), so every process of every version picks the same
//! ingesters for the same series and live set. When an ingester leaves the
//! live set, only the series it held move.

use std::hash::{Hash, Hasher};

use fathom_model::{Id, IdHasher, Labels, TenantId};
use rendezvous_hash::{KeyValueNode, NodeHasher, RendezvousNodes};

use crate::cluster::IngesterAddr;

/// The key a series is placed by: tenant and labels (not the profile type,
/// so every type of one profile lands on the same ingesters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingKey(pub Id);

impl Hash for RingKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0.0);
    }
}

impl RingKey {
    pub fn of(tenant: &TenantId, labels: &Labels) -> RingKey {
        let mut h = IdHasher::new("ring");
        h.str(tenant.as_str()).u64(labels.len() as u64);
        for (k, v) in labels.iter() {
            h.str(k).str(v);
        }
        RingKey(h.finish())
    }
}

/// xxh3-64 of (ingester id, key): stable across builds and versions.
#[derive(Clone, Copy, Debug, Default)]
pub struct StableHasher;

impl NodeHasher<String> for StableHasher {
    fn hash<T: Hash>(&self, node: &String, item: &T) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(node.as_bytes());
        h.update(&[0xff]);
        item.hash(&mut h);
        h.digest()
    }
}

/// The `n` ingesters that hold `key`, best first.
pub fn replicas(live: &[IngesterAddr], key: &RingKey, n: usize) -> Vec<IngesterAddr> {
    let mut nodes = RendezvousNodes::new(StableHasher);
    for m in live {
        nodes.insert(KeyValueNode::new(m.id.clone(), m.addr.clone()));
    }
    nodes
        .calc_candidates(key)
        .take(n)
        .map(|n| IngesterAddr {
            id: n.key.clone(),
            addr: n.value.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashSet};

    fn members(n: usize) -> Vec<IngesterAddr> {
        (0..n)
            .map(|i| IngesterAddr {
                id: format!("ingester-{i}"),
                addr: format!("127.0.0.1:{}", 9000 + i),
            })
            .collect()
    }

    fn key(i: usize) -> RingKey {
        let labels = Labels::from_pairs([("service_name", format!("svc{i}"))]).unwrap();
        RingKey::of(&TenantId::new("t").unwrap(), &labels)
    }

    #[test]
    fn placement_is_stable_and_spread() {
        let live = members(5);
        let pinned: Vec<String> = replicas(&live, &key(0), 3)
            .into_iter()
            .map(|m| m.id)
            .collect();
        let again: Vec<String> = replicas(&live, &key(0), 3)
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(pinned, again);
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..1000 {
            let r = replicas(&live, &key(i), 3);
            assert_eq!(r.len(), 3);
            assert_eq!(r.iter().map(|m| &m.id).collect::<HashSet<_>>().len(), 3);
            for m in r {
                *counts.entry(m.id).or_default() += 1;
            }
        }
        // 3000 placements over 5 ingesters: each near 600.
        for (id, c) in &counts {
            assert!((450..750).contains(c), "{id} holds {c} of 3000");
        }
    }

    #[test]
    fn losing_an_ingester_moves_only_its_series() {
        let live = members(4);
        let fewer: Vec<IngesterAddr> = live[1..].to_vec();
        for i in 0..500 {
            let before = replicas(&live, &key(i), 3);
            let after = replicas(&fewer, &key(i), 3);
            let kept: Vec<&IngesterAddr> = before.iter().filter(|m| m.id != live[0].id).collect();
            for m in kept {
                assert!(after.contains(m), "series {i} moved off a live ingester");
            }
        }
    }

    #[test]
    fn hash_is_pinned() {
        // Changing the hash moves every series: this value must not change.
        let h = StableHasher.hash(&"ingester-a".to_owned(), &RingKey(Id::from_u128(42)));
        assert_eq!(h, 13_786_487_932_972_525_577);
        // ... which is xxh3 of the id, a separator and the key's 16 bytes.
        assert_eq!(h, {
            let mut x = xxhash_rust::xxh3::Xxh3::new();
            x.update(b"ingester-a\xff");
            x.update(&Id::from_u128(42).0);
            x.digest()
        });
    }
}
