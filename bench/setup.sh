# Shared by bench/profile.sh and bench/cpu.sh (sourced): writes $OUT/gateway.yaml (the bench models routed to the
# shared bench's mock upstream on $MOCK_PORT, over $DEPLOYMENTS deployments when set; quotas out of the way),
# creates the bench account in $OUT/data and sets KEY to a fresh API key of it. Needs ROOT, OUT, MOCK_PORT, NODE.
# STATUS_REFRESH_SECONDS overrides status.refresh_seconds; MOCK_CONNECTIONS the connections to the mock (64).
"$NODE" -e '
  const Y = require(process.argv[1] + "/node_modules/yaml"); const fs = require("fs")
  const doc = Y.parse(fs.readFileSync(process.argv[1] + "/config/gateway.yaml", "utf8"))
  doc.dev_account = false
  doc.plans.default = { session_limit: 1e12, weekly_limit: 1e12, session_hours: 5 }
  doc.abuse = { burst: 1e9, window_seconds: 1, cooldown_seconds: 1 }
  // STATUS_REFRESH_SECONDS=3600 keeps the status refresh (aggregates over request_log) out of a measurement.
  if (process.env.STATUS_REFRESH_SECONDS) doc.status = { ...doc.status, refresh_seconds: Number(process.env.STATUS_REFRESH_SECONDS) }
  // BUSY_CONCURRENCY sets limits.busy_concurrency (0: the busy gate off).
  if (process.env.BUSY_CONCURRENCY) doc.limits = { ...doc.limits, busy_concurrency: Number(process.env.BUSY_CONCURRENCY) }
  doc.catalog.providers.mock = { kind: "openai-compatible", base_url: "http://127.0.0.1:" + process.argv[3] + "/v1", connections: Number(process.env.MOCK_CONNECTIONS ?? 64) }
  for (const id of ["gpt-4o-mini", "mock-chunks20-delay10"])
    doc.catalog.models.push({ id, owned_by: "bench", max_input_tokens: 100000, max_output_tokens: 4096,
      rate_limit_rpm: 1e9, concurrency: 1e6, ...(process.env.DEPLOYMENTS
        ? { deployments: Array.from({ length: Number(process.env.DEPLOYMENTS) }, (_, i) => ({ id: "d" + i, provider: "mock", model: id })) }
        : { route: { provider: "mock", model: id } }) })
  fs.writeFileSync(process.argv[2] + "/gateway.yaml", Y.stringify(doc))' "$ROOT" "$OUT" "$MOCK_PORT"
(cd "$ROOT" && WELLSPRING_CONFIG=$OUT/gateway.yaml WELLSPRING_DATA_DIR=$OUT/data "$NODE" --import tsx src/cli.ts account:create --username bench --display-name Bench >/dev/null 2>&1)
KEY=$(cd "$ROOT" && WELLSPRING_CONFIG=$OUT/gateway.yaml WELLSPRING_DATA_DIR=$OUT/data "$NODE" --import tsx src/cli.ts key:create --username bench 2>/dev/null | sed -n 's/.*API key: //p')
