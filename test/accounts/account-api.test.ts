/**
 * The account API over HTTP on a running gateway, once per storage back end (embedded PGlite and real
 * PostgreSQL). Admission is the real in-memory engine, so the endpoint rate limits are the real limiter.
 */
import { Effect, Result } from "effect"
import { TestClock } from "effect/testing"
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import { Leaderboard } from "../../src/accounts/Leaderboard.js"
import { rotateKey } from "../../src/accounts/Keys.js"
import { Auth } from "../../src/auth/Auth.js"
import { hashKey } from "../../src/auth/KeyMaterial.js"
import { layerFromConfig } from "../../src/quota/layer.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import {
  call,
  chat,
  errorRow,
  flushRequestLog,
  insertRows,
  newKey,
  newUser,
  query,
  row,
  sortedKeys
} from "./support.js"

const postgresAvailable = await serviceGate("postgres")

const SNAPSHOT_KEYS = [
  "profile",
  "rebindRequest",
  "display_id",
  "plan",
  "contributor",
  "modelUsage",
  "recentRequests",
  "totals",
  "rpm",
  "rank",
  "today_self"
]
const PROFILE_KEYS = [
  "createdAt",
  "lastUsedAt",
  "livenessBlockedAt",
  "nextLivenessAt",
  "passwordChangedAt",
  "lastNickChangedAt",
  "nicknameCooldownUntil",
  "email",
  "emailVerified",
  "passkeyCount",
  "communityId",
  "communityType",
  "displayName",
  "status",
  "isAdmin",
  "isLegacy",
  "username",
  "sfwMode",
  "needsMigration"
]
const METRICS_KEYS = [
  "range",
  "model",
  "since",
  "until",
  "bucket_seconds",
  "totals",
  "latency",
  "tps",
  "tokens",
  "tools",
  "errors",
  "by_model",
  "byok",
  "series"
]
const REQUEST_ROW_KEYS = [
  "id",
  "created_at",
  "model_id",
  "status",
  "error_code",
  "input_tokens",
  "output_tokens",
  "reasoning_tokens",
  "prompt_cached_tokens",
  "duration_ms",
  "tps",
  "had_tools",
  "byok",
  "fell_back"
]
const RECENT_ROW_KEYS = ["id", "model_id", "status", "created_at", "input_tokens", "output_tokens", "tps", "error"]
const KEY_RECORD_KEYS = ["id", "label", "key_prefix", "created_at", "last_used_at", "revealable", "legacy"]
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/

const backends = [
  { name: "embedded PGlite", postgres: false },
  { name: "PostgreSQL", postgres: true }
] as const

describe.each(backends)("account API on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  let gw: TestGateway
  let db: FreshDatabase | undefined

  beforeAll(async () => {
    if (skip) return
    db = postgres ? await freshDatabase("acct") : undefined
    gw = await startGateway({
      admission: layerFromConfig({ abuse: { burst: 300, window_seconds: 10, cooldown_seconds: 60 } }),
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        // Production mode has no generated key-encryption key; configure one so keys are revealable.
        if (postgres) doc.encryption_key = Crypto.randomBytes(32).toString("base64")
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
  })

  describe.skipIf(skip)("authentication", () => {
    const endpoints: Array<[string, string, "bare" | "wrapped"]> = [
      ["GET", "/api/user/me", "bare"],
      ["GET", "/api/user/me/metrics", "bare"],
      ["GET", "/api/user/me/requests", "bare"],
      ["POST", "/api/user/sfw", "wrapped"],
      ["GET", "/api/user/me/keys", "wrapped"],
      ["POST", "/api/user/me/keys", "wrapped"],
      ["DELETE", "/api/user/me/keys/1", "wrapped"],
      ["GET", "/api/user/me/keys/1/reveal", "wrapped"],
      ["POST", "/api/user/me/rotate-key", "wrapped"]
    ]

    it.each(endpoints)("%s %s without cookie or key is 401 without a code", async (method, path, form) => {
      const res = await call(gw, method, path)
      expect(res.status).toBe(401)
      if (form === "wrapped") {
        expect(sortedKeys(res.body)).toEqual(["error", "success"])
        expect(res.body.success).toBe(false)
      } else {
        expect(sortedKeys(res.body)).toEqual(["error"])
      }
      expect(res.body.error.code).toBeUndefined()
      expect(typeof res.body.error.message).toBe("string")
      expect(res.body.error.type).toBe("invalid_request_error")
    })

    it("rejects a malformed key, a revoked key, an unknown cookie and a revoked session", async () => {
      const u = await newUser(gw)
      expect((await call(gw, "GET", "/api/user/me/keys", { key: "sk-ws-nope" })).status).toBe(401)
      expect((await call(gw, "GET", "/api/user/me/keys", { session: "not-a-session" })).status).toBe(401)
      const other = await newKey(gw, u.account.id, "doomed")
      await gw.run(Effect.flatMap(AccountsRepo, (r) => r.revokeKey(u.account.id, other.id)))
      await gw.run(Effect.flatMap(Auth, (a) => a.invalidateKeys([hashKey(other.key)])))
      expect((await call(gw, "GET", "/api/user/me/keys", { key: other.key })).status).toBe(401)
      await query(gw, "UPDATE sessions SET revoked_at = now() WHERE account_id = $1", [u.account.id])
      expect((await call(gw, "GET", "/api/user/me/keys", { session: u.session })).status).toBe(401)
    })

    it("rejects an expired session", async () => {
      const u = await newUser(gw)
      await query(gw, "UPDATE sessions SET expires_at = now() - interval '1 minute' WHERE account_id = $1", [u.account.id])
      expect((await call(gw, "GET", "/api/user/me", { session: u.session })).status).toBe(401)
    })

    it("accepts the ws-session cookie, a Bearer key, and a key behind an unknown cookie", async () => {
      const u = await newUser(gw)
      for (const options of [{ session: u.session }, { key: u.key }, { session: "stale", key: u.key }]) {
        const res = await call(gw, "GET", "/api/user/me", options)
        expect(res.status).toBe(200)
        expect(res.body.profile.username).toBe(u.account.username)
      }
    })
  })

  describe.skipIf(skip)("GET /api/user/me", () => {
    it("is a bare object with exactly the eleven keys and the 19 profile fields", async () => {
      const u = await newUser(gw, { communityId: "c-12345", communityType: "naver-cafe", plan: "default" })
      const res = await call(gw, "GET", "/api/user/me", { session: u.session })
      expect(res.status).toBe(200)
      expect(sortedKeys(res.body)).toEqual([...SNAPSHOT_KEYS].sort())
      const p = res.body.profile
      expect(sortedKeys(p)).toEqual([...PROFILE_KEYS].sort())
      expect(p.createdAt).toBe(u.account.created_at.getTime())
      expect(p.lastUsedAt).toBeNull()
      for (const f of ["livenessBlockedAt", "nextLivenessAt", "passwordChangedAt", "lastNickChangedAt", "nicknameCooldownUntil"]) {
        expect(p[f]).toBeNull()
      }
      expect(p.email).toBe(u.account.email)
      expect(p.email).toContain("@example.com")
      expect(p.emailVerified).toBe(true)
      expect(p.passkeyCount).toBe(0)
      expect(p.communityId).toBe("c-12345")
      expect(p.communityType).toBe("naver-cafe")
      expect(p).toMatchObject({
        displayName: "테스터",
        status: "active",
        isAdmin: false,
        isLegacy: false,
        username: u.account.username,
        sfwMode: false,
        needsMigration: false
      })
      expect(res.body.rebindRequest).toBeNull()
      expect(res.body.contributor).toBeNull()
      expect(res.body.display_id).toBe(u.account.display_id)
      expect(res.body.rpm).toEqual({ current: 0 })
      expect(res.body.totals).toEqual({ totalRequests: 0, totalTokens: 0 })
      expect(res.body.recentRequests).toEqual([])
      expect(res.body.modelUsage).toEqual([])
      expect(res.body.rank).toBeNull()
      expect(res.body.today_self).toMatchObject({ rank: null, tokens: 0, requests: 0, attempted: 0 })
      expect(sortedKeys(res.body.today_self)).toEqual(["attempted", "leader_tokens", "rank", "requests", "tokens"])
    })

    it("renders ISO dates and epoch-ms numbers as specified", async () => {
      const u = await newUser(gw)
      const at = new Date("2026-01-02T03:04:05.000Z")
      await query(
        gw,
        `UPDATE accounts SET liveness_blocked_at = $2, next_liveness_at = $2, password_changed_at = $2,
          last_nick_changed_at = $2, last_used_at = $2, email_verified_at = NULL WHERE id = $1`,
        [u.account.id, at]
      )
      const p = (await call(gw, "GET", "/api/user/me", { key: u.key })).body.profile
      expect(p.livenessBlockedAt).toBe(at.toISOString())
      expect(p.nextLivenessAt).toBe(at.toISOString())
      expect(p.passwordChangedAt).toBe(at.toISOString())
      expect(p.lastNickChangedAt).toBe(at.toISOString())
      expect(p.nicknameCooldownUntil).toBeNull()
      expect(p.lastUsedAt).toBe(at.getTime())
      expect(typeof p.createdAt).toBe("number")
      expect(p.emailVerified).toBe(false)
    })

    it("plan: visible absolutes, an active session window and by_model of successful requests only", async () => {
      const u = await newUser(gw)
      // A real request starts the session and weekly windows.
      const first = await chat(gw, u.key)
      expect(first.status).toBe(200)
      await flushRequestLog(gw)
      await insertRows(gw, [
        row(u.account.id, { model_id: "ws-lite", weighted_cost: 1000, created_at: new Date() }),
        row(u.account.id, { model_id: "ws-lite", weighted_cost: 1000, created_at: new Date() }),
        errorRow(u.account.id, "upstream_error", 500, { model_id: "ws-reasoner", created_at: new Date() })
      ])
      const res = await call(gw, "GET", "/api/user/me", { key: u.key })
      const { session, weekly } = res.body.plan
      expect(sortedKeys(session)).toEqual(
        ["used", "limit", "remaining", "used_pct", "resets_at", "resets_in_seconds", "active", "by_model"].sort()
      )
      expect(sortedKeys(weekly)).toEqual(
        ["used", "limit", "remaining", "used_pct", "resets_at", "resets_in_seconds", "anchor_at", "by_model"].sort()
      )
      expect(session.active).toBe(true)
      expect(session.limit).toBe(2_000_000)
      expect(session.used).toBeGreaterThan(0)
      expect(session.remaining).toBe(session.limit - session.used)
      expect(session.resets_at).toMatch(ISO)
      expect(session.resets_in_seconds).toBeGreaterThan(4 * 3600)
      expect(weekly.limit).toBe(20_000_000)
      expect(weekly.anchor_at).toMatch(ISO)
      const models = session.by_model.map((m: any) => m.model_id)
      expect(models).toContain("ws-lite")
      expect(models).toContain("ws-pro")
      expect(models).not.toContain("ws-reasoner")
      const lite = session.by_model.find((m: any) => m.model_id === "ws-lite")
      expect(sortedKeys(lite)).toEqual(["model_id", "pct_of_total", "request_count", "weighted"])
      expect(lite.request_count).toBe(2)
      expect(lite.weighted).toBe(2000)
      const pctSum = session.by_model.reduce((s: number, m: any) => s + m.pct_of_total, 0)
      expect(pctSum).toBeGreaterThan(99.9)
      expect(pctSum).toBeLessThan(100.1)
      expect(res.body.rpm.current).toBe(1)
    })

    it("plan: absolutes and per-model weights are all null when the plan hides them", async () => {
      const u = await newUser(gw, { plan: "community" })
      expect((await chat(gw, u.key)).status).toBe(200)
      await flushRequestLog(gw)
      const { session, weekly } = (await call(gw, "GET", "/api/user/me", { key: u.key })).body.plan
      for (const pool of [session, weekly]) {
        expect(pool.used).toBeNull()
        expect(pool.limit).toBeNull()
        expect(pool.remaining).toBeNull()
        expect(typeof pool.used_pct).toBe("number")
        expect(pool.by_model.length).toBeGreaterThan(0)
        for (const m of pool.by_model) {
          expect(m.weighted).toBeNull()
          expect(m.request_count).toBeGreaterThan(0)
        }
      }
      expect(session.active).toBe(true)
    })

    it("plan: an idle account has an inactive session and no anchor", async () => {
      const u = await newUser(gw)
      const { session, weekly } = (await call(gw, "GET", "/api/user/me", { key: u.key })).body.plan
      expect(session).toMatchObject({ used: 0, remaining: 2_000_000, resets_at: null, active: false, by_model: [] })
      expect(weekly).toMatchObject({ used: 0, resets_at: null, anchor_at: null, by_model: [] })
    })

    it("recentRequests: the last 20 rows, newest first, in snake_case; totals and modelUsage over 24 h", async () => {
      const u = await newUser(gw)
      const now = Date.now()
      const rows = Array.from({ length: 25 }, (_, i) =>
        row(u.account.id, {
          created_at: new Date(now - (i + 1) * 60_000),
          input_tokens: 10,
          output_tokens: 5,
          model_id: i % 2 === 0 ? "ws-pro" : "ws-lite"
        }))
      const old = row(u.account.id, { created_at: new Date(now - 25 * 3600_000), input_tokens: 999, output_tokens: 999 })
      const failed = errorRow(u.account.id, "rate_limited", 429, { created_at: new Date(now - 30_000) })
      await insertRows(gw, [...rows, old, failed])
      const body = (await call(gw, "GET", "/api/user/me", { session: u.session })).body
      expect(body.recentRequests).toHaveLength(20)
      expect(sortedKeys(body.recentRequests[0])).toEqual([...RECENT_ROW_KEYS].sort())
      expect(body.recentRequests[0].id).toBe(failed.id)
      expect(body.recentRequests[0].status).toBe("error")
      expect(typeof body.recentRequests[0].error).toBe("string")
      expect(body.recentRequests[1].id).toBe(rows[0]!.id)
      expect(body.recentRequests[1].created_at).toMatch(ISO)
      expect(body.recentRequests[1].error).toBeNull()
      const times = body.recentRequests.map((r: any) => Date.parse(r.created_at))
      expect([...times].sort((a, b) => b - a)).toEqual(times)
      expect(body.totals).toEqual({ totalRequests: 26, totalTokens: 25 * 15 })
      const pro = body.modelUsage.find((m: any) => m.modelId === "ws-pro")
      expect(pro).toEqual({ modelId: "ws-pro", requests: 14, successes: 13, inputTokens: 130, outputTokens: 65, totalTokens: 195 })
    })

    it("rank and today_self: today's leaderboard by tokens; guests are not ranked", async () => {
      const top = await newUser(gw)
      const second = await newUser(gw)
      const guest = await newUser(gw, { isGuest: true })
      const now = new Date()
      const dayStart = Math.floor(now.getTime() / 86_400_000) * 86_400_000
      const big = (accountId: string, n: number, over: Parameters<typeof row>[1] = {}) =>
        Array.from({ length: n }, () => row(accountId, { input_tokens: 2_000_000_000, output_tokens: 0, created_at: now, ...over }))
      // Huge counts keep these accounts ahead of every other test's rows.
      await insertRows(gw, [
        ...big(top.account.id, 4),
        ...big(second.account.id, 2),
        errorRow(second.account.id, "rate_limited", 429, { created_at: now }),
        // Yesterday's rows do not count.
        ...big(second.account.id, 5, { created_at: new Date(dayStart - 60_000) }),
        // Guests are not on the board.
        ...big(guest.account.id, 5)
      ])
      // The board is refreshed every 30 s (Leaderboard.ts); these rows were written behind its back.
      await gw.run(Effect.flatMap(Leaderboard, (board) => board.invalidate))
      const a = (await call(gw, "GET", "/api/user/me", { key: top.key })).body
      const b = (await call(gw, "GET", "/api/user/me", { key: second.key })).body
      const g = (await call(gw, "GET", "/api/user/me", { key: guest.key })).body
      expect(a.rank).toBe(1)
      expect(a.today_self).toEqual({ rank: 1, tokens: 8_000_000_000, requests: 4, attempted: 4, leader_tokens: 8_000_000_000 })
      expect(b.rank).toBe(2)
      expect(b.today_self).toEqual({ rank: 2, tokens: 4_000_000_000, requests: 2, attempted: 3, leader_tokens: 8_000_000_000 })
      expect(g.rank).toBeNull()
      expect(g.today_self).toEqual({ rank: null, tokens: 10_000_000_000, requests: 5, attempted: 5, leader_tokens: 8_000_000_000 })
      expect(g.display_id).toBeNull()
    })

    it("rank orders by today's tokens", async () => {
      const big = await newUser(gw)
      const small = await newUser(gw)
      const now = new Date()
      await insertRows(gw, [
        row(big.account.id, { input_tokens: 2_000_000_000, output_tokens: 1_000_000_000, created_at: now }),
        row(big.account.id, { input_tokens: 2_000_000_000, output_tokens: 1_000_000_000, created_at: now }),
        row(big.account.id, { input_tokens: 2_000_000_000, output_tokens: 1_000_000_000, created_at: now }),
        row(small.account.id, { input_tokens: 2_000_000_000, output_tokens: 1_000_000_000, created_at: now })
      ])
      await gw.run(Effect.flatMap(Leaderboard, (board) => board.invalidate))
      const a = (await call(gw, "GET", "/api/user/me", { key: big.key })).body
      const b = (await call(gw, "GET", "/api/user/me", { key: small.key })).body
      expect(a.rank).toBe(1)
      expect(a.today_self).toMatchObject({ rank: 1, tokens: 9_000_000_000, requests: 3, leader_tokens: 9_000_000_000 })
      // 8e9 (previous test's leader, if it ran) and 9e9 are ahead of 3e9.
      expect(b.rank).toBeGreaterThan(1)
      expect(b.today_self).toMatchObject({ rank: b.rank, tokens: 3_000_000_000, leader_tokens: 9_000_000_000 })
    })

    it("403 for a legacy account that must migrate is a bare {error: string}", async () => {
      const u = await newUser(gw, { isLegacy: true, needsMigration: true })
      const res = await call(gw, "GET", "/api/user/me", { key: u.key })
      expect(res.status).toBe(403)
      expect(sortedKeys(res.body)).toEqual(["error"])
      expect(typeof res.body.error).toBe("string")
      expect(res.body.error.length).toBeGreaterThan(0)
      const migrated = await newUser(gw, { isLegacy: true, needsMigration: false })
      const ok = await call(gw, "GET", "/api/user/me", { key: migrated.key })
      expect(ok.status).toBe(200)
      expect(ok.body.profile.isLegacy).toBe(true)
    })

    it("an unlinked account still reads its snapshot", async () => {
      const u = await newUser(gw, { status: "unlinked" })
      const res = await call(gw, "GET", "/api/user/me", { session: u.session })
      expect(res.status).toBe(200)
      expect(res.body.profile.status).toBe("unlinked")
    })
  })

  describe.skipIf(skip)("GET /api/user/me/metrics", () => {
    it("defaults to 24h with every key, null ratios on empty samples and a dense series", async () => {
      const u = await newUser(gw)
      const res = await call(gw, "GET", "/api/user/me/metrics", { key: u.key })
      expect(res.status).toBe(200)
      const m = res.body
      expect(sortedKeys(m)).toEqual([...METRICS_KEYS].sort())
      expect(m.range).toBe("24h")
      expect(m.model).toBeNull()
      expect(Date.parse(m.until) - Date.parse(m.since)).toBe(86_400_000)
      expect(m.since).toMatch(ISO)
      expect(m.bucket_seconds).toBe(1800)
      expect(m.totals).toEqual({ requests: 0, success: 0, errors: 0, cancelled: 0, success_rate: null })
      expect(m.latency).toEqual({ ttfb_p50: null, ttfb_p95: null, duration_p50: null, duration_p95: null })
      expect(m.tps).toEqual({ avg: null, p50: null, max: null })
      expect(m.tokens).toEqual({ input: 0, output: 0, reasoning: 0, cached: 0, total: 0, cache_rate: null })
      expect(m.tools).toEqual({ with_tools: 0, with_tools_rate: null, choices: [] })
      expect(m.errors).toEqual({ total: 0, by_code: [], by_tier: { client: 0, limit: 0, server: 0 } })
      expect(m.by_model).toEqual([])
      expect(m.byok).toEqual({
        requests: 0,
        success: 0,
        errors: 0,
        fell_back: 0,
        input_tokens: 0,
        output_tokens: 0,
        total_tokens: 0,
        by_provider: []
      })
      expect(m.series.length).toBeGreaterThanOrEqual(48)
      expect(m.series.length).toBeLessThanOrEqual(49)
      expect(m.series.every((b: any) => b.requests === 0)).toBe(true)
      expect(m.series[0].start).toMatch(ISO)
    })

    it.each([["1h", 60], ["4h", 300], ["24h", 1800], ["7d", 10800], ["30d", 43200]])(
      "range %s is accepted with %i-second buckets",
      async (range, bucket) => {
        const u = await newUser(gw)
        const res = await call(gw, "GET", `/api/user/me/metrics?range=${range}`, { key: u.key })
        expect(res.status).toBe(200)
        expect(res.body.range).toBe(range)
        expect(res.body.bucket_seconds).toBe(bucket)
        const span = (Date.parse(res.body.until) - Date.parse(res.body.since)) / 1000
        expect(res.body.series.length).toBeGreaterThanOrEqual(Math.floor(span / bucket))
        expect(res.body.series.length).toBeLessThanOrEqual(Math.floor(span / bucket) + 1)
      }
    )

    it.each(["2h", "1d", "24H", "all", "24h "])("range %j is 400 listing the allowed values", async (range) => {
      const u = await newUser(gw)
      const res = await call(gw, "GET", `/api/user/me/metrics?range=${encodeURIComponent(range)}`, { key: u.key })
      expect(res.status).toBe(400)
      expect(sortedKeys(res.body)).toEqual(["error"])
      expect(res.body.error.code).toBeUndefined()
      for (const allowed of ["1h", "4h", "24h", "7d", "30d"]) expect(res.body.error.message).toContain(allowed)
    })

    it("aggregates latency, tokens, tools, errors by tier, models, byok and series in SQL", async () => {
      const u = await newUser(gw)
      const now = Date.now()
      const at = (minutesAgo: number) => new Date(now - minutesAgo * 60_000)
      const ok = [100, 200, 300, 400, 500].map((ttfb, i) =>
        row(u.account.id, {
          ttfb_ms: ttfb,
          duration_ms: ttfb * 10,
          tps: 10 * (i + 1),
          input_tokens: 1000,
          output_tokens: 100,
          reasoning_tokens: 20,
          prompt_cached_tokens: 250,
          created_at: at(5 + i)
        })
      )
      const tools = [
        row(u.account.id, { had_tools: true, tool_choice: "auto", model_id: "ws-lite", created_at: at(20) }),
        row(u.account.id, { had_tools: true, tool_choice: "auto", model_id: "ws-lite", created_at: at(21) }),
        row(u.account.id, { had_tools: true, tool_choice: null, model_id: "ws-lite", created_at: at(22) }),
        row(u.account.id, { had_tools: true, tool_choice: "function:" + "x".repeat(100), model_id: "ws-lite", created_at: at(23) })
      ]
      const errors = [
        errorRow(u.account.id, "rate_limited", 429, { created_at: at(30) }),
        errorRow(u.account.id, "rate_limited", 429, { created_at: at(31) }),
        errorRow(u.account.id, "model_overloaded", 529, { created_at: at(32) }),
        errorRow(u.account.id, "upstream_error", 500, { created_at: at(33) }),
        errorRow(u.account.id, "invalid_messages", 400, { created_at: at(34) }),
        errorRow(u.account.id, null, 499, { created_at: at(35) })
      ]
      const byok = [
        row(u.account.id, { byok: true, provider: "openai", model_id: "@openai/gpt-x", created_at: at(40), input_tokens: 7, output_tokens: 3 }),
        row(u.account.id, { byok: true, provider: "openai", fell_back: true, created_at: at(41), input_tokens: 7, output_tokens: 3 }),
        errorRow(u.account.id, "upstream_error", 500, { byok: true, provider: "anthropic", created_at: at(42) })
      ]
      const outside = row(u.account.id, { created_at: new Date(now - 25 * 3600_000), ttfb_ms: 99_999 })
      const stranger = await newUser(gw)
      const theirs = row(stranger.account.id, { ttfb_ms: 77_777, created_at: at(1) })
      await insertRows(gw, [...ok, ...tools, ...errors, ...byok, outside, theirs])

      const m = (await call(gw, "GET", "/api/user/me/metrics?range=24h", { key: u.key })).body
      const total = ok.length + tools.length + errors.length + byok.length
      expect(m.totals).toEqual({
        requests: total,
        success: ok.length + tools.length + 2,
        errors: 6,
        cancelled: 1,
        success_rate: Math.round(((ok.length + tools.length + 2) / total) * 10_000) / 10_000
      })
      // percentile_cont over successful rows only (the tool and byok rows have ttfb 100, duration 1000)
      const ttfbs = [100, 200, 300, 400, 500, 100, 100, 100, 100, 100, 100].sort((a, b) => a - b)
      const pct = (xs: Array<number>, p: number) => {
        const pos = (xs.length - 1) * p
        const lo = Math.floor(pos)
        return xs[lo]! + (xs[Math.ceil(pos)]! - xs[lo]!) * (pos - lo)
      }
      expect(m.latency.ttfb_p50).toBe(Math.round(pct(ttfbs, 0.5)))
      expect(m.latency.ttfb_p95).toBe(Math.round(pct(ttfbs, 0.95)))
      expect(m.latency.duration_p95).toBe(Math.round(pct(ttfbs.map((t) => t * 10), 0.95)))
      expect(m.tps.max).toBe(50)
      expect(m.tokens.input).toBe(5 * 1000 + 4 * 100 + 14)
      expect(m.tokens.cached).toBe(5 * 250)
      expect(m.tokens.reasoning).toBe(100)
      expect(m.tokens.total).toBe(m.tokens.input + m.tokens.output)
      expect(m.tokens.cache_rate).toBe(Math.round((1250 / m.tokens.input) * 10_000) / 10_000)
      expect(m.tools.with_tools).toBe(4)
      expect(m.tools.with_tools_rate).toBe(Math.round((4 / total) * 10_000) / 10_000)
      expect(m.tools.choices[0]).toEqual({ choice: "auto", count: 2 })
      expect(m.tools.choices).toContainEqual({ choice: "unset", count: 1 })
      const long = m.tools.choices.find((c: any) => c.choice.startsWith("function:"))
      expect(long.choice.length).toBe(64)
      expect(m.errors.total).toBe(7)
      expect(m.errors.by_code).toContainEqual({ code: "rate_limited", tier: "limit", count: 2 })
      expect(m.errors.by_code).toContainEqual({ code: "model_overloaded", tier: "limit", count: 1 })
      expect(m.errors.by_code).toContainEqual({ code: "upstream_error", tier: "server", count: 2 })
      expect(m.errors.by_code).toContainEqual({ code: "invalid_messages", tier: "client", count: 1 })
      expect(m.errors.by_code).toContainEqual({ code: "cancelled", tier: "client", count: 1 })
      expect(m.errors.by_tier).toEqual({ client: 2, limit: 3, server: 2 })
      const pro = m.by_model.find((x: any) => x.model_id === "ws-pro")
      expect(pro.requests).toBe(ok.length + errors.length + 2)
      expect(m.by_model.find((x: any) => x.model_id === "ws-lite")).toMatchObject({ requests: 4, success: 4, success_rate: 1 })
      expect(m.byok).toMatchObject({ requests: 3, success: 2, errors: 1, fell_back: 1, input_tokens: 14, output_tokens: 6 })
      expect(m.byok.by_provider).toEqual([
        expect.objectContaining({ provider: "openai", requests: 2, success: 2 }),
        expect.objectContaining({ provider: "anthropic", requests: 1, errors: 1, success_rate: 0 })
      ])
      const seriesTotal = m.series.reduce((s: number, b: any) => s + b.requests, 0)
      expect(seriesTotal).toBe(total)
      const bucketMs = m.bucket_seconds * 1000
      for (const b of m.series) expect(Date.parse(b.start) % bucketMs).toBe(0)

      // 1h excludes rows older than an hour
      const hour = (await call(gw, "GET", "/api/user/me/metrics?range=1h", { key: u.key })).body
      expect(hour.totals.requests).toBe(total)
      const week = (await call(gw, "GET", "/api/user/me/metrics?range=7d", { key: u.key })).body
      expect(week.totals.requests).toBe(total + 1)
    })

    it("tools.choices is a top-10 distribution", async () => {
      const u = await newUser(gw)
      const rows = Array.from({ length: 12 }, (_, i) =>
        Array.from({ length: 12 - i }, () => row(u.account.id, { had_tools: true, tool_choice: `function:f${i}` }))).flat()
      await insertRows(gw, rows)
      const m = (await call(gw, "GET", "/api/user/me/metrics", { key: u.key })).body
      expect(m.tools.choices).toHaveLength(10)
      expect(m.tools.choices[0]).toEqual({ choice: "function:f0", count: 12 })
      expect(m.tools.with_tools_rate).toBe(1)
    })

    it("ratios are null, not 0, when only the relevant sample is empty", async () => {
      const u = await newUser(gw)
      // Only failures: success_rate is 0 (a real ratio), latency and tps have no sample, no input tokens.
      await insertRows(gw, [errorRow(u.account.id, "rate_limited", 429), errorRow(u.account.id, "upstream_error", 500)])
      const m = (await call(gw, "GET", "/api/user/me/metrics", { key: u.key })).body
      expect(m.totals.success_rate).toBe(0)
      expect(m.latency).toEqual({ ttfb_p50: null, ttfb_p95: null, duration_p50: null, duration_p95: null })
      expect(m.tps.avg).toBeNull()
      expect(m.tokens.cache_rate).toBeNull()
      expect(m.tools.with_tools_rate).toBe(0)
      expect(m.errors.by_tier).toEqual({ client: 0, limit: 1, server: 1 })
    })

    it("model filters; an unknown model is an empty result; long values are truncated to 128", async () => {
      const u = await newUser(gw)
      await insertRows(gw, [row(u.account.id, { model_id: "ws-lite" }), row(u.account.id, { model_id: "ws-pro" })])
      const lite = (await call(gw, "GET", "/api/user/me/metrics?model=ws-lite", { key: u.key })).body
      expect(lite.model).toBe("ws-lite")
      expect(lite.totals.requests).toBe(1)
      expect(lite.by_model.map((x: any) => x.model_id)).toEqual(["ws-lite"])
      const unknown = await call(gw, "GET", "/api/user/me/metrics?model=no-such-model", { key: u.key })
      expect(unknown.status).toBe(200)
      expect(unknown.body.totals).toMatchObject({ requests: 0, success_rate: null })
      expect(unknown.body.by_model).toEqual([])
      const long = "m".repeat(300)
      const truncated = await call(gw, "GET", `/api/user/me/metrics?model=${long}`, { key: u.key })
      expect(truncated.status).toBe(200)
      expect(truncated.body.model).toBe("m".repeat(128))
      const empty = (await call(gw, "GET", "/api/user/me/metrics?model=", { key: u.key })).body
      expect(empty.model).toBeNull()
      expect(empty.totals.requests).toBe(2)
    })

    it("includes real requests made through /v1/chat/completions", async () => {
      const u = await newUser(gw)
      expect((await chat(gw, u.key)).status).toBe(200)
      expect((await chat(gw, u.key, { stream: true })).status).toBe(200)
      expect((await chat(gw, u.key, { model: "ws-embed" })).status).toBe(400)
      await flushRequestLog(gw)
      const m = (await call(gw, "GET", "/api/user/me/metrics?range=1h", { key: u.key })).body
      expect(m.totals.requests).toBe(3)
      expect(m.totals.success).toBe(2)
      expect(m.latency.duration_p50).not.toBeNull()
      expect(m.tokens.input).toBeGreaterThan(0)
      expect(m.errors.by_code).toEqual([{ code: "model_not_chat", tier: "client", count: 1 }])
    })
  })

  describe.skipIf(skip)("GET /api/user/me/requests", () => {
    let u: Awaited<ReturnType<typeof newUser>>
    let rows: Array<ReturnType<typeof row>>
    beforeAll(async () => {
      if (skip) return
      u = await newUser(gw)
      const now = Date.now()
      rows = Array.from({ length: 55 }, (_, i) => row(u.account.id, { created_at: new Date(now - (i + 1) * 1000) }))
      await insertRows(gw, rows)
    })

    it.each([
      [undefined, 20],
      ["", 20],
      ["abc", 20],
      ["-5", 20],
      ["0", 20],
      ["1", 1],
      ["7", 7],
      ["2.9", 2],
      ["50", 50],
      ["51", 50],
      ["100000", 50]
    ])("limit=%j applies %i and echoes it", async (limit, applied) => {
      const path = limit === undefined ? "/api/user/me/requests" : `/api/user/me/requests?limit=${limit}`
      const res = await call(gw, "GET", path, { session: u.session })
      expect(res.status).toBe(200)
      expect(sortedKeys(res.body)).toEqual(["limit", "requests"])
      expect(res.body.limit).toBe(applied)
      expect(res.body.requests).toHaveLength(applied)
    })

    it("rows carry exactly the spec's fields, newest first", async () => {
      const res = await call(gw, "GET", "/api/user/me/requests?limit=50", { key: u.key })
      const first = res.body.requests[0]
      expect(sortedKeys(first)).toEqual([...REQUEST_ROW_KEYS].sort())
      expect(first.id).toBe(rows[0]!.id)
      expect(first.created_at).toMatch(ISO)
      expect(first).toMatchObject({
        model_id: "ws-pro",
        status: "success",
        error_code: null,
        input_tokens: 100,
        output_tokens: 50,
        reasoning_tokens: 0,
        prompt_cached_tokens: 0,
        duration_ms: 1000,
        tps: 50,
        had_tools: false,
        byok: false,
        fell_back: false
      })
      expect(res.body.requests.map((r: any) => r.id)).toEqual(rows.slice(0, 50).map((r) => r.id))
    })

    it("shows real rows with their error code, and never another account's rows", async () => {
      const v = await newUser(gw)
      expect((await chat(gw, v.key)).status).toBe(200)
      expect((await chat(gw, v.key, { model: "nope" })).status).toBe(400)
      await flushRequestLog(gw)
      const mine = (await call(gw, "GET", "/api/user/me/requests", { key: v.key })).body.requests
      expect(mine).toHaveLength(2)
      expect(mine[0]).toMatchObject({ status: "error", error_code: "model_not_found", model_id: "nope" })
      expect(mine[1]).toMatchObject({ status: "success", error_code: null, model_id: "ws-pro" })
      expect(mine[1].output_tokens).toBeGreaterThan(0)
      const ids = new Set(rows.map((r) => r.id))
      expect(mine.some((r: any) => ids.has(r.id))).toBe(false)
    })
  })

  describe.skipIf(skip)("POST /api/user/sfw", () => {
    it.each<[string, unknown, boolean]>([
      ["true", { sfw_mode: true }, true],
      ["false", { sfw_mode: false }, false],
      ["string true", { sfw_mode: "true" }, false],
      ["number 1", { sfw_mode: 1 }, false],
      ["null", { sfw_mode: null }, false],
      ["missing field", {}, false],
      ["array", "[true]", false],
      ["invalid JSON", "{sfw_mode: true", false],
      ["empty body", "", false],
      ["bare true", "true", false]
    ])("%s gives sfw_mode %s and never rejects", async (_name, body, expected) => {
      const u = await newUser(gw)
      // start from the opposite value so the write is observable
      await query(gw, "UPDATE accounts SET sfw_mode = $2 WHERE id = $1", [u.account.id, !expected])
      const res = await call(gw, "POST", "/api/user/sfw", { session: u.session, body: body === "" ? " " : body })
      expect(res.status).toBe(200)
      expect(res.body).toEqual({ success: true, sfw_mode: expected })
      const me = (await call(gw, "GET", "/api/user/me", { session: u.session })).body
      expect(me.profile.sfwMode).toBe(expected)
    })
  })

  describe.skipIf(skip)("API keys", () => {
    it("lists active keys oldest first with the record fields, never plaintext or hash", async () => {
      const u = await newUser(gw)
      const second = await newKey(gw, u.account.id, "second")
      const revoked = await newKey(gw, u.account.id, "revoked")
      await gw.run(Effect.flatMap(AccountsRepo, (r) => r.revokeKey(u.account.id, revoked.id)))
      const res = await call(gw, "GET", "/api/user/me/keys", { session: u.session })
      expect(res.status).toBe(200)
      expect(sortedKeys(res.body)).toEqual(["data", "success"])
      expect(res.body.success).toBe(true)
      expect(res.body.data.max).toBe(5)
      const keys = res.body.data.keys
      expect(keys.map((k: any) => k.id)).toEqual([u.keyId, second.id])
      for (const k of keys) expect(sortedKeys(k)).toEqual([...KEY_RECORD_KEYS].sort())
      expect(keys[0]).toMatchObject({ label: "first", key_prefix: u.key.slice(0, 16), revealable: true, legacy: false })
      expect(typeof keys[0].created_at).toBe("number")
      for (const secret of [u.key, second.key, hashKey(u.key), hashKey(second.key)]) expect(res.text).not.toContain(secret)
    })

    it("last_used_at is null until first use, then epoch ms", async () => {
      const u = await newUser(gw)
      const before = (await call(gw, "GET", "/api/user/me/keys", { session: u.session })).body.data.keys[0]
      expect(before.last_used_at).toBeNull()
      expect((await call(gw, "GET", "/v1/models", { key: u.key })).status).toBe(200)
      await gw.run(Effect.flatMap(Auth, (a) => a.flushTouches))
      const after = (await call(gw, "GET", "/api/user/me/keys", { session: u.session })).body.data.keys[0]
      expect(typeof after.last_used_at).toBe("number")
      expect(Math.abs(after.last_used_at - Date.now())).toBeLessThan(60_000)
    })

    it("marks legacy keys and rows without a prefix as legacy and not revealable", async () => {
      const u = await newUser(gw)
      const legacy = await newKey(gw, u.account.id, "old", true)
      const noPrefix = await newKey(gw, u.account.id, "ancient")
      await query(gw, "UPDATE api_keys SET key_prefix = NULL WHERE id = $1", [noPrefix.id])
      const keys = (await call(gw, "GET", "/api/user/me/keys", { key: u.key })).body.data.keys
      expect(keys.find((k: any) => k.id === legacy.id)).toMatchObject({ legacy: true, revealable: false })
      expect(keys.find((k: any) => k.id === noPrefix.id)).toMatchObject({ legacy: true, revealable: false, key_prefix: null })
      expect(keys.find((k: any) => k.id === u.keyId)).toMatchObject({ legacy: false, revealable: true })
    })

    it("creates keys: default label, truncation to 40, plaintext once, usable at once, audited", async () => {
      const u = await newUser(gw)
      const created = await call(gw, "POST", "/api/user/me/keys", { session: u.session, body: {} })
      expect(created.status).toBe(200)
      expect(sortedKeys(created.body)).toEqual(["data", "success"])
      expect(sortedKeys(created.body.data)).toEqual(["apiKey"])
      const apiKey: string = created.body.data.apiKey
      expect(apiKey.startsWith("sk-ws-")).toBe(true)
      expect((await call(gw, "GET", "/v1/models", { key: apiKey })).status).toBe(200)
      const long = "가".repeat(50)
      await call(gw, "POST", "/api/user/me/keys", { session: u.session, body: { label: long } })
      await call(gw, "POST", "/api/user/me/keys", { session: u.session, body: { label: "   " } })
      await call(gw, "POST", "/api/user/me/keys", { key: u.key, body: "not json" })
      const keys = (await call(gw, "GET", "/api/user/me/keys", { session: u.session })).body.data.keys
      expect(keys.map((k: any) => k.label)).toEqual(["first", "새 키", "가".repeat(40), "새 키", "새 키"])
      expect(keys[1].key_prefix).toBe(apiKey.slice(0, 16))
      const audits = await query(gw, "SELECT action, target FROM audit_log WHERE account_id = $1 ORDER BY id", [u.account.id])
      expect(audits.filter((a: any) => a.action === "key.create")).toHaveLength(4)
    })

    it("caps active keys at 5 with 400 key_cap_reached; deleting one frees a slot", async () => {
      const u = await newUser(gw)
      for (let i = 0; i < 4; i++) {
        expect((await call(gw, "POST", "/api/user/me/keys", { key: u.key, body: { label: `k${i}` } })).status).toBe(200)
      }
      const capped = await call(gw, "POST", "/api/user/me/keys", { key: u.key, body: { label: "sixth" } })
      expect(capped.status).toBe(400)
      expect(capped.body.success).toBe(false)
      expect(capped.body.error.code).toBe("key_cap_reached")
      const keys = (await call(gw, "GET", "/api/user/me/keys", { key: u.key })).body.data.keys
      expect(keys).toHaveLength(5)
      expect((await call(gw, "DELETE", `/api/user/me/keys/${keys[4].id}`, { key: u.key })).status).toBe(200)
      expect((await call(gw, "POST", "/api/user/me/keys", { key: u.key, body: {} })).status).toBe(200)
    })

    it("concurrent creations never exceed the cap", async () => {
      const u = await newUser(gw)
      const results = await Promise.all(
        Array.from({ length: 8 }, () => call(gw, "POST", "/api/user/me/keys", { session: u.session, body: {} }))
      )
      expect(results.filter((r) => r.status === 200)).toHaveLength(4)
      expect(results.filter((r) => r.status === 400)).toHaveLength(4)
      const [{ n }] = await query(gw, "SELECT count(*)::int AS n FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL", [
        u.account.id
      ])
      expect(n).toBe(5)
    })

    it("creating a key and rotating need an active account (403 account_unlinked)", async () => {
      for (const status of ["unlinked", "revoked"] as const) {
        const u = await newUser(gw, { status })
        for (const path of ["/api/user/me/keys", "/api/user/me/rotate-key"]) {
          const res = await call(gw, "POST", path, { session: u.session, body: {} })
          expect(res.status).toBe(403)
          expect(res.body).toMatchObject({ success: false, error: { code: "account_unlinked", type: "access_denied" } })
        }
      }
    })

    it("the status check reads the current account row, not a cached one", async () => {
      const u = await newUser(gw)
      expect((await call(gw, "GET", "/api/user/me/keys", { key: u.key })).status).toBe(200)
      await query(gw, "UPDATE accounts SET status = 'unlinked' WHERE id = $1", [u.account.id])
      const res = await call(gw, "POST", "/api/user/me/keys", { key: u.key, body: {} })
      expect(res.status).toBe(403)
    })

    it.each(["abc", "0", "-1", "1.5", "01", "1e3", "99999999999999999999"])("DELETE with id %j is 400 without a code", async (id) => {
      const u = await newUser(gw)
      const res = await call(gw, "DELETE", `/api/user/me/keys/${id}`, { key: u.key })
      expect(res.status).toBe(400)
      expect(res.body.success).toBe(false)
      expect(res.body.error.code).toBeUndefined()
      const reveal = await call(gw, "GET", `/api/user/me/keys/${id}/reveal`, { key: u.key })
      expect(reveal.status).toBe(400)
    })

    it("DELETE revokes; the key fails with 401 on its very next /v1 request; audited", async () => {
      const u = await newUser(gw)
      const spare = await newKey(gw, u.account.id, "spare")
      // Warm the auth cache for the key that will be deleted.
      expect((await call(gw, "GET", "/v1/models", { key: spare.key })).status).toBe(200)
      const res = await call(gw, "DELETE", `/api/user/me/keys/${spare.id}`, { session: u.session })
      expect(res.status).toBe(200)
      expect(res.body).toEqual({ success: true })
      const next = await call(gw, "GET", "/v1/models", { key: spare.key })
      expect(next.status).toBe(401)
      expect(next.body.error.code).toBe("invalid_api_key")
      const again = await call(gw, "DELETE", `/api/user/me/keys/${spare.id}`, { session: u.session })
      expect(again.status).toBe(404)
      expect(again.body.success).toBe(false)
      expect(again.body.error.code).toBeUndefined()
      const audits = await query(gw, "SELECT action, target, meta FROM audit_log WHERE account_id = $1 AND action = 'key.delete'", [
        u.account.id
      ])
      expect(audits).toHaveLength(1)
      expect(audits[0]!.target).toBe(String(spare.id))
      const keys = (await call(gw, "GET", "/api/user/me/keys", { session: u.session })).body.data.keys
      expect(keys.map((k: any) => k.id)).toEqual([u.keyId])
    })

    it("the key used for the request may delete itself", async () => {
      const u = await newUser(gw)
      expect((await call(gw, "DELETE", `/api/user/me/keys/${u.keyId}`, { key: u.key })).status).toBe(200)
      expect((await call(gw, "GET", "/api/user/me/keys", { key: u.key })).status).toBe(401)
      expect((await call(gw, "GET", "/v1/models", { key: u.key })).status).toBe(401)
    })

    it("reveal returns the plaintext of a revealable key, audited with the id and never the plaintext", async () => {
      const u = await newUser(gw)
      const res = await call(gw, "GET", `/api/user/me/keys/${u.keyId}/reveal`, { session: u.session })
      expect(res.status).toBe(200)
      expect(res.body).toEqual({ success: true, data: { key: u.key } })
      const audits = await query(gw, "SELECT action, target, meta::text AS meta FROM audit_log WHERE account_id = $1", [
        u.account.id
      ])
      const reveal = audits.find((a: any) => a.action === "key.reveal")
      expect(reveal).toBeDefined()
      expect(reveal!.target).toBe(String(u.keyId))
      expect(JSON.parse(reveal!.meta).key_id).toBe(u.keyId)
      const all = await query(gw, "SELECT coalesce(string_agg(action || ' ' || coalesce(target, '') || ' ' || coalesce(meta::text, ''), '|'), '') AS t FROM audit_log")
      expect(all[0]!.t).not.toContain(u.key)
    })

    it("reveal is 409 key_not_revealable for legacy, unsealed and damaged keys", async () => {
      const u = await newUser(gw)
      const legacy = await newKey(gw, u.account.id, "legacy", true)
      const unsealed = await newKey(gw, u.account.id, "before encryption")
      const damaged = await newKey(gw, u.account.id, "damaged")
      await query(gw, "UPDATE api_keys SET ciphertext = NULL WHERE id = $1", [unsealed.id])
      // A ciphertext moved from another row fails its associated-data check.
      await query(gw, "UPDATE api_keys SET ciphertext = (SELECT ciphertext FROM api_keys WHERE id = $2) WHERE id = $1", [
        damaged.id,
        u.keyId
      ])
      for (const id of [legacy.id, unsealed.id, damaged.id]) {
        const res = await call(gw, "GET", `/api/user/me/keys/${id}/reveal`, { key: u.key })
        expect(res.status).toBe(409)
        expect(res.body).toMatchObject({ success: false, error: { code: "key_not_revealable" } })
        expect(res.text).not.toContain(u.key)
      }
      const keys = (await call(gw, "GET", "/api/user/me/keys", { key: u.key })).body.data.keys
      expect(keys.find((k: any) => k.id === unsealed.id).revealable).toBe(false)
    })

    it("isolation: account A can never see, delete or reveal B's keys or rows", async () => {
      const a = await newUser(gw)
      const b = await newUser(gw)
      await insertRows(gw, [row(b.account.id, { model_id: "ws-reasoner" })])
      const list = await call(gw, "GET", "/api/user/me/keys", { key: a.key })
      expect(list.body.data.keys.map((k: any) => k.id)).toEqual([a.keyId])
      expect(list.text).not.toContain(b.key.slice(0, 16))
      const del = await call(gw, "DELETE", `/api/user/me/keys/${b.keyId}`, { session: a.session })
      expect(del.status).toBe(404)
      const reveal = await call(gw, "GET", `/api/user/me/keys/${b.keyId}/reveal`, { session: a.session })
      expect(reveal.status).toBe(404)
      expect(reveal.text).not.toContain(b.key)
      expect((await call(gw, "GET", "/v1/models", { key: b.key })).status).toBe(200)
      const requests = (await call(gw, "GET", "/api/user/me/requests", { key: a.key })).body.requests
      expect(requests).toEqual([])
      const metrics = (await call(gw, "GET", "/api/user/me/metrics?model=ws-reasoner", { key: a.key })).body
      expect(metrics.totals.requests).toBe(0)
      const me = (await call(gw, "GET", "/api/user/me", { key: a.key })).body
      expect(me.recentRequests).toEqual([])
      expect(me.profile.username).toBe(a.account.username)
      const audits = await query(gw, "SELECT count(*)::int AS n FROM audit_log WHERE account_id = $1", [b.account.id])
      expect(audits[0]!.n).toBe(0)
    })

    it("rotate revokes every key, issues one labelled 기본, audits, leaves sessions alone", async () => {
      const u = await newUser(gw)
      const other = await newKey(gw, u.account.id, "other")
      expect((await call(gw, "GET", "/v1/models", { key: other.key })).status).toBe(200)
      const res = await call(gw, "POST", "/api/user/me/rotate-key", { key: u.key })
      expect(res.status).toBe(200)
      expect(sortedKeys(res.body)).toEqual(["data", "success"])
      const fresh: string = res.body.data.apiKey
      expect(fresh.startsWith("sk-ws-")).toBe(true)
      for (const old of [u.key, other.key]) expect((await call(gw, "GET", "/v1/models", { key: old })).status).toBe(401)
      expect((await call(gw, "GET", "/v1/models", { key: fresh })).status).toBe(200)
      const keys = (await call(gw, "GET", "/api/user/me/keys", { session: u.session })).body.data.keys
      expect(keys).toHaveLength(1)
      expect(keys[0]).toMatchObject({ label: "기본", key_prefix: fresh.slice(0, 16) })
      const audit = await query(gw, "SELECT meta::text AS meta FROM audit_log WHERE account_id = $1 AND action = 'key.rotate'", [
        u.account.id
      ])
      expect(audit).toHaveLength(1)
      expect(JSON.parse(audit[0]!.meta).revoked.sort()).toEqual([u.keyId, other.id].sort())
      expect(audit[0]!.meta).not.toContain(fresh)
      const me = (await call(gw, "GET", "/v1/me", { key: fresh })).body
      expect(Math.abs(me.last_rotated_at - Date.now())).toBeLessThan(60_000)
    })

    it("rotate within 60 s is 429 rate_limit_exceeded without a code or Retry-After", async () => {
      const u = await newUser(gw)
      expect((await call(gw, "POST", "/api/user/me/rotate-key", { session: u.session })).status).toBe(200)
      const again = await call(gw, "POST", "/api/user/me/rotate-key", { session: u.session })
      expect(again.status).toBe(429)
      expect(again.body.success).toBe(false)
      expect(again.body.error.type).toBe("rate_limit_exceeded")
      expect(again.body.error.code).toBeUndefined()
      expect(again.headers.get("retry-after")).toBeNull()
      const keys = (await call(gw, "GET", "/api/user/me/keys", { session: u.session })).body.data.keys
      expect(keys).toHaveLength(1)
    })

    it("concurrent rotations: exactly one wins", async () => {
      const u = await newUser(gw)
      const results = await Promise.all(
        Array.from({ length: 4 }, () => call(gw, "POST", "/api/user/me/rotate-key", { session: u.session }))
      )
      expect(results.filter((r) => r.status === 200)).toHaveLength(1)
      expect(results.filter((r) => r.status === 429)).toHaveLength(3)
      const [{ n }] = await query(gw, "SELECT count(*)::int AS n FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL", [
        u.account.id
      ])
      expect(n).toBe(1)
    })

    it("rotate cooldown on the TestClock: 60 s from the last rotation, shared through the account row", async () => {
      const u = await newUser(gw)
      const outcome = await gw.run(Effect.gen(function*() {
        const repo = yield* AccountsRepo
        const caller = { account: (yield* repo.findAccount(u.account.id))!, key: null }
        yield* TestClock.setTime(Date.now())
        const first = yield* Effect.result(rotateKey(caller))
        yield* TestClock.adjust("59999 millis")
        const early = yield* Effect.result(rotateKey(caller))
        yield* TestClock.adjust("1 millis")
        const due = yield* Effect.result(rotateKey(caller))
        const immediately = yield* Effect.result(rotateKey(caller))
        return { first, early, due, immediately }
      }).pipe(Effect.provide(TestClock.layer())))
      expect(Result.isSuccess(outcome.first)).toBe(true)
      expect(Result.isFailure(outcome.early) && outcome.early.failure.code).toBe("rotate_cooldown")
      expect(Result.isSuccess(outcome.due)).toBe(true)
      expect(Result.isFailure(outcome.immediately) && outcome.immediately.failure.code).toBe("rotate_cooldown")
      // The HTTP endpoint sees the same stamp: live time is within 60 s of it.
      expect((await call(gw, "POST", "/api/user/me/rotate-key", { session: u.session })).status).toBe(429)
    })
  })

  describe.skipIf(skip)("rate limits (real admission limiter)", () => {
    it("reveal: 30 per minute per account, then 429 rate_limited with Retry-After", async () => {
      const u = await newUser(gw)
      const v = await newUser(gw)
      for (let i = 0; i < 30; i++) {
        expect((await call(gw, "GET", `/api/user/me/keys/${u.keyId}/reveal`, { session: u.session })).status).toBe(200)
      }
      const over = await call(gw, "GET", `/api/user/me/keys/${u.keyId}/reveal`, { session: u.session })
      expect(over.status).toBe(429)
      expect(over.body).toMatchObject({ success: false, error: { code: "rate_limited" } })
      expect(Number(over.headers.get("retry-after"))).toBeGreaterThan(0)
      // Another account is unaffected.
      expect((await call(gw, "GET", `/api/user/me/keys/${v.keyId}/reveal`, { session: v.session })).status).toBe(200)
    })

    it("metrics and requests share 120 per minute per account", async () => {
      const u = await newUser(gw)
      for (let i = 0; i < 110; i++) {
        expect((await call(gw, "GET", "/api/user/me/requests?limit=1", { key: u.key })).status).toBe(200)
      }
      for (let i = 0; i < 10; i++) {
        expect((await call(gw, "GET", "/api/user/me/metrics?range=1h", { key: u.key })).status).toBe(200)
      }
      for (const path of ["/api/user/me/metrics", "/api/user/me/requests"]) {
        const over = await call(gw, "GET", path, { key: u.key })
        expect(over.status).toBe(429)
        expect(sortedKeys(over.body)).toEqual(["error"])
        expect(over.body.error.code).toBe("rate_limited")
        expect(Number(over.headers.get("retry-after"))).toBeGreaterThan(0)
      }
      // The snapshot and keys are not part of that budget.
      expect((await call(gw, "GET", "/api/user/me", { key: u.key })).status).toBe(200)
    })
  })
})
