import { PgTypes } from "@effect/sql-pg"
import { Context, Duration, Effect, Fiber, Layer, Result, Schedule, Semaphore } from "effect"
import { SqlClient } from "effect/sql"
import { Settings } from "../config/Live.js"
import * as Batcher from "../runtime/Batcher.js"
import { REQUEST_ROW_TYPES, type RequestRow, sanitizeRow } from "./RequestRow.js"

const BLOCK = 1000
/** Rows kept while the database is unreachable; beyond this the oldest are dropped (and logged). */
const MAX_BUFFER = 200_000

const COLUMNS = Object.keys(REQUEST_ROW_TYPES) as Array<keyof typeof REQUEST_ROW_TYPES>

/**
 * A batch of rows as one array per column, expanded into rows by `unnest`: the statement text and its 27
 * parameter types are the same for every batch, so the database parses and plans it once per connection, and
 * each value travels in binary. A VALUES list (27 parameters per row, typed by each batch's values) was parsed
 * and planned again for every batch (docs/decisions.md, "Request rows as one array per column").
 */
const INSERT_ROWS = `INSERT INTO request_log (${COLUMNS.join(", ")})
  SELECT * FROM unnest(${COLUMNS.map((c, i) => `$${i + 1}::${REQUEST_ROW_TYPES[c]}[]`).join(", ")})
  ON CONFLICT (id) DO NOTHING`

const ELEMENT_OIDS = {
  int8: PgTypes.OID.int8,
  int4: PgTypes.OID.int4,
  float8: PgTypes.OID.float8,
  bool: PgTypes.OID.bool,
  text: PgTypes.OID.text,
  timestamptz: PgTypes.OID.timestamptz
} as const

/** The parameters of `INSERT_ROWS`: one typed array per column. */
const columnArrays = (rows: ReadonlyArray<RequestRow>): Array<PgTypes.Parameter> =>
  COLUMNS.map((column) =>
    Result.getOrThrow(PgTypes.array(rows.map((row) => row[column]), ELEMENT_OIDS[REQUEST_ROW_TYPES[column]]))
  )

/** SQLSTATE of a database error in `error`'s cause chain; undefined for network errors (no server answer). */
export const sqlState = (error: unknown): string | undefined => {
  let current = error
  for (let depth = 0; depth < 8 && current !== null && typeof current === "object"; depth++) {
    const { code, severity } = current as { code?: unknown; severity?: unknown }
    // pg's DatabaseError carries the server's severity; Node's socket errors (ECONNREFUSED, EPIPE) do not.
    if (typeof code === "string" && typeof severity === "string" && /^[0-9A-Z]{5}$/.test(code)) return code
    current = (current as { cause?: unknown }).cause
  }
  return undefined
}

/**
 * True when the database refused the rows themselves (data exception, constraint, program limit such as an
 * index row too large): retrying the same rows fails the same way. Anything else (unreachable, shutting down,
 * too many connections, a missing table during a migration) may pass later.
 */
export const isRowRejection = (error: unknown): boolean => {
  const state = sqlState(error)
  if (state === undefined) return false
  const cls = state.slice(0, 2)
  return cls === "22" || cls === "23" || cls === "54"
}

export class RequestLog extends Context.Service<RequestLog, {
  /** Next request row id, without a database round trip (ids come in blocks of 1000). */
  readonly nextId: Effect.Effect<number>
  /** `nextId` when the current block has one left (no wait), else undefined. */
  readonly nextIdNow: () => number | undefined
  /** Queues a row (bounded and cleaned first); written by the batched writer (`runtime/Batcher.ts`), never on the caller's path. */
  readonly record: (row: RequestRow) => void
  /** Writes everything queued so far (rows the database rejects are dropped; see `dropped`). */
  readonly flush: Effect.Effect<void>
  readonly pending: () => number
  /** Rows dropped since start: rejected by the database, unusable, or over the buffer while it was down. */
  readonly dropped: () => number
}>()("wellspring/telemetry/RequestLog") {}

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const { config } = yield* Settings
  const { batch_size, flush_ms } = config.request_log

  const fetchBlock = sql<{ start: number }>`SELECT nextval('request_log_id_blocks') AS start`.pipe(
    Effect.map((rows) => Number(rows[0]!.start)),
    Effect.retry({ schedule: Schedule.exponential("50 millis"), times: 5 }),
    Effect.orDie
  )
  let next = yield* fetchBlock
  let end = next + BLOCK
  // The next block, fetched in the background while the current one is used.
  let spare = yield* Effect.forkDetach(fetchBlock)
  // One fiber at a time installs the next block; the others wait for it and then take ids from it.
  const switching = yield* Semaphore.make(1)

  const nextBlock: Effect.Effect<number> = switching.withPermits(1)(Effect.suspend(() => {
    if (next < end) return Effect.succeed(next++)
    // A spare block is always being fetched, so this wait is at most one round trip, once per 1000 rows.
    return Fiber.join(spare).pipe(
      // A spare fetch that failed (database down for a while) is retried here, on the caller's path.
      Effect.catchCause(() => fetchBlock),
      Effect.flatMap((start) =>
        Effect.map(Effect.forkDetach(fetchBlock), (fiber) => {
          spare = fiber
          next = start
          end = start + BLOCK
          return next++
        })
      )
    )
  }))

  const nextId: Effect.Effect<number> = Effect.suspend(() => (next < end ? Effect.succeed(next++) : nextBlock))

  /** Rows `sanitizeRow` refused (unusable); the writer counts the ones the database refused. */
  let unusable = 0

  // Never called with no rows: the writer takes only non-empty batches, and a split halves two or more rows.
  const insert = (rows: ReadonlyArray<RequestRow>) =>
    Effect.suspend(() => sql.unsafe(INSERT_ROWS, columnArrays(rows))).pipe(Effect.asVoid)

  interface Rejected {
    readonly row: RequestRow
    readonly state: string
  }

  /**
   * Writes the rows; when the database rejects the batch for its data, the batch is halved until each bad row
   * stands alone, and those rows go to `rejected` (a few extra inserts per bad row, never a retry loop).
   * Any other failure (database unreachable) fails, and the writer keeps the rows for the next attempt.
   */
  const insertOrSplit = (rows: ReadonlyArray<RequestRow>, rejected: Array<Rejected>): Effect.Effect<void, unknown> =>
    insert(rows).pipe(Effect.catch((error) => {
      if (!isRowRejection(error)) return Effect.fail(error)
      if (rows.length === 1) {
        rejected.push({ row: rows[0]!, state: sqlState(error)! })
        return Effect.void
      }
      const half = rows.length >>> 1
      return insertOrSplit(rows.slice(0, half), rejected).pipe(
        Effect.andThen(insertOrSplit(rows.slice(half), rejected))
      )
    }))

  // Rows already written when a batch is retried are skipped by ON CONFLICT.
  const writer = yield* Batcher.queue<RequestRow>({
    label: "request rows",
    interval: Duration.millis(flush_ms),
    batchSize: batch_size,
    maxPending: MAX_BUFFER,
    write: (rows, drop) => {
      const rejected: Array<Rejected> = []
      return insertOrSplit(rows, rejected).pipe(Effect.ensuring(Effect.suspend(() => {
        if (rejected.length === 0) return Effect.void
        for (const r of rejected) drop(r.row)
        // Once per batch: how many, which ids, and the database's reasons (never the row contents).
        return Effect.logError(`request rows dropped: ${rejected.length} rejected by the database`).pipe(
          Effect.annotateLogs({
            ids: rejected.slice(0, 20).map((r) => r.row.id).join(","),
            sqlstates: [...new Set(rejected.map((r) => r.state))].join(",")
          })
        )
      })))
    }
  })

  return RequestLog.of({
    nextId,
    nextIdNow: () => (next < end ? next++ : undefined),
    record: (row) => {
      const clean = sanitizeRow(row)
      if (clean === null) unusable++
      else writer.add(clean)
    },
    flush: writer.flush,
    pending: writer.pending,
    dropped: () => unusable + writer.dropped()
  })
})

export const layer = Layer.effect(RequestLog, make)
