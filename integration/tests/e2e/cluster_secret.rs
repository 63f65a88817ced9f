//! The cluster secret, in a process cluster: an ingester (writes and
//! Flight head reads), a metastore node (client API) and a Raft endpoint
//! refuse a caller without the secret and with a wrong one, and answer
//! the right one; a role refuses to start on a non-loopback address
//! without a secret unless told the network is trusted.

use std::process::Command;
use std::time::Duration;

use fathom_integration::cluster::{Cluster, ClusterOptions};
use fathom_integration::fathom_bin;

/// Any message whose field 1 is bytes (a Raft request, a Flight ticket) or
/// absent (an empty write request or members request).
#[derive(Clone, PartialEq, prost::Message)]
struct Raw {
    #[prost(bytes = "vec", tag = "1")]
    data: Vec<u8>,
}

/// Calls `path` at `addr` with an empty message, carrying `secret` (if
/// any) in `x-fathom-cluster-secret`; returns the gRPC code and message.
fn call(addr: &str, path: &'static str, secret: Option<&str>) -> (tonic::Code, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap();
        let mut g = tonic::client::Grpc::new(ch);
        g.ready().await.unwrap();
        let mut req = tonic::Request::new(Raw { data: Vec::new() });
        if let Some(s) = secret {
            req.metadata_mut()
                .insert("x-fathom-cluster-secret", s.parse().unwrap());
        }
        req.metadata_mut()
            .insert("x-scope-orgid", "secret-test".parse().unwrap());
        let codec = tonic_prost::ProstCodec::<Raw, Raw>::default();
        match g
            .unary(req, http::uri::PathAndQuery::from_static(path), codec)
            .await
        {
            Ok(_) => (tonic::Code::Ok, String::new()),
            Err(s) => (s.code(), s.message().to_owned()),
        }
    })
}

#[test]
fn cluster_internal_services_refuse_callers_without_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), &ClusterOptions::default()).unwrap();
    let wrong = format!("{}-not", c.secret);
    let leader = c.leader().unwrap().addr();
    let follower = c
        .metastores
        .iter()
        .find(|m| m.addr() != leader)
        .unwrap()
        .addr();
    let ingester = c.ingesters[0].addr();
    let endpoints = [
        (
            "ingester write",
            ingester.clone(),
            "/fathom.ingester.v1.IngesterService/Write",
        ),
        (
            "ingester record write",
            ingester.clone(),
            "/fathom.ingester.v1.IngesterService/WriteRecord",
        ),
        (
            "ingester head read (Flight DoGet)",
            ingester.clone(),
            "/arrow.flight.protocol.FlightService/DoGet",
        ),
        (
            "metastore Members",
            leader.clone(),
            "/fathom.metastore.v1.Metastore/Members",
        ),
        (
            "metastore Tenants",
            leader.clone(),
            "/fathom.metastore.v1.Metastore/Tenants",
        ),
        (
            "Raft Vote",
            follower.clone(),
            "/fathom.metastore.v1.Raft/Vote",
        ),
        (
            "Raft AppendEntries",
            follower,
            "/fathom.metastore.v1.Raft/AppendEntries",
        ),
    ];
    for (what, addr, path) in &endpoints {
        for (who, secret) in [
            ("no secret", None),
            ("a wrong secret", Some(wrong.as_str())),
        ] {
            let (code, msg) = call(addr, path, secret);
            assert_eq!(
                code,
                tonic::Code::Unauthenticated,
                "{what} with {who}: {msg}"
            );
            assert!(msg.contains("cluster secret"), "{what} with {who}: {msg}");
            println!("{what} with {who}: {code:?}: {msg}");
        }
        // The right secret gets past the check: the service itself
        // answers (an empty message is a bad request to most of them).
        let (code, msg) = call(addr, path, Some(&c.secret));
        assert_ne!(
            code,
            tonic::Code::Unauthenticated,
            "{what} with the secret: {msg}"
        );
        println!("{what} with the secret: {code:?} {msg}");
    }
    // A fake ingester cannot join the ring through the client API.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt
        .block_on(async {
            fathom_metastore::MetastoreClient::new([leader.clone()])
                .unwrap()
                .register(fathom_metastore::Member::new(
                    "fake",
                    fathom_metastore::Role::Ingester,
                    "127.0.0.1:1",
                ))
                .await
        })
        .unwrap_err();
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
    assert_eq!(
        c.live_ingesters().unwrap(),
        ["ingester-0", "ingester-1", "ingester-2"],
        "the ring holds only the real ingesters"
    );
    // A block listing names a tenant: a call without one is refused.
    let (code, msg) = call(
        &leader,
        "/fathom.metastore.v1.Metastore/Blocks",
        Some(&c.secret),
    );
    assert_eq!(code, tonic::Code::InvalidArgument, "{msg}");
    assert!(msg.contains("tenant"), "{msg}");
}

/// `fathom <role>` on 0.0.0.0 without a secret refuses to start and says
/// why; `--insecure-trusted-network` lets it start.
#[test]
fn roles_refuse_a_public_address_without_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    for role in [
        "metastore",
        "ingester",
        "distributor",
        "querier",
        "compactor",
    ] {
        let mut args = vec![role.to_owned(), "--listen".into(), "0.0.0.0:0".into()];
        if role != "metastore" {
            args.extend(["--metastore".into(), "127.0.0.1:1".into()]);
        }
        if role != "distributor" {
            args.extend([
                "--data-dir".into(),
                dir.path().join(role).display().to_string(),
            ]);
        }
        let out = Command::new(fathom_bin())
            .args(&args)
            .env_remove("FATHOM_CLUSTER_SECRET")
            .env_remove("FATHOM_CLUSTER_SECRET_FILE")
            .env_remove("FATHOM_INSECURE_TRUSTED_NETWORK")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{role} started without a secret");
        assert!(
            err.contains("without a cluster secret") && err.contains("--cluster-secret"),
            "{role}: {err}"
        );
        // A short secret is refused too, naming the rule.
        let out = Command::new(fathom_bin())
            .args(&args)
            .env("FATHOM_CLUSTER_SECRET", "short")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{role} started with a short secret");
        assert!(err.contains("at least 16"), "{role}: {err}");
    }
    // Told that the network is trusted, a metastore node starts on
    // 0.0.0.0 (it needs nothing else) and serves /ready.
    let port = fathom_integration::free_port();
    let mut child = Command::new(fathom_bin())
        .args(["metastore", "--insecure-trusted-network", "--listen"])
        .arg(format!("0.0.0.0:{port}"))
        .arg("--data-dir")
        .arg(dir.path().join("trusted"))
        .env_remove("FATHOM_CLUSTER_SECRET")
        .env_remove("FATHOM_CLUSTER_SECRET_FILE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let ready = loop {
        if let Ok(r) = reqwest::blocking::get(format!("http://127.0.0.1:{port}/ready"))
            && r.status().is_success()
        {
            break true;
        }
        if child.try_wait().unwrap().is_some() || t0.elapsed() > Duration::from_secs(30) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        ready,
        "a metastore with --insecure-trusted-network did not start"
    );
}
