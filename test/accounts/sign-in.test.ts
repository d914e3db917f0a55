/**
 * Issue 21, point 1: dashboard sign-in over real HTTP, on the embedded database and on PostgreSQL. An API key is
 * exchanged for a `ws-session` cookie (HttpOnly, SameSite=Lax, Path=/api/user, a week, Secure behind https);
 * wrong keys count against the per-address failed-authentication limit; the request must be same-origin JSON;
 * sessions are listed, revoked (also another account's id is 404) and capped; sign-out revokes and clears.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { MAX_SESSIONS, SESSION_HOURS } from "../../src/accounts/SignIn.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { newSession, newUser, query } from "./support.js"

const postgresAvailable = await serviceGate("postgres")

const backends = [
  { name: "embedded PGlite", postgres: false },
  { name: "PostgreSQL", postgres: true }
] as const

describe.each(backends)("dashboard sign-in on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  let gw: TestGateway
  let db: FreshDatabase | undefined

  beforeAll(async () => {
    if (skip) return
    db = postgres ? await freshDatabase("signin") : undefined
    gw = await startGateway({
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        // Room for the cap test's sign-ins; the guessing test uses its own address.
        doc.limits.failed_auth_per_minute = 5
        doc.trusted_proxies = ["127.0.0.1/32"]
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
  })

  const send = async (method: string, path: string, init: { headers?: Record<string, string>; body?: string } = {}) => {
    const res = await fetch(`${gw.url}${path}`, { method, headers: init.headers ?? {}, ...(init.body !== undefined ? { body: init.body } : {}) })
    const text = await res.text()
    return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : null }
  }
  const sameOrigin = (extra: Record<string, string> = {}) => ({ origin: gw.url, "content-type": "application/json", ...extra })
  const signIn = (apiKey: unknown, headers: Record<string, string> = sameOrigin()) =>
    send("POST", "/api/user/session", { headers, body: JSON.stringify({ api_key: apiKey }) })
  const tokenOf = (setCookie: string | null) => /^ws-session=([^;]*)/.exec(setCookie ?? "")![1]!

  it.skipIf(skip)("a valid key gets a week-long HttpOnly, SameSite=Lax cookie that the account API accepts", async () => {
    const user = await newUser(gw, { username: "signin-ok" })
    const r = await signIn(`  ${user.key}  `)
    expect(r.status).toBe(200)
    expect(r.body.success).toBe(true)
    expect(r.body.data.username).toBe("signin-ok")
    const cookie = r.headers.get("set-cookie")!
    expect(cookie).toMatch(new RegExp(`^ws-session=[A-Za-z0-9]{48}; Path=/api/user; Max-Age=${SESSION_HOURS * 3600}; HttpOnly; SameSite=Lax$`))
    const token = tokenOf(cookie)
    const expires = Date.parse(r.body.data.expires_at)
    expect(Math.abs(expires - (Date.now() + SESSION_HOURS * 3600_000))).toBeLessThan(60_000)
    const me = await send("GET", "/api/user/me", { headers: { cookie: `ws-session=${token}` } })
    expect(me.status).toBe(200)
    expect(me.body.profile.username).toBe("signin-ok")
    // Stored hashed, never the token; audited with the key id.
    const rows = await query<{ token_hash: string }>(gw, "SELECT token_hash FROM sessions WHERE account_id = $1", [user.account.id])
    expect(rows.map((row) => row.token_hash)).not.toContain(token)
    const audits = await query<{ action: string; meta: any }>(gw, "SELECT action, meta FROM audit_log WHERE account_id = $1 AND action = 'session.create'", [user.account.id])
    expect(audits).toHaveLength(1)
    expect(Number(audits[0]!.meta.key_id)).toBe(user.keyId)
  })

  it.skipIf(skip)("over https (X-Forwarded-Proto from a trusted proxy) the cookie is Secure", async () => {
    const user = await newUser(gw, { username: "signin-secure" })
    const r = await signIn(user.key, sameOrigin({ "x-forwarded-proto": "https", origin: `https://127.0.0.1:${gw.port}` }))
    expect(r.status).toBe(200)
    expect(r.headers.get("set-cookie")).toMatch(/; Secure$/)
  })

  it.skipIf(skip)("bad requests: no key 400, wrong key 401, cross-site 403, not JSON 415, all in Korean; nothing created", async () => {
    const user = await newUser(gw, { username: "signin-bad" })
    const before = (await query<{ n: number }>(gw, "SELECT count(*)::int AS n FROM sessions"))[0]!.n
    const cases: Array<[Promise<{ status: number; body: any }>, number]> = [
      [signIn(""), 400],
      [signIn(42), 400],
      [signIn("x".repeat(300)), 400],
      [send("POST", "/api/user/session", { headers: sameOrigin(), body: "[" }), 400],
      [signIn(user.key, { origin: "https://evil.example", "content-type": "application/json" }), 403],
      [signIn(user.key, { "content-type": "application/json" }), 403],
      [signIn(user.key, { origin: gw.url, "content-type": "text/plain" }), 415],
      [signIn(user.key, { "sec-fetch-site": "cross-site", "content-type": "application/json" }), 403]
    ]
    for (const [request, status] of cases) {
      const r = await request
      expect(r.status).toBe(status)
      expect(r.body.success).toBe(false)
      expect(r.body.error.message).toMatch(/[가-힣]/)
    }
    const wrong = await signIn("sk-ws-" + "A".repeat(43), sameOrigin({ "x-forwarded-for": "203.0.113.9" }))
    expect([wrong.status, wrong.body.error.code, wrong.body.error.message]).toEqual([401, "invalid_api_key", "API 키가 올바르지 않거나 폐기되었습니다."])
    expect((await query<{ n: number }>(gw, "SELECT count(*)::int AS n FROM sessions"))[0]!.n).toBe(before)
  })

  it.skipIf(skip)("guessing is limited per address: past failed_auth_per_minute even a valid key waits (429)", async () => {
    const user = await newUser(gw, { username: "signin-guess" })
    const from = { "x-forwarded-for": "198.51.100.7" }
    for (let i = 0; i < 5; i++) {
      const r = await signIn(`sk-ws-${String(i).repeat(43)}`, sameOrigin(from))
      expect(r.status).toBe(401)
    }
    const refused = await signIn(`sk-ws-${"Z".repeat(43)}`, sameOrigin(from))
    expect([refused.status, refused.body.error.code]).toEqual([429, "too_many_failed_requests"])
    expect(Number(refused.headers.get("retry-after"))).toBeGreaterThan(0)
    // A key this replica has never cached is not looked up from a refused address either.
    const valid = await signIn(user.key, sameOrigin(from))
    expect(valid.status).toBe(429)
    // Another address is not affected.
    expect((await signIn(user.key, sameOrigin({ "x-forwarded-for": "198.51.100.8" }))).status).toBe(200)
  })

  it.skipIf(skip)("sessions: listed with the current one marked, revoked by id (another account's id is 404), capped", async () => {
    const user = await newUser(gw, { username: "signin-list" })
    const other = await newUser(gw, { username: "signin-other" })
    const a = tokenOf((await signIn(user.key)).headers.get("set-cookie"))
    const b = tokenOf((await signIn(user.key)).headers.get("set-cookie"))
    const list = await send("GET", "/api/user/me/sessions", { headers: { cookie: `ws-session=${a}` } })
    expect(list.status).toBe(200)
    // Two sign-ins plus the support's own session.
    expect(list.body.data.sessions).toHaveLength(3)
    expect(list.body.data.max).toBe(MAX_SESSIONS)
    expect(list.body.data.sessions.filter((s: any) => s.current)).toHaveLength(1)
    for (const s of list.body.data.sessions) expect(s.id).toMatch(/^[0-9a-f]{16}$/)
    const ids = list.body.data.sessions.map((s: any) => s.id)

    // Another account cannot revoke them; malformed ids are 404 too.
    for (const id of [ids[0], "zz", "0".repeat(16)]) {
      const r = await send("DELETE", `/api/user/me/sessions/${id}`, { headers: { authorization: `Bearer ${other.key}` } })
      expect([r.status, r.body.error.message]).toEqual([404, "세션을 찾을 수 없습니다."])
    }
    // Revoking b from a (a cookie change: same origin); b is refused at once.
    const bId = (await send("GET", "/api/user/me/sessions", { headers: { cookie: `ws-session=${b}` } })).body.data.sessions.find((s: any) => s.current).id
    const cross = await send("DELETE", `/api/user/me/sessions/${bId}`, { headers: { cookie: `ws-session=${a}`, origin: "https://evil.example" } })
    expect(cross.status).toBe(403)
    const revoked = await send("DELETE", `/api/user/me/sessions/${bId}`, { headers: { cookie: `ws-session=${a}`, origin: gw.url } })
    expect(revoked.status).toBe(200)
    expect(revoked.headers.get("set-cookie")).toBeNull()
    expect((await send("GET", "/api/user/me", { headers: { cookie: `ws-session=${b}` } })).status).toBe(401)
    // Revoking the current session also clears its cookie.
    const aId = ids[list.body.data.sessions.findIndex((s: any) => s.current)]
    const self = await send("DELETE", `/api/user/me/sessions/${aId}`, { headers: { cookie: `ws-session=${a}`, origin: gw.url } })
    expect(self.headers.get("set-cookie")).toMatch(/^ws-session=; Path=\/api\/user; Max-Age=0/)

    // The cap: at most MAX_SESSIONS live sessions after a sign-in, the oldest revoked; dead rows deleted. (The
    // sessions beyond it come from the operator's session:create, since sign-ins are limited to 10 a minute.)
    for (let i = 0; i < MAX_SESSIONS + 2; i++) await newSession(gw, user.account.id)
    expect((await signIn(user.key)).status).toBe(200)
    const rows = await query<{ live: number; dead: number }>(
      gw,
      `SELECT count(*) FILTER (WHERE revoked_at IS NULL)::int AS live, count(*) FILTER (WHERE revoked_at IS NOT NULL)::int AS dead
       FROM sessions WHERE account_id = $1`,
      [user.account.id]
    )
    expect(rows[0]!.live).toBe(MAX_SESSIONS)
    // The rows revoked above (a, b) were deleted; live were the support's session, the 12 and this one: 14, so
    // this sign-in revoked 4, which remain as rows until the next sign-in.
    expect(rows[0]!.dead).toBe(1 + (MAX_SESSIONS + 2) + 1 - MAX_SESSIONS)
  })

  it.skipIf(skip)("sign-out revokes the cookie's session and clears it; cross-site sign-out is refused", async () => {
    const user = await newUser(gw, { username: "signin-out" })
    const token = tokenOf((await signIn(user.key)).headers.get("set-cookie"))
    const cross = await send("DELETE", "/api/user/session", { headers: { cookie: `ws-session=${token}`, origin: "https://evil.example" } })
    expect(cross.status).toBe(403)
    expect((await send("GET", "/api/user/me", { headers: { cookie: `ws-session=${token}` } })).status).toBe(200)
    const out = await send("DELETE", "/api/user/session", { headers: { cookie: `ws-session=${token}`, origin: gw.url } })
    expect(out.status).toBe(200)
    expect(out.headers.get("set-cookie")).toMatch(/^ws-session=; Path=\/api\/user; Max-Age=0; HttpOnly; SameSite=Lax$/)
    expect((await send("GET", "/api/user/me", { headers: { cookie: `ws-session=${token}` } })).status).toBe(401)
    // Without a cookie (or with an unknown one) it only clears.
    const none = await send("DELETE", "/api/user/session", { headers: { origin: gw.url, cookie: "ws-session=unknown" } })
    expect(none.status).toBe(200)
    // Bearer requests are unaffected by all this.
    expect((await send("GET", "/api/user/me", { headers: { authorization: `Bearer ${user.key}` } })).status).toBe(200)
  })
})
