/**
 * `@provider[:label]/model` routing end to end, with the `openai` SDK against a fake OpenAI-compatible provider on
 * 127.0.0.1 (the operator's base URL override points `openai` at it): chat (JSON and stream) and embeddings through
 * the primary or a labelled credential, the model id verbatim, rows `byok`/`provider`, a 401 marking the
 * credential `rejected`, and the fallback to a pool model. Once per storage back end.
 */
import * as Crypto from "node:crypto"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { layerFromConfig } from "../../src/quota/layer.js"
import { call, flushRequestLog, newUser, query } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"
import { type FakeOpenAi, GOOD, startFakeOpenAi } from "./FakeOpenAi.js"
import { type CapturingGateway, startCapturingGateway } from "./support.js"
import { eventually } from "../support/Eventually.js"

const postgresAvailable = await serviceGate("postgres")
const BASE = "/api/user/me/byok"

const backends = [
  { name: "embedded PGlite", postgres: false },
  { name: "PostgreSQL", postgres: true }
] as const

const good = (tag: string) => `${GOOD}${tag}-${Crypto.randomBytes(6).toString("hex")}`


describe.each(backends)("BYOK routing on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  let gw: CapturingGateway
  let fake: FakeOpenAi
  let db: FreshDatabase | undefined

  const client = (key: string) => new OpenAI({ apiKey: key, baseURL: `${gw.url}/v1`, maxRetries: 0 })
  const save = async (key: string, secret: string, extra: Record<string, unknown> = {}) => {
    const r = await call(gw, "POST", BASE, { key, body: { provider: "openai", secret, ...extra } })
    expect(r.status, r.text).toBe(200)
    return r.body.data.credential
  }
  const rowOf = async (id: string | null) => {
    await flushRequestLog(gw)
    const rows = await query(gw, "SELECT * FROM request_log WHERE id = $1", [Number(id)])
    return rows[0]
  }

  beforeAll(async () => {
    if (skip) return
    fake = await startFakeOpenAi()
    db = postgres ? await freshDatabase("byokroute") : undefined
    gw = await startCapturingGateway({
      admission: layerFromConfig({ abuse: { burst: 1000, window_seconds: 10, cooldown_seconds: 60 } }),
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        doc.byok = {
          ...(postgres ? { enabled: true, encryption_key: Crypto.randomBytes(32).toString("hex") } : {}),
          providers: { openai: { base_url: `${fake.origin}/v1` } }
        }
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await fake?.close()
    await db?.drop()
  })

  it.skipIf(skip)("chat through the primary credential: model id verbatim, row byok + provider, no pool charge", async () => {
    const u = await newUser(gw)
    const secret = good("primary")
    await save(u.key, secret)
    const before = fake.chatCalls()
    const { data, response } = await client(u.key).chat.completions.create({
      model: "@openai/gpt-fake:2025",
      messages: [{ role: "user", content: "hi" }]
    }).withResponse()
    expect(data.choices[0]!.message.content).toBe("echo:gpt-fake:2025")
    expect(fake.chatCalls()).toBe(before + 1)
    const sent = fake.requests.at(-1)!
    expect(sent.path).toBe("/v1/chat/completions")
    expect(sent.headers.authorization).toBe(`Bearer ${secret}`)
    expect(sent.body.model).toBe("gpt-fake:2025")
    // OpenAI's own API takes max_completion_tokens; nothing is sent when the client set none.
    expect(sent.body.max_tokens).toBeUndefined()
    expect(sent.body.max_completion_tokens).toBeUndefined()
    const row = await rowOf(response.headers.get("x-request-id"))
    expect(row).toMatchObject({ status: "success", byok: true, provider: "openai", fell_back: false, model_id: "@openai/gpt-fake:2025" })
    expect(Number(row.weighted_cost)).toBe(0)
    const recent = await call(gw, "GET", "/api/user/me/requests", { key: u.key })
    expect(recent.body.requests[0]).toMatchObject({ byok: true, fell_back: false })
  })

  it.skipIf(skip)("stream through a labelled credential; embeddings too", async () => {
    const u = await newUser(gw)
    await save(u.key, good("first"))
    const second = good("second")
    await save(u.key, second, { label: "work" })
    const stream = await client(u.key).chat.completions.create({
      model: "@openai:work/gpt-fake",
      messages: [{ role: "user", content: "hi" }],
      stream: true,
      max_tokens: 50
    })
    let text = ""
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? ""
    expect(text).toBe("echo:gpt-fake")
    const sent = fake.requests.at(-1)!
    expect(sent.headers.authorization).toBe(`Bearer ${second}`)
    expect(sent.body.max_completion_tokens).toBe(50)
    const emb = await client(u.key).embeddings.create({ model: "@openai:work/text-embed-fake", input: ["abc", "de"] })
    expect(emb.data.map((d) => d.embedding[0])).toEqual([3, 2])
    expect(fake.requests.at(-1)!.path).toBe("/v1/embeddings")
  })

  it.skipIf(skip)("unknown label or provider: 400 byok_credential_missing; malformed reference: model_not_found", async () => {
    const u = await newUser(gw)
    await save(u.key, good("only"))
    const before = fake.chatCalls()
    for (const model of ["@openai:nope/gpt-fake", "@anthropic/claude", "@nosuch/x"]) {
      const r = await call(gw, "POST", "/v1/chat/completions", { key: u.key, body: { model, messages: [{ role: "user", content: "x" }] } })
      expect(r.status, model).toBe(400)
      expect(r.body.error.code).toBe("byok_credential_missing")
    }
    for (const model of ["@openai", "@openai/", "@/x", "@openai:bad label/x"]) {
      const r = await call(gw, "POST", "/v1/chat/completions", { key: u.key, body: { model, messages: [{ role: "user", content: "x" }] } })
      expect(r.status, model).toBe(400)
      expect(r.body.error.code).toBe("model_not_found")
    }
    expect(fake.chatCalls()).toBe(before)
  })

  it.skipIf(skip)("a 401 marks the credential rejected; later requests are refused without a call", async () => {
    const u = await newUser(gw)
    const secret = good("revoked")
    const credential = await save(u.key, secret)
    fake.revoked.add(secret)
    const r = await call(gw, "POST", "/v1/chat/completions", {
      key: u.key,
      body: { model: "@openai/gpt-fake", messages: [{ role: "user", content: "x" }] }
    })
    expect(r.status).toBe(400)
    expect(r.body.error.code).toBe("byok_credential_rejected")
    expect(r.text).not.toContain(secret)
    const listed = await eventually(async () => {
      const l = await call(gw, "GET", BASE, { key: u.key })
      const c = l.body.data.credentials.find((x: any) => x.id === credential.id)
      return c.status === "rejected" ? c : undefined
    })
    expect(listed.last_error_code).toBe("auth_failed")
    const calls = fake.chatCalls()
    const again = await call(gw, "POST", "/v1/chat/completions", {
      key: u.key,
      body: { model: "@openai/gpt-fake", messages: [{ role: "user", content: "x" }] }
    })
    expect(again.body.error.code).toBe("byok_credential_rejected")
    expect(fake.chatCalls()).toBe(calls)
    expect(gw.logs.join("\n")).not.toContain(secret)
  })

  it.skipIf(skip)("fallback: a failed dispatch before the first byte is answered by the pool model, charged", async () => {
    const u = await newUser(gw)
    const secret = good("fallback")
    const credential = await save(u.key, secret)
    expect((await call(gw, "PATCH", `${BASE}/${credential.id}`, { key: u.key, body: { fallback_model_id: "ws-lite" } })).status).toBe(200)
    expect((await call(gw, "PUT", `${BASE}/fallback`, { key: u.key, body: { enabled: true } })).status).toBe(200)
    fake.fail.set(secret, 500)
    const { data, response } = await client(u.key).chat.completions.create({
      model: "@openai/gpt-fake",
      messages: [{ role: "user", content: "hello" }]
    }).withResponse()
    expect(data.model).toBe("ws-lite")
    expect(typeof data.choices[0]!.message.content).toBe("string")
    const row = await rowOf(response.headers.get("x-request-id"))
    expect(row).toMatchObject({ status: "success", byok: true, fell_back: true, provider: "openai", model_id: "ws-lite" })
    expect(Number(row.weighted_cost)).toBeGreaterThan(0)
    // A 500 does not reject the credential.
    const listed = await call(gw, "GET", BASE, { key: u.key })
    expect(listed.body.data.credentials[0].status).toBe("active")
  })
})
