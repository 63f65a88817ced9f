//! Real metastore nodes on loopback ports in one process.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fathom_block::{BlockIndex, BlockMeta};
use fathom_metastore::{
    ClientOptions, Member, MetastoreClient, MetastoreConfig, MetastoreError, MetastoreNode, Role,
};

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn block(tenant: &str, id: &str, min: i64, max: i64) -> BlockMeta {
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
        stats: fathom_block::BlockStats {
            samples: 7,
            ..Default::default()
        },
        created_at_ms: 1,
        rollup_widths_nanos: Vec::new(),
    }
}

fn ids(blocks: &[BlockMeta]) -> Vec<String> {
    let mut v: Vec<String> = blocks.iter().map(|b| b.id.clone()).collect();
    v.sort();
    v
}

struct Cluster {
    cfgs: Vec<MetastoreConfig>,
    nodes: Vec<Option<MetastoreNode>>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(n: u64, heartbeat_timeout: Duration) -> Cluster {
        init_tracing();
        let dir = tempfile::tempdir().unwrap();
        let peers: Vec<(u64, String)> = (1..=n)
            .map(|id| (id, format!("127.0.0.1:{}", free_port())))
            .collect();
        let cfgs: Vec<MetastoreConfig> = peers
            .iter()
            .map(|(id, addr)| MetastoreConfig {
                node_id: *id,
                listen: addr.parse().unwrap(),
                advertise: addr.clone(),
                data_dir: dir.path().join(format!("node{id}")),
                peers: peers.clone(),
                heartbeat_timeout,
                election_timeout: (Duration::from_millis(400), Duration::from_millis(800)),
                raft_heartbeat_interval: Duration::from_millis(100),
                snapshot_every: 20,
                serve: true,
                secret: fathom_api::secret::ClusterSecret::none(),
            })
            .collect();
        let mut nodes = Vec::new();
        for c in &cfgs {
            nodes.push(Some(MetastoreNode::start(c.clone()).await.unwrap()));
        }
        Cluster {
            cfgs,
            nodes,
            _dir: dir,
        }
    }

    fn addrs(&self) -> Vec<String> {
        self.cfgs.iter().map(|c| c.advertise.clone()).collect()
    }

    fn client(&self) -> MetastoreClient {
        MetastoreClient::new(self.addrs()).unwrap()
    }

    fn node(&self, i: usize) -> &MetastoreNode {
        self.nodes[i].as_ref().unwrap()
    }

    /// Index of the node that leads, once every running node agrees.
    async fn wait_leader(&self, within: Duration) -> usize {
        let t0 = Instant::now();
        loop {
            let running: Vec<(usize, &MetastoreNode)> = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
                .collect();
            let leaders: Vec<usize> = running
                .iter()
                .filter(|(_, n)| n.is_leader())
                .map(|(i, _)| *i)
                .collect();
            if let [l] = leaders[..] {
                let id = self.node(l).node_id();
                if running
                    .iter()
                    .all(|(_, n)| n.leader().map(|(lid, _)| lid) == Some(id))
                {
                    return l;
                }
            }
            assert!(
                t0.elapsed() < within,
                "no agreed leader within {within:?} (leaders: {leaders:?})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(&mut self, i: usize) {
        self.nodes[i].take().unwrap().shutdown().await;
    }

    async fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].is_none());
        self.nodes[i] = Some(MetastoreNode::start(self.cfgs[i].clone()).await.unwrap());
    }

    /// Waits until node `i`'s own state machine holds exactly `want`.
    async fn wait_local_blocks(&self, i: usize, want: &[&str], within: Duration) {
        let t0 = Instant::now();
        loop {
            let got = ids(&self.node(i).local_blocks());
            if got == want {
                return;
            }
            assert!(
                t0.elapsed() < within,
                "node {} has blocks {got:?}, want {want:?}",
                i + 1
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_replicate_and_serve_clients_through_a_follower() {
    let c = Cluster::start(3, Duration::from_secs(15)).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    // A client that only knows a follower is redirected to the leader.
    let client = MetastoreClient::new([c.cfgs[follower].advertise.clone()]).unwrap();
    client.add_block(block("t1", "b1", 0, 100)).await.unwrap();
    for i in 0..3 {
        c.wait_local_blocks(i, &["b1"], Duration::from_secs(5))
            .await;
    }
    let got = client.blocks("t1", 50, 60).await.unwrap();
    assert_eq!(got, vec![block("t1", "b1", 0, 100)]);
    assert!(client.blocks("t1", 101, 200).await.unwrap().is_empty());
    assert!(client.blocks("t2", 0, 100).await.unwrap().is_empty());
    assert_eq!(
        client.leader().await.unwrap(),
        Some(c.cfgs[leader].advertise.clone())
    );
    // Bad input is refused with a message, not retried.
    let err = client
        .add_block(block("bad tenant!", "b2", 0, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MetastoreError::InvalidArgument(m) if m.contains("tenant")),
        "{err}"
    );
    let err = client
        .add_block(block("t1", "b3", 10, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, MetastoreError::InvalidArgument(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_keeps_serving_and_restarted_node_catches_up() {
    let mut c = Cluster::start(3, Duration::from_secs(15)).await;
    let client = c.client();
    let old = c.wait_leader(Duration::from_secs(10)).await;
    let old_term = c.node(old).term();
    client
        .add_block(block("t1", "before", 0, 10))
        .await
        .unwrap();
    c.stop(old).await;
    let t0 = Instant::now();
    let new = c.wait_leader(Duration::from_secs(5)).await;
    assert_ne!(new, old);
    assert!(c.node(new).term() > old_term);
    tracing::info!(elapsed = ?t0.elapsed(), "new leader");
    // The client (which cached the old leader) follows to the new one.
    client.add_block(block("t1", "after", 0, 10)).await.unwrap();
    assert_eq!(
        ids(&client.blocks("t1", 0, 10).await.unwrap()),
        ["after", "before"]
    );
    // Enough entries to make the others snapshot and purge their logs, so
    // the restarted node needs a snapshot.
    for i in 0..60 {
        client
            .add_block(block("t2", &format!("x{i:02}"), i, i))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.restart(old).await;
    let want: Vec<String> = {
        let mut v = ids(&client.all_blocks().await.unwrap());
        v.sort();
        v
    };
    assert_eq!(want.len(), 62);
    let want: Vec<&str> = want.iter().map(String::as_str).collect();
    c.wait_local_blocks(old, &want, Duration::from_secs(10))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_restart_keeps_blocks_members_and_leases() {
    let mut c = Cluster::start(3, Duration::from_secs(15)).await;
    let client = c.client();
    c.wait_leader(Duration::from_secs(10)).await;
    client.add_block(block("t1", "a", 0, 10)).await.unwrap();
    client.add_block(block("t1", "b", 0, 10)).await.unwrap();
    client
        .replace_blocks(
            "t1",
            vec![block("t1", "ab", 0, 10)],
            vec!["a".into(), "b".into()],
        )
        .await
        .unwrap();
    client
        .register(Member::new("ing-1", Role::Ingester, "10.0.0.1:9000"))
        .await
        .unwrap();
    assert!(
        client
            .acquire_lease("compact/t1", "c1", Duration::from_secs(600))
            .await
            .unwrap()
    );
    for i in 0..3 {
        c.stop(i).await;
    }
    for i in 0..3 {
        c.restart(i).await;
    }
    c.wait_leader(Duration::from_secs(10)).await;
    let client = c.client();
    assert_eq!(ids(&client.all_blocks().await.unwrap()), ["ab"]);
    let pending = client.pending_deletions().await.unwrap();
    assert_eq!(
        ids(&pending.iter().map(|p| p.0.clone()).collect::<Vec<_>>()),
        ["a", "b"]
    );
    let members = client.members(None).await.unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(
        (
            members[0].id.as_str(),
            members[0].role,
            members[0].addr.as_str()
        ),
        ("ing-1", Role::Ingester, "10.0.0.1:9000")
    );
    assert!(members[0].registered_at_ms > 0);
    // The lease survived: another owner is refused, the holder renews.
    assert!(
        !client
            .acquire_lease("compact/t1", "c2", Duration::from_secs(600))
            .await
            .unwrap()
    );
    assert!(
        client
            .acquire_lease("compact/t1", "c1", Duration::from_secs(600))
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_blocks_is_atomic_for_readers_and_moves_sources_to_pending() {
    let c = Cluster::start(3, Duration::from_secs(15)).await;
    let client = c.client();
    c.wait_leader(Duration::from_secs(10)).await;
    let sources: Vec<String> = (0..20).map(|i| format!("src{i:02}")).collect();
    for id in &sources {
        client.add_block(block("t1", id, 0, 100)).await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let client = client.clone();
        let stop = stop.clone();
        let sources = sources.clone();
        tokio::spawn(async move {
            let mut seen_before = 0;
            let mut seen_after = 0;
            while !stop.load(Ordering::SeqCst) {
                let got = ids(&client.blocks("t1", 0, 100).await.unwrap());
                if got == sources {
                    seen_before += 1;
                } else if got == ["merged"] {
                    seen_after += 1;
                } else {
                    panic!("reader saw a partial replacement: {got:?}");
                }
            }
            (seen_before, seen_after)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut merged = block("t1", "merged", 0, 100);
    merged.level = 1;
    merged.compacted_from = sources.clone();
    client
        .replace_blocks("t1", vec![merged.clone()], sources.clone())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::SeqCst);
    let (before, after) = reader.await.unwrap();
    assert!(
        before > 0 && after > 0,
        "reader saw {before} before, {after} after"
    );

    let pending = client.pending_deletions().await.unwrap();
    let pending_ids = ids(&pending.iter().map(|p| p.0.clone()).collect::<Vec<_>>());
    assert_eq!(pending_ids, sources);
    let removed_at = pending[0].1;
    assert!(pending.iter().all(|p| p.1 == removed_at && p.1 > 0));
    // Retrying the same replacement is accepted and changes nothing.
    client
        .replace_blocks("t1", vec![merged.clone()], sources.clone())
        .await
        .unwrap();
    // Replacing sources that are gone is refused as a whole.
    let err = client
        .replace_blocks(
            "t1",
            vec![block("t1", "other", 0, 100)],
            vec!["src00".into(), "merged".into()],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MetastoreError::Rejected(m) if m.contains("src00")),
        "{err}"
    );
    assert_eq!(ids(&client.all_blocks().await.unwrap()), ["merged"]);
    // BlockIndex::remove moves to pending too.
    BlockIndex::remove(&client, "t1", &["merged".to_string()])
        .await
        .unwrap();
    assert!(BlockIndex::all(&client).await.unwrap().is_empty());
    // Purge forgets pending deletions once their files are gone.
    client.purge("t1", sources[..10].to_vec()).await.unwrap();
    let left = client.pending_deletions().await.unwrap();
    let mut want: Vec<String> = sources[10..].to_vec();
    want.push("merged".into());
    want.sort();
    assert_eq!(
        ids(&left.iter().map(|p| p.0.clone()).collect::<Vec<_>>()),
        want
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_exclusive_expire_renew_and_release() {
    let c = Cluster::start(1, Duration::from_secs(15)).await;
    let client = c.client();
    c.wait_leader(Duration::from_secs(10)).await;
    // Seconds, not fractions: each step below has a second of margin for
    // a machine that stalls the test (at 800 ms it failed under the full
    // suite's load).
    let ttl = Duration::from_secs(3);
    assert!(client.acquire_lease("job", "a", ttl).await.unwrap());
    assert!(!client.acquire_lease("job", "b", ttl).await.unwrap());
    // Renewal by the owner extends the lease past the first expiry.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(client.acquire_lease("job", "a", ttl).await.unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!client.acquire_lease("job", "b", ttl).await.unwrap());
    // Expiry frees it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(client.acquire_lease("job", "b", ttl).await.unwrap());
    // Only the holder's release counts.
    client.release_lease("job", "a").await.unwrap();
    assert!(!client.acquire_lease("job", "a", ttl).await.unwrap());
    client.release_lease("job", "b").await.unwrap();
    assert!(
        client
            .acquire_lease("job", "a", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // Other jobs are independent.
    assert!(client.acquire_lease("job2", "b", ttl).await.unwrap());
    let err = client
        .acquire_lease("job3", "b", Duration::ZERO)
        .await
        .unwrap_err();
    assert!(matches!(err, MetastoreError::InvalidArgument(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_time_out_and_return_on_heartbeat() {
    let timeout = Duration::from_millis(1500);
    let c = Cluster::start(3, timeout).await;
    let client = c.client();
    c.wait_leader(Duration::from_secs(10)).await;
    let names = |v: Vec<Member>| {
        let mut n: Vec<String> = v.into_iter().map(|m| m.id).collect();
        n.sort();
        n
    };
    client
        .register(Member::new("ing-1", Role::Ingester, "h1:1"))
        .await
        .unwrap();
    client
        .register(Member::new("q-1", Role::Querier, "h2:1"))
        .await
        .unwrap();
    // Unknown members cannot heartbeat.
    let err = client.heartbeat("nobody").await.unwrap_err();
    assert!(matches!(err, MetastoreError::NotFound(_)), "{err}");
    // ing-1 heartbeats, q-1 falls silent.
    let t0 = Instant::now();
    while t0.elapsed() < timeout + Duration::from_millis(1000) {
        client.heartbeat("ing-1").await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(names(client.members(None).await.unwrap()), ["ing-1"]);
    assert_eq!(
        names(client.members(Some(Role::Querier)).await.unwrap()),
        Vec::<String>::new()
    );
    assert_eq!(
        names(client.all_members(None).await.unwrap()),
        ["ing-1", "q-1"]
    );
    // A heartbeat brings it back.
    client.heartbeat("q-1").await.unwrap();
    assert_eq!(
        names(client.members(Some(Role::Querier)).await.unwrap()),
        ["q-1"]
    );
    assert_eq!(
        names(client.members(Some(Role::Ingester)).await.unwrap()),
        ["ing-1"]
    );

    // The heartbeat helper keeps a member live.
    let h = fathom_metastore::spawn_heartbeat(
        client.clone(),
        Member::new("d-1", Role::Distributor, "h3:1"),
        Duration::from_millis(300),
    );
    tokio::time::sleep(timeout + Duration::from_millis(800)).await;
    assert_eq!(
        names(client.members(Some(Role::Distributor)).await.unwrap()),
        ["d-1"]
    );
    h.abort();
    tokio::time::sleep(timeout + Duration::from_millis(500)).await;
    assert!(
        client
            .members(Some(Role::Distributor))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_group_works_and_survives_a_torn_log_tail() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    let cfg = MetastoreConfig {
        election_timeout: (Duration::from_millis(300), Duration::from_millis(600)),
        raft_heartbeat_interval: Duration::from_millis(100),
        ..MetastoreConfig::single(dir.path().join("meta"), listen)
    };
    let node = MetastoreNode::start(cfg.clone()).await.unwrap();
    let client = MetastoreClient::new([cfg.advertise.clone()]).unwrap();
    let t0 = Instant::now();
    client.add_block(block("t1", "b1", 0, 10)).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(node.is_leader());
    assert_eq!(node.leader(), Some((1, cfg.advertise.clone())));
    let mut registry = prometheus_client::registry::Registry::default();
    node.register_metrics(&mut registry);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("fathom_metastore_blocks 1"), "{text}");
    assert!(text.contains("fathom_metastore_is_leader 1"), "{text}");
    node.shutdown().await;

    // A crash in the middle of an append leaves a torn record at the end.
    let log = dir.path().join("meta").join("raft.log");
    append_garbage(&log, &[0x20, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, b'{', b'"']);
    let node = MetastoreNode::start(cfg.clone()).await.unwrap();
    assert_eq!(ids(&client.blocks("t1", 0, 10).await.unwrap()), ["b1"]);
    client.add_block(block("t1", "b2", 0, 10)).await.unwrap();
    node.shutdown().await;
    let node = MetastoreNode::start(cfg).await.unwrap();
    assert_eq!(ids(&client.all_blocks().await.unwrap()), ["b1", "b2"]);
    node.shutdown().await;
}

fn append_garbage(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

#[tokio::test]
async fn client_fails_after_its_deadline_when_nothing_answers() {
    let port = free_port();
    let client = MetastoreClient::with_options(
        [format!("127.0.0.1:{port}")],
        ClientOptions {
            deadline: Duration::from_millis(700),
            attempt_timeout: Duration::from_millis(200),
            max_backoff: Duration::from_millis(100),
            ..Default::default()
        },
    )
    .unwrap();
    let t0 = Instant::now();
    let err = client.blocks("t1", 0, 1).await.unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(err, MetastoreError::Unavailable { attempts, .. } if attempts > 1),
        "{err}"
    );
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // As a BlockIndex, the failure is an error, never an empty list.
    let e = BlockIndex::blocks(&client, "t1", 0, 1).await.unwrap_err();
    assert!(e.to_string().contains("unavailable"), "{e}");
    assert!(matches!(
        MetastoreClient::new(Vec::<String>::new()),
        Err(MetastoreError::NoAddress)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_leader_gives_registered_members_one_timeout_of_grace() {
    let timeout = Duration::from_millis(1500);
    let mut c = Cluster::start(3, timeout).await;
    let client = c.client();
    let old = c.wait_leader(Duration::from_secs(10)).await;
    client
        .register(Member::new("c-1", Role::Compactor, "h:1"))
        .await
        .unwrap();
    assert_eq!(client.members(None).await.unwrap().len(), 1);
    tokio::time::sleep(timeout + Duration::from_millis(300)).await;
    assert!(
        client.members(None).await.unwrap().is_empty(),
        "silent member still live"
    );
    // Heartbeats live on the leader only: a new leader cannot know who was
    // silent, so every registered member is live for one timeout.
    c.stop(old).await;
    c.wait_leader(Duration::from_secs(5)).await;
    let t0 = Instant::now();
    assert_eq!(client.members(None).await.unwrap().len(), 1);
    assert!(t0.elapsed() < timeout);
    tokio::time::sleep(timeout + Duration::from_millis(300)).await;
    assert!(
        client.members(None).await.unwrap().is_empty(),
        "grace did not end"
    );
    assert_eq!(client.all_members(None).await.unwrap().len(), 1);
}

/// A member that leaves is no longer live at once, is listed as left,
/// and a registration brings it back; leaving is refused for a member
/// never registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_leaves_is_not_live_until_it_registers_again() {
    let c = Cluster::start(3, Duration::from_secs(30)).await;
    let client = c.client();
    c.wait_leader(Duration::from_secs(10)).await;
    for id in ["ing-1", "ing-2"] {
        client
            .register(Member::new(id, Role::Ingester, "h:1"))
            .await
            .unwrap();
    }
    client.leave("ing-2").await.unwrap();
    let live: Vec<String> = client
        .members(Some(Role::Ingester))
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(
        live,
        ["ing-1"],
        "a member that left is not live, heartbeat or not"
    );
    let all = client.all_members(Some(Role::Ingester)).await.unwrap();
    let left: Vec<(String, bool)> = all.into_iter().map(|m| (m.id, m.left)).collect();
    assert_eq!(
        left,
        [("ing-1".to_owned(), false), ("ing-2".to_owned(), true)]
    );
    client
        .register(Member::new("ing-2", Role::Ingester, "h:1"))
        .await
        .unwrap();
    assert_eq!(client.members(Some(Role::Ingester)).await.unwrap().len(), 2);
    assert!(
        client
            .all_members(None)
            .await
            .unwrap()
            .iter()
            .all(|m| !m.left),
        "registering again clears left"
    );
    let err = client.leave("nobody").await.unwrap_err();
    assert!(matches!(err, MetastoreError::NotFound(_)), "{err}");

    // A member marked left while it still runs (forgotten while cut off)
    // is told to register again by its next heartbeat, and its heartbeat
    // loop does: it is never out of the ring while it runs.
    client.leave("ing-1").await.unwrap();
    let err = client.heartbeat("ing-1").await.unwrap_err();
    assert!(
        matches!(&err, MetastoreError::NotFound(m) if m.contains("has left")),
        "{err}"
    );
    client.leave("ing-2").await.unwrap();
    let h = fathom_metastore::spawn_heartbeat(
        client.clone(),
        Member::new("ing-2", Role::Ingester, "h:1"),
        Duration::from_millis(100),
    );
    h.registered().await;
    client.leave("ing-2").await.unwrap();
    let t = Instant::now();
    loop {
        let all = client.all_members(Some(Role::Ingester)).await.unwrap();
        let live = client.members(Some(Role::Ingester)).await.unwrap();
        let back =
            all.iter().any(|m| m.id == "ing-2" && !m.left) && live.iter().any(|m| m.id == "ing-2");
        if back {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a running member marked left did not register again: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_mount_on_a_shared_grpc_server() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = MetastoreConfig {
        serve: false,
        election_timeout: (Duration::from_millis(300), Duration::from_millis(600)),
        raft_heartbeat_interval: Duration::from_millis(100),
        ..MetastoreConfig::single(dir.path(), addr)
    };
    let node = MetastoreNode::start(cfg).await.unwrap();
    // The process's own server, with the metastore next to its services.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(node.routes())
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = rx.await;
                },
            ),
    );
    let client = MetastoreClient::new([addr.to_string()]).unwrap();
    client.add_block(block("t1", "b1", 0, 1)).await.unwrap();
    assert_eq!(ids(&client.blocks("t1", 0, 1).await.unwrap()), ["b1"]);
    assert_eq!(node.local_blocks().len(), 1);
    let _ = tx.send(());
    let _ = server.await;
    node.shutdown().await;
}

#[test]
fn peer_lists_parse_and_bad_configs_are_refused() {
    let peers = MetastoreConfig::parse_peers("1=a:1, 2=b:2,3=c:3").unwrap();
    assert_eq!(
        peers,
        vec![(1, "a:1".to_string()), (2, "b:2".into()), (3, "c:3".into())]
    );
    let err = MetastoreConfig::parse_peers("1=a:1,x=b:2").unwrap_err();
    assert!(err.to_string().contains("\"x\""), "{err}");
    assert!(MetastoreConfig::parse_peers("1").is_err());
}

#[tokio::test]
async fn node_not_in_its_peer_list_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = MetastoreConfig {
        node_id: 4,
        peers: vec![(1, "127.0.0.1:1".into()), (2, "127.0.0.1:2".into())],
        data_dir: dir.path().to_owned(),
        ..MetastoreConfig::default()
    };
    let err = MetastoreNode::start(cfg).await.err().unwrap();
    assert!(
        err.to_string()
            .contains("node id 4 is not in the peer list"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_redirect_with_the_leader_address() {
    use fathom_metastore::proto;
    let c = Cluster::start(3, Duration::from_secs(15)).await;
    let leader = c.wait_leader(Duration::from_secs(10)).await;
    let follower = (leader + 1) % 3;
    let mut raw = proto::metastore_client::MetastoreClient::connect(format!(
        "http://{}",
        c.cfgs[follower].advertise
    ))
    .await
    .unwrap();
    let status = raw
        .blocks(proto::BlocksRequest {
            tenant: Some("t1".into()),
            start_nanos: 0,
            end_nanos: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let hint = status
        .metadata()
        .get(fathom_metastore::LEADER_METADATA)
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(hint, c.cfgs[leader].advertise);
    assert!(
        status.message().contains(&c.cfgs[leader].advertise),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_tolerate_two_failures() {
    let mut c = Cluster::start(5, Duration::from_secs(15)).await;
    let client = c.client();
    let first = c.wait_leader(Duration::from_secs(10)).await;
    client.add_block(block("t1", "b1", 0, 1)).await.unwrap();
    // Stop the leader and one follower: three of five remain, a quorum.
    c.stop(first).await;
    c.stop((first + 1) % 5).await;
    c.wait_leader(Duration::from_secs(5)).await;
    client.add_block(block("t1", "b2", 0, 1)).await.unwrap();
    assert_eq!(ids(&client.all_blocks().await.unwrap()), ["b1", "b2"]);
    // A third failure loses the quorum: calls fail after the deadline
    // instead of answering from a minority.
    let survivors: Vec<usize> = (0..5).filter(|i| c.nodes[*i].is_some()).collect();
    c.stop(survivors[0]).await;
    let short = MetastoreClient::with_options(
        c.addrs(),
        ClientOptions {
            deadline: Duration::from_secs(2),
            attempt_timeout: Duration::from_millis(500),
            max_backoff: Duration::from_millis(200),
            ..Default::default()
        },
    )
    .unwrap();
    let err = short.blocks("t1", 0, 1).await.unwrap_err();
    assert!(matches!(err, MetastoreError::Unavailable { .. }), "{err}");
}

#[tokio::test]
async fn a_node_with_a_secret_refuses_calls_without_it() {
    use fathom_api::secret::ClusterSecret;
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let secret = ClusterSecret::new("metastore-test-secret").unwrap();
    let cfg = MetastoreConfig {
        election_timeout: (Duration::from_millis(300), Duration::from_millis(600)),
        raft_heartbeat_interval: Duration::from_millis(100),
        secret: secret.clone(),
        ..MetastoreConfig::single(dir.path().join("meta"), listen)
    };
    let node = MetastoreNode::start(cfg.clone()).await.unwrap();
    let with = |s: ClusterSecret| {
        MetastoreClient::with_options(
            [cfg.advertise.clone()],
            fathom_metastore::ClientOptions {
                secret: s,
                ..Default::default()
            },
        )
        .unwrap()
    };
    with(secret.clone())
        .add_block(block("t1", "b1", 0, 10))
        .await
        .unwrap();
    for s in [
        ClusterSecret::none(),
        ClusterSecret::new("another-secret-value").unwrap(),
    ] {
        let e = with(s).blocks("t1", 0, 10).await.unwrap_err();
        assert!(
            matches!(
                e,
                fathom_metastore::MetastoreError::Rpc {
                    code: tonic::Code::Unauthenticated,
                    ..
                }
            ),
            "{e}"
        );
    }
    // Every tenant's blocks, one tenant per call.
    assert_eq!(
        ids(&with(secret.clone()).all_blocks().await.unwrap()),
        ["b1"]
    );
    assert_eq!(with(secret).tenants().await.unwrap(), ["t1"]);
    node.shutdown().await;
}
