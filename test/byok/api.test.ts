/**
 * The BYOK router over HTTP (spec: "BYOK credential", Account API rules 8–12, Authentication 6, the account error
 * table, Limits), once per storage back end (embedded PGlite and PostgreSQL), against fake providers on
 * 127.0.0.1 (operator base URL overrides point the providers at them). Admission is the real in-memory engine,
 * so the 15/min limit is the real limiter.
 */
import { Effect } from "effect"
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import { layerFromConfig } from "../../src/quota/layer.js"
import { call, newAccount, newKey, newSession, newUser, query, type Reply } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"
import { type CapturingGateway, type FakeProviders, GOOD, startCapturingGateway, startFakeProviders } from "./support.js"

const postgresAvailable = await serviceGate("postgres")

const CREDENTIAL_KEYS = [
  "id",
  "provider",
  "auth_scheme",
  "label",
  "masked_hint",
  "is_primary",
  "pinned",
  "status",
  "last_verified_at",
  "last_used_at",
  "created_at",
  "last_error_code",
  "base_url_origin",
  "fallback_model_id",
  "has_org_id",
  "has_project_id",
  "region"
].sort()
const PROVIDER_ROW_KEYS = [
  "id",
  "label",
  "auth_scheme",
  "required_fields",
  "optional_fields",
  "supports_models_list",
  "multi_scheme"
].sort()
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/
const BASE = "/api/user/me/byok"

const backends = [
  { name: "embedded PGlite", postgres: false },
  { name: "PostgreSQL", postgres: true }
] as const

const good = (tag: string) => `${GOOD}${tag}-${Crypto.randomBytes(6).toString("hex")}`

describe.each(backends)("BYOK API on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  let gw: CapturingGateway
  let fakes: FakeProviders
  let db: FreshDatabase | undefined
  /** Every response body of this suite, for the canary check. */
  const bodies: Array<string> = []

  const req = async (method: string, path: string, options: Parameters<typeof call>[3] = {}): Promise<Reply> => {
    const reply = await call(gw, method, path, options)
    bodies.push(reply.text)
    return reply
  }
  const openai = (secret: string, extra: Record<string, unknown> = {}) => ({ provider: "openai", secret, ...extra })

  beforeAll(async () => {
    if (skip) return
    fakes = await startFakeProviders()
    db = postgres ? await freshDatabase("byok") : undefined
    gw = await startCapturingGateway({
      admission: layerFromConfig({ abuse: { burst: 1000, window_seconds: 10, cooldown_seconds: 60 } }),
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        doc.byok = {
          // Production needs the switch and a key; embedded mode is on by default with a generated key.
          ...(postgres ? { enabled: true, encryption_key: Crypto.randomBytes(32).toString("hex") } : {}),
          max_per_provider: 3,
          http_allowlist: [fakes.origin],
          providers: {
            openai: { base_url: `${fakes.origin}/openai/v1` },
            anthropic: { base_url: `${fakes.origin}/anthropic/v1` },
            gemini: { base_url: `${fakes.origin}/down/v1` }
          }
        }
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await fakes?.close()
    await db?.drop()
  })

  it.skipIf(skip)("GET: empty list with every provider row, the cap and the three fallback fields", async () => {
    const { key } = await newUser(gw)
    const r = await req("GET", BASE, { key })
    expect(r.status).toBe(200)
    expect(Object.keys(r.body)).toEqual(["success", "data"])
    expect(Object.keys(r.body.data).sort()).toEqual(
      ["credentials", "providers", "max_per_provider", "fallback_default_on", "fallback_override", "fallback_enabled"].sort()
    )
    expect(r.body.data.credentials).toEqual([])
    expect(r.body.data.max_per_provider).toBe(3)
    expect(r.body.data.fallback_default_on).toBe(false)
    expect(r.body.data.fallback_override).toBeNull()
    expect(r.body.data.fallback_enabled).toBe(false)
    for (const row of r.body.data.providers) expect(Object.keys(row).sort()).toEqual(PROVIDER_ROW_KEYS)
    const pairs = r.body.data.providers.map((p: any) => `${p.id}/${p.auth_scheme}`)
    expect(pairs).toEqual(expect.arrayContaining(["openai/bearer", "anthropic/x-api-key", "azure/api-key", "azure/bearer", "custom/bearer"]))
    const azure = r.body.data.providers.filter((p: any) => p.id === "azure")
    expect(azure.map((p: any) => p.multi_scheme)).toEqual([true, true])
    expect(r.body.data.providers.find((p: any) => p.id === "openai").multi_scheme).toBe(false)
  })

  it.skipIf(skip)("PUT /fallback: true, false, null; a missing or non-boolean enabled is 400 invalid_request", async () => {
    const { key } = await newUser(gw)
    let r = await req("PUT", `${BASE}/fallback`, { key, body: { enabled: true } })
    expect(r.status).toBe(200)
    expect(r.body).toEqual({ success: true, data: { fallback_override: true, fallback_enabled: true } })
    expect((await req("GET", BASE, { key })).body.data).toMatchObject({ fallback_override: true, fallback_enabled: true })
    r = await req("PUT", `${BASE}/fallback`, { key, body: { enabled: false } })
    expect(r.body).toEqual({ success: true, data: { fallback_override: false, fallback_enabled: false } })
    r = await req("PUT", `${BASE}/fallback`, { key, body: { enabled: null } })
    expect(r.body).toEqual({ success: true, data: { fallback_override: null, fallback_enabled: false } })
    for (const body of [{}, { enabled: "yes" }, { enabled: 1 }, "[]"]) {
      r = await req("PUT", `${BASE}/fallback`, { key, body })
      expect(r.status, JSON.stringify(body)).toBe(400)
      expect(r.body.success).toBe(false)
      expect(r.body.error.code).toBe("invalid_request")
      expect(r.body.error.message).toMatch(/enabled/)
    }
  })

  it.skipIf(skip)("POST /verify: ok with model_count; probe failure is HTTP 200 ok:false with kind and message", async () => {
    const { key } = await newUser(gw)
    let r = await req("POST", `${BASE}/verify`, { key, body: openai(good("v")) })
    expect(r.status).toBe(200)
    expect(r.body).toEqual({ success: true, data: { ok: true, model_count: 2 } })

    r = await req("POST", `${BASE}/verify`, { key, body: openai("sk-wrong-key-123456") })
    expect(r.status).toBe(200)
    expect(r.body).toEqual({ success: false, data: { ok: false, kind: "auth_failed", message: expect.stringMatching(/[가-힣]/) } })

    // A custom endpoint shows the URL it assembled.
    r = await req("POST", `${BASE}/verify`, {
      key,
      body: { provider: "custom", secret: good("c"), meta: { base_url: `${fakes.origin}/custom/v1/` } }
    })
    expect(r.body).toEqual({ success: true, data: { ok: true, model_count: 2, resolved_base_url: `${fakes.origin}/custom/v1` } })

    // The SSRF guard's refusal is a probe failure too: one kind for wherever the URL leads (issue 16).
    r = await req("POST", `${BASE}/verify`, {
      key,
      body: { provider: "custom", secret: good("c"), meta: { base_url: "https://169.254.169.254/v1" } }
    })
    expect(r.status).toBe(200)
    expect(r.body.data).toMatchObject({ ok: false, kind: "address_not_allowed" })

    // Unusable requests are not probe failures.
    r = await req("POST", `${BASE}/verify`, { key, body: { provider: "nope", secret: good("x") } })
    expect([r.status, r.body.error.code]).toEqual([400, "byok_credential_missing"])
    r = await req("POST", `${BASE}/verify`, { key, body: openai("") })
    expect([r.status, r.body.error.code]).toEqual([400, "byok_credential_missing"])
    r = await req("POST", `${BASE}/verify`, { key, body: { provider: "azure", auth_scheme: "api-key", secret: good("a") } })
    expect([r.status, r.body.error.code]).toEqual([400, "byok_credential_missing"])
    r = await req("POST", `${BASE}/verify`, { key, body: openai(good("x"), { meta: { region: "mars" } }) })
    expect([r.status, r.body.error.code]).toEqual([400, "invalid_request"])
    expect(r.body.error.message).toContain("meta.region")
  })

  it.skipIf(skip)("POST: saves a passing credential (exact shape, key-N, first is primary, audited)", async () => {
    const { account, key } = await newUser(gw)
    const secret = good("save")
    let r = await req("POST", BASE, { key, body: openai(secret, { meta: { organization_id: "org-1" } }) })
    expect(r.status).toBe(200)
    expect(Object.keys(r.body)).toEqual(["success", "data"])
    expect(Object.keys(r.body.data)).toEqual(["credential"])
    const c = r.body.data.credential
    expect(Object.keys(c).sort()).toEqual(CREDENTIAL_KEYS)
    expect(c).toMatchObject({
      provider: "openai",
      auth_scheme: "bearer",
      label: "key-1",
      masked_hint: `${secret.slice(0, 5)}…`,
      is_primary: true,
      pinned: false,
      status: "active",
      last_used_at: null,
      last_error_code: null,
      base_url_origin: null,
      fallback_model_id: null,
      has_org_id: true,
      has_project_id: false,
      region: null
    })
    expect(Number.isInteger(c.id)).toBe(true)
    expect(c.created_at).toMatch(ISO)
    expect(c.last_verified_at).toMatch(ISO)

    r = await req("POST", BASE, { key, body: openai(good("two")) })
    expect(r.body.data.credential).toMatchObject({ label: "key-2", is_primary: false })
    r = await req("POST", BASE, { key, body: openai(good("named"), { label: "work" }) })
    expect(r.body.data.credential).toMatchObject({ label: "work", is_primary: false })
    // Another provider has its own primary and its own key-N.
    r = await req("POST", BASE, { key, body: { provider: "anthropic", secret: good("ant") } })
    expect(r.body.data.credential).toMatchObject({ provider: "anthropic", auth_scheme: "x-api-key", label: "key-1", is_primary: true })

    const list = await req("GET", BASE, { key })
    expect(list.body.data.credentials.map((x: any) => x.label)).toEqual(["key-1", "key-2", "work", "key-1"])
    for (const x of list.body.data.credentials) expect(Object.keys(x).sort()).toEqual(CREDENTIAL_KEYS)

    const audits = await query(gw, "SELECT action, target, meta FROM audit_log WHERE account_id = $1 ORDER BY id", [account.id])
    expect(audits.map((a) => a.action)).toEqual(["byok.create", "byok.create", "byok.create", "byok.create"])
    expect(audits[0]!.target).toBe(String(c.id))
  })

  it.skipIf(skip)("POST: a probe failure is 400 with the probe's code and stores nothing", async () => {
    const { account, key } = await newUser(gw)
    let r = await req("POST", BASE, { key, body: openai("sk-wrong-key-123456") })
    expect(r.status).toBe(400)
    expect(r.body).toEqual({
      success: false,
      error: { message: expect.stringMatching(/[가-힣]/), type: "invalid_request_error", code: "auth_failed" }
    })
    r = await req("POST", BASE, { key, body: { provider: "gemini", secret: good("g") } })
    expect([r.status, r.body.error.code]).toEqual([400, "upstream_error"])
    r = await req("POST", BASE, {
      key,
      body: { provider: "custom", secret: good("c"), meta: { base_url: "https://10.0.0.1/v1" } }
    })
    expect([r.status, r.body.error.code]).toEqual([400, "address_not_allowed"])
    const rows = await query(gw, "SELECT id FROM byok_credentials WHERE account_id = $1", [account.id])
    expect(rows).toEqual([])
  })

  it.skipIf(skip)("POST: the cap per provider and scheme and a label clash are byok_credential_conflict", async () => {
    const { key } = await newUser(gw)
    expect((await req("POST", BASE, { key, body: openai(good("1"), { label: "a" }) })).status).toBe(200)
    let r = await req("POST", BASE, { key, body: openai(good("1b"), { label: "a" }) })
    expect([r.status, r.body.error.code]).toEqual([400, "byok_credential_conflict"])
    expect((await req("POST", BASE, { key, body: openai(good("2")) })).status).toBe(200)
    expect((await req("POST", BASE, { key, body: openai(good("3")) })).status).toBe(200)
    r = await req("POST", BASE, { key, body: openai(good("4")) })
    expect([r.status, r.body.error.code]).toEqual([400, "byok_credential_conflict"])
    expect(r.body.error.message).toContain("3")
    // Another scheme of a provider has its own cap; labels too.
    r = await req("POST", BASE, { key, body: { provider: "anthropic", secret: good("ant"), label: "a" } })
    expect(r.status).toBe(200)
  })

  it.skipIf(skip)("DELETE: soft revoke, another credential promoted to primary, label reusable, audited", async () => {
    const { account, key } = await newUser(gw)
    const first = (await req("POST", BASE, { key, body: openai(good("1")) })).body.data.credential
    const second = (await req("POST", BASE, { key, body: openai(good("2")) })).body.data.credential
    expect([first.label, first.is_primary, second.label, second.is_primary]).toEqual(["key-1", true, "key-2", false])
    let r = await req("DELETE", `${BASE}/${first.id}`, { key })
    expect(r.status).toBe(200)
    expect(r.body).toEqual({ success: true })
    const list = (await req("GET", BASE, { key })).body.data.credentials
    expect(list.map((x: any) => [x.id, x.is_primary])).toEqual([[second.id, true]])
    const [row] = await query(gw, "SELECT status, revoked_at, is_primary FROM byok_credentials WHERE id = $1", [first.id])
    expect(row!.status).toBe("revoked")
    expect(row!.revoked_at).not.toBeNull()
    expect(row!.is_primary).toBe(false)
    // key-1 is free again.
    const again = (await req("POST", BASE, { key, body: openai(good("3")) })).body.data.credential
    expect([again.label, again.is_primary]).toEqual(["key-1", false])
    r = await req("DELETE", `${BASE}/${first.id}`, { key })
    expect([r.status, r.body.error.code]).toEqual([404, "byok_credential_missing"])
    r = await req("DELETE", `${BASE}/abc`, { key })
    expect([r.status, r.body.error.code]).toEqual([400, "byok_credential_missing"])
    const audits = await query(gw, "SELECT action, target FROM audit_log WHERE account_id = $1 AND action = 'byok.delete'", [account.id])
    expect(audits).toEqual([{ action: "byok.delete", target: String(first.id) }])
  })

  it.skipIf(skip)("pinned: listed first, and preferred over an older credential when a new primary is chosen", async () => {
    const { key } = await newUser(gw)
    const first = (await req("POST", BASE, { key, body: openai(good("p1")) })).body.data.credential
    const second = (await req("POST", BASE, { key, body: openai(good("p2")) })).body.data.credential
    const third = (await req("POST", BASE, { key, body: openai(good("p3")) })).body.data.credential
    expect((await req("PATCH", `${BASE}/${third.id}`, { key, body: { pinned: true } })).status).toBe(200)
    let list = (await req("GET", BASE, { key })).body.data.credentials
    expect(list.map((x: any) => x.id)).toEqual([third.id, first.id, second.id])
    expect((await req("DELETE", `${BASE}/${first.id}`, { key })).status).toBe(200)
    list = (await req("GET", BASE, { key })).body.data.credentials
    expect(list.map((x: any) => [x.id, x.is_primary])).toEqual([[third.id, true], [second.id, false]])
  })

  it.skipIf(skip)("PATCH: only pinned, is_primary (true acts), fallback_model_id (catalog id or clear)", async () => {
    const { key } = await newUser(gw)
    const a = (await req("POST", BASE, { key, body: openai(good("1")) })).body.data.credential
    const b = (await req("POST", BASE, { key, body: openai(good("2")) })).body.data.credential
    let r = await req("PATCH", `${BASE}/${b.id}`, { key, body: { is_primary: true, pinned: true, fallback_model_id: "ws-lite" } })
    expect(r.status).toBe(200)
    expect(r.body.success).toBe(true)
    expect(r.body.data.credential).toMatchObject({ id: b.id, is_primary: true, pinned: true, fallback_model_id: "ws-lite" })
    let list = (await req("GET", BASE, { key })).body.data.credentials
    // b is pinned now, so it is listed first.
    expect(list.map((x: any) => [x.id, x.is_primary])).toEqual([[b.id, true], [a.id, false]])
    // `is_primary: false` does nothing.
    r = await req("PATCH", `${BASE}/${b.id}`, { key, body: { is_primary: false, fallback_model_id: "" } })
    expect(r.body.data.credential).toMatchObject({ is_primary: true, fallback_model_id: null })
    r = await req("PATCH", `${BASE}/${a.id}`, { key, body: { fallback_model_id: "ws-pro" } })
    r = await req("PATCH", `${BASE}/${a.id}`, { key, body: { fallback_model_id: null } })
    expect(r.body.data.credential.fallback_model_id).toBeNull()
    for (const bad of ["@openai/gpt-4o", "no-such-model"]) {
      r = await req("PATCH", `${BASE}/${a.id}`, { key, body: { fallback_model_id: bad } })
      expect([r.status, r.body.error.code], bad).toEqual([400, "byok_credential_missing"])
    }
    for (const body of [{ label: "x" }, { secret: "y" }]) {
      r = await req("PATCH", `${BASE}/${a.id}`, { key, body })
      expect([r.status, r.body.error.code]).toEqual([400, "invalid_request"])
    }
    r = await req("PATCH", `${BASE}/1.5`, { key, body: { pinned: true } })
    expect([r.status, r.body.error.code]).toEqual([400, "byok_credential_missing"])
    list = (await req("GET", BASE, { key })).body.data.credentials
    // Pinned credentials are listed first.
    expect(list.map((x: any) => [x.label, x.pinned])).toEqual([["key-2", true], ["key-1", false]])
  })

  it.skipIf(skip)("GET /:id/models: listing, then cached; ownership on every hit; rejected turns active", async () => {
    const { account, key } = await newUser(gw)
    const other = await newUser(gw)
    const secret = good("m")
    const c = (await req("POST", BASE, { key, body: openai(secret) })).body.data.credential
    await query(gw, "UPDATE byok_credentials SET status = 'rejected', last_error_code = 'auth_failed', last_verified_at = NULL WHERE id = $1", [c.id])
    const before = fakes.listings.get(`Bearer ${secret}`) ?? 0
    let r = await req("GET", `${BASE}/${c.id}/models`, { key })
    expect(r.status).toBe(200)
    expect(r.body).toEqual({
      success: true,
      data: { models: [{ id: "gpt-x", display_name: null }, { id: "gpt-y", display_name: null }], cached: false }
    })
    const [row] = await query(gw, "SELECT status, last_error_code, last_verified_at FROM byok_credentials WHERE id = $1", [c.id])
    expect(row).toMatchObject({ status: "active", last_error_code: null })
    expect(row!.last_verified_at).not.toBeNull()
    r = await req("GET", `${BASE}/${c.id}/models`, { key })
    expect(r.body.data.cached).toBe(true)
    expect(r.body.data.models).toHaveLength(2)
    expect(fakes.listings.get(`Bearer ${secret}`)).toBe(before + 1)
    // Another account never gets the cached answer.
    r = await req("GET", `${BASE}/${c.id}/models`, { key: other.key })
    expect([r.status, r.body.error.code]).toEqual([404, "byok_credential_missing"])
    expect(r.text).not.toContain("gpt-x")
    r = await req("GET", `${BASE}/999999999/models`, { key })
    expect([r.status, r.body.error.code]).toEqual([404, "byok_credential_missing"])
    // After delete, the cache is gone with the credential.
    await req("DELETE", `${BASE}/${c.id}`, { key })
    r = await req("GET", `${BASE}/${c.id}/models`, { key })
    expect(r.status).toBe(404)
    expect(account.id).not.toBe(other.account.id)
  })

  it.skipIf(skip)("gates: 401 without auth; unlinked account 403; guests 403 byok_disabled with their own message", async () => {
    let r = await req("GET", BASE)
    expect(r.status).toBe(401)
    const unlinked = await newAccount(gw, { status: "unlinked" })
    const k1 = await newKey(gw, unlinked.id)
    r = await req("GET", BASE, { key: k1.key })
    expect(r.status).toBe(403)
    const guest = await newAccount(gw, { isGuest: true, guestExpiresAt: new Date(Date.now() + 86_400_000) })
    const session = await newSession(gw, guest.id)
    r = await req("GET", BASE, { session })
    expect([r.status, r.body.error.code]).toEqual([403, "byok_disabled"])
    expect(r.body.error.message).toMatch(/게스트/)
    // A cookie mutation needs the dashboard origin (CSRF) before any gate counts.
    const user = await newUser(gw)
    r = await req("POST", `${BASE}/verify`, { session: user.session, headers: { origin: "https://evil.example" }, body: openai(good("x")) })
    expect(r.status).toBe(403)
    expect(r.body.error.code).toBe("cross_site_request")
    r = await req("POST", `${BASE}/verify`, { session: user.session, body: openai(good("x")) })
    expect(r.body).toEqual({ success: true, data: { ok: true, model_count: 2 } })
  })

  it.skipIf(skip)("a body over 64 KiB is 413 before it is parsed", async () => {
    const { key } = await newUser(gw)
    const r = await req("POST", `${BASE}/verify`, { key, body: JSON.stringify(openai("x".repeat(70_000))) })
    expect(r.status).toBe(413)
  })

  it.skipIf(skip)("15 requests per minute shared by all seven endpoints", async () => {
    const { key } = await newUser(gw)
    const c = (await req("POST", BASE, { key, body: openai(good("rl")) })).body.data.credential
    const calls: Array<[string, string, unknown?]> = [
      ["GET", BASE],
      ["PUT", `${BASE}/fallback`, { enabled: true }],
      ["POST", `${BASE}/verify`, openai(good("rl"))],
      ["PATCH", `${BASE}/${c.id}`, { pinned: true }],
      ["GET", `${BASE}/${c.id}/models`]
    ]
    for (let i = 1; i < 15; i++) {
      const [method, path, body] = calls[i % calls.length]!
      const r = await req(method, path, { key, ...(body !== undefined ? { body } : {}) })
      expect(r.status, `${i}: ${method} ${path}`).toBe(200)
    }
    const r = await req("DELETE", `${BASE}/${c.id}`, { key })
    expect(r.status).toBe(429)
    expect(r.body.error.code).toBe("rate_limited")
    expect(r.body.error.message).toContain("15")
    expect(Number(r.headers.get("retry-after"))).toBeGreaterThan(0)
    // Nothing was deleted.
    const [row] = await query(gw, "SELECT status FROM byok_credentials WHERE id = $1", [c.id])
    expect(row!.status).toBe("active")
    // Another account has its own budget.
    expect((await req("GET", BASE, { key: (await newUser(gw)).key })).status).toBe(200)
  })

  it.skipIf(skip)("a canary secret is in no response, no log line and no row (only sealed in the ciphertext)", async () => {
    const { key } = await newUser(gw)
    const canary = `${GOOD}CANARY${Crypto.randomBytes(8).toString("hex")}`
    const badCanary = `sk-CANARY-bad-${Crypto.randomBytes(8).toString("hex")}`
    await req("POST", `${BASE}/verify`, { key, body: openai(canary) })
    const saved = await req("POST", BASE, { key, body: openai(canary, { label: "canary" }) })
    expect(saved.status).toBe(200)
    await req("GET", `${BASE}/${saved.body.data.credential.id}/models`, { key })
    await req("GET", BASE, { key })
    // The fake echoes a refused key in its 401 body; that must not travel on either.
    await req("POST", `${BASE}/verify`, { key, body: openai(badCanary) })
    await req("POST", BASE, { key, body: openai(badCanary) })
    await req("POST", BASE, { key, body: { provider: "gemini", secret: canary } })

    const needles = [canary, canary.slice(8), badCanary, badCanary.slice(8)]
    for (const body of bodies) for (const needle of needles) expect(body).not.toContain(needle)
    expect(gw.logs.length).toBeGreaterThan(0)
    for (const line of gw.logs) for (const needle of needles) expect(line).not.toContain(needle)
    const tables = await query<{ table_name: string }>(
      gw,
      "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
    )
    expect(tables.map((t) => t.table_name)).toEqual(expect.arrayContaining(["byok_credentials", "audit_log"]))
    for (const { table_name } of tables) {
      const rows = await query<{ t: string }>(gw, `SELECT t::text AS t FROM "${table_name}" t`)
      for (const { t } of rows) for (const needle of needles) expect(t, table_name).not.toContain(needle)
    }
    // The ciphertext opens to the canary with the row id (sealed, not dropped).
    const [row] = await query<{ secret_ciphertext: string }>(gw, "SELECT secret_ciphertext FROM byok_credentials WHERE id = $1", [
      saved.body.data.credential.id
    ])
    expect(row!.secret_ciphertext).toMatch(/^v1\./)
  })

  it.skipIf(skip)("the account repo still sees the fallback override the BYOK router wrote", async () => {
    const { account, key } = await newUser(gw)
    await req("PUT", `${BASE}/fallback`, { key, body: { enabled: true } })
    const row = await gw.run(Effect.flatMap(AccountsRepo, (repo) => repo.findAccount(account.id)))
    expect(row!.byok_fallback_override).toBe(true)
  })
})

describe("BYOK switched off", () => {
  let gw: CapturingGateway
  let db: FreshDatabase | undefined
  beforeAll(async () => {
    // Production mode (PostgreSQL) when available: cheaper to boot than a second embedded store.
    db = postgresAvailable ? await freshDatabase("byokoff") : undefined
    gw = await startCapturingGateway({
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => void (doc.byok = { enabled: false })
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
  })

  it("every endpoint answers 403 byok_disabled; guests still get their own message", async () => {
    const { key } = await newUser(gw)
    for (const [method, path] of [["GET", BASE], ["POST", `${BASE}/verify`], ["GET", `${BASE}/1/models`], ["DELETE", `${BASE}/1`]] as const) {
      const r = await call(gw, method, path, { key, ...(method === "POST" ? { body: { provider: "openai", secret: "x" } } : {}) })
      expect([r.status, r.body.error.code], `${method} ${path}`).toEqual([403, "byok_disabled"])
      expect(r.body.error.message).not.toMatch(/게스트/)
    }
    const guest = await newAccount(gw, { isGuest: true, guestExpiresAt: new Date(Date.now() + 86_400_000) })
    const r = await call(gw, "GET", BASE, { key: (await newKey(gw, guest.id)).key })
    expect([r.status, r.body.error.code]).toEqual([403, "byok_disabled"])
    expect(r.body.error.message).toMatch(/게스트/)
  })
})
