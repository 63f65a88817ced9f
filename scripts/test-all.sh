#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine with Rust: installs what the
# tests need (apt packages, Python clients, the Garage S3 server), then checks formatting
# and lints and runs every test. Safe to run again: installs only what is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_pkgs=(protobuf-compiler clang llvm libbpf-dev golang-go nodejs python3 util-linux chromium chromium-driver openjdk-17-jdk-headless debootstrap binutils debuginfod elfutils)
# Python with pip, unless one is already on PATH (e.g. pyenv).
python3 -m pip --version >/dev/null 2>&1 || apt_pkgs+=(python3 python3-pip)
# ...and venv support (Debian splits ensurepip out).
python3 -c 'import ensurepip' >/dev/null 2>&1 || apt_pkgs+=(python3-venv)
# The deploy tests run containers: Docker Engine and docker-compose (they fail,
# saying so, when the engine is not running).
command -v docker >/dev/null 2>&1 || apt_pkgs+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || apt_pkgs+=(docker-compose)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
py_pkgs=('pyroscope-io==0.8.16' pyarrow 'adbc-driver-flightsql>=1.13' 'adbc-driver-manager>=1.13' selenium 'kubernetes-validate>=1.31')
if ! python3 -c 'import pyroscope, pyarrow, adbc_driver_flightsql, selenium, kubernetes_validate' 2>/dev/null; then
  # Debian's own Python refuses pip installs without this flag (PEP 668).
  python3 -m pip install -q "${py_pkgs[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${py_pkgs[@]}"
fi
# A venv under the target directory (the system Python keeps its own pins);
# Debian's Python needs python3-venv for ensurepip.
make_venv() {
  python3 -m venv "$1" 2>/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv --clear "$1"
  }
}
# pyroscope-io 1.4.x (it pushes over push.v1) for its e2e test, in a venv
# under the target directory: the system Python keeps 0.8.16 for the
# legacy-SDK test. The test creates the same venv if it is missing.
venv="${CARGO_TARGET_DIR:-target}/pyroscope-io-1.4"
if ! "$venv/bin/python" -c 'import pyroscope' 2>/dev/null; then
  make_venv "$venv"
  "$venv/bin/pip" install -q 'pyroscope-io>=1.4,<1.5'
fi
# The OpenTelemetry profiling SDK (OTLP e2e test) in its own venv: it pins
# opentelemetry-exporter-otlp/protobuf versions of its own.
otlp_venv="${CARGO_TARGET_DIR:-target}/otlp-venv"
if ! "$otlp_venv/bin/python" -c 'import opentelemetry.sdk.extension.profiling' 2>/dev/null; then
  echo "installing opentelemetry-sdk-extension-profiling into $otlp_venv"
  make_venv "$otlp_venv"
  "$otlp_venv/bin/pip" install -q 'opentelemetry-sdk-extension-profiling==0.63b4'
fi
# The OTLP trace receiver of the tracing e2e test (grpcio and
# opentelemetry-proto; the SDK above usually brings both), in the same venv.
if ! "$otlp_venv/bin/python" -c 'import grpc, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc' 2>/dev/null; then
  echo "installing grpcio and opentelemetry-proto into $otlp_venv"
  "$otlp_venv/bin/pip" install -q grpcio opentelemetry-proto
fi
# Grafana's Connect client (connectrpc) and its code generators, in a venv of
# their own under the target directory: their protobuf runtime must not meet
# the pinned SDKs' (the Grafana e2e test looks for it there).
connect_venv="${CARGO_TARGET_DIR:-target}/py-connect"
connect_pkgs=('connectrpc==0.13.0' 'protoc-gen-connectrpc==0.13.0' 'protobuf-py==0.7.0' 'protoc-gen-py==0.7.0')
if ! "$connect_venv/bin/python" -c 'import connectrpc, protobuf' 2>/dev/null ||
  [ ! -x "$connect_venv/bin/protoc-gen-py" ] || [ ! -x "$connect_venv/bin/protoc-gen-connectrpc" ]; then
  echo "installing ${connect_pkgs[*]} into $connect_venv"
  make_venv "$connect_venv"
  "$connect_venv/bin/python" -m pip install -q "${connect_pkgs[@]}"
fi
# Garage, the S3 server of the object-storage tests (about 20 minutes to
# build; only when missing).
if ! command -v garage >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/garage" ]; then
  echo "installing garage (cargo install garage --locked)"
  cargo install -q garage --locked
fi

# CI builds once, from a clean clone: incremental caches (a third of the
# target directory) buy nothing there but disk.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
# Fuzzing: every decoder of outside bytes for 15 s each (fuzz/run.sh builds
# the targets with AddressSanitizer; see docs/security.md, "Fuzzing").
command -v cargo-fuzz >/dev/null 2>&1 || cargo install -q cargo-fuzz --locked
FUZZ_SECONDS="${FUZZ_SECONDS:-15}" fuzz/run.sh
