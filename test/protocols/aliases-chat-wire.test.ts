/**
 * Model aliases (issue 20 point 4) on every API and through a live reload; the cached-input quota weight; and the
 * chat wire as today's SDKs send it (point 6): max_completion_tokens, n, ignored fields, models.retrieve, a path
 * without /v1. Also that the seam kept the chat answer's shape (no ignored-fields header on a plain request).
 */
import Anthropic from "@anthropic-ai/sdk"
import { Effect } from "effect"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { decodeCatalog } from "../../src/config/GatewayConfig.js"
import { LiveCatalog } from "../../src/config/Live.js"
import { weightedCost } from "../../src/quota/Policy.js"
import type { ModelConfig } from "../../src/config/GatewayConfig.js"
import { defaultConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { addMockModel, expectError, HANGUL, postChat, rowById, rowIdOf, user } from "../inference/helpers.js"

const LiveReload = Effect.gen(function*() {
  const catalog = yield* LiveCatalog
  return yield* catalog.reload
})

describe("aliases and the chat wire", () => {
  let gw: TestGateway
  let mock: MockUpstream
  let openai: OpenAI

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({
      configure: (doc) => {
        addMockModel(doc, { baseUrl: mock.url })
        doc.catalog.aliases = { "claude-sonnet-4-5": "ws-pro", "gpt-mock": "ws-mock", "text-embedding-3-small": "ws-embed" }
      }
    })
    openai = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.key, maxRetries: 0 })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  describe("aliases", () => {
    it("an alias serves its model on /v1/messages; the answer and the row name the catalog model", async () => {
      const client = new Anthropic({ baseURL: gw.url, apiKey: gw.key, maxRetries: 0 })
      const { data, response } = await client.messages
        .create({ model: "claude-sonnet-4-5", max_tokens: 50, messages: [{ role: "user", content: "hi" }] })
        .withResponse()
      expect(data.model).toBe("ws-pro")
      const row = await rowById(gw, Number(response.headers.get("x-request-id")))
      expect(row.model_id).toBe("ws-pro")
    })

    it("an alias works on chat completions too, and reaches the upstream as the target's upstream model", async () => {
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop")]))
      const before = mock.requests.length
      const completion = await openai.chat.completions.create({ model: "gpt-mock", messages: [{ role: "user", content: "x" }] })
      expect(completion.model).toBe("ws-mock")
      expect(mock.requests[before]!.body.model).toBe("mock-model")
    })

    it("an alias works on embeddings; the answer names the catalog model", async () => {
      const embedded = await openai.embeddings.create({ model: "text-embedding-3-small", input: "hello" })
      expect(embedded.model).toBe("ws-embed")
      expect(embedded.data[0]!.embedding).toHaveLength(1024)
    })

    it("aliases are never listed, and models.retrieve of an alias is 404", async () => {
      const ids = (await openai.models.list()).data.map((m) => m.id)
      expect(ids).toContain("ws-pro")
      expect(ids).not.toContain("claude-sonnet-4-5")
      const error = await openai.models.retrieve("claude-sonnet-4-5").catch((e) => e)
      expect(error).toBeInstanceOf(OpenAI.NotFoundError)
    })

    it("a live reload adds and removes aliases; an alias naming an unknown model is rejected (the old catalog stays)", async () => {
      gw.rewriteConfig((doc) => {
        doc.catalog.aliases = { "claude-haiku-4-5": "ws-lite" }
      })
      // Reloaded now rather than polled with requests (each refused one counts toward the failed-request limit).
      expect(await gw.run(LiveReload)).toBe(true)
      const res = await postChat(gw, { model: "claude-haiku-4-5", messages: [user("x")] })
      expect(res.status).toBe(200)
      expect(((await res.json()) as any).model).toBe("ws-lite")
      const gone = await postChat(gw, { model: "claude-sonnet-4-5", messages: [user("x")] })
      await expectError(gone, 400, "model_not_found")

      gw.rewriteConfig((doc) => {
        doc.catalog.aliases = { "claude-haiku-4-5": "no-such-model" }
      })
      // The invalid file is rejected; the previous aliases keep working.
      const ok = await gw.run(LiveReload)
      expect(ok).toBe(false)
      const still = await postChat(gw, { model: "claude-haiku-4-5", messages: [user("x")] })
      expect(still.status).toBe(200)
    })
  })

  describe("alias validation", () => {
    const catalogWith = (aliases: Record<string, string>) => {
      const doc = defaultConfigDoc()
      doc.catalog.aliases = aliases
      return doc
    }
    it("accepts aliases to catalog models; rejects an unknown target and an alias that is a model id", () => {
      expect(decodeCatalog(catalogWith({ "claude-opus-4-1": "ws-pro" }), "t").aliases).toEqual({ "claude-opus-4-1": "ws-pro" })
      expect(() => decodeCatalog(catalogWith({ "claude-x": "nope" }), "t")).toThrow(/unknown model nope/)
      expect(() => decodeCatalog(catalogWith({ "ws-lite": "ws-pro" }), "t")).toThrow(/is a model id/)
      expect(() => decodeCatalog(catalogWith({ "bad alias!": "ws-pro" }), "t")).toThrow()
    })
    it("no aliases section means none", () => {
      expect(decodeCatalog(defaultConfigDoc(), "t").aliases).toEqual({})
    })
  })

  describe("cached-input weight", () => {
    const model = (cached?: number) =>
      ({ weights: { input: 2, output: 8, ...(cached !== undefined ? { cached_input: cached } : {}) } }) as unknown as ModelConfig

    it("cached tokens are weighted by cached_input, the rest of the input by input", () => {
      expect(weightedCost(model(0.5), { inputTokens: 100, cachedInputTokens: 40, outputTokens: 10 })).toBe(60 * 2 + 40 * 0.5 + 80)
    })
    it("without cached_input they cost what input costs (the old charge)", () => {
      expect(weightedCost(model(), { inputTokens: 100, cachedInputTokens: 40, outputTokens: 10 })).toBe(100 * 2 + 80)
      expect(weightedCost(model(0.5), { inputTokens: 100, outputTokens: 10 })).toBe(100 * 2 + 80)
    })
    it("a cached count above the input is clamped to it", () => {
      expect(weightedCost(model(0), { inputTokens: 10, cachedInputTokens: 50, outputTokens: 0 })).toBe(0)
    })
  })

  describe("the chat wire", () => {
    it("max_completion_tokens caps the output as max_tokens does; with both the smaller wins", async () => {
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop")]))
      const before = mock.requests.length
      await openai.chat.completions.create({ model: "ws-mock", max_completion_tokens: 77, messages: [{ role: "user", content: "x" }] })
      await openai.chat.completions.create({
        model: "ws-mock",
        max_tokens: 300,
        max_completion_tokens: 40,
        messages: [{ role: "user", content: "x" }]
      })
      await openai.chat.completions.create({
        model: "ws-mock",
        max_tokens: 30,
        max_completion_tokens: 400,
        messages: [{ role: "user", content: "x" }]
      })
      // Clamped to the model's max_output_tokens (512) as max_tokens is.
      await openai.chat.completions.create({ model: "ws-mock", max_completion_tokens: 9_999, messages: [{ role: "user", content: "x" }] })
      expect(mock.requests.slice(before).map((r) => r.body.max_tokens)).toEqual([77, 40, 30, 512])
      expect(mock.requests.slice(before).map((r) => r.body.max_completion_tokens)).toEqual([undefined, undefined, undefined, undefined])
    })

    it("the simulated model stops at max_completion_tokens (finish length)", async () => {
      const completion = await openai.chat.completions.create({
        model: "ws-pro",
        max_completion_tokens: 3,
        messages: [{ role: "user", content: "tell me a long story about the sea" }]
      })
      expect(completion.choices[0]!.finish_reason).toBe("length")
      expect(completion.usage!.completion_tokens).toBeLessThanOrEqual(3)
    })

    it("n other than 1 is a 400 with a Korean message; n: 1 is fine", async () => {
      const res = await postChat(gw, { model: "ws-pro", n: 2, messages: [user("x")] })
      const body = await expectError(res, 400, "invalid_request")
      expect(body.error.message).toContain("n 은 1만")
      const one = await postChat(gw, { model: "ws-pro", n: 1, messages: [user("x")] })
      expect(one.status).toBe(200)
      expect(one.headers.get("x-wellspring-ignored-fields")).toBeNull()
    })

    it("dropped fields are named in x-wellspring-ignored-fields, bounded and sanitized; none on a plain request", async () => {
      const plain = await postChat(gw, { model: "ws-pro", messages: [user("x")] })
      expect(plain.headers.get("x-wellspring-ignored-fields")).toBeNull()
      const res = await postChat(gw, {
        model: "ws-pro",
        messages: [user("x")],
        seed: 1,
        response_format: { type: "json_object" },
        "x\u0000<script>": true
      })
      expect(res.status).toBe(200)
      expect(res.headers.get("x-wellspring-ignored-fields")).toBe("seed, response_format, (unnamed)")
      const many: Record<string, unknown> = { model: "ws-pro", messages: [user("x")] }
      for (let i = 0; i < 40; i++) many[`field_${i}`] = i
      const bounded = await postChat(gw, many)
      expect(bounded.headers.get("x-wellspring-ignored-fields")!.split(", ")).toHaveLength(16)
      // A stream carries it too.
      const stream = await postChat(gw, { model: "ws-pro", stream: true, user: "u1", messages: [user("x")] })
      expect(stream.headers.get("x-wellspring-ignored-fields")).toBe("user")
      await stream.text()
    })

    it("GET /v1/models/{id}: the model's entry (SDK models.retrieve); 404 model_not_found otherwise, also for a disabled model", async () => {
      const model = await openai.models.retrieve("ws-pro")
      expect(model).toMatchObject({ id: "ws-pro", object: "model", supports_tools: true })
      for (const id of ["nope", "ws-legacy"]) {
        const res = await fetch(`${gw.url}/v1/models/${id}`, { headers: { authorization: `Bearer ${gw.key}` } })
        await expectError(res, 404, "model_not_found", "not_found_error")
      }
      const unauthorized = await fetch(`${gw.url}/v1/models/ws-pro`)
      expect(unauthorized.status).toBe(401)
    })

    it("a known path without /v1 is a 404 whose message says to use /v1", async () => {
      for (const [path, expected] of [
        ["/chat/completions", "/v1/chat/completions"],
        ["/messages", "/v1/messages"],
        ["/models/ws-pro", "/v1/models"]
      ] as const) {
        const res = await fetch(`${gw.url}${path}`, { method: path.startsWith("/models") ? "GET" : "POST" })
        const body = await expectError(res, 404, "not_found", "not_found_error")
        expect(body.error.message).toContain(expected)
        expect(body.error.message).toMatch(HANGUL)
      }
      const other = await fetch(`${gw.url}/nothing-here`)
      const body = await expectError(other, 404, "not_found", "not_found_error")
      expect(body.error.message).not.toContain("/v1")
    })

    it("the seam kept chat's answer: a plain completion's shape and row", async () => {
      const res = await postChat(gw, { model: "ws-pro", messages: [user("hello")] })
      expect(res.status).toBe(200)
      const body = (await res.json()) as any
      expect(Object.keys(body)).toEqual(["id", "object", "created", "model", "choices", "usage", "wellspring"])
      expect(body.object).toBe("chat.completion")
      const row = await rowById(gw, rowIdOf(res))
      expect((row as any).api).toBe("chat")
    })
  })
})
