#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine with Rust: installs what the
# tests need (apt packages, Python clients, the Garage S3 server), then checks formatting
# and lints and runs every test. Safe to run again: installs only what is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_pkgs=(protobuf-compiler clang llvm libbpf-dev golang-go nodejs util-linux chromium chromium-driver)
# Python with pip, unless one is already on PATH (e.g. pyenv).
python3 -m pip --version >/dev/null 2>&1 || apt_pkgs+=(python3 python3-pip)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
py_pkgs=('pyroscope-io==0.8.16' pyarrow 'adbc-driver-flightsql>=1.13' 'adbc-driver-manager>=1.13' selenium)
if ! python3 -c 'import pyroscope, pyarrow, adbc_driver_flightsql, selenium' 2>/dev/null; then
  # Debian's own Python refuses pip installs without this flag (PEP 668).
  python3 -m pip install -q "${py_pkgs[@]}" 2>/dev/null ||
    python3 -m pip install -q --break-system-packages "${py_pkgs[@]}"
fi
# The OpenTelemetry profiling SDK (OTLP e2e test) in its own venv: it pins
# opentelemetry-exporter-otlp/protobuf versions of its own.
otlp_venv="${CARGO_TARGET_DIR:-target}/otlp-venv"
if ! "$otlp_venv/bin/python" -c 'import opentelemetry.sdk.extension.profiling' 2>/dev/null; then
  echo "installing opentelemetry-sdk-extension-profiling into $otlp_venv"
  python3 -m venv "$otlp_venv" 2>/dev/null || {
    # Debian's Python needs python3-venv for ensurepip.
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv --clear "$otlp_venv"
  }
  "$otlp_venv/bin/pip" install -q 'opentelemetry-sdk-extension-profiling==0.63b4'
fi
# Garage, the S3 server of the object-storage tests (about 20 minutes to
# build; only when missing).
if ! command -v garage >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/garage" ]; then
  echo "installing garage (cargo install garage --locked)"
  cargo install -q garage --locked
fi

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
