//! The Raft log and vote, in one append-only file.
//!
//! ```text
//! raft.log = "FTHMLOG1" record*
//! record   = len: u32 LE | crc32(payload): u32 LE | payload (JSON of LogRecord, len bytes)
//! ```
//!
//! Appends, votes, truncations and purges are records; the in-memory view is
//! the replay of the file. Every append and vote is fsynced before openraft
//! is told it is durable. When dead records (truncated or purged entries,
//! superseded votes) outnumber live entries, the file is rewritten to a
//! temporary file that is fsynced and renamed over the old one.
//!
//! On open, a record that is cut short, fails its checksum or does not
//! decode ends the log: the file is truncated before it (a crash in the
//! middle of an append leaves exactly that), and a warning names the offset
//! and the cause.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageIOError};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};

const MAGIC: &[u8; 8] = b"FTHMLOG1";
/// Largest record accepted on replay; anything longer is corruption.
pub(crate) const MAX_RECORD_BYTES: u32 = 64 << 20;
/// Rewrite the file once this many records are dead (and they outnumber the
/// live entries).
const REWRITE_MIN_DEAD: u64 = 1024;

#[derive(Serialize, Deserialize)]
enum LogRecord {
    Vote(Vote),
    Entry(Box<Entry>),
    /// Entries from this index on are gone.
    Truncate(u64),
    /// Entries up to and including this log id are gone.
    Purge(LogId),
    Committed(Option<LogId>),
}

#[derive(Default)]
struct LogData {
    vote: Option<Vote>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    entries: BTreeMap<u64, Entry>,
}

impl LogData {
    fn replay(&mut self, rec: LogRecord) {
        match rec {
            LogRecord::Vote(v) => self.vote = Some(v),
            LogRecord::Entry(e) => {
                let e = *e;
                let idx = e.log_id.index;
                self.entries.split_off(&idx);
                self.entries.insert(idx, e);
            }
            LogRecord::Truncate(since) => {
                self.entries.split_off(&since);
            }
            LogRecord::Purge(id) => self.purge(id),
            LogRecord::Committed(c) => self.committed = c,
        }
    }

    fn purge(&mut self, id: LogId) {
        let keep = self.entries.split_off(&(id.index + 1));
        self.entries = keep;
        if self.last_purged.is_none_or(|p| p < id) {
            self.last_purged = Some(id);
        }
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(self.last_purged)
    }
}

/// What [`LogFile::open`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct OpenReport {
    pub(crate) records: u64,
    /// Bytes cut off the end because the tail was torn or corrupt.
    pub(crate) truncated_bytes: u64,
    pub(crate) reason: Option<String>,
}

struct LogFile {
    path: PathBuf,
    file: File,
    dead: u64,
    /// Set after a failed write: the file may end in a partial record, so
    /// nothing more may be appended in this process.
    failed: bool,
}

fn encode(rec: &LogRecord, out: &mut Vec<u8>) -> std::io::Result<()> {
    let payload = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| *l <= MAX_RECORD_BYTES)
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "log record of {} bytes exceeds the limit of {MAX_RECORD_BYTES}",
                payload.len()
            ))
        })?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(())
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

impl LogFile {
    /// Opens (or creates) the log and replays it into `data`.
    fn open(path: &Path, data: &mut LogData) -> std::io::Result<(LogFile, OpenReport)> {
        let mut report = OpenReport::default();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let size = file.metadata()?.len();
        let mut good_end = 0u64;
        if size < MAGIC.len() as u64 {
            if size > 0 {
                report.reason = Some("file shorter than its header".into());
            }
        } else {
            let mut r = BufReader::new(&mut file);
            let mut magic = [0u8; 8];
            r.read_exact(&mut magic)?;
            if &magic != MAGIC {
                return Err(std::io::Error::other(format!(
                    "{} is not a metastore log (bad header)",
                    path.display()
                )));
            }
            good_end = MAGIC.len() as u64;
            loop {
                match read_record(&mut r, size - good_end) {
                    Ok(None) => break,
                    Ok(Some((rec, n))) => {
                        data.replay(rec);
                        report.records += 1;
                        good_end += n;
                    }
                    Err(reason) => {
                        report.reason = Some(reason);
                        break;
                    }
                }
            }
        }
        if good_end < size || size < MAGIC.len() as u64 {
            report.truncated_bytes = size - good_end.min(size);
            if let Some(reason) = &report.reason {
                tracing::warn!(
                    path = %path.display(),
                    offset = good_end,
                    dropped_bytes = report.truncated_bytes,
                    reason = %reason,
                    "metastore log ends in a torn or corrupt record; truncating it"
                );
            }
            if good_end == 0 {
                file.set_len(0)?;
                file.write_all(MAGIC)?;
                good_end = MAGIC.len() as u64;
            }
            file.set_len(good_end)?;
            file.sync_all()?;
        }
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(good_end))?;
        let dead = report.records.saturating_sub(data.entries.len() as u64);
        Ok((
            LogFile {
                path: path.to_owned(),
                file,
                dead,
                failed: false,
            },
            report,
        ))
    }

    fn write(&mut self, buf: &[u8], sync: bool) -> std::io::Result<()> {
        if self.failed {
            return Err(std::io::Error::other(
                "an earlier write to the metastore log failed",
            ));
        }
        let res = self
            .file
            .write_all(buf)
            .and_then(|()| if sync { self.file.sync_data() } else { Ok(()) });
        if res.is_err() {
            self.failed = true;
        }
        res
    }

    /// Replaces the file by one holding only the live state.
    fn rewrite(&mut self, data: &LogData) -> std::io::Result<()> {
        let tmp = self.path.with_extension("log.tmp");
        let mut buf = MAGIC.to_vec();
        if let Some(v) = &data.vote {
            encode(&LogRecord::Vote(*v), &mut buf)?;
        }
        if let Some(p) = data.last_purged {
            encode(&LogRecord::Purge(p), &mut buf)?;
        }
        for e in data.entries.values() {
            encode(&LogRecord::Entry(Box::new(e.clone())), &mut buf)?;
        }
        if data.committed.is_some() {
            encode(&LogRecord::Committed(data.committed), &mut buf)?;
        }
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&buf)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            sync_dir(dir)?;
        }
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.dead = 0;
        Ok(())
    }
}

/// Reads one record; `Ok(None)` at a clean end of file, `Err(reason)` when
/// the record is torn or corrupt.
fn read_record(r: &mut impl Read, remaining: u64) -> Result<Option<(LogRecord, u64)>, String> {
    if remaining == 0 {
        return Ok(None);
    }
    if remaining < 8 {
        return Err(format!("torn record header ({remaining} bytes)"));
    }
    let mut head = [0u8; 8];
    r.read_exact(&mut head)
        .map_err(|e| format!("reading record header: {e}"))?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len > MAX_RECORD_BYTES {
        return Err(format!(
            "record length {len} exceeds the limit of {MAX_RECORD_BYTES}"
        ));
    }
    if u64::from(len) > remaining - 8 {
        return Err(format!(
            "torn record: {len} bytes announced, {} present",
            remaining - 8
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)
        .map_err(|e| format!("reading record: {e}"))?;
    if crc32fast::hash(&payload) != crc {
        return Err("record checksum mismatch".into());
    }
    let rec = serde_json::from_slice(&payload).map_err(|e| format!("undecodable record: {e}"))?;
    Ok(Some((rec, 8 + u64::from(len))))
}

/// Openraft's log storage, backed by [`LogFile`].
#[derive(Clone)]
pub(crate) struct LogStore {
    data: Arc<RwLock<LogData>>,
    file: Arc<Mutex<LogFile>>,
}

/// Reads entries for replication; shares the in-memory view with the store.
#[derive(Clone)]
pub(crate) struct LogReader {
    data: Arc<RwLock<LogData>>,
}

fn io_err(e: std::io::Error) -> StorageError {
    StorageIOError::write_logs(&e).into()
}

impl LogStore {
    pub(crate) fn open(path: &Path) -> std::io::Result<(LogStore, OpenReport)> {
        let mut data = LogData::default();
        let (file, report) = LogFile::open(path, &mut data)?;
        Ok((
            LogStore {
                data: Arc::new(RwLock::new(data)),
                file: Arc::new(Mutex::new(file)),
            },
            report,
        ))
    }

    /// Writes records on a blocking thread (fsync when `sync`), then applies
    /// `then` to the in-memory view.
    async fn write(
        &self,
        recs: Vec<LogRecord>,
        sync: bool,
        dead: u64,
        then: impl FnOnce(&mut LogData) + Send + 'static,
    ) -> std::io::Result<()> {
        let file = self.file.clone();
        let data = self.data.clone();
        tokio::task::spawn_blocking(move || {
            let mut buf = Vec::new();
            for r in &recs {
                encode(r, &mut buf)?;
            }
            let mut f = file.lock();
            f.write(&buf, sync)?;
            f.dead += dead;
            let mut d = data.write();
            then(&mut d);
            if f.dead >= REWRITE_MIN_DEAD && f.dead > d.entries.len() as u64 {
                f.rewrite(&d)?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

impl LogStore {
    /// Appends and fsyncs entries; they are readable when this returns.
    async fn append_entries(&self, entries: Vec<Entry>) -> std::io::Result<()> {
        let recs: Vec<LogRecord> = entries
            .iter()
            .map(|e| LogRecord::Entry(Box::new(e.clone())))
            .collect();
        self.write(recs, true, 0, move |d| {
            for e in entries {
                d.replay(LogRecord::Entry(Box::new(e)));
            }
        })
        .await
    }
}

fn range_entries<RB: RangeBounds<u64>>(data: &LogData, range: RB) -> Vec<Entry> {
    let start = match range.start_bound() {
        Bound::Included(s) => Bound::Included(*s),
        Bound::Excluded(s) => Bound::Excluded(*s),
        Bound::Unbounded => Bound::Unbounded,
    };
    let end = match range.end_bound() {
        Bound::Included(s) => Bound::Included(*s),
        Bound::Excluded(s) => Bound::Excluded(*s),
        Bound::Unbounded => Bound::Unbounded,
    };
    // An empty or inverted range would make BTreeMap::range panic.
    let empty = match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e))
        | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
        _ => false,
    };
    if empty {
        return Vec::new();
    }
    data.entries
        .range((start, end))
        .map(|(_, e)| e.clone())
        .collect()
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(range_entries(&self.data.read(), range))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(range_entries(&self.data.read(), range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let d = self.data.read();
        Ok(LogState {
            last_purged_log_id: d.last_purged,
            last_log_id: d.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            data: self.data.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let v = *vote;
        self.write(vec![LogRecord::Vote(v)], true, 1, move |d| d.vote = Some(v))
            .await
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.data.read().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // A hint that lets a restarted node apply committed entries at once;
        // not fsynced on its own (the next append or vote syncs it).
        self.write(vec![LogRecord::Committed(committed)], false, 1, move |d| {
            d.committed = committed
        })
        .await
        .map_err(io_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.data.read().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        match self.append_entries(entries.into_iter().collect()).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                let err = io_err(std::io::Error::new(e.kind(), e.to_string()));
                callback.log_io_completed(Err(e));
                Err(err)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let since = log_id.index;
        let dead = self.data.read().entries.range(since..).count() as u64 + 1;
        self.write(vec![LogRecord::Truncate(since)], true, dead, move |d| {
            d.replay(LogRecord::Truncate(since))
        })
        .await
        .map_err(io_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let dead = self.data.read().entries.range(..=log_id.index).count() as u64 + 1;
        self.write(vec![LogRecord::Purge(log_id)], true, dead, move |d| {
            d.purge(log_id)
        })
        .await
        .map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn indexes(store: &LogStore) -> Vec<u64> {
        store.data.read().entries.keys().copied().collect()
    }

    async fn append(store: &mut LogStore, entries: Vec<Entry>) {
        store.append_entries(entries).await.unwrap();
    }

    #[tokio::test]
    async fn log_survives_reopen_with_truncate_and_purge() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.log");
        let (mut s, _) = LogStore::open(&path).unwrap();
        append(&mut s, (1..=5).map(|i| entry(1, i)).collect()).await;
        s.save_vote(&Vote::new(3, 2)).await.unwrap();
        s.truncate(LogId::new(CommittedLeaderId::new(1, 1), 4))
            .await
            .unwrap();
        append(&mut s, vec![entry(3, 4)]).await;
        s.purge(LogId::new(CommittedLeaderId::new(1, 1), 2))
            .await
            .unwrap();
        drop(s);
        let (mut s, report) = LogStore::open(&path).unwrap();
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(indexes(&s), [3, 4]);
        assert_eq!(s.data.read().entries[&4].log_id.leader_id.term, 3);
        assert_eq!(s.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
        let st = s.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id.map(|l| l.index), Some(2));
        assert_eq!(st.last_log_id.map(|l| l.index), Some(4));
        let got = s.try_get_log_entries(3..5).await.unwrap();
        assert_eq!(got.len(), 2);
        let (from, to) = (5, 3);
        assert!(s.try_get_log_entries(from..to).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn torn_and_corrupt_tails_are_truncated_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.log");
        let (mut s, _) = LogStore::open(&path).unwrap();
        append(&mut s, (1..=3).map(|i| entry(1, i)).collect()).await;
        drop(s);
        let full = std::fs::read(&path).unwrap();

        // Torn: the last record is cut in the middle.
        std::fs::write(&path, &full[..full.len() - 5]).unwrap();
        let (mut s, report) = LogStore::open(&path).unwrap();
        assert_eq!(indexes(&s), [1, 2]);
        assert!(report.truncated_bytes > 0);
        assert!(
            report.reason.as_deref().unwrap().contains("torn"),
            "{report:?}"
        );
        // Appending after the repair yields a clean log.
        append(&mut s, vec![entry(1, 3), entry(1, 4)]).await;
        drop(s);
        let (s, report) = LogStore::open(&path).unwrap();
        assert_eq!((indexes(&s), report.truncated_bytes), (vec![1, 2, 3, 4], 0));
        drop(s);

        // Corrupt: a flipped bit in the last record's payload.
        let mut bad = std::fs::read(&path).unwrap();
        let n = bad.len();
        bad[n - 3] ^= 0x40;
        std::fs::write(&path, &bad).unwrap();
        let (s, report) = LogStore::open(&path).unwrap();
        assert_eq!(indexes(&s), [1, 2, 3]);
        assert!(
            report.reason.as_deref().unwrap().contains("checksum"),
            "{report:?}"
        );
        drop(s);
        assert!(std::fs::metadata(&path).unwrap().len() < n as u64);

        // Garbage length: bounded, refused, truncated.
        let mut bad = std::fs::read(&path).unwrap();
        bad.extend_from_slice(&u32::MAX.to_le_bytes());
        bad.extend_from_slice(&[0; 12]);
        std::fs::write(&path, &bad).unwrap();
        let (s, report) = LogStore::open(&path).unwrap();
        assert_eq!(indexes(&s), [1, 2, 3]);
        assert!(
            report.reason.as_deref().unwrap().contains("limit"),
            "{report:?}"
        );
    }

    #[tokio::test]
    async fn file_is_rewritten_when_mostly_dead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.log");
        let (mut s, _) = LogStore::open(&path).unwrap();
        for i in 1..=(REWRITE_MIN_DEAD + 10) {
            append(&mut s, vec![entry(1, i)]).await;
        }
        let big = std::fs::metadata(&path).unwrap().len();
        s.purge(LogId::new(
            CommittedLeaderId::new(1, 1),
            REWRITE_MIN_DEAD + 5,
        ))
        .await
        .unwrap();
        let small = std::fs::metadata(&path).unwrap().len();
        assert!(small * 10 < big, "{small} vs {big}");
        append(&mut s, vec![entry(1, REWRITE_MIN_DEAD + 11)]).await;
        drop(s);
        let (s, report) = LogStore::open(&path).unwrap();
        assert_eq!(report.truncated_bytes, 0);
        let want: Vec<u64> = (REWRITE_MIN_DEAD + 6..=REWRITE_MIN_DEAD + 11).collect();
        assert_eq!(indexes(&s), want);
        assert_eq!(
            s.data.read().last_purged.map(|l| l.index),
            Some(REWRITE_MIN_DEAD + 5)
        );
    }
}
