//! The Kubernetes manifests of `deploy/k8s/`, validated offline against
//! the Kubernetes API's schemas with PyPI `kubernetes-validate` (strict:
//! unknown fields fail too), and checked for the shape the docs promise.

use std::collections::BTreeSet;
use std::process::Command;

use super::deploy_dir;

/// Validates `files` (strict); the validator's output, or an error with it.
fn validate(files: &[std::path::PathBuf]) -> Result<String, String> {
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(files)
        .output()
        .expect("python3 runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    if text.contains("No module named kubernetes_validate") {
        panic!(
            "the manifest test needs PyPI kubernetes-validate \
             (python3 -m pip install kubernetes-validate; scripts/test-all.sh installs it)"
        );
    }
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

fn manifests(dir: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(deploy_dir().join("k8s").join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    v
}

/// `kind/name` of every document, and the ones with volume claim templates.
fn kinds(files: &[std::path::PathBuf]) -> (BTreeSet<String>, BTreeSet<String>) {
    let script = r#"
import sys, yaml
for f in sys.argv[1:]:
    for d in yaml.safe_load_all(open(f)):
        if not d: continue
        vct = bool(d.get("spec", {}).get("volumeClaimTemplates"))
        print(d["kind"] + "/" + d["metadata"]["name"] + (" vct" if vct else ""))
"#;
    let out = fathom_integration::python3_script(script, files);
    let mut all = BTreeSet::new();
    let mut with_volumes = BTreeSet::new();
    for l in String::from_utf8(out).unwrap().lines() {
        let (k, vct) = l
            .strip_suffix(" vct")
            .map(|k| (k, true))
            .unwrap_or((l, false));
        if vct {
            with_volumes.insert(k.to_owned());
        }
        all.insert(k.to_owned());
    }
    (all, with_volumes)
}

#[test]
fn k8s_manifests_validate_against_the_api_schemas() {
    let cluster = manifests("cluster");
    let single = manifests("single");
    for set in [&cluster, &single] {
        let out = validate(set).unwrap_or_else(|e| panic!("manifests do not validate:\n{e}"));
        print!("{out}");
    }
    let (all, with_volumes) = kinds(&cluster);
    for want in [
        "StatefulSet/fathom-metastore",
        "StatefulSet/fathom-ingester",
        "Deployment/fathom-distributor",
        "Deployment/fathom-querier",
        "Deployment/fathom-compactor",
        "DaemonSet/fathom-agent",
        "Service/fathom-metastore",
        "Service/fathom-ingester",
        "Service/fathom-distributor",
        "Service/fathom-querier",
        "Secret/fathom-s3",
    ] {
        assert!(
            all.contains(want),
            "deploy/k8s/cluster has no {want}: {all:?}"
        );
    }
    for want in [
        "StatefulSet/fathom-metastore",
        "StatefulSet/fathom-ingester",
    ] {
        assert!(
            with_volumes.contains(want),
            "{want} keeps its data on a volume claim"
        );
    }

    // The validator does reject what the API server would: a wrong type
    // and an unknown field.
    let dir = tempfile::tempdir().unwrap();
    let src = std::fs::read_to_string(deploy_dir().join("k8s/cluster/ingester.yaml")).unwrap();
    for (what, broken) in [
        (
            "replicas as a string",
            src.replace("replicas: 3", "replicas: three"),
        ),
        (
            "an unknown field",
            src.replace(
                "serviceName: fathom-ingester",
                "serviceName: fathom-ingester\n  replica: 3",
            ),
        ),
    ] {
        assert_ne!(broken, src, "the mutation applies");
        let f = dir.path().join("broken.yaml");
        std::fs::write(&f, broken).unwrap();
        let e = validate(&[f]).expect_err(what);
        let why = e.lines().find(|l| !l.contains(" passed ")).unwrap_or("");
        println!("broken manifest ({what}) rejected: {why}");
    }
}
