/**
 * Worker tokens (issue 17): what a remote image worker presents as `Authorization: Bearer wsw_…`. Issued by the
 * operator CLI (`worker:token:create`), shown once; only the SHA-256 is stored (`image_worker_tokens`), revoked
 * softly (`revoked_at`).
 *
 * Verification never reads the store per request: each replica keeps the active tokens' hashes (a few, one row per
 * GPU box) and compares the presented token's hash with every one of them in constant time. The set is reloaded
 * when it is `SNAPSHOT_TTL_MS` old, and on a miss when it is `MISS_RELOAD_MS` old (a token just issued works
 * within a second). A revocation is announced on the auth invalidation path (`key:<hash>`, Invalidation.ts): it
 * takes effect at once in this replica and, on PostgreSQL, in every replica; the embedded store has no listener,
 * so there it takes effect at the next reload (`SNAPSHOT_TTL_MS`). Failures count toward the per-address
 * failed-authentication limit through `Auth.authenticateWith`.
 */
import { Clock, Context, Effect, Layer, Semaphore } from "effect"
import type { HttpServerRequest } from "effect/http"
import { SqlClient } from "effect/sql"
import * as Crypto from "node:crypto"
import { Auth, bearerToken } from "../auth/Auth.js"
import { randomBase62 } from "../auth/KeyMaterial.js"
import { fail, type GatewayError } from "../errors/Catalog.js"

export const TOKEN_PREFIX = "wsw_"
const TOKEN_BODY_LENGTH = 43
export const TOKEN_LENGTH = TOKEN_PREFIX.length + TOKEN_BODY_LENGTH

/** How old the set of active tokens may get before a verification reloads it. */
export const SNAPSHOT_TTL_MS = 5_000
/** A token not in the set reloads it when the set is at least this old (at most one reload per interval). */
export const MISS_RELOAD_MS = 1_000
/** Active tokens a replica holds; more are not loaded (and a warning is logged). */
export const MAX_ACTIVE_TOKENS = 1_000
/** Revoked hashes remembered, so a reload that raced a revocation cannot bring a token back. */
const MAX_REVOKED_REMEMBERED = 4_096

export const WorkerMessages = {
  /** `invalid_api_key` on the worker API. */
  unauthorized: "워커 토큰이 없거나 올바르지 않거나 폐기되었습니다."
} as const

export const generateToken = (): string => TOKEN_PREFIX + randomBase62(TOKEN_BODY_LENGTH)

/** Shape check before any comparison: the prefix and 43 base62 characters. */
export const isWellFormedToken = (token: string): boolean =>
  token.length === TOKEN_LENGTH && token.startsWith(TOKEN_PREFIX) && /^[A-Za-z0-9]+$/.test(token.slice(TOKEN_PREFIX.length))

export const hashToken = (token: string): string => Crypto.hash("sha256", token, "hex")

/** A token's name: 1–64 characters after trimming, no control characters. */
export const validName = (name: string): boolean => {
  const trimmed = name.trim()
  return trimmed.length >= 1 && [...trimmed].length <= 64 && !/[\p{Cc}\p{Cf}\u2028\u2029]/u.test(trimmed)
}

export interface WorkerTokenRow {
  readonly id: number
  readonly name: string
  readonly token_hash: string
  readonly created_at: Date
  readonly revoked_at: Date | null
}

/** A verified token. */
export interface WorkerCredential {
  readonly tokenId: number
  readonly name: string
  /** SHA-256 (hex) of the token: what its revocation is announced under. */
  readonly hash: string
}

const normalize = (row: WorkerTokenRow): WorkerTokenRow => ({ ...row, id: Number(row.id) })

// ---------------------------------------------------------------------------------------------------------
// The table, over any SqlClient (the CLI and the service share these)

export const insertToken = (name: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const token = generateToken()
    const rows = yield* sql<WorkerTokenRow>`
      INSERT INTO image_worker_tokens (name, token_hash) VALUES (${name.trim()}, ${hashToken(token)}) RETURNING *`
    return { token, row: normalize(rows[0]!) }
  }).pipe(Effect.orDie)

export const listTokens = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<WorkerTokenRow>`SELECT * FROM image_worker_tokens ORDER BY id`
  return rows.map(normalize)
}).pipe(Effect.orDie)

/** Revokes an active token; null when there is no active token with this id. */
export const revokeToken = (id: number) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<WorkerTokenRow>`
      UPDATE image_worker_tokens SET revoked_at = now() WHERE id = ${id} AND revoked_at IS NULL RETURNING *`
    return rows[0] === undefined ? null : normalize(rows[0])
  }).pipe(Effect.orDie)

const activeTokens = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<Pick<WorkerTokenRow, "id" | "name" | "token_hash">>`
    SELECT id, name, token_hash FROM image_worker_tokens WHERE revoked_at IS NULL ORDER BY id LIMIT ${MAX_ACTIVE_TOKENS + 1}`
  return rows.map((row) => ({ id: Number(row.id), name: row.name, token_hash: row.token_hash }))
}).pipe(Effect.orDie)

// ---------------------------------------------------------------------------------------------------------
// The service

export class WorkerTokens extends Context.Service<WorkerTokens, {
  /** The token's credential, or null (malformed, unknown, revoked). Not counted: see `authenticate`. */
  readonly verify: (token: string) => Effect.Effect<WorkerCredential | null>
  /**
   * The bearer worker token of a request: 401 `invalid_api_key` when missing, malformed, unknown or revoked (counted
   * against the client address unless missing), 429 while the address is refused.
   */
  readonly authenticate: (request: HttpServerRequest.HttpServerRequest) => Effect.Effect<WorkerCredential, GatewayError>
  /** Completes when this credential's token is revoked (announced); never otherwise. */
  readonly revoked: (credential: WorkerCredential) => Effect.Effect<void>
  readonly issue: (name: string) => Effect.Effect<{ readonly token: string; readonly row: WorkerTokenRow }>
  readonly list: Effect.Effect<ReadonlyArray<WorkerTokenRow>>
  /** Revokes and announces the revocation; null when no active token has this id. */
  readonly revoke: (id: number) => Effect.Effect<WorkerTokenRow | null>
  /** Reads of the token table so far (tests). */
  readonly reloads: Effect.Effect<number>
}>()("wellspring/images/WorkerTokens") {}

interface Entry {
  readonly digest: Buffer
  readonly credential: WorkerCredential
}

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const auth = yield* Auth
  const lock = yield* Semaphore.make(1)
  let entries: ReadonlyArray<Entry> = []
  /** When the set in `entries` was read (its query's start); -Infinity: reload before the next use. */
  let loadedAt = Number.NEGATIVE_INFINITY
  let reloads = 0
  let warnedFull = false
  /** Bumped by an invalidation this version cannot read (a newer replica's): the set is read again. */
  let generation = 0
  const revokedHashes = new Set<string>()
  const waiters = new Map<string, Set<() => void>>()

  const forgetRevoked = (hash: string) => {
    revokedHashes.add(hash)
    for (const old of revokedHashes) {
      if (revokedHashes.size <= MAX_REVOKED_REMEMBERED) break
      revokedHashes.delete(old)
    }
    entries = entries.filter((entry) => entry.credential.hash !== hash)
    const waiting = waiters.get(hash)
    if (waiting !== undefined) {
      waiters.delete(hash)
      for (const wake of waiting) wake()
    }
  }

  // Revocations, this replica's and (on PostgreSQL) every other's. API keys' hashes pass through here too: they
  // match no worker token, and the remembered set is bounded.
  auth.subscribe((invalidation) => {
    if (invalidation._tag === "Key") forgetRevoked(invalidation.hash)
    else if (invalidation._tag === "Unknown") {
      generation++
      loadedAt = Number.NEGATIVE_INFINITY
    }
  })

  /** Reloads unless a reload that started at or after `since` already ran (concurrent callers share one). */
  const reload = (since: number) =>
    lock.withPermits(1)(Effect.suspend(() => {
      if (loadedAt >= since) return Effect.void
      const seen = generation
      return Effect.flatMap(Clock.currentTimeMillis, (started) =>
        Effect.flatMap(activeTokens.pipe(Effect.provideService(SqlClient.SqlClient, sql)), (rows) =>
          Effect.suspend(() => {
            reloads++
            // A token gone from the table was revoked without an announcement reaching us (the embedded CLI):
            // what waits on it learns now.
            const active = new Set(rows.map((row) => row.token_hash))
            for (const entry of entries) if (!active.has(entry.credential.hash)) forgetRevoked(entry.credential.hash)
            entries = rows
              .slice(0, MAX_ACTIVE_TOKENS)
              .filter((row) => !revokedHashes.has(row.token_hash))
              .map((row) => ({
                digest: Buffer.from(row.token_hash, "hex"),
                credential: { tokenId: row.id, name: row.name, hash: row.token_hash }
              }))
            // An unknown invalidation during the read: used for this call, read again for the next.
            loadedAt = seen === generation ? started : Number.NEGATIVE_INFINITY
            if (rows.length <= MAX_ACTIVE_TOKENS || warnedFull) return Effect.void
            warnedFull = true
            return Effect.logWarning(`more than ${MAX_ACTIVE_TOKENS} active worker tokens; only the oldest are accepted`)
          })))
    }))

  /** Compares with every active hash, without stopping at a match. */
  const find = (digest: Buffer): WorkerCredential | null => {
    let found: WorkerCredential | null = null
    for (const entry of entries) {
      if (Crypto.timingSafeEqual(entry.digest, digest)) found = entry.credential
    }
    return found
  }

  const verify = (token: string): Effect.Effect<WorkerCredential | null> =>
    Effect.suspend(() => {
      if (!isWellFormedToken(token)) return Effect.succeed(null)
      const digest = Crypto.createHash("sha256").update(token).digest()
      return Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const age = now - loadedAt
        if (age < SNAPSHOT_TTL_MS) {
          const hit = find(digest)
          if (hit !== null || age < MISS_RELOAD_MS) return Effect.succeed(hit)
        }
        return Effect.map(reload(now - (age < SNAPSHOT_TTL_MS ? MISS_RELOAD_MS : SNAPSHOT_TTL_MS)), () => find(digest))
      })
    })

  const authenticate = (request: HttpServerRequest.HttpServerRequest): Effect.Effect<WorkerCredential, GatewayError> => {
    const unauthorized = fail("invalid_api_key", { message: WorkerMessages.unauthorized })
    const header = request.headers.authorization
    // No credential at all: nothing guessed, not counted (as for API keys).
    if (header === undefined || header.trim() === "") return Effect.fail(unauthorized)
    const token = bearerToken(header)
    return auth.authenticateWith(auth.clientAddress(request), token === null ? Effect.succeed(null) : verify(token)).pipe(
      Effect.mapError((error) => (error.code === "invalid_api_key" ? unauthorized : error))
    )
  }

  /** Announced revocations wake at once; others are found by reading the table once per `SNAPSHOT_TTL_MS`. */
  const revoked = (credential: WorkerCredential): Effect.Effect<void> =>
    Effect.raceFirst(announcedRevocation(credential), unannouncedRevocation(credential))

  const unannouncedRevocation = (credential: WorkerCredential): Effect.Effect<void> =>
    Effect.sleep(SNAPSHOT_TTL_MS).pipe(
      Effect.andThen(Clock.currentTimeMillis),
      Effect.flatMap((now) => reload(now - SNAPSHOT_TTL_MS)),
      Effect.andThen(Effect.sync(() => revokedHashes.has(credential.hash))),
      Effect.repeat({ until: (gone) => gone }),
      Effect.asVoid
    )

  const announcedRevocation = (credential: WorkerCredential): Effect.Effect<void> =>
    Effect.callback<void>((resume) => {
      if (revokedHashes.has(credential.hash)) return resume(Effect.void)
      const wake = () => resume(Effect.void)
      const set = waiters.get(credential.hash) ?? new Set()
      set.add(wake)
      waiters.set(credential.hash, set)
      return Effect.sync(() => {
        set.delete(wake)
        if (set.size === 0 && waiters.get(credential.hash) === set) waiters.delete(credential.hash)
      })
    })

  const withSql = <A>(effect: Effect.Effect<A, never, SqlClient.SqlClient>) => Effect.provideService(effect, SqlClient.SqlClient, sql)

  return WorkerTokens.of({
    verify,
    authenticate,
    revoked,
    // A token issued here is accepted at once here; elsewhere after `MISS_RELOAD_MS`.
    issue: (name) => withSql(insertToken(name)).pipe(Effect.tap(() => Effect.sync(() => (loadedAt = Number.NEGATIVE_INFINITY)))),
    list: withSql(listTokens),
    revoke: (id) =>
      withSql(revokeToken(id)).pipe(Effect.tap((row) => (row === null ? Effect.void : auth.invalidateKeys([row.token_hash])))),
    reloads: Effect.sync(() => reloads)
  })
})

/** Needs the SqlClient and Auth (its failed-authentication count and invalidation path). */
export const layer = Layer.effect(WorkerTokens, make)
