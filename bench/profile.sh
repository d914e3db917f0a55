#!/usr/bin/env bash
# CPU profile of the compiled gateway (embedded mode) under wrk load against the shared bench's mock upstream.
#   bench/profile.sh [chat|stream] [seconds] [connections]
# Writes /tmp/wellspring-profile/*.cpuprofile and prints the top self-time functions and packages.
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
"$NODE" -e '
  const Y = require(process.argv[1] + "/node_modules/yaml"); const fs = require("fs")
  const doc = Y.parse(fs.readFileSync(process.argv[1] + "/config/gateway.yaml", "utf8"))
  doc.dev_account = false
  doc.plans.default = { session_limit: 1e12, weekly_limit: 1e12, session_hours: 5 }
  doc.abuse = { burst: 1e9, window_seconds: 1, cooldown_seconds: 1 }
  doc.catalog.providers.mock = { kind: "openai-compatible", base_url: "http://127.0.0.1:" + process.argv[3] + "/v1", connections: 64 }
  for (const id of ["gpt-4o-mini", "mock-chunks20-delay10"])
    doc.catalog.models.push({ id, owned_by: "bench", max_input_tokens: 100000, max_output_tokens: 4096,
      rate_limit_rpm: 1e9, concurrency: 1e6, ...(process.env.DEPLOYMENTS
        ? { deployments: Array.from({ length: Number(process.env.DEPLOYMENTS) }, (_, i) => ({ id: "d" + i, provider: "mock", model: id })) }
        : { route: { provider: "mock", model: id } }) })
  fs.writeFileSync(process.argv[2] + "/gateway.yaml", Y.stringify(doc))' "$ROOT" "$OUT" "$MOCK_PORT"
KEY=$(cd "$ROOT" && WELLSPRING_CONFIG=$OUT/gateway.yaml WELLSPRING_DATA_DIR=$OUT/data "$NODE" --import tsx src/cli.ts account:create --username bench --display-name Bench 2>/dev/null | tail -1 >/dev/null;
  cd "$ROOT" && WELLSPRING_CONFIG=$OUT/gateway.yaml WELLSPRING_DATA_DIR=$OUT/data "$NODE" --import tsx src/cli.ts key:create --username bench 2>/dev/null | sed -n 's/.*API key: //p')
PORT=$MOCK_PORT "$NODE" "$BENCH/mock-upstream.mjs" >"$OUT/mock.log" 2>&1 &
MOCK=$!
WELLSPRING_CONFIG=$OUT/gateway.yaml WELLSPRING_DATA_DIR=$OUT/data WELLSPRING_PORT=$GW_PORT \
  "$NODE" --max-old-space-size=160 --cpu-prof --cpu-prof-dir="$OUT" "$ROOT/dist/main.js" >"$OUT/gateway.log" 2>&1 &
GW=$!
trap 'kill $MOCK $GW 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$GW_PORT/healthz" >/dev/null && break; sleep 0.1; done
BODY=$BENCH/bodies/chat.json; [[ $SCENARIO == stream ]] && BODY=$BENCH/bodies/chat-stream.json
export WRK_BODY_FILE=$BODY WRK_HEADERS="Authorization: Bearer $KEY"
wrk -t1 -c"$CONNS" -d3s -s "$BENCH/lib/wrk.lua" "http://127.0.0.1:$GW_PORT/v1/chat/completions" >/dev/null
wrk -t1 -c"$CONNS" -d"${SECONDS_}s" -s "$BENCH/lib/wrk.lua" "http://127.0.0.1:$GW_PORT/v1/chat/completions"
kill -INT $GW; wait $GW 2>/dev/null || true
"$NODE" "$BENCH/lib/cpuprofile-top.mjs" "$OUT"/*.cpuprofile | head -70
