/**
 * The hand-written decoder of common chat requests (`decodeCommon`) against the schema it stands in for: on
 * generated bodies (seeded), whenever it answers, the schema accepts the same body and decodes it to the same
 * value with the same keys in the same order; whenever the schema refuses, it does not answer.
 */
import { Result, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { ChatRequest, decodeChatRequest, decodeCommon, MODEL_CHARS, STOP_CHARS } from "../../src/inference/ChatRequest.js"
import { ID_CHARS } from "../../src/wire/ChatSchemas.js"
import { LimitsConfig } from "../../src/config/GatewayConfig.js"

const schemaDecode = Schema.decodeUnknownResult(ChatRequest)

let seed = 20261129
const random = () => {
  seed = (Math.imul(seed, 1103515245) + 12345) >>> 0
  return seed / 4294967296
}
const pick = <A>(items: ReadonlyArray<A>): A => items[Math.floor(random() * items.length)]!
const chance = (p: number) => random() < p

const ABSENT = Symbol("absent")
const text = (n: number) => "가".repeat(n)

const contents: ReadonlyArray<unknown> = ["hi", "", text(3), null, 7, [{ type: "text", text: "hi" }], [], { text: "x" }]
const roles: ReadonlyArray<unknown> = ["user", "system", "assistant", "tool", "developer", "USER", 1, ABSENT]

const message = (): unknown => {
  if (chance(0.03)) return pick([null, "hi", 3, []])
  const m: Record<string, unknown> = {}
  const role = chance(0.8) ? pick(["user", "system", "assistant", "tool"]) : pick(roles)
  if (role !== ABSENT) m["role"] = role
  if (!chance(0.05)) m["content"] = chance(0.7) ? "hello" : pick(contents)
  if (role === "tool" || chance(0.05)) {
    const id = pick<unknown>(["call_1", "", "x".repeat(ID_CHARS), "x".repeat(ID_CHARS + 1), 5, ABSENT])
    if (id !== ABSENT) m["tool_call_id"] = id
  }
  if (chance(0.05)) m["tool_calls"] = pick([[], [{ id: "c", type: "function", function: { name: "f", arguments: "{}" } }], null])
  if (chance(0.05)) m["reasoning"] = pick(["why", 3])
  if (chance(0.1)) m["name"] = "extra"
  return m
}

/** Each optional field: absent most of the time, else a value in range, at an edge, or of the wrong kind. */
const OPTIONS: Record<string, ReadonlyArray<unknown>> = {
  stream: [true, false, "true", 1, null],
  temperature: [0, -0, 0.7, 2, 2.0000001, -0.01, "1", null],
  max_tokens: [1, 64, 2 ** 53 - 1, 2 ** 53, 0, -1, 1.5, "5", null],
  max_completion_tokens: [1, 32, 0, 2.5, null],
  top_p: [0, 0.5, 1, 1.01, -1, null],
  stop: ["\n", "", "x".repeat(STOP_CHARS), "x".repeat(STOP_CHARS + 1), [], ["a", "b"], ["a", "b", "c", "d"], ["a", "b", "c", "d", "e"], [1], [
    "x".repeat(STOP_CHARS + 1)
  ], null, 3],
  reasoning_effort: ["low", "high", "anything", "", 1, null],
  parallel_tool_calls: [true, false, "yes", null],
  tools: [[], [{ type: "function", function: { name: "f" } }], null],
  tool_choice: ["auto", "none", "bogus", null],
  user: ["someone", 1],
  n: [1, 2]
}

const body = (): unknown => {
  if (chance(0.02)) return pick([null, [], "x", 3])
  const b: Record<string, unknown> = {}
  const model = chance(0.8) ? "ws-lite" : pick<unknown>(["", "m".repeat(MODEL_CHARS), "m".repeat(MODEL_CHARS + 1), 3, null, ABSENT])
  if (model !== ABSENT) b["model"] = model
  if (!chance(0.03)) {
    b["messages"] = chance(0.04) ? pick([[], "hi", null, {}]) : Array.from({ length: 1 + Math.floor(random() * 3) }, message)
  }
  for (const [key, values] of Object.entries(OPTIONS)) if (chance(0.08)) b[key] = pick(values)
  return b
}

describe("decodeCommon", () => {
  it("answers only where the schema accepts, with the schema's value and key order (5,000 generated bodies)", () => {
    let answered = 0
    let refusedBySchema = 0
    for (let i = 0; i < 5_000; i++) {
      const b = body()
      const fast = typeof b === "object" && b !== null && !Array.isArray(b) ? decodeCommon(b as Record<string, unknown>) : undefined
      const slow = schemaDecode(b)
      if (Result.isFailure(slow)) {
        refusedBySchema++
        expect(fast, JSON.stringify(b)).toBeUndefined()
      } else if (fast !== undefined) {
        answered++
        expect(JSON.stringify(fast), JSON.stringify(b)).toBe(JSON.stringify(slow.success))
      }
    }
    // Both sides of the comparison were exercised.
    expect(answered).toBeGreaterThan(500)
    expect(refusedBySchema).toBeGreaterThan(500)
  })

  it("decodes the common request itself and leaves tools, content parts and tool calls to the schema", () => {
    const common = { model: "ws-lite", messages: [{ role: "system", content: "s" }, { role: "user", content: "hi" }], stream: true, temperature: 0.5 }
    expect(decodeCommon(common)).toEqual(common)
    expect(decodeCommon({ ...common, tools: [] })).toBeUndefined()
    expect(decodeCommon({ ...common, messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }] })).toBeUndefined()
    expect(decodeCommon({ ...common, messages: [{ role: "assistant", content: null, tool_calls: [] }] })).toBeUndefined()
    // Fields the decoder does not read are dropped, as the schema drops them.
    expect(decodeCommon({ ...common, user: "u", messages: [{ role: "user", content: "hi", name: "n" }] })).toEqual({
      model: "ws-lite",
      messages: [{ role: "user", content: "hi" }],
      stream: true,
      temperature: 0.5
    })
  })

  it("gives the full decoder the same results either way, errors included", () => {
    const limits = Schema.decodeSync(LimitsConfig)({})
    const cases: ReadonlyArray<unknown> = [
      { model: "ws-lite", messages: [{ role: "user", content: "hi" }], max_tokens: 10, max_completion_tokens: 5 },
      { model: "ws-lite", messages: [{ role: "user", content: "hi" }], temperature: 3 },
      { model: "ws-lite", messages: [{ role: "user", content: "x".repeat(limits.text_chars + 1) }] }
    ]
    const [folded, outOfRange, tooLong] = cases.map((c) => decodeChatRequest(c, limits))
    expect(Result.isSuccess(folded!) && folded.success.max_tokens).toBe(5)
    expect(Result.isFailure(outOfRange!) && outOfRange.failure.code).toBe("invalid_request")
    expect(Result.isFailure(tooLong!) && tooLong.failure.code).toBe("invalid_messages")
  })
})
