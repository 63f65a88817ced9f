//! The cluster's roles wired over the network, in one test process: three
//! ingesters (RF=3), a distributor and a querier on loopback ports, a
//! shared filesystem bucket and block index. Real gRPC writes, real Flight
//! head reads; an ingester "killed" here is its server task aborted without
//! a flush. (Separate processes with the metastore: integration/.)

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fathom_api::cluster::{IngesterAddr, StaticIngesters};
use fathom_block::{BlockIndex, MemoryIndex};
use fathom_server::{
    DistributorConfig, IngesterConfig, ObjectStoreConfig, QuerierRoleConfig, distributor_app,
    ingester_app, querier_app, serve,
};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const LARGE: &str = "google+pprof/internal/proftest/testdata/large.cpu";
const SMALL: &str = "google+pprof/internal/report/testdata/sample.cpu";

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata/pprof")
}

/// The cluster secret of every role here (the ingesters refuse calls
/// without it).
fn secret() -> fathom_api::secret::ClusterSecret {
    fathom_api::secret::ClusterSecret::new("in-process-cluster-secret").unwrap()
}

/// A loopback address no listener holds now, and that this test process
/// has not handed out before: the kernel may give a port it just gave
/// (the probe's listener is closed at once), and two roles of one cluster
/// then got the same address, one failing to bind.
fn free_addr() -> SocketAddr {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        if !given.contains(&addr.port()) {
            given.push(addr.port());
            return addr;
        }
    }
}

struct Proc {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Proc {
    /// Graceful: drains and flushes.
    async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = self.task.await;
    }

    /// Like kill -9 as far as the process's data goes: no flush.
    fn kill(self) {
        self.task.abort();
    }
}

async fn spawn(
    addr: SocketAddr,
    registry: Registry,
    app: axum::Router,
    ingester: Option<Arc<fathom_ingester::Ingester>>,
) -> Proc {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve(
            addr,
            registry,
            app,
            ingester.map(|i| (i, Duration::from_secs(60))),
            None,
            "a test process",
            async {
                let _ = rx.await;
            },
        )
        .await
        .unwrap();
    });
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(r) = http.get(format!("http://{addr}/ready")).send().await
            && r.status().is_success()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Proc {
        addr,
        stop: Some(tx),
        task,
    }
}

struct Cluster {
    dir: tempfile::TempDir,
    index: Arc<dyn BlockIndex>,
    store: Arc<dyn object_store::ObjectStore>,
    ring: Vec<IngesterAddr>,
    ingesters: Vec<Option<Proc>>,
    distributor: Proc,
    querier: Proc,
}

impl Cluster {
    async fn ingester(&self, i: usize) -> Proc {
        let addr: SocketAddr = self.ring[i].addr.parse().unwrap();
        let mut reg = Registry::default();
        let (app, ing) = ingester_app(
            &IngesterConfig {
                name: self.ring[i].id.clone(),
                data_dir: self.dir.path().join(&self.ring[i].id),
                flush_interval: Duration::from_secs(3600),
                max_head_bytes: 1 << 30,
                max_head_memory: 1 << 30,
                secret: secret(),
                tenants: Default::default(),
            },
            self.store.clone(),
            self.index.clone(),
            &mut reg,
        )
        .unwrap();
        spawn(addr, reg, app, Some(ing)).await
    }

    async fn start() -> Cluster {
        Self::start_with(Default::default()).await
    }

    /// The cluster, its distributor and querier with `tenants`.
    async fn start_with(tenants: fathom_server::TenantsFileConfig) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let store = ObjectStoreConfig::filesystem().build(dir.path()).unwrap();
        let index: Arc<dyn BlockIndex> = Arc::new(MemoryIndex::new(vec![]));
        let ring: Vec<IngesterAddr> = (0..3)
            .map(|i| IngesterAddr {
                id: format!("ingester-{i}"),
                addr: free_addr().to_string(),
            })
            .collect();
        let members = Arc::new(StaticIngesters(ring.clone()));
        let mut reg = Registry::default();
        let app = distributor_app(
            &DistributorConfig {
                limits: Default::default(),
                replication_factor: 3,
                write_timeout: Duration::from_secs(60),
                tenants: tenants.clone(),
                secret: secret(),
                inflight: Default::default(),
            },
            members.clone(),
            &mut reg,
        )
        .unwrap();
        let distributor = spawn(free_addr(), reg, app, None).await;
        let mut reg = Registry::default();
        let app = querier_app(
            &QuerierRoleConfig {
                querier: Default::default(),
                replication_factor: 3,
                query_threads: 2,
                head_timeout: Duration::from_secs(60),
                cache: fathom_server::CacheConfig {
                    dir: dir.path().join("querier-cache"),
                    ..Default::default()
                },
                tenants,
                secret: secret(),
                symbols: Default::default(),
            },
            members,
            index.clone(),
            store.clone(),
            &mut reg,
        )
        .await
        .unwrap();
        let querier = spawn(free_addr(), reg, app, None).await;
        let mut c = Cluster {
            dir,
            index,
            store,
            ring,
            ingesters: Vec::new(),
            distributor,
            querier,
        };
        for i in 0..3 {
            let p = c.ingester(i).await;
            c.ingesters.push(Some(p));
        }
        c
    }

    async fn push(&self, file: &str, service: &str, at_s: i64) -> reqwest::Response {
        reqwest::Client::new()
            .post(format!("http://{}/ingest", self.distributor.addr))
            .query(&[
                ("name", service),
                ("format", "pprof"),
                ("from", &at_s.to_string()),
                ("until", &(at_s + 10).to_string()),
            ])
            .body(std::fs::read(testdata().join(file)).unwrap())
            .send()
            .await
            .unwrap()
    }

    async fn folded(&self, service: &str) -> Result<BTreeMap<String, i64>, String> {
        let r = reqwest::Client::new()
            .get(format!("http://{}/api/v1/query", self.querier.addr))
            .query(&[
                ("query", format!("{CPU}{{service_name=\"{service}\"}}")),
                ("start", "2023-12-31T00:00:00Z".into()),
                ("end", "2024-01-02T00:00:00Z".into()),
                ("format", "folded".into()),
            ])
            .send()
            .await
            .unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        if !status.is_success() {
            return Err(format!("{status}: {text}"));
        }
        Ok(text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect())
    }
}

fn expected(file: &str) -> BTreeMap<String, i64> {
    let f = std::fs::File::open(testdata().join(format!("expected/{file}.folded.tsv.gz"))).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(f), &mut text).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() == 3 && cols[0] == "cpu/nanoseconds" {
            *out.entry(cols[1].to_owned()).or_insert(0) += cols[2].parse::<i64>().unwrap();
        }
    }
    assert!(!out.is_empty(), "expectation loaded");
    out
}

const T0: i64 = 1_704_067_200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicated_writes_are_counted_once_wherever_they_sit() {
    let want = expected(LARGE);
    let small = expected(SMALL);
    let mut c = Cluster::start().await;
    let r = c.push(LARGE, "svc", T0).await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());

    // Three heads hold it; the querier counts it once.
    assert_eq!(c.folded("svc").await.unwrap(), want, "from three heads");

    // One ingester dies: writes still reach a quorum, reads still complete.
    c.ingesters[0].take().unwrap().kill();
    let r = c.push(SMALL, "svc2", T0).await;
    assert!(
        r.status().is_success(),
        "2 of 3: {}",
        r.text().await.unwrap()
    );
    assert_eq!(
        c.folded("svc").await.unwrap(),
        want,
        "with one ingester down"
    );
    assert_eq!(c.folded("svc2").await.unwrap(), small);

    // A second one dies: no quorum, a retryable 503 that says so; reads
    // refuse to answer partially.
    c.ingesters[1].take().unwrap().kill();
    let r = c.push(SMALL, "svc3", T0).await;
    assert_eq!(r.status().as_u16(), 503);
    let body = r.text().await.unwrap();
    assert!(body.contains("2 of 3 replicas failed"), "{body}");
    let e = c.folded("svc").await.unwrap_err();
    assert!(
        e.starts_with("503") && e.contains("2 of 3 live ingesters could not be read"),
        "{e}"
    );

    // Restart both from their WALs: every acknowledged profile is back,
    // once.
    for i in 0..2 {
        let p = c.ingester(i).await;
        c.ingesters[i] = Some(p);
    }
    assert_eq!(c.folded("svc").await.unwrap(), want, "after WAL replay");
    assert_eq!(c.folded("svc2").await.unwrap(), small);
    // The refused write may sit on the one ingester that took it; the
    // client's retry (same content, same profile id) is counted once.
    let r = c.push(SMALL, "svc3", T0).await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    assert_eq!(
        c.folded("svc3").await.unwrap(),
        small,
        "a retried write, once"
    );

    // Flush every head (graceful stop), restart empty: three level-0
    // blocks per write answer like the heads did.
    for i in 0..3 {
        c.ingesters[i].take().unwrap().stop().await;
    }
    let blocks = c.index.all().await.unwrap();
    assert!(
        blocks.len() >= 3,
        "each ingester cut a block: {}",
        blocks.len()
    );
    for i in 0..3 {
        let p = c.ingester(i).await;
        c.ingesters[i] = Some(p);
    }
    assert_eq!(c.folded("svc").await.unwrap(), want, "from blocks alone");
    assert_eq!(c.folded("svc2").await.unwrap(), small, "from blocks alone");
    assert_eq!(c.folded("svc3").await.unwrap(), small, "from blocks alone");
    for p in c.ingesters.iter_mut().filter_map(Option::take) {
        p.stop().await;
    }
}

/// The distributor and querier roles are external edges: with a tenants
/// file they refuse requests without a credential (401), with one of the
/// wrong scope (403), and serve the credential's tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributor_and_querier_roles_require_a_credential() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.yaml");
    std::fs::write(
        &file,
        format!(
            "credentials:\n  - {{ name: w, token: '{}', scopes: [write], tenants: [team-a] }}\n  \
             - {{ name: r, token: '{}', scopes: [read], tenants: [team-a] }}\n",
            fathom_server::auth::hash_sha256("write-token"),
            fathom_server::auth::hash_sha256("read-token"),
        ),
    )
    .unwrap();
    let c = Cluster::start_with(fathom_server::TenantsFileConfig {
        path: Some(file),
        reload_interval: Duration::from_secs(5),
    })
    .await;
    let http = reqwest::Client::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let push = |token: Option<&str>| {
        let mut rb = http
            .post(format!("http://{}/ingest", c.distributor.addr))
            .query(&[("name", "svc"), ("format", "pprof"), ("from", &now)])
            .body(std::fs::read(testdata().join(SMALL)).unwrap());
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        rb.send()
    };
    assert_eq!(push(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(
        push(Some("read-token")).await.unwrap().status().as_u16(),
        403
    );
    let r = push(Some("write-token")).await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let series = |token: Option<&str>| {
        let mut rb = http
            .get(format!("http://{}/api/v1/series", c.querier.addr))
            .query(&[("start", "now-1h")]);
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        rb.send()
    };
    assert_eq!(series(None).await.unwrap().status().as_u16(), 401);
    assert_eq!(
        series(Some("write-token")).await.unwrap().status().as_u16(),
        403
    );
    let r = series(Some("read-token")).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("\"svc\""),
        "team-a's data from the ingesters: {body}"
    );
    for p in [c.distributor.addr, c.querier.addr] {
        let r = http.get(format!("http://{p}/ready")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "/ready stays open");
    }
}
