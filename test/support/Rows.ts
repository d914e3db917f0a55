/**
 * Reading what a gateway under test stored. Request rows are written behind the response (batched), so readers
 * of `request_log` flush the writer first.
 */
import { Effect } from "effect"
import { type SqlClient as SqlClientNs, SqlClient } from "effect/sql"
import { RequestLog } from "../../src/telemetry/RequestLog.js"
import type { TestGateway } from "./Gateway.js"

/** Writes every queued request row now. */
export const flushRequestLog = (gw: Pick<TestGateway, "run">) => gw.run(Effect.flatMap(RequestLog, (log) => log.flush))

/** Flushes the request rows, then runs `read` on the gateway's database. */
export const afterFlush = <A, E>(
  gw: Pick<TestGateway, "run">,
  read: (sql: SqlClientNs.SqlClient) => Effect.Effect<A, E>
): Promise<A> =>
  gw.run(Effect.gen(function*() {
    yield* Effect.flatMap(RequestLog, (log) => log.flush)
    return yield* read(yield* SqlClient.SqlClient)
  }).pipe(Effect.orDie))

/** A raw SQL query on the gateway's database (no flush). */
export const query = <A extends object = Record<string, any>>(
  gw: Pick<TestGateway, "run">,
  text: string,
  params: Array<unknown> = []
) => gw.run(Effect.flatMap(SqlClient.SqlClient, (sql) => Effect.orDie(sql.unsafe<A>(text, params))))
