import { describe, expect, it } from "@effect/vitest"
import {
  ChatNormalizer,
  mapFinishReason,
  normalizeToolCallId
} from "../../src/upstream/openai-compatible/Normalize.js"
import { SseParser } from "../../src/upstream/http/Sse.js"

const parseAll = (pieces: ReadonlyArray<string>): Array<string> => {
  const out: Array<string> = []
  const parser = new SseParser((d) => out.push(d))
  for (const p of pieces) parser.push(p)
  parser.end()
  return out
}

describe("SseParser", () => {
  const stream = ": keep-alive comment\r\n" +
    "event: message\r\n" +
    "data: {\"a\":1}\r\n\r\n" +
    "data:{\"b\":2}\n\n" +
    "id: 7\rdata: line one\rdata: line two\r\r" +
    "data: [DONE]\n\n"
  const expected = ["{\"a\":1}", "{\"b\":2}", "line one\nline two", "[DONE]"]

  it("parses comments, CRLF/CR/LF endings, data without a space and multi-line data", () => {
    expect(parseAll([stream])).toEqual(expected)
  })

  it("gives the same events wherever the text is split (every one- and two-cut split)", () => {
    for (let i = 0; i <= stream.length; i++) {
      expect(parseAll([stream.slice(0, i), stream.slice(i)])).toEqual(expected)
      for (let j = i; j <= stream.length; j += 7) {
        expect(parseAll([stream.slice(0, i), stream.slice(i, j), stream.slice(j)])).toEqual(expected)
      }
    }
  })

  it("delivers a final event that lacks its blank line, and ignores fields other than data", () => {
    expect(parseAll(["database: x\nretry: 5\ndata: last"])).toEqual(["last"])
  })

  it("rejects a runaway line", () => {
    const parser = new SseParser(() => {}, 10)
    expect(() => parser.push("data: 0123456789abcdef")).toThrow(/longer than 10/)
  })
})

describe("ChatNormalizer", () => {
  const chunk = (delta: object, finish_reason: string | null = null) =>
    JSON.stringify({ choices: [{ index: 0, delta, finish_reason }] })

  it("maps reasoning fields, skips empty content and ends with Finish then Usage", () => {
    const n = new ChatNormalizer()
    n.onData(chunk({ role: "assistant", content: "" }))
    n.onData(chunk({ reasoning_content: "think " }))
    n.onData(chunk({ reasoning: "more" }))
    n.onData(chunk({ content: "Hi" }))
    n.onData(chunk({ reasoning: "late reasoning is dropped" }))
    n.onData(chunk({}, "content_filter"))
    n.onData(JSON.stringify({
      choices: [],
      usage: {
        prompt_tokens: 10,
        completion_tokens: 20,
        prompt_tokens_details: { cached_tokens: 4 },
        completion_tokens_details: { reasoning_tokens: 5 }
      }
    }))
    n.onData("[DONE]")
    expect(n.end()).toBeUndefined()
    expect(n.events).toEqual([
      { _tag: "Reasoning", text: "think " },
      { _tag: "Reasoning", text: "more" },
      { _tag: "Content", text: "Hi" },
      { _tag: "Finish", reason: "stop" },
      { _tag: "Usage", usage: { prompt_tokens: 10, completion_tokens: 20, reasoning_tokens: 5, cached_tokens: 4 } }
    ])
  })

  it("buffers tool call arguments until id and name are known, keyed by index", () => {
    const n = new ChatNormalizer()
    n.onData(chunk({ tool_calls: [{ index: 3, function: { arguments: "{\"a\"" } }] }))
    n.onData(chunk({ tool_calls: [{ index: 3, id: "toolu_abc", function: { name: "f" } }] }))
    n.onData(chunk({ tool_calls: [{ index: 5, id: "toolu_def", function: { name: "g", arguments: "{}" } }] }))
    n.onData(chunk({ tool_calls: [{ index: 3, function: { arguments: ":1}" } }] }))
    n.onData(chunk({}, "tool_calls"))
    expect(n.end()).toBeUndefined()
    expect(n.events).toEqual([
      { _tag: "ToolCallStart", index: 0, id: expect.stringMatching(/^call_[0-9a-f]{32}$/), name: "f" },
      { _tag: "ToolCallArgs", index: 0, fragment: "{\"a\"" },
      { _tag: "ToolCallStart", index: 1, id: expect.stringMatching(/^call_[0-9a-f]{32}$/), name: "g" },
      { _tag: "ToolCallArgs", index: 1, fragment: "{}" },
      { _tag: "ToolCallArgs", index: 0, fragment: ":1}" },
      { _tag: "Finish", reason: "tool_calls" }
    ])
  })

  it("normalizes tool call ids to call_ + 32 hex, keeping ones already in that form", () => {
    const ok = "call_0123456789abcdef0123456789abcdef"
    expect(normalizeToolCallId(ok)).toBe(ok)
    expect(normalizeToolCallId("toolu_abc")).toMatch(/^call_[0-9a-f]{32}$/)
    // Never derived from the upstream id: upstreams that number their calls would repeat ids across requests.
    expect(normalizeToolCallId("toolu_abc")).not.toBe(normalizeToolCallId("toolu_abc"))
    expect(normalizeToolCallId("0")).not.toBe(normalizeToolCallId("0"))
    expect(normalizeToolCallId("call_ABC")).toMatch(/^call_[0-9a-f]{32}$/)
    expect(normalizeToolCallId(undefined)).toMatch(/^call_[0-9a-f]{32}$/)
  })

  it("maps finish reasons", () => {
    expect(mapFinishReason("stop")).toBe("stop")
    expect(mapFinishReason("length")).toBe("length")
    expect(mapFinishReason("tool_calls")).toBe("tool_calls")
    expect(mapFinishReason("function_call")).toBe("tool_calls")
    expect(mapFinishReason("content_filter")).toBe("stop")
    expect(mapFinishReason("end_turn")).toBe("stop")
  })

  it("counts undecodable frames and reports an unfinished stream and error frames", () => {
    const n = new ChatNormalizer()
    n.onData("{not json")
    n.onData(chunk({ content: "a" }))
    expect(n.skipped).toBe(1)
    expect(n.lastSkipped).toBe("{not json")
    expect(n.end()).toMatchObject({ kind: "protocol", detail: expect.stringMatching(/before finishing/) })
    const e = new ChatNormalizer()
    e.onData(JSON.stringify({ error: { message: "model overloaded" } }))
    expect(e.end()).toMatchObject({ kind: "protocol", detail: "upstream error: model overloaded" })
  })

  it("reads a whole chat.completion body", () => {
    const n = new ChatNormalizer()
    expect(n.onJson({
      choices: [{
        message: {
          content: "Done",
          reasoning: "thought",
          tool_calls: [{ id: "x1", type: "function", function: { name: "f", arguments: "{\"k\":1}" } }]
        },
        finish_reason: "stop"
      }],
      usage: { prompt_tokens: 1, completion_tokens: 2 }
    })).toBeUndefined()
    expect(n.events).toEqual([
      { _tag: "Reasoning", text: "thought" },
      { _tag: "Content", text: "Done" },
      { _tag: "ToolCallStart", index: 0, id: expect.stringMatching(/^call_[0-9a-f]{32}$/), name: "f" },
      { _tag: "ToolCallArgs", index: 0, fragment: "{\"k\":1}" },
      { _tag: "Finish", reason: "tool_calls" },
      { _tag: "Usage", usage: { prompt_tokens: 1, completion_tokens: 2, reasoning_tokens: 0, cached_tokens: 0 } }
    ])
    expect(new ChatNormalizer().onJson({ choices: [] })).toMatchObject({
      kind: "protocol",
      detail: expect.stringMatching(/no choices/)
    })
  })
})
