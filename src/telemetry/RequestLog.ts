import { SqlClient } from "@effect/sql"
import { Context, Duration, Effect, Fiber, Layer, Schedule } from "effect"
import { Settings } from "../config/Live.js"

export interface RequestRow {
  readonly id: number
  readonly request_id: string
  readonly account_id: string
  readonly key_id: number | null
  readonly model_id: string
  readonly status: "success" | "error" | "cancelled"
  readonly error_code: string | null
  readonly http_status: number
  readonly stream: boolean
  readonly input_tokens: number
  readonly output_tokens: number
  readonly reasoning_tokens: number
  readonly prompt_cached_tokens: number
  readonly weighted_cost: number
  readonly ttfb_ms: number | null
  readonly duration_ms: number
  readonly tps: number
  readonly had_tools: boolean
  readonly tool_choice: string | null
  readonly byok: boolean
  readonly provider: string | null
  readonly fell_back: boolean
  readonly error: string | null
  readonly created_at: Date
}

const BLOCK = 1000
/** Rows kept while the database is unreachable; beyond this the oldest are dropped (and logged). */
const MAX_BUFFER = 200_000

export class RequestLog extends Context.Tag("wellspring/telemetry/RequestLog")<RequestLog, {
  /** Next request row id, without a database round trip (ids come in blocks of 1000). */
  readonly nextId: Effect.Effect<number>
  /** Queues a row; written by the batch writer, never on the caller's path. */
  readonly record: (row: RequestRow) => void
  /** Writes everything queued so far. */
  readonly flush: Effect.Effect<void>
  readonly pending: () => number
}>() {}

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const { config } = yield* Settings
  const { batch_size, flush_ms } = config.request_log

  const fetchBlock = sql<{ start: number }>`SELECT nextval('request_log_id_blocks') AS start`.pipe(
    Effect.map((rows) => Number(rows[0]!.start)),
    Effect.retry(Schedule.exponential("50 millis").pipe(Schedule.compose(Schedule.recurs(5)))),
    Effect.orDie
  )
  let next = yield* fetchBlock
  let end = next + BLOCK
  // The next block, fetched in the background while the current one is used.
  let spare = yield* Effect.forkDaemon(fetchBlock)
  // One fiber at a time installs the next block; the others wait for it and then take ids from it.
  const switching = yield* Effect.makeSemaphore(1)

  const nextBlock: Effect.Effect<number> = switching.withPermits(1)(Effect.suspend(() => {
    if (next < end) return Effect.succeed(next++)
    // A spare block is always being fetched, so this wait is at most one round trip, once per 1000 rows.
    return Fiber.join(spare).pipe(
      // A spare fetch that failed (database down for a while) is retried here, on the caller's path.
      Effect.catchAllCause(() => fetchBlock),
      Effect.flatMap((start) =>
        Effect.map(Effect.forkDaemon(fetchBlock), (fiber) => {
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

  const writeBatch = (rows: ReadonlyArray<RequestRow>) =>
    sql`INSERT INTO request_log ${sql.insert(rows as unknown as Array<Record<string, unknown>>)} ON CONFLICT (id) DO NOTHING`.pipe(Effect.asVoid)

  // Flushes run one at a time, so a flush also waits for a batch another flush is writing
  // ("everything queued so far" is in the database when it returns).
  const writing = yield* Effect.makeSemaphore(1)

  const flushOnce = Effect.suspend(() => {
    if (buffer.length === 0) return Effect.void
    const rows = buffer.splice(0, batch_size)
    const putBack = Effect.suspend(() => {
      // Keep the rows for the next attempt; past the bound the oldest go, and the log says how many.
      buffer = rows.concat(buffer)
      const over = buffer.length - MAX_BUFFER
      if (over <= 0) return Effect.void
      buffer.splice(0, over)
      return Effect.logError(`request rows dropped: ${over} (database unreachable, buffer full)`)
    })
    return writeBatch(rows).pipe(
      Effect.onInterrupt(() => putBack),
      Effect.catchAll((error) =>
        putBack.pipe(
          Effect.zipRight(Effect.logWarning("request rows not written; will retry", error)),
          Effect.zipRight(Effect.fail(error))
        )
      )
    )
  })
  const flushAll: Effect.Effect<void, unknown> = Effect.suspend(() =>
    buffer.length === 0 ? Effect.void : flushOnce.pipe(Effect.zipRight(flushAll))
  )
  const flush: Effect.Effect<void> = writing.withPermits(1)(flushAll).pipe(Effect.catchAll(() => Effect.void))

  yield* flush.pipe(Effect.repeat(Schedule.spaced(Duration.millis(flush_ms))), Effect.forkScoped)
  yield* Effect.addFinalizer(() => flush)

  return RequestLog.of({
    nextId,
    record: (row) => {
      buffer.push(row)
    },
    flush,
    pending: () => buffer.length
  })
})

export const layer = Layer.scoped(RequestLog, make)
