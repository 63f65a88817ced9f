#!/usr/bin/env bash
# Builds and runs `fathom all` on a fresh Debian machine with Rust.
set -euo pipefail
cd "$(dirname "$0")/.."
dpkg -s protobuf-compiler >/dev/null 2>&1 || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler clang llvm libbpf-dev >/dev/null
}
exec cargo run --release -p fathom -- all "$@"
