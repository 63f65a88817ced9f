//! Replication: each (tenant, label set) goes to `replication_factor`
//! ingesters chosen by rendezvous hashing over the live ones; a write is
//! acknowledged when a quorum of them acknowledged it.
//!
//! ```text
//!  batch ──► group profiles by (tenant, labels) ──► replicas by rendezvous hash
//!               │                                        │
//!               └─ per group: profiles + the symbols     ├─► ingester a ─┐
//!                  their stacks need                     ├─► ingester b ─┼─ quorum (2 of 3)?
//!                                                        └─► ingester c ─┘
//! ```
//!
//! The placement ([`replicas`]) is `fathom_api::ring`'s, which the
//! ingesters share: stable across builds and versions; when an ingester
//! leaves the live set, only the series it held move.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fathom_api::cluster::{ChannelError, Channels, IngesterAddr, Ingesters, quorum};
use fathom_model::{Id, IngestBatch, Symbols, TenantId};
use fathom_proto::ingester::Record;
use fathom_proto::ingester::ingester_service_client::IngesterServiceClient;
use futures::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tracing::Instrument;

pub use fathom_api::ring::{RingKey, StableHasher, replicas};

use crate::acked::Acked;
use crate::{IngesterWriter, WriteError};

/// Why one replica did not take a write, with the error that said so.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// No channel to the ingester could be made.
    #[error("{ingester}: {source}")]
    Channel {
        ingester: String,
        #[source]
        source: ChannelError,
    },
    /// The ingester answered the call with an error status; its code says
    /// which [`ReplicaFailure`] it is.
    #[error("{ingester} ({addr}): {}", source.message())]
    Status {
        ingester: String,
        addr: String,
        #[source]
        source: tonic::Status,
    },
    /// An ingester reached another way (in process): its own error, and
    /// which [`ReplicaFailure`] it is.
    #[error("{ingester}: {source}")]
    Other {
        ingester: String,
        failure: ReplicaFailure,
        #[source]
        source: crate::Source,
    },
}

/// What a replica's failure means for the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaFailure {
    /// Refused by the tenant's `max_series` (`RESOURCE_EXHAUSTED`): the
    /// client's limit, not worth a retry.
    Limit,
    /// The record left out stacks the ingester's head no longer holds
    /// (`FAILED_PRECONDITION`): sent whole, it would be taken.
    NotHeld,
    /// Unreachable, failing or full: retryable.
    Failed,
}

impl ReplicaError {
    /// What this failure means for the write.
    pub fn failure(&self) -> ReplicaFailure {
        match self {
            ReplicaError::Channel { .. } => ReplicaFailure::Failed,
            ReplicaError::Status { source, .. } => match source.code() {
                tonic::Code::ResourceExhausted => ReplicaFailure::Limit,
                tonic::Code::FailedPrecondition => ReplicaFailure::NotHeld,
                _ => ReplicaFailure::Failed,
            },
            ReplicaError::Other { failure, .. } => *failure,
        }
    }

    /// The failure in the ingester's own words, without which ingester
    /// it was or its address: what a client is told of a tenant's limit.
    pub fn answer(&self) -> String {
        match self {
            ReplicaError::Channel { source, .. } => source.to_string(),
            ReplicaError::Status { source, .. } => source.message().to_owned(),
            ReplicaError::Other { source, .. } => source.to_string(),
        }
    }
}

/// Sends one write to one ingester: `record` is the encoded
/// `WriteRequest` ([`fathom_proto::encode_write_request`]), encoded once
/// and sent as is to every replica, which stores it as is in its WAL.
/// `held_under` (0: none) is the replica's head number under which the
/// stacks the record leaves out were found acknowledged
/// (`Record.held_under`). Answers the number of the head that took it
/// (`WriteResponse.head`).
#[async_trait::async_trait]
pub trait ReplicaClient: Send + Sync + 'static {
    async fn write(
        &self,
        to: &IngesterAddr,
        record: bytes::Bytes,
        held_under: u64,
    ) -> Result<u64, ReplicaError>;
}

/// [`ReplicaClient`] over gRPC, one lazily connected channel per address,
/// every call carrying the cluster secret.
pub struct GrpcReplicas(Channels);

impl GrpcReplicas {
    pub fn new(timeout: Duration, secret: fathom_api::secret::ClusterSecret) -> Self {
        GrpcReplicas(Channels::new(timeout, secret))
    }
}

#[async_trait::async_trait]
impl ReplicaClient for GrpcReplicas {
    async fn write(
        &self,
        to: &IngesterAddr,
        record: bytes::Bytes,
        held_under: u64,
    ) -> Result<u64, ReplicaError> {
        let ch = self
            .0
            .get(&to.addr)
            .map_err(|source| ReplicaError::Channel {
                ingester: to.id.clone(),
                source,
            })?;
        let mut req = tonic::Request::new(Record { record, held_under });
        fathom_api::trace_context::inject(&mut req);
        IngesterServiceClient::new(ch)
            .max_encoding_message_size(64 << 20)
            .write_record(req)
            .await
            .map(|r| r.into_inner().head)
            .map_err(|source| ReplicaError::Status {
                ingester: to.id.clone(),
                addr: to.addr.clone(),
                source,
            })
    }
}

#[derive(Clone, Default)]
struct RingMetrics {
    replica_writes: Family<Vec<(String, String)>, Counter>,
    quorum_failures: Counter,
}

/// Replica writes one distributor has in flight to one ingester at most;
/// more wait here, in the distributor, before their deadline starts.
///
/// Every ingester takes a share of every write (all of them with RF=3 and
/// three ingesters) and works through its writes one group commit at a
/// time; without a bound, a burst of writes (the distributor admits up to
/// `--max-inflight-writes` requests) all start their `--write-timeout`
/// at once inside the ingester, and under load the last ones time out
/// although every replica is up and working (issue 13: 503s with 32
/// clients). Waiting here keeps each replica write's deadline for the
/// ingester's own work, and the client sees latency (backpressure), not
/// a refusal. Eight keep an ingester's group commits full.
pub const MAX_WRITES_PER_REPLICA: usize = 8;

/// The distributor's write target in a cluster.
pub struct ReplicatedWriter {
    ingesters: Arc<dyn Ingesters>,
    client: Arc<dyn ReplicaClient>,
    replication_factor: usize,
    metrics: RingMetrics,
    /// One [`MAX_WRITES_PER_REPLICA`] bound per ingester id.
    per_replica: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// The stacks each replica acknowledged under its current head.
    acked: Arc<Acked>,
    /// The live ingesters the last write was placed on: where the next
    /// one's stacks are looked up ([`IngesterWriter::held_stacks`]).
    last_live: parking_lot::Mutex<Arc<Vec<IngesterAddr>>>,
}

impl ReplicatedWriter {
    pub fn new(
        ingesters: Arc<dyn Ingesters>,
        client: Arc<dyn ReplicaClient>,
        replication_factor: usize,
        registry: &mut Registry,
    ) -> Self {
        let metrics = RingMetrics::default();
        let r = registry.sub_registry_with_prefix("fathom_distributor");
        r.register(
            "replica_writes",
            "Writes to ingester replicas by outcome",
            metrics.replica_writes.clone(),
        );
        r.register(
            "quorum_failures",
            "Batches refused because too few replicas acknowledged",
            metrics.quorum_failures.clone(),
        );
        ReplicatedWriter {
            ingesters,
            client,
            replication_factor: replication_factor.max(1),
            metrics,
            per_replica: parking_lot::Mutex::new(HashMap::new()),
            acked: Arc::new(Acked::default()),
            last_live: parking_lot::Mutex::new(Arc::new(Vec::new())),
        }
    }

    /// Waits until no replica write is in flight: those a write left
    /// running when a quorum had answered included.
    pub async fn settled(&self) {
        let bounds: Vec<_> = self.per_replica.lock().values().cloned().collect();
        for b in bounds {
            // Never closed: acquiring every permit only waits.
            let _all = b.acquire_many(MAX_WRITES_PER_REPLICA as u32).await;
        }
    }

    /// The bound on writes in flight to ingester `id`.
    fn replica_bound(&self, id: &str) -> Arc<tokio::sync::Semaphore> {
        self.per_replica
            .lock()
            .entry(id.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(MAX_WRITES_PER_REPLICA)))
            .clone()
    }
}

/// Splits a batch into groups that share a replica key.
fn groups(batch: IngestBatch) -> Vec<(RingKey, IngestBatch)> {
    let IngestBatch {
        tenant,
        profiles,
        symbols,
    } = batch;
    let mut by: HashMap<Id, (RingKey, Vec<fathom_model::Profile>)> = HashMap::new();
    for p in profiles {
        let k = RingKey::of(&tenant, &p.labels);
        by.entry(k.0).or_insert_with(|| (k, Vec::new())).1.push(p);
    }
    // One group (the usual write: one series) takes the symbols by move;
    // several take the part each needs.
    let (mut whole, symbols) = if by.len() == 1 {
        (Some(symbols), Symbols::default())
    } else {
        (None, symbols)
    };
    by.into_values()
        .map(|(k, profiles)| {
            let syms: Symbols = if let Some(all) = whole.take() {
                all
            } else {
                symbols.subset(
                    profiles
                        .iter()
                        .flat_map(|p| p.samples.iter().map(|s| &s.stack)),
                )
            };
            (
                k,
                IngestBatch {
                    tenant: tenant.clone(),
                    profiles,
                    symbols: syms,
                },
            )
        })
        .collect()
}

#[async_trait::async_trait]
impl IngesterWriter for ReplicatedWriter {
    fn held_stacks(&self, tenant: &TenantId) -> Option<Arc<dyn fathom_model::HeldStacks>> {
        let live = self.last_live.lock().clone();
        if live.is_empty() {
            return None;
        }
        Some(Arc::new(self.acked.stacks_for(
            tenant,
            live,
            self.replication_factor,
        )))
    }

    async fn write(&self, batch: IngestBatch) -> Result<(), WriteError> {
        // The token of the answers that left stacks out, if any.
        let token = batch.symbols.relies_on;
        let live = self.ingesters.ingesters().await.map_err(WriteError::Ring)?;
        let rf = self.replication_factor;
        let need = quorum(rf);
        {
            let mut last = self.last_live.lock();
            if **last != live {
                *last = Arc::new(live.clone());
            }
        }
        if live.len() < need {
            self.metrics.quorum_failures.inc();
            return Err(WriteError::NoQuorum {
                live: live.len(),
                need,
                rf,
            });
        }
        // Per replica, the head number its left-out stacks were found
        // under: while its head keeps it, it takes them without lookups.
        let relied = token
            .map(|t| self.acked.relied_on(t, &live))
            .unwrap_or_default();
        let relied = &relied;
        let writes = groups(batch).into_iter().map(|(key, group)| {
            let targets = replicas(&live, &key, rf);
            let record = bytes::Bytes::from(fathom_proto::encode_write_request(&group));
            let group = Arc::new(group);
            async move {
                // A slot on every replica first, taken in one order (by
                // ingester id) by every write, so that two writes never
                // each hold a slot the other waits for.
                let mut by_id: Vec<&IngesterAddr> = targets.iter().collect();
                by_id.sort_by(|a, b| a.id.cmp(&b.id));
                let mut slots = HashMap::with_capacity(by_id.len());
                for t in by_id {
                    // Never closed, so acquiring only waits.
                    if let Ok(slot) = self.replica_bound(&t.id).acquire_owned().await {
                        slots.insert(t.id.as_str(), slot);
                    }
                }
                // Each replica's write is a task of its own: it runs to its
                // end (what the replica holds, or its failure counted) after
                // this write was answered at a quorum.
                let mut pending: futures::stream::FuturesUnordered<_> = targets
                    .iter()
                    .map(|t| {
                        let span = tracing::info_span!(
                            "replica_write",
                            ingester = %t.id,
                            tenant = %group.tenant,
                            profiles = group.profiles.len(),
                            otel.kind = "client",
                        );
                        let task = tokio::spawn(
                            replica_write(ReplicaWrite {
                                client: self.client.clone(),
                                acked: self.acked.clone(),
                                metrics: self.metrics.clone(),
                                to: t.clone(),
                                record: record.clone(),
                                held_under: relied.get(&t.id).copied().unwrap_or(0),
                                group: group.clone(),
                                slot: slots.remove(t.id.as_str()),
                            })
                            .instrument(span),
                        );
                        let ingester = t.id.clone();
                        async move {
                            task.await.unwrap_or_else(|e| {
                                Err(ReplicaError::Other {
                                    ingester,
                                    failure: ReplicaFailure::Failed,
                                    source: Box::new(e),
                                })
                            })
                        }
                    })
                    .collect();
                let mut ok = 0;
                let mut errors = Vec::new();
                let mut limit = None;
                let mut not_held = None;
                while let Some(r) = pending.next().await {
                    match r {
                        Ok(()) => ok += 1,
                        Err(e) => match e.failure() {
                            ReplicaFailure::Limit => limit = Some(e),
                            ReplicaFailure::Failed => errors.push(e),
                            ReplicaFailure::NotHeld => not_held = Some(e),
                        },
                    }
                    // A quorum answers the write; the other replicas' writes
                    // go on without it. (A replica that no longer held what
                    // the record left out before then gets the write whole,
                    // below.)
                    if ok >= need && not_held.is_none() {
                        return Ok(());
                    }
                }
                // With fewer live ingesters than the factor, every one of
                // them must take the write (and at least a quorum).
                if let Some(e) = not_held {
                    // Built again whole, for every replica (those that
                    // took this one skip its profiles): a write is not
                    // left on fewer replicas than it could be.
                    Err(WriteError::LeftOut {
                        source: Box::new(e),
                    })
                } else if ok >= need {
                    Ok(())
                } else if let Some(e) = limit {
                    // A replica refused by the tenant's limit: retrying
                    // does not help, so it is the answer.
                    Err(WriteError::Limit {
                        limit: "max_series",
                        source: Box::new(e),
                    })
                } else {
                    Err(WriteError::Replicas {
                        targets: targets.len(),
                        need,
                        rf,
                        errors,
                    })
                }
            }
        });
        let results = futures::future::join_all(writes).await;
        let mut errors = Vec::new();
        let mut left_out = None;
        for r in results {
            match r {
                Ok(()) => {}
                Err(e @ WriteError::Limit { .. }) => return Err(e),
                Err(e @ WriteError::LeftOut { .. }) => left_out = Some(e),
                Err(e) => errors.push(e),
            }
        }
        if let Some(e) = left_out
            && errors.is_empty()
        {
            return Err(e);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            self.metrics.quorum_failures.inc();
            Err(WriteError::Groups(errors))
        }
    }
}

/// One replica's write and what the distributor learns from it.
struct ReplicaWrite {
    client: Arc<dyn ReplicaClient>,
    acked: Arc<Acked>,
    metrics: RingMetrics,
    to: IngesterAddr,
    record: bytes::Bytes,
    held_under: u64,
    group: Arc<IngestBatch>,
    /// The write's share of [`MAX_WRITES_PER_REPLICA`], held to its end.
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Sends one replica its record and keeps what the answer says: the
/// stacks the replica holds from then on, or that it holds none of those
/// left out (`NotHeld`); counts the outcome.
async fn replica_write(w: ReplicaWrite) -> Result<(), ReplicaError> {
    let ReplicaWrite {
        client,
        acked,
        metrics,
        to,
        record,
        held_under,
        group,
        slot: _slot,
    } = w;
    let outcome = |o: &str| {
        metrics
            .replica_writes
            .get_or_create(&vec![("outcome".into(), o.into())])
            .inc();
    };
    match client.write(&to, record, held_under).await {
        Ok(head) => {
            acked.acknowledged(
                &to.id,
                &group.tenant,
                head,
                group.symbols.stacks.keys(),
                group
                    .profiles
                    .iter()
                    .flat_map(|p| p.samples.iter().map(|s| &s.stack)),
            );
            outcome("ok");
            Ok(())
        }
        Err(e) => {
            tracing::warn!(ingester = %to.id, error = %e, "replica write failed");
            outcome("error");
            if e.failure() == ReplicaFailure::NotHeld {
                acked.forget(&to.id, &group.tenant);
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_api::cluster::StaticIngesters;
    use parking_lot::Mutex;
    use std::collections::{BTreeMap, HashSet};

    fn members(n: usize) -> Vec<IngesterAddr> {
        (0..n)
            .map(|i| IngesterAddr {
                id: format!("ingester-{i}"),
                addr: format!("127.0.0.1:{}", 9000 + i),
            })
            .collect()
    }

    struct Fake {
        down: HashSet<String>,
        got: Mutex<Vec<(String, usize)>>,
        records: Mutex<Vec<bytes::Bytes>>,
    }

    #[async_trait::async_trait]
    impl ReplicaClient for Fake {
        async fn write(
            &self,
            to: &IngesterAddr,
            record: bytes::Bytes,
            _: u64,
        ) -> Result<u64, ReplicaError> {
            if self.down.contains(&to.id) {
                return Err(ReplicaError::Other {
                    ingester: to.id.clone(),
                    failure: ReplicaFailure::Failed,
                    source: "down".into(),
                });
            }
            let batch = fathom_proto::decode_write_request(&record).expect("a valid record");
            self.got.lock().push((to.id.clone(), batch.profiles.len()));
            self.records.lock().push(record);
            Ok(1)
        }
    }

    fn batch(services: usize) -> IngestBatch {
        let mut profiles = Vec::new();
        for i in 0..services {
            profiles.push(fathom_model::Profile {
                id: Id::from_u128(i as u128 + 1),
                profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
                    .parse()
                    .unwrap(),
                labels: fathom_model::Labels::from_pairs([("service_name", format!("svc{i}"))])
                    .unwrap(),
                time_nanos: 1,
                duration_nanos: 1,
                period: 1,
                samples: vec![],
            });
        }
        IngestBatch {
            tenant: TenantId::new("t").unwrap(),
            profiles,
            symbols: Symbols::default(),
        }
    }

    fn writer(down: &[&str], live: usize) -> (ReplicatedWriter, Arc<Fake>) {
        let fake = Arc::new(Fake {
            down: down.iter().map(|s| s.to_string()).collect(),
            got: Mutex::new(Vec::new()),
            records: Mutex::new(Vec::new()),
        });
        let w = ReplicatedWriter::new(
            Arc::new(StaticIngesters(members(live))),
            fake.clone(),
            3,
            &mut Registry::default(),
        );
        (w, fake)
    }

    /// Counts the writes in flight to each ingester.
    #[derive(Default)]
    struct Counting {
        now: Mutex<BTreeMap<String, usize>>,
        max: Mutex<BTreeMap<String, usize>>,
    }

    #[async_trait::async_trait]
    impl ReplicaClient for Counting {
        async fn write(
            &self,
            to: &IngesterAddr,
            _: bytes::Bytes,
            _: u64,
        ) -> Result<u64, ReplicaError> {
            {
                let mut now = self.now.lock();
                let n = now.entry(to.id.clone()).or_default();
                *n += 1;
                let mut max = self.max.lock();
                let m = max.entry(to.id.clone()).or_default();
                *m = (*m).max(*n);
            }
            // Long enough for every other write of the burst to arrive.
            tokio::time::sleep(Duration::from_millis(2)).await;
            *self.now.lock().get_mut(&to.id).unwrap() -= 1;
            Ok(1)
        }
    }

    /// A burst of writes (more than the distributor lets in flight to one
    /// ingester) waits in the distributor: each ingester sees at most
    /// MAX_WRITES_PER_REPLICA at once, and every write is acknowledged.
    #[tokio::test]
    async fn a_burst_waits_for_replica_slots_instead_of_piling_on_ingesters() {
        let client = Arc::new(Counting::default());
        let w = ReplicatedWriter::new(
            Arc::new(StaticIngesters(members(3))),
            client.clone(),
            3,
            &mut Registry::default(),
        );
        let writes = (0..5 * MAX_WRITES_PER_REPLICA).map(|_| w.write(batch(1)));
        let results = futures::future::join_all(writes).await;
        assert!(results.iter().all(Result::is_ok));
        let max = client.max.lock().clone();
        assert_eq!(max.len(), 3, "every ingester took writes");
        for (id, m) in max {
            assert_eq!(
                m, MAX_WRITES_PER_REPLICA,
                "{id}: at most the bound, and the bound used"
            );
        }
    }

    #[tokio::test]
    async fn quorum_of_three() {
        let (w, fake) = writer(&[], 3);
        w.write(batch(4)).await.unwrap();
        w.settled().await;
        // Every profile on all three ingesters.
        let total: usize = fake.got.lock().iter().map(|g| g.1).sum();
        assert_eq!(total, 12);
        // Each group is encoded once: its three replicas get the same
        // bytes, the record of that group's batch (format 4).
        let records = fake.records.lock().clone();
        assert_eq!(records.len(), 12);
        for r in &records {
            assert_eq!(records.iter().filter(|x| *x == r).count(), 3);
            let b = fathom_proto::decode_write_request(r).unwrap();
            assert_eq!(b.profiles.len(), 1);
        }

        let (w, _) = writer(&["ingester-1"], 3);
        w.write(batch(4)).await.expect("2 of 3 is a quorum");

        let (w, _) = writer(&["ingester-1", "ingester-2"], 3);
        let e = w.write(batch(4)).await.unwrap_err();
        let m = e.to_string();
        assert!(m.contains("2 of 3 replicas failed"), "{m}");
        // Each group's error, and in it each failed replica's, kept as
        // values: the replicas that failed are named by the errors
        // themselves, not only by the message.
        let WriteError::Groups(groups) = &e else {
            panic!("the groups' errors: {e:?}")
        };
        assert_eq!(groups.len(), 4, "one error per group of a single profile");
        for g in groups {
            let WriteError::Replicas { errors, need, .. } = g else {
                panic!("a replica quorum failure: {g:?}")
            };
            assert_eq!(*need, 2);
            let mut failed: Vec<&str> = errors
                .iter()
                .map(|r| match r {
                    ReplicaError::Other {
                        ingester, failure, ..
                    } if *failure == ReplicaFailure::Failed => ingester.as_str(),
                    r => panic!("the fake's failure: {r:?}"),
                })
                .collect();
            failed.sort_unstable();
            assert_eq!(failed, ["ingester-1", "ingester-2"]);
            let source = std::error::Error::source(&errors[0]).expect("the replica's own error");
            assert_eq!(source.to_string(), "down");
        }
        // Retryable: 503, with the same message.
        let api = fathom_api::ApiError::from(e);
        assert_eq!(api.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(api.to_string().contains("2 of 3 replicas failed"), "{api}");
    }

    /// A replica's status code decides what its failure means, and the
    /// status stays the error's source.
    #[test]
    fn a_replica_status_says_what_failed() {
        let at = |code| ReplicaError::Status {
            ingester: "ingester-1".into(),
            addr: "127.0.0.1:1".into(),
            source: tonic::Status::new(code, "the ingester's words"),
        };
        assert_eq!(
            at(tonic::Code::ResourceExhausted).failure(),
            ReplicaFailure::Limit
        );
        assert_eq!(
            at(tonic::Code::FailedPrecondition).failure(),
            ReplicaFailure::NotHeld
        );
        assert_eq!(
            at(tonic::Code::Unavailable).failure(),
            ReplicaFailure::Failed
        );
        let e = at(tonic::Code::ResourceExhausted);
        assert_eq!(
            e.to_string(),
            "ingester-1 (127.0.0.1:1): the ingester's words"
        );
        let status = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<tonic::Status>())
            .expect("the status as the source");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        // A limit is the client's: 429 through the one mapping.
        let w = WriteError::Limit {
            limit: "max_series",
            source: Box::new(e),
        };
        assert!(std::error::Error::source(&w).is_some_and(|s| s.is::<ReplicaError>()));
        let api = fathom_api::ApiError::from(w);
        assert_eq!(api.status(), axum::http::StatusCode::TOO_MANY_REQUESTS);
        // The ingester's words alone: no replica's name or address.
        assert_eq!(api.to_string(), "the ingester's words");
    }

    #[tokio::test]
    async fn too_few_live_ingesters() {
        let (w, _) = writer(&[], 1);
        let e = w.write(batch(1)).await.unwrap_err();
        assert!(e.to_string().contains("1 live ingesters"), "{e}");
        let (w, fake) = writer(&[], 2);
        w.write(batch(1))
            .await
            .expect("2 live of 3 still make a quorum");
        assert_eq!(fake.got.lock().len(), 2);
    }

    /// A replica whose writes wait at a gate until the test opens it.
    struct Gated {
        slow: &'static str,
        gate: Arc<tokio::sync::Semaphore>,
        got: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl ReplicaClient for Gated {
        async fn write(
            &self,
            to: &IngesterAddr,
            _: bytes::Bytes,
            _: u64,
        ) -> Result<u64, ReplicaError> {
            if to.id == self.slow {
                let _pass = self.gate.acquire().await;
            }
            self.got.lock().push(to.id.clone());
            Ok(1)
        }
    }

    /// A write is answered once a quorum acknowledged it, not when the
    /// slowest replica did; the slow replica's write goes on after the
    /// answer, to its end, and `settled` waits for it.
    #[tokio::test]
    async fn a_write_is_answered_at_a_quorum_and_the_slow_replica_still_takes_it() {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let client = Arc::new(Gated {
            slow: "ingester-2",
            gate: gate.clone(),
            got: Mutex::new(Vec::new()),
        });
        let w = ReplicatedWriter::new(
            Arc::new(StaticIngesters(members(3))),
            client.clone(),
            3,
            &mut Registry::default(),
        );
        // The gate stays shut: waiting for every replica would never end.
        tokio::time::timeout(Duration::from_secs(30), w.write(batch(1)))
            .await
            .expect("answered without the slow replica")
            .expect("2 of 3 is a quorum");
        let mut got = client.got.lock().clone();
        got.sort();
        assert_eq!(got, ["ingester-0", "ingester-1"]);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), w.settled())
                .await
                .is_err(),
            "the slow replica's write is still in flight, not dropped"
        );
        gate.add_permits(1);
        tokio::time::timeout(Duration::from_secs(30), w.settled())
            .await
            .expect("settled once the slow replica took the write");
        assert_eq!(client.got.lock().len(), 3);
        assert_eq!(client.got.lock()[2], "ingester-2");
    }
}
