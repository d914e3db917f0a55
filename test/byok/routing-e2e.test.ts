/**
 * BYOK routing end to end, beyond the first routing tests (routing.test.ts): the Anthropic wire through a user's
 * credential, the fallback matrix, re-verification of a rejected credential, the per-provider RPM window, the
 * gates, the `byok` block of the metrics, last-used stamps and the secret canary. The `openai` SDK (or plain
 * fetch) talks to the gateway; fake providers answer on 127.0.0.1 (the operator's base URL overrides point the
 * providers at them). Once per storage back end.
 */
import * as Crypto from "node:crypto"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import OpenAI from "openai"
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AccountMessages } from "../../src/errors/Catalog.js"
import { layerFromConfig } from "../../src/quota/layer.js"
import { call, type CallOptions, flushRequestLog, newUser, query, type Reply } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { errorBody, FakeBehaviour, type FakeAnthropic, FakeMessages, startFakeAnthropic } from "../support/FakeAnthropic.js"
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

const hex = () => Crypto.randomBytes(8).toString("hex")
const good = (tag: string) => `${GOOD}${tag}-${hex()}`


const weatherTool: ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
  }
}

// ---------------------------------------------------------------------------------------------
// The fake Anthropic with a model listing (the BYOK probe and listing use `GET <base>/models?limit=1000`; the
// shared fake serves only `POST /v1/messages`): a small front server answers the listing and passes everything
// else through to the fake unchanged (streams included).

interface AnthropicProvider {
  readonly origin: string
  readonly fake: FakeAnthropic
  readonly listings: Array<Http.IncomingHttpHeaders>
  readonly close: () => Promise<void>
}

const startAnthropic = async (apiKey: string): Promise<AnthropicProvider> => {
  const fake = await startFakeAnthropic({ apiKey })
  const target = new URL(fake.url)
  const listings: Array<Http.IncomingHttpHeaders> = []
  const server = Http.createServer((req, res) => {
    if (req.method === "GET" && req.url === "/v1/models?limit=1000") {
      listings.push(req.headers)
      const ok = req.headers["x-api-key"] === apiKey && req.headers["anthropic-version"] === "2023-06-01"
      res.writeHead(ok ? 200 : 401, { "content-type": "application/json" })
      return res.end(JSON.stringify(
        ok
          ? { data: [{ id: "claude-x", display_name: "Claude X", type: "model" }], has_more: false }
          : errorBody("authentication_error", "invalid x-api-key")
      ))
    }
    const upstream = Http.request({
      host: target.hostname,
      port: target.port,
      method: req.method,
      path: req.url,
      headers: req.headers
    }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers)
      answer.pipe(res)
      answer.on("error", () => res.destroy())
    })
    upstream.on("error", () => res.destroy())
    req.pipe(upstream)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    fake,
    listings,
    close: async () => {
      await new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
      await fake.close()
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A gateway under test with every response text it gave kept (the canary greps them).

interface Harness {
  gw: CapturingGateway
  /** Every response text read from the gateway. */
  readonly seen: Array<string>
  readonly pending: Array<Promise<void>>
  readonly call: (method: string, path: string, options?: CallOptions) => Promise<Reply>
  readonly client: (key: string) => OpenAI
  readonly rowOf: (requestId: string | null) => Promise<Record<string, any>>
}

const harness = (): Harness => {
  const seen: Array<string> = []
  const pending: Array<Promise<void>> = []
  const h: Harness = {
    gw: undefined as unknown as CapturingGateway,
    seen,
    pending,
    call: async (method, path, options) => {
      const r = await call(h.gw, method, path, options)
      seen.push(r.text)
      return r
    },
    client: (key) =>
      new OpenAI({
        apiKey: key,
        baseURL: `${h.gw.url}/v1`,
        maxRetries: 0,
        fetch: (async (input: any, init: any) => {
          const res = await fetch(input, init)
          pending.push(res.clone().text().then((t) => void seen.push(t), () => undefined))
          return res
        }) as any
      }),
    rowOf: async (id) => {
      expect(id, "x-request-id").toMatch(/^\d+$/)
      await flushRequestLog(h.gw)
      const rows = await query(h.gw, "SELECT * FROM request_log WHERE id = $1", [Number(id)])
      expect(rows.length, `row ${id}`).toBe(1)
      return rows[0]!
    }
  }
  return h
}

const userMessage = [{ role: "user" as const, content: "hello" }]

describe.each(backends)("BYOK end to end on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  const h = harness()
  let fake: FakeOpenAi
  let anthropic: AnthropicProvider
  let db: FreshDatabase | undefined
  /** Every secret saved or tried in this block: none may appear in any output (the last test). */
  const secrets = new Set<string>()
  const anthropicKey = `sk-ant-canary-${hex()}${hex()}`
  secrets.add(anthropicKey)

  const save = async (key: string, secret: string, extra: Record<string, unknown> = {}) => {
    secrets.add(secret)
    const r = await h.call("POST", BASE, { key, body: { provider: "openai", secret, ...extra } })
    expect(r.status, r.text).toBe(200)
    return r.body.data.credential as { id: number; status: string }
  }
  const credentialOf = async (key: string, id: number) => {
    const l = await h.call("GET", BASE, { key })
    expect(l.status, l.text).toBe(200)
    return l.body.data.credentials.find((c: any) => c.id === id)
  }
  /**
   * The stored row of a credential (polled instead of the list endpoint, whose 15/min limit polling would hit; the
   * endpoint is read once the row shows the change).
   */
  const storedCredential = async (id: number) =>
    (await query(h.gw, "SELECT status, last_used_at FROM byok_credentials WHERE id = $1", [id]))[0]!
  const waitRejected = async (key: string, id: number) => {
    await eventually(async () => (await storedCredential(id)).status === "rejected", { what: "credential rejected" })
    const c = await credentialOf(key, id)
    expect(c.status).toBe("rejected")
    return c
  }
  const setFallback = async (key: string, id: number, model: string | null, enabled: boolean | null) => {
    const p = await h.call("PATCH", `${BASE}/${id}`, { key, body: { fallback_model_id: model } })
    expect(p.status, p.text).toBe(200)
    const f = await h.call("PUT", `${BASE}/fallback`, { key, body: { enabled } })
    expect(f.status, f.text).toBe(200)
  }
  const chatVia = (key: string, body: Record<string, unknown>) =>
    h.call("POST", "/v1/chat/completions", { key, body: { messages: userMessage, ...body } })
  /** The account's snapshot `used` of both pools and `/v1/usage` percentages. */
  const pools = async (key: string) => {
    const me = await h.call("GET", "/api/user/me", { key })
    expect(me.status, me.text).toBe(200)
    const usage = await h.call("GET", "/v1/usage", { key })
    expect(usage.status, usage.text).toBe(200)
    return {
      session: me.body.plan.session.used as number,
      weekly: me.body.plan.weekly.used as number,
      sessionPct: usage.body.session.used_pct as number,
      weeklyPct: usage.body.weekly.used_pct as number
    }
  }

  beforeAll(async () => {
    if (skip) return
    fake = await startFakeOpenAi()
    anthropic = await startAnthropic(anthropicKey)
    db = postgres ? await freshDatabase("byoke2e") : undefined
    h.gw = await startCapturingGateway({
      admission: layerFromConfig({ abuse: { burst: 1000, window_seconds: 10, cooldown_seconds: 60 } }),
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        doc.byok = {
          ...(postgres ? { enabled: true, encryption_key: Crypto.randomBytes(32).toString("hex") } : {}),
          providers: {
            openai: { base_url: `${fake.origin}/v1` },
            anthropic: { base_url: `${anthropic.origin}/v1` }
          }
        }
      }
    })
  })
  afterAll(async () => {
    await h.gw?.stop()
    await fake?.close()
    await anthropic?.close()
    await db?.drop()
  })

  // -------------------------------------------------------------------------------------------
  // 1. Anthropic

  describe("anthropic credential", () => {
    let user: Awaited<ReturnType<typeof newUser>>
    beforeAll(async () => {
      if (skip) return
      user = await newUser(h.gw)
      const r = await h.call("POST", BASE, { key: user.key, body: { provider: "anthropic", secret: anthropicKey } })
      expect(r.status, r.text).toBe(200)
      expect(r.body.data.credential).toMatchObject({ provider: "anthropic", auth_scheme: "x-api-key", is_primary: true })
      // The probe listed models with the key and the version header.
      expect(anthropic.listings.at(-1)).toMatchObject({ "x-api-key": anthropicKey, "anthropic-version": "2023-06-01" })
    })

    it.skipIf(skip)("non-stream text: x-api-key is the secret, anthropic-version sent, max_tokens 4096, usage", async () => {
      anthropic.fake.script(FakeBehaviour.message(FakeMessages.text("안녕, BYOK", { input_tokens: 21, output_tokens: 9 })))
      const { data, response } = await h.client(user.key).chat.completions.create({
        model: "@anthropic/claude-x",
        messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "hi" }]
      }).withResponse()
      expect(data.choices[0]!.message.content).toBe("안녕, BYOK")
      expect(data.choices[0]!.finish_reason).toBe("stop")
      expect(data.usage).toMatchObject({ prompt_tokens: 21, completion_tokens: 9, total_tokens: 30 })
      const sent = anthropic.fake.requests.at(-1)!
      expect(sent.path).toBe("/v1/messages")
      expect(sent.headers["x-api-key"]).toBe(anthropicKey)
      expect(sent.headers["anthropic-version"]).toBe("2023-06-01")
      expect(sent.headers.authorization).toBeUndefined()
      expect(sent.body).toMatchObject({
        model: "claude-x",
        max_tokens: 4096,
        system: "Be brief.",
        messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }]
      })
      const row = await h.rowOf(response.headers.get("x-request-id"))
      expect(row).toMatchObject({
        status: "success",
        byok: true,
        provider: "anthropic",
        fell_back: false,
        model_id: "@anthropic/claude-x",
        input_tokens: 21,
        output_tokens: 9,
        stream: false
      })
      expect(Number(row.weighted_cost)).toBe(0)
    })

    it.skipIf(skip)("stream text: deltas in order, usage in the last chunk, the client's max_tokens passed", async () => {
      anthropic.fake.script(FakeBehaviour.message(FakeMessages.text("스트림으로 온 답입니다.", { input_tokens: 12, output_tokens: 7 }), 3))
      const stream = await h.client(user.key).chat.completions.create({
        model: "@anthropic/claude-x",
        messages: [{ role: "user", content: "stream please" }],
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 300
      })
      let text = ""
      let usage: ChatCompletionChunk["usage"] | undefined
      let finish: string | null | undefined
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? ""
        finish = chunk.choices[0]?.finish_reason ?? finish
        if (chunk.usage) usage = chunk.usage
      }
      expect(text).toBe("스트림으로 온 답입니다.")
      expect(finish).toBe("stop")
      expect(usage).toMatchObject({ prompt_tokens: 12, completion_tokens: 7 })
      const sent = anthropic.fake.requests.at(-1)!
      expect(sent.body).toMatchObject({ model: "claude-x", max_tokens: 300, stream: true })
      expect(sent.headers["x-api-key"]).toBe(anthropicKey)
    })

    it.skipIf(skip)("a tool call, non-stream and stream: name, arguments, finish_reason tool_calls", async () => {
      const call = { id: "toolu_01A09q90qw90lq917835lq9", name: "get_weather", input: { city: "Seoul", unit: "c" } }
      anthropic.fake.script(FakeBehaviour.message(FakeMessages.toolUse([call])))
      const { data } = await h.client(user.key).chat.completions.create({
        model: "@anthropic/claude-x",
        messages: [{ role: "user", content: "weather in Seoul?" }],
        tools: [weatherTool]
      }).withResponse()
      const choice = data.choices[0]!
      expect(choice.finish_reason).toBe("tool_calls")
      expect(choice.message.tool_calls).toHaveLength(1)
      const tc = choice.message.tool_calls![0]! as any
      expect(tc.function.name).toBe("get_weather")
      expect(JSON.parse(tc.function.arguments)).toEqual({ city: "Seoul", unit: "c" })
      // The tool went to Anthropic in its own shape.
      expect(anthropic.fake.requests.at(-1)!.body.tools).toEqual([{
        name: "get_weather",
        description: "Current weather of a city",
        input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
      }])

      anthropic.fake.script(FakeBehaviour.message(FakeMessages.toolUse([call], "Let me check."), 4))
      const { data: stream, response } = await h.client(user.key).chat.completions.create({
        model: "@anthropic/claude-x",
        messages: [{ role: "user", content: "weather in Seoul?" }],
        tools: [weatherTool],
        stream: true,
        stream_options: { include_usage: true }
      }).withResponse()
      let text = ""
      let name = ""
      let args = ""
      let finish: string | null | undefined
      let usage: ChatCompletionChunk["usage"] | undefined
      for await (const chunk of stream) {
        const delta = chunk.choices[0]?.delta
        text += delta?.content ?? ""
        for (const t of delta?.tool_calls ?? []) {
          name += t.function?.name ?? ""
          args += t.function?.arguments ?? ""
        }
        finish = chunk.choices[0]?.finish_reason ?? finish
        if (chunk.usage) usage = chunk.usage
      }
      expect(text).toBe("Let me check.")
      expect(name).toBe("get_weather")
      expect(JSON.parse(args)).toEqual({ city: "Seoul", unit: "c" })
      expect(finish).toBe("tool_calls")
      expect(usage?.total_tokens).toBeGreaterThan(0)
      const row = await h.rowOf(response.headers.get("x-request-id"))
      expect(row).toMatchObject({ byok: true, provider: "anthropic", had_tools: true, stream: true, status: "success" })
    })

    it.skipIf(skip)("the model listing of the credential comes from the provider", async () => {
      const l = await h.call("GET", BASE, { key: user.key })
      const id = l.body.data.credentials[0].id
      const models = await h.call("GET", `${BASE}/${id}/models`, { key: user.key })
      expect(models.status, models.text).toBe(200)
      expect(models.body.data.models).toEqual([{ id: "claude-x", display_name: "Claude X" }])
    })
  })

  // -------------------------------------------------------------------------------------------
  // 2. Fallback matrix

  describe("fallback", () => {
    it.skipIf(skip)("stream: a failure before the first byte streams the pool model instead; row fell_back", async () => {
      const u = await newUser(h.gw)
      const secret = good("sfb")
      const c = await save(u.key, secret)
      await setFallback(u.key, c.id, "ws-lite", true)
      fake.fail.set(secret, 500)
      const before = fake.chatCalls()
      const { data: stream, response } = await h.client(u.key).chat.completions.create({
        model: "@openai/gpt-fake",
        messages: userMessage,
        stream: true
      }).withResponse()
      let text = ""
      const models = new Set<string>()
      for await (const chunk of stream) {
        models.add(chunk.model)
        text += chunk.choices[0]?.delta?.content ?? ""
      }
      expect(fake.chatCalls()).toBe(before + 1)
      expect(fake.requests.at(-1)!.body.stream).toBe(true)
      expect([...models]).toEqual(["ws-lite"])
      expect(text.length).toBeGreaterThan(0)
      const row = await h.rowOf(response.headers.get("x-request-id"))
      expect(row).toMatchObject({ status: "success", stream: true, byok: true, fell_back: true, provider: "openai", model_id: "ws-lite" })
      expect(Number(row.weighted_cost)).toBeGreaterThan(0)
    })

    it.skipIf(skip)("embeddings fall back to ws-embed", async () => {
      const u = await newUser(h.gw)
      const secret = good("efb")
      const c = await save(u.key, secret)
      await setFallback(u.key, c.id, "ws-embed", true)
      fake.fail.set(secret, 503)
      const { data, response } = await h.client(u.key).embeddings.create({
        model: "@openai/text-embed-fake",
        input: ["alpha", "beta"]
      }).withResponse()
      expect(data.model).toBe("ws-embed")
      expect(data.data).toHaveLength(2)
      expect(fake.requests.at(-1)!.path).toBe("/v1/embeddings")
      const row = await h.rowOf(response.headers.get("x-request-id"))
      expect(row).toMatchObject({ status: "success", byok: true, fell_back: true, provider: "openai", model_id: "ws-embed" })
    })

    it.skipIf(skip)("fallback switched off (override false): the BYOK error, no pool charge", async () => {
      const u = await newUser(h.gw)
      const secret = good("off")
      const c = await save(u.key, secret)
      await setFallback(u.key, c.id, "ws-lite", false)
      fake.fail.set(secret, 500)
      const before = await pools(u.key)
      const r = await chatVia(u.key, { model: "@openai/gpt-fake" })
      expect(r.status, r.text).toBe(500)
      expect(r.body.error.code).toBe("upstream_error")
      const row = await h.rowOf(r.headers.get("x-request-id"))
      expect(row).toMatchObject({ status: "error", byok: true, fell_back: false, provider: "openai", model_id: "@openai/gpt-fake" })
      expect(Number(row.weighted_cost)).toBe(0)
      const after = await pools(u.key)
      expect(after).toEqual(before)
      // The same request with fallback on is charged: the figures above can move.
      const on = await h.call("PUT", `${BASE}/fallback`, { key: u.key, body: { enabled: true } })
      expect(on.status).toBe(200)
      const ok = await chatVia(u.key, { model: "@openai/gpt-fake" })
      expect(ok.status, ok.text).toBe(200)
      expect(ok.body.model).toBe("ws-lite")
      expect((await pools(u.key)).session).toBeGreaterThan(before.session)
    })

    it.skipIf(skip)("a rejected credential with fallback on: the pool answers, the provider is not called", async () => {
      const u = await newUser(h.gw)
      const secret = good("rejfb")
      const c = await save(u.key, secret)
      await setFallback(u.key, c.id, "ws-lite", true)
      fake.revoked.add(secret)
      // The 401 rejects the credential; this request already falls back.
      const first = await chatVia(u.key, { model: "@openai/gpt-fake" })
      expect(first.status, first.text).toBe(200)
      expect(first.body.model).toBe("ws-lite")
      const rejected = await waitRejected(u.key, c.id)
      expect(rejected.last_error_code).toBe("auth_failed")
      const calls = fake.chatCalls()
      const { data, response } = await h.client(u.key).chat.completions.create({
        model: "@openai/gpt-fake",
        messages: userMessage
      }).withResponse()
      expect(data.model).toBe("ws-lite")
      expect(fake.chatCalls()).toBe(calls)
      const row = await h.rowOf(response.headers.get("x-request-id"))
      expect(row).toMatchObject({ status: "success", byok: true, fell_back: true, provider: "openai", model_id: "ws-lite" })
      // Embeddings through the rejected credential: the chat fallback cannot take them, the rejection is answered.
      const emb = await h.call("POST", "/v1/embeddings", { key: u.key, body: { model: "@openai/text-embed-fake", input: "x" } })
      expect(emb.status, emb.text).toBe(400)
      expect(emb.body.error.code).toBe("byok_credential_rejected")
      expect(fake.requests.filter((r) => r.headers.authorization === `Bearer ${secret}` && r.path.includes("embeddings"))).toHaveLength(0)
    })

    it.skipIf(skip)("a fallback model that cannot take the request: the original BYOK error, fell_back false", async () => {
      const u = await newUser(h.gw)
      const secret = good("cannot")
      const c = await save(u.key, secret)
      // ws-lite has no supports_tools (config/gateway.yaml) and is not an embeddings model.
      await setFallback(u.key, c.id, "ws-lite", true)
      fake.fail.set(secret, 500)
      const before = await pools(u.key)
      const tools = await chatVia(u.key, { model: "@openai/gpt-fake", tools: [weatherTool] })
      expect(tools.status, tools.text).toBe(500)
      expect(tools.body.error.code).toBe("upstream_error")
      // The provider did get the tools (the catalog's gates do not apply to BYOK).
      expect(fake.requests.at(-1)!.body.tools).toHaveLength(1)
      const row = await h.rowOf(tools.headers.get("x-request-id"))
      expect(row).toMatchObject({ status: "error", error_code: "upstream_error", byok: true, fell_back: false, model_id: "@openai/gpt-fake" })
      const emb = await h.call("POST", "/v1/embeddings", { key: u.key, body: { model: "@openai/text-embed-fake", input: "x" } })
      expect(emb.status, emb.text).toBe(500)
      expect(emb.body.error.code).toBe("upstream_error")
      const erow = await h.rowOf(emb.headers.get("x-request-id"))
      expect(erow).toMatchObject({ status: "error", byok: true, fell_back: false, model_id: "@openai/text-embed-fake" })
      expect(await pools(u.key)).toEqual(before)
      // Without tools the same credential does fall back (the failure above is the model's gate, not the setup).
      const plain = await chatVia(u.key, { model: "@openai/gpt-fake" })
      expect(plain.status, plain.text).toBe(200)
      expect(plain.body.model).toBe("ws-lite")
    })
  })

  // -------------------------------------------------------------------------------------------
  // 3. Re-verification

  it.skipIf(skip)("a rejected credential listed successfully turns active, and routing works again", async () => {
    const u = await newUser(h.gw)
    const secret = good("reverify")
    const c = await save(u.key, secret)
    // A listing while active (cached by the gateway for a minute).
    const listed = await h.call("GET", `${BASE}/${c.id}/models`, { key: u.key })
    expect(listed.status, listed.text).toBe(200)
    fake.revoked.add(secret)
    const r = await chatVia(u.key, { model: "@openai/gpt-fake" })
    expect(r.body.error.code).toBe("byok_credential_rejected")
    await waitRejected(u.key, c.id)
    const calls = fake.chatCalls()
    const refused = await chatVia(u.key, { model: "@openai/gpt-fake" })
    expect(refused.body.error.code).toBe("byok_credential_rejected")
    expect(fake.chatCalls()).toBe(calls)
    // The key works again at the provider; the listing asks the provider (a cached list proves nothing).
    fake.revoked.delete(secret)
    const listings = fake.requests.filter((x) => x.path.includes("/models")).length
    const models = await h.call("GET", `${BASE}/${c.id}/models`, { key: u.key })
    expect(models.status, models.text).toBe(200)
    expect(models.body.data.cached).toBe(false)
    expect(fake.requests.filter((x) => x.path.includes("/models")).length).toBe(listings + 1)
    const now = await credentialOf(u.key, c.id)
    expect(now).toMatchObject({ status: "active", last_error_code: null })
    const ok = await h.client(u.key).chat.completions.create({ model: "@openai/gpt-fake", messages: userMessage })
    expect(ok.choices[0]!.message.content).toBe("echo:gpt-fake")
    expect(fake.chatCalls()).toBe(calls + 1)
  })

  // -------------------------------------------------------------------------------------------
  // 5. Gates (BYOK on here; the "off" gate is below)

  it.skipIf(skip)("a guest is refused with the guest message, before any credential or provider", async () => {
    const u = await newUser(h.gw, { isGuest: true, guestExpiresAt: new Date(Date.now() + 86_400_000) })
    // A pool request works for the guest: the refusal below is the BYOK gate.
    const pool = await chatVia(u.key, { model: "ws-lite" })
    expect(pool.status, pool.text).toBe(200)
    const calls = fake.requests.length
    for (const path of ["/v1/chat/completions", "/v1/embeddings"]) {
      const r = await h.call("POST", path, {
        key: u.key,
        body: path.includes("chat") ? { model: "@openai/gpt-fake", messages: userMessage } : { model: "@openai/x", input: "x" }
      })
      expect(r.status, r.text).toBe(403)
      expect(r.body.error.code).toBe("byok_disabled")
      expect(r.body.error.message).toBe(AccountMessages.byokGuest)
    }
    expect(fake.requests.length).toBe(calls)
  })

  // -------------------------------------------------------------------------------------------
  // 6. Metrics

  it.skipIf(skip)("metrics: the byok block counts success, error and fell back per provider; zeros without traffic", async () => {
    const u = await newUser(h.gw)
    const empty = await h.call("GET", "/api/user/me/metrics", { key: u.key })
    expect(empty.status, empty.text).toBe(200)
    expect(empty.body.byok).toMatchObject({ requests: 0, success: 0, errors: 0, fell_back: 0, by_provider: [] })
    for (const [k, v] of Object.entries(empty.body.byok)) if (k !== "by_provider") expect(v, k).toBe(0)

    const secret = good("metrics")
    const c = await save(u.key, secret)
    const ok = await chatVia(u.key, { model: "@openai/gpt-fake" })
    expect(ok.status, ok.text).toBe(200)
    fake.fail.set(secret, 500)
    const err = await chatVia(u.key, { model: "@openai/gpt-fake" })
    expect(err.status, err.text).toBe(500)
    await setFallback(u.key, c.id, "ws-lite", true)
    const fb = await chatVia(u.key, { model: "@openai/gpt-fake" })
    expect(fb.status, fb.text).toBe(200)
    expect(fb.body.model).toBe("ws-lite")
    // And one pool request, not BYOK.
    expect((await chatVia(u.key, { model: "ws-lite" })).status).toBe(200)
    await flushRequestLog(h.gw)

    const m = await h.call("GET", "/api/user/me/metrics", { key: u.key })
    expect(m.status, m.text).toBe(200)
    expect(m.body.totals).toMatchObject({ requests: 4, success: 3, errors: 1 })
    expect(m.body.byok).toMatchObject({ requests: 3, success: 2, errors: 1, fell_back: 1 })
    // The fake reports 11 + 3 tokens for the direct answer; the fell-back answer adds the pool's.
    expect(m.body.byok.input_tokens).toBeGreaterThanOrEqual(11)
    expect(m.body.byok.output_tokens).toBeGreaterThanOrEqual(3)
    expect(m.body.byok.by_provider).toHaveLength(1)
    expect(m.body.byok.by_provider[0]).toMatchObject({ provider: "openai", requests: 3, success: 2, errors: 1 })
  })

  // -------------------------------------------------------------------------------------------
  // 7. last_used_at

  it.skipIf(skip)("a BYOK request stamps the credential's last_used_at (batched, within seconds)", async () => {
    const u = await newUser(h.gw)
    const c = await save(u.key, good("used"))
    expect((await credentialOf(u.key, c.id)).last_used_at).toBeNull()
    const started = Date.now()
    const ok = await chatVia(u.key, { model: "@openai/gpt-fake" })
    expect(ok.status, ok.text).toBe(200)
    await eventually(async () => (await storedCredential(c.id)).last_used_at !== null, { what: "last_used_at stamped" })
    const stamped = await credentialOf(u.key, c.id)
    expect(stamped.last_used_at).not.toBeNull()
    const at = Date.parse(stamped.last_used_at)
    expect(at).toBeGreaterThanOrEqual(started - 1000)
    expect(at).toBeLessThanOrEqual(Date.now() + 1000)
  })

  // -------------------------------------------------------------------------------------------
  // 8. Canary (last: it checks everything this block did)

  it.skipIf(skip)("canary: no secret appears in responses, logs, request rows, audit rows", async () => {
    const u = await newUser(h.gw)
    // Probe failures: the fake's 401 echoes the key.
    for (const path of [`${BASE}/verify`, BASE]) {
      const bad = `sk-bad-canary-${hex()}${hex()}`
      secrets.add(bad)
      const r = await h.call("POST", path, { key: u.key, body: { provider: "openai", secret: bad } })
      expect(r.text).not.toContain(bad)
    }
    const echoed500 = good("canary500")
    const c500 = await save(u.key, echoed500)
    const echoed401 = good("canary401")
    await save(u.key, echoed401, { label: "other" })
    // 500s that echo the key: chat, stream, embeddings; then the same with fallback (rows keep the BYOK detail).
    fake.fail.set(echoed500, 500)
    const chat = await chatVia(u.key, { model: "@openai/gpt-fake" })
    expect(chat.status).toBe(500)
    const stream = await chatVia(u.key, { model: "@openai/gpt-fake", stream: true })
    expect(stream.status).toBe(500)
    const emb = await h.call("POST", "/v1/embeddings", { key: u.key, body: { model: "@openai/e", input: "x" } })
    expect(emb.status).toBe(500)
    await setFallback(u.key, c500.id, "ws-lite", true)
    expect((await chatVia(u.key, { model: "@openai/gpt-fake" })).status).toBe(200)
    // A 401 that echoes the key: rejected, answered as such.
    fake.revoked.add(echoed401)
    const rejected = await chatVia(u.key, { model: "@openai:other/gpt-fake", stream: true })
    expect(rejected.status).toBe(400)
    expect(rejected.body.error.code).toBe("byok_credential_rejected")
    expect(fake.requests.some((r) => r.headers.authorization === `Bearer ${echoed401}`)).toBe(true)

    // Anthropic: a 500 and a 401 whose messages carry the key.
    const a = await newUser(h.gw)
    const saved = await h.call("POST", BASE, { key: a.key, body: { provider: "anthropic", secret: anthropicKey } })
    expect(saved.status, saved.text).toBe(200)
    anthropic.fake.script(FakeBehaviour.error(500, "api_error", `Internal error for key ${anthropicKey}`))
    const a500 = await chatVia(a.key, { model: "@anthropic/claude-x" })
    expect(a500.status, a500.text).toBe(500)
    anthropic.fake.script(FakeBehaviour.error(401, "authentication_error", `invalid x-api-key: ${anthropicKey}`))
    const a401 = await chatVia(a.key, { model: "@anthropic/claude-x", stream: true })
    expect(a401.status, a401.text).toBe(400)
    expect(a401.body.error.code).toBe("byok_credential_rejected")
    anthropic.fake.script(FakeBehaviour.message(FakeMessages.text("ok")))
    const aId = saved.body.data.credential.id
    await waitRejected(a.key, aId)
    const otherId = (await h.call("GET", BASE, { key: u.key })).body.data.credentials.find((x: any) => x.label === "other").id
    await waitRejected(u.key, otherId)
    // The providers did see the keys (the test would prove nothing otherwise).
    expect(anthropic.fake.requests.some((r) => r.headers["x-api-key"] === anthropicKey)).toBe(true)
    expect(fake.requests.some((r) => r.headers.authorization === `Bearer ${echoed500}`)).toBe(true)

    await Promise.all(h.pending)
    await flushRequestLog(h.gw)
    const rows = await query(h.gw, "SELECT r::text AS t FROM request_log r")
    const audits = await query(h.gw, "SELECT a::text AS t FROM audit_log a")
    const credentials = await query(h.gw, "SELECT c::text AS t FROM byok_credentials c")
    expect(rows.length).toBeGreaterThanOrEqual(7)
    expect(audits.length).toBeGreaterThanOrEqual(3)
    expect(credentials.length).toBeGreaterThanOrEqual(3)
    const places: Record<string, string> = {
      logs: h.gw.logs.join("\n"),
      responses: h.seen.join("\n"),
      request_log: rows.map((r) => r.t).join("\n"),
      audit_log: audits.map((r) => r.t).join("\n"),
      byok_credentials: credentials.map((r) => r.t).join("\n")
    }
    expect(places.responses.length).toBeGreaterThan(500)
    // The upstream messages did reach the rows and logs, with the key removed.
    expect(places.request_log + places.logs).toContain("[redacted]")
    expect(secrets.size).toBeGreaterThanOrEqual(5)
    for (const secret of secrets) {
      for (const [where, text] of Object.entries(places)) {
        expect(text.includes(secret), `${secret} in ${where}`).toBe(false)
      }
    }
  })
})

// ---------------------------------------------------------------------------------------------
// Operator settings: `rate_limit_rpm: 2`, `fallback_default_on: true`; `gemini` also points at the fake (a second
// provider, a second RPM window).

describe.each(backends)("BYOK operator settings on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  const h = harness()
  let fake: FakeOpenAi
  let db: FreshDatabase | undefined

  beforeAll(async () => {
    if (skip) return
    fake = await startFakeOpenAi()
    db = postgres ? await freshDatabase("byokops") : undefined
    h.gw = await startCapturingGateway({
      admission: layerFromConfig({ abuse: { burst: 1000, window_seconds: 10, cooldown_seconds: 60 } }),
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        doc.byok = {
          ...(postgres ? { enabled: true, encryption_key: Crypto.randomBytes(32).toString("hex") } : {}),
          rate_limit_rpm: 2,
          fallback_default_on: true,
          providers: { openai: { base_url: `${fake.origin}/v1` }, gemini: { base_url: `${fake.origin}/gemini` } }
        }
      }
    })
  })
  afterAll(async () => {
    await h.gw?.stop()
    await fake?.close()
    await db?.drop()
  })

  const save = async (key: string, provider: string, secret: string) => {
    const r = await h.call("POST", BASE, { key, body: { provider, secret } })
    expect(r.status, r.text).toBe(200)
    return r.body.data.credential as { id: number }
  }
  const chatVia = (key: string, model: string) =>
    h.call("POST", "/v1/chat/completions", { key, body: { model, messages: userMessage } })
  const usageOf = async (key: string) => {
    const me = await h.call("GET", "/api/user/me", { key })
    const usage = await h.call("GET", "/v1/usage", { key })
    expect(me.status, me.text).toBe(200)
    expect(usage.status, usage.text).toBe(200)
    return {
      session: me.body.plan.session.used,
      weekly: me.body.plan.weekly.used,
      sessionPct: usage.body.session.used_pct,
      weeklyPct: usage.body.weekly.used_pct
    }
  }

  it.skipIf(skip)("RPM per provider: the third request in the minute is 429; pools untouched; other windows open", async () => {
    const u = await newUser(h.gw)
    await save(u.key, "openai", good("rpm"))
    await save(u.key, "gemini", good("rpm-gemini"))
    const before = await usageOf(u.key)
    expect((await chatVia(u.key, "@openai/gpt-fake")).status).toBe(200)
    const emb = await h.call("POST", "/v1/embeddings", { key: u.key, body: { model: "@openai/text-embed-fake", input: "x" } })
    expect(emb.status, emb.text).toBe(200)
    const calls = fake.requests.length
    const third = await chatVia(u.key, "@openai/gpt-fake")
    expect(third.status, third.text).toBe(429)
    expect(third.body.error.code).toBe("rate_limited")
    expect(fake.requests.length).toBe(calls)
    // Another provider is another window.
    const gemini = await chatVia(u.key, "@gemini/gpt-fake")
    expect(gemini.status, gemini.text).toBe(200)
    expect(fake.requests.at(-1)!.path).toBe("/gemini/chat/completions")
    // BYOK requests left the pools as they were.
    expect(await usageOf(u.key)).toEqual(before)
    // A pool request is not in the BYOK window, and it is charged.
    const pool = await chatVia(u.key, "ws-lite")
    expect(pool.status, pool.text).toBe(200)
    const after = await usageOf(u.key)
    expect(after.session).toBeGreaterThan(before.session)
    expect(after.weekly).toBeGreaterThan(before.weekly)
    // Another account has its own window.
    const other = await newUser(h.gw)
    await save(other.key, "openai", good("rpm-other"))
    expect((await chatVia(other.key, "@openai/gpt-fake")).status).toBe(200)
  })

  it.skipIf(skip)("operator default fallback on, override null: a failed dispatch falls back", async () => {
    const u = await newUser(h.gw)
    const secret = good("default-on")
    const c = await save(u.key, "openai", secret)
    const p = await h.call("PATCH", `${BASE}/${c.id}`, { key: u.key, body: { fallback_model_id: "ws-lite" } })
    expect(p.status, p.text).toBe(200)
    const listed = await h.call("GET", BASE, { key: u.key })
    expect(listed.body.data).toMatchObject({ fallback_default_on: true, fallback_override: null, fallback_enabled: true })
    fake.fail.set(secret, 500)
    const r = await chatVia(u.key, "@openai/gpt-fake")
    expect(r.status, r.text).toBe(200)
    expect(r.body.model).toBe("ws-lite")
    await flushRequestLog(h.gw)
    const rows = await query(h.gw, "SELECT * FROM request_log WHERE id = $1", [Number(r.headers.get("x-request-id"))])
    expect(rows[0]).toMatchObject({ byok: true, fell_back: true, provider: "openai", model_id: "ws-lite" })
    // The account's own "off" wins over the operator's default.
    expect((await h.call("PUT", `${BASE}/fallback`, { key: u.key, body: { enabled: false } })).status).toBe(200)
    const off = await chatVia(u.key, "@openai/gpt-fake")
    expect(off.status, off.text).toBe(500)
    expect(off.body.error.code).toBe("upstream_error")
  })
})

// ---------------------------------------------------------------------------------------------
// BYOK off: embedded with `enabled: false`; PostgreSQL (production) with `enabled: true` but no encryption key.

describe.each(backends)("BYOK off on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  const h = harness()
  let fake: FakeOpenAi
  let db: FreshDatabase | undefined

  beforeAll(async () => {
    if (skip) return
    fake = await startFakeOpenAi()
    db = postgres ? await freshDatabase("byokoff") : undefined
    h.gw = await startCapturingGateway({
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        doc.byok = {
          ...(postgres ? { enabled: true } : { enabled: false }),
          providers: { openai: { base_url: `${fake.origin}/v1` } }
        }
      }
    })
  })
  afterAll(async () => {
    await h.gw?.stop()
    await fake?.close()
    await db?.drop()
  })

  it.skipIf(skip)("`@...` chat and embeddings: 403 byok_disabled (off message); a guest gets the guest message", async () => {
    const u = await newUser(h.gw)
    const guest = await newUser(h.gw, { isGuest: true, guestExpiresAt: new Date(Date.now() + 86_400_000) })
    const off = await h.call("POST", "/v1/chat/completions", { key: u.key, body: { model: "@openai/gpt-fake", messages: userMessage } })
    expect(off.status, off.text).toBe(403)
    expect(off.body.error.code).toBe("byok_disabled")
    expect(off.body.error.message).toBe(AccountMessages.byokOff)
    const offEmb = await h.call("POST", "/v1/embeddings", { key: u.key, body: { model: "@openai:work/e", input: "x" } })
    expect(offEmb.status, offEmb.text).toBe(403)
    expect(offEmb.body.error.code).toBe("byok_disabled")
    const g = await h.call("POST", "/v1/chat/completions", { key: guest.key, body: { model: "@openai/gpt-fake", messages: userMessage } })
    expect(g.status, g.text).toBe(403)
    expect(g.body.error.code).toBe("byok_disabled")
    expect(g.body.error.message).toBe(AccountMessages.byokGuest)
    expect(g.body.error.message).not.toBe(off.body.error.message)
    // The account API says the same.
    const list = await h.call("GET", BASE, { key: u.key })
    expect(list.status).toBe(403)
    expect(list.body.error.code).toBe("byok_disabled")
    // Pool models are unaffected; the provider never heard of any of this.
    expect((await h.call("POST", "/v1/chat/completions", { key: u.key, body: { model: "ws-lite", messages: userMessage } })).status).toBe(200)
    expect(fake.requests).toHaveLength(0)
    if (postgres) expect(h.gw.logs.join("\n")).toContain("no_encryption_key")
  })
})
