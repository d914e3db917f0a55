#!/usr/bin/env bash
# Per-request counts of the compiled gateway (embedded mode) under wrk load that do not move with the machine's
# other load, for A/B work where CPU time is too noisy to settle a few percent: bytes allocated on the main thread
# and the sites allocating the most (V8's sampling heap profiler), young- and old-generation collections, and
# system calls by name (strace, when installed). Same setup as bench/cpu.sh; pinned as the shared bench pins.
#   bench/counts.sh [chat|stream] [seconds] [connections]
# NOBUILD=1 skips `npm run build`; DIST=folder runs another build; TOP=n sites (20).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=$(cd "$ROOT/../shared/bench" && pwd)
SCENARIO=${1:-chat}
SECONDS_=${2:-5}
CONNS=${3:-32}
OUT=$(mktemp -d /tmp/wellspring-counts.XXXXXX)
GW_PORT=${GW_PORT:-19120}
MOCK_PORT=${MOCK_PORT:-19121}
NODE=node; [[ -x $ROOT/node_modules/.bin/node ]] && NODE=$ROOT/node_modules/.bin/node
[[ ${NOBUILD:-0} == 1 ]] || (cd "$ROOT" && npm run -s build)
source "$ROOT/bench/setup.sh"
taskset -c 0 env PORT=$MOCK_PORT "$NODE" "$BENCH/mock-upstream.mjs" >"$OUT/mock.log" 2>&1 &
MOCK=$!
ALLOC_PROFILE=$OUT/alloc.json WELLSPRING_CONFIG=$OUT/gateway.yaml WELLSPRING_DATA_DIR=$OUT/data WELLSPRING_PORT=$GW_PORT \
  taskset -c 1 "$NODE" --max-old-space-size=160 --trace-gc --import "$ROOT/bench/alloc-sampler.mjs" \
  "$ROOT/${DIST:-dist}/main.js" >"$OUT/gateway.log" 2>&1 &
GW=$!
trap 'kill $MOCK $GW 2>/dev/null || true; rm -rf "$OUT"' EXIT
for _ in $(seq 200); do curl -sf "http://127.0.0.1:$GW_PORT/healthz" >/dev/null && break; sleep 0.1; done
BODY=$BENCH/bodies/chat.json; [[ $SCENARIO == stream ]] && BODY=$BENCH/bodies/chat-stream.json
export WRK_BODY_FILE=$BODY WRK_HEADERS="Authorization: Bearer $KEY"
load() { # seconds -> requests served
  taskset -c 0 wrk -t1 -c"$CONNS" -d"$1s" --timeout 5s -s "$BENCH/lib/wrk.lua" "http://127.0.0.1:$GW_PORT/v1/chat/completions" \
    | tail -1 | "$NODE" -p 'const r = JSON.parse(require("fs").readFileSync(0, "utf8")); r.requests'
}
gcs() { echo "$(grep -c 'Scavenge' "$OUT/gateway.log" || true) $(grep -c 'Mark-Compact' "$OUT/gateway.log" || true)"; }
load 3 >/dev/null
echo "$SCENARIO c=$CONNS, ${SECONDS_} s per measurement"
read -r s0 m0 <<<"$(gcs)"
kill -USR2 $GW
reqs=$(load "$SECONDS_")
kill -USR2 $GW
read -r s1 m1 <<<"$(gcs)"
for _ in $(seq 100); do [[ -s $OUT/alloc.json ]] && break; sleep 0.1; done
"$NODE" "$ROOT/bench/alloc-summary.mjs" "$OUT/alloc.json" "$reqs" "${TOP:-20}"
awk -v s=$((s1 - s0)) -v m=$((m1 - m0)) -v r="$reqs" \
  'BEGIN { printf "collections per 1,000 requests: %.2f young, %.3f old (sampling on)\n", 1000 * s / r, 1000 * m / r }'
if command -v strace >/dev/null; then
  strace -f -c -p $GW -o "$OUT/strace.txt" 2>/dev/null &
  TRACE=$!
  sleep 0.5
  reqs=$(load "$SECONDS_")
  kill -INT $TRACE; wait $TRACE 2>/dev/null || true
  echo "system calls per request (all threads, under strace):"
  awk -v r="$reqs" '$NF ~ /^[a-z_0-9]+$/ && $4 ~ /^[0-9]+$/ && $NF != "total" { printf "  %-14s %.2f\n", $NF, $4 / r }' "$OUT/strace.txt" \
    | sort -k2 -nr | head -8
fi
