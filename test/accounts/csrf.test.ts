/**
 * Issue 8, finding 6 (CSRF): cookie-authenticated mutations of the account API need a same-origin request
 * and a JSON content type; Bearer requests and reads are unaffected. Over real HTTP, on both storage back
 * ends; every refusal is also checked to have changed nothing.
 *
 * Requests are built by hand (no defaults from support.ts's `call`), so each test states exactly the
 * headers a browser would send.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { newUser, query, sortedKeys } from "./support.js"

const postgresAvailable = await serviceGate("postgres")

const EVIL = "https://evil.example"
const DASHBOARD = "https://dash.example.com"

interface Raw {
  readonly method: string
  readonly path: string
  readonly session?: string
  readonly key?: string
  readonly headers?: Record<string, string>
  readonly body?: string
}

const send = async (gw: TestGateway, raw: Raw) => {
  const headers: Record<string, string> = { ...raw.headers }
  if (raw.session !== undefined) headers.cookie = `ws-session=${raw.session}`
  if (raw.key !== undefined) headers.authorization = `Bearer ${raw.key}`
  const res = await fetch(`${gw.url}${raw.path}`, {
    method: raw.method,
    headers,
    ...(raw.body !== undefined ? { body: raw.body } : {})
  })
  const text = await res.text()
  let body: any
  try {
    body = JSON.parse(text)
  } catch {
    body = undefined
  }
  return { status: res.status, headers: res.headers, body, text }
}

const backends = [
  { name: "embedded PGlite", postgres: false },
  { name: "PostgreSQL", postgres: true }
] as const

describe.each(backends)("CSRF defence of the account API on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  let gw: TestGateway
  let db: FreshDatabase | undefined

  beforeAll(async () => {
    if (skip) return
    db = postgres ? await freshDatabase("csrf") : undefined
    gw = await startGateway({
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        doc.dashboard_origins = [DASHBOARD]
        // Production mode generates no key-encryption key; configure one so keys are revealable.
        doc.encryption_key = Buffer.alloc(32, 7).toString("base64")
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
  })

  const activeKeyIds = async (accountId: string) =>
    (await query<{ id: number }>(gw, "SELECT id FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL ORDER BY id", [
      accountId
    ])).map((r) => Number(r.id))

  const accountRow = async (accountId: string) =>
    (await query<{ last_rotated_at: Date | null; sfw_mode: boolean }>(
      gw,
      "SELECT last_rotated_at, sfw_mode FROM accounts WHERE id = $1",
      [accountId]
    ))[0]!

  const audits = async (accountId: string) =>
    (await query<{ n: number }>(gw, "SELECT count(*)::int AS n FROM audit_log WHERE account_id = $1", [accountId]))[0]!.n

  /** A wrapped refusal: small, Korean, the catalog's status and code. */
  const expectWrapped = (res: Awaited<ReturnType<typeof send>>, status: number, code: string) => {
    expect(res.status).toBe(status)
    expect(sortedKeys(res.body)).toEqual(["error", "success"])
    expect(res.body.success).toBe(false)
    expect(res.body.error.code).toBe(code)
    expect(res.body.error.message).toMatch(/[가-힣]/)
    expect(res.text.length).toBeLessThan(1024)
  }

  describe.skipIf(skip)("refused cookie mutations change nothing", () => {
    it("rotate-key with the cookie, Origin evil.example and text/plain: 403 cross_site_request, keys unchanged", async () => {
      const u = await newUser(gw)
      const before = await activeKeyIds(u.account.id)
      const res = await send(gw, {
        method: "POST",
        path: "/api/user/me/rotate-key",
        session: u.session,
        headers: { origin: EVIL, "content-type": "text/plain" },
        body: "{}"
      })
      expectWrapped(res, 403, "cross_site_request")
      expect(res.body.error.type).toBe("access_denied")
      expect(await activeKeyIds(u.account.id)).toEqual(before)
      expect((await accountRow(u.account.id)).last_rotated_at).toBeNull()
      expect(await audits(u.account.id)).toBe(0)
      // The old key still works.
      expect((await send(gw, { method: "GET", path: "/api/user/me/keys", key: u.key })).status).toBe(200)
    })

    it("form-encoded key creation is refused, cross-site (403) and even same-origin (415)", async () => {
      const u = await newUser(gw)
      const before = await activeKeyIds(u.account.id)
      const form = { "content-type": "application/x-www-form-urlencoded" }
      const cross = await send(gw, {
        method: "POST",
        path: "/api/user/me/keys",
        session: u.session,
        headers: { ...form, origin: EVIL },
        body: "label=pwned"
      })
      expectWrapped(cross, 403, "cross_site_request")
      const same = await send(gw, {
        method: "POST",
        path: "/api/user/me/keys",
        session: u.session,
        headers: { ...form, origin: gw.url, "sec-fetch-site": "same-origin" },
        body: "label=pwned"
      })
      expectWrapped(same, 415, "unsupported_content_type")
      for (const type of ["text/plain", "multipart/form-data; boundary=x", "application/jsonp", "application/json-seq"]) {
        const res = await send(gw, {
          method: "POST",
          path: "/api/user/me/keys",
          session: u.session,
          headers: { "content-type": type, origin: gw.url },
          body: "{}"
        })
        expectWrapped(res, 415, "unsupported_content_type")
      }
      // No content type at all (a bodiless no-cors fetch) is refused too.
      const none = await send(gw, { method: "POST", path: "/api/user/me/keys", session: u.session, headers: { origin: gw.url } })
      expectWrapped(none, 415, "unsupported_content_type")
      expect(await activeKeyIds(u.account.id)).toEqual(before)
      expect(await audits(u.account.id)).toBe(0)
    })

    it("Sec-Fetch-Site cross-site or same-site is refused, with or without Origin; sfw stays off", async () => {
      const u = await newUser(gw)
      const json = { "content-type": "application/json" }
      for (
        const headers of [
          { ...json, "sec-fetch-site": "cross-site" },
          { ...json, "sec-fetch-site": "cross-site", origin: EVIL },
          { ...json, "sec-fetch-site": "same-site", origin: "https://sub.127.0.0.1" }
        ]
      ) {
        const res = await send(gw, { method: "POST", path: "/api/user/sfw", session: u.session, headers, body: '{"sfw_mode":true}' })
        expectWrapped(res, 403, "cross_site_request")
      }
      expect((await accountRow(u.account.id)).sfw_mode).toBe(false)
    })

    it("no Origin and no Sec-Fetch-Site, Origin null, or a malformed Origin: refused", async () => {
      const u = await newUser(gw)
      const before = await activeKeyIds(u.account.id)
      for (
        const extra of [{}, { origin: "null" }, { origin: `${gw.url}/path` }, { origin: "not a url" }, {
          origin: `${gw.url}.evil.example`
        }]
      ) {
        const res = await send(gw, {
          method: "POST",
          path: "/api/user/me/keys",
          session: u.session,
          headers: { "content-type": "application/json", ...extra },
          body: "{}"
        })
        expectWrapped(res, 403, "cross_site_request")
      }
      expect(await activeKeyIds(u.account.id)).toEqual(before)
    })

    it("DELETE with the cookie from another origin is refused and the key stays active", async () => {
      const u = await newUser(gw)
      const res = await send(gw, {
        method: "DELETE",
        path: `/api/user/me/keys/${u.keyId}`,
        session: u.session,
        headers: { origin: EVIL, "sec-fetch-site": "cross-site" }
      })
      expectWrapped(res, 403, "cross_site_request")
      expect(await activeKeyIds(u.account.id)).toEqual([u.keyId])
    })

    it("the origin is judged on scheme, host and port: near misses of a dashboard origin are refused", async () => {
      const u = await newUser(gw)
      for (const origin of ["http://dash.example.com", "https://dash.example.com:8443", "https://evil.dash.example.com"]) {
        const res = await send(gw, {
          method: "POST",
          path: "/api/user/me/keys",
          session: u.session,
          headers: { origin, "sec-fetch-site": "cross-site", "content-type": "application/json" },
          body: "{}"
        })
        expectWrapped(res, 403, "cross_site_request")
      }
      expect(await activeKeyIds(u.account.id)).toEqual([u.keyId])
    })
  })

  describe.skipIf(skip)("accepted requests", () => {
    it("same-origin JSON works for every mutation: by Origin, or by Sec-Fetch-Site alone", async () => {
      const u = await newUser(gw)
      const json = { "content-type": "application/json; charset=utf-8" }
      const created = await send(gw, {
        method: "POST",
        path: "/api/user/me/keys",
        session: u.session,
        headers: { ...json, origin: gw.url },
        body: '{"label":"대시보드"}'
      })
      expect(created.status).toBe(200)
      expect(created.body.data.apiKey).toMatch(/^sk-ws-/)
      const sfw = await send(gw, {
        method: "POST",
        path: "/api/user/sfw",
        session: u.session,
        headers: { ...json, "sec-fetch-site": "same-origin" },
        body: '{"sfw_mode":true}'
      })
      expect(sfw.status).toBe(200)
      expect((await accountRow(u.account.id)).sfw_mode).toBe(true)
      const ids = await activeKeyIds(u.account.id)
      expect(ids).toHaveLength(2)
      // DELETE carries no body, so it needs no content type.
      const del = await send(gw, {
        method: "DELETE",
        path: `/api/user/me/keys/${ids[1]}`,
        session: u.session,
        headers: { origin: gw.url }
      })
      expect(del.status).toBe(200)
      // A bodiless POST is fine once it declares JSON; `none` is a user-initiated request.
      const rotated = await send(gw, {
        method: "POST",
        path: "/api/user/me/rotate-key",
        session: u.session,
        headers: { "content-type": "application/json", "sec-fetch-site": "none" }
      })
      expect(rotated.status).toBe(200)
      expect(await activeKeyIds(u.account.id)).not.toContain(u.keyId)
    })

    it("an Origin listed in dashboard_origins is accepted even when the browser calls it cross-site", async () => {
      const u = await newUser(gw)
      const res = await send(gw, {
        method: "POST",
        path: "/api/user/me/keys",
        session: u.session,
        headers: { origin: DASHBOARD, "sec-fetch-site": "cross-site", "content-type": "application/json" },
        body: "{}"
      })
      expect(res.status).toBe(200)
      expect(await activeKeyIds(u.account.id)).toHaveLength(2)
    })

    it("behind a proxy, the forwarded scheme and host define the request's own origin", async () => {
      const u = await newUser(gw)
      const base = { origin: "https://gateway.example", "content-type": "application/json" }
      const proxied = await send(gw, {
        method: "POST",
        path: "/api/user/me/keys",
        session: u.session,
        headers: { ...base, "x-forwarded-host": "gateway.example", "x-forwarded-proto": "https" },
        body: "{}"
      })
      expect(proxied.status).toBe(200)
      // Without the forwarded scheme the request is http://, which is not the https:// page's origin.
      const plain = await send(gw, {
        method: "POST",
        path: "/api/user/me/keys",
        session: u.session,
        headers: { ...base, "x-forwarded-host": "gateway.example" },
        body: "{}"
      })
      expectWrapped(plain, 403, "cross_site_request")
      expect(await activeKeyIds(u.account.id)).toHaveLength(2)
    })

    it("Bearer requests from any origin with any content type work", async () => {
      const u = await newUser(gw)
      const created = await send(gw, {
        method: "POST",
        path: "/api/user/me/keys",
        key: u.key,
        headers: { origin: EVIL, "sec-fetch-site": "cross-site", "content-type": "application/x-www-form-urlencoded" },
        body: "label=x"
      })
      expect(created.status).toBe(200)
      const rotated = await send(gw, {
        method: "POST",
        path: "/api/user/me/rotate-key",
        key: u.key,
        headers: { origin: EVIL, "content-type": "text/plain" },
        body: "{}"
      })
      expect(rotated.status).toBe(200)
      expect(rotated.body.data.apiKey).toMatch(/^sk-ws-/)
      expect(await activeKeyIds(u.account.id)).toHaveLength(1)
    })

    it("a refused cookie request that also carries a Bearer key is authenticated by the key", async () => {
      const u = await newUser(gw)
      const res = await send(gw, {
        method: "POST",
        path: "/api/user/me/keys",
        session: u.session,
        key: u.key,
        headers: { origin: EVIL, "content-type": "text/plain" },
        body: "{}"
      })
      expect(res.status).toBe(200)
      const audit = await query<{ meta: { via: string } }>(
        gw,
        "SELECT meta FROM audit_log WHERE account_id = $1 AND action = 'key.create'",
        [u.account.id]
      )
      expect(audit.map((a) => a.meta.via)).toEqual(["key"])
    })

    it("reads with the cookie from another origin still work (no CORS, so the page cannot read them)", async () => {
      const u = await newUser(gw)
      for (const path of ["/api/user/me", "/api/user/me/keys", "/api/user/me/requests"]) {
        const res = await send(gw, {
          method: "GET",
          path,
          session: u.session,
          headers: { origin: EVIL, "sec-fetch-site": "cross-site" }
        })
        expect(res.status).toBe(200)
        expect(res.headers.get("access-control-allow-origin")).toBeNull()
      }
    })

    it("key reveal with the cookie needs the same origin: a cross-site page cannot spend the limit or write audit rows", async () => {
      const u = await newUser(gw)
      const before = await audits(u.account.id)
      for (const headers of [{ origin: EVIL, "sec-fetch-site": "cross-site" }, { "sec-fetch-site": "cross-site" }, {}]) {
        const res = await send(gw, { method: "GET", path: `/api/user/me/keys/${u.keyId}/reveal`, session: u.session, headers })
        expect(res.status).toBe(403)
        expect(res.body.error.code).toBe("cross_site_request")
      }
      expect(await audits(u.account.id)).toBe(before)
      const own = await send(gw, {
        method: "GET",
        path: `/api/user/me/keys/${u.keyId}/reveal`,
        session: u.session,
        headers: { "sec-fetch-site": "same-origin" }
      })
      expect(own.status).toBe(200)
      expect(own.body.data.key).toBe(u.key)
      expect(await audits(u.account.id)).toBe(before + 1)
    })
  })
})
