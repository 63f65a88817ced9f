//! A distributor's replicated write, end to end in one process: the
//! records the distributor's [`ReplicatedWriter`] sends (one per ring
//! group, to every replica) are, byte for byte, what each ingester's WAL
//! holds, and what replays after a restart.

use std::sync::Arc;
use std::time::Duration;

use fathom_api::cluster::{IngesterAddr, StaticIngesters};
use fathom_block::MemoryIndex;
use fathom_distributor::IngesterWriter;
use fathom_distributor::ring::{ReplicaClient, ReplicaError, ReplicaFailure, ReplicatedWriter};
use fathom_model::{IngestBatch, Labels, TenantId};
use object_store::memory::InMemory;
use parking_lot::Mutex;
use prometheus_client::registry::Registry;

use crate::{Config, Ingester, wal};

/// Delivers each record to an in-process ingester, as the gRPC
/// `WriteRecord` handler does, and keeps a copy of what was sent.
struct InProcess {
    ingesters: Vec<(String, Arc<Ingester>)>,
    sent: Mutex<Vec<(String, bytes::Bytes)>>,
    /// Per record sent: the head number it was sent under
    /// (`Record.held_under`) and the receiving ingester's head then.
    held_under: Mutex<Vec<(u64, u64)>>,
    /// An ingester whose answer the others' writes wait for, and the
    /// gate (a semaphore without permits) it closes when it answered.
    first: Mutex<Option<(String, Arc<tokio::sync::Semaphore>)>>,
}

impl InProcess {
    /// The next writes reach ingester `id` first: the other replicas'
    /// wait until it answered.
    fn answer_first(&self, id: &str) {
        *self.first.lock() = Some((id.to_owned(), Arc::new(tokio::sync::Semaphore::new(0))));
    }
}

#[async_trait::async_trait]
impl ReplicaClient for InProcess {
    async fn write(
        &self,
        to: &IngesterAddr,
        record: bytes::Bytes,
        held_under: u64,
    ) -> Result<u64, ReplicaError> {
        let (_, ing) = self
            .ingesters
            .iter()
            .find(|(id, _)| *id == to.id)
            .expect("a known ingester");
        let first = self.first.lock().clone();
        if let Some((id, gate)) = &first
            && *id != to.id
        {
            let _open = gate.acquire().await;
        }
        self.sent.lock().push((to.id.clone(), record.clone()));
        self.held_under.lock().push((held_under, ing.head()));
        let answer = ing.write_record_to_head(record, held_under).await;
        if let Some((id, gate)) = &first
            && *id == to.id
        {
            // Closed, it lets every waiting and later write through.
            gate.close();
        }
        answer
            .map(|(_, head)| head)
            .map_err(|e| ReplicaError::Other {
                ingester: to.id.clone(),
                failure: match e {
                    crate::Error::NotHeld => ReplicaFailure::NotHeld,
                    _ => ReplicaFailure::Failed,
                },
                source: Box::new(e),
            })
    }
}

fn open(dir: &std::path::Path) -> Arc<Ingester> {
    Ingester::open(
        Config {
            data_dir: dir.to_owned(),
            name: "test".into(),
            flush_interval: Duration::from_secs(3600),
            max_head_bytes: 1 << 30,
            max_head_memory: 1 << 30,
        },
        Arc::new(InMemory::new()),
        Arc::new(MemoryIndex::default()),
        &mut Registry::default(),
    )
    .unwrap()
}

/// Real profiles of two services in one request (so two ring groups and
/// two records), normalized and merged as the distributor does.
fn corpus_batch() -> IngestBatch {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/testdata/pprof/"
    );
    let mut batch = IngestBatch {
        tenant: TenantId::new("t1").unwrap(),
        profiles: Vec::new(),
        symbols: Default::default(),
    };
    for (file, service) in [
        (
            "grafana+pyroscope/pkg/og/convert/pprof/testdata/heap.pb.gz",
            "heap-svc",
        ),
        (
            "google+pprof/internal/driver/testdata/cppbench.cpu_no_samples_type",
            "cpu-svc",
        ),
    ] {
        let bytes = std::fs::read(format!("{dir}{file}")).expect("corpus file");
        let p = fathom_pprof::decode(&bytes, &fathom_pprof::Limits::default()).unwrap();
        let n = fathom_pprof::normalize(
            &p,
            &fathom_pprof::NormalizeOptions {
                labels: Labels::from_pairs([("service_name", service)]).unwrap(),
                time_nanos_override: Some(1_700_000_000_000_000_000),
                ..Default::default()
            },
        )
        .unwrap();
        batch.profiles.extend(n.profiles);
        batch.symbols.merge_owned(n.symbols);
    }
    batch
}

/// In-process ingesters on `dirs` behind a distributor's replicated
/// writer (RF=3), as a cluster's write path has them (records by value,
/// no network).
fn replicated(
    dirs: &[tempfile::TempDir],
    registry: &mut Registry,
) -> (ReplicatedWriter, Arc<InProcess>, Vec<String>) {
    let ids: Vec<String> = (0..dirs.len()).map(|i| format!("ingester-{i}")).collect();
    let client = Arc::new(InProcess {
        ingesters: ids
            .iter()
            .zip(dirs)
            .map(|(id, d)| (id.clone(), open(d.path())))
            .collect(),
        sent: Mutex::new(Vec::new()),
        held_under: Mutex::new(Vec::new()),
        first: Mutex::new(None),
    });
    let members = ids
        .iter()
        .map(|id| IngesterAddr {
            id: id.clone(),
            addr: format!("{id}:9095"),
        })
        .collect();
    let writer = ReplicatedWriter::new(
        Arc::new(StaticIngesters(members)),
        client.clone(),
        3,
        registry,
    );
    (writer, client, ids)
}

#[tokio::test]
async fn the_wal_holds_the_bytes_the_distributor_sent() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (writer, client, ids) = replicated(&dirs, &mut Registry::default());
    let batch = corpus_batch();
    let series: std::collections::HashSet<_> =
        batch.profiles.iter().map(|p| p.labels.clone()).collect();
    assert_eq!(series.len(), 2, "two services, two ring groups");
    writer.write(batch.clone()).await.unwrap();
    // Answered at a quorum: the third replica's write may still be going.
    writer.settled().await;

    let sent = client.sent.lock().clone();
    assert_eq!(
        sent.len(),
        3 * series.len(),
        "one record per group and replica"
    );
    for (id, dir) in ids.iter().zip(&dirs) {
        let to_this: Vec<Vec<u8>> = sent
            .iter()
            .filter(|(to, _)| to == id)
            .map(|(_, r)| r.to_vec())
            .collect();
        let mut stored = wal::read_records(&dir.path().join("wal"));
        let mut want = to_this.clone();
        // Replicas of different groups may append in either order.
        stored.sort();
        want.sort();
        assert_eq!(stored, want, "{id}'s WAL holds exactly what it was sent");
    }
    // Every replica got the same bytes for a group: the record was encoded
    // once, and it decodes back to the batch's profiles and symbols.
    let mut profiles = 0;
    for (_, r) in sent.iter().filter(|(to, _)| *to == ids[0]) {
        assert_eq!(
            sent.iter().filter(|(_, other)| other == r).count(),
            3,
            "three replicas of the same bytes"
        );
        let b = fathom_proto::decode_write_request(r).unwrap();
        for p in &b.profiles {
            assert!(batch.profiles.contains(p));
        }
        profiles += b.profiles.len();
    }
    assert_eq!(profiles, batch.profiles.len());

    // After a restart each ingester replays those records to the same head.
    replays_to_the_same_heads(&client, &dirs);
}

/// Each ingester of `client`, opened again on its directory, replays its
/// WAL to the head it has: the same profiles (groups were applied in the
/// order their writes finished and are replayed in WAL order, so maybe in
/// another order), sample rows and symbols.
fn replays_to_the_same_heads(client: &InProcess, dirs: &[tempfile::TempDir]) {
    let t = TenantId::new("t1").unwrap();
    for ((_, ing), dir) in client.ingesters.iter().zip(dirs) {
        let mut before = ing.snapshot(&t, 0, i64::MAX);
        let again = open(dir.path());
        let mut after = again.snapshot(&t, 0, i64::MAX);
        before.profiles.sort_by_key(|p| p.profile_id);
        after.profiles.sort_by_key(|p| p.profile_id);
        assert_eq!(after.profiles, before.profiles);
        assert_eq!(
            after.samples.iter().map(|b| b.num_rows()).sum::<usize>(),
            before.samples.iter().map(|b| b.num_rows()).sum::<usize>()
        );
        let symbols = |ing: &Ingester| ing.state.read().active["t1"].symbols.clone();
        assert_eq!(symbols(&again), symbols(ing));
    }
}

/// A record whose symbols the head already holds adds its profiles and
/// no copy of them; after a cut the new head gets every symbol again.
#[tokio::test]
async fn records_of_known_symbols_keep_every_head_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ing = open(dir.path());
    let t = TenantId::new("t1").unwrap();
    let batch = corpus_batch();
    // The same symbols under new profile ids, as the next scrape sends.
    let again = |n: u8| {
        let mut b = batch.clone();
        for p in &mut b.profiles {
            p.id.0[0] ^= n;
        }
        bytes::Bytes::from(fathom_proto::encode_write_request(&b))
    };
    let head_symbols = |ing: &Ingester| ing.state.read().active["t1"].symbols.as_ref().clone();
    ing.write_record(again(0)).await.unwrap();
    assert_eq!(head_symbols(&ing), batch.symbols);
    let added = ing.write_record(again(1)).await.unwrap();
    assert_eq!(added, batch.sample_count(), "every sample of the repeat");
    assert_eq!(
        head_symbols(&ing),
        batch.symbols,
        "nothing lost, nothing new"
    );
    let snap = ing.snapshot(&t, 0, i64::MAX);
    assert_eq!(snap.profiles.len(), 2 * batch.profiles.len());

    // A cut empties the active head: the next record brings everything.
    let blocks = ing.flush(None).await.unwrap();
    assert!(!blocks.is_empty());
    ing.write_record(again(2)).await.unwrap();
    assert_eq!(head_symbols(&ing), batch.symbols);
    // And every stack a head sample names resolves.
    let stacks: Vec<_> = batch.symbols.stacks.keys().copied().collect();
    let read = ing.symbols(&t, &stacks);
    assert_eq!(read.stacks.len(), stacks.len());
    assert_eq!(read.locations.len(), batch.symbols.locations.len());
}

/// [`replicated`] behind a distributor.
fn cluster(
    dirs: &[tempfile::TempDir],
) -> (
    fathom_distributor::Distributor,
    Arc<ReplicatedWriter>,
    Arc<InProcess>,
) {
    let mut registry = Registry::default();
    let (writer, client, _) = replicated(dirs, &mut registry);
    let writer = Arc::new(writer);
    let d = fathom_distributor::Distributor::new(
        fathom_distributor::Limits::default(),
        writer.clone(),
        &mut registry,
    );
    (d, writer, client)
}

/// A distributor leaves out of a write the stacks every replica
/// acknowledged under its current head (record format 5, a fraction of
/// the bytes); once one replica's head is cut, that replica refuses the
/// next such record and the distributor writes it whole. Every head stays
/// whole, every write is stored once, and replay gives the same heads.
#[tokio::test]
async fn acknowledged_stacks_are_left_out_until_a_head_is_cut() {
    use fathom_distributor::{Format, Idempotence, IngestRequest, Payload};
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (d, writer, client) = cluster(&dirs);
    let body = bytes::Bytes::from(
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/testdata/pprof/google+pprof/internal/driver/testdata/cppbench.cpu_no_samples_type"
        ))
        .expect("corpus file"),
    );
    let t = TenantId::new("t1").unwrap();
    // A push answered (at a quorum), then every replica's write ended.
    let push = async |n: u128| {
        let mut p = Payload::new(Format::Pprof, body.clone());
        p.labels = Labels::from_pairs([("service_name", "svc")]).unwrap();
        p.time_nanos = Some(1_700_000_000_000_000_000 + n as i64);
        p.idempotence = Idempotence::Key(fathom_model::Id::from_u128(n + 1));
        let answer = d
            .ingest(IngestRequest {
                tenant: t.clone(),
                received_bytes: body.len(),
                payloads: vec![p],
            })
            .await;
        writer.settled().await;
        answer
    };
    let sent = |from: usize| -> Vec<(String, bytes::Bytes)> { client.sent.lock()[from..].to_vec() };
    let formats = |records: &[(String, bytes::Bytes)]| -> Vec<u32> {
        records
            .iter()
            .map(|(_, r)| fathom_proto::write_format(r).unwrap())
            .collect()
    };

    push(0).await.unwrap();
    let first = sent(0);
    assert_eq!(formats(&first), vec![fathom_proto::WRITE_FORMAT; 3]);
    let whole = first[0].1.len();
    let samples = fathom_proto::decode_write_request(&first[0].1)
        .unwrap()
        .sample_count();

    // The same stacks again: left out for every replica.
    push(1).await.unwrap();
    let second = sent(3);
    assert_eq!(formats(&second), vec![fathom_proto::WRITE_FORMAT_HELD; 3]);
    assert!(
        second[0].1.len() * 4 < whole,
        "{} bytes against {whole} whole",
        second[0].1.len()
    );
    // Each sent under its replica's current head number, which takes the
    // left-out stacks without looking them up.
    let held_under = |from: usize| client.held_under.lock()[from..].to_vec();
    for (under, head) in held_under(3) {
        assert_eq!(under, head);
    }
    let by_head = |ing: &Ingester| ing.m.held_by_head.get();
    for (id, ing) in &client.ingesters {
        assert_eq!(by_head(ing), 1, "{id}");
    }
    let symbols = |ing: &Ingester| ing.state.read().active["t1"].symbols.clone();
    let full = symbols(&client.ingesters[0].1);
    for (_, ing) in &client.ingesters {
        assert_eq!(symbols(ing), full, "every head holds every stack");
        assert_eq!(ing.snapshot(&t, 0, i64::MAX).profiles.len(), 2);
    }

    // One replica cut: it refuses the next record that leaves stacks out,
    // and the distributor writes it whole to every replica (when the
    // refusal comes before a quorum's answers: here the others wait for
    // it).
    client.ingesters[1].1.flush(None).await.unwrap();
    client.answer_first(&client.ingesters[1].0);
    push(2).await.unwrap();
    *client.first.lock() = None;
    let third = sent(6);
    assert_eq!(third.len(), 6, "three left-out records, then three whole");
    let whole_again: Vec<&(String, bytes::Bytes)> = third
        .iter()
        .filter(|(_, r)| fathom_proto::write_format(r) == Some(fathom_proto::WRITE_FORMAT))
        .collect();
    assert_eq!(whole_again.len(), 3, "{:?}", formats(&third));
    // The cut replica got the record under its old head number: it looked
    // the stacks up and found them gone; the others took them as held.
    let cut_head = held_under(6)
        .into_iter()
        .zip(&third)
        .find(|(_, (to, _))| *to == client.ingesters[1].0)
        .map(|(h, _)| h)
        .unwrap();
    assert_ne!(cut_head.0, cut_head.1);
    assert_eq!(by_head(&client.ingesters[1].1), 1);
    assert_eq!(by_head(&client.ingesters[0].1), 2);
    assert_eq!(by_head(&client.ingesters[2].1), 2);
    assert_eq!(
        symbols(&client.ingesters[1].1),
        full,
        "the cut head whole again"
    );
    for (i, (_, ing)) in client.ingesters.iter().enumerate() {
        let snap = ing.snapshot(&t, 0, i64::MAX);
        let want = if i == 1 { 1 } else { 3 };
        assert_eq!(snap.profiles.len(), want, "ingester-{i}: each write once");
        assert_eq!(
            snap.samples.iter().map(|b| b.num_rows()).sum::<usize>(),
            want * samples,
            "ingester-{i}"
        );
    }
    // The next write leaves out stacks again (the cut head has them back).
    push(3).await.unwrap();
    assert_eq!(formats(&sent(12)), vec![fathom_proto::WRITE_FORMAT_HELD; 3]);
    for (id, ing) in &client.ingesters {
        assert_eq!(
            by_head(ing),
            if id == &client.ingesters[1].0 { 2 } else { 3 }
        );
    }

    // Replay of the WALs (format-5 records among them) gives the same heads.
    replays_to_the_same_heads(&client, &dirs);
}
