#!/usr/bin/env bash
# Builds the fuzz targets (cargo fuzz, libFuzzer, AddressSanitizer) and runs
# each for a while, seeded from the real profiles in ../shared/testdata
# (read where they are, never copied into the repository), then prints one
# line of figures per target. Exits non-zero when a target crashes (the
# input is kept in fuzz/artifacts/<target>/; reproduce it with
# fuzz/target/x86_64-unknown-linux-gnu/release/<target> <file>).
#
#   fuzz/run.sh                      # every target, 15 s each
#   FUZZ_SECONDS=300 fuzz/run.sh     # a longer run
#   fuzz/run.sh pprof jfr            # some targets
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`); the stable toolchain takes
# libFuzzer's nightly flags with RUSTC_BOOTSTRAP=1. The working corpus
# grows in fuzz/corpus/<target>/ (not in git).
set -euo pipefail
cd "$(dirname "$0")"
secs=${FUZZ_SECONDS:-15}
testdata=$(cd "${FATHOM_TESTDATA:-../../shared/testdata}" && pwd)
all=(pprof pprof_legacy folded speedscope jfr otlp_proto otlp_json push_v1 selector flight_ticket write_record)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# The fuzz build has its own target directory and flags: never the
# workspace's (CARGO_TARGET_DIR would mix instrumented and plain builds).
unset CARGO_TARGET_DIR
export RUSTC_BOOTSTRAP=1
if [ ${#targets[@]} -eq 1 ]; then
  cargo fuzz build --codegen-units 16 "${targets[0]}"
else
  cargo fuzz build --codegen-units 16
fi
bin=target/x86_64-unknown-linux-gnu/release

seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT

# Files under $1 (a testdata folder) matching the find(1) tests that
# follow, at most 256 KiB each.
pick() {
  local dir=$1
  shift
  find "$testdata/$dir" -type f -size -257k "$@" ! -name MANIFEST.tsv ! -name '*.md' \
    ! -path '*/expected/*' -print
}

# Seeds of one target in $seeds/<target>: real inputs, gunzipped where the
# decoder takes raw bytes, with the selector byte of the targets that have
# one.
make_seeds() {
  local t=$1 d="$seeds/$1" i=0 f
  mkdir -p "$d"
  case $t in
    pprof) pick pprof | while read -r f; do cp "$f" "$d/$((i++))"; done ;;
    pprof_legacy)
      pick pprof | while read -r f; do
        case $f in *.gz) gzip -dc "$f" >"$d/$((i++))" 2>/dev/null || true ;; *) cp "$f" "$d/$((i++))" ;; esac
      done ;;
    folded) pick other/collapsed | while read -r f; do cp "$f" "$d/$((i++))"; done ;;
    speedscope) pick other/speedscope | while read -r f; do cp "$f" "$d/$((i++))"; done ;;
    jfr)
      # Recordings are a few MiB gunzipped: the smallest, without labels
      # (first byte 0) and with their labels snapshot (first byte 1: the
      # labels' length in 16-byte units follows in the upper bits).
      find "$testdata/jfr" -name '*.jfr.gz' -size -400k | while read -r f; do
        { printf '\000'; gzip -dc "$f"; } >"$d/$((i++))"
      done ;;
    otlp_proto) pick other/otlp -name '*.bin' | while read -r f; do cp "$f" "$d/$((i++))"; done ;;
    otlp_json) pick other/otlp -name '*.json' | while read -r f; do cp "$f" "$d/$((i++))"; done ;;
    push_v1)
      # Mode 2: a pprof wrapped into a one-series PushRequest.
      pick pprof -size -64k | while read -r f; do { printf '\002'; cat "$f"; } >"$d/$((i++))"; done ;;
    write_record)
      # Mode 1: a pprof, normalized and written as records of formats 3
      # and 2.
      pick pprof -size -64k | while read -r f; do { printf '\001'; cat "$f"; } >"$d/$((i++))"; done ;;
    selector)
      for s in '{}' 'process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="app"}' \
        '{service_name=~"a.*|b", env!="prod", region!~"eu-.+"}' 'memory:alloc_space:bytes:space:bytes{a="\"q\\"}' \
        'x{a="1",}' '{a=~"(?i)Ab[0-9]{2,}$"}'; do
        printf '%s' "$s" >"$d/$((i++))"
      done ;;
    flight_ticket)
      for s in '{"kind":"merge","query":"process_cpu:cpu:nanoseconds:cpu:nanoseconds{}","start":0,"end":1}' \
        '{"kind":"head","start":1,"end":2}' \
        '{"kind":"head_symbols","stacks":["00112233445566778899aabbccddeeff"]}' \
        '{"kind":"query_range","query":"{}","step":"10s","group_by":"a,b"}'; do
        printf '%s' "$s" >"$d/$((i++))"
      done ;;
  esac
}

status=0
printf '%-14s %12s %10s %12s %8s %8s\n' target executions exec/s peak_rss_mb crashes corpus
for t in "${targets[@]}"; do
  make_seeds "$t"
  mkdir -p "corpus/$t" "artifacts/$t"
  log="artifacts/$t/last-run.log"
  rc=0
  "$bin/$t" "corpus/$t" "$seeds/$t" -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/" >"$log" 2>&1 || rc=$?
  stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
  crashes=0
  if [ "$rc" -ne 0 ]; then
    crashes=1
    status=1
    echo "$t: libFuzzer exited with $rc; the input is in fuzz/artifacts/$t/:" >&2
    grep -E 'ERROR|panicked|SUMMARY|Test unit written' "$log" | head -20 >&2 || tail -30 "$log" >&2
  fi
  printf '%-14s %12s %10s %12s %8s %8s\n' "$t" "$(stat number_of_executed_units)" \
    "$(stat average_exec_per_sec)" "$(stat peak_rss_mb)" "$crashes" "$(ls "corpus/$t" | wc -l)"
done
exit $status
