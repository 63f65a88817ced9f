//! Replicas that share the storing of their cuts ([`Ingester::set_peers`]):
//! each stores the series it comes first for, and of the others only what
//! the first ingester's blocks do not hold. Three in-process ingesters on
//! one store and block index, the ring a fixed list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fathom_api::cluster::{IngesterAddr, StaticIngesters};
use fathom_api::ring::{RingKey, replicas};
use fathom_block::{BlockIndex, MemoryIndex};
use fathom_model::{Id, IngestBatch, Labels, TenantId};
use object_store::memory::InMemory;
use prometheus_client::registry::Registry;

use crate::tests::batch;
use crate::{Config, Ingester};

const NAMES: [&str; 3] = ["ing-a", "ing-b", "ing-c"];

fn ring() -> Vec<IngesterAddr> {
    NAMES
        .iter()
        .map(|n| IngesterAddr {
            id: (*n).to_owned(),
            addr: format!("{n}:9095"),
        })
        .collect()
}

/// The ingester the distributors' placement puts first for `svc`.
fn first_for(svc: &str) -> String {
    let labels = Labels::from_pairs([("service_name", svc)]).unwrap();
    let key = RingKey::of(&TenantId::new("t").unwrap(), &labels);
    replicas(&ring(), &key, 1).remove(0).id
}

/// A profile of series `svc` (its id from `seed`).
fn profile(seed: u64, svc: &str) -> IngestBatch {
    let mut b = batch("t", seed, 1);
    b.profiles[0].labels = Labels::from_pairs([("service_name", svc)]).unwrap();
    b
}

struct Cluster {
    _dirs: Vec<tempfile::TempDir>,
    store: Arc<InMemory>,
    index: Arc<MemoryIndex>,
    ingesters: Vec<Arc<Ingester>>,
}

/// Three ingesters in one ring, each waiting up to `wait` for the others.
fn cluster(wait: Duration) -> Cluster {
    let store = Arc::new(InMemory::new());
    let index = Arc::new(MemoryIndex::default());
    let mut dirs = Vec::new();
    let mut ingesters = Vec::new();
    for name in NAMES {
        let dir = tempfile::tempdir().unwrap();
        let ing = Ingester::open(
            Config {
                data_dir: dir.path().to_owned(),
                name: name.into(),
                flush_interval: Duration::from_secs(3600),
                max_head_bytes: 1 << 30,
                max_head_memory: 1 << 30,
            },
            store.clone(),
            index.clone(),
            &mut Registry::default(),
        )
        .unwrap();
        ing.set_peers(Arc::new(StaticIngesters(ring())), wait);
        dirs.push(dir);
        ingesters.push(ing);
    }
    Cluster {
        _dirs: dirs,
        store,
        index,
        ingesters,
    }
}

impl Cluster {
    /// Every stored profile and the sources of the blocks holding it.
    async fn stored(&self) -> BTreeMap<Id, Vec<String>> {
        let mut out: BTreeMap<Id, Vec<String>> = BTreeMap::new();
        for meta in self.index.all().await.unwrap() {
            let rows = fathom_block::read_profiles(self.store.as_ref(), &meta)
                .await
                .unwrap();
            // A block's series are those of its profiles.
            let series = fathom_block::read_series(self.store.as_ref(), &meta)
                .await
                .unwrap();
            let ids: BTreeSet<Id> = rows.iter().map(|r| r.series_id).collect();
            assert_eq!(
                series.iter().map(|s| s.series_id).collect::<BTreeSet<_>>(),
                ids,
                "block {} has series without profiles",
                meta.id
            );
            for r in rows {
                out.entry(r.profile_id)
                    .or_default()
                    .push(meta.source.clone());
            }
        }
        out
    }
}

fn svc(i: u64) -> String {
    format!("svc{i}")
}

/// All three replicas get every write and cut at once: each profile is
/// stored once, by the ingester that comes first for its series, and
/// every WAL is emptied.
#[tokio::test]
async fn replicas_that_got_every_write_store_each_profile_once() {
    let c = cluster(Duration::from_secs(20));
    let mut want = BTreeMap::new();
    for seed in 0..30u64 {
        let s = svc(seed % 10);
        for ing in &c.ingesters {
            assert_eq!(ing.write(profile(seed, &s)).await.unwrap(), 1);
        }
        want.insert(profile(seed, &s).profiles[0].id, first_for(&s));
    }
    // The ten series are spread over all three.
    assert_eq!(want.values().collect::<BTreeSet<_>>().len(), 3);
    let (a, b, cc) = tokio::join!(
        c.ingesters[0].flush(None),
        c.ingesters[1].flush(None),
        c.ingesters[2].flush(None)
    );
    for blocks in [a, b, cc] {
        assert!(!blocks.unwrap().is_empty());
    }
    let stored = c.stored().await;
    assert_eq!(stored.len(), want.len(), "every profile stored");
    for (id, sources) in &stored {
        assert_eq!(sources, &vec![want[id].clone()], "profile {id:?}");
    }
    for ing in &c.ingesters {
        assert!(
            ing.snapshot(&TenantId::new("t").unwrap(), 0, i64::MAX)
                .profiles
                .is_empty()
        );
        assert_eq!(ing.wal_disk_bytes(), 0, "every stored segment dropped");
    }
}

/// A replica that missed some writes (they reached a quorum without it)
/// stores its series' profiles it got; the replica that got the others
/// stores those once the wait is over. Nothing is lost, and what the
/// first ingester's block holds is not stored twice.
#[tokio::test]
async fn profiles_a_peer_missed_are_stored_after_the_wait() {
    let c = cluster(Duration::from_millis(300));
    // A series each ingester comes first for.
    let mut by_first: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..100 {
        by_first.entry(first_for(&svc(i))).or_insert_with(|| svc(i));
        if by_first.len() == 3 {
            break;
        }
    }
    let (b_name, b_svc) = (NAMES[1], by_first[NAMES[1]].clone());
    let a = &c.ingesters[0];
    let b = &c.ingesters[1];
    // Profiles 1..=3 of b's series reach a and b; 4..=6 reach a alone.
    for seed in 1..=6u64 {
        a.write(profile(seed, &b_svc)).await.unwrap();
        if seed <= 3 {
            b.write(profile(seed, &b_svc)).await.unwrap();
        }
    }
    let b_blocks = b.flush(None).await.unwrap();
    assert_eq!(b_blocks.len(), 1);
    assert!(b_blocks.iter().all(|m| m.source == b_name));
    // b's block came before a's cut: a waits, then stores 4..=6 alone.
    let a_blocks = a.flush(None).await.unwrap();
    assert_eq!(a_blocks.len(), 1, "{a_blocks:?}");
    let stored = c.stored().await;
    assert_eq!(stored.len(), 6);
    for seed in 1..=6u64 {
        let id = profile(seed, &b_svc).profiles[0].id;
        let want = if seed <= 3 { b_name } else { NAMES[0] };
        assert_eq!(stored[&id], vec![want.to_owned()], "profile {seed}");
    }
    assert_eq!(a.wal_disk_bytes(), 0);
}

/// A peer that stores nothing (down, or its cut not come) leaves its
/// series to the replicas that have them: after the wait, a stores
/// every profile itself.
#[tokio::test]
async fn a_peer_that_stores_nothing_delays_the_cut_by_the_wait_only() {
    let c = cluster(Duration::from_millis(200));
    let a = &c.ingesters[0];
    for seed in 0..12u64 {
        a.write(profile(seed, &svc(seed))).await.unwrap();
    }
    let blocks = a.flush(None).await.unwrap();
    // Its own series in one block, the rest in another.
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let stored = c.stored().await;
    assert_eq!(stored.len(), 12);
    assert!(stored.values().all(|s| s == &vec![NAMES[0].to_owned()]));
    assert_eq!(a.wal_disk_bytes(), 0);
}

/// A shutdown's cut (a deadline) and a zero wait store the head whole.
#[tokio::test]
async fn a_shutdown_cut_or_a_zero_wait_stores_the_head_whole() {
    for zero_wait in [false, true] {
        let c = cluster(if zero_wait {
            Duration::ZERO
        } else {
            Duration::from_secs(20)
        });
        let a = &c.ingesters[0];
        for seed in 0..12u64 {
            a.write(profile(seed, &svc(seed))).await.unwrap();
        }
        let deadline = (!zero_wait).then(|| std::time::Instant::now() + Duration::from_secs(20));
        let blocks = a.flush(deadline).await.unwrap();
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].stats.profiles, 12);
    }
}

/// A peer's block made after this cut froze its head that holds none of
/// the series the peer comes first for (the rest of the peer's earlier
/// cut) does not end the wait: the cut waits on for the peer's own
/// series, and stores nothing its block then holds.
#[tokio::test]
async fn the_rest_of_a_peers_earlier_cut_does_not_end_the_wait() {
    let c = cluster(Duration::from_secs(20));
    let mut by_first: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..100 {
        by_first.entry(first_for(&svc(i))).or_insert_with(|| svc(i));
        if by_first.len() == 3 {
            break;
        }
    }
    let (a, b) = (c.ingesters[0].clone(), c.ingesters[1].clone());
    // b stores what c comes first for after a short wait (c stores nothing).
    b.set_peers(
        Arc::new(StaticIngesters(ring())),
        Duration::from_millis(100),
    );
    let b_svc = by_first[NAMES[1]].clone();
    let c_svc = by_first[NAMES[2]].clone();
    for seed in 1..=3u64 {
        a.write(profile(seed, &b_svc)).await.unwrap();
    }
    let a_cut = tokio::spawn(async move { a.flush(None).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // After a's freeze: b's block of c's series alone...
    // (within the time range of a's profiles, which a looks up)
    let mut other = profile(10, &c_svc);
    other.profiles[0].time_nanos = 1_002;
    b.write(other).await.unwrap();
    let rest = b.flush(None).await.unwrap();
    assert_eq!(rest.len(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!a_cut.is_finished(), "a stopped waiting at b's other block");
    // ... then b's own series.
    for seed in 1..=3u64 {
        b.write(profile(seed, &b_svc)).await.unwrap();
    }
    b.flush(None).await.unwrap();
    let a_blocks = a_cut.await.unwrap();
    assert!(a_blocks.is_empty(), "a stored {a_blocks:?}");
    let stored = c.stored().await;
    for seed in 1..=3u64 {
        let id = profile(seed, &b_svc).profiles[0].id;
        assert_eq!(stored[&id], vec![NAMES[1].to_owned()], "profile {seed}");
    }
}
