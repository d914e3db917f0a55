#!/usr/bin/env bash
# CPU profile of the compiled gateway (embedded mode) under wrk load against the shared bench's mock upstream.
#   bench/profile.sh [chat|stream] [seconds] [connections]
# Writes /tmp/wellspring-profile/*.cpuprofile and prints the top self-time functions and packages. The gateway runs
# on core 1 and the mock and wrk on core 0, as the shared bench places them. DIST=folder profiles another build.
# Needs wrk (apt) and ../shared/bench.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=$(cd "$ROOT/../shared/bench" && pwd)
SCENARIO=${1:-chat}
SECONDS_=${2:-10}
CONNS=${3:-32}
OUT=/tmp/wellspring-profile
GW_PORT=19100
MOCK_PORT=19101
NODE=node; [[ -x $ROOT/node_modules/.bin/node ]] && NODE=$ROOT/node_modules/.bin/node
rm -rf "$OUT" && mkdir -p "$OUT"
(cd "$ROOT" && npm run -s build)
source "$ROOT/bench/setup.sh"
taskset -c 0 env PORT=$MOCK_PORT "$NODE" "$BENCH/mock-upstream.mjs" >"$OUT/mock.log" 2>&1 &
MOCK=$!
WELLSPRING_CONFIG=$OUT/gateway.yaml WELLSPRING_DATA_DIR=$OUT/data WELLSPRING_PORT=$GW_PORT \
  taskset -c 1 "$NODE" --max-old-space-size=160 --cpu-prof --cpu-prof-dir="$OUT" "$ROOT/${DIST:-dist}/main.js" >"$OUT/gateway.log" 2>&1 &
GW=$!
trap 'kill $MOCK $GW 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$GW_PORT/healthz" >/dev/null && break; sleep 0.1; done
BODY=$BENCH/bodies/chat.json; [[ $SCENARIO == stream ]] && BODY=$BENCH/bodies/chat-stream.json
export WRK_BODY_FILE=$BODY WRK_HEADERS="Authorization: Bearer $KEY"
taskset -c 0 wrk -t1 -c"$CONNS" -d3s -s "$BENCH/lib/wrk.lua" "http://127.0.0.1:$GW_PORT/v1/chat/completions" >/dev/null
taskset -c 0 wrk -t1 -c"$CONNS" -d"${SECONDS_}s" -s "$BENCH/lib/wrk.lua" "http://127.0.0.1:$GW_PORT/v1/chat/completions"
kill -INT $GW; wait $GW 2>/dev/null || true
"$NODE" "$BENCH/lib/cpuprofile-top.mjs" "$OUT"/*.cpuprofile | head -70
