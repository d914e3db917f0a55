import { PgClient } from "@effect/sql-pg"
import { Clock, Context, Deferred, Duration, Effect, Exit, Fiber, Layer, Option, Schedule, Stream } from "effect"
import type { HttpServerRequest } from "effect/http"
import type { SqlClient } from "effect/sql"
import { randomUUID } from "node:crypto"
import { Settings } from "../config/Live.js"
import { AuthMessages, fail, type GatewayError } from "../errors/Catalog.js"
import * as ClientAddress from "../http/ClientAddress.js"
import { headersOf } from "../http/Respond.js"
import * as Batcher from "../runtime/Batcher.js"
import { MAX_TRACKED_KEYS } from "../runtime/RateWindow.js"
import { CurrentTelemetry } from "../telemetry/Telemetry.js"
import * as FailedAuth from "./FailedAuth.js"
import * as Invalidation from "./Invalidation.js"
import { hashKey, isWellFormed } from "./KeyMaterial.js"
import * as KeyStore from "./KeyStore.js"
import type { AccountRow, KeyRow } from "./Rows.js"

export interface Caller {
  readonly account: AccountRow
  /** The key used, or null for a cookie session. */
  readonly key: KeyRow | null
}

interface CacheEntry {
  readonly caller: Caller | null
  readonly expiresAt: number
}

/**
 * A cached key used within this long of its entry's expiry is looked up again in the background, so that a key in
 * steady use never expires under its requests (each expiry would otherwise send every concurrent request of the
 * key to the database at once).
 */
export const REFRESH_AHEAD_MS = 15_000

/** A key's `last_used_at` is written at most this often per replica. */
const TOUCH_EVERY_MS = 60_000
/** Stamps per write, and stamps kept while the database is away (one per key per minute at most). */
const TOUCH_BATCH = 1000
const MAX_PENDING_TOUCHES = 100_000

/** Longest session token we bother hashing; real tokens are 48 base62 characters. */
export const MAX_SESSION_TOKEN_LENGTH = 256

/** Unknown session tokens remembered at once (beyond it the oldest go first). */
const MAX_UNKNOWN_SESSIONS = MAX_TRACKED_KEYS

/** Reads that reached the key store since start (diagnostics and tests). */
export interface StoreLookups {
  readonly keys: number
  readonly sessions: number
  /** Background refreshes of cached keys under way (`REFRESH_AHEAD_MS`). */
  readonly refreshing: number
}

/**
 * Authentication. Every credential is resolved here, counted against the client address it came from
 * (`FailedAuth.ts`): an address past `limits.failed_auth_per_minute` failures in the last minute gets 429
 * `too_many_failed_requests` before any lookup; only a key already in the positive cache is still served.
 */
export class Auth extends Context.Service<Auth, {
  /**
   * Resolves a bearer key from `client` (a counted address) through the cache; 401 `invalid_api_key` otherwise
   * (counted unless no credential was sent), 429 while the address is refused.
   */
  readonly authenticateKey: (authorization: string | undefined, client: string) => Effect.Effect<Caller, GatewayError>
  /** Resolves a `ws-session` cookie token from `client`; null when unknown (counted), 429 while the address is refused. */
  readonly authenticateSession: (token: string, client: string) => Effect.Effect<Caller | null, GatewayError>
  /**
   * Another kind of credential (a worker token) from `client`, under the same failed-authentication count as keys:
   * 429 while the address is refused; `check` counts as a lookup under way while it runs, and its null (unknown
   * or malformed credential) is a counted failure, 401 `invalid_api_key`.
   */
  readonly authenticateWith: <A>(client: string, check: Effect.Effect<A | null, GatewayError>) => Effect.Effect<A, GatewayError>
  /**
   * The bearer key of a request, counted against its client address: how every `/v1` route authenticates. With
   * `xApiKey`, a request without `Authorization` may send the key in `x-api-key` (Anthropic clients), counted the same.
   */
  readonly bearer: (request: HttpServerRequest.HttpServerRequest, xApiKey?: boolean) => Effect.Effect<Caller, GatewayError>
  /** The counted address of a request (`http/ClientAddress.ts` with `trusted_proxies`). */
  readonly clientAddress: (request: HttpServerRequest.HttpServerRequest) => string
  /** Key and session reads that reached the store so far. */
  readonly storeLookups: Effect.Effect<StoreLookups>
  /** Bearer keys answered from the cache (valid or known unknown) and read from the store, since start (metrics). */
  readonly keyCache: () => { readonly hits: number; readonly misses: number }
  /** Drops cached entries of these key hashes (and announces it to other replicas). */
  readonly invalidateKeys: (hashes: ReadonlyArray<string>) => Effect.Effect<void>
  /** Drops cached entries of an account (status or profile change). */
  readonly invalidateAccount: (accountId: string) => Effect.Effect<void>
  /** Announces a change of an account's BYOK credentials to this replica's and every other replica's listeners. */
  readonly invalidateCredentials: (accountId: string) => Effect.Effect<void>
  /**
   * Calls `listener` with every invalidation this replica sees, its own and other replicas' (BYOK credentials use
   * the key path). Listeners run synchronously and must not throw.
   */
  readonly subscribe: (listener: (invalidation: Invalidation.Invalidation) => void) => void
  /**
   * The hot path's synchronous `bearer`: the caller of a key this replica has cached as valid (counted and
   * stamped as `bearer` does), else undefined and the caller goes through `bearer`. Always undefined with tracing
   * on (`bearer` makes the span).
   */
  readonly cachedBearer: (request: HttpServerRequest.HttpServerRequest, xApiKey: boolean, now: number) => Caller | undefined
  /** 403 gates for spending endpoints, in the spec's order. */
  readonly gate: (caller: Caller, headers: Readonly<Record<string, string | undefined>>) => Effect.Effect<void, GatewayError>
  /** `gate` as a plain check at `now`: the refusal, or undefined. */
  readonly gateError: (
    caller: Caller,
    headers: Readonly<Record<string, string | undefined>>,
    now: number
  ) => GatewayError | undefined
  /** Pending last-used stamps are written now (shutdown, tests). */
  readonly flushTouches: Effect.Effect<void>
}>()("wellspring/auth/Auth") {}

export const bearerToken = (authorization: string | undefined): string | null => {
  if (!authorization) return null
  const match = /^Bearer\s+(\S+)\s*$/i.exec(authorization)
  return match ? match[1]! : null
}

/**
 * `Authorization`, else an `x-api-key` value as a bearer credential. A key containing whitespace is kept so that
 * it fails (and is counted) rather than being read as another key.
 */
export const authorizationOrApiKey = (headers: Readonly<Record<string, string | undefined>>): string | undefined => {
  const authorization = headers.authorization
  if (authorization !== undefined && authorization.trim() !== "") return authorization
  const apiKey = headers["x-api-key"]
  return apiKey === undefined || apiKey.trim() === "" ? authorization : `Bearer ${apiKey}`
}

export const make = Effect.gen(function*() {
  const store = yield* KeyStore.KeyStore
  const settings = yield* Settings
  const pg = yield* Effect.serviceOption(PgClient.PgClient)
  const { config } = settings
  const cache = new Map<string, CacheEntry>()
  /** Inserts since the last sweep of expired entries (unknown keys would otherwise stay cached forever). */
  let inserts = 0
  const remember = (hash: string, entry: CacheEntry, now: number) => {
    cache.set(hash, entry)
    if (++inserts >= 1024 && inserts >= cache.size) {
      inserts = 0
      for (const [h, e] of cache) if (e.expiresAt <= now) cache.delete(h)
    }
  }
  const lastTouch = new Map<number, number>()
  const addresses = ClientAddress.make(config.trusted_proxies)
  const limiter = FailedAuth.makeLimiter(config.limits.failed_auth_per_minute)
  let keyLookups = 0
  let keyCacheHits = 0
  let sessionLookups = 0
  const telemetry = yield* CurrentTelemetry
  /**
   * Session tokens the store did not know (SHA-256 → expiry), so a repeated unknown cookie costs no query. Never
   * invalidated: sessions are only created with a fresh random 48-character token, which no cached guess matches.
   */
  const unknownSessions = new Map<string, number>()
  let unknownInserts = 0
  const rememberUnknownSession = (hash: string, now: number) => {
    if ((++unknownInserts >= 1024 && unknownInserts >= unknownSessions.size) || unknownSessions.size >= MAX_UNKNOWN_SESSIONS) {
      unknownInserts = 0
      for (const [h, until] of unknownSessions) if (until <= now) unknownSessions.delete(h)
    }
    // Still full: the oldest go (Map order is insertion order).
    for (const h of unknownSessions.keys()) {
      if (unknownSessions.size < MAX_UNKNOWN_SESSIONS) break
      unknownSessions.delete(h)
    }
    unknownSessions.set(hash, now + Invalidation.NEGATIVE_TTL_MS)
  }

  /**
   * Bumped by every invalidation, local or announced. A lookup that started before an invalidation may have read
   * the row before it changed (a revoke committing meanwhile): its answer is used for that request but never
   * cached, or a revoked key could be served for a whole TTL.
   */
  let invalidations = 0
  const listeners: Array<(invalidation: Invalidation.Invalidation) => void> = []

  const dropLocal = (invalidation: Invalidation.Invalidation) => {
    for (const listener of listeners) listener(invalidation)
    if (invalidation._tag === "Credentials") return
    invalidations++
    switch (invalidation._tag) {
      case "Key":
        cache.delete(invalidation.hash)
        break
      case "Account":
        for (const [hash, entry] of cache) if (entry.caller?.account.id === invalidation.accountId) cache.delete(hash)
        break
      case "Unknown":
        cache.clear()
    }
  }

  /**
   * Announcements carry this replica's tag (`<message>|<tag>`) so that its own echo is not counted twice: an echo
   * arriving late would otherwise keep an unrelated lookup from being cached. The CLI sends untagged messages.
   */
  const tag = randomUUID().slice(0, 8)

  const announce = (invalidation: Invalidation.Invalidation) =>
    Effect.sync(() => dropLocal(invalidation)).pipe(
      Effect.andThen(
        Option.isSome(pg) && !settings.embedded
          ? Invalidation.publish(pg.value, invalidation, tag).pipe(
            Effect.catch((error) => Effect.logWarning("auth invalidation not announced", error))
          )
          : Effect.void
      )
    )

  // Other replicas' announcements. Embedded mode runs one process, so local invalidation is enough.
  if (Option.isSome(pg) && !settings.embedded) {
    const client = pg.value
    // `listen` holds a connection for its scope and fails the queue when that connection is lost: each round
    // gets its own scope, so a retry listens on a fresh connection.
    yield* Effect.scoped(Effect.flatMap(client.listen(Invalidation.CHANNEL), (notifications) =>
      Stream.fromQueue(notifications).pipe(
        Stream.runForEach((notification) =>
          Effect.sync(() => {
            const announced = Invalidation.decode(notification.payload)
            if (announced.tag !== tag) dropLocal(announced.invalidation)
          })
        )
      ))).pipe(
      Effect.catch((error) => Effect.logWarning("auth invalidation listener failed", error)),
      Effect.repeat(Schedule.spaced(Duration.seconds(1))),
      Effect.forkScoped
    )
  }

  // Last-used stamps: batched, 5 s after the first; a failed write (database briefly down) is retried.
  const touches = yield* Batcher.queue<{ readonly keyId: number; readonly at: Date }>({
    label: "key last-used stamps",
    interval: Duration.seconds(5),
    batchSize: TOUCH_BATCH,
    maxPending: MAX_PENDING_TOUCHES,
    write: (batch) => store.touchKeys(batch)
  })
  const flushTouches = touches.flush

  const touch = (key: KeyRow, now: number) => {
    const last = lastTouch.get(key.id) ?? (key.last_used_at ? key.last_used_at.getTime() : 0)
    if (now - last < TOUCH_EVERY_MS) return
    lastTouch.set(key.id, now)
    touches.add({ keyId: key.id, at: new Date(now) })
  }

  /** 429 for a refused address; a warning at most once a minute per address (the address is normalized, never header text). */
  const refuse = (client: string, now: number, wait: number): Effect.Effect<never, GatewayError> => {
    const refusal = Effect.fail(fail("too_many_failed_requests", { message: AuthMessages.tooManyFailedAuth, retryAfter: wait }))
    const report = limiter.refused(client, now)
    return report === null ? refusal : Effect.logWarning("failed authentication limit reached").pipe(
      Effect.annotateLogs({
        address: report.address,
        failures_last_minute: report.failures,
        refused_since_last_line: report.refused,
        limit_per_minute: config.limits.failed_auth_per_minute
      }),
      Effect.andThen(refusal)
    )
  }

  const invalidKey = (client: string, now: number): Effect.Effect<never, GatewayError> => {
    limiter.record(client, now)
    return Effect.fail(fail("invalid_api_key"))
  }

  /** A store read on behalf of `client`: under way it counts toward the limit, and when it finds nothing it is a failure. */
  const lookup = <A>(client: string, now: number, read: Effect.Effect<A | null>): Effect.Effect<A | null> =>
    Effect.suspend(() => {
      limiter.begin(client)
      return read
    }).pipe(Effect.onExit((exit) =>
      Effect.sync(() => limiter.end(client, now, Exit.isSuccess(exit) && exit.value === null))
    ))

  /**
   * Key lookups under way, by hash: concurrent misses of one key share one query (`sharedFind`). The query runs on
   * its own fiber in this service's scope, so a waiting request that goes away does not cancel it for the others.
   */
  const finding = new Map<string, Deferred.Deferred<Found>>()
  const forkDetached = Effect.runForkWith(yield* Effect.context<never>())
  const serviceScope = yield* Effect.scope
  /** Runs `effect` on its own fiber, interrupted when this service's scope closes. */
  const runInScope = (effect: Effect.Effect<void>): void => {
    Fiber.runIn(forkDetached(effect), serviceScope)
  }
  /**
   * One lookup's answer with when it began and the invalidation count then: whoever joins it caches what it found as
   * of that moment (an entry never outlives its TTL from the read, and an invalidation during the read is seen).
   */
  interface Found {
    readonly owner: KeyStore.KeyOwner | null
    readonly at: number
    readonly seen: number
  }
  const startFind = (hash: string, now: number): Deferred.Deferred<Found> => {
    const running = finding.get(hash)
    if (running !== undefined) return running
    const done = Deferred.makeUnsafe<Found>()
    finding.set(hash, done)
    const seen = invalidations
    runInScope(
      store.findActiveKeyByHash(hash).pipe(
        Effect.map((owner): Found => ({ owner, at: now, seen })),
        Effect.onExit((exit) =>
          Effect.suspend(() => {
            finding.delete(hash)
            return Deferred.done(done, exit)
          })
        ),
        Effect.asVoid
      )
    )
    return done
  }
  const sharedFind = (hash: string, now: number): Effect.Effect<Found> =>
    Effect.suspend(() => Deferred.await(startFind(hash, now)))

  /**
   * The cache entry of a lookup's answer, living from when the lookup began; not cached when an invalidation came
   * while it ran.
   */
  const rememberFound = (hash: string, found: Found): Caller | null => {
    const owner = found.owner
    const caller: Caller | null = owner ? { account: owner.account, key: owner.key } : null
    if (found.seen === invalidations) {
      const ttl = caller ? Invalidation.POSITIVE_TTL_MS : Invalidation.NEGATIVE_TTL_MS
      remember(hash, { caller, expiresAt: found.at + ttl }, found.at)
    }
    return caller
  }

  /** Keys being refreshed ahead of their expiry (`REFRESH_AHEAD_MS`). */
  const refreshing = new Set<string>()
  /** Starts a background lookup of a cached key close to its expiry; a revoked key is then refused sooner. */
  const refreshAhead = (hash: string, entry: CacheEntry, now: number): void => {
    if (entry.expiresAt - now > REFRESH_AHEAD_MS || refreshing.has(hash)) return
    refreshing.add(hash)
    runInScope(
      sharedFind(hash, now).pipe(
        Effect.map((found) => void rememberFound(hash, found)),
        Effect.catchCause((cause) => Effect.logWarning("key refresh failed; the cached entry expires as usual", cause)),
        Effect.ensuring(Effect.sync(() => refreshing.delete(hash)))
      )
    )
  }

  const authenticateKey = (authorization: string | undefined, client: string): Effect.Effect<Caller, GatewayError> => {
    // No credential at all: nothing guessed and nothing to look up, so not counted.
    if (authorization === undefined || authorization.trim() === "") return Effect.fail(fail("invalid_api_key"))
    const token = bearerToken(authorization)
    const hash = token !== null && isWellFormed(token, config.key_prefix) ? hashKey(token) : null
    return Clock.currentTimeMillis.pipe(Effect.flatMap((now) => {
      const hit = hash === null ? undefined : cache.get(hash)
      // A valid cached key is served even from a refused address (a client behind the same NAT as a guesser).
      if (hit !== undefined && hit.expiresAt > now && hit.caller !== null) {
        keyCacheHits++
        touch(hit.caller.key!, now)
        refreshAhead(hash!, hit, now)
        return Effect.succeed(hit.caller)
      }
      // Past the limit nothing is looked up, except a key this replica last saw valid (its entry expired).
      const wait = limiter.retryAfter(client, now)
      if (wait > 0 && !hit?.caller) return refuse(client, now, wait)
      // Malformed, or cached as unknown.
      if (hash === null) return invalidKey(client, now)
      if (hit !== undefined && hit.expiresAt > now) {
        keyCacheHits++
        return invalidKey(client, now)
      }
      keyLookups++
      // `lookup` counts a lookup that found nothing against the address; the cache takes the lookup's own time.
      let found: Found | undefined
      const read = Effect.map(sharedFind(hash, now), (f) => {
        found = f
        return f.owner
      })
      return lookup(client, now, read).pipe(Effect.flatMap(() => {
        const caller = rememberFound(hash, found!)
        if (caller === null) return Effect.fail(fail("invalid_api_key"))
        touch(caller.key!, now)
        return Effect.succeed(caller)
      }))
    }))
  }

  const authenticateWith = <A>(client: string, check: Effect.Effect<A | null, GatewayError>): Effect.Effect<A, GatewayError> =>
    Clock.currentTimeMillis.pipe(Effect.flatMap((now) => {
      const wait = limiter.retryAfter(client, now)
      if (wait > 0) return refuse(client, now, wait)
      return Effect.suspend(() => {
        limiter.begin(client)
        return check
      }).pipe(
        Effect.onExit((exit) => Effect.sync(() => limiter.end(client, now, Exit.isSuccess(exit) && exit.value === null))),
        Effect.flatMap((found) => (found === null ? Effect.fail(fail("invalid_api_key")) : Effect.succeed(found)))
      )
    }))

  const authenticateSession = (token: string, client: string): Effect.Effect<Caller | null, GatewayError> =>
    Clock.currentTimeMillis.pipe(Effect.flatMap((now) => {
      const wait = limiter.retryAfter(client, now)
      if (wait > 0) return refuse(client, now, wait)
      const unknown = () => {
        limiter.record(client, now)
        return null
      }
      if (token.length > MAX_SESSION_TOKEN_LENGTH) return Effect.sync(unknown)
      const hash = hashKey(token)
      const until = unknownSessions.get(hash)
      if (until !== undefined && until > now) return Effect.sync(unknown)
      sessionLookups++
      return lookup(client, now, store.findSession(token)).pipe(Effect.map((account) => {
        if (account) return { account, key: null }
        rememberUnknownSession(hash, now)
        return null
      }))
    }))

  const clientAddress = (request: HttpServerRequest.HttpServerRequest) =>
    addresses.of(Option.getOrUndefined(request.remoteAddress), request.headers["x-forwarded-for"])

  const lock = config.access.region_lock
  const countryHeader = lock.header.toLowerCase()
  const allowedCountries = new Set(lock.allowed_countries.map((c) => c.toUpperCase()))

  const gateError = (
    caller: Caller,
    headers: Readonly<Record<string, string | undefined>>,
    now: number
  ): GatewayError | undefined => {
    if (lock.enabled) {
      const country = headers[countryHeader]?.toUpperCase()
      if (!country || !allowedCountries.has(country)) return fail("geo_restricted")
    }
    const account = caller.account
    if (account.status !== "active") return fail("account_unlinked")
    if (account.is_legacy && account.needs_migration) return fail("legacy_account_upgrade_required")
    if (account.is_guest && account.guest_expires_at && account.guest_expires_at.getTime() <= now) {
      return fail("guest_expired")
    }
    if (config.access.email_enforcement && !account.email_verified_at) return fail("email_required")
    return undefined
  }

  const gate = (caller: Caller, headers: Readonly<Record<string, string | undefined>>) =>
    Clock.currentTimeMillis.pipe(Effect.flatMap((now) => {
      const refusal = gateError(caller, headers, now)
      return refusal === undefined ? Effect.void : Effect.fail(refusal)
    }))

  const cachedBearer = (request: HttpServerRequest.HttpServerRequest, xApiKey: boolean, now: number): Caller | undefined => {
    if (telemetry.tracing) return undefined
    const headers = headersOf(request)
    const authorization = xApiKey ? authorizationOrApiKey(headers) : headers.authorization
    if (authorization === undefined) return undefined
    const token = bearerToken(authorization)
    if (token === null || !isWellFormed(token, config.key_prefix)) return undefined
    const hash = hashKey(token)
    const hit = cache.get(hash)
    if (hit === undefined || hit.expiresAt <= now || hit.caller === null) return undefined
    keyCacheHits++
    touch(hit.caller.key!, now)
    refreshAhead(hash, hit, now)
    return hit.caller
  }

  return Auth.of({
    authenticateKey,
    authenticateSession,
    authenticateWith,
    bearer: (request, xApiKey) =>
      telemetry.span(
        authenticateKey(
          xApiKey === true ? authorizationOrApiKey(headersOf(request)) : headersOf(request).authorization,
          clientAddress(request)
        ),
        "wellspring.auth"
      ),
    cachedBearer,
    clientAddress,
    storeLookups: Effect.sync(() => ({ keys: keyLookups, sessions: sessionLookups, refreshing: refreshing.size })),
    keyCache: () => ({ hits: keyCacheHits, misses: keyLookups }),
    invalidateKeys: (hashes) => Effect.forEach(hashes, (hash) => announce(Invalidation.key(hash)), { discard: true }),
    invalidateAccount: (accountId) => announce(Invalidation.account(accountId)),
    invalidateCredentials: (accountId) => announce(Invalidation.credentials(accountId)),
    subscribe: (listener) => {
      listeners.push(listener)
    },
    gate,
    gateError,
    flushTouches
  })
})

/** Auth with its key store (needs the SqlClient and Settings; listens for announcements when on PostgreSQL). */
export const layer = Layer.effect(Auth, make).pipe(Layer.provide(KeyStore.layer))

export type { SqlClient }
