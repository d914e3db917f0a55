/**
 * The Auth service over a real PostgreSQL database: account gates, key cache TTLs and invalidation,
 * last-used stamps. Time is the TestClock's.
 */
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, ManagedRuntime, Redacted, Result } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { afterAll, beforeAll } from "vitest"
import * as Accounts from "../../src/accounts/AccountsRepo.js"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import * as AuthModule from "../../src/auth/Auth.js"
import { generateKey, hashKey } from "../../src/auth/KeyMaterial.js"
import * as KeyStore from "../../src/auth/KeyStore.js"
import { type GatewayConfig, loadConfig } from "../../src/config/GatewayConfig.js"
import { Settings } from "../../src/config/Live.js"
import * as Sql from "../../src/store/Sql.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { eventually } from "../support/Eventually.js"
import { serviceGate } from "../support/Services.js"

const postgres = await serviceGate("postgres")

const base = loadConfig({ path: "config/gateway.yaml", env: {} })

type Access = GatewayConfig["access"]
const settingsWith = (access: Partial<Access> = {}): Context.Service.Shape<typeof Settings> => {
  const config: GatewayConfig = { ...base.config, access: { ...base.config.access, ...access } }
  return {
    config,
    path: base.path,
    encryptionKey: null,
    embedded: true,
    planFor: () => config.plans[config.default_plan]!
  }
}

type Services = SqlClient.SqlClient | AccountsRepo | KeyStore.KeyStore
let db: FreshDatabase
let runtime: ManagedRuntime.ManagedRuntime<Services, unknown>
let context: Context.Context<Services>

/** Runs against the shared database; the Auth under test is built per test with its own settings. */
const withDb = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provide(effect, context) as Effect.Effect<A, E, Exclude<R, Services>>

const makeAuth = (access: Partial<Access> = {}) =>
  AuthModule.make.pipe(Effect.provideService(Settings, settingsWith(access)))

let seq = 0
const account = (extra: Partial<Accounts.NewAccount> = {}) =>
  Effect.flatMap(AccountsRepo, (repo) =>
    repo.createAccount({
      username: `auth${++seq}_${Date.now()}`,
      displayName: "테스트",
      email: "t@example.com",
      ...extra
    }))

const caller = (row: Accounts.AccountRow): AuthModule.Caller => ({ account: row, key: null })

/** The code of a failed gate, or "ok". */
const gateResult = (auth: Context.Service.Shape<typeof AuthModule.Auth>, row: Accounts.AccountRow, headers: Record<string, string> = {}) =>
  auth.gate(caller(row), headers).pipe(
    Effect.result,
    Effect.map(Result.match({ onFailure: (e) => e.code as string, onSuccess: () => "ok" }))
  )

const authResult = (auth: Context.Service.Shape<typeof AuthModule.Auth>, key: string) =>
  auth.authenticateKey(`Bearer ${key}`, "127.0.0.1").pipe(
    Effect.result,
    Effect.map(Result.match({ onFailure: (e) => e.code as string, onSuccess: (c) => c.account.status }))
  )

/** The real key store, counting the key lookups Auth sends it. */
const countingKeyStore = Effect.map(KeyStore.KeyStore, (real) => {
  let queries = 0
  const store: Context.Service.Shape<typeof KeyStore.KeyStore> = {
    ...real,
    findActiveKeyByHash: (hash) => Effect.suspend(() => (queries++, real.findActiveKeyByHash(hash)))
  }
  return { store, queries: () => queries }
})

const revokeInDbOnly = (keyId: number) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) => sql`UPDATE api_keys SET revoked_at = now() WHERE id = ${keyId}`).pipe(
    Effect.orDie
  )

describe.skipIf(!postgres)("Auth service on PostgreSQL", () => {
  beforeAll(async () => {
    db = await freshDatabase("auth")
    const layer = Layer.provideMerge(
      Layer.merge(Accounts.layer, KeyStore.layer),
      Layer.merge(
        Layer.succeed(Settings, settingsWith()),
        Sql.layerSql({ databaseUrl: Redacted.make(db.url), dataDir: "unused" })
      )
    )
    runtime = ManagedRuntime.make(layer as Layer.Layer<Services, unknown>)
    context = await runtime.context()
  })
  afterAll(async () => {
    await runtime?.dispose()
    await db?.drop()
  })

  describe("gates", () => {
    it.effect("status: only active passes; unlinked and revoked give account_unlinked", () =>
      withDb(Effect.gen(function*() {
        const auth = yield* makeAuth()
        expect(yield* gateResult(auth, yield* account())).toBe("ok")
        expect(yield* gateResult(auth, yield* account({ status: "unlinked" }))).toBe("account_unlinked")
        expect(yield* gateResult(auth, yield* account({ status: "revoked" }))).toBe("account_unlinked")
      })))

    it.effect("legacy_account_upgrade_required needs is_legacy and needs_migration", () =>
      withDb(Effect.gen(function*() {
        const auth = yield* makeAuth()
        expect(yield* gateResult(auth, yield* account({ isLegacy: true, needsMigration: true })))
          .toBe("legacy_account_upgrade_required")
        expect(yield* gateResult(auth, yield* account({ isLegacy: true }))).toBe("ok")
        expect(yield* gateResult(auth, yield* account({ needsMigration: true }))).toBe("ok")
      })))

    it.effect("guest_expired once the clock passes guest_expires_at", () =>
      withDb(Effect.gen(function*() {
        const start = Date.parse("2026-03-01T00:00:00Z")
        yield* TestClock.setTime(start)
        const auth = yield* makeAuth()
        const guest = yield* account({ isGuest: true, guestExpiresAt: new Date(start + 3_600_000) })
        expect(yield* gateResult(auth, guest)).toBe("ok")
        yield* TestClock.adjust("59 minutes")
        expect(yield* gateResult(auth, guest)).toBe("ok")
        yield* TestClock.adjust("1 minute")
        expect(yield* gateResult(auth, guest)).toBe("guest_expired")
        // A guest without an end date does not expire; a non-guest's date is ignored.
        expect(yield* gateResult(auth, yield* account({ isGuest: true }))).toBe("ok")
        expect(yield* gateResult(auth, yield* account({ guestExpiresAt: new Date(start) }))).toBe("ok")
      })))

    it.effect("email_required only with enforcement on, and only without a verified email", () =>
      withDb(Effect.gen(function*() {
        const enforced = yield* makeAuth({ email_enforcement: true })
        const relaxed = yield* makeAuth({ email_enforcement: false })
        const noEmail = yield* account({ email: undefined })
        const unverified = yield* account({ emailVerified: false })
        const verified = yield* account()
        expect(yield* gateResult(enforced, noEmail)).toBe("email_required")
        expect(yield* gateResult(enforced, unverified)).toBe("email_required")
        expect(yield* gateResult(enforced, verified)).toBe("ok")
        expect(yield* gateResult(relaxed, noEmail)).toBe("ok")
        expect(yield* gateResult(relaxed, unverified)).toBe("ok")
      })))

    it.effect("geo_restricted: the configured header, allowed countries, fails closed without the header", () =>
      withDb(Effect.gen(function*() {
        const locked = yield* makeAuth({
          region_lock: { enabled: true, header: "X-Test-Country", allowed_countries: ["KR", "jp"] }
        })
        const open = yield* makeAuth()
        const row = yield* account()
        expect(yield* gateResult(locked, row, { "x-test-country": "KR" })).toBe("ok")
        expect(yield* gateResult(locked, row, { "x-test-country": "kr" })).toBe("ok")
        expect(yield* gateResult(locked, row, { "x-test-country": "JP" })).toBe("ok")
        expect(yield* gateResult(locked, row, { "x-test-country": "US" })).toBe("geo_restricted")
        expect(yield* gateResult(locked, row, {})).toBe("geo_restricted")
        expect(yield* gateResult(locked, row, { "x-test-country": "" })).toBe("geo_restricted")
        // Only the configured (trusted proxy) header counts.
        expect(yield* gateResult(locked, row, { "cf-ipcountry": "KR" })).toBe("geo_restricted")
        // Off by default: no header needed.
        expect(base.config.access.region_lock.enabled).toBe(false)
        expect(yield* gateResult(open, row, {})).toBe("ok")
      })))

    it.effect("order: region, status, legacy, guest, email", () =>
      withDb(Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const auth = yield* makeAuth({
          email_enforcement: true,
          region_lock: { enabled: true, header: "cf-ipcountry", allowed_countries: ["KR"] }
        })
        const past = new Date(Date.now() - 1000)
        const everything = yield* account({
          status: "unlinked",
          isLegacy: true,
          needsMigration: true,
          isGuest: true,
          guestExpiresAt: past,
          email: undefined
        })
        expect(yield* gateResult(auth, everything, { "cf-ipcountry": "US" })).toBe("geo_restricted")
        expect(yield* gateResult(auth, everything, { "cf-ipcountry": "KR" })).toBe("account_unlinked")
        const legacyGuest = yield* account({
          isLegacy: true,
          needsMigration: true,
          isGuest: true,
          guestExpiresAt: past,
          email: undefined
        })
        expect(yield* gateResult(auth, legacyGuest, { "cf-ipcountry": "KR" })).toBe("legacy_account_upgrade_required")
        const guest = yield* account({ isGuest: true, guestExpiresAt: past, email: undefined })
        expect(yield* gateResult(auth, guest, { "cf-ipcountry": "KR" })).toBe("guest_expired")
      })))
  })

  describe("key cache", () => {
    it.effect("malformed or unknown keys are invalid_api_key", () =>
      withDb(Effect.gen(function*() {
        const auth = yield* makeAuth()
        const row = yield* account()
        const { key } = yield* Effect.flatMap(AccountsRepo, (r) => r.createKey(row.id, "k"))
        const code = (header: string | undefined) =>
          auth.authenticateKey(header, "127.0.0.1").pipe(Effect.flip, Effect.map((e) => e.code))
        expect(yield* code(undefined)).toBe("invalid_api_key")
        expect(yield* code("")).toBe("invalid_api_key")
        expect(yield* code(key)).toBe("invalid_api_key") // no "Bearer"
        expect(yield* code(`Basic ${key}`)).toBe("invalid_api_key")
        expect(yield* code(`Bearer ${key} extra`)).toBe("invalid_api_key")
        expect(yield* code(`Bearer ${key.slice(0, 20)}`)).toBe("invalid_api_key")
        expect(yield* code(`Bearer ${key.replace("sk-ws-", "sk-xx-")}`)).toBe("invalid_api_key")
        expect(yield* code(`Bearer ${key.slice(0, -1)}!`)).toBe("invalid_api_key")
        expect(yield* code(`Bearer ${generateKey("sk-ws-")}`)).toBe("invalid_api_key")
        // The scheme is case-insensitive.
        expect((yield* auth.authenticateKey(`bearer ${key}`, "127.0.0.1")).account.id).toBe(row.id)
      })))

    it.effect("a cached key is served without the database for 60 s; invalidation drops it at once", () =>
      withDb(Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const auth = yield* makeAuth()
        const row = yield* account()
        const repo = yield* AccountsRepo
        const a = yield* repo.createKey(row.id, "a")
        const b = yield* repo.createKey(row.id, "b")
        expect(yield* authResult(auth, a.key)).toBe("active")
        expect(yield* authResult(auth, b.key)).toBe("active")

        // Revoked behind the cache's back: still served from the cache until the entry expires.
        yield* revokeInDbOnly(a.row.id)
        yield* TestClock.adjust("59 seconds")
        expect(yield* authResult(auth, a.key)).toBe("active")
        yield* TestClock.adjust("1 second")
        expect(yield* authResult(auth, a.key)).toBe("invalid_api_key")

        // Revoked the way the account API does it: rejected on the very next request.
        expect(yield* authResult(auth, b.key)).toBe("active")
        yield* repo.revokeKeyById(b.row.id)
        yield* auth.invalidateKeys([b.row.key_hash])
        expect(yield* authResult(auth, b.key)).toBe("invalid_api_key")
      })))

    it.effect("concurrent misses of one key send one query; an expired entry sends one more", () =>
      withDb(Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const counted = yield* countingKeyStore
        const auth = yield* Effect.provideService(makeAuth(), KeyStore.KeyStore, counted.store)
        const row = yield* account()
        const { key } = yield* Effect.flatMap(AccountsRepo, (r) => r.createKey(row.id, "k"))
        const burst = Effect.all(Array.from({ length: 40 }, () => authResult(auth, key)), { concurrency: "unbounded" })
        expect(yield* burst).toEqual(Array(40).fill("active"))
        expect(counted.queries()).toBe(1)
        yield* TestClock.adjust("61 seconds")
        expect(yield* burst).toEqual(Array(40).fill("active"))
        expect(counted.queries()).toBe(2)
      })))

    it.effect("a key in use is looked up again before its entry expires; a revocation found so is refused at once", () =>
      withDb(Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const counted = yield* countingKeyStore
        const auth = yield* Effect.provideService(makeAuth(), KeyStore.KeyStore, counted.store)
        const row = yield* account()
        const created = yield* Effect.flatMap(AccountsRepo, (r) => r.createKey(row.id, "k"))
        const key = created.key
        expect(yield* authResult(auth, key)).toBe("active")
        expect(counted.queries()).toBe(1)
        // More than REFRESH_AHEAD_MS before expiry: no lookup.
        yield* TestClock.adjust(`${60_000 - AuthModule.REFRESH_AHEAD_MS - 1} millis`)
        expect(yield* authResult(auth, key)).toBe("active")
        expect(counted.queries()).toBe(1)
        // Within it: served from the cache, and looked up once in the background.
        yield* TestClock.adjust("1 millis")
        expect(yield* authResult(auth, key)).toBe("active")
        expect(yield* authResult(auth, key)).toBe("active")
        yield* Effect.promise(() => eventually(() => counted.queries() === 2, { what: "background key lookup" }))
        const here = Effect.runPromiseWith(yield* Effect.context<never>())
        const refreshDone = () => eventually(async () => (await here(auth.storeLookups)).refreshing === 0, { what: "refresh done" })
        yield* Effect.promise(refreshDone)
        // Past the first entry's expiry the refreshed entry serves the key without a query.
        yield* TestClock.adjust("20 seconds")
        expect(yield* authResult(auth, key)).toBe("active")
        expect(counted.queries()).toBe(2)
        // Revoked behind the cache's back: the next refresh finds it, and the key is refused before the entry's end.
        yield* revokeInDbOnly(created.row.id)
        yield* TestClock.adjust("25 seconds")
        expect(yield* authResult(auth, key)).toBe("active")
        yield* Effect.promise(() => eventually(() => counted.queries() === 3, { what: "background key lookup" }))
        yield* Effect.promise(refreshDone)
        yield* Effect.promise(() =>
          eventually(async () => (await here(authResult(auth, key))) === "invalid_api_key", { what: "refusal" })
        )
        expect(counted.queries()).toBe(3)
      })))

    it.effect("an unknown key is remembered for 5 s", () =>
      withDb(Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const auth = yield* makeAuth()
        const row = yield* account()
        const key = generateKey("sk-ws-")
        expect(yield* authResult(auth, key)).toBe("invalid_api_key")
        // The key appears in the database (e.g. issued by another replica a moment later).
        yield* Effect.flatMap(SqlClient.SqlClient, (sql) =>
          sql`INSERT INTO api_keys (account_id, label, key_hash, key_prefix)
              VALUES (${row.id}, 'late', ${hashKey(key)}, ${key.slice(0, 16)})`).pipe(Effect.orDie)
        yield* TestClock.adjust("4999 millis")
        expect(yield* authResult(auth, key)).toBe("invalid_api_key")
        yield* TestClock.adjust("1 millis")
        expect(yield* authResult(auth, key)).toBe("active")
      })))

    it.effect("invalidateAccount refreshes the cached account (status changes reach the gates)", () =>
      withDb(Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const auth = yield* makeAuth()
        const repo = yield* AccountsRepo
        const row = yield* account()
        const { key } = yield* repo.createKey(row.id, "k")
        expect(yield* authResult(auth, key)).toBe("active")
        yield* repo.setStatus(row.id, "unlinked")
        expect(yield* authResult(auth, key)).toBe("active") // cached copy
        yield* auth.invalidateAccount(row.id)
        expect(yield* authResult(auth, key)).toBe("unlinked")
        const caller = yield* auth.authenticateKey(`Bearer ${key}`, "127.0.0.1")
        expect(yield* gateResult(auth, caller.account)).toBe("account_unlinked")
      })))

    it.effect("last_used_at is stamped at most once a minute", () =>
      withDb(Effect.gen(function*() {
        const start = Date.parse("2026-05-05T05:00:00Z")
        yield* TestClock.setTime(start)
        const auth = yield* makeAuth()
        const repo = yield* AccountsRepo
        const row = yield* account()
        const { key, row: keyRow } = yield* repo.createKey(row.id, "k")
        const lastUsed = Effect.map(repo.listActiveKeys(row.id), (keys) =>
          keys.find((k) => k.id === keyRow.id)!.last_used_at?.getTime() ?? null)

        yield* auth.authenticateKey(`Bearer ${key}`, "127.0.0.1")
        yield* auth.flushTouches
        expect(yield* lastUsed).toBe(start)

        yield* TestClock.adjust("30 seconds")
        yield* auth.authenticateKey(`Bearer ${key}`, "127.0.0.1")
        yield* auth.flushTouches
        expect(yield* lastUsed).toBe(start)

        yield* TestClock.adjust("31 seconds")
        yield* auth.authenticateKey(`Bearer ${key}`, "127.0.0.1")
        yield* auth.flushTouches
        expect(yield* lastUsed).toBe(start + 61_000)
      })))

    it.effect("sessions authenticate as the account without a key", () =>
      withDb(Effect.gen(function*() {
        const auth = yield* makeAuth()
        const row = yield* account()
        const token = yield* Effect.flatMap(AccountsRepo, (r) => r.createSession(row.id, 1))
        const found = yield* auth.authenticateSession(token, "127.0.0.1")
        expect(found?.account.id).toBe(row.id)
        expect(found?.key).toBeNull()
        expect(yield* auth.authenticateSession("nope", "127.0.0.1")).toBeNull()
      })))
  })

  describe("clock", () => {
    it.effect("times written by auth and the account module are the Effect clock's, not the wall clock's", () =>
      withDb(Effect.gen(function*() {
        // A time far from now: a wall-clock or database stamp would show.
        const T = Date.UTC(2030, 0, 2, 3, 4, 5)
        yield* TestClock.setTime(T)
        const repo = yield* AccountsRepo
        const row = yield* account({ emailVerified: true })
        expect(row.email_verified_at?.getTime()).toBe(T)
        const a = yield* repo.createKey(row.id, "a")
        const b = yield* repo.createKey(row.id, "b")

        yield* TestClock.adjust("1 second")
        expect((yield* repo.revokeKeyById(a.row.id))?.revoked_at?.getTime()).toBe(T + 1_000)

        // A key's last-used stamp, and its account's.
        const auth = yield* makeAuth()
        yield* auth.authenticateKey(`Bearer ${b.key}`, "127.0.0.1")
        yield* auth.flushTouches
        expect((yield* repo.findAccount(row.id))?.last_used_at?.getTime()).toBe(T + 1_000)

        yield* TestClock.adjust("1 second")
        const rotated = yield* repo.rotate(row.id)
        expect(rotated.revoked.map((k) => k.revoked_at?.getTime())).toEqual([T + 2_000])
        expect((yield* repo.findAccount(row.id))?.last_rotated_at?.getTime()).toBe(T + 2_000)
      })))
  })
})
