#!/bin/bash
# One Garage node for the compose cluster and the container tests: writes its
# config, starts the server, and on first start lays the node out and creates
# the bucket and the key the Fathom roles use (idempotent: a restart finds
# them in /data and skips).
#   garage-entrypoint          run the node (the image's entrypoint)
#   garage-entrypoint ready    exit 0 once the bucket and key exist and S3 answers
#
# Environment:
#   GARAGE_BUCKET             bucket name (default fathom)
#   GARAGE_ACCESS_KEY_ID      key id, GK + 24 hex digits
#   GARAGE_SECRET_ACCESS_KEY  secret, 64 hex digits
#   GARAGE_RPC_SECRET         64 hex digits (default: derived from the secret)
set -euo pipefail

data=${GARAGE_DATA:-/data}
config="$data/garage.toml"
flag=/tmp/garage-initialized

s3_answers() {
  exec 3<>/dev/tcp/127.0.0.1/3900 || return 1
  printf 'GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  IFS=' ' read -r -t 3 proto _status _rest <&3 || return 1
  [[ $proto == HTTP/* ]]
}

if [ "${1:-}" = ready ]; then
  [ -f "$flag" ] && s3_answers
  exit
fi

bucket=${GARAGE_BUCKET:-fathom}
key_id=${GARAGE_ACCESS_KEY_ID:?set GARAGE_ACCESS_KEY_ID (GK followed by 24 hex digits)}
secret=${GARAGE_SECRET_ACCESS_KEY:?set GARAGE_SECRET_ACCESS_KEY (64 hex digits)}
rpc_secret=${GARAGE_RPC_SECRET:-$(printf '%s' "$secret" | sha256sum | cut -c1-64)}

# Garage logs every request at info (health checks included): warnings only
# unless RUST_LOG says otherwise.
export RUST_LOG=${RUST_LOG:-warn}
rm -f "$flag"
mkdir -p "$data/meta" "$data/data"
cat >"$config" <<TOML
metadata_dir = "$data/meta"
data_dir = "$data/data"
db_engine = "sqlite"
replication_factor = 1
rpc_bind_addr = "0.0.0.0:3901"
rpc_public_addr = "127.0.0.1:3901"
rpc_secret = "$rpc_secret"

[s3_api]
s3_region = "garage"
api_bind_addr = "0.0.0.0:3900"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "0.0.0.0:3903"
TOML

g() { garage -c "$config" "$@"; }

# Retries a garage CLI call while the node starts (up to 30 s).
retry() {
  local i
  for i in $(seq 1 100); do
    if out=$("$@" 2>&1); then
      printf '%s\n' "$out"
      return 0
    fi
    sleep 0.3
  done
  echo "garage-entrypoint: $* failed: $out" >&2
  return 1
}

g server &
server=$!
trap 'kill -TERM $server 2>/dev/null' TERM INT

if [ ! -f "$data/.fathom-initialized" ]; then
  node=$(retry g node id -q | head -n1 | cut -d@ -f1)
  if ! g layout show 2>/dev/null | grep -q "$(printf '%.16s' "$node")"; then
    retry g layout assign -z dc1 -c 1G "$node" >/dev/null
    retry g layout apply --version 1 >/dev/null
  fi
  g bucket info "$bucket" >/dev/null 2>&1 || retry g bucket create "$bucket" >/dev/null
  g key info "$key_id" >/dev/null 2>&1 || retry g key import --yes -n fathom "$key_id" "$secret" >/dev/null
  retry g bucket allow --read --write --owner "$bucket" --key "$key_id" >/dev/null
  touch "$data/.fathom-initialized"
  echo "garage-entrypoint: bucket $bucket and key $key_id created"
fi
# Ready once the S3 API answers.
until s3_answers 2>/dev/null; do sleep 0.2; done
touch "$flag"
echo "garage-entrypoint: ready"
wait $server
