import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Stream } from "effect"
import { TestClock } from "effect/testing"
import {
  countTokens,
  EMBEDDING_DIMENSIONS,
  embedText,
  estimatePromptTokens,
  makeSimulatedAdapter,
  planChat
} from "../../src/upstream/simulated/Engine.js"
import type { ToolDefinition, UpstreamEvent, UpstreamRequest } from "../../src/upstream/Upstream.js"
import { upstreamStream } from "../support/UpstreamStream.js"

/** The in-process adapter's answer as a Stream (derived from `open`). */
const simulateChat = (request: UpstreamRequest, timing: { first_token_ms: number; tokens_per_second: number }) =>
  upstreamStream(makeSimulatedAdapter({ kind: "simulated", ...timing }), request)

const ask = (text: string, extra: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
  model: "sim-pro",
  stream: true,
  max_tokens: 4096,
  messages: [{ role: "system", content: "be brief" }, { role: "user", content: text }],
  ...extra
})

const weather: ToolDefinition = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", minLength: 3 },
        days: { type: "integer", minimum: 2, maximum: 7 },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        detailed: { type: "boolean" },
        tags: { type: "array", items: { type: "string" } },
        where: { type: "object", properties: { lat: { type: "number" } }, required: ["lat"] },
        optional: { type: "string" }
      },
      required: ["city", "days", "unit", "detailed", "tags", "where"]
    }
  }
}
const search: ToolDefinition = {
  type: "function",
  function: { name: "search", parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } }
}

const tags = (events: ReadonlyArray<UpstreamEvent>) => events.map((e) => e._tag)
const textOf = (events: ReadonlyArray<UpstreamEvent>, tag: "Content" | "Reasoning") =>
  events.flatMap((e) => (e._tag === tag ? [e.text] : [])).join("")

describe("simulated engine", () => {
  it("counts one token per started 4-character piece of each word", () => {
    expect(countTokens("")).toBe(0)
    expect(countTokens("abcd")).toBe(1)
    expect(countTokens("abcde")).toBe(2)
    expect(countTokens("  a bb\tccccc\n")).toBe(4)
  })

  it("is deterministic and depends on the last user message", () => {
    const a = planChat(ask("Tell me about rivers in spring"))
    const b = planChat(ask("Tell me about rivers in spring"))
    const c = planChat(ask("Something else entirely"))
    expect(b.events).toEqual(a.events)
    expect(c.content).not.toBe(a.content)
  })

  it("answers with several content events echoing the user's words, then Finish and Usage", () => {
    const request = ask("Tell me about rivers in spring")
    const plan = planChat(request)
    const content = plan.events.filter((e) => e._tag === "Content")
    expect(content.length).toBeGreaterThan(5)
    expect(textOf(plan.events, "Content")).toMatch(/^Echo: Tell me about rivers in spring\. \w+/)
    expect(tags(plan.events).slice(-2)).toEqual(["Finish", "Usage"])
    expect(plan.events.at(-2)).toEqual({ _tag: "Finish", reason: "stop" })
    expect(plan.usage).toEqual({
      prompt_tokens: estimatePromptTokens(request),
      completion_tokens: countTokens(plan.content),
      reasoning_tokens: 0,
      cached_tokens: 0
    })
    expect(plan.usage.prompt_tokens).toBe(3 + (4 + countTokens("be brief")) + (4 + countTokens("Tell me about rivers in spring")))
    expect(countTokens("be brief")).toBe(3)
  })

  it("reasons first, longer for higher effort, and counts reasoning in completion tokens", () => {
    const none = planChat(ask("Why is the sky blue?", { reasoning_effort: "none" }))
    expect(tags(none.events)).not.toContain("Reasoning")
    const counts = (["low", "high", "max"] as const).map((effort) => {
      const plan = planChat(ask("Why is the sky blue?", { reasoning_effort: effort }))
      const t = tags(plan.events)
      expect(t.lastIndexOf("Reasoning")).toBeLessThan(t.indexOf("Content"))
      expect(plan.usage.reasoning_tokens).toBe(countTokens(plan.reasoning))
      expect(plan.usage.completion_tokens).toBe(countTokens(plan.reasoning) + countTokens(plan.content))
      return t.filter((x) => x === "Reasoning").length
    })
    expect(counts[0]).toBeGreaterThan(3)
    expect(counts[1]).toBeGreaterThan(counts[0]!)
    expect(counts[2]).toBeGreaterThan(counts[1]!)
  })

  it("truncates at max_tokens (reasoning included) with finish length", () => {
    const plan = planChat(ask("Tell me about rivers in spring", { max_tokens: 5 }))
    expect(plan.finish).toBe("length")
    expect(plan.usage.completion_tokens).toBe(5)
    // "Echo: " 2 + "Tell " 1 + "me " 1 = 4 tokens; the fifth cuts "about" to one 4-character piece.
    expect(plan.content).toBe("Echo: Tell me abou")
    const reasoned = planChat(ask("Tell me about rivers", { max_tokens: 6, reasoning_effort: "high" }))
    expect(reasoned.finish).toBe("length")
    expect(reasoned.usage.reasoning_tokens).toBe(6)
    expect(tags(reasoned.events)).not.toContain("Content")
  })

  it("cuts the text at a stop sequence", () => {
    const plan = planChat(ask("alpha beta gamma delta", { stop: ["gamma", "zzz"] }))
    expect(plan.content).toBe("Echo: alpha beta ")
    expect(plan.finish).toBe("stop")
  })

  it("calls an offered tool with schema-valid arguments split into fragments", () => {
    const plan = planChat(ask("What is the weather in Paris?", { tools: [weather], tool_choice: "auto" }))
    expect(tags(plan.events)).not.toContain("Content")
    const start = plan.events.find((e) => e._tag === "ToolCallStart")
    expect(start).toMatchObject({ index: 0, name: "get_weather" })
    expect(start?._tag === "ToolCallStart" && start.id).toMatch(/^call_[0-9a-f]{32}$/)
    const fragments = plan.events.flatMap((e) => (e._tag === "ToolCallArgs" ? [e.fragment] : []))
    expect(fragments.length).toBeGreaterThan(3)
    expect(tags(plan.events).indexOf("ToolCallStart")).toBeLessThan(tags(plan.events).indexOf("ToolCallArgs"))
    expect(JSON.parse(fragments.join(""))).toEqual({
      city: "Paris",
      days: 2,
      unit: "celsius",
      detailed: true,
      tags: ["Paris"],
      where: { lat: 1 }
    })
    expect(plan.finish).toBe("tool_calls")
    expect(plan.usage.completion_tokens).toBeGreaterThan(0)
  })

  it("respects tool_choice and parallel_tool_calls", () => {
    const none = planChat(ask("weather in Paris", { tools: [weather, search], tool_choice: "none" }))
    expect(tags(none.events)).not.toContain("ToolCallStart")
    expect(none.finish).toBe("stop")

    const named = planChat(
      ask("weather in Paris", { tools: [weather, search], tool_choice: { type: "function", function: { name: "search" } } })
    )
    expect(named.toolCalls.map((c) => c.name)).toEqual(["search"])
    expect(JSON.parse(named.toolCalls[0]!.arguments)).toEqual({ q: "Paris" })

    const parallel = planChat(ask("weather in Paris", { tools: [weather, search], parallel_tool_calls: true }))
    expect(parallel.toolCalls.map((c) => c.name).sort()).toEqual(["get_weather", "search"])
    expect(parallel.events.filter((e) => e._tag === "ToolCallStart").map((e) => e._tag === "ToolCallStart" && e.index))
      .toEqual([0, 1])
    expect(new Set(parallel.toolCalls.map((c) => c.id)).size).toBe(2)

    const single = planChat(ask("weather in Paris", { tools: [weather, search], parallel_tool_calls: false }))
    expect(single.toolCalls).toHaveLength(1)
  })

  it("answers a tool result with text that mentions it", () => {
    const first = planChat(ask("What is the weather in Paris?", { tools: [weather] }))
    const call = first.toolCalls[0]!
    const plan = planChat({
      model: "sim-pro",
      stream: false,
      max_tokens: 1000,
      tools: [weather],
      messages: [
        { role: "user", content: "What is the weather in Paris?" },
        { role: "assistant", content: null, tool_calls: [{ id: call.id, type: "function", function: { name: call.name, arguments: call.arguments } }] },
        { role: "tool", tool_call_id: call.id, content: "sunny and 21 degrees" }
      ]
    })
    expect(tags(plan.events)).not.toContain("ToolCallStart")
    expect(plan.content).toMatch(/^The get_weather tool returned: sunny and 21 degrees\./)
    expect(plan.finish).toBe("stop")
  })

  it.effect("emits everything at once without latency settings", () =>
    Effect.gen(function*() {
      const events = yield* Stream.runCollect(simulateChat(ask("hello"), { first_token_ms: 0, tokens_per_second: 0 }))
      expect(events).toEqual(planChat(ask("hello")).events)
    }))

  it.effect("paces events on the Clock: first token delay, then tokens per second", () =>
    Effect.gen(function*() {
      const request = ask("Tell me about rivers in spring")
      const plan = planChat(request)
      const seen: Array<UpstreamEvent> = []
      const fiber = yield* simulateChat(request, { first_token_ms: 100, tokens_per_second: 10 }).pipe(
        Stream.runForEach((e) => Effect.sync(() => seen.push(e))),
        Effect.forkChild
      )
      yield* TestClock.adjust("99 millis")
      expect(seen).toHaveLength(0)
      yield* TestClock.adjust("1 millis")
      expect(seen).toEqual([plan.events[0]])
      // The second event is due after its own tokens at 10 tokens/s.
      yield* TestClock.adjust(`${plan.costs[1]! * 100 - 1} millis`)
      expect(seen).toHaveLength(1)
      yield* TestClock.adjust("1 millis")
      expect(seen).toHaveLength(2)
      const outputTokens = plan.costs.slice(1).reduce((a, b) => a + b, 0)
      const total = 100 + outputTokens * 100
      yield* TestClock.setTime(total - 1)
      expect(fiber.pollUnsafe()).toBeUndefined()
      expect(seen.length).toBeLessThan(plan.events.length)
      yield* TestClock.setTime(total)
      yield* Fiber.join(fiber)
      expect(seen).toEqual(plan.events)
    }))

  it("embeds text as deterministic 1024-dimension unit vectors", () => {
    const a = embedText("hello world")
    expect(a).toHaveLength(EMBEDDING_DIMENSIONS)
    expect(Math.hypot(...a)).toBeCloseTo(1, 10)
    expect(embedText("hello world")).toEqual(a)
    const b = embedText("hello there")
    const cosine = a.reduce((sum, v, i) => sum + v * b[i]!, 0)
    expect(Math.abs(cosine)).toBeLessThan(0.3)
  })

  it.effect("the in-process adapter streams the plan and embeds with token counts", () =>
    Effect.gen(function*() {
      const adapter = makeSimulatedAdapter({ kind: "simulated", first_token_ms: 0, tokens_per_second: 0 })
      const events = yield* Stream.runCollect(upstreamStream(adapter, ask("hi there")))
      expect(events).toEqual(planChat(ask("hi there")).events)
      const result = yield* adapter.embed("sim-embed", ["abcdefgh ij", "x"])
      expect(result.prompt_tokens).toBe(4)
      expect(result.vectors).toEqual([embedText("abcdefgh ij"), embedText("x")])
    }))
})
