//! The write-ahead log: numbered segment files of length-prefixed,
//! checksummed records, appended and fsync'd by one writer thread that
//! commits every record waiting at the time as one group (one fsync).
//!
//! Record: `u32 LE payload length | u32 LE crc32(payload) | payload`.
//! Replay reads segments in order and stops at the first torn or corrupt
//! record of the last segment (a crash mid-append), truncating it away.

use std::fs::{self, File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

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
}

/// A handle to the WAL writer thread.
pub(crate) struct Wal {
    dir: PathBuf,
    tx: mpsc::Sender<Cmd>,
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
        let file = create_segment(dir, next)?;
        let (tx, rx) = mpsc::channel();
        let d = dir.to_owned();
        std::thread::Builder::new()
            .name("fathom-wal".into())
            .spawn(move || writer(d, next, file, rx, metrics))
            .map_err(io(dir))?;
        Ok((
            Wal {
                dir: dir.to_owned(),
                tx,
            },
            replayed,
        ))
    }

    /// Appends a record, its bytes as given, and waits until it is on disk.
    pub(crate) async fn append(&self, record: bytes::Bytes) -> Result<(), WalError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Append(record, tx))
            .map_err(|_| WalError::Closed)?;
        rx.await.map_err(|_| WalError::Closed)?
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

    /// Bytes of all segments on disk.
    pub(crate) fn disk_bytes(&self) -> u64 {
        segments(&self.dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|n| fs::metadata(segment_path(&self.dir, *n)).ok())
            .map(|m| m.len())
            .sum()
    }
}

fn create_segment(dir: &Path, n: u64) -> Result<File, WalError> {
    let p = segment_path(dir, n);
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&p)
        .map_err(io(&p))?;
    // Make the new file's directory entry durable too.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(f)
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
                let f = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(io(path))?;
                f.set_len(offset).map_err(io(path))?;
                f.sync_all().map_err(io(path))?;
                return Ok(n);
            }
            Some(e) => return Err(e),
        }
    }
}

/// The segment the writer appends to.
struct Segment {
    dir: PathBuf,
    n: u64,
    file: File,
    /// Bytes written to it.
    written: u64,
}

fn writer(dir: PathBuf, n: u64, file: File, rx: mpsc::Receiver<Cmd>, m: WalMetrics) {
    let mut pending: Vec<oneshot::Sender<Result<(), WalError>>> = Vec::new();
    let mut buf = Vec::new();
    let mut seg = Segment {
        dir,
        n,
        file,
        written: 0,
    };
    while let Ok(first) = rx.recv() {
        let mut cmds = vec![first];
        while let Ok(c) = rx.try_recv() {
            cmds.push(c);
            if cmds.len() >= 1024 {
                break;
            }
        }
        for cmd in cmds {
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
                        seg.file = create_segment(&seg.dir, n)?;
                        seg.n = n;
                        seg.written = 0;
                        Ok(n)
                    });
                    let _ = done.send(r);
                }
            }
        }
        let _ = commit(&mut seg, &mut buf, &mut pending, &m);
    }
}

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
/// docs/benchmarks.md, sixteenth session). A boundary of 4 KiB serves
/// larger pages too: the kernel keeps any page the range covers only in
/// part. Dropping clean pages loses nothing; it is advice, so a refusal
/// is only logged.
fn drop_from_page_cache(file: &File, written: u64) {
    let Some(len) = std::num::NonZeroU64::new(written & !4095) else {
        return;
    };
    if let Err(e) = rustix::fs::fadvise(file, 0, Some(len), rustix::fs::Advice::DontNeed) {
        tracing::debug!(error = %e, "could not drop written wal pages from the page cache");
    }
}

/// Writes and fsyncs `buf` to `seg`, then answers every pending append.
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
    let r = seg
        .file
        .write_all(buf)
        .and_then(|()| seg.file.sync_data())
        .map_err(|source| WalError::Io {
            path: path.clone(),
            source,
        });
    m.bytes.inc_by(buf.len() as u64);
    m.fsyncs.inc();
    if r.is_ok() {
        seg.written += buf.len() as u64;
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
    if r.is_ok() {
        drop_from_page_cache(&seg.file, seg.written);
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
        drop(wal);
        // A torn record at the end of the newest segment.
        let p = segment_path(dir.path(), seg);
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        std::thread::sleep(std::time::Duration::from_millis(50));

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
        drop(wal);
        std::thread::sleep(std::time::Duration::from_millis(50));
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
        let written = fs::metadata(&path).unwrap().len();
        assert!(written > 4 << 20, "{written} bytes written");
        // Synced pages are dropped as they are written: at most the
        // partial pages at the ends of commits remain.
        let resident = resident_bytes(&path);
        assert!(
            resident < written / 8,
            "{resident} of {written} bytes of the segment still in the page cache"
        );
        drop(wal);
        std::thread::sleep(std::time::Duration::from_millis(50));
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
        for i in 0..64u8 {
            // 8 + 70,001 bytes a record: every commit ends mid-page.
            wal.append(bytes::Bytes::from(vec![i; 70_001]))
                .await
                .unwrap();
        }
        let seg = *segments(dir.path()).unwrap().last().unwrap();
        let path = segment_path(dir.path(), seg);
        let written = fs::metadata(&path).unwrap().len();
        assert_ne!(written % 4096, 0, "the segment ends mid-page");
        let resident = resident_bytes(&path);
        assert!(
            resident > 0,
            "the page the next append writes into was dropped ({written} bytes written)"
        );
        assert!(
            resident < written / 8,
            "{resident} of {written} bytes of the segment still in the page cache"
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
        drop(wal);
        let p = segment_path(dir.path(), first);
        let mut bytes = fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&p, bytes).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let err = Wal::open(dir.path(), WalMetrics::default(), |_| {})
            .err()
            .unwrap();
        assert!(err.to_string().contains("checksum"), "{err}");
    }
}
