//! Query limits over real HTTP: the query routes served on a TCP port and
//! a real TCP client. A client that disconnects mid-query cancels the
//! query, which gives its memory back (`fathom_querier_query_memory_bytes`
//! back to 0, `fathom_querier_queries_cancelled` up by one); a query over
//! the memory limit or the timeout answers 429 naming the limit, and the
//! server keeps serving.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use fathom_block::MemoryIndex;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use fathom_querier::test_util::{ReadHook, history};
use fathom_querier::{Config, Querier, SqlConfig, test_querier_on};

/// Parks the first read of a data page (a column chunk, not the footer)
/// of a samples file whose path holds `hold` for ever (until the reader is
/// dropped): a query stopped in the middle of its execution, after the
/// blocks before it have been read into its aggregation. Called by a
/// [`ReadHook`] store before every read.
#[derive(Debug)]
struct Gate {
    inner: Arc<dyn ObjectStore>,
    hold: String,
    armed: AtomicBool,
    held: AtomicUsize,
}

impl Gate {
    /// Whether one of `ranges` starts among the column chunks of the
    /// Parquet file at `location`: after its leading magic and before its
    /// footer (metadata, then its length as a little-endian u32, then the
    /// magic again).
    async fn reads_data(&self, location: &Path, ranges: &[Range<u64>]) -> bool {
        let Ok(meta) = self.inner.head(location).await else {
            return false;
        };
        let size = meta.size;
        let Some(tail_start) = size.checked_sub(8) else {
            return false;
        };
        let Ok(tail) = self.inner.get_range(location, tail_start..size).await else {
            return false;
        };
        let footer = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
        let data_end = tail_start.saturating_sub(footer);
        ranges.iter().any(|r| r.start >= 4 && r.start < data_end)
    }

    async fn maybe_hold(&self, location: &Path, ranges: &[Range<u64>]) {
        let p = location.as_ref();
        if !p.contains(&self.hold) || !p.ends_with(fathom_block::files::SAMPLES) {
            return;
        }
        if self.armed.load(Ordering::SeqCst)
            && self.reads_data(location, ranges).await
            && self.armed.swap(false, Ordering::SeqCst)
        {
            self.held.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        }
    }
}

/// Serves the query routes of `q` on a loopback port.
async fn serve(q: Querier) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, crate::router(q)).await.unwrap();
    });
    addr
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The request line and headers of a GET for tenant `t`.
fn request(path_and_query: &str) -> String {
    format!(
        "GET {path_and_query} HTTP/1.1\r\nhost: fathom\r\nx-scope-orgid: t\r\nconnection: close\r\n\r\n"
    )
}

/// A whole HTTP/1.1 exchange: the status and the body text.
async fn get(addr: std::net::SocketAddr, path_and_query: &str) -> (u16, String) {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(request(path_and_query).as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Polls `f` every 10 ms until it holds, at most ~20 s; whether it held.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..2000 {
        if f() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    f()
}

/// The merge query of the whole test history, as a path and query string.
fn merge_path(pt: &str) -> String {
    let day = fathom_block::DAY_NANOS / 1_000_000;
    let (start, end) = (20_000 * day - 3 * day, 20_000 * day + 3 * day);
    format!(
        "/api/v1/query?query={}&start={start}&end={end}&format=top",
        percent(&format!("{pt}{{service_name=\"svc\"}}"))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_client_that_disconnects_cancels_its_query_and_frees_its_memory() {
    let mem: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (metas, all) = history(mem.as_ref()).await;
    let gate = Arc::new(Gate {
        inner: mem.clone(),
        hold: metas.last().unwrap().id.clone(),
        armed: AtomicBool::new(true),
        held: AtomicUsize::new(0),
    });
    let on_read = gate.clone();
    let store = Arc::new(ReadHook {
        inner: mem,
        on_read: Box::new(move |l, r| {
            let (gate, l, r) = (on_read.clone(), l.clone(), r.to_vec());
            Box::pin(async move { gate.maybe_hold(&l, &r).await })
        }),
    });
    // Raw samples only: every block is read through the gate. Small
    // batches: the other blocks' rows reach the final aggregation (and its
    // memory reservation) while the last one is parked (DataFusion gathers
    // a batch's rows before a repartition without reserving them).
    let q = test_querier_on(
        Config {
            use_rollups: false,
            sql: SqlConfig {
                batch_rows: 16,
                ..SqlConfig::default()
            },
            ..Config::default()
        },
        Arc::new(MemoryIndex::new(metas)),
        store,
    );
    let addr = serve(q.clone()).await;
    let pt = all[0].profile_type.to_string();
    let path = merge_path(&pt);

    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    client.write_all(request(&path).as_bytes()).await.unwrap();
    // The query runs and is parked on a read of the last block's samples,
    // holding the memory of what it has aggregated so far.
    assert!(
        eventually(|| gate.held.load(Ordering::SeqCst) == 1).await,
        "the query never reached the parked read"
    );
    assert!(
        eventually(|| q.query_memory_bytes() > 0).await,
        "the parked query holds no memory"
    );
    let held = q.query_memory_bytes();
    assert_eq!(q.queries_cancelled(), 0);
    // The client goes away mid-query.
    drop(client);
    assert!(
        eventually(|| q.queries_cancelled() == 1).await,
        "the query was not cancelled"
    );
    assert!(
        eventually(|| q.query_memory_bytes() == 0).await,
        "the cancelled query still holds {} of its {held} bytes",
        q.query_memory_bytes()
    );
    // The server keeps serving, exactly (the gate is open now).
    let (status, body) = get(addr, &path).await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let want: i64 = all
        .iter()
        .filter(|p| p.profile_type.to_string() == pt)
        .map(|p| p.total())
        .sum();
    assert_eq!(v["total"].as_i64(), Some(want), "{body}");
    assert_eq!(q.queries_cancelled(), 1);
    assert_eq!(q.query_memory_bytes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_query_over_its_limits_answers_429_and_the_server_keeps_serving() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (metas, all) = history(store.as_ref()).await;
    let index = Arc::new(MemoryIndex::new(metas));
    let pt = all[0].profile_type.to_string();
    let path = merge_path(&pt);
    for (sql, want) in [
        (
            SqlConfig {
                memory_limit: 64,
                ..SqlConfig::default()
            },
            "query memory limit",
        ),
        (
            SqlConfig {
                timeout: std::time::Duration::from_nanos(1),
                ..SqlConfig::default()
            },
            "query timeout",
        ),
    ] {
        let q = test_querier_on(
            Config {
                use_rollups: false,
                sql,
                ..Config::default()
            },
            index.clone(),
            store.clone(),
        );
        let addr = serve(q.clone()).await;
        for _ in 0..2 {
            let (status, body) = get(addr, &path).await;
            assert_eq!(status, 429, "{want}: {body}");
            assert!(body.contains(want), "{want}: {body}");
        }
        // Still serving: the series of the same range answer.
        let day = fathom_block::DAY_NANOS / 1_000_000;
        let (status, body) = get(
            addr,
            &format!(
                "/api/v1/series?start={}&end={}",
                20_000 * day - 3 * day,
                20_000 * day + 3 * day
            ),
        )
        .await;
        assert_eq!(status, 200, "{want}: {body}");
        assert!(body.contains("svc"), "{body}");
        assert!(
            eventually(|| q.query_memory_bytes() == 0).await,
            "{want}: memory still held"
        );
    }
}
