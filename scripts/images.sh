#!/usr/bin/env bash
# Builds the container images from binaries built on the host (no registry
# needed; docs/deploy.md says why):
#   fathom:TAG         every role (deploy/Dockerfile)
#   fathom-agent:TAG   the eBPF agent (deploy/agent.Dockerfile, on top of fathom)
#   fathom-garage:TAG  Garage, the compose cluster's S3 bucket (deploy/garage.Dockerfile)
#
# Usage: bash scripts/images.sh [FATHOM_BINARY]
#   FATHOM_BINARY  default: $CARGO_TARGET_DIR/debug/fathom (the tests' dev
#                  build); pass target/release/fathom for a release image.
# Environment: FATHOM_IMAGE_TAG (default latest), GARAGE (the garage binary;
# default: on PATH or ~/.cargo/bin/garage).
#
# When the base image (debian:bookworm-slim) is not in the local engine it is
# made from Debian's packages: debootstrap --variant=minbase bookworm into a
# directory, then docker import under that name. Re-running is fast: the
# binaries are re-staged only when they changed and docker reuses its cache.
set -euo pipefail
cd "$(dirname "$0")/.."

base=debian:bookworm-slim
tag=${FATHOM_IMAGE_TAG:-latest}
target=${CARGO_TARGET_DIR:-target}
bin=${1:-$target/debug/fathom}

die() { echo "images.sh: $*" >&2; exit 1; }

command -v docker >/dev/null || die "docker is not installed (apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "the Docker engine does not answer (is dockerd running? docker info says: $(docker info 2>&1 | tail -n1))"
[ -x "$bin" ] || die "$bin is missing: build it first (cargo build --workspace --bins, or cargo build --release)"

garage=${GARAGE:-$(command -v garage || true)}
[ -n "$garage" ] || garage="$HOME/.cargo/bin/garage"
[ -x "$garage" ] || die "the garage binary is missing: cargo install garage --locked (scripts/test-all.sh installs it), or set GARAGE"

# One build at a time (tests build images from parallel threads and processes).
mkdir -p deploy/bin
exec 9>deploy/bin/.lock
flock 9

# The base image, from Debian's packages when it cannot be found locally.
# (With a registry at hand, `docker pull debian:bookworm-slim` first to use
# Debian's official image instead; this script never pulls.)
if ! docker image inspect "$base" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || {
    echo "images.sh: installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  rootfs=$(mktemp -d "${TMPDIR:-/tmp}/bookworm-rootfs.XXXXXX")
  trap 'rm -rf "$rootfs" "$rootfs.log"' EXIT
  echo "images.sh: building $base with debootstrap (about a minute)"
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >"$rootfs.log" 2>&1 ||
    die "debootstrap failed: $(tail -n5 "$rootfs.log")"
  # What the slim image leaves out too: docs, man pages, locales, apt caches.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/*
  tar -C "$rootfs" -c . | docker import -c 'CMD ["bash"]' - "$base" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
  trap - EXIT
fi

# Stage the binaries into the build context (deploy/bin/, ignored by git).
# Debug info is dropped (a dev build's is most of its size); the symbol
# table stays, so Fathom's own processes still profile with function names.
stage() {
  local src=$1 dst=$2
  if [ ! -f "$dst" ] || [ "$src" -nt "$dst" ] || [ "$(cat "$dst.src" 2>/dev/null)" != "$(realpath "$src")" ]; then
    objcopy --strip-debug "$src" "$dst.tmp" 2>/dev/null || cp "$src" "$dst.tmp"
    mv "$dst.tmp" "$dst"
    touch -r "$src" "$dst"
    realpath "$src" >"$dst.src"
  fi
}
stage "$bin" deploy/bin/fathom
stage "$garage" deploy/bin/garage

build() {
  local t0=$SECONDS
  local log
  log=$(docker build -q -f "$1" -t "$2" "${@:3}" . 2>&1) || die "docker build of $2 failed: $log"
  echo "images.sh: $2 ($(docker image inspect -f '{{.Size}}' "$2" | awk '{printf "%.0f MB", $1/1e6}'), $((SECONDS - t0)) s)"
}
build deploy/Dockerfile "fathom:$tag"
build deploy/agent.Dockerfile "fathom-agent:$tag" --build-arg "FATHOM_IMAGE=fathom:$tag"
build deploy/garage.Dockerfile "fathom-garage:$tag"
