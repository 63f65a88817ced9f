//! The write-ahead log: numbered segment files of length-prefixed,
//! checksummed records, appended and fsync'd by one writer thread that
//! commits every record waiting at the time as one group (one fsync).
//!
//! Record: `u32 LE payload length | u32 LE crc32(payload) | payload`.
//! Replay reads segments in order and stops at the first torn or corrupt
//! record of the last segment (a crash mid-append), truncating it away.
//!
//! Zeros are written ahead of the records, by a second thread (the
//! filler), so that a commit overwrites bytes the file already has: its
//! `fdatasync` then writes the data alone, not the inode as well (as it
//! must when a write grows the file). A record is never empty, so a
//! header of eight zero bytes is where the records of a segment end; the
//! zeros after the last record are cut off when the writer leaves the
//! segment (and by replay, from a segment a crash left).

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, mpsc};

use tokio::sync::oneshot;

/// The largest record replay accepts; larger lengths mean corruption.
pub(crate) const MAX_RECORD: usize = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("wal {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("wal writer stopped")]
    Closed,
    #[error("an empty wal record")]
    Empty,
    #[error("wal segment {path} is corrupt at byte {offset}: {what}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_owned(),
        source,
    }
}

enum Cmd {
    Append(bytes::Bytes, oneshot::Sender<Result<(), WalError>>),
    /// Starts a new segment; answers the new segment's number.
    Rotate(oneshot::Sender<Result<u64, WalError>>),
    /// Commits what is waiting, leaves the segment and stops the writer;
    /// answered once the segment holds its records alone.
    Close(oneshot::Sender<()>),
}

/// A handle to the WAL writer thread.
pub(crate) struct Wal {
    dir: PathBuf,
    tx: mpsc::Sender<Cmd>,
    progress: Arc<Progress>,
    append_seconds: fathom_api::metrics::Seconds,
}

fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n:016}.wal"))
}

/// Segment numbers present in `dir`, ascending.
fn segments(dir: &Path) -> Result<Vec<u64>, WalError> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        let name = e.file_name();
        let Some(s) = name.to_str() else { continue };
        if let Some(n) = s.strip_suffix(".wal").and_then(|n| n.parse().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Counters the writer thread reports.
#[derive(Clone, Default)]
pub(crate) struct WalMetrics {
    pub(crate) bytes: prometheus_client::metrics::counter::Counter,
    pub(crate) records: prometheus_client::metrics::counter::Counter,
    pub(crate) fsyncs: prometheus_client::metrics::counter::Counter,
    /// Commits that wrote past the zeros written ahead (the filler fell
    /// behind, or a commit was larger than the zeros left).
    pub(crate) commits_past_fill: prometheus_client::metrics::counter::Counter,
    /// A group commit's write and `fdatasync`.
    pub(crate) commit_seconds: fathom_api::metrics::Seconds,
    /// An append, until its record is on disk.
    pub(crate) append_seconds: fathom_api::metrics::Seconds,
}

impl Wal {
    /// Reads every record of every segment in `dir` (creating it if
    /// needed), calls `apply` on each in order, then starts a writer on a
    /// new segment. Returns the WAL and the number of replayed records.
    pub(crate) fn open(
        dir: &Path,
        metrics: WalMetrics,
        mut apply: impl FnMut(&[u8]),
    ) -> Result<(Wal, usize), WalError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let segs = segments(dir)?;
        let mut replayed = 0;
        for (i, &n) in segs.iter().enumerate() {
            let path = segment_path(dir, n);
            let last = i + 1 == segs.len();
            replayed += replay_segment(&path, last, &mut apply)?;
        }
        let next = segs.last().map(|n| n + 1).unwrap_or(1);
        let progress = Arc::new(Mutex::new((next, 0)));
        let seg = Segment::new(
            dir.to_owned(),
            next,
            create_segment(dir, next)?,
            progress.clone(),
        );
        let append_seconds = metrics.append_seconds.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("fathom-wal".into())
            .spawn(move || writer(seg, rx, metrics))
            .map_err(io(dir))?;
        Ok((
            Wal {
                dir: dir.to_owned(),
                tx,
                progress,
                append_seconds,
            },
            replayed,
        ))
    }

    /// Appends a record, its bytes as given, and waits until it is on disk.
    /// A record is never empty (a zero header ends a segment's records).
    pub(crate) async fn append(&self, record: bytes::Bytes) -> Result<(), WalError> {
        if record.is_empty() {
            return Err(WalError::Empty);
        }
        let start = std::time::Instant::now();
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Append(record, tx))
            .map_err(|_| WalError::Closed)?;
        let r = rx.await.map_err(|_| WalError::Closed)?;
        self.append_seconds.since(start);
        r
    }

    /// Closes the current segment and starts a new one; every record
    /// appended before this call is in a segment numbered below the answer.
    pub(crate) async fn rotate(&self) -> Result<u64, WalError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Rotate(tx))
            .map_err(|_| WalError::Closed)?;
        rx.await.map_err(|_| WalError::Closed)?
    }

    /// Deletes every segment numbered below `n`.
    pub(crate) fn remove_before(&self, n: u64) -> Result<usize, WalError> {
        let mut removed = 0;
        for s in segments(&self.dir)? {
            if s < n {
                let p = segment_path(&self.dir, s);
                fs::remove_file(&p).map_err(io(&p))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Commits what is waiting and stops the writer once it has left its
    /// segment (the zeros after the records cut off); appends after this
    /// fail with [`WalError::Closed`].
    pub(crate) async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Cmd::Close(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Bytes of records in all segments on disk (not the zeros written
    /// ahead of them).
    pub(crate) fn disk_bytes(&self) -> u64 {
        let (current, written) = *self.progress.lock().unwrap_or_else(|e| e.into_inner());
        segments(&self.dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|&n| {
                if n == current {
                    Some(written)
                } else {
                    fs::metadata(segment_path(&self.dir, n))
                        .ok()
                        .map(|m| m.len())
                }
            })
            .sum()
    }
}

fn create_segment(dir: &Path, n: u64) -> Result<File, WalError> {
    let p = segment_path(dir, n);
    // Not in append mode: the writer writes at its own offset, over the
    // zeros the filler wrote ahead.
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(io(&p))?;
    // Make the new file's directory entry durable too.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(f)
}

/// Whether every byte `r` has left is zero (the fill after the records).
fn only_zeros_left(r: &mut impl Read) -> std::io::Result<bool> {
    let mut chunk = [0u8; 8192];
    loop {
        let n = r.read(&mut chunk)?;
        if n == 0 {
            return Ok(true);
        }
        if chunk[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

/// Cuts the segment at `path` to its first `len` bytes, durably.
fn truncate_at(path: &Path, len: u64) -> Result<(), WalError> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    f.set_len(len).map_err(io(path))?;
    f.sync_all().map_err(io(path))
}

fn replay_segment(
    path: &Path,
    last: bool,
    apply: &mut impl FnMut(&[u8]),
) -> Result<usize, WalError> {
    let f = File::open(path).map_err(io(path))?;
    let len = f.metadata().map_err(io(path))?.len();
    let mut r = BufReader::new(f);
    let mut offset = 0u64;
    let mut n = 0;
    let mut header = [0u8; 8];
    let mut payload = Vec::new();
    loop {
        if offset == len {
            return Ok(n);
        }
        let bad = |what: &str| WalError::Corrupt {
            path: path.to_owned(),
            offset,
            what: what.to_owned(),
        };
        let torn = if r.read_exact(&mut header).is_err() {
            Some(bad("torn record header"))
        } else if header == [0; 8] {
            // The zero fill: the records end here. In the last segment
            // whatever follows was never acknowledged (each commit is
            // synced before the next starts, and this one did not reach
            // the disk whole); in an older one it must be fill too.
            if last {
                truncate_at(path, offset)?;
                return Ok(n);
            }
            return match only_zeros_left(&mut r) {
                Ok(true) => Ok(n),
                Ok(false) => Err(bad("records after the zero fill")),
                Err(e) => Err(io(path)(e)),
            };
        } else {
            let size = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            if size > MAX_RECORD || offset + 8 + size as u64 > len {
                Some(bad("record runs past the end of the segment"))
            } else {
                payload.resize(size, 0);
                if r.read_exact(&mut payload).is_err() {
                    Some(bad("torn record"))
                } else if crc32fast::hash(&payload) != crc {
                    Some(bad("checksum mismatch"))
                } else {
                    None
                }
            }
        };
        match torn {
            None => {
                apply(&payload);
                n += 1;
                offset += 8 + payload.len() as u64;
            }
            Some(e) if last => {
                // A crash mid-append: the unacknowledged tail is dropped.
                tracing::warn!(error = %e, "truncating torn wal tail");
                truncate_at(path, offset)?;
                return Ok(n);
            }
            Some(e) => return Err(e),
        }
    }
}

/// Bytes of zeros the filler writes and syncs at a time. Small: a
/// commit's `fdatasync` waits for whatever of the file is being written
/// back, the filler's zeros included. In a test on a virtio disk, 4 MiB
/// at a time made about one commit in a hundred take 1.6–13 ms, and
/// 256 KiB none (docs/benchmarks.md, issue 13's twenty-eighth session).
const FILL_CHUNK: u64 = 256 << 10;
/// The writer asks for more zeros when fewer than this many are left
/// ahead of its records; the filler then writes them, a chunk at a time,
/// until twice this many are.
const FILL_AHEAD: u64 = 2 << 20;

/// The zeros of one segment: how far they reach, shared by the writer
/// and the filler.
#[derive(Default)]
struct Fill {
    state: Mutex<FillState>,
    changed: Condvar,
}

#[derive(Default)]
struct FillState {
    /// Bytes from the segment's start that are on the disk (records, then
    /// zeros): a commit that ends at or below this writes no metadata.
    end: u64,
    /// The filler is writing zeros from `end`.
    busy: bool,
    /// The writer is leaving the segment: the filler stops after the
    /// chunk it is writing.
    closing: bool,
    /// A fill failed: the writer appends to this segment without zeros
    /// ahead (as it did before the fill existed).
    failed: bool,
}

impl Fill {
    fn state(&self) -> std::sync::MutexGuard<'_, FillState> {
        // The lock guards plain numbers; a panic elsewhere leaves them whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called before the writer writes up to `end`: past the zeros, it
    /// waits until a fill under way (which writes there) reaches `end` or
    /// stops, and then owns the bytes up to `end`. Returns whether the
    /// write stays within zeros.
    fn reserve(&self, end: u64) -> bool {
        let mut s = self.state();
        while s.busy && end > s.end {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        let within = end <= s.end;
        // Past the zeros only with no fill under way: the filler writes
        // from `end` on, never below it.
        s.end = s.end.max(end);
        within
    }

    /// Stops a fill under way after its current chunk and waits for it
    /// (before the segment is closed).
    fn idle(&self) {
        let mut s = self.state();
        s.closing = true;
        while s.busy {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A fill the writer asks for: zeros from `fill.end` of `file` to
/// `until`.
struct FillJob {
    path: PathBuf,
    file: Arc<File>,
    fill: Arc<Fill>,
    until: u64,
}

/// The filler thread: writes each job's zeros a chunk at a time and syncs
/// each (allocating the blocks and growing the file, the metadata a
/// commit then need not write), publishing the new end after each.
fn filler(jobs: mpsc::Receiver<FillJob>) {
    let zeros = vec![0u8; FILL_CHUNK as usize];
    while let Ok(job) = jobs.recv() {
        loop {
            let from = {
                let s = job.fill.state();
                if s.closing || s.end >= job.until {
                    break;
                }
                s.end
            };
            let r = job
                .file
                .write_all_at(&zeros, from)
                .and_then(|()| job.file.sync_data());
            let mut s = job.fill.state();
            match r {
                Ok(()) => s.end = from + FILL_CHUNK,
                Err(e) => {
                    tracing::warn!(
                        path = %job.path.display(),
                        error = %e,
                        "could not write zeros ahead of the wal; appending without them"
                    );
                    s.failed = true;
                    break;
                }
            }
            job.fill.changed.notify_all();
        }
        job.fill.state().busy = false;
        job.fill.changed.notify_all();
    }
}

/// The segment the writer appends to.
struct Segment {
    dir: PathBuf,
    n: u64,
    file: Arc<File>,
    /// Bytes of records written to it.
    written: u64,
    /// Where the last [`drop_from_page_cache`] of it stopped.
    dropped: u64,
    fill: Arc<Fill>,
    /// Where [`Wal::disk_bytes`] reads `n` and `written`.
    progress: Arc<Progress>,
}

impl Segment {
    fn new(dir: PathBuf, n: u64, file: File, progress: Arc<Progress>) -> Segment {
        let seg = Segment {
            dir,
            n,
            file: Arc::new(file),
            written: 0,
            dropped: 0,
            fill: Arc::default(),
            progress,
        };
        seg.publish();
        seg
    }

    /// Shows the records written so far to [`Wal::disk_bytes`].
    fn publish(&self) {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = (self.n, self.written);
    }

    /// Asks the filler for more zeros when few are left ahead.
    fn fill_ahead(&self, filler: &mpsc::Sender<FillJob>) {
        let mut s = self.fill.state();
        if s.busy || s.failed || s.end.saturating_sub(self.written) >= FILL_AHEAD {
            return;
        }
        s.busy = true;
        let job = FillJob {
            path: segment_path(&self.dir, self.n),
            file: self.file.clone(),
            fill: self.fill.clone(),
            until: self.written.saturating_add(2 * FILL_AHEAD),
        };
        if filler.send(job).is_err() {
            s.busy = false;
            s.failed = true;
        }
    }

    /// Leaves the segment: cuts the zeros after its records off (replay
    /// would stop at them anyway; this gives their disk space back).
    fn close(&self) {
        self.fill.idle();
        if let Err(e) = self.file.set_len(self.written) {
            tracing::debug!(error = %e, "could not cut the zero fill off a wal segment");
        }
    }
}

/// What the writer has written, for [`Wal::disk_bytes`]: the current
/// segment's number and its bytes of records.
type Progress = Mutex<(u64, u64)>;

fn writer(seg: Segment, rx: mpsc::Receiver<Cmd>, m: WalMetrics) {
    let (fill_tx, fill_rx) = mpsc::channel();
    let filler = std::thread::Builder::new()
        .name("fathom-wal-fill".into())
        .spawn(move || filler(fill_rx));
    let fill_tx = match filler {
        Ok(_) => Some(fill_tx),
        Err(e) => {
            tracing::warn!(error = %e, "could not start the wal's filler; appending without zeros ahead");
            None
        }
    };
    let fill_ahead = |seg: &Segment| {
        if let Some(tx) = &fill_tx {
            seg.fill_ahead(tx);
        }
    };
    let mut pending: Vec<oneshot::Sender<Result<(), WalError>>> = Vec::new();
    let mut buf = Vec::new();
    let mut seg = seg;
    let mut closed = None;
    fill_ahead(&seg);
    while let Ok(first) = rx.recv() {
        let mut cmds = vec![first];
        while let Ok(c) = rx.try_recv() {
            cmds.push(c);
            if cmds.len() >= 1024 {
                break;
            }
        }
        for cmd in cmds {
            if closed.is_some() {
                // Sent after the close in the same batch: dropped, so its
                // caller hears `Closed`, as it would once the writer stops.
                continue;
            }
            match cmd {
                Cmd::Append(rec, done) => {
                    buf.extend_from_slice(&(rec.len() as u32).to_le_bytes());
                    buf.extend_from_slice(&crc32fast::hash(&rec).to_le_bytes());
                    buf.extend_from_slice(&rec);
                    m.records.inc();
                    pending.push(done);
                }
                Cmd::Rotate(done) => {
                    let r = commit(&mut seg, &mut buf, &mut pending, &m).and_then(|()| {
                        let n = seg.n + 1;
                        let file = create_segment(&seg.dir, n)?;
                        seg.close();
                        seg = Segment::new(seg.dir.clone(), n, file, seg.progress.clone());
                        fill_ahead(&seg);
                        Ok(n)
                    });
                    let _ = done.send(r);
                }
                Cmd::Close(done) => closed = Some(done),
            }
        }
        let _ = commit(&mut seg, &mut buf, &mut pending, &m);
        if closed.is_some() {
            break;
        }
        fill_ahead(&seg);
    }
    seg.close();
    if let Some(done) = closed {
        let _ = done.send(());
    }
}

/// The bytes a segment's writer commits between two
/// [`drop_from_page_cache`] calls.
const DROP_EVERY: u64 = 1 << 20;

/// Asks the kernel to drop the first `written` bytes of `file`, all
/// written and synced, from the page cache. Nothing reads them again
/// except a replay after a restart, and kept they only grow the cache:
/// every append then copies into newly allocated pages (a fifth of a
/// cluster ingester's CPU in `docs/benchmarks.md`) and pushes out pages
/// that queries read. The advice covers the segment from its start, not
/// just the bytes of this commit: the cache holds large folios, and a
/// folio is only dropped when the range covers all of it, which a
/// commit's unaligned range rarely does (ranges already dropped cost
/// nothing to walk). It stops at the last 4 KiB boundary at or below
/// `written`: the kernel then keeps the partly written last page, which
/// the next append writes into (a range that ends at the end of the file
/// drops that page too, and the append must read it back from the disk
/// before it can copy into it: a synchronous read in every commit,
/// docs/benchmarks.md, sixteenth session), and the zeros ahead, which
/// later appends overwrite. A boundary of 4 KiB serves larger pages too:
/// the kernel keeps any page the range covers only in part. Dropping
/// clean pages loses nothing; it is advice, so a refusal is only logged.
fn drop_from_page_cache(file: &File, written: u64) {
    let Some(len) = std::num::NonZeroU64::new(written & !4095) else {
        return;
    };
    if let Err(e) = rustix::fs::fadvise(file, 0, Some(len), rustix::fs::Advice::DontNeed) {
        tracing::debug!(error = %e, "could not drop written wal pages from the page cache");
    }
}

/// Writes and fsyncs `buf` to `seg` after its records, then answers every
/// pending append.
fn commit(
    seg: &mut Segment,
    buf: &mut Vec<u8>,
    pending: &mut Vec<oneshot::Sender<Result<(), WalError>>>,
    m: &WalMetrics,
) -> Result<(), WalError> {
    if pending.is_empty() {
        return Ok(());
    }
    let path = segment_path(&seg.dir, seg.n);
    let end = seg.written + buf.len() as u64;
    if !seg.fill.reserve(end) {
        m.commits_past_fill.inc();
    }
    let start = std::time::Instant::now();
    let r = seg
        .file
        .write_all_at(buf, seg.written)
        .and_then(|()| seg.file.sync_data())
        .map_err(|source| WalError::Io {
            path: path.clone(),
            source,
        });
    m.commit_seconds.since(start);
    m.bytes.inc_by(buf.len() as u64);
    m.fsyncs.inc();
    if r.is_ok() {
        seg.written = end;
        seg.publish();
    }
    buf.clear();
    for done in pending.drain(..) {
        let _ = done.send(match &r {
            Ok(()) => Ok(()),
            Err(e) => Err(WalError::Io {
                path: path.clone(),
                source: std::io::Error::other(e.to_string()),
            }),
        });
    }
    // After the answers: the advice is not part of the acknowledgement.
    // Once a MiB, not every commit: the call took a tenth of a
    // millisecond a commit on average, and milliseconds in the slowest,
    // while the next commit's records waited (docs/benchmarks.md, issue
    // 13's twenty-eighth session); the cache keeps that much more.
    if r.is_ok() && seg.written - seg.dropped >= DROP_EVERY {
        drop_from_page_cache(&seg.file, seg.written);
        seg.dropped = seg.written;
    }
    r
}

/// Every record of every segment in `dir`, in order, without replaying or
/// truncating anything (tests look at what was stored).
#[cfg(test)]
pub(crate) fn read_records(dir: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for n in segments(dir).unwrap() {
        replay_segment(&segment_path(dir, n), false, &mut |r: &[u8]| {
            out.push(r.to_vec())
        })
        .unwrap();
    }
    out
}

/// Writes segment `n` of `dir` holding `records`, framed as the writer
/// frames them (tests build WALs of earlier formats).
#[cfg(test)]
pub(crate) fn write_segment(dir: &Path, n: u64, records: &[&[u8]]) {
    let mut buf = Vec::new();
    for r in records {
        buf.extend_from_slice(&(r.len() as u32).to_le_bytes());
        buf.extend_from_slice(&crc32fast::hash(r).to_le_bytes());
        buf.extend_from_slice(r);
    }
    fs::create_dir_all(dir).unwrap();
    fs::write(segment_path(dir, n), buf).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replays_in_order_and_truncates_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, n) = Wal::open(dir.path(), WalMetrics::default(), |_| {}).unwrap();
        assert_eq!(n, 0);
        wal.append(bytes::Bytes::from_static(b"one")).await.unwrap();
        let seg = wal.rotate().await.unwrap();
        wal.append(bytes::Bytes::from_static(b"two")).await.unwrap();
        wal.append(bytes::Bytes::from_static(b"three"))
            .await
            .unwrap();
        wal.close().await;
        // A torn record at the end of the newest segment.
        let p = segment_path(dir.path(), seg);
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        let records = f.metadata().unwrap().len();
        assert_eq!(
            records,
            8 + 3 + 8 + 5,
            "the zeros after the records are cut off"
        );
        f.write_all_at(&[9, 0, 0, 0, 1, 2], records).unwrap();
        drop(f);

        let mut got = Vec::new();
        let (wal, n) =
            Wal::open(dir.path(), WalMetrics::default(), |r| got.push(r.to_vec())).unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            got,
            vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]
        );
        // Dropping old segments keeps only what is newer.
        let cut = wal.rotate().await.unwrap();
        wal.remove_before(cut).unwrap();
        wal.close().await;
        let (_wal, n) = Wal::open(dir.path(), WalMetrics::default(), |_| {}).unwrap();
        assert_eq!(n, 0);
    }

    /// Bytes of `path` in the page cache, by util-linux's `fincore`.
    fn resident_bytes(path: &Path) -> u64 {
        let out = std::process::Command::new("fincore")
            .args(["--bytes", "--noheadings", "--raw", "--output", "RES"])
            .arg(path)
            .output()
            .expect("this test needs util-linux's fincore on the PATH");
        assert!(out.status.success(), "fincore: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("fincore printed {out:?}: {e}"))
    }

    #[tokio::test]
    async fn appended_records_leave_the_page_cache_and_replay_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), WalMetrics::default(), |_| {}).unwrap();
        let records: Vec<bytes::Bytes> = (0..64u8)
            .map(|i| bytes::Bytes::from(vec![i; 64 << 10]))
            .collect();
        for r in &records {
            wal.append(r.clone()).await.unwrap();
        }
        let seg = *segments(dir.path()).unwrap().last().unwrap();
        let path = segment_path(dir.path(), seg);
        // Closed, the segment is its records alone (the zeros ahead,
        // cached for the appends to come, are cut off).
        wal.close().await;
        let written = fs::metadata(&path).unwrap().len();
        assert!(written > 4 << 20, "{written} bytes written");
        // Synced pages are dropped as they are written, a MiB at a time:
        // at most the last MiB and a partial page remain.
        let resident = resident_bytes(&path);
        assert!(
            resident <= DROP_EVERY + 4096,
            "{resident} of {written} bytes of the segment still in the page cache"
        );
        let mut got = Vec::new();
        let (_wal, n) =
            Wal::open(dir.path(), WalMetrics::default(), |r| got.push(r.to_vec())).unwrap();
        assert_eq!(n, records.len());
        assert!(got.iter().zip(&records).all(|(g, r)| g[..] == r[..]));
    }

    /// The page that holds the end of the last commit stays cached (the
    /// next append writes into it; dropped, it would be read back from
    /// the disk first), while the pages before it are dropped.
    #[tokio::test]
    async fn the_last_partly_written_page_stays_in_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), WalMetrics::default(), |_| {}).unwrap();
        // 8 + 70,001 bytes a record, one a commit: every commit ends
        // mid-page. The writer drops the cache once `DROP_EVERY` more
        // bytes are synced; four times that many records end with a
        // commit that drops it, so only the last page should remain.
        // (With the zeros ahead in the same folio the kernel may keep
        // that page anyway: the advice's own bound on it is checked by
        // `the_advice_keeps_the_partly_written_last_page`.)
        let record = 8 + 70_001u64;
        let per_drop = DROP_EVERY.div_ceil(record);
        for i in 0..4 * per_drop {
            wal.append(bytes::Bytes::from(vec![i as u8; 70_001]))
                .await
                .unwrap();
        }
        let seg = *segments(dir.path()).unwrap().last().unwrap();
        let path = segment_path(dir.path(), seg);
        wal.close().await;
        let written = fs::metadata(&path).unwrap().len();
        assert_ne!(written % 4096, 0, "the segment ends mid-page");
        let resident = resident_bytes(&path);
        assert!(
            resident > 0,
            "the page the next append writes into was dropped ({written} bytes written)"
        );
        assert!(
            resident < DROP_EVERY / 4,
            "{resident} of {written} bytes of the segment still in the page cache"
        );
    }

    /// The advice drops every synced page but the one a write ended in
    /// (the next append writes into it).
    #[test]
    fn the_advice_keeps_the_partly_written_last_page() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        let len: u64 = (3 << 20) + 100;
        for chunk in 0..len.div_ceil(70_001) {
            let n = (len - chunk * 70_001).min(70_001);
            file.write_all_at(&vec![7u8; n as usize], chunk * 70_001)
                .unwrap();
        }
        file.sync_data().unwrap();
        assert!(resident_bytes(&path) >= len, "the written file is cached");
        drop_from_page_cache(&file, len);
        let resident = resident_bytes(&path);
        assert!(resident > 0, "the partly written last page was dropped");
        assert!(
            resident < 1 << 20,
            "{resident} of {len} bytes still cached after the advice"
        );
    }

    #[tokio::test]
    async fn corrupt_record_in_older_segment_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), WalMetrics::default(), |_| {}).unwrap();
        wal.append(bytes::Bytes::from_static(b"hello"))
            .await
            .unwrap();
        let first = wal.rotate().await.unwrap() - 1;
        wal.append(bytes::Bytes::from_static(b"x")).await.unwrap();
        wal.close().await;
        let p = segment_path(dir.path(), first);
        let mut bytes = fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&p, bytes).unwrap();
        let err = Wal::open(dir.path(), WalMetrics::default(), |_| {})
            .err()
            .unwrap();
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    /// Waits (up to 10 s) until the filler has written zeros ahead of
    /// the current segment's records.
    fn wait_for_zeros_ahead(dir: &Path, wal: &Wal) -> (PathBuf, u64) {
        let seg = *segments(dir).unwrap().last().unwrap();
        let path = segment_path(dir, seg);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let len = fs::metadata(&path).unwrap().len();
            if len >= wal.disk_bytes() + FILL_AHEAD {
                return (path, len);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no zeros written ahead of the records: the segment is {len} bytes"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Commits overwrite zeros written ahead (so that their fsync need
    /// not write the file's metadata); the zeros never reach a replay,
    /// and leaving a segment cuts them off.
    #[tokio::test]
    async fn commits_overwrite_zeros_written_ahead_which_replay_skips() {
        let dir = tempfile::tempdir().unwrap();
        let m = WalMetrics::default();
        let (wal, _) = Wal::open(dir.path(), m.clone(), |_| {}).unwrap();
        wal.append(bytes::Bytes::from_static(b"first"))
            .await
            .unwrap();
        let (path, len) = wait_for_zeros_ahead(dir.path(), &wal);
        let past = m.commits_past_fill.get();
        let records: Vec<bytes::Bytes> = (1..=20u8)
            .map(|i| bytes::Bytes::from(vec![i; 1000 * i as usize]))
            .collect();
        for r in &records {
            wal.append(r.clone()).await.unwrap();
        }
        let written = 8 + 5 + records.iter().map(|r| 8 + r.len() as u64).sum::<u64>();
        assert_eq!(
            wal.disk_bytes(),
            written,
            "the size counts records, not zeros"
        );
        assert_eq!(
            m.commits_past_fill.get(),
            past,
            "commits within the zeros wrote past them"
        );
        let on_disk = fs::read(&path).unwrap();
        assert!(on_disk.len() as u64 >= len.max(written + 1));
        assert!(
            on_disk[written as usize..].iter().all(|&b| b == 0),
            "only zeros after the records"
        );
        // Rotating cuts the zeros off the segment left.
        let next = wal.rotate().await.unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), written);
        wal.append(bytes::Bytes::from_static(b"last"))
            .await
            .unwrap();
        let (newest, _) = wait_for_zeros_ahead(dir.path(), &wal);
        assert_eq!(newest, segment_path(dir.path(), next));
        // As a crash leaves it: the newest segment still holds its zeros.
        let copy = tempfile::tempdir().unwrap();
        for p in [&path, &newest] {
            fs::copy(p, copy.path().join(p.file_name().unwrap())).unwrap();
        }
        wal.close().await;
        assert_eq!(
            fs::metadata(&newest).unwrap().len(),
            8 + 4,
            "closed, the zeros are cut off"
        );
        let after = wal.append(bytes::Bytes::from_static(b"late")).await;
        assert!(matches!(after, Err(WalError::Closed)), "{after:?}");
        let mut got = Vec::new();
        let (_wal, n) =
            Wal::open(copy.path(), WalMetrics::default(), |r| got.push(r.to_vec())).unwrap();
        assert_eq!(n, 22);
        assert_eq!(got[0], b"first");
        assert!(got[1..21].iter().zip(&records).all(|(g, r)| g[..] == r[..]));
        assert_eq!(got[21], b"last");
        // Replay cut the zeros off the newest segment.
        assert_eq!(
            fs::metadata(copy.path().join(newest.file_name().unwrap()))
                .unwrap()
                .len(),
            8 + 4
        );
    }

    /// Zeros end an older segment's records only when nothing but zeros
    /// follows; bytes after them are corruption, not a fill.
    #[tokio::test]
    async fn bytes_after_the_zeros_of_an_older_segment_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, &[b"one", b"two"]);
        write_segment(dir.path(), 2, &[b"three"]);
        let p = segment_path(dir.path(), 1);
        let mut bytes = fs::read(&p).unwrap();
        bytes.resize(bytes.len() + 100_000, 0);
        fs::write(&p, &bytes).unwrap();
        let mut got = Vec::new();
        let (wal, _) =
            Wal::open(dir.path(), WalMetrics::default(), |r| got.push(r.to_vec())).unwrap();
        wal.close().await;
        assert_eq!(
            got,
            vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]
        );

        let last = bytes.len() - 1;
        bytes[last] = 1;
        fs::write(&p, &bytes).unwrap();
        let err = Wal::open(dir.path(), WalMetrics::default(), |_| {})
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("records after the zero fill"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn an_empty_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(dir.path(), WalMetrics::default(), |_| {}).unwrap();
        let err = wal.append(bytes::Bytes::new()).await.unwrap_err();
        assert!(matches!(err, WalError::Empty), "{err}");
        assert_eq!(wal.disk_bytes(), 0);
    }

    /// An append or rotate queued right behind a close (in the writer's
    /// same batch, or after it stopped) is refused and writes nothing.
    /// Queued while the writer commits an earlier append, they mostly
    /// land in one batch; rounds make a miss of that case unlikely.
    #[tokio::test]
    async fn commands_behind_a_close_are_refused() {
        for round in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let (wal, _) = Wal::open(dir.path(), WalMetrics::default(), |_| {}).unwrap();
            let (kept_tx, kept_rx) = oneshot::channel();
            let (close_tx, close_rx) = oneshot::channel();
            let (append_tx, append_rx) = oneshot::channel();
            let (rotate_tx, rotate_rx) = oneshot::channel();
            let late = bytes::Bytes::from_static(b"late");
            wal.tx
                .send(Cmd::Append(bytes::Bytes::from_static(b"kept"), kept_tx))
                .unwrap();
            wal.tx.send(Cmd::Close(close_tx)).unwrap();
            // The writer may already have stopped (a send then fails).
            let _ = wal.tx.send(Cmd::Append(late, append_tx));
            let _ = wal.tx.send(Cmd::Rotate(rotate_tx));
            kept_rx.await.unwrap().unwrap();
            close_rx.await.unwrap();
            assert!(
                append_rx.await.is_err(),
                "round {round}: late append answered"
            );
            assert!(
                rotate_rx.await.is_err(),
                "round {round}: late rotate answered"
            );
            assert_eq!(segments(dir.path()).unwrap().len(), 1, "round {round}");
            let mut got = Vec::new();
            Wal::open(dir.path(), WalMetrics::default(), |r| got.push(r.to_vec())).unwrap();
            assert_eq!(got, vec![b"kept".to_vec()], "round {round}");
        }
    }
}
