//! The deployment artefacts of `deploy/`, run for real: the images built by
//! `scripts/images.sh`, the docker-compose dev cluster (`compose`), the
//! cluster under faults as containers started with testcontainers
//! (`containers`), and the Kubernetes manifests validated offline against
//! the API schemas (`k8s`).
//!
//! Docker and docker-compose are required: without them these tests fail
//! with a message saying so, never skip. The Docker tests take one lock, so
//! at most one cluster of containers runs at a time.

mod compose;
mod containers;
mod k8s;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use fathom_integration::{fathom_bin, workspace};

/// The tag the tests build and run (`latest` stays the user's).
pub(crate) const TAG: &str = "e2e";

/// One Docker cluster at a time (two on two cores starve each other).
pub(crate) fn docker_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `cmd`; its stdout, or a panic with everything it printed.
pub(crate) fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Panics unless the Docker engine answers.
pub(crate) fn require_docker() {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
    {
        Err(e) => panic!(
            "the deploy tests need Docker, and `docker` cannot be run ({e}): \
             install Docker Engine (apt-get install docker.io) and start dockerd"
        ),
        Ok(o) if !o.status.success() => panic!(
            "the deploy tests need Docker, and the engine does not answer \
             (`docker info`: {}): start dockerd",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Ok(_) => {}
    }
}

/// Builds the images (`fathom`, `fathom-agent`, `fathom-garage`, tag
/// [`TAG`]) from the `fathom` binary under test, once per test run.
pub(crate) fn images() {
    static BUILT: OnceLock<Result<f64, String>> = OnceLock::new();
    let r = BUILT.get_or_init(|| {
        require_docker();
        let t0 = Instant::now();
        let out = Command::new("bash")
            .arg(workspace().join("scripts/images.sh"))
            .arg(fathom_bin())
            .env("FATHOM_IMAGE_TAG", TAG)
            .current_dir(workspace())
            .output()
            .map_err(|e| format!("cannot run scripts/images.sh: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!("scripts/images.sh failed:\n{text}"));
        }
        print!("{text}");
        Ok(t0.elapsed().as_secs_f64())
    });
    match r {
        Ok(secs) => println!("images built (or found current) in {secs:.1} s"),
        Err(e) => panic!("{e}"),
    }
}

/// `deploy/` in the workspace.
pub(crate) fn deploy_dir() -> PathBuf {
    workspace().join("deploy")
}
