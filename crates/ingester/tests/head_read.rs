//! The ingester's read API end to end in one process: its head-read Flight
//! service on a loopback port and its client, `FlightHeads`, give back the
//! ingester's own `HeadSnapshot` and symbols; failures beyond what
//! replication tolerates are an error naming each one.

use std::sync::Arc;
use std::time::Duration;

use fathom_api::cluster::{IngesterAddr, Ingesters, MembershipError, StaticIngesters};
use fathom_api::secret::ClusterSecret;
use fathom_block::MemoryIndex;
use fathom_ingester::{Config, FlightHeads, Ingester, ReadError, flight_service};
use fathom_model::{
    Function, Id, IdHasher, IngestBatch, Labels, Line, Location, Profile, Sample, Stack, Symbols,
    TenantId,
};
use object_store::memory::InMemory;
use prometheus_client::registry::Registry;

fn batch(tenant: &TenantId, seed: u64) -> (IngestBatch, Id) {
    let mut symbols = Symbols::default();
    let f = symbols.add_function(Function {
        name: format!("fn{seed}"),
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
    let b = IngestBatch {
        tenant: tenant.clone(),
        profiles: vec![Profile {
            id: IdHasher::new("head-read").u64(seed).finish(),
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
                .parse()
                .unwrap(),
            labels: Labels::from_pairs([("service_name", "svc")]).unwrap(),
            time_nanos: 1_000 + seed as i64,
            duration_nanos: 10,
            period: 1,
            samples: vec![Sample {
                stack: st,
                value: 7,
            }],
        }],
        symbols,
    };
    (b, st)
}

fn heads(members: Vec<IngesterAddr>, replication_factor: usize) -> FlightHeads {
    FlightHeads::new(
        Arc::new(StaticIngesters(members)),
        replication_factor,
        Duration::from_secs(10),
        ClusterSecret::random(),
    )
}

#[tokio::test]
async fn a_head_read_returns_the_ingesters_own_snapshot_and_symbols() {
    let dir = tempfile::tempdir().unwrap();
    let ingester = Ingester::open(
        Config {
            data_dir: dir.path().to_owned(),
            name: "i1".into(),
            flush_interval: Duration::from_secs(3600),
            max_head_bytes: 1 << 30,
            max_head_memory: 1 << 30,
        },
        Arc::new(InMemory::new()),
        Arc::new(MemoryIndex::default()),
        &mut Registry::default(),
    )
    .unwrap();
    let tenant = TenantId::new("t1").unwrap();
    let (b1, st1) = batch(&tenant, 1);
    let (b2, _) = batch(&tenant, 2);
    ingester.write(b1).await.unwrap();
    ingester.write(b2).await.unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = async_stream_of(listener);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(flight_service(ingester.clone()))
            .serve_with_incoming(incoming),
    );
    let up = IngesterAddr {
        id: "i1".into(),
        addr: addr.to_string(),
    };

    let local = ingester.snapshot(&tenant, i64::MIN, i64::MAX);
    let got = heads(vec![up.clone()], 1)
        .snapshot(&tenant, i64::MIN, i64::MAX)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].series, local.series);
    assert_eq!(got[0].profiles, local.profiles);
    assert_eq!(local.profiles.len(), 2);
    let rows = |s: &fathom_ingester::HeadSnapshot| -> usize {
        s.samples.iter().map(|b| b.num_rows()).sum()
    };
    assert_eq!(rows(&got[0]), rows(&local));
    assert_eq!(rows(&local), 2);

    // Another tenant's read sees nothing of t1.
    let other = TenantId::new("t2").unwrap();
    let none = heads(vec![up.clone()], 1)
        .snapshot(&other, i64::MIN, i64::MAX)
        .await
        .unwrap();
    assert!(none[0].profiles.is_empty() && none[0].series.is_empty());

    // Symbols: exactly what the stack needs, ids as the ingester has them.
    let want = ingester.symbols(&tenant, &[st1]);
    let syms = heads(vec![up.clone()], 1)
        .symbols(&tenant, &[st1])
        .await
        .unwrap();
    assert_eq!(syms.stacks.len(), 1);
    assert_eq!(syms.stacks[&st1].locations, want.stacks[&st1].locations);
    let mut names: Vec<&str> = syms.functions.values().map(|f| f.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["fn1"]);

    // One ingester down: RF=3 tolerates it, RF=1 does not, and says why.
    let down = IngesterAddr {
        id: "i9".into(),
        addr: "127.0.0.1:1".into(),
    };
    let both = vec![up.clone(), down];
    let tolerated = heads(both.clone(), 3)
        .snapshot(&tenant, i64::MIN, i64::MAX)
        .await
        .unwrap();
    assert_eq!(tolerated.len(), 1);
    let e = heads(both.clone(), 1)
        .snapshot(&tenant, i64::MIN, i64::MAX)
        .await
        .unwrap_err();
    match &e {
        ReadError::Quorum {
            failed: 1,
            live: 2,
            down,
            tolerated: 0,
            errors,
        } if down.is_empty() => assert!(e.to_string().contains("i9") && errors.len() == 1, "{e}"),
        other => panic!("expected a quorum error, got {other}"),
    }
    let api = fathom_api::ApiError::from(e);
    assert_eq!(api.grpc_code(), tonic::Code::Unavailable);

    // An ingester down (killed: neither live nor left after a flush) is a
    // replica missed too. RF=3 with one down reads every live one, and a
    // failed read then is one miss too many: the writes the two acknowledged
    // may be on no ingester that answered.
    let one_down = |live: Vec<IngesterAddr>| {
        FlightHeads::new(
            Arc::new(WithDown(live, vec!["i7".into()])),
            3,
            Duration::from_secs(10),
            ClusterSecret::random(),
        )
    };
    let read = one_down(vec![up.clone()])
        .snapshot(&tenant, i64::MIN, i64::MAX)
        .await
        .unwrap();
    assert_eq!(read.len(), 1, "one down, every live one read: tolerated");
    let e = one_down(both.clone())
        .snapshot(&tenant, i64::MIN, i64::MAX)
        .await
        .unwrap_err();
    let ReadError::Quorum {
        failed: 1,
        live: 2,
        tolerated: 1,
        down,
        ..
    } = &e
    else {
        panic!("expected a quorum error of 1 failed read, got {e}");
    };
    assert_eq!(down, &["i7"]);
    let m = e.to_string();
    assert!(
        m.contains(
            "1 of 2 live ingesters could not be read and 1 is down with heads not flushed (i7)"
        ) && m.contains("i9"),
        "{m}"
    );
    // Two down: missed whatever the live ones would answer, so none is
    // asked (the unreachable i9 is no failure here).
    let e = FlightHeads::new(
        Arc::new(WithDown(both, vec!["i7".into(), "i8".into()])),
        3,
        Duration::from_secs(10),
        ClusterSecret::random(),
    )
    .snapshot(&tenant, i64::MIN, i64::MAX)
    .await
    .unwrap_err();
    let m = e.to_string();
    assert!(
        m.starts_with(
            "0 of 2 live ingesters could not be read and 2 are down with heads not flushed (i7, i8)"
        ),
        "{m}"
    );

    server.abort();
}

/// A fixed set of live ingesters and some that are down.
struct WithDown(Vec<IngesterAddr>, Vec<String>);

#[async_trait::async_trait]
impl Ingesters for WithDown {
    async fn ingesters(&self) -> Result<Vec<IngesterAddr>, MembershipError> {
        Ok(self.0.clone())
    }

    async fn down(&self) -> Vec<String> {
        self.1.clone()
    }
}

/// The accepted connections of `listener`, for tonic.
fn async_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |l| async move {
        let r = l.accept().await.map(|(s, _)| s);
        Some((r, l))
    })
}
