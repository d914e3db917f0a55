import { Context, Duration, Effect, Fiber, Layer, Schedule, Semaphore } from "effect"
import { SqlClient } from "effect/sql"
import { Settings } from "../config/Live.js"
import { type RequestRow, sanitizeRow } from "./RequestRow.js"

const BLOCK = 1000
/** Rows kept while the database is unreachable; beyond this the oldest are dropped (and logged). */
const MAX_BUFFER = 200_000

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
  /** Queues a row (bounded and cleaned first); written by the batch writer, never on the caller's path. */
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

  let buffer: Array<RequestRow> = []
  let droppedRows = 0

  // Never called with no rows: a flush writes only a non-empty buffer, and a split halves two or more rows.
  const insert = (rows: ReadonlyArray<RequestRow>) =>
    sql`INSERT INTO request_log ${
      sql.insert(rows as unknown as readonly [Record<string, unknown>, ...Array<Record<string, unknown>>])
    } ON CONFLICT (id) DO NOTHING`.pipe(Effect.asVoid)

  /**
   * Writes the rows; when the database rejects the batch for its data, the batch is halved until each bad row
   * stands alone, and those rows go to `rejected` (a few extra inserts per bad row, never a retry loop).
   * Any other failure (database unreachable) fails, and the caller keeps the rows for the next attempt.
   */
  const insertOrSplit = (
    rows: ReadonlyArray<RequestRow>,
    rejected: Array<{ readonly id: number; readonly state: string }>
  ): Effect.Effect<void, unknown> =>
    insert(rows).pipe(Effect.catch((error) => {
      if (!isRowRejection(error)) return Effect.fail(error)
      if (rows.length === 1) {
        rejected.push({ id: rows[0]!.id, state: sqlState(error)! })
        return Effect.void
      }
      const half = rows.length >>> 1
      return insertOrSplit(rows.slice(0, half), rejected).pipe(
        Effect.andThen(insertOrSplit(rows.slice(half), rejected))
      )
    }))

  // Flushes run one at a time, so a flush also waits for a batch another flush is writing
  // ("everything queued so far" is in the database when it returns).
  const writing = yield* Semaphore.make(1)

  const flushOnce = Effect.suspend(() => {
    if (buffer.length === 0) return Effect.void
    const rows = buffer.splice(0, batch_size)
    const rejected: Array<{ readonly id: number; readonly state: string }> = []
    const reportRejected = Effect.suspend(() => {
      if (rejected.length === 0) return Effect.void
      droppedRows += rejected.length
      // Once per batch: how many, which ids, and the database's reasons (never the row contents).
      return Effect.logError(`request rows dropped: ${rejected.length} rejected by the database`).pipe(
        Effect.annotateLogs({
          ids: rejected.slice(0, 20).map((r) => r.id).join(","),
          sqlstates: [...new Set(rejected.map((r) => r.state))].join(",")
        })
      )
    })
    const putBack = Effect.suspend(() => {
      // Keep the rows not known to be bad for the next attempt (rows already written are skipped then by
      // ON CONFLICT); past the bound the oldest go, and the log says how many.
      const bad = new Set(rejected.map((r) => r.id))
      buffer = (bad.size === 0 ? rows : rows.filter((r) => !bad.has(r.id))).concat(buffer)
      const over = buffer.length - MAX_BUFFER
      if (over <= 0) return Effect.void
      buffer.splice(0, over)
      droppedRows += over
      return Effect.logError(`request rows dropped: ${over} (database unreachable, buffer full)`)
    })
    return insertOrSplit(rows, rejected).pipe(
      Effect.onInterrupt(() => Effect.andThen(reportRejected, putBack)),
      Effect.catch((error) =>
        reportRejected.pipe(
          Effect.andThen(putBack),
          Effect.andThen(Effect.logWarning("request rows not written; will retry", error)),
          Effect.andThen(Effect.fail(error))
        )
      ),
      Effect.andThen(reportRejected)
    )
  })
  const flushAll: Effect.Effect<void, unknown> = Effect.suspend(() =>
    buffer.length === 0 ? Effect.void : flushOnce.pipe(Effect.andThen(flushAll))
  )
  const flush: Effect.Effect<void> = writing.withPermits(1)(flushAll).pipe(Effect.catch(() => Effect.void))

  yield* flush.pipe(Effect.repeat(Schedule.spaced(Duration.millis(flush_ms))), Effect.forkScoped)
  // On shutdown (after the HTTP server has stopped) whatever is queued is written; what cannot be is reported.
  yield* Effect.addFinalizer(() =>
    flush.pipe(Effect.andThen(Effect.suspend(() =>
      buffer.length === 0
        ? Effect.void
        : Effect.logError(`request rows lost at shutdown: ${buffer.length} (database unreachable)`)
    )))
  )

  return RequestLog.of({
    nextId,
    nextIdNow: () => (next < end ? next++ : undefined),
    record: (row) => {
      const clean = sanitizeRow(row)
      if (clean === null) droppedRows++
      else buffer.push(clean)
    },
    flush,
    pending: () => buffer.length,
    dropped: () => droppedRows
  })
})

export const layer = Layer.effect(RequestLog, make)
