/**
 * Stored responses of the Responses API, per account, in the gateway's database (table `stored_responses`,
 * migration 0007). Writes never wait on the database: `put` queues the serialized record in memory and a
 * background fiber inserts the queue in batches (every `responses.flush_ms`), then trims each account it wrote
 * for back under its bounds (bytes and count, oldest first). Reads (`get`, `chain`) happen only for
 * `previous_response_id` and `GET /v1/responses/{id}`; they look at the queue first, so a response can be
 * continued before its row is written (on the replica that answered it). Expired rows are never returned and
 * are deleted every `responses.sweep_minutes`.
 */
import { Context, Duration, Effect, Layer, Schedule, Semaphore } from "effect"
import { SqlClient } from "effect/sql"
import { Settings } from "../../config/Live.js"
import type { Message } from "../../upstream/Upstream.js"
import type { ResponsesConfig } from "../../config/Responses.js"

/** One response to keep. */
export interface NewStoredResponse {
  readonly id: string
  readonly accountId: string
  readonly previousId: string | null
  /** Epoch ms. */
  readonly createdAt: number
  /** This turn's input and output as chat messages (what a continuation replays). */
  readonly messages: ReadonlyArray<Message>
  /** The response object as answered (what `GET` returns). */
  readonly response: unknown
}

interface Row {
  readonly id: string
  readonly account_id: string
  readonly previous_id: string | null
  readonly created_at: Date
  readonly expires_at: Date
  readonly bytes: number
  readonly messages: string
  readonly response: string
}

/** A stored conversation up to a response: its messages oldest first, or why it cannot be replayed. */
export type Chain =
  | { readonly _tag: "Found"; readonly messages: ReadonlyArray<Message> }
  | { readonly _tag: "NotFound" }
  | { readonly _tag: "TooLong" }

/** Queued records kept while the database is unreachable; past this the oldest are dropped (and logged). */
const MAX_PENDING_BYTES = 64 * 1024 * 1024
/** Rows deleted per statement by the expiry sweep, and statements per sweep. */
const SWEEP_BATCH = 5_000
const SWEEP_ROUNDS = 20
const BATCH = 200

export class ResponseStore extends Context.Service<ResponseStore, {
  /**
   * Queues a response (serialized here; written by the batch writer). False when it is over
   * `max_response_bytes` and is not kept.
   */
  readonly put: (record: NewStoredResponse) => boolean
  /** The account's response object, unless missing, expired or another account's. */
  readonly get: (accountId: string, id: string, now: number) => Effect.Effect<unknown | null>
  /**
   * The conversation ending at `id` (its messages and those of the responses it continued, oldest first), at
   * most `maxDepth` responses and `max_chain_bytes`. A link that expired or was trimmed ends the chain there.
   */
  readonly chain: (accountId: string, id: string, now: number, maxDepth: number) => Effect.Effect<Chain>
  /** Deletes the account's response; false when there was none. */
  readonly remove: (accountId: string, id: string) => Effect.Effect<boolean>
  /** Writes everything queued so far. */
  readonly flush: Effect.Effect<void>
  /** Deletes responses expired at `now`; how many. */
  readonly sweep: (now: number) => Effect.Effect<number>
  readonly pending: () => number
}>()("wellspring/protocols/responses/ResponseStore") {}

interface Pending {
  readonly row: Row
}

export const make = Effect.fnUntraced(function*(config: ResponsesConfig) {
  const sql = yield* SqlClient.SqlClient
  const ttlMs = config.store_hours * 3_600_000
  /** Queued rows by id, in insertion order (Map keeps it), until written. */
  const pending = new Map<string, Pending>()
  let pendingBytes = 0
  /** Queued records dropped (queue over its bound) since the last flush reported them. */
  let lost = 0

  const drop = (id: string) => {
    const entry = pending.get(id)
    if (entry === undefined) return
    pending.delete(id)
    pendingBytes -= entry.row.bytes
  }

  const put = (record: NewStoredResponse): boolean => {
    const messages = JSON.stringify(record.messages)
    const response = JSON.stringify(record.response)
    const bytes = Buffer.byteLength(messages) + Buffer.byteLength(response)
    if (bytes > config.max_response_bytes) return false
    const row: Row = {
      id: record.id,
      account_id: record.accountId,
      previous_id: record.previousId,
      created_at: new Date(record.createdAt),
      expires_at: new Date(record.createdAt + ttlMs),
      bytes,
      messages,
      response
    }
    pending.set(row.id, { row })
    pendingBytes += bytes
    while (pendingBytes > MAX_PENDING_BYTES && pending.size > 1) {
      const oldest = pending.keys().next().value as string
      drop(oldest)
      lost++
    }
    return true
  }

  const insert = (rows: ReadonlyArray<Row>) =>
    sql`INSERT INTO stored_responses ${
      sql.insert(rows as unknown as readonly [Record<string, unknown>, ...Array<Record<string, unknown>>])
    } ON CONFLICT (id) DO NOTHING`

  /** Deletes the account's oldest responses past its byte and count bounds. */
  const trim = (accountId: string) =>
    sql`
      DELETE FROM stored_responses WHERE id IN (
        SELECT id FROM (
          SELECT id,
            sum(bytes) OVER (ORDER BY created_at DESC, id DESC) AS running,
            row_number() OVER (ORDER BY created_at DESC, id DESC) AS n
          FROM stored_responses WHERE account_id = ${accountId}
        ) ranked
        WHERE running > ${config.max_account_bytes} OR n > ${config.max_account_responses}
      )`

  const writing = yield* Semaphore.make(1)
  const flushOnce = Effect.suspend(() => {
    if (pending.size === 0) return Effect.void
    const rows: Array<Row> = []
    for (const { row } of pending.values()) {
      rows.push(row)
      if (rows.length >= BATCH) break
    }
    const accounts = [...new Set(rows.map((r) => r.account_id))]
    return insert(rows).pipe(
      Effect.andThen(Effect.forEach(accounts, trim, { discard: true })),
      Effect.andThen(Effect.sync(() => {
        for (const row of rows) drop(row.id)
      }))
    )
  })
  const flushAll: Effect.Effect<void, unknown> = Effect.suspend(() =>
    pending.size === 0 ? Effect.void : flushOnce.pipe(Effect.andThen(flushAll))
  )
  const flush: Effect.Effect<void> = writing.withPermits(1)(flushAll).pipe(
    Effect.catch((error) => Effect.logWarning("stored responses not written; will retry", error)),
    Effect.andThen(Effect.suspend(() => {
      if (lost === 0) return Effect.void
      const n = lost
      lost = 0
      return Effect.logError(`stored responses dropped: ${n} (database unreachable, queue full)`)
    }))
  )

  const pendingFor = (accountId: string, id: string, now: number): Row | null => {
    const row = pending.get(id)?.row
    return row !== undefined && row.account_id === accountId && row.expires_at.getTime() > now ? row : null
  }

  const get = (accountId: string, id: string, now: number): Effect.Effect<unknown | null> => {
    const queued = pendingFor(accountId, id, now)
    if (queued !== null) return Effect.succeed(JSON.parse(queued.response))
    return sql<{ response: string }>`
      SELECT response FROM stored_responses
      WHERE id = ${id} AND account_id = ${accountId} AND expires_at > ${new Date(now)}
    `.pipe(
      Effect.map((rows) => (rows.length === 0 ? null : JSON.parse(rows[0]!.response) as unknown)),
      Effect.orDie
    )
  }

  const chain: (accountId: string, id: string, now: number, maxDepth: number) => Effect.Effect<Chain> = Effect
    .fnUntraced(function*(accountId: string, id: string, now: number, maxDepth: number) {
      // Newest first: the queued links, then the rest from the database.
      const parts: Array<string> = []
      let total = 0
      let next: string | null = id
      while (next !== null && parts.length <= maxDepth) {
        const queued = pendingFor(accountId, next, now)
        if (queued === null) break
        parts.push(queued.messages)
        total += queued.bytes
        next = queued.previous_id
      }
      if (parts.length > maxDepth) return { _tag: "TooLong" } as const
      if (next !== null) {
        if (parts.length >= maxDepth) return { _tag: "TooLong" } as const
        const remaining = maxDepth - parts.length
        // One row more than allowed, to tell a chain that is too long.
        const links = yield* sql<{ id: string; bytes: number; depth: number }>`
          WITH RECURSIVE chain(id, previous_id, bytes, depth) AS (
            SELECT id, previous_id, bytes, 1 FROM stored_responses
            WHERE id = ${next} AND account_id = ${accountId} AND expires_at > ${new Date(now)}
            UNION ALL
            SELECT r.id, r.previous_id, r.bytes, c.depth + 1
            FROM stored_responses r JOIN chain c ON r.id = c.previous_id
            WHERE r.account_id = ${accountId} AND r.expires_at > ${new Date(now)} AND c.depth <= ${remaining}
          )
          SELECT id, bytes, depth FROM chain ORDER BY depth
        `.pipe(Effect.orDie)
        if (links.length === 0 && parts.length === 0) return { _tag: "NotFound" } as const
        if (links.length > remaining) return { _tag: "TooLong" } as const
        for (const link of links) total += link.bytes
        if (total > config.max_chain_bytes) return { _tag: "TooLong" } as const
        if (links.length > 0) {
          const rows = yield* sql<{ id: string; messages: string }>`
            SELECT id, messages FROM stored_responses
            WHERE id IN ${sql.in(links.map((l) => l.id))} AND account_id = ${accountId}
          `.pipe(Effect.orDie)
          const byId = new Map(rows.map((r) => [r.id, r.messages]))
          for (const link of links) {
            const text = byId.get(link.id)
            // Deleted between the two reads: the chain ends there.
            if (text === undefined) break
            parts.push(text)
          }
        }
      }
      if (total > config.max_chain_bytes) return { _tag: "TooLong" } as const
      const messages: Array<Message> = []
      for (let i = parts.length - 1; i >= 0; i--) {
        for (const m of JSON.parse(parts[i]!) as Array<Message>) messages.push(m)
      }
      return { _tag: "Found", messages } as const
    })

  const remove = (accountId: string, id: string): Effect.Effect<boolean> =>
    Effect.suspend(() => {
      const queued = pending.get(id)?.row
      const wasQueued = queued !== undefined && queued.account_id === accountId
      if (wasQueued) drop(id)
      return sql<{ id: string }>`
        DELETE FROM stored_responses WHERE id = ${id} AND account_id = ${accountId} RETURNING id
      `.pipe(Effect.map((rows) => wasQueued || rows.length > 0), Effect.orDie)
    })

  const sweep = (now: number): Effect.Effect<number> => {
    const round = sql<{ id: string }>`
      DELETE FROM stored_responses WHERE id IN (
        SELECT id FROM stored_responses WHERE expires_at <= ${new Date(now)} LIMIT ${SWEEP_BATCH}
      ) RETURNING id
    `.pipe(Effect.map((rows) => rows.length))
    const loop = (done: number, rounds: number): Effect.Effect<number, unknown> =>
      Effect.flatMap(round, (n) =>
        n < SWEEP_BATCH || rounds + 1 >= SWEEP_ROUNDS ? Effect.succeed(done + n) : loop(done + n, rounds + 1))
    return loop(0, 0).pipe(
      Effect.catch((error) => Effect.as(Effect.logWarning("expired stored responses not deleted; will retry", error), 0))
    )
  }

  yield* flush.pipe(Effect.repeat(Schedule.spaced(Duration.millis(config.flush_ms))), Effect.forkScoped)
  yield* Effect.suspend(() => Effect.flatMap(Effect.clockWith((clock) => clock.currentTimeMillis), sweep)).pipe(
    Effect.repeat(Schedule.spaced(Duration.minutes(config.sweep_minutes))),
    Effect.forkScoped
  )
  // On shutdown (after the HTTP server has stopped) whatever is queued is written.
  yield* Effect.addFinalizer(() =>
    flush.pipe(Effect.andThen(Effect.suspend(() =>
      pending.size === 0
        ? Effect.void
        : Effect.logError(`stored responses lost at shutdown: ${pending.size} (database unreachable)`)
    )))
  )

  return ResponseStore.of({ put, get, chain, remove, flush, sweep, pending: () => pending.size })
})

export const layer = Layer.effect(
  ResponseStore,
  Effect.flatMap(Settings, ({ config }) => make(config.responses))
)
