import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * Request rows summed per minute, account, model and BYOK flag, kept by a trigger on every insert into
 * `request_log` (one aggregated upsert per statement, whatever writes the rows). The public status resources and
 * the leaderboard read whole minutes from here and only the partial minutes at the edges of their periods from
 * `request_log`, so a refresh costs what the number of minutes and active accounts costs, not what the day's rows
 * cost (telemetry/RequestQueries.ts). `failures` uses the status page's definition of a failure the model is to
 * blame for (`MODEL_FAILURE` there). Rows already written are summed here once.
 *
 * The upsert takes its row locks in key order, so two replicas writing batches at once never deadlock on it.
 */
export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE request_minutes (
      model_id text NOT NULL,
      minute timestamptz NOT NULL,
      account_id text NOT NULL,
      byok boolean NOT NULL,
      requests integer NOT NULL,
      successes integer NOT NULL,
      failures integer NOT NULL,
      ttfb_sum double precision NOT NULL,
      ttfb_count integer NOT NULL,
      tps_sum double precision NOT NULL,
      tps_count integer NOT NULL,
      input_tokens bigint NOT NULL,
      output_tokens bigint NOT NULL,
      PRIMARY KEY (model_id, minute, account_id, byok)
    )`
  yield* sql`CREATE INDEX request_minutes_minute ON request_minutes (minute)`
  const sums = (from: string) => `
    SELECT model_id, date_trunc('minute', created_at) AS minute, account_id, byok,
      count(*)::int AS requests,
      count(*) FILTER (WHERE status = 'success')::int AS successes,
      count(*) FILTER (WHERE status = 'error' AND http_status >= 500 AND http_status <> 529)::int AS failures,
      coalesce(sum(ttfb_ms) FILTER (WHERE status = 'success' AND ttfb_ms IS NOT NULL), 0)::float8 AS ttfb_sum,
      count(*) FILTER (WHERE status = 'success' AND ttfb_ms IS NOT NULL)::int AS ttfb_count,
      coalesce(sum(tps) FILTER (WHERE status = 'success' AND tps > 0), 0)::float8 AS tps_sum,
      count(*) FILTER (WHERE status = 'success' AND tps > 0)::int AS tps_count,
      coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
      coalesce(sum(output_tokens), 0)::bigint AS output_tokens
    FROM ${from}
    GROUP BY 1, 2, 3, 4
    ORDER BY 1, 2, 3, 4`
  yield* sql.unsafe(`INSERT INTO request_minutes ${sums("request_log")}`)
  yield* sql.unsafe(`
    CREATE FUNCTION request_minutes_add() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO request_minutes ${sums("new_rows")}
      ON CONFLICT (model_id, minute, account_id, byok) DO UPDATE SET
        requests = request_minutes.requests + EXCLUDED.requests,
        successes = request_minutes.successes + EXCLUDED.successes,
        failures = request_minutes.failures + EXCLUDED.failures,
        ttfb_sum = request_minutes.ttfb_sum + EXCLUDED.ttfb_sum,
        ttfb_count = request_minutes.ttfb_count + EXCLUDED.ttfb_count,
        tps_sum = request_minutes.tps_sum + EXCLUDED.tps_sum,
        tps_count = request_minutes.tps_count + EXCLUDED.tps_count,
        input_tokens = request_minutes.input_tokens + EXCLUDED.input_tokens,
        output_tokens = request_minutes.output_tokens + EXCLUDED.output_tokens;
      RETURN NULL;
    END
    $$`)
  yield* sql`
    CREATE TRIGGER request_log_minutes AFTER INSERT ON request_log
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION request_minutes_add()`
})
