//! The ingester: makes acknowledged writes durable, answers queries for
//! recent data, and cuts blocks to object storage.
//!
//! ```text
//! write_record(bytes) ─ decode once (ids as sent) ─┐
//! write(batch) ─ drop what the head holds, encode ─┴► WAL append (the record's
//!                bytes as received) + fsync (group commit) ──► per-tenant head ──► ack
//!                                                           │ every flush interval,
//!                                                           │ at the size limit, on shutdown
//!                                                           ▼
//!                      rotate WAL, freeze heads ──► encode Parquet (blocking pool)
//!                      ──► upload files, meta.json last ──► block index ──► drop old WAL segments
//! ```
//!
//! A distributor's write arrives as the encoded record it made once
//! (`fathom_proto::encode_write_request`, format 4: every symbol with its
//! content-addressed id, stacks indexing the record's locations, samples
//! indexing its stacks): its bytes are the WAL record, and the head takes
//! the ids as sent and the batch's symbols by move. A single process's
//! write ([`Ingester::write`]) is built against the head
//! ([`Ingester::held_stacks`]): its record, encoded here, leaves out what
//! the head holds (format 5). Replay decodes each record against the head
//! the records before it rebuilt; it reads records of format 0 (ids
//! recomputed), 2, 3, 4 and 5, and refuses to start on any other
//! ([`Error::RecordVersion`]).
//!
//! Invariants:
//! - a write is acknowledged only after its WAL record is fsync'd, and the
//!   record is in a segment older than any cut that does not include it (a
//!   gate makes "append + apply" atomic with respect to a cut);
//! - WAL segments are deleted only after every block cut from them is
//!   stored and registered; until then the frozen heads stay queryable;
//! - applying a profile id twice is a no-op, so replay after a crash and
//!   client retries do not double count within a head; across a head and a
//!   block the querier removes duplicates by profile id.
//!
//! Reads: the ingester owns its read API. In process, [`Ingester::snapshot`]
//! and [`Ingester::symbols`]; across processes, the head-read Flight service
//! ([`flight_service`], tickets [`HeadTicket`]) and its client
//! ([`FlightHeads`]), both speaking [`HeadSnapshot`] and
//! `fathom_proto::ingester::HeadSymbols`.
//!
//! Failure modes: object storage down → uploads retry with backoff while
//! writes keep being acknowledged (the WAL grows) until the heads, those
//! waiting to be stored included, reach `max_head_memory`; then writes are
//! refused ([`Error::HeadFull`], retryable) until blocks are stored again;
//! a crash → replay on start;
//! a torn WAL tail (crash mid-append, never acknowledged) is truncated.

mod flight;
mod grpc;
mod head;
mod remote;
mod wal;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fathom_api::cluster::Ingesters;
use fathom_block::{BlockIndex, BlockMeta};
use fathom_model::{HeldStacks, Id, IdMap, IdSet, IngestBatch, Symbols, TenantId};
use object_store::ObjectStore;
use parking_lot::RwLock;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use fathom_api::ticket::{HeadTicket, MAX_HEAD_STACKS};
pub use flight::{HeadFlight, flight_service};
pub use grpc::{WriteServer, write_service};
use head::TenantHead;
pub use head::{HEAD_SAMPLE_BYTES, HeadSnapshot};
pub use remote::{FlightHeads, ReadError};
pub use wal::WalError;
use wal::{Wal, WalMetrics};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("write record could not be decoded")]
    Record(#[source] fathom_proto::ConvertError),
    /// A WAL record of a format this build does not know (written by a
    /// newer build): replay stops rather than drop acknowledged data.
    #[error(
        "wal record {record} cannot be replayed by this build; start the version of fathom that \
         wrote the wal (or move its wal directory away, losing its unflushed writes)"
    )]
    RecordVersion {
        record: usize,
        #[source]
        source: fathom_proto::ConvertError,
    },
    #[error("block encoding task failed")]
    EncodeTask(#[source] tokio::task::JoinError),
    #[error("block upload: {0}")]
    Block(#[from] fathom_block::Error),
    #[error("flush did not finish before its deadline; the data stays in the WAL")]
    FlushDeadline,
    #[error("ingester is shutting down")]
    ShuttingDown,
    /// The heads hold `held` bytes, at or over `limit`: blocks are not
    /// being stored fast enough (object store down?). Retryable.
    #[error(
        "the ingester's heads are full ({held} bytes held, limit {limit}): blocks cannot be \
         stored fast enough (is the object store down?); retry later"
    )]
    HeadFull { held: usize, limit: usize },
    /// The write would give `tenant` more than `limit` series in this
    /// ingester's head, which holds `series` of them. The client's limit:
    /// not retryable as is.
    #[error(
        "tenant {tenant} is at its limit of {limit} series in an ingester's head ({series} series \
         held, this write adds {new} new ones): writes to existing series are accepted; new \
         series are refused until the head is cut to a block or the limit (max_series) is raised"
    )]
    SeriesLimit {
        tenant: TenantId,
        limit: usize,
        series: usize,
        new: usize,
    },
    /// A write built against a head that was cut, and whose blocks were
    /// stored, before the write reached the WAL: the stacks it left out
    /// are nowhere in memory. Retryable (the retry is built anew).
    #[error(
        "the head this write was prepared against was cut and stored meanwhile ({stacks} stacks \
         it left out are gone); retry"
    )]
    LeftOut { stacks: usize },
    /// A replicated record (format 5) names stacks or locations that it
    /// leaves out and this ingester's head does not hold: the head was cut
    /// or the ingester restarted since the distributor learned what it
    /// held. Nothing is written; the distributor sends the write whole.
    #[error(
        "the record leaves out stacks this ingester's head does not hold (cut or restarted since \
         the sender learned what it held); send it whole"
    )]
    NotHeld,
}

/// A tenant's `max_series` (none: unlimited), asked on every write so that
/// a reloaded tenants file applies at once.
pub type SeriesLimit = Arc<dyn Fn(&TenantId) -> Option<usize> + Send + Sync>;

/// Ingester settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Directory for the WAL (`<dir>/wal`).
    pub data_dir: PathBuf,
    /// Instance name, recorded as each block's source.
    pub name: String,
    /// Cut blocks at least this often.
    pub flush_interval: Duration,
    /// Cut blocks when the heads hold more than this many (estimated) bytes.
    pub max_head_bytes: usize,
    /// Refuse writes ([`Error::HeadFull`]) while the heads, those being
    /// flushed included, hold this many (estimated) bytes or more.
    pub max_head_memory: usize,
}

struct Pending {
    wal_segment: u64,
    /// When the heads were frozen, and when the ones before them were
    /// (unix milliseconds): which peers' blocks can hold their profiles
    /// ([`Ingester::left_to_peers`]).
    frozen_ms: i64,
    since_ms: i64,
    /// Estimated bytes of `heads`.
    bytes: usize,
    heads: Arc<HashMap<String, Arc<TenantHead>>>,
    done: HashSet<String>,
}

#[derive(Default)]
struct State {
    active: HashMap<String, TenantHead>,
    active_bytes: usize,
    /// Estimated bytes of the heads in `pending`.
    pending_bytes: usize,
    pending: VecDeque<Pending>,
    /// When the active heads began: the last cut (unix milliseconds).
    active_since_ms: i64,
}

impl State {
    fn held(&self) -> usize {
        self.active_bytes + self.pending_bytes
    }
}

#[derive(Clone, Default)]
struct Metrics {
    wal: WalMetrics,
    profiles: Counter,
    samples: Counter,
    blocks: Counter,
    block_bytes: Counter,
    upload_failures: Counter,
    index_failures: Counter,
    head_bytes: Gauge,
    head_memory: Gauge,
    head_full: Counter,
    series_limit: Counter,
    replayed: Counter,
    left_out_restored: Counter,
    not_held: Counter,
    held_by_head: Counter,
    /// A cut's block: encoding it, then storing it (upload and index);
    /// [`fathom_api::metrics::Seconds::slow`].
    block_encode_seconds: fathom_api::metrics::Seconds,
    block_store_seconds: fathom_api::metrics::Seconds,
    /// A cut's wait for its peers' blocks ([`Ingester::left_to_peers`]).
    peer_wait_seconds: fathom_api::metrics::Seconds,
    left_to_peers: Counter,
    kept_from_peers: Counter,
}

/// The live ingesters this one shares series with, and how long a cut
/// waits for their blocks ([`Ingester::set_peers`]).
struct Peers {
    ring: Arc<dyn Ingesters>,
    wait: Duration,
}

/// How soon a cut waiting for its peers' blocks looks for new ones
/// again: first after `PEER_POLL.0`, each time twice as long, at most
/// `PEER_POLL.1` (a peer's cut takes seconds to encode, and each look is
/// a linearizable read of the metastore's index).
const PEER_POLL: (Duration, Duration) = (Duration::from_millis(250), Duration::from_secs(1));

/// What a block cut from a head holds.
enum Part {
    Whole,
    /// The profiles of these ids.
    Of(IdSet),
}

/// A frozen head's profiles by which live ingester comes first for
/// their series ([`fathom_api::ring::replicas`]).
struct Split {
    /// Those whose series this ingester comes first for.
    mine: IdSet,
    /// The others: (profile, time, index in `peers` of the first one).
    theirs: Vec<(Id, i64, usize)>,
    peers: Vec<String>,
}

/// The ingester; see the crate documentation.
pub struct Ingester {
    cfg: Config,
    store: Arc<dyn ObjectStore>,
    index: Arc<dyn BlockIndex>,
    wal: Wal,
    gate: tokio::sync::RwLock<()>,
    state: RwLock<State>,
    flush_lock: tokio::sync::Mutex<()>,
    last_flush: parking_lot::Mutex<Instant>,
    series_limit: RwLock<Option<SeriesLimit>>,
    peers: RwLock<Option<Peers>>,
    /// How many cuts have replaced the heads: what a batch built against
    /// a head's stacks ([`Ingester::held_stacks`]) is checked with.
    generation: AtomicU64,
    /// Where this run's head numbers start ([`Ingester::head`]).
    epoch: u64,
    m: Metrics,
}

/// The stacks of one tenant's active head, for one generation
/// ([`Ingester::held_stacks`]).
struct HeadStacks {
    ingester: Arc<Ingester>,
    tenant: String,
    generation: u64,
}

impl std::fmt::Debug for HeadStacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadStacks")
            .field("tenant", &self.tenant)
            .field("generation", &self.generation)
            .finish()
    }
}

impl HeldStacks for HeadStacks {
    fn generation(&self) -> u64 {
        self.generation
    }

    fn holds(&self, _series: &fathom_model::Labels, ids: &[Id]) -> Vec<bool> {
        let st = self.ingester.state.read();
        match st.active.get(&self.tenant) {
            Some(h) => ids
                .iter()
                .map(|id| h.symbols.stacks.contains_key(id))
                .collect(),
            None => vec![false; ids.len()],
        }
    }
}

impl Ingester {
    /// Replays the WAL into the heads and starts a new WAL segment.
    pub fn open(
        cfg: Config,
        store: Arc<dyn ObjectStore>,
        index: Arc<dyn BlockIndex>,
        registry: &mut Registry,
    ) -> Result<Arc<Self>, Error> {
        let m = Metrics {
            block_encode_seconds: fathom_api::metrics::Seconds::slow(),
            block_store_seconds: fathom_api::metrics::Seconds::slow(),
            peer_wait_seconds: fathom_api::metrics::Seconds::slow(),
            ..Metrics::default()
        };
        let r = registry.sub_registry_with_prefix("fathom_ingester");
        r.register(
            "wal_bytes",
            "Bytes appended to the WAL",
            m.wal.bytes.clone(),
        );
        r.register(
            "wal_records",
            "Records appended to the WAL",
            m.wal.records.clone(),
        );
        r.register(
            "wal_fsyncs",
            "WAL group commits (one fsync each)",
            m.wal.fsyncs.clone(),
        );
        r.register(
            "wal_commits_past_fill",
            "WAL group commits that grew the segment file past the zeros written ahead of the records (each also writes the file's metadata)",
            m.wal.commits_past_fill.clone(),
        );
        r.register(
            "wal_commit_seconds",
            "Seconds a WAL group commit takes to write its records and fdatasync",
            m.wal.commit_seconds.histogram(),
        );
        r.register(
            "wal_append_seconds",
            "Seconds from a WAL append to its record being on disk (the commit under way, then its own)",
            m.wal.append_seconds.histogram(),
        );
        r.register("profiles", "Profiles added to heads", m.profiles.clone());
        r.register("samples", "Sample rows added to heads", m.samples.clone());
        r.register("blocks_flushed", "Blocks cut and stored", m.blocks.clone());
        r.register(
            "block_encode_seconds",
            "Seconds a head cut takes to encode its block",
            m.block_encode_seconds.histogram(),
        );
        r.register(
            "block_store_seconds",
            "Seconds a head cut takes to store its encoded block and add it to the block index (retries included)",
            m.block_store_seconds.histogram(),
        );
        r.register(
            "peer_cut_wait_seconds",
            "Seconds a head cut waits for the blocks of the ingesters that come first for some of its series",
            m.peer_wait_seconds.histogram(),
        );
        r.register(
            "profiles_left_to_peers",
            "Profiles a head cut did not store because the block of the ingester that comes first for their series holds them",
            m.left_to_peers.clone(),
        );
        r.register(
            "profiles_kept_from_peers",
            "Profiles of series another ingester comes first for that a head cut stored itself (no block of that ingester held them in time)",
            m.kept_from_peers.clone(),
        );
        r.register(
            "block_bytes",
            "Bytes of stored blocks",
            m.block_bytes.clone(),
        );
        r.register(
            "block_upload_failures",
            "Failed block uploads (retried)",
            m.upload_failures.clone(),
        );
        r.register(
            "block_index_failures",
            "Failed attempts to register a stored block in the block index (retried)",
            m.index_failures.clone(),
        );
        r.register(
            "head_bytes",
            "Estimated bytes held in heads",
            m.head_bytes.clone(),
        );
        r.register(
            "head_memory_bytes",
            "Estimated bytes held in heads, those being flushed included (capped by --max-head-memory)",
            m.head_memory.clone(),
        );
        r.register(
            "head_full_refusals",
            "Writes refused because the heads were full (retryable 503 to clients)",
            m.head_full.clone(),
        );
        r.register(
            "series_limit_refusals",
            "Writes refused because they would take a tenant over its max_series in this head",
            m.series_limit.clone(),
        );
        r.register(
            "wal_replayed_records",
            "WAL records replayed at start",
            m.replayed.clone(),
        );
        r.register(
            "left_out_restored",
            "Writes built against a head that a cut replaced before they reached the WAL, whose left-out stacks were put back",
            m.left_out_restored.clone(),
        );
        r.register(
            "records_held_by_head",
            "Replicated records sent under the head number this ingester still has: the stacks they leave out were taken as held without a lookup per sample",
            m.held_by_head.clone(),
        );
        r.register(
            "records_not_held",
            "Replicated records refused because they leave out stacks the head no longer holds (a cut or restart since the distributor learned them; it resends them whole)",
            m.not_held.clone(),
        );

        let mut state = State {
            active_since_ms: now_ms(),
            ..State::default()
        };
        let mut bad = 0usize;
        let mut seen = 0usize;
        let mut unknown_version = None;
        let (wal, replayed) = Wal::open(&cfg.data_dir.join("wal"), m.wal.clone(), |rec| {
            seen += 1;
            if unknown_version.is_some() {
                return;
            }
            // Decoded against the head the records before it rebuilt: a
            // format-5 record names symbols that head holds.
            let decoded = fathom_proto::decode_write_request_skipping(rec, |tenant| {
                state.active.get(tenant).map(|h| &*h.symbols)
            });
            match decoded {
                Ok(batch) => {
                    let h = state.active.entry(batch.tenant.to_string()).or_default();
                    let before = h.bytes;
                    h.apply(batch);
                    state.active_bytes += h.bytes - before;
                }
                Err(e @ fathom_proto::ConvertError::FormatVersion { .. }) => {
                    unknown_version = Some((seen, e));
                }
                Err(_) => bad += 1,
            }
        })?;
        if let Some((record, source)) = unknown_version {
            return Err(Error::RecordVersion { record, source });
        }
        if bad > 0 {
            tracing::error!(records = bad, "skipped undecodable wal records");
        }
        m.replayed.inc_by(replayed as u64);
        m.head_bytes.set(state.active_bytes as i64);
        m.head_memory.set(state.held() as i64);
        tracing::info!(records = replayed, dir = %cfg.data_dir.display(), "replayed wal");
        Ok(Arc::new(Ingester {
            cfg,
            store,
            index,
            wal,
            gate: tokio::sync::RwLock::new(()),
            state: RwLock::new(state),
            flush_lock: tokio::sync::Mutex::new(()),
            last_flush: parking_lot::Mutex::new(Instant::now()),
            series_limit: RwLock::new(None),
            peers: RwLock::new(None),
            generation: AtomicU64::new(0),
            // The clock's nanoseconds: a restarted ingester's heads count
            // on from past every number the last run gave out.
            epoch: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2)),
            m,
        }))
    }

    /// Enforces per-tenant `max_series` on this ingester's active head
    /// (see [`Error::SeriesLimit`]). Series already held are kept when a
    /// limit is lowered; a cut head no longer counts.
    pub fn set_series_limit(&self, limit: SeriesLimit) {
        *self.series_limit.write() = Some(limit);
    }

    /// Shares the storing of blocks with the other live ingesters of
    /// `ring`. A cut stores at once the profiles of the series this
    /// ingester comes first for ([`fathom_api::ring::replicas`], the
    /// distributors' placement), and waits up to `wait` for the blocks of
    /// the ingesters that come first for the others. Of those it stores
    /// only what no such block holds: the profiles those ingesters did not
    /// get (down, or a write that reached a quorum without them), or got
    /// after their cut. Either way every profile of the head is in a
    /// stored, indexed block before its WAL segment goes. A zero `wait`,
    /// a ring this ingester is not in, or a shutdown's cut stores the
    /// head whole.
    pub fn set_peers(&self, ring: Arc<dyn Ingesters>, wait: Duration) {
        *self.peers.write() = Some(Peers { ring, wait });
    }

    /// Refuses `batch` if it would create series beyond its tenant's limit.
    /// Concurrent writes may each pass the check and together go a few
    /// series beyond it.
    fn check_series(&self, batch: &IngestBatch) -> Result<(), Error> {
        let Some(limit) = self
            .series_limit
            .read()
            .as_ref()
            .and_then(|f| f(&batch.tenant))
        else {
            return Ok(());
        };
        let st = self.state.read();
        let head = st.active.get(batch.tenant.as_str());
        let series = head.map_or(0, |h| h.series.len());
        let mut new = HashSet::new();
        for p in &batch.profiles {
            let sid = p.series_id();
            if !head.is_some_and(|h| h.series.contains_key(&sid)) {
                new.insert(sid);
            }
        }
        if new.is_empty() || series.saturating_add(new.len()) <= limit {
            return Ok(());
        }
        self.m.series_limit.inc();
        Err(Error::SeriesLimit {
            tenant: batch.tenant.clone(),
            limit,
            series,
            new: new.len(),
        })
    }

    /// Makes a batch durable, then visible to queries. Returns the sample
    /// rows added (0 when every profile was already present). Refused,
    /// before anything is written, with [`Error::HeadFull`] while the heads
    /// hold `max_head_memory` bytes or more (concurrent writes may each add
    /// one batch beyond it), and with [`Error::SeriesLimit`] when it would
    /// take its tenant over its series limit.
    ///
    /// The WAL record is encoded from what is left once the symbols the
    /// head holds are dropped (format 5 when that names any of them). A
    /// batch built against the head ([`Ingester::held_stacks`]) whose
    /// head was cut since gets the stacks it left out back from the head
    /// that held them, or is refused ([`Error::LeftOut`], retryable) if
    /// that head is gone too.
    pub async fn write(&self, mut batch: IngestBatch) -> Result<usize, Error> {
        let _g = self.gate.read().await;
        if let Some(generation) = batch.symbols.relies_on.take() {
            self.restore_left_out(&mut batch, generation)?;
        }
        self.write_batch(batch, None).await
    }

    /// The stacks the active head of `tenant` holds, for a batch built for
    /// this ingester ([`fathom_model::HeldStacks`]): asked by a single
    /// process's pprof normalizer, so that held stacks are not copied
    /// into the batch. `None` while the tenant has no head.
    pub fn held_stacks(self: &Arc<Self>, tenant: &TenantId) -> Option<Arc<dyn HeldStacks>> {
        // The generation first: a cut after this shows as another one.
        let generation = self.generation.load(Ordering::Acquire);
        if !self.state.read().active.contains_key(tenant.as_str()) {
            return None;
        }
        Some(Arc::new(HeadStacks {
            ingester: self.clone(),
            tenant: tenant.to_string(),
            generation,
        }))
    }

    /// Puts back the stacks `batch` left out because the head of
    /// `generation` held them, when a cut has replaced that head since:
    /// from the active head if it holds them (the record then names
    /// them, as any record does), else from the cut heads still in
    /// memory. The caller holds the gate.
    fn restore_left_out(&self, batch: &mut IngestBatch, generation: u64) -> Result<(), Error> {
        if self.generation.load(Ordering::Acquire) == generation {
            return Ok(());
        }
        let st = self.state.read();
        let active = st.active.get(batch.tenant.as_str());
        let mut missing: Vec<Id> = batch
            .profiles
            .iter()
            .flat_map(|p| p.samples.iter().map(|x| x.stack))
            .filter(|id| {
                !batch.symbols.stacks.contains_key(id)
                    && !active.is_some_and(|h| h.symbols.stacks.contains_key(id))
            })
            .collect::<IdSet>()
            .into_iter()
            .collect();
        let before = missing.len();
        for p in st.pending.iter().rev() {
            if missing.is_empty() {
                break;
            }
            if let Some(h) = p.heads.get(batch.tenant.as_str()) {
                let found = h.symbols.subset(&missing);
                missing.retain(|id| !found.stacks.contains_key(id));
                batch.symbols.merge_owned(found);
            }
        }
        self.m.left_out_restored.inc();
        tracing::debug!(
            tenant = %batch.tenant,
            stacks = before,
            lost = missing.len(),
            "a cut came between a write's normalization and its append; its left-out stacks restored"
        );
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Error::LeftOut {
                stacks: missing.len(),
            })
        }
    }

    /// [`Ingester::write`] of a replicated record: the encoded
    /// `WriteRequest` a distributor sent (format 4: ids computed by the
    /// distributor), appended to the WAL exactly as received and applied
    /// to the head without recomputing any id. An undecodable record is
    /// refused ([`Error::Record`]) before anything is written.
    ///
    /// Symbols the tenant's active head already holds are read and checked
    /// but not copied (most of a steady stream's): the record is decoded
    /// under the gate, so no cut can take that head away before the batch
    /// is applied to it.
    pub async fn write_record(&self, record: bytes::Bytes) -> Result<usize, Error> {
        self.write_record_to_head(record, 0)
            .await
            .map(|(rows, _)| rows)
    }

    /// The number of the active heads: it grows with every cut, and
    /// across restarts (it starts from the clock). A distributor that
    /// sends records leaving out stacks (format 5) keeps, per ingester,
    /// the stacks acknowledged under the current number.
    pub fn head(&self) -> u64 {
        self.epoch
            .wrapping_add(self.generation.load(Ordering::Acquire))
    }

    /// [`Ingester::write_record`], with the number of the head
    /// ([`Ingester::head`]) that took the record. A record of format 5
    /// that names what it leaves out and the head does not hold is
    /// refused whole ([`Error::NotHeld`]).
    ///
    /// `held_under` (`Record.held_under`, 0: not given) is the head number
    /// under which the sender learned that this head holds every stack
    /// the record leaves out: the sender's own record of what this
    /// ingester acknowledged under that number, which only a cut or a
    /// restart (each a new number) can make stale. While the head has that
    /// number, those stacks are taken as held without a lookup each (in a
    /// large head every lookup misses the cache).
    pub async fn write_record_to_head(
        &self,
        record: bytes::Bytes,
        held_under: u64,
    ) -> Result<(usize, u64), Error> {
        let _g = self.gate.read().await;
        // Under the gate: no cut comes before the batch is in the head.
        let head = self.head();
        let trusted = held_under != 0 && held_under == head;
        let batch = {
            let st = self.state.read();
            fathom_proto::decode_write_request_held(
                &record,
                |tenant| st.active.get(tenant).map(|h| &*h.symbols),
                trusted,
            )
        };
        if trusted && batch.is_ok() {
            self.m.held_by_head.inc();
        }
        let batch = match batch {
            Ok(b) => b,
            Err(_)
                if fathom_proto::write_format(&record) == Some(fathom_proto::WRITE_FORMAT_HELD) =>
            {
                self.m.not_held.inc();
                return Err(Error::NotHeld);
            }
            Err(e) => return Err(Error::Record(e)),
        };
        // The gRPC layer's `ingester_write` span, once the record is read.
        let span = tracing::Span::current();
        span.record("tenant", tracing::field::display(&batch.tenant));
        span.record("profiles", batch.profiles.len() as i64);
        span.record("samples", batch.sample_count() as i64);
        let rows = self.write_batch(batch, Some(record)).await?;
        Ok((rows, head))
    }

    /// Appends `batch`'s WAL record, then applies `batch` to its tenant's
    /// head. The caller holds the gate (shared). `received`: the record
    /// as a distributor sent it, its batch decoded skipping what the head
    /// holds (so not looked up again); `None`: the symbols the head holds
    /// are dropped here and the record encoded from the rest.
    async fn write_batch(
        &self,
        batch: IngestBatch,
        received: Option<bytes::Bytes>,
    ) -> Result<usize, Error> {
        let held = self.state.read().held();
        if held >= self.cfg.max_head_memory {
            self.m.head_full.inc();
            return Err(Error::HeadFull {
                held,
                limit: self.cfg.max_head_memory,
            });
        }
        self.check_series(&batch)?;
        let profiles = batch.profiles.len();
        let tenant = batch.tenant.to_string();
        // The sample rows built with no lock; under the shared one
        // (writers side by side), the batch's symbols looked up in the
        // head and those it holds dropped. The caller's gate keeps the
        // head from being cut before the batch is applied to it, and a
        // symbol the head holds came with a record appended before this
        // one, which replay applies first.
        let mut prepared = head::Prepared::new(batch);
        let rec = match received {
            Some(rec) => rec,
            None => {
                if let Some(h) = self.state.read().active.get(&tenant) {
                    prepared.drop_known(&h.symbols);
                }
                prepared.record().into()
            }
        };
        self.wal.append(rec).await?;
        let mut st = self.state.write();
        let h = st.active.entry(tenant).or_default();
        let before = h.bytes;
        let added = h.apply_prepared(prepared);
        let grown = h.bytes - before;
        st.active_bytes += grown;
        self.m.head_bytes.set(st.active_bytes as i64);
        self.m.head_memory.set(st.held() as i64);
        self.m.profiles.inc_by(profiles as u64);
        self.m.samples.inc_by(added as u64);
        Ok(added)
    }

    /// The head data of `tenant` in `[start, end]` (nanoseconds), including
    /// heads being flushed.
    pub fn snapshot(&self, tenant: &TenantId, start: i64, end: i64) -> HeadSnapshot {
        let mut out = HeadSnapshot::default();
        let mut chunks = Vec::new();
        let mut taken = IdSet::default();
        {
            let st = self.state.read();
            if let Some(h) = st.active.get(tenant.as_str()) {
                out.extend_from(h, start, end, &mut chunks, &mut taken);
            }
            for p in &st.pending {
                if let Some(h) = p.heads.get(tenant.as_str()) {
                    out.extend_from(h, start, end, &mut chunks, &mut taken);
                }
            }
        }
        // The rows are built with no lock held: writers go on meanwhile.
        out.add_samples(&chunks, start, end);
        out
    }

    /// The symbols that `stacks` of `tenant` need, from the heads.
    pub fn symbols(&self, tenant: &TenantId, stacks: &[Id]) -> Symbols {
        let st = self.state.read();
        let mut out = Symbols::default();
        let heads = st.active.get(tenant.as_str()).into_iter().chain(
            st.pending
                .iter()
                .filter_map(|p| p.heads.get(tenant.as_str()).map(|h| &**h)),
        );
        for h in heads {
            out.merge(&h.symbols.subset(stacks));
        }
        out
    }

    /// Stops the WAL once what is waiting is on disk (at shutdown, after
    /// the last flush): its segment is left holding records alone, without
    /// the zeros written ahead. Writes after this fail.
    pub async fn close(&self) {
        self.wal.close().await;
    }

    /// Whether a cut is due (interval elapsed with data, or size reached).
    pub fn flush_due(&self) -> bool {
        let st = self.state.read();
        let has_data = st.active.values().any(|h| !h.is_empty());
        has_data
            && (st.active_bytes >= self.cfg.max_head_bytes
                || self.last_flush.lock().elapsed() >= self.cfg.flush_interval)
    }

    /// Cuts every head into blocks and stores them, retrying uploads until
    /// `deadline` (forever when `None`). Returns the blocks written.
    pub async fn flush(&self, deadline: Option<Instant>) -> Result<Vec<BlockMeta>, Error> {
        let _f = self.flush_lock.lock().await;
        {
            let _g = self.gate.write().await;
            let has_data = self.state.read().active.values().any(|h| !h.is_empty());
            if has_data {
                let seg = self.wal.rotate().await?;
                let mut st = self.state.write();
                self.generation.fetch_add(1, Ordering::AcqRel);
                let heads = std::mem::take(&mut st.active);
                let bytes = std::mem::take(&mut st.active_bytes);
                let frozen_ms = now_ms();
                let since_ms = std::mem::replace(&mut st.active_since_ms, frozen_ms);
                st.pending_bytes += bytes;
                st.pending.push_back(Pending {
                    wal_segment: seg,
                    frozen_ms,
                    since_ms,
                    bytes,
                    heads: Arc::new(heads.into_iter().map(|(t, h)| (t, Arc::new(h))).collect()),
                    done: HashSet::new(),
                });
            }
            *self.last_flush.lock() = Instant::now();
        }
        let mut written = Vec::new();
        loop {
            let next = {
                let st = self.state.read();
                st.pending.front().map(|p| {
                    (
                        p.wal_segment,
                        (p.since_ms, p.frozen_ms),
                        p.heads.clone(),
                        p.done.clone(),
                    )
                })
            };
            let Some((seg, times, heads, done)) = next else {
                break;
            };
            for (tenant, head) in heads.iter() {
                if head.is_empty() || done.contains(tenant) {
                    continue;
                }
                // A shutdown's cut stores its heads whole: the peers may
                // be stopping too.
                let split = match deadline {
                    None => self.split(tenant, head).await,
                    Some(_) => None,
                };
                match split {
                    None => {
                        let part = Part::Whole;
                        written.push(self.store_part(head, tenant, part, deadline).await?);
                    }
                    Some(split) => {
                        let Split {
                            mine,
                            theirs,
                            peers,
                        } = split;
                        if !mine.is_empty() {
                            let part = Part::Of(mine);
                            written.push(self.store_part(head, tenant, part, deadline).await?);
                        }
                        let rest = self.left_to_peers(tenant, theirs, &peers, times).await;
                        if !rest.is_empty() {
                            let part = Part::Of(rest);
                            written.push(self.store_part(head, tenant, part, deadline).await?);
                        }
                    }
                }
                if let Some(p) = self.state.write().pending.front_mut() {
                    p.done.insert(tenant.clone());
                }
            }
            {
                let mut st = self.state.write();
                if let Some(p) = st.pending.pop_front() {
                    st.pending_bytes -= p.bytes;
                }
                self.m.head_memory.set(st.held() as i64);
            }
            let removed = self.wal.remove_before(seg)?;
            tracing::debug!(segments = removed, "dropped flushed wal segments");
        }
        self.m.head_bytes.set(self.state.read().active_bytes as i64);
        Ok(written)
    }

    /// A frozen head's profiles by the live ingester that comes first
    /// for their series; none when this ingester has no peers (none set,
    /// the ring unread, this ingester not in it) or comes first for every
    /// series: then the head is stored whole.
    async fn split(&self, tenant: &str, head: &TenantHead) -> Option<Split> {
        let ring = {
            let peers = self.peers.read();
            let p = peers.as_ref()?;
            if p.wait.is_zero() {
                return None;
            }
            p.ring.clone()
        };
        let live = match ring.ingesters().await {
            Ok(live) => live,
            Err(e) => {
                tracing::warn!(error = %e, "the ring could not be read: the cut stores every series");
                return None;
            }
        };
        if live.len() < 2 || !live.iter().any(|m| m.id == self.cfg.name) {
            return None;
        }
        let tenant_id = TenantId::new(tenant).ok()?;
        let mut peers: Vec<String> = Vec::new();
        // Series → the index in `peers` of the ingester first for it;
        // none when it is this one.
        let mut first: IdMap<Option<usize>> = IdMap::default();
        for (sid, row) in &head.series {
            let key = fathom_api::ring::RingKey::of(&tenant_id, &row.labels);
            let to = fathom_api::ring::replicas(&live, &key, 1);
            let peer = match to.into_iter().next() {
                Some(m) if m.id != self.cfg.name => {
                    Some(match peers.iter().position(|p| *p == m.id) {
                        Some(i) => i,
                        None => {
                            peers.push(m.id);
                            peers.len() - 1
                        }
                    })
                }
                _ => None,
            };
            first.insert(*sid, peer);
        }
        if peers.is_empty() {
            return None;
        }
        let mut mine = IdSet::default();
        let mut theirs = Vec::new();
        for p in &head.profiles {
            match first.get(&p.series_id).copied().flatten() {
                Some(peer) => theirs.push((p.profile_id, p.time_nanos, peer)),
                None => {
                    mine.insert(p.profile_id);
                }
            }
        }
        Some(Split {
            mine,
            theirs,
            peers,
        })
    }

    /// Which of `theirs` (profiles whose series `peers` come first for)
    /// this ingester must store itself: those that no level-0 block of a
    /// peer holds once each peer first for one of them has stored, since
    /// the head was frozen, a block with profiles of this head whose
    /// series it comes first for (its cut after this one's, or the one
    /// before it if that came after some of this head's writes: what the
    /// peer got later it stores at its next cut, too late to wait for),
    /// or once the wait ([`Ingester::set_peers`]) is over. `times`: when
    /// the head began and was frozen, unix milliseconds. Blocks made
    /// before the head began are not looked at (their profiles came
    /// before this head's, bar a late replica's).
    async fn left_to_peers(
        &self,
        tenant: &str,
        mut theirs: Vec<(Id, i64, usize)>,
        peers: &[String],
        (since_ms, frozen_ms): (i64, i64),
    ) -> IdSet {
        let wait = self
            .peers
            .read()
            .as_ref()
            .map_or(Duration::ZERO, |p| p.wait);
        let start = Instant::now();
        let total = theirs.len();
        let (lo, hi) = theirs
            .iter()
            .fold((i64::MAX, i64::MIN), |(lo, hi), &(_, t, _)| {
                (lo.min(t), hi.max(t))
            });
        let first: IdMap<usize> = theirs.iter().map(|&(id, _, peer)| (id, peer)).collect();
        let mut looked: HashSet<String> = HashSet::new();
        let mut covered = IdSet::default();
        // Per peer: has it stored, since the freeze, a block of the
        // series it comes first for (not the rest of an earlier cut)?
        let mut cut_since = vec![false; peers.len()];
        let mut poll = PEER_POLL.0;
        loop {
            match self.index.blocks(tenant, lo, hi).await {
                Ok(blocks) => {
                    for b in blocks {
                        let Some(peer) = peers.iter().position(|p| *p == b.source) else {
                            continue;
                        };
                        if b.level != 0
                            || b.created_at_ms < since_ms
                            || !looked.insert(b.id.clone())
                        {
                            continue;
                        }
                        match fathom_block::read_profiles(self.store.as_ref(), &b).await {
                            Ok(rows) => {
                                let own = |r: &fathom_block::ProfileRow| {
                                    first.get(&r.profile_id) == Some(&peer)
                                };
                                if b.created_at_ms >= frozen_ms && rows.iter().any(own) {
                                    cut_since[peer] = true;
                                }
                                covered.extend(rows.iter().map(|r| r.profile_id));
                            }
                            Err(e) => {
                                tracing::warn!(block_id = %b.id, error = %e, "a peer's block could not be read: the cut stores the profiles it may hold");
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(tenant, error = %e, "the block index could not be read: the cut stores its peers' series");
                    break;
                }
            }
            theirs.retain(|(id, _, _)| !covered.contains(id));
            let waited = start.elapsed();
            if theirs.is_empty()
                || theirs.iter().all(|&(_, _, peer)| cut_since[peer])
                || waited >= wait
            {
                break;
            }
            tokio::time::sleep((wait - waited).min(poll)).await;
            poll = (poll * 2).min(PEER_POLL.1);
        }
        let waited = start.elapsed();
        self.m.peer_wait_seconds.observe(waited);
        let left = total - theirs.len();
        self.m.left_to_peers.inc_by(left as u64);
        self.m.kept_from_peers.inc_by(theirs.len() as u64);
        tracing::info!(
            tenant,
            left_to_peers = left,
            kept = theirs.len(),
            waited_ms = waited.as_millis() as u64,
            "cut: the blocks of the ingesters first for their series hold the profiles left to them"
        );
        theirs.into_iter().map(|(id, _, _)| id).collect()
    }

    /// Encodes the block of `part` of `tenant`'s `head` (on the
    /// blocking pool: a part's symbols are found by reading its samples),
    /// stores it and adds it to the index.
    async fn store_part(
        &self,
        head: &Arc<TenantHead>,
        tenant: &str,
        part: Part,
        deadline: Option<Instant>,
    ) -> Result<BlockMeta, Error> {
        let start = Instant::now();
        let (head, t, source) = (head.clone(), tenant.to_owned(), self.cfg.name.clone());
        let (meta, files) = tokio::task::spawn_blocking(move || {
            match part {
                Part::Whole => head.to_block(t, source),
                Part::Of(keep) => head.to_block_of(t, source, keep),
            }
            .encode()
        })
        .await
        .map_err(Error::EncodeTask)??;
        let encoded = start.elapsed();
        self.m.block_encode_seconds.observe(encoded);
        let mut backoff = Duration::from_millis(200);
        loop {
            match fathom_block::write_block(self.store.as_ref(), &meta, files.clone()).await {
                Ok(()) => break,
                Err(e) => {
                    self.m.upload_failures.inc();
                    tracing::warn!(tenant, block_id = %meta.id, error = %e, "block upload failed; retrying");
                    if deadline.is_some_and(|d| Instant::now() + backoff > d) {
                        return Err(Error::FlushDeadline);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        // A stored block that the index does not know is invisible to
        // queries: keep retrying (the WAL segment stays until this returns
        // Ok), but do not upload again.
        loop {
            match self.index.add(meta.clone()).await {
                Ok(()) => break,
                Err(e) => {
                    self.m.index_failures.inc();
                    tracing::warn!(tenant, block_id = %meta.id, error = %e, "block index update failed; retrying");
                    if deadline.is_some_and(|d| Instant::now() + backoff > d) {
                        return Err(Error::FlushDeadline);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        let stored = start.elapsed().saturating_sub(encoded);
        self.m.block_store_seconds.observe(stored);
        self.m.blocks.inc();
        self.m.block_bytes.inc_by(meta.stats.bytes);
        tracing::info!(
            tenant,
            block_id = %meta.id,
            profiles = meta.stats.profiles,
            samples = meta.stats.samples,
            bytes = meta.stats.bytes,
            encode_ms = encoded.as_millis() as u64,
            store_ms = stored.as_millis() as u64,
            "flushed block"
        );
        Ok(meta)
    }

    /// Runs [`Ingester::flush`] whenever it is due, until `stop` fires.
    pub async fn run_flush_loop(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => return,
            }
            if self.flush_due()
                && let Err(e) = self.flush(None).await
            {
                tracing::error!(error = %e, "flush failed");
            }
        }
    }

    /// Bytes of WAL segments on disk.
    pub fn wal_disk_bytes(&self) -> u64 {
        self.wal.disk_bytes()
    }
}

/// The clock's unix milliseconds (a block's `created_at_ms`).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod replication_tests;

#[cfg(test)]
mod peer_cut_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use fathom_block::MemoryIndex;
    use fathom_model::*;
    use object_store::memory::InMemory;

    /// One profile of one sample, at a location of its own (`address` is
    /// the seed) in a function all share.
    pub(crate) fn batch(tenant: &str, seed: u64, value: i64) -> IngestBatch {
        let mut symbols = Symbols::default();
        let f = symbols.add_function(Function {
            name: "main".into(),
            ..Default::default()
        });
        let l = symbols.add_location(Location {
            address: seed,
            lines: vec![Line {
                function: f,
                line: 1,
            }],
            ..Default::default()
        });
        let st = symbols.add_stack(Stack { locations: vec![l] });
        IngestBatch {
            tenant: TenantId::new(tenant).unwrap(),
            profiles: vec![Profile {
                id: IdHasher::new("test").u64(seed).finish(),
                profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
                    .parse()
                    .unwrap(),
                labels: Labels::from_pairs([("service_name", "svc")]).unwrap(),
                time_nanos: 1_000 + seed as i64,
                duration_nanos: 10,
                period: 1,
                samples: vec![Sample { stack: st, value }],
            }],
            symbols,
        }
    }

    fn open(dir: &std::path::Path, store: Arc<InMemory>, index: Arc<MemoryIndex>) -> Arc<Ingester> {
        open_on(dir, store, index)
    }

    /// [`open`] on any store (one that refuses uploads, say).
    fn open_on(
        dir: &std::path::Path,
        store: Arc<dyn ObjectStore>,
        index: Arc<dyn BlockIndex>,
    ) -> Arc<Ingester> {
        Ingester::open(
            Config {
                data_dir: dir.to_owned(),
                name: "test".into(),
                flush_interval: Duration::from_secs(3600),
                max_head_bytes: 1 << 30,
                max_head_memory: 1 << 30,
            },
            store,
            index,
            &mut Registry::default(),
        )
        .unwrap()
    }

    /// A cut whose upload cannot finish in time: the heads stay pending
    /// (in memory, queryable, in the WAL).
    async fn cut_unstored(ing: &Ingester) {
        let err = ing
            .flush(Some(Instant::now() + Duration::from_millis(300)))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::FlushDeadline), "{err}");
    }

    fn total(s: &HeadSnapshot) -> i64 {
        use arrow::array::AsArray;
        s.samples
            .iter()
            .map(|b| {
                b.column(4)
                    .as_primitive::<arrow::datatypes::Int64Type>()
                    .values()
                    .iter()
                    .sum::<i64>()
            })
            .sum()
    }

    #[tokio::test]
    async fn replay_flush_and_idempotence() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(InMemory::new());
        let index = Arc::new(MemoryIndex::default());
        let t = TenantId::new("t1").unwrap();
        {
            let ing = open(dir.path(), store.clone(), index.clone());
            assert_eq!(ing.write(batch("t1", 1, 5)).await.unwrap(), 1);
            assert_eq!(ing.write(batch("t1", 2, 7)).await.unwrap(), 1);
            // The same profile id again is a no-op.
            assert_eq!(ing.write(batch("t1", 2, 7)).await.unwrap(), 0);
            assert_eq!(ing.write(batch("t2", 3, 100)).await.unwrap(), 1);
            assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 12);
            // Tenants never see each other's heads.
            assert_eq!(
                total(&ing.snapshot(&TenantId::new("t2").unwrap(), 0, i64::MAX)),
                100
            );
            // Time ranges filter profiles and series.
            assert_eq!(ing.snapshot(&t, 0, 1001).profiles.len(), 1);
        }
        // Crash (no flush): the WAL brings everything back.
        let ing = open(dir.path(), store.clone(), index.clone());
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 12);
        assert_eq!(ing.snapshot(&t, 0, i64::MAX).profiles.len(), 2);

        let blocks = ing.flush(None).await.unwrap();
        assert_eq!(blocks.len(), 2, "one block per tenant");
        assert!(ing.snapshot(&t, 0, i64::MAX).profiles.is_empty());
        let metas = index.blocks("t1", 0, i64::MAX).await.unwrap();
        assert_eq!(metas.len(), 1);
        assert_eq!(metas[0].stats.samples, 2);
        assert_eq!(
            (metas[0].min_time_nanos, metas[0].max_time_nanos),
            (1001, 1002)
        );
        drop(ing);
        // After a flush the WAL is empty.
        let ing = open(dir.path(), store, index);
        assert!(ing.snapshot(&t, 0, i64::MAX).profiles.is_empty());
    }

    #[tokio::test]
    async fn failed_upload_keeps_data_queryable_and_in_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(InMemory::new());
        let index = Arc::new(MemoryIndex::default());
        let t = TenantId::new("t1").unwrap();
        let ing = open_on(dir.path(), Arc::new(ReadOnly(store.clone())), index.clone());
        ing.write(batch("t1", 1, 5)).await.unwrap();
        cut_unstored(&ing).await;
        // Still queryable from the frozen head, nothing registered.
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        assert!(index.blocks("t1", 0, i64::MAX).await.unwrap().is_empty());
        drop(ing);
        // And still in the WAL: a restart with a working store flushes it.
        let ing = open(dir.path(), store, index.clone());
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        assert_eq!(ing.flush(None).await.unwrap().len(), 1);
        assert_eq!(index.blocks("t1", 0, i64::MAX).await.unwrap().len(), 1);
    }

    /// `batch(tenant, seed, value)` as a single process's normalizer
    /// builds it against `held`: another profile (id from `n`), its stack
    /// and every symbol behind it left out because the head holds them.
    fn built_against(held: &dyn HeldStacks, seed: u64, n: u64, value: i64) -> IngestBatch {
        let mut b = batch("t1", seed, value);
        let stack = b.profiles[0].samples[0].stack;
        assert_eq!(
            held.holds(&Labels::new(), &[stack]),
            [true],
            "the head holds the stack"
        );
        b.profiles[0].id = IdHasher::new("again").u64(seed).u64(n).finish();
        b.symbols = Symbols {
            relies_on: Some(held.generation()),
            ..Default::default()
        };
        b
    }

    /// The format versions of the WAL's records, read after a restart.
    fn wal_formats(dir: &std::path::Path) -> Vec<u32> {
        let mut formats = Vec::new();
        Wal::open(&dir.join("wal"), WalMetrics::default(), |rec| {
            let w = <fathom_proto::ingester::WriteRequest as prost::Message>::decode(rec).unwrap();
            formats.push(w.format_version);
        })
        .unwrap();
        formats
    }

    /// A write built against the head leaves out what the head holds: its
    /// WAL record (format 5) names the stack without repeating it, and
    /// replay, applying records in order, rebuilds the same head. A cut
    /// between the build and the write is survived while the stacks are
    /// in memory, and refused (retryable) once they are not.
    #[tokio::test]
    async fn a_write_built_against_the_head_leaves_out_what_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(InMemory::new());
        let index = Arc::new(MemoryIndex::default());
        let t = TenantId::new("t1").unwrap();
        let stack = batch("t1", 1, 0).profiles[0].samples[0].stack;
        {
            let ing = open(dir.path(), store.clone(), index.clone());
            assert!(ing.held_stacks(&t).is_none(), "no head yet");
            ing.write(batch("t1", 1, 5)).await.unwrap();
            let held = ing.held_stacks(&t).unwrap();
            assert_eq!(
                held.holds(&Labels::new(), &[IdHasher::new("x").finish()]),
                [false]
            );
            assert_eq!(ing.write(built_against(&*held, 1, 1, 7)).await.unwrap(), 1);
            assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 12);
        }
        assert_eq!(
            wal_formats(dir.path()),
            [fathom_proto::WRITE_FORMAT, fathom_proto::WRITE_FORMAT_HELD]
        );
        // Replay rebuilds the head, the stack's symbols with it.
        let ing = open(dir.path(), store.clone(), index.clone());
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 12);
        assert_eq!(ing.symbols(&t, &[stack]).locations.len(), 1);

        // Built, then the head is cut and stored: the stack is gone.
        let held = ing.held_stacks(&t).unwrap();
        let stale = built_against(&*held, 1, 2, 100);
        assert_eq!(ing.flush(None).await.unwrap().len(), 1);
        let err = ing.write(stale.clone()).await.unwrap_err();
        assert!(matches!(err, Error::LeftOut { stacks: 1 }), "{err}");
        assert!(err.to_string().contains("retry"), "{err}");
        // Once the new head holds it again, the same batch is taken.
        ing.write(batch("t1", 1, 1)).await.unwrap();
        assert_eq!(ing.write(stale).await.unwrap(), 1);
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 101);
        drop(ing);

        // A cut whose blocks are not stored yet: the stack comes back
        // from the cut head, into the record.
        let ing = open_on(dir.path(), Arc::new(ReadOnly(store.clone())), index.clone());
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 101);
        let held = ing.held_stacks(&t).unwrap();
        let pending = built_against(&*held, 1, 3, 1000);
        cut_unstored(&ing).await;
        assert_eq!(ing.write(pending).await.unwrap(), 1);
        drop(ing);
        let ing = open(dir.path(), store, index);
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 1101);
        assert_eq!(ing.symbols(&t, &[stack]).stacks.len(), 1);
    }

    /// A block index that refuses every change until `healthy` is set.
    #[derive(Default)]
    struct FlakyIndex {
        healthy: std::sync::atomic::AtomicBool,
        inner: MemoryIndex,
    }

    #[async_trait::async_trait]
    impl BlockIndex for FlakyIndex {
        async fn add(&self, meta: BlockMeta) -> Result<(), fathom_block::IndexError> {
            if !self.healthy.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(fathom_block::IndexError::new("metastore unreachable"));
            }
            self.inner.add(meta).await
        }
        async fn blocks(
            &self,
            tenant: &str,
            start: i64,
            end: i64,
        ) -> Result<Vec<BlockMeta>, fathom_block::IndexError> {
            self.inner.blocks(tenant, start, end).await
        }
        async fn all(&self) -> Result<Vec<BlockMeta>, fathom_block::IndexError> {
            self.inner.all().await
        }
        async fn remove(
            &self,
            tenant: &str,
            ids: &[String],
        ) -> Result<(), fathom_block::IndexError> {
            self.inner.remove(tenant, ids).await
        }
    }

    #[tokio::test]
    async fn failed_index_update_keeps_the_block_pending_and_in_the_wal() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(InMemory::new());
        let index = Arc::new(FlakyIndex::default());
        let t = TenantId::new("t1").unwrap();
        let open_flaky = |index: Arc<FlakyIndex>| {
            Ingester::open(
                Config {
                    data_dir: dir.path().to_owned(),
                    name: "test".into(),
                    flush_interval: Duration::from_secs(3600),
                    max_head_bytes: 1 << 30,
                    max_head_memory: 1 << 30,
                },
                store.clone(),
                index,
                &mut Registry::default(),
            )
            .unwrap()
        };
        let ing = open_flaky(index.clone());
        ing.write(batch("t1", 1, 5)).await.unwrap();
        cut_unstored(&ing).await;
        // Uploaded but not indexed: still served from the frozen head.
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        assert!(index.inner.all().await.unwrap().is_empty());
        drop(ing);
        // The WAL segment was kept: a restart with a reachable index
        // registers the data.
        index
            .healthy
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let ing = open_flaky(index.clone());
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        assert_eq!(ing.flush(None).await.unwrap().len(), 1);
        assert_eq!(
            index.inner.blocks("t1", 0, i64::MAX).await.unwrap().len(),
            1
        );
        assert!(ing.snapshot(&t, 0, i64::MAX).profiles.is_empty());
    }

    /// An object store whose writes fail while `down` is set.
    #[derive(Debug, Default)]
    struct Outage {
        down: std::sync::atomic::AtomicBool,
        inner: InMemory,
    }

    impl Outage {
        /// A store that is down from the start.
        fn down() -> Arc<Outage> {
            let store = Arc::new(Outage::default());
            store.down.store(true, std::sync::atomic::Ordering::SeqCst);
            store
        }
    }

    impl std::fmt::Display for Outage {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outage")
        }
    }

    impl Outage {
        fn check(&self) -> object_store::Result<()> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                Err(refused())
            } else {
                Ok(())
            }
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for Outage {
        async fn put_opts(
            &self,
            l: &object_store::path::Path,
            p: object_store::PutPayload,
            o: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            self.check()?;
            self.inner.put_opts(l, p, o).await
        }
        async fn put_multipart_opts(
            &self,
            l: &object_store::path::Path,
            o: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.check()?;
            self.inner.put_multipart_opts(l, o).await
        }
        async fn get_opts(
            &self,
            l: &object_store::path::Path,
            o: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.inner.get_opts(l, o).await
        }
        fn delete_stream(
            &self,
            l: futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>
        {
            self.inner.delete_stream(l)
        }
        fn list(
            &self,
            p: Option<&object_store::path::Path>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.inner.list(p)
        }
        async fn list_with_delimiter(
            &self,
            p: Option<&object_store::path::Path>,
        ) -> object_store::Result<object_store::ListResult> {
            self.inner.list_with_delimiter(p).await
        }
        async fn copy_opts(
            &self,
            f: &object_store::path::Path,
            t: &object_store::path::Path,
            o: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.check()?;
            self.inner.copy_opts(f, t, o).await
        }
    }

    /// A retry that comes after a cut, its first copy in the head still
    /// being stored, is held twice, but a snapshot gives it once: its
    /// samples are counted once, not twice and not (left out by id as a
    /// second copy) zero times.
    #[tokio::test]
    async fn a_retry_after_a_cut_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Outage::down();
        let index = Arc::new(MemoryIndex::default());
        let ing = open_on(dir.path(), store.clone(), index.clone());
        ing.write(batch("t1", 1, 7)).await.unwrap();
        ing.write(batch("t1", 2, 5)).await.unwrap();
        cut_unstored(&ing).await;
        // The retry goes to the active head: the cut one is still pending.
        assert_eq!(ing.write(batch("t1", 1, 7)).await.unwrap(), 1);
        let t = TenantId::new("t1").unwrap();
        let snap = ing.snapshot(&t, 0, i64::MAX);
        assert_eq!(snap.profiles.len(), 2, "{:?}", snap.profiles);
        assert_eq!(total(&snap), 12);
        // Stored, each head keeps its copy (a query or a compaction
        // counts the profile once): two blocks, three samples.
        store.down.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(ing.flush(None).await.unwrap().len(), 2);
        let blocks = index.blocks("t1", 0, i64::MAX).await.unwrap();
        let stored: u64 = blocks.iter().map(|b| b.stats.samples).sum();
        assert_eq!(stored, 3);
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 0);
    }

    /// While the object store is down, the heads fill up to the memory cap
    /// and writes are refused (retryable, nothing written); once it is back,
    /// a flush frees the heads, writes are accepted again, and every
    /// acknowledged write is in the stored blocks.
    #[tokio::test]
    async fn a_full_head_refuses_writes_until_blocks_are_stored() {
        let dir = tempfile::tempdir().unwrap();
        let store = Outage::down();
        let index = Arc::new(MemoryIndex::default());
        let limit = 4096;
        let ing = Ingester::open(
            Config {
                data_dir: dir.path().to_owned(),
                name: "test".into(),
                flush_interval: Duration::from_secs(3600),
                max_head_bytes: 1 << 30,
                max_head_memory: limit,
            },
            store.clone(),
            index.clone(),
            &mut Registry::default(),
        )
        .unwrap();
        let mut acked = 0i64;
        let mut seed = 0u64;
        let refused = loop {
            seed += 1;
            assert!(
                seed < 1000,
                "the cap of {limit} bytes never refused a write"
            );
            match ing.write(batch("t1", seed, 1)).await {
                Ok(_) => acked += 1,
                Err(e) => break e,
            }
        };
        assert!(
            matches!(refused, Error::HeadFull { held, limit: l } if held >= l && l == limit),
            "{refused}"
        );
        assert!(refused.to_string().contains("retry later"), "{refused}");
        assert!(acked > 1, "several writes fit under the cap");
        let wal = ing.wal_disk_bytes();
        // A cut with the store down moves the heads to pending: they still
        // count, so writes are still refused, and the WAL did not grow.
        cut_unstored(&ing).await;
        assert!(matches!(
            ing.write(batch("t1", 5000, 1)).await,
            Err(Error::HeadFull { .. })
        ));
        assert_eq!(
            ing.wal_disk_bytes(),
            wal,
            "a refused write leaves no WAL record"
        );
        let t = TenantId::new("t1").unwrap();
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), acked);
        // The store is back: the pending heads become blocks and writes are
        // accepted again.
        store.down.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(ing.flush(None).await.unwrap().len(), 1);
        ing.write(batch("t1", 6000, 1)).await.unwrap();
        acked += 1;
        assert_eq!(ing.flush(None).await.unwrap().len(), 1);
        let blocks = index.blocks("t1", 0, i64::MAX).await.unwrap();
        let stored: u64 = blocks.iter().map(|b| b.stats.samples).sum();
        assert_eq!(stored, acked as u64, "every acknowledged write is stored");
    }

    /// What a distributor sends (the record `fathom_proto::encode_write_request`
    /// makes of its batch, as `ReplicatedWriter` sends it) is what the
    /// ingester stores: the WAL record is the same bytes, and the head
    /// holds the batch with the ids as sent.
    #[tokio::test]
    async fn a_replicated_record_is_stored_as_received() {
        use fathom_proto::ingester::Record;
        use fathom_proto::ingester::ingester_service_server::IngesterService;
        let dir = tempfile::tempdir().unwrap();
        let ing = open(
            dir.path(),
            Arc::new(InMemory::new()),
            Arc::new(MemoryIndex::default()),
        );
        let sent_batch = batch("t1", 1, 5);
        let sent = bytes::Bytes::from(fathom_proto::encode_write_request(&sent_batch));
        let server = WriteServer(ing.clone());
        server
            .write_record(tonic::Request::new(Record {
                record: sent.clone(),
                held_under: 0,
            }))
            .await
            .unwrap();
        assert_eq!(
            wal::read_records(&dir.path().join("wal")),
            vec![sent.to_vec()]
        );
        let t = TenantId::new("t1").unwrap();
        assert_eq!(total(&ing.snapshot(&t, 0, i64::MAX)), 5);
        let stack = sent_batch.profiles[0].samples[0].stack;
        assert_eq!(ing.symbols(&t, &[stack]), sent_batch.symbols);
        // A record that is not a WriteRequest is refused, nothing stored.
        let err = server
            .write_record(tonic::Request::new(Record {
                record: bytes::Bytes::from_static(b"\xff\xff not protobuf"),
                held_under: 0,
            }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert_eq!(wal::read_records(&dir.path().join("wal")).len(), 1);
    }

    /// A WAL written by the first record format (format 0: no symbol ids)
    /// replays, the ids recomputed, to the same head, and so do ones of
    /// format 2 (stacks by location id) and 3 (samples by stack id); a
    /// record of a format
    /// this build does not know stops the start with an error that says
    /// what to do, instead of dropping acknowledged data.
    #[tokio::test]
    async fn replays_a_first_format_wal_and_refuses_an_unknown_format() {
        use fathom_proto::ingester::WriteRequest;
        use prost::Message;
        let dir = tempfile::tempdir().unwrap();
        let b = batch("t1", 1, 5);
        let v0 = fathom_proto::write_request_format0(&b);
        let b2 = batch("t1", 2, 7);
        let v2 = fathom_proto::write_request_format2(&b2);
        assert_eq!(v2.format_version, 2);
        let b3 = batch("t1", 3, 9);
        let v3 = fathom_proto::write_request_format3(&b3);
        assert_eq!(v3.format_version, 3);
        let wal_dir = dir.path().join("wal");
        wal::write_segment(
            &wal_dir,
            1,
            &[
                &v0.encode_to_vec(),
                &v2.encode_to_vec(),
                &v3.encode_to_vec(),
            ],
        );
        let store = Arc::new(InMemory::new());
        let index = Arc::new(MemoryIndex::default());
        let ing = open(dir.path(), store.clone(), index.clone());
        let t = TenantId::new("t1").unwrap();
        assert_eq!(
            total(&ing.snapshot(&t, 0, i64::MAX)),
            5 + 7 + 9,
            "every record replayed"
        );
        let stack = b.profiles[0].samples[0].stack;
        assert_eq!(ing.symbols(&t, &[stack]), b.symbols);
        drop(ing);
        std::thread::sleep(Duration::from_millis(50));

        let mut future = WriteRequest::from(&b);
        future.format_version = fathom_proto::WRITE_FORMAT_HELD + 1;
        wal::write_segment(&wal_dir, 100, &[&future.encode_to_vec()]);
        let err = Ingester::open(
            Config {
                data_dir: dir.path().to_owned(),
                name: "test".into(),
                flush_interval: Duration::from_secs(3600),
                max_head_bytes: 1 << 30,
                max_head_memory: 1 << 30,
            },
            store,
            index,
            &mut Registry::default(),
        )
        .err()
        .expect("an unknown record format refuses the start");
        assert!(
            matches!(err, Error::RecordVersion { record: 4, .. }),
            "{err}"
        );
        let source = std::error::Error::source(&err).unwrap().to_string();
        let version = format!("format version {}", fathom_proto::WRITE_FORMAT_HELD + 1);
        assert!(
            err.to_string().contains("cannot be replayed by this build")
                && source.contains(&version),
            "{err}: {source}"
        );
    }

    /// A batch of one profile of series `svc` of `tenant`.
    fn series_batch(tenant: &str, seed: u64, svc: &str) -> IngestBatch {
        let mut b = batch(tenant, seed, 1);
        b.profiles[0].labels = Labels::from_pairs([("service_name", svc)]).unwrap();
        b
    }

    /// At its max_series a tenant's new series are refused before anything
    /// is written; its existing series and other tenants are unaffected;
    /// a raised limit applies at once and a cut head frees the count.
    #[tokio::test]
    async fn max_series_refuses_new_series_only() {
        let dir = tempfile::tempdir().unwrap();
        let ing = open(
            dir.path(),
            Arc::new(InMemory::new()),
            Arc::new(MemoryIndex::default()),
        );
        let limit = Arc::new(std::sync::atomic::AtomicUsize::new(2));
        let l = limit.clone();
        ing.set_series_limit(Arc::new(move |t: &TenantId| {
            (t.as_str() == "t1").then(|| l.load(std::sync::atomic::Ordering::SeqCst))
        }));
        ing.write(series_batch("t1", 1, "a")).await.unwrap();
        ing.write(series_batch("t1", 2, "b")).await.unwrap();
        let wal = ing.wal_disk_bytes();
        let err = ing.write(series_batch("t1", 3, "c")).await.unwrap_err();
        assert!(
            matches!(&err, Error::SeriesLimit { tenant, limit: 2, series: 2, new: 1 } if tenant.as_str() == "t1"),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("tenant t1") && msg.contains("limit of 2 series"),
            "{msg}"
        );
        assert_eq!(
            ing.wal_disk_bytes(),
            wal,
            "a refused write leaves no WAL record"
        );
        let t1 = TenantId::new("t1").unwrap();
        assert_eq!(ing.snapshot(&t1, 0, i64::MAX).series.len(), 2);
        assert_eq!(ing.snapshot(&t1, 0, i64::MAX).profiles.len(), 2);
        // A batch mixing an existing and a new series is refused whole.
        let mut mixed = series_batch("t1", 4, "a");
        mixed.profiles.extend(series_batch("t1", 5, "d").profiles);
        assert!(matches!(
            ing.write(mixed).await,
            Err(Error::SeriesLimit { new: 1, .. })
        ));
        assert_eq!(ing.snapshot(&t1, 0, i64::MAX).profiles.len(), 2);
        // Existing series still take writes.
        assert_eq!(ing.write(series_batch("t1", 6, "a")).await.unwrap(), 1);
        // Another tenant is not limited.
        for (i, svc) in ["a", "b", "c", "d"].iter().enumerate() {
            ing.write(series_batch("t2", 10 + i as u64, svc))
                .await
                .unwrap();
        }
        // A raised limit applies to the next write.
        limit.store(3, std::sync::atomic::Ordering::SeqCst);
        ing.write(series_batch("t1", 7, "c")).await.unwrap();
        assert!(ing.write(series_batch("t1", 8, "d")).await.is_err());
        // Once the head is cut, its series no longer count.
        ing.flush(None).await.unwrap();
        ing.write(series_batch("t1", 8, "d")).await.unwrap();
        assert_eq!(ing.snapshot(&t1, 0, i64::MAX).series.len(), 1);
    }

    /// An object store whose writes fail.
    #[derive(Debug)]
    struct ReadOnly(Arc<InMemory>);

    impl std::fmt::Display for ReadOnly {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("read-only")
        }
    }

    fn refused() -> object_store::Error {
        object_store::Error::Generic {
            store: "read-only",
            source: "the store is down".into(),
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for ReadOnly {
        async fn put_opts(
            &self,
            _: &object_store::path::Path,
            _: object_store::PutPayload,
            _: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            Err(refused())
        }
        async fn put_multipart_opts(
            &self,
            _: &object_store::path::Path,
            _: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            Err(refused())
        }
        async fn get_opts(
            &self,
            l: &object_store::path::Path,
            o: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.0.get_opts(l, o).await
        }
        fn delete_stream(
            &self,
            l: futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>
        {
            self.0.delete_stream(l)
        }
        fn list(
            &self,
            p: Option<&object_store::path::Path>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.0.list(p)
        }
        async fn list_with_delimiter(
            &self,
            p: Option<&object_store::path::Path>,
        ) -> object_store::Result<object_store::ListResult> {
            self.0.list_with_delimiter(p).await
        }
        async fn copy_opts(
            &self,
            _: &object_store::path::Path,
            _: &object_store::path::Path,
            _: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            Err(refused())
        }
    }
}
