/**
 * Issue 16, finding 5, without a server: the per-address failed-authentication limit of `Auth` on the TestClock
 * (over an in-memory counting key store), its log line, the negative cache of unknown session tokens, and the
 * memory bounds of the counter (`src/auth/FailedAuth.ts`).
 */
import { describe, expect, it } from "@effect/vitest"
import { type Context, Deferred, Effect, Fiber, Logger, References } from "effect"
import { TestClock } from "effect/testing"
import * as AuthModule from "../../src/auth/Auth.js"
import { bucketOf, makeLimiter } from "../../src/auth/FailedAuth.js"
import { NEGATIVE_TTL_MS, POSITIVE_TTL_MS } from "../../src/auth/Invalidation.js"
import { generateKey, hashKey } from "../../src/auth/KeyMaterial.js"
import * as KeyStore from "../../src/auth/KeyStore.js"
import type { AccountRow, KeyRow } from "../../src/auth/Rows.js"
import { type GatewayConfig, loadConfig } from "../../src/config/GatewayConfig.js"
import { Settings } from "../../src/config/Live.js"
import { MAX_TRACKED_KEYS } from "../../src/runtime/RateWindow.js"

const HANGUL = /[\uAC00-\uD7A3]/
const base = loadConfig({ path: "config/gateway.yaml", env: {} })

const account = { id: "acc_1", status: "active", last_used_at: null } as unknown as AccountRow

/** An in-memory key store that counts its reads; `keys` and `sessions` can be changed by the test. */
const countingStore = () => {
  const keys = new Map<string, KeyRow>()
  const sessions = new Set<string>()
  const reads = { keys: 0, sessions: 0 }
  const store = KeyStore.KeyStore.of({
    findActiveKeyByHash: (hash) =>
      Effect.sync(() => {
        reads.keys++
        const key = keys.get(hash)
        return key ? { key, account } : null
      }),
    findSession: (token) =>
      Effect.sync(() => {
        reads.sessions++
        return sessions.has(token) ? account : null
      }),
    touchKeys: () => Effect.void
  })
  const addKey = () => {
    const key = generateKey("sk-ws-")
    keys.set(hashKey(key), { id: keys.size + 1, account_id: account.id, last_used_at: null } as unknown as KeyRow)
    return `Bearer ${key}`
  }
  return { store, reads, sessions, addKey }
}

const makeAuth = (limit: number, store: Context.Service.Shape<typeof KeyStore.KeyStore>) => {
  const config: GatewayConfig = { ...base.config, limits: { ...base.config.limits, failed_auth_per_minute: limit } }
  return AuthModule.make.pipe(
    Effect.provideService(Settings, {
      config,
      path: base.path,
      encryptionKey: null,
      embedded: true,
      planFor: () => config.plans[config.default_plan]!
    }),
    Effect.provideService(KeyStore.KeyStore, store)
  )
}

type AuthShape = Context.Service.Shape<typeof AuthModule.Auth>

/** "ok", or the error code with its Retry-After. */
const keyResult = (auth: AuthShape, authorization: string | undefined, from: string) =>
  auth.authenticateKey(authorization, from).pipe(
    Effect.map(() => "ok"),
    Effect.catch((e) => Effect.succeed(e.retryAfter === undefined ? e.code : `${e.code} ${e.retryAfter}`))
  )
const sessionResult = (auth: AuthShape, token: string, from: string) =>
  auth.authenticateSession(token, from).pipe(
    Effect.map((caller) => (caller ? "ok" : "unknown")),
    Effect.catch((e) => Effect.succeed(`${e.code} ${e.retryAfter}`))
  )
const randomKey = () => `Bearer ${generateKey("sk-ws-")}`

describe("failed authentication per address (Auth, TestClock)", () => {
  it.effect("past the limit an address is refused before any lookup, for keys and sessions, until the minute slides", () =>
    Effect.scoped(Effect.gen(function*() {
      const { store, reads } = countingStore()
      const auth = yield* makeAuth(3, store)
      for (let i = 0; i < 3; i++) expect(yield* keyResult(auth, randomKey(), "198.51.100.7")).toBe("invalid_api_key")
      expect(reads.keys).toBe(3)

      // Three failures at t=0: the estimate stays 3 until the window ends at 60 s.
      expect(yield* keyResult(auth, randomKey(), "198.51.100.7")).toBe("too_many_failed_requests 61")
      expect(yield* sessionResult(auth, "x".repeat(48), "198.51.100.7")).toBe("too_many_failed_requests 61")
      expect(yield* keyResult(auth, "Bearer not-even-a-key", "198.51.100.7")).toBe("too_many_failed_requests 61")
      expect(reads).toEqual({ keys: 3, sessions: 0 })
      const refusal = yield* Effect.flip(auth.authenticateKey(randomKey(), "198.51.100.7"))
      expect([refusal.status, refusal.code]).toEqual([429, "too_many_failed_requests"])
      expect(refusal.userMessage).toMatch(HANGUL)

      // Another address is not affected.
      expect(yield* keyResult(auth, randomKey(), "198.51.100.8")).toBe("invalid_api_key")
      expect(reads.keys).toBe(4)

      yield* TestClock.adjust("30 seconds")
      expect(yield* keyResult(auth, randomKey(), "198.51.100.7")).toBe("too_many_failed_requests 31")
      yield* TestClock.adjust("31 seconds")
      expect(yield* keyResult(auth, randomKey(), "198.51.100.7")).toBe("invalid_api_key")
      expect(reads.keys).toBe(5)
    })))

  it.effect("a request without any credential is answered 401 and never counted", () =>
    Effect.scoped(Effect.gen(function*() {
      const { store, reads } = countingStore()
      const auth = yield* makeAuth(2, store)
      for (let i = 0; i < 50; i++) {
        expect(yield* keyResult(auth, undefined, "198.51.100.9")).toBe("invalid_api_key")
        expect(yield* keyResult(auth, "  ", "198.51.100.9")).toBe("invalid_api_key")
      }
      expect(yield* keyResult(auth, randomKey(), "198.51.100.9")).toBe("invalid_api_key")
      expect(reads.keys).toBe(1)
      // Malformed keys and too-long cookies need no lookup but are guesses all the same.
      expect(yield* keyResult(auth, "Basic abc", "198.51.100.9")).toBe("invalid_api_key")
      expect(yield* keyResult(auth, randomKey(), "198.51.100.9")).toBe("too_many_failed_requests 61")
      expect(yield* sessionResult(auth, "y".repeat(300), "198.51.100.10")).toBe("unknown")
      expect(yield* sessionResult(auth, "y".repeat(300), "198.51.100.10")).toBe("unknown")
      expect(yield* sessionResult(auth, "y".repeat(300), "198.51.100.10")).toBe("too_many_failed_requests 61")
      expect(reads.sessions).toBe(0)
    })))

  it.effect("a valid key in the cache is served from a refused address; others are not looked up; an expired entry is", () =>
    Effect.scoped(Effect.gen(function*() {
      const { store, reads, addKey } = countingStore()
      const auth = yield* makeAuth(3, store)
      const cached = addKey()
      const uncached = addKey()
      const from = "203.0.113.5"
      expect(yield* keyResult(auth, cached, from)).toBe("ok") // cached until t=60 s
      yield* TestClock.adjust("40 seconds") // more than REFRESH_AHEAD_MS before the entry ends: no refresh
      for (let i = 0; i < 3; i++) expect(yield* keyResult(auth, randomKey(), from)).toBe("invalid_api_key")
      expect(reads.keys).toBe(4)

      expect(yield* keyResult(auth, cached, from)).toBe("ok")
      expect(yield* keyResult(auth, uncached, from)).toMatch(/^too_many_failed_requests/)
      expect(reads.keys).toBe(4)

      // Past the positive TTL the address is still refused (its window began at 40 s), but a key this replica
      // last saw valid is looked up again: nobody holds such a key without having been given it.
      yield* TestClock.adjust(`${POSITIVE_TTL_MS - 40_000 + 1000} millis`)
      expect(yield* keyResult(auth, randomKey(), from)).toMatch(/^too_many_failed_requests/)
      expect(yield* keyResult(auth, cached, from)).toBe("ok")
      expect(reads.keys).toBe(5)
      expect(yield* keyResult(auth, uncached, from)).toMatch(/^too_many_failed_requests/)
      expect(reads.keys).toBe(5)
    })))

  it.effect("after a first failure, concurrent guesses get no more lookups than the limit; a clean address is not held back", () =>
    Effect.scoped(Effect.gen(function*() {
      const { store, reads } = countingStore()
      // Every read waits at the current gate: all the requests arrive while the first ones are under way.
      let gate = yield* Deferred.make<void>()
      const held = KeyStore.KeyStore.of({
        ...store,
        findActiveKeyByHash: (hash) =>
          Effect.suspend(() => {
            const waitFor = gate
            return Effect.andThen(store.findActiveKeyByHash(hash), (found) => Effect.as(Deferred.await(waitFor), found))
          })
      })
      const auth = yield* makeAuth(5, held)
      const burst = (from: string, n: number, answered: { n: number }) =>
        Effect.forEach(
          Array.from({ length: n }, randomKey),
          (key) => keyResult(auth, key, from).pipe(Effect.tap(() => Effect.sync(() => void answered.n++))),
          { concurrency: "unbounded" }
        ).pipe(Effect.forkChild)

      // A clean address: 8 lookups at once (8 distinct credentials, a benchmark's keys on a cold cache) all go through.
      const cleanAnswered = { n: 0 }
      const clean = yield* burst("192.0.2.45", 8, cleanAnswered)
      for (let i = 0; i < 1000 && reads.keys < 8; i++) yield* Effect.yieldNow
      expect([reads.keys, cleanAnswered.n]).toEqual([8, 0])
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(clean)).toEqual(Array.from({ length: 8 }, () => "invalid_api_key"))

      // An address with one failure: of 100 at once, 4 are looked up and the rest refused while those are under way.
      gate = yield* Deferred.make<void>()
      const released = gate
      yield* Deferred.succeed(released, undefined)
      expect(yield* keyResult(auth, randomKey(), "192.0.2.44")).toBe("invalid_api_key")
      gate = yield* Deferred.make<void>()
      const answered = { n: 0 }
      const fiber = yield* burst("192.0.2.44", 100, answered)
      for (let i = 0; i < 1000 && answered.n < 96; i++) yield* Effect.yieldNow
      expect([answered.n, reads.keys]).toEqual([96, 8 + 1 + 4])
      yield* Deferred.succeed(gate, undefined)
      const results = yield* Fiber.join(fiber)
      expect(results.filter((r) => r === "invalid_api_key")).toHaveLength(4)
      // Refused while the four were under way: retry in a second.
      expect(results.filter((r) => r === "too_many_failed_requests 1")).toHaveLength(96)
      expect(reads.keys).toBe(13)
      expect(yield* keyResult(auth, randomKey(), "192.0.2.44")).toBe("too_many_failed_requests 61")
    })))

  it.effect("a refused address is logged at most once a minute, with its counts, never with a credential", () => {
    const lines: Array<{ message: string; annotations: Record<string, unknown> }> = []
    const capture = Logger.layer([Logger.make(({ fiber, message }) => {
      lines.push({
        message: (Array.isArray(message) ? message : [message]).join(" "),
        annotations: { ...fiber.getRef(References.CurrentLogAnnotations) }
      })
    })])
    return Effect.scoped(Effect.gen(function*() {
      const { store } = countingStore()
      const auth = yield* makeAuth(2, store)
      const keys = Array.from({ length: 20 }, randomKey)
      const cookie = "c".repeat(48)
      for (let i = 0; i < 2; i++) yield* keyResult(auth, keys[i], "198.51.100.20")
      expect(lines).toHaveLength(0) // failures under the limit are not logged
      for (let i = 2; i < 7; i++) yield* keyResult(auth, keys[i], "198.51.100.20")
      yield* sessionResult(auth, cookie, "198.51.100.20")
      expect(lines).toHaveLength(1)
      expect(lines[0]!.message).toBe("failed authentication limit reached")
      expect(lines[0]!.annotations).toEqual({
        address: "198.51.100.20",
        failures_last_minute: 2,
        refused_since_last_line: 1,
        limit_per_minute: 2
      })

      yield* TestClock.adjust("30 seconds")
      for (let i = 7; i < 10; i++) yield* keyResult(auth, keys[i], "198.51.100.20")
      expect(lines).toHaveLength(1)

      // At 61 s one more guess is looked up (the previous minute's weight has faded below 2), then refused again.
      yield* TestClock.adjust("31 seconds")
      expect(yield* keyResult(auth, keys[10], "198.51.100.20")).toBe("invalid_api_key")
      yield* keyResult(auth, keys[11], "198.51.100.20")
      expect(lines).toHaveLength(2)
      // Refused since the first line: 4 keys and the cookie before 30 s, 3 keys at 30 s, this one.
      expect(lines[1]!.annotations).toMatchObject({ address: "198.51.100.20", failures_last_minute: 3, refused_since_last_line: 9 })

      // Every address has its own line.
      for (let i = 0; i < 3; i++) yield* keyResult(auth, keys[12 + i], "198.51.100.21")
      expect(lines.map((l) => l.annotations.address)).toEqual(["198.51.100.20", "198.51.100.20", "198.51.100.21"])

      const text = JSON.stringify(lines)
      for (const key of keys) expect(text).not.toContain(key.slice("Bearer ".length))
      expect(text).not.toContain(cookie)
    })).pipe(Effect.provide(capture))
  })

  it.effect("one unknown session cookie costs one query per negative TTL, however often it is sent", () =>
    Effect.scoped(Effect.gen(function*() {
      const { store, reads, sessions } = countingStore()
      const auth = yield* makeAuth(1000, store)
      const unknown = "u".repeat(48)
      for (let i = 0; i < 50; i++) expect(yield* sessionResult(auth, unknown, "198.51.100.30")).toBe("unknown")
      expect(reads.sessions).toBe(1)
      // Another unknown token is another query.
      expect(yield* sessionResult(auth, "v".repeat(48), "198.51.100.30")).toBe("unknown")
      expect(reads.sessions).toBe(2)
      yield* TestClock.adjust(`${NEGATIVE_TTL_MS} millis`)
      expect(yield* sessionResult(auth, unknown, "198.51.100.30")).toBe("unknown")
      expect(reads.sessions).toBe(3)
      // Valid sessions are not cached at all: each is read (revocation stays immediate).
      const valid = "w".repeat(48)
      sessions.add(valid)
      for (let i = 0; i < 3; i++) expect(yield* sessionResult(auth, valid, "198.51.100.30")).toBe("ok")
      expect(reads.sessions).toBe(6)
      expect(yield* auth.storeLookups).toEqual({ keys: 0, sessions: 6, refreshing: 0 })
    })))
})

describe("failed-authentication counter (clock-free)", () => {
  it("counts IPv6 per /64 and IPv4 per address", () => {
    expect(bucketOf("2001:db8:1:2:aaaa:bbbb:cccc:dddd")).toBe("2001:db8:1:2::/64")
    expect(bucketOf("2001:db8:1:2::1")).toBe(bucketOf("2001:db8:1:2:ffff::9"))
    expect(bucketOf("2001:db8:1:3::1")).not.toBe(bucketOf("2001:db8:1:2::1"))
    expect(bucketOf("203.0.113.9")).toBe("203.0.113.9")
    expect(bucketOf("unknown")).toBe("unknown")
    const limiter = makeLimiter(2)
    limiter.record("2001:db8::1", 0)
    limiter.record("2001:db8::2", 0)
    expect(limiter.retryAfter("2001:db8::ffff", 0)).toBe(61)
    expect(limiter.retryAfter("2001:db8:0:1::1", 0)).toBe(0)
  })

  it("stays bounded when a million distinct addresses fail and are refused", () => {
    const limiter = makeLimiter(1)
    let peak = { counted: 0, logged: 0, pending: 0 }
    for (let i = 0; i < 1_000_000; i++) {
      const address = `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}-${i >> 24}`
      limiter.record(address, i)
      if (limiter.retryAfter(address, i) > 0) limiter.refused(address, i)
      if ((i & 1023) === 0) {
        const size = limiter.size()
        peak = { counted: Math.max(peak.counted, size.counted), logged: Math.max(peak.logged, size.logged), pending: 0 }
      }
    }
    expect(peak.counted).toBeLessThanOrEqual(MAX_TRACKED_KEYS)
    expect(peak.logged).toBeLessThanOrEqual(MAX_TRACKED_KEYS)
    expect(limiter.size().counted).toBeLessThanOrEqual(MAX_TRACKED_KEYS)
    expect(limiter.size().logged).toBeLessThanOrEqual(MAX_TRACKED_KEYS)
  })
})
