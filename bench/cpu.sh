#!/usr/bin/env bash
# Gateway CPU per request (user+sys of the whole process, worker threads included) under wrk load against the
# shared bench's mock upstream, embedded mode, no profiler. Same setup as bench/profile.sh.
#   bench/cpu.sh [chat|stream] [seconds] [connections] [repetitions]
# Prints one line per repetition: requests, requests/s, CPU µs/req. DEPLOYMENTS=3 routes over 3 deployments.
# PIN=1 pins as the shared bench does. THREADS=1 adds each thread's share of the CPU and its CPU µs per request. NOBUILD=1 skips `npm run build`; NODE_FLAGS adds flags to the gateway (e.g. --heap-prof); the heap bound is the shared bench's. DISTS="dist dist-base" runs one gateway per build folder (each on its own copy
# of the same data folder) and alternates them within every repetition: an A/B under the same foreign load.
# FLAGS0, FLAGS1, ... add node flags to the first, second, ... gateway only (an A/B of flags: DISTS="dist dist").
# PROD=1: production mode, PostgreSQL on 127.0.0.1:5432 (a fresh database per gateway) and Redis on 127.0.0.1:6379
# (db 4, flushed first); their own CPU is not counted, as in the shared bench. PROD_REDIS=0: PostgreSQL only
# (admission in memory).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=$(cd "$ROOT/../shared/bench" && pwd)
SCENARIO=${1:-chat}
SECONDS_=${2:-10}
CONNS=${3:-32}
REPS=${4:-3}
OUT=$(mktemp -d /tmp/wellspring-cpu.XXXXXX)
GW_PORT=${GW_PORT:-19110}
MOCK_PORT=${MOCK_PORT:-19111}
NODE=node; [[ -x $ROOT/node_modules/.bin/node ]] && NODE=$ROOT/node_modules/.bin/node
[[ ${NOBUILD:-0} == 1 ]] || (cd "$ROOT" && npm run -s build)
if [[ ${PROD:-0} == 1 ]]; then
  redis-cli -n 4 flushdb >/dev/null
  PROD_DB=wscpu_$$
  psql -q -h 127.0.0.1 -U root -d test -c "create database ${PROD_DB}_0" >/dev/null
  export DATABASE_URL=postgres://root@127.0.0.1:5432/${PROD_DB}_0
  [[ ${PROD_REDIS:-1} == 1 ]] && export REDIS_URL=redis://127.0.0.1:6379/4
fi
source "$ROOT/bench/setup.sh"
PORT=$MOCK_PORT "$NODE" "$BENCH/mock-upstream.mjs" >"$OUT/mock.log" 2>&1 &
PIDS=($!)
trap 'kill -INT "${PIDS[@]}" 2>/dev/null || true; wait "${PIDS[@]}" 2>/dev/null || true; [[ ${KEEP:-0} == 1 ]] && rm -rf /tmp/wellspring-cpu-data && cp -r "$OUT/data0" /tmp/wellspring-cpu-data; mkdir -p /tmp/wellspring-cpu-logs; cp "$OUT"/*.log /tmp/wellspring-cpu-logs/ 2>/dev/null; rm -rf "$OUT"; [[ -n ${PROD_DB:-} ]] && for d in $(psql -At -h 127.0.0.1 -U root -d test -c "select datname from pg_database where datname like '"'"'${PROD_DB}_%'"'"'"); do psql -q -h 127.0.0.1 -U root -d test -c "drop database $d" >/dev/null; done' EXIT
# PIN=1: the gateways on core 1 and wrk on core 0, as ../shared/bench runs them (wrk's timeout 5 s, as there)
PIN_GATEWAY=; PIN_WRK=; WRK_TIMEOUT=2s
[[ ${PIN:-0} == 1 ]] && { PIN_GATEWAY="taskset -c 1"; PIN_WRK="taskset -c 0"; WRK_TIMEOUT=5s; }
read -r -a DIRS <<<"${DISTS:-dist}"
GWS=()
SERVED=()
for i in "${!DIRS[@]}"; do
  mkdir -p "$OUT/data" && cp -r "$OUT/data" "$OUT/data$i"
  # production: one database per gateway, copied from the first before any gateway connects to it
  [[ ${PROD:-0} == 1 && $i -gt 0 ]] && psql -q -h 127.0.0.1 -U root -d test -c "create database ${PROD_DB}_$i template ${PROD_DB}_0" >/dev/null
done
for i in "${!DIRS[@]}"; do
  [[ ${PROD:-0} == 1 ]] && export DATABASE_URL=postgres://root@127.0.0.1:5432/${PROD_DB}_$i
  WELLSPRING_CONFIG=$OUT/gateway.yaml WELLSPRING_DATA_DIR=$OUT/data$i WELLSPRING_PORT=$((GW_PORT + 2 * i)) \
    $PIN_GATEWAY "$NODE" --max-old-space-size=160 ${NODE_FLAGS:-} $(eval echo "\${FLAGS$i:-}") "$ROOT/${DIRS[$i]}/main.js" >"$OUT/gateway$i.log" 2>&1 &
  PIDS+=($!); GWS+=($!)
done
BODY=$BENCH/bodies/chat.json; [[ $SCENARIO == stream ]] && BODY=$BENCH/bodies/chat-stream.json
export WRK_BODY_FILE=$BODY WRK_HEADERS="Authorization: Bearer $KEY"
HZ=$(getconf CLK_TCK)
# "name:tid ticks" per thread of a process (THREADS=1 prints each thread name's share of the CPU)
thread_ticks() {
  for t in /proc/$1/task/*; do
    echo "$(tr ' ' '_' <"$t/comm"):${t##*/} $(awk '{ print $14 + $15 }' "$t/stat")"
  done | sort
}
for i in "${!DIRS[@]}"; do
  port=$((GW_PORT + 2 * i))
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
  SERVED[$i]=$(wrk -t1 -c"$CONNS" -d3s -s "$BENCH/lib/wrk.lua" "http://127.0.0.1:$port/v1/chat/completions" | tail -1 | node -p 'JSON.parse(require("fs").readFileSync(0, "utf8")).requests')
done
for rep in $(seq "$REPS"); do
  for i in "${!DIRS[@]}"; do
    pid=${GWS[$i]}
    t0=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
    [[ ${THREADS:-0} == 1 ]] && threads0=$(thread_ticks "$pid")
    res=$($PIN_WRK wrk --timeout $WRK_TIMEOUT -t1 -c"$CONNS" -d"${SECONDS_}s" -s "$BENCH/lib/wrk.lua" "http://127.0.0.1:$((GW_PORT + 2 * i))/v1/chat/completions" | tail -1)
    t1=$(awk '{ print $14 + $15 }' "/proc/$pid/stat")
    node -e '
      const r = JSON.parse(process.argv[1]); const cpuUs = (process.argv[3] - process.argv[2]) / process.argv[4] * 1e6
      const errs = Object.entries(r.errors).filter(([, v]) => v > 0).map(([k, v]) => k + " " + v).join(" + ") || 0
      console.log(`${process.argv[5]} ${process.argv[6]} rep ${process.argv[7]}: ${r.requests} req, ${(r.requests / r.duration_us * 1e6).toFixed(0)} rps, ${(cpuUs / r.requests).toFixed(0)} µs CPU/req, errors ${errs}, p50/p99/max ${(r.lat_us.p50 / 1000).toFixed(0)}/${(r.lat_us.p99 / 1000).toFixed(0)}/${(r.lat_us.max / 1000).toFixed(0)} ms`)' \
      "$res" "$t0" "$t1" "$HZ" "${DIRS[$i]}" "$SCENARIO c=$CONNS" "$rep"
    reqs=$(node -p 'JSON.parse(process.argv[1]).requests' "$res")
    SERVED[$i]=$((SERVED[$i] + reqs))
    [[ ${THREADS:-0} == 1 ]] && join <(echo "$threads0") <(thread_ticks "$pid") | awk -v total=$((t1 - t0)) -v hz="$HZ" -v reqs="$reqs" '
      { d = $3 - $2; if (d > 0) { split($1, parts, ":"); by[parts[1]] += d } }
      END { for (k in by) printf "  %-16s %5.1f %%  %6.1f µs/req\n", k, 100 * by[k] / total, by[k] / hz * 1e6 / reqs }' | sort -k2 -nr
  done
done
for i in "${!DIRS[@]}"; do
  echo "${DIRS[$i]} peak RSS $(awk '/VmHWM/ { printf "%.0f MB", $2 / 1024 }' "/proc/${GWS[$i]}/status"), ${SERVED[$i]} requests served (warm-up included)"
  grep -iE "error|warn" "$OUT/gateway$i.log" | head -3 || true
done
