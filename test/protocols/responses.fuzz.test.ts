/**
 * Property-based fuzzing of the Responses wire: generated bodies (wrong types, NUL and lone surrogates, unknown
 * item and tool types, huge and nested values) through the decoder (it answers a 400 in Korean or a request,
 * never throws, never repeats a long client string) and through a running gateway (no 5xx, small JSON errors),
 * whose stored responses of such text are then written to the database without a rejected row.
 */
import { Effect, Result, Schema } from "effect"
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { LimitsConfig } from "../../src/config/GatewayConfig.js"
import { BUILT_IN_TOOLS, decodeResponsesRequest, UNSUPPORTED_ITEMS } from "../../src/protocols/responses/Request.js"
import { ResponseStore } from "../../src/protocols/responses/Store.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"

const limits = Schema.decodeSync(LimitsConfig)({})
const HANGUL = /[\uac00-\ud7a3]/

const nasty = fc.constantFrom("", "\u0000", "x\u0000y", "\ud800", "a\udfffb", "\u202e\u200b", "__proto__", "constructor",
  "'; DROP TABLE stored_responses; --", "@openai/gpt-x", "resp_", "call_")
const text = fc.oneof(
  { weight: 4, arbitrary: fc.string({ maxLength: 30 }) },
  { weight: 2, arbitrary: fc.string({ unit: "binary", maxLength: 30 }) },
  { weight: 3, arbitrary: nasty }
)
const number = fc.oneof(fc.double(), fc.integer(), fc.constantFrom(0, -1, 2.5, 1e308, 2 ** 53, 16))
const scalar = fc.oneof(text, number, fc.boolean(), fc.constant(null))
const value: fc.Arbitrary<unknown> = fc.letrec<{ v: unknown }>((tie) => ({
  v: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    scalar,
    fc.array(tie("v"), { maxLength: 3 }),
    fc.dictionary(fc.oneof(fc.string({ maxLength: 10 }), nasty), tie("v"), { maxKeys: 3 })
  )
})).v

const part = fc.oneof(
  fc.record({ type: fc.constantFrom("input_text", "output_text"), text }),
  fc.record({ type: fc.constant("input_image"), image_url: fc.oneof(text, fc.constant("https://x.test/a.png")), detail: value },
    { requiredKeys: ["type"] }),
  fc.record({ type: fc.constantFrom("input_file", "refusal", "nope"), file_id: text, refusal: text }, { requiredKeys: ["type"] }),
  value
)
const item = fc.oneof(
  fc.record({
    type: fc.option(fc.constant("message"), { nil: undefined }),
    role: fc.oneof(fc.constantFrom("user", "system", "developer", "assistant", "tool"), text),
    content: fc.oneof(text, fc.array(part, { maxLength: 3 }), value)
  }, { requiredKeys: ["role"] }),
  fc.record({ type: fc.constant("function_call"), call_id: text, name: text, arguments: fc.oneof(text, value) }),
  fc.record({ type: fc.constant("function_call_output"), call_id: text, output: fc.oneof(text, fc.array(part, { maxLength: 2 }), value) }),
  fc.record({
    type: fc.constant("reasoning"),
    summary: fc.oneof(fc.array(fc.record({ type: fc.constant("summary_text"), text }), { maxLength: 2 }), value),
    content: value
  }, { requiredKeys: ["type"] }),
  fc.record({ type: fc.oneof(fc.constantFrom("item_reference", "web_search_call", "compaction"), text), id: text }),
  value
)
const tool = fc.oneof(
  fc.record({ type: fc.constant("function"), name: fc.oneof(fc.constantFrom("f", "get_weather"), text), parameters: value, strict: value },
    { requiredKeys: ["type", "name"] }),
  fc.record({ type: fc.oneof(fc.constantFrom("web_search", "file_search", "code_interpreter", "mcp", "custom"), text) }),
  value
)
const body = fc.record({
  model: fc.oneof(fc.constantFrom("ws-pro", "ws-lite", "ws-embed"), text, value),
  input: fc.oneof(text, fc.array(item, { maxLength: 5 }), value),
  instructions: fc.oneof(text, value),
  tools: fc.oneof(fc.array(tool, { maxLength: 3 }), value),
  tool_choice: fc.oneof(fc.constantFrom("auto", "none", "required"), fc.record({ type: text, name: text }), value),
  parallel_tool_calls: value,
  max_output_tokens: fc.oneof(number, value),
  temperature: fc.oneof(number, value),
  top_p: fc.oneof(number, value),
  reasoning: fc.oneof(fc.record({ effort: fc.oneof(fc.constantFrom("low", "medium", "xhigh"), text) }), value),
  store: value,
  previous_response_id: fc.oneof(text, value),
  metadata: value,
  text: value,
  include: value,
  unknown_field: value
}, { requiredKeys: [] })

const longestRun = (body: unknown): Array<string> => {
  const strings: Array<string> = []
  const walk = (v: unknown) => {
    if (typeof v === "string" && v.length >= 12) strings.push(v)
    else if (Array.isArray(v)) v.forEach(walk)
    else if (typeof v === "object" && v !== null) {
      for (const [k, x] of Object.entries(v)) {
        if (k.length >= 12) strings.push(k)
        walk(x)
      }
    }
  }
  walk(body)
  return strings
}

describe("Responses wire fuzz", () => {
  it("the decoder never throws; refusals are 400 in Korean and never repeat a client string", () => {
    fc.assert(
      fc.property(body, (b) => {
        const result = decodeResponsesRequest(b, limits)
        if (Result.isSuccess(result)) return
        const error = result.failure
        expect(error.status).toBe(400)
        expect(error.userMessage).toMatch(HANGUL)
        // Only the fixed names of built-in tools and unsupported items are ever repeated (and field names,
        // which a generated key may happen to spell).
        for (const s of longestRun(b)) {
          if (BUILT_IN_TOOLS.has(s) || UNSUPPORTED_ITEMS.has(s) || /^[a-z_.]+$/.test(s)) continue
          expect(error.userMessage.includes(s), s).toBe(false)
        }
      }),
      { numRuns: 3_000 }
    )
  })

  describe("through the gateway", () => {
    let gw: TestGateway
    beforeAll(async () => {
      gw = await startGateway({
        configure: (doc) => {
          doc.abuse = { burst: 1_000_000, window_seconds: 10, cooldown_seconds: 1 }
          doc.limits = { ...doc.limits, failed_requests_per_minute: 1_000_000 }
          for (const model of doc.catalog.models) model.rate_limit_rpm = 1_000_000
        }
      })
    })
    afterAll(() => gw?.stop())

    it("no 5xx and small JSON errors; stored responses of hostile text are written", async () => {
      let answered = 0
      await fc.assert(
        fc.asyncProperty(body, fc.boolean(), async (b, stream) => {
          const sent = stream && typeof b === "object" && b !== null ? { ...b, stream: true } : b
          const res = await fetch(`${gw.url}/v1/responses`, { method: "POST", headers: authed(gw.key), body: JSON.stringify(sent) })
          const reply = await res.text()
          expect(res.status, reply.slice(0, 300)).toBeLessThan(500)
          if (res.status >= 400) {
            expect(reply.length).toBeLessThan(8_192)
            expect(() => JSON.parse(reply)).not.toThrow()
          } else answered++
        }),
        { numRuns: 150 }
      )
      // Valid requests whose text the database must take as is.
      for (const hostile of ["\u0000", "a\ud800b", "\udfff", "'; DROP TABLE stored_responses; --", "\u202e"]) {
        const res = await fetch(`${gw.url}/v1/responses`, {
          method: "POST",
          headers: authed(gw.key),
          body: JSON.stringify({
            model: "ws-pro",
            input: [{ role: "user", content: `say ${hostile}` }],
            instructions: hostile,
            metadata: { k: hostile }
          })
        })
        expect(res.status).toBe(200)
        answered++
      }
      const pending = await gw.run(Effect.flatMap(ResponseStore, (s) => Effect.andThen(s.flush, Effect.sync(() => s.pending()))))
      expect(pending).toBe(0)
      expect(answered).toBeGreaterThan(4)
    })
  })
})
