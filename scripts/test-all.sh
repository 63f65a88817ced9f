#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine with Rust: installs what the
# tests need (apt packages, the pyroscope-io client), then checks formatting
# and lints and runs every test. Safe to run again: installs only what is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_pkgs=(protobuf-compiler clang llvm libbpf-dev golang-go python3-pip nodejs util-linux)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
python3 -c 'import pyroscope, pyarrow' 2>/dev/null || python3 -m pip install -q 'pyroscope-io==0.8.16' pyarrow

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
