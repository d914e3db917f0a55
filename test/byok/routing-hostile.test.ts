/**
 * BYOK routing against a hostile client and a hostile provider (HostileUpstream.ts), on PostgreSQL:
 *
 * 1. fuzzed `@...` model references on chat and embeddings: never a 5xx, always the envelope with a Korean
 *    message, never an echo of the input, a bounded row `model_id`; a `/` inside the model part passes verbatim;
 * 2. a client that goes away mid-stream or before the first byte: the upstream request is aborted, the row is
 *    `cancelled`, and 30 such cycles leak no connection of a 4-connection pool;
 * 3. a provider dying after the first byte: the stream ends without `[DONE]`, no fallback;
 * 4. a provider hanging before its headers: 503 `upstream_timeout` after `first_token_ms`, the credential kept;
 * 5. huge and endless bodies, and redirects (never followed);
 * 6. a custom base URL allowed when saved, refused at dispatch by a gateway whose allow-list no longer has it;
 * 7. 50 concurrent requests through a revoked key: one state change, one announcement, no 5xx.
 */
import fc from "fast-check"
import * as Crypto from "node:crypto"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, flushRequestLog, newUser, query, type Reply } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { POSTGRES, serviceGate } from "../support/Services.js"
import {
  GOOD,
  type HostileUpstream,
  type RedirectTarget,
  startHostileUpstream,
  startRedirectTarget
} from "./HostileUpstream.js"
import { type CapturingGateway, startCapturingGateway } from "./support.js"
import { eventually as poll } from "../support/Eventually.js"

/** Polls until `check` holds, at most 15 s. */
const eventually = <A>(check: () => A | Promise<A>) => poll(check, { timeoutMs: 15_000, everyMs: 50 })

const postgresAvailable = await serviceGate("postgres")
const BASE = "/api/user/me/byok"
const CHAT = "/v1/chat/completions"
const EMBEDDINGS = "/v1/embeddings"
const POOL_CONNECTIONS = 4
const HANGUL = /[\uac00-\ud7a3]/
const MB = 1024 * 1024

const good = (tag: string) => `${GOOD}${tag}-${Crypto.randomBytes(6).toString("hex")}`


const messages = [{ role: "user", content: "안녕" }]
const chatBody = (model: string, extra: Record<string, unknown> = {}) => ({ model, messages, ...extra })
const embeddingsBody = (model: string) => ({ model, input: ["abc"] })

/** The inference error envelope: `{error: {message (Korean), type, code}}` and nothing else. */
const expectEnvelope = (r: Reply, status: number, code: string) => {
  expect(r.status, r.text.slice(0, 300)).toBe(status)
  expect(Object.keys(r.body)).toEqual(["error"])
  expect(Object.keys(r.body.error).sort()).toEqual(["code", "message", "type"])
  expect(r.body.error.code).toBe(code)
  expect(typeof r.body.error.type).toBe("string")
  expect(r.body.error.message).toMatch(HANGUL)
}

/** No run of 24 characters of `input` appears in `text` (a bounded echo at most). */
const expectNoEcho = (text: string, input: string) => {
  expect(text.length).toBeLessThan(2_000)
  for (let i = 0; i + 24 <= input.length; i += 12) expect(text.includes(input.slice(i, i + 24))).toBe(false)
}

const configureByok = (
  doc: Record<string, any>,
  origin: string,
  extra: { readonly key: string; readonly allow?: ReadonlyArray<string>; readonly timeouts?: object }
) => {
  doc.byok = {
    enabled: true,
    encryption_key: extra.key,
    rate_limit_rpm: 100_000,
    connections_per_origin: POOL_CONNECTIONS,
    http_allowlist: extra.allow ?? [],
    ...(extra.timeouts ? { dispatch_timeouts: extra.timeouts } : {}),
    providers: {
      openai: { base_url: `${origin}/v1` },
      openrouter: { base_url: `${origin}/or/v1` },
      azure: { base_url: `${origin}/{resource}/openai` }
    }
  }
  doc.abuse = { burst: 100_000, window_seconds: 10, cooldown_seconds: 60 }
  doc.limits = { ...doc.limits, failed_requests_per_minute: 100_000 }
}

describe.skipIf(!postgresAvailable)("BYOK routing under hostile clients and providers (PostgreSQL)", () => {
  let up: HostileUpstream
  let custom: HostileUpstream
  let target: RedirectTarget
  let gw: CapturingGateway
  let db: FreshDatabase
  const encryptionKey = Crypto.randomBytes(32).toString("hex")

  const save = async (g: CapturingGateway, key: string, body: Record<string, unknown>) => {
    const r = await call(g, "POST", BASE, { key, body })
    expect(r.status, r.text).toBe(200)
    return r.body.data.credential
  }
  const post = (key: string, path: string, body: unknown, g: CapturingGateway = gw) => call(g, "POST", path, { key, body })
  const rowById = async (g: CapturingGateway, id: string | null | undefined) => {
    await flushRequestLog(g)
    return (await query(g, "SELECT * FROM request_log WHERE id = $1", [Number(id)]))[0]
  }
  /** The account's rows for `modelId`, newest first, once `count` of them are written. */
  const rowsOf = (g: CapturingGateway, accountId: string, modelId: string, count: number) =>
    eventually(async () => {
      await flushRequestLog(g)
      const rows = await query(g, "SELECT * FROM request_log WHERE account_id = $1 AND model_id = $2 ORDER BY id DESC", [
        accountId,
        modelId
      ])
      return rows.length >= count ? rows : undefined
    })
  const credentialStatus = async (g: CapturingGateway, key: string, id: number) => {
    const l = await call(g, "GET", BASE, { key })
    return l.body.data.credentials.find((c: any) => c.id === id)
  }
  const streamFetch = (key: string, body: object, signal?: AbortSignal) =>
    fetch(`${gw.url}${CHAT}`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      ...(signal ? { signal } : {})
    })
  /** Reads a body to its end (or its cut), as text. */
  const readAll = async (res: Response): Promise<{ text: string; cut: boolean }> => {
    const reader = res.body!.getReader()
    const decoder = new TextDecoder()
    let text = ""
    try {
      for (;;) {
        const { done, value } = await reader.read()
        if (done) return { text, cut: false }
        text += decoder.decode(value, { stream: true })
      }
    } catch {
      return { text, cut: true }
    }
  }

  beforeAll(async () => {
    target = await startRedirectTarget()
    up = await startHostileUpstream({ redirectTo: target.origin })
    custom = await startHostileUpstream()
    db = await freshDatabase("byokhostile")
    gw = await startCapturingGateway({
      databaseUrl: db.url,
      configure: (doc) => configureByok(doc, up.origin, { key: encryptionKey, allow: [custom.origin] })
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await up?.close()
    await custom?.close()
    await target?.close()
    await db?.drop()
  })

  // ----- 1. fuzzed references

  describe("fuzzed model references", () => {
    const nfc = "läbel".normalize("NFC")
    const nfd = "läbel".normalize("NFD")
    let user: Awaited<ReturnType<typeof newUser>>

    beforeAll(async () => {
      user = await newUser(gw)
      await save(gw, user.key, { provider: "openai", secret: good("fz-primary") })
      await save(gw, user.key, { provider: "openai", secret: good("fz-work"), label: "work" })
      await save(gw, user.key, { provider: "openai", secret: good("fz-nfc"), label: nfc })
      await save(gw, user.key, { provider: "openrouter", secret: good("fz-or") })
      await save(gw, user.key, { provider: "azure", auth_scheme: "api-key", secret: good("fz-az"), meta: { resource: "res" } })
    })

    const malformed = [
      "@",
      "@@x/y",
      "@openai:/x",
      `@openai:${"a".repeat(41)}/x`,
      "@OPENAI/x",
      "@Openai/x",
      `@openai/${"m".repeat(201)}`,
      `@openai:${"a".repeat(161)}/x`,
      "@openai/x\u0000y",
      "@openai/x\u001by",
      "@openai/x\u0085y",
      "@openai/x y",
      "@openai/\ud800",
      "@openai/a\udc00b",
      "@azure/\ud800",
      "@azure/deploy\udbff",
      "@azure/..",
      "@azure:key-1/.",
      "@openai:a:b/x",
      "@openai:a@b/x",
      "@openai:a b/x",
      "@openai:\u202eevil/x",
      "@openai\u0000/x",
      "@ openai/x",
      `@${"p".repeat(33)}/x`,
      "@openai",
      "@openai/",
      "@/x",
      `@openai:${"가".repeat(41)}/x`
    ]

    for (const path of [CHAT, EMBEDDINGS]) {
      it(`malformed references on ${path}: 400 model_not_found (invalid_request past 256 chars), Korean envelope, no echo, bounded row`, async () => {
        const before = up.requests.length
        for (const model of malformed) {
          const r = await post(user.key, path, path === CHAT ? chatBody(model) : embeddingsBody(model))
          expectEnvelope(r, 400, "model_not_found")
          expectNoEcho(r.text, model)
          const row = await rowById(gw, r.headers.get("x-request-id"))
          expect(row, JSON.stringify(model.slice(0, 40))).toBeDefined()
          expect([...row.model_id].length).toBeLessThanOrEqual(128)
          expect(row.model_id).not.toMatch(/[\u0000-\u001f\u007f-\u009f]/)
          expect(row.status).toBe("error")
        }
        // Over the request schema's 256 characters: refused before it is read as a reference.
        for (const model of [`@openai/${"m".repeat(10_000)}`, `@openai:${"b".repeat(300)}/x`, `@${"@".repeat(5_000)}`]) {
          const r = await post(user.key, path, path === CHAT ? chatBody(model) : embeddingsBody(model))
          expectEnvelope(r, 400, "invalid_request")
          expectNoEcho(r.text, model)
          const row = await rowById(gw, r.headers.get("x-request-id"))
          expect([...row.model_id].length).toBeLessThanOrEqual(128)
        }
        expect(up.requests.length).toBe(before)
      })

      it(`references naming no credential on ${path}: 400 byok_credential_missing`, async () => {
        const before = up.requests.length
        for (const model of ["@nosuch/x", "@anthropic/claude", "@gemini/x", "@openai:other/x", "@custom/x", "@openrouter:work/x"]) {
          const r = await post(user.key, path, path === CHAT ? chatBody(model) : embeddingsBody(model))
          expectEnvelope(r, 400, "byok_credential_missing")
          expectNoEcho(r.text, model)
        }
        expect(up.requests.length).toBe(before)
      })

      it(`a '/' inside the model part passes verbatim on ${path} (labels end at the first '/')`, async () => {
        const cases: Array<[string, string, string]> = [
          // [reference, model id the provider receives, where it is sent]
          ["@openai/org/model", "org/model", "/v1/"],
          ["@openrouter/meta-llama/llama-3", "meta-llama/llama-3", "/or/v1/"],
          ["@openrouter/meta-llama/llama-3.1-8b-instruct:free", "meta-llama/llama-3.1-8b-instruct:free", "/or/v1/"],
          ["@openai:work/a/b/c", "a/b/c", "/v1/"],
          ["@openai/模型-ü/🦙", "模型-ü/🦙", "/v1/"],
          ["@openai/@openai/x", "@openai/x", "/v1/"],
          ["@openai/:x", ":x", "/v1/"],
          [`@openai/${"z".repeat(200)}`, "z".repeat(200), "/v1/"]
        ]
        for (const [reference, model, prefix] of cases) {
          const r = await post(user.key, path, path === CHAT ? chatBody(reference) : embeddingsBody(reference))
          expect(r.status, `${reference.slice(0, 60)}: ${r.text.slice(0, 200)}`).toBe(200)
          const sent = up.requests.at(-1)!
          expect(sent.body.model).toBe(model)
          expect(sent.path.startsWith(prefix)).toBe(true)
          const row = await rowById(gw, r.headers.get("x-request-id"))
          expect(row).toMatchObject({ status: "success", byok: true })
          expect(row.model_id.length).toBeLessThanOrEqual(128)
          expect(reference.startsWith(row.model_id)).toBe(true)
        }
      })

      it(`a label in NFD names the credential saved under its NFC form on ${path}`, async () => {
        expect(nfd).not.toBe(nfc)
        const r = await post(user.key, path, path === CHAT ? chatBody(`@openai:${nfd}/x`) : embeddingsBody(`@openai:${nfd}/x`))
        expect(r.status, r.text).toBe(200)
        expect(String(up.requests.at(-1)!.headers.authorization)).toContain("fz-nfc")
      })
    }

    it("an Azure deployment id with a lone surrogate is refused, never a 500", async () => {
      // The deployment id goes into the URL path (encodeURIComponent throws on a lone surrogate).
      for (const path of [CHAT, EMBEDDINGS]) {
        const model = "@azure/dep\ud800loy"
        const r = await post(user.key, path, path === CHAT ? chatBody(model) : embeddingsBody(model))
        expectEnvelope(r, 400, "model_not_found")
      }
      // A well-formed one reaches the deployment's path.
      const ok = await post(user.key, CHAT, chatBody("@azure/dep-1"))
      expect(ok.status, ok.text).toBe(200)
      expect(up.requests.at(-1)!.path).toMatch(/^\/res\/openai\/deployments\/dep-1\/chat\/completions\?api-version=/)
    })

    it("random references: never a 5xx; 4xx is the Korean envelope without echo; rows bounded", async () => {
      const piece = fc.oneof(
        fc.string({ unit: "binary", maxLength: 60 }),
        fc.string({ unit: "grapheme", maxLength: 30 }),
        fc.constantFrom("/", ":", "@", "\u0000", "\ud800", "\udfff", "\u202e", "..", "%2F", "?", "#", " ", "\n", "work", nfd, nfc),
        fc.string({ unit: fc.constantFrom("a", "/", ":", "@", "-", "_", "."), maxLength: 300 })
      )
      const model = fc.tuple(
        fc.constantFrom("@", "@openai/", "@openai:", "@openai:work/", "@openrouter/", "@azure/", "@custom/", "@@", "@OpenAI/"),
        fc.array(piece, { maxLength: 5 })
      ).map(([head, parts]) => head + parts.join(""))
      const samples = fc.sample(model, { numRuns: 300, seed: 20250614 })
      const rowIds: Array<number> = []
      for (const [i, m] of samples.entries()) {
        const path = i % 2 === 0 ? CHAT : EMBEDDINGS
        const r = await post(user.key, path, path === CHAT ? chatBody(m) : embeddingsBody(m))
        const label = JSON.stringify(m.slice(0, 80))
        expect(r.status, label).toBeLessThan(500)
        if (r.status !== 200) {
          expect(r.status, label).toBeGreaterThanOrEqual(400)
          expect(Object.keys(r.body.error).sort(), label).toEqual(["code", "message", "type"])
          expect(r.body.error.message, label).toMatch(HANGUL)
          expectNoEcho(r.text, m)
        }
        const id = r.headers.get("x-request-id")
        expect(id, label).not.toBeNull()
        rowIds.push(Number(id))
      }
      await flushRequestLog(gw)
      const rows = await query(gw, "SELECT id, model_id FROM request_log WHERE id = ANY($1::bigint[])", [rowIds])
      expect(rows.length).toBe(rowIds.length)
      for (const row of rows) {
        expect([...row.model_id].length).toBeLessThanOrEqual(128)
        expect(row.model_id).not.toMatch(/[\u0000-\u001f\u007f-\u009f]/)
      }
    })
  })

  // ----- 2. client cancels

  describe("client cancels", () => {
    it("mid-stream: the upstream request is aborted and the row is cancelled", async () => {
      const u = await newUser(gw)
      await save(gw, u.key, { provider: "openai", secret: good("cancel-mid") })
      const arrival = up.arrival("slow")
      const abort = new AbortController()
      const res = await streamFetch(u.key, chatBody("@openai/slow", { stream: true }), abort.signal)
      expect(res.status).toBe(200)
      const rowId = res.headers.get("x-request-id")
      const reader = res.body!.getReader()
      let text = ""
      while (!text.includes("first")) text += new TextDecoder().decode((await reader.read()).value)
      abort.abort()
      const seen = await arrival
      await seen.closed
      expect(seen.aborted).toBe(true)
      const row = await eventually(async () => {
        const r = await rowById(gw, rowId)
        return r?.status === "cancelled" ? r : undefined
      })
      expect(row).toMatchObject({ byok: true, provider: "openai", http_status: 499, fell_back: false })
    })

    it("before the first byte: the upstream request is aborted and the row is cancelled", async () => {
      const u = await newUser(gw)
      await save(gw, u.key, { provider: "openai", secret: good("cancel-early") })
      for (const stream of [true, false]) {
        const arrival = up.arrival("hang")
        const abort = new AbortController()
        const pending = streamFetch(u.key, chatBody("@openai/hang", { stream }), abort.signal).then(
          () => "answered",
          (e: Error) => e.name
        )
        const seen = await arrival
        abort.abort()
        expect(await pending).toBe("AbortError")
        await seen.closed
        expect(seen.aborted).toBe(true)
      }
      const rows = await rowsOf(gw, u.account.id, "@openai/hang", 2)
      for (const row of rows) expect(row).toMatchObject({ status: "cancelled", byok: true, http_status: 499 })
    })

    it("30 cancel cycles leak nothing: every upstream request closed, the pool serves the next request", async () => {
      const u = await newUser(gw)
      const secret = good("cancel-cycles")
      await save(gw, u.key, { provider: "openai", secret })
      const before = up.callsWith(secret)
      for (let i = 0; i < 30; i++) {
        const model = i % 2 === 0 ? "slow" : "hang"
        const arrival = up.arrival(model)
        const abort = new AbortController()
        const pending = streamFetch(u.key, chatBody(`@openai/${model}`, { stream: i % 3 !== 2 }), abort.signal)
        if (model === "slow" && i % 3 !== 2) {
          const res = await pending
          const reader = res.body!.getReader()
          await reader.read()
          abort.abort()
          await reader.read().catch(() => undefined)
        } else {
          pending.catch(() => undefined)
          await arrival
          abort.abort()
        }
        const seen = await arrival
        await seen.closed
        expect(seen.aborted, `cycle ${i}`).toBe(true)
      }
      expect(up.callsWith(secret) - before).toBe(30)
      // With 4 connections per origin, one leaked request of the 30 would leave the pool short; all are closed.
      await eventually(() => up.sockets() <= POOL_CONNECTIONS)
      const rows = await rowsOf(gw, u.account.id, "@openai/slow", 15)
      const hung = await rowsOf(gw, u.account.id, "@openai/hang", 15)
      for (const row of [...rows, ...hung]) expect(row.status).toBe("cancelled")
      // The gateway and the pool still answer, several requests at once.
      const after = await Promise.all(Array.from({ length: 8 }, () => post(u.key, CHAT, chatBody("@openai/ok-after"))))
      for (const r of after) expect(r.status, r.text).toBe(200)
    })
  })

  // ----- 3. provider dies mid-stream

  it("a provider dying after the first byte: no [DONE], row error, no fallback although fallback is on", async () => {
    const u = await newUser(gw)
    const credential = await save(gw, u.key, { provider: "openai", secret: good("die") })
    expect((await call(gw, "PATCH", `${BASE}/${credential.id}`, { key: u.key, body: { fallback_model_id: "ws-lite" } })).status).toBe(200)
    expect((await call(gw, "PUT", `${BASE}/fallback`, { key: u.key, body: { enabled: true } })).status).toBe(200)
    const res = await streamFetch(u.key, chatBody("@openai/die", { stream: true }))
    expect(res.status).toBe(200)
    const rowId = res.headers.get("x-request-id")
    const { text } = await readAll(res)
    expect(text).toContain("partial")
    expect(text).not.toContain("[DONE]")
    expect(text).not.toContain("ws-lite")
    const row = await eventually(async () => {
      const r = await rowById(gw, rowId)
      return r?.status === "error" ? r : undefined
    })
    expect(row).toMatchObject({
      byok: true,
      fell_back: false,
      provider: "openai",
      model_id: "@openai/die",
      error_code: "upstream_error",
      stream: true
    })
    expect(Number(row.weighted_cost)).toBe(0)
    expect((await credentialStatus(gw, u.key, credential.id)).status).toBe("active")
  })

  // ----- 5. huge bodies, redirects

  describe("huge and endless answers, redirects", () => {
    let u: Awaited<ReturnType<typeof newUser>>
    let credentialId: number
    beforeAll(async () => {
      u = await newUser(gw)
      credentialId = (await save(gw, u.key, { provider: "openai", secret: good("huge") })).id
    })

    const bodies: Array<[string, string, boolean]> = [
      ["huge-error", CHAT, false],
      ["huge-error", CHAT, true],
      ["huge-error", EMBEDDINGS, false],
      ["huge-json", CHAT, false],
      ["huge-json", EMBEDDINGS, false],
      ["endless-error", CHAT, false],
      ["endless-error", CHAT, true],
      ["endless-error", EMBEDDINGS, false],
      ["endless-json", CHAT, false],
      ["endless-json", EMBEDDINGS, false]
    ]
    for (const [model, path, stream] of bodies) {
      it(`${model} on ${path}${stream ? " (stream)" : ""}: a quick 500 upstream_error, the read bounded`, async () => {
        const arrival = up.arrival(model)
        const started = performance.now()
        const r = await post(u.key, path, path === CHAT ? chatBody(`@openai/${model}`, { stream }) : embeddingsBody(`@openai/${model}`))
        expectEnvelope(r, 500, "upstream_error")
        expect(r.text).not.toContain("xxxxxxxx")
        expect(performance.now() - started).toBeLessThan(8_000)
        const seen = await arrival
        await seen.closed
        if (model !== "huge-json") {
          // The gateway stopped reading and closed the connection: what was sent is bounded by its limits
          // (64 KiB of an error body, 64 MiB of an answer) plus what the sockets buffer.
          expect(seen.aborted).toBe(true)
          expect(seen.sent).toBeLessThan(model.endsWith("-error") ? 16 * MB : 80 * MB)
        }
      }, 20_000)
    }

    it("a 302 is never followed (metadata address or any target): upstream error, nothing reaches the target", async () => {
      for (const model of ["redirect-metadata", "redirect-target"]) {
        for (const [path, stream] of [[CHAT, false], [CHAT, true], [EMBEDDINGS, false]] as const) {
          const r = await post(u.key, path, path === CHAT ? chatBody(`@openai/${model}`, { stream }) : embeddingsBody(`@openai/${model}`))
          expectEnvelope(r, 500, "upstream_error")
          expect(r.text).not.toContain("169.254")
          expect(r.text).not.toContain(target.origin)
        }
      }
      expect(target.hits()).toBe(0)
      expect((await credentialStatus(gw, u.key, credentialId)).status).toBe("active")
    })
  })

  // ----- 6. custom base URL refused at dispatch

  it("a custom base URL no longer allow-listed is refused at dispatch by a gateway on the same database", async () => {
    const u = await newUser(gw)
    const secret = good("custom")
    const credential = await save(gw, u.key, { provider: "custom", secret, meta: { base_url: `${custom.origin}/v1` } })
    const ok = await post(u.key, CHAT, chatBody("@custom/ok-custom"))
    expect(ok.status, ok.text).toBe(200)
    expect(custom.callsWith(secret)).toBe(1)

    const other = await startCapturingGateway({
      databaseUrl: db.url,
      configure: (doc) => configureByok(doc, up.origin, { key: encryptionKey, allow: ["http://127.0.0.1:1"] })
    })
    try {
      const seen = custom.requests.length
      for (const [path, stream] of [[CHAT, false], [CHAT, true], [EMBEDDINGS, false]] as const) {
        const r = await post(
          u.key,
          path,
          path === CHAT ? chatBody("@custom/ok-custom", { stream }) : embeddingsBody("@custom/ok-custom"),
          other
        )
        expectEnvelope(r, 400, "byok_credential_missing")
        expect(r.text).not.toContain(custom.origin)
      }
      expect(custom.requests.length).toBe(seen)
      // The credential itself is untouched (the first gateway, still allowing the origin, uses it).
      expect((await credentialStatus(other, u.key, credential.id)).status).toBe("active")
      expect((await post(u.key, CHAT, chatBody("@custom/ok-again"))).status).toBe(200)
      expect(other.logs.join("\n")).not.toContain(secret)
    } finally {
      await other.stop()
    }
  })

  // ----- 7. concurrency on a revoked key

  it("50 concurrent requests through a revoked key: all 400 byok_credential_rejected, one state change, one announcement", async () => {
    const u = await newUser(gw)
    const secret = good("revoked50")
    const credential = await save(gw, u.key, { provider: "openai", secret })
    // Every status change of this credential, as the database sees it.
    await query(gw, `CREATE TABLE IF NOT EXISTS hostile_transitions (id bigint, old_status text, new_status text)`)
    await query(
      gw,
      `CREATE OR REPLACE FUNCTION hostile_transition() RETURNS trigger AS $$
       BEGIN
         IF OLD.status IS DISTINCT FROM NEW.status THEN
           INSERT INTO hostile_transitions VALUES (NEW.id, OLD.status, NEW.status);
         END IF;
         RETURN NEW;
       END $$ LANGUAGE plpgsql`
    )
    await query(gw, "DROP TRIGGER IF EXISTS hostile_transition ON byok_credentials")
    await query(gw, "CREATE TRIGGER hostile_transition AFTER UPDATE ON byok_credentials FOR EACH ROW EXECUTE FUNCTION hostile_transition()")
    const listener = new pg.Client({ ...POSTGRES, database: db.name })
    await listener.connect()
    const announcements: Array<string> = []
    listener.on("notification", (n) => {
      // `byok:<account>|<replica tag>`
      if (n.payload?.split("|")[0] === `byok:${u.account.id}`) announcements.push(n.payload)
    })
    await listener.query("LISTEN wellspring_auth")
    try {
      up.revoked.add(secret)
      const wave = () => Promise.all(Array.from({ length: 50 }, () => post(u.key, CHAT, chatBody("@openai/gpt-x"))))
      const first = await wave()
      for (const r of first) {
        expectEnvelope(r, 400, "byok_credential_rejected")
        expect(r.text).not.toContain(secret)
      }
      const called = up.callsWith(secret)
      expect(called).toBeGreaterThanOrEqual(1)
      expect(called).toBeLessThanOrEqual(50)
      await eventually(() => announcements.length >= 1)
      const listed = await credentialStatus(gw, u.key, credential.id)
      expect(listed).toMatchObject({ status: "rejected", last_error_code: "auth_failed" })
      // A second wave is refused without a call.
      const second = await wave()
      for (const r of second) expectEnvelope(r, 400, "byok_credential_rejected")
      expect(up.callsWith(secret)).toBe(called)
      // Quiet: no statement of the gateway still touching the credentials.
      await eventually(async () => {
        const busy = await query(
          gw,
          `SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active' AND query ILIKE '%byok_credentials%'`
        )
        return busy[0]!.n === 0
      })
      const transitions = await query(gw, "SELECT * FROM hostile_transitions WHERE id = $1", [credential.id])
      expect(transitions.map((t) => `${t.old_status}->${t.new_status}`)).toEqual(["active->rejected"])
      expect(announcements.length).toBe(1)
      expect(gw.logs.join("\n")).not.toContain(secret)
    } finally {
      await listener.end()
    }
  })
})

// ----- 4. a provider hanging before its headers (its own gateway: a short first-token timeout)

describe("BYOK dispatch timeouts against a hanging provider", () => {
  let up: HostileUpstream
  let gw: CapturingGateway

  beforeAll(async () => {
    up = await startHostileUpstream()
    gw = await startCapturingGateway({
      configure: (doc) =>
        configureByok(doc, up.origin, {
          key: Crypto.randomBytes(32).toString("hex"),
          timeouts: { first_token_ms: 300, idle_ms: 300, total_ms: 1_000 }
        })
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await up?.close()
  })

  const save = async (key: string, secret: string) => {
    const r = await call(gw, "POST", BASE, { key, body: { provider: "openai", secret } })
    expect(r.status, r.text).toBe(200)
    return r.body.data.credential
  }

  it("no headers within first_token_ms: 503 upstream_timeout (chat, stream, embeddings), the credential kept", async () => {
    const u = await newUser(gw)
    const secret = good("hang")
    const credential = await save(u.key, secret)
    for (const [path, stream] of [[CHAT, false], [CHAT, true], [EMBEDDINGS, false]] as const) {
      const arrival = up.arrival("hang")
      const started = performance.now()
      const r = await call(gw, "POST", path, {
        key: u.key,
        body: path === CHAT ? chatBody("@openai/hang", { stream }) : embeddingsBody("@openai/hang")
      })
      const elapsed = performance.now() - started
      expectEnvelope(r, 503, "upstream_timeout")
      // first_token_ms bounds the wait for headers on every call, the buffered embeddings one too (not total_ms).
      expect(elapsed).toBeGreaterThanOrEqual(290)
      expect(elapsed).toBeLessThan(path === CHAT ? 5_000 : 950)
      const seen = await arrival
      await seen.closed
      expect(seen.aborted).toBe(true)
    }
    // Not rejected: the next request through it is sent and answered.
    const ok = await call(gw, "POST", CHAT, { key: u.key, body: chatBody("@openai/ok-after-timeout") })
    expect(ok.status, ok.text).toBe(200)
    const listed = await call(gw, "GET", BASE, { key: u.key })
    expect(listed.body.data.credentials.find((c: any) => c.id === credential.id).status).toBe("active")
  }, 20_000)
})
