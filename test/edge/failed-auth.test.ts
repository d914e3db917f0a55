/**
 * Issue 16, finding 5, over HTTP: failed authentication is counted per client address on every route that
 * authenticates (enumerated from the routers of src/App.ts, so a route added later is covered), and past
 * `limits.failed_auth_per_minute` the address gets 429 `too_many_failed_requests` with `Retry-After` in its route's
 * envelope, before any key or session lookup. On embedded PGlite and on PostgreSQL.
 *
 * Every gateway here trusts 127.0.0.1 as a proxy, so each test picks its counted address with X-Forwarded-For
 * (except the last suite, which shows that an untrusted peer's header is ignored).
 */
import { Effect, Layer } from "effect"
import { HttpRouter } from "effect/http"
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { accountRouter, inferenceRouter } from "../../src/App.js"
import { Auth } from "../../src/auth/Auth.js"
import { generateKey } from "../../src/auth/KeyMaterial.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { newUser } from "../accounts/support.js"

const postgres = await serviceGate("postgres")
const LIMIT = 3
const HANGUL = /[\uAC00-\uD7A3]/

interface Route {
  readonly method: string
  readonly path: string
}

/** The routes a router layer registers, read by building it against a router that only records. */
const routesOf = async (router: Layer.Layer<never, never, any>): Promise<Array<Route>> => {
  const routes: Array<Route> = []
  const recorder = {
    add: (method: string, path: string) => Effect.sync(() => void routes.push({ method, path }))
  } as unknown as HttpRouter.HttpRouter
  await Effect.runPromise(Effect.scoped(Layer.build(Layer.provide(router, Layer.succeed(HttpRouter.HttpRouter, recorder))) as Effect.Effect<unknown, never, never>))
  return routes
}

/**
 * Routes that answer without authenticating, on purpose: the public status endpoints (issue 18); the dashboard's
 * sign-in, whose key comes in the body and is counted per address like any key (test/accounts/sign-in.test.ts), its
 * sign-out, and its static files (issue 21).
 */
const PUBLIC = [
  "GET /v1/openapi.json",
  "GET /api/quota",
  "GET /api/stats/fleet",
  "GET /api/stats/server",
  "GET /api/incidents",
  "POST /api/user/session",
  "DELETE /api/user/session",
  "GET /dashboard/*"
]

let nextAddress = 0
/** A fresh counted address per use (TEST-NET-2 and TEST-NET-3). */
const freshAddress = () => {
  const n = nextAddress++
  return `${n % 2 === 0 ? "198.51.100" : "203.0.113"}.${(n >> 1) % 250 + 1}`
}
const randomCookie = () => Crypto.randomBytes(36).toString("base64url")

interface Answer {
  readonly status: number
  readonly retryAfter: string | null
  readonly body: any
}

const send = async (gw: TestGateway, route: Route, from: string, credential: { key?: string; cookie?: string }): Promise<Answer> => {
  const headers: Record<string, string> = { "x-forwarded-for": from }
  if (credential.key !== undefined) headers.authorization = `Bearer ${credential.key}`
  if (credential.cookie !== undefined) {
    headers.cookie = `ws-session=${credential.cookie}`
    headers.origin = gw.url
  }
  const hasBody = route.method !== "GET" && route.method !== "DELETE"
  if (hasBody) headers["content-type"] = "application/json"
  const res = await fetch(`${gw.url}${route.path.replaceAll(/:[a-z]+/g, "1")}`, {
    method: route.method,
    headers,
    ...(hasBody ? { body: "{}" } : {})
  })
  const text = await res.text()
  let body: unknown = text
  try {
    body = JSON.parse(text)
  } catch {
    // not JSON: kept as text
  }
  return { status: res.status, retryAfter: res.headers.get("retry-after"), body }
}

const lookups = (gw: TestGateway) =>
  gw.run(Effect.flatMap(Auth, (auth) => auth.storeLookups)).then((l) => l.keys + l.sessions)

const expectRefused = (answer: Answer, unauthorized: Answer) => {
  expect(answer.status).toBe(429)
  const retryAfter = Number(answer.retryAfter)
  expect(retryAfter).toBeGreaterThan(0)
  expect(retryAfter).toBeLessThanOrEqual(61)
  // The image endpoint answers `{statusCode, message}`.
  if (unauthorized.body.statusCode !== undefined) {
    expect(answer.body).toEqual({ statusCode: 429, message: expect.stringMatching(HANGUL) })
    return
  }
  // The Anthropic Messages routes answer in Anthropic's envelope (no `code`).
  if (unauthorized.body.type === "error") {
    expect(answer.body.error.type).toBe("rate_limit_error")
    expect(answer.body.error.message).toMatch(HANGUL)
    return
  }
  expect(answer.body.error.code).toBe("too_many_failed_requests")
  expect(answer.body.error.type).toBe("rate_limit_error")
  expect(answer.body.error.message).toMatch(HANGUL)
  // The route's own envelope: wrapped routes answer `{success: false, error}`, the others `{error}`.
  expect(answer.body.success).toBe(unauthorized.body.success)
}

const suite = (label: string, database: () => Promise<FreshDatabase | null>) =>
  describe(label, () => {
    let gw: TestGateway
    let db: FreshDatabase | null = null

    beforeAll(async () => {
      db = await database()
      gw = await startGateway({
        ...(db ? { databaseUrl: db.url } : {}),
        configure: (doc) => {
          doc.limits = { ...doc.limits, failed_auth_per_minute: LIMIT }
          doc.trusted_proxies = ["127.0.0.1"]
        }
      })
    })
    afterAll(async () => {
      await gw?.stop()
      await db?.drop()
    })

    it("every route that authenticates counts failures per address and refuses past the limit, before any lookup", async () => {
      const routes = [...(await routesOf(inferenceRouter)), ...(await routesOf(accountRouter))]
      // The enumeration sees all three families (inference, account, BYOK).
      expect(routes.map((r) => `${r.method} ${r.path}`)).toEqual(expect.arrayContaining([
        "POST /v1/chat/completions",
        "POST /v1/embeddings",
        "POST /v1/images/nai/generate-image",
        "GET /v1/models",
        "GET /api/user/me",
        "POST /api/user/me/rotate-key",
        "GET /api/user/me/byok",
        "PATCH /api/user/me/byok/:id"
      ]))
      const open: Array<string> = []
      for (const route of routes) {
        const name = `${route.method} ${route.path}`
        const from = freshAddress()
        // Without any credential: 401 (not counted) on a route that authenticates.
        const anonymous = await send(gw, route, from, {})
        if (anonymous.status !== 401) {
          open.push(name)
          continue
        }
        const account = route.path.startsWith("/api/user")
        const before = await lookups(gw)
        for (let i = 0; i < LIMIT; i++) {
          // Account routes take a cookie or a key; both count.
          const credential = account && i % 2 === 0 ? { cookie: randomCookie() } : { key: generateKey("sk-ws-") }
          const answer = await send(gw, route, from, credential)
          expect(answer.status, `${name} attempt ${i + 1}`).toBe(401)
          expect(answer.body.success, name).toBe(anonymous.body.success)
        }
        // Worker routes compare worker tokens in memory (src/images/WorkerTokens.ts): their failures need no lookup.
        const looked = route.path.startsWith("/v1/images/workers/") ? 0 : LIMIT
        expect(await lookups(gw), name).toBe(before + looked)
        const refusals = account
          ? [{ cookie: randomCookie() }, { key: generateKey("sk-ws-") }, { cookie: randomCookie(), key: generateKey("sk-ws-") }]
          : [{ key: generateKey("sk-ws-") }, { key: "malformed" }]
        for (const credential of refusals) expectRefused(await send(gw, route, from, credential), anonymous)
        expect(await lookups(gw), `${name}: no lookup once refused`).toBe(before + looked)
        // Another address on the same route is unaffected.
        expect((await send(gw, route, freshAddress(), { key: generateKey("sk-ws-") })).status, name).toBe(401)
      }
      expect(open).toEqual(PUBLIC)
    })

    it("a flood of random keys from one address: the store sees the limit, not the flood", async () => {
      const route = { method: "GET", path: "/v1/models" }
      const flood = async (from: string, n: number) => {
        const before = await lookups(gw)
        const answers = await Promise.all(Array.from({ length: n }, () => send(gw, route, from, { key: generateKey("sk-ws-") })))
        return {
          reached: (await lookups(gw)) - before,
          unauthorized: answers.filter((a) => a.status === 401).length,
          refused: answers.filter((a) => a.status === 429).length
        }
      }
      // An address that has failed once: of 300 concurrent guesses only LIMIT - 1 more reach the store.
      const from = freshAddress()
      expect((await send(gw, route, from, { key: generateKey("sk-ws-") })).status).toBe(401)
      const after = await flood(from, 300)
      console.log(`300 concurrent random keys after a first failure: ${after.reached} store lookups, ${after.refused} refused`)
      expect(after).toEqual({ reached: LIMIT - 1, unauthorized: LIMIT - 1, refused: 300 - LIMIT + 1 })
      // Sequentially, another 300: none reaches the store.
      const before = await lookups(gw)
      for (let i = 0; i < 300; i++) expect((await send(gw, route, from, { key: generateKey("sk-ws-") })).status).toBe(429)
      expect(await lookups(gw)).toBe(before)
      // A clean address's first burst is looked up as it arrives (bounded by its concurrency), then refused.
      const clean = await flood(freshAddress(), 300)
      console.log(`300 concurrent random keys from a clean address: ${clean.reached} store lookups, ${clean.refused} refused`)
      expect(clean.reached).toBe(clean.unauthorized)
      expect(clean.unauthorized + clean.refused).toBe(300)
    })

    it("a valid key already cached is served from a refused address; an uncached key and a session are refused", async () => {
      const from = freshAddress()
      const cached = await newUser(gw)
      const uncached = await newUser(gw)
      const models = { method: "GET", path: "/v1/models" }
      const me = { method: "GET", path: "/api/user/me" }
      expect((await send(gw, models, from, { key: cached.key })).status).toBe(200)
      for (let i = 0; i < LIMIT; i++) expect((await send(gw, models, from, { key: generateKey("sk-ws-") })).status).toBe(401)

      expect((await send(gw, models, from, { key: cached.key })).status).toBe(200)
      expect((await send(gw, me, from, { key: cached.key })).status).toBe(200)
      // With a stale cookie too: the refused cookie falls through to the cached key.
      expect((await send(gw, me, from, { key: cached.key, cookie: randomCookie() })).status).toBe(200)
      // The trade-off: a valid credential this replica has not cached waits out the minute like any guess.
      expect((await send(gw, models, from, { key: uncached.key })).status).toBe(429)
      expect((await send(gw, me, from, { cookie: uncached.session })).status).toBe(429)
      // From another address all of them work.
      const other = freshAddress()
      expect((await send(gw, models, other, { key: uncached.key })).status).toBe(200)
      expect((await send(gw, me, other, { cookie: uncached.session })).status).toBe(200)
    })

    it("the same unknown session cookie sent again and again costs one query", async () => {
      const cookie = randomCookie()
      const me = { method: "GET", path: "/api/user/me" }
      const before = await gw.run(Effect.flatMap(Auth, (auth) => auth.storeLookups))
      // Each from its own address, so the limit does not stop them: only the negative cache does.
      for (let i = 0; i < 20; i++) expect((await send(gw, me, freshAddress(), { cookie })).status).toBe(401)
      const after = await gw.run(Effect.flatMap(Auth, (auth) => auth.storeLookups))
      expect(after.sessions - before.sessions).toBe(1)
      // A real session is still found (sessions are created with fresh random tokens, never a cached guess).
      const user = await newUser(gw)
      expect((await send(gw, me, freshAddress(), { cookie: user.session })).status).toBe(200)
    })
  })

suite("failed authentication per address (PGlite)", async () => null)
describe.skipIf(!postgres)("on PostgreSQL", () => {
  suite("failed authentication per address (PostgreSQL)", () => freshDatabase("failauth"))
})

describe("without trusted proxies", () => {
  let gw: TestGateway
  beforeAll(async () => {
    gw = await startGateway({ configure: (doc) => void (doc.limits = { ...doc.limits, failed_auth_per_minute: LIMIT }) })
  })
  afterAll(() => gw?.stop())

  it("X-Forwarded-For from an untrusted peer is ignored: the peer is counted", async () => {
    const route = { method: "GET", path: "/v1/models" }
    for (let i = 0; i < LIMIT; i++) expect((await send(gw, route, freshAddress(), { key: generateKey("sk-ws-") })).status).toBe(401)
    expect((await send(gw, route, freshAddress(), { key: generateKey("sk-ws-") })).status).toBe(429)
    // The dev key was never used from here, so it is not cached: refused as well.
    expect((await send(gw, route, freshAddress(), { key: gw.key })).status).toBe(429)
  })
})
