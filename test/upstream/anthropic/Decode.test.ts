import { createHash } from "node:crypto"
import { describe, expect, it } from "vitest"
import { upstreamFailure } from "../../../src/upstream/Failure.js"
import {
  AnthropicSse,
  decodeResponse,
  MAX_EVENT_CHARS,
  StreamDecoder
} from "../../../src/upstream/anthropic/Decode.js"
import { UpstreamError, type UpstreamEvent } from "../../../src/upstream/Upstream.js"
import {
  type FakeEvent,
  FakeEvents as E,
  type FakeMessage,
  FakeMessages,
  messageBody,
  RawText,
  streamEvents
} from "../../support/FakeAnthropic.js"

/** Feeds events (objects) one by one; returns every event emitted and `end()`'s outcome. */
const decode = (events: ReadonlyArray<object>, decoder = new StreamDecoder()) => {
  const out: Array<UpstreamEvent> = []
  for (const event of events) {
    decoder.onData(JSON.stringify(event))
    out.push(...decoder.take())
  }
  const end = decoder.end()
  out.push(...decoder.take())
  return { events: out, end, decoder }
}

const wire = (events: ReadonlyArray<FakeEvent>): string =>
  events.map((e) => (e instanceof RawText ? e.text : `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`)).join("")

/** Feeds SSE text in the given pieces through `AnthropicSse`. */
const decodeText = (pieces: ReadonlyArray<string>) => {
  const sse = new AnthropicSse()
  const out: Array<UpstreamEvent> = []
  for (const piece of pieces) {
    sse.push(piece)
    out.push(...sse.decoder.take())
  }
  const end = sse.end()
  out.push(...sse.decoder.take())
  return { events: out, end }
}

const derived = (toolu: string) =>
  "call_" + createHash("sha256").update("anthropic:" + toolu).digest("hex").slice(0, 32)

const usage = (prompt: number, completion: number, reasoning = 0, cached = 0) => ({
  _tag: "Usage",
  usage: { prompt_tokens: prompt, completion_tokens: completion, reasoning_tokens: reasoning, cached_tokens: cached }
})

describe("Anthropic stream decoding", () => {
  it("decodes a text answer: Content deltas, Finish, then Usage with cache tokens counted in the prompt", () => {
    const { end, events } = decode([
      E.messageStart({ input_tokens: 10, cache_creation_input_tokens: 3, cache_read_input_tokens: 5, output_tokens: 1 }),
      E.blockStart(0, { type: "text", text: "" }),
      E.ping(),
      E.textDelta(0, "Hel"),
      E.textDelta(0, "lo"),
      E.textDelta(0, ""),
      E.blockStop(0),
      E.messageDelta("end_turn", { output_tokens: 7 }),
      E.messageStop()
    ])
    expect(end).toBeUndefined()
    expect(events).toEqual([
      { _tag: "Content", text: "Hel" },
      { _tag: "Content", text: "lo" },
      { _tag: "Finish", reason: "stop" },
      usage(18, 7, 0, 5)
    ])
  })

  it("decodes thinking then text: Reasoning first, signature ignored, reasoning tokens estimated from the text", () => {
    const thinking = "Let me think about this carefully." // 34 characters -> 9 tokens
    const { end, events } = decode([
      E.messageStart({ input_tokens: 40, output_tokens: 1 }),
      E.blockStart(0, { type: "thinking", thinking: "" }),
      E.thinkingDelta(0, thinking.slice(0, 20)),
      E.thinkingDelta(0, thinking.slice(20)),
      E.signatureDelta(0),
      E.blockStop(0),
      E.blockStart(1, { type: "text", text: "" }),
      E.textDelta(1, "42"),
      E.blockStop(1),
      E.messageDelta("end_turn", { output_tokens: 60 }),
      E.messageStop()
    ])
    expect(end).toBeUndefined()
    expect(events).toEqual([
      { _tag: "Reasoning", text: "Let me think about t" },
      { _tag: "Reasoning", text: "his carefully." },
      { _tag: "Content", text: "42" },
      { _tag: "Finish", reason: "stop" },
      usage(40, 60, 9)
    ])
  })

  it("caps the reasoning estimate at the output tokens", () => {
    const { events } = decode([
      E.messageStart({ input_tokens: 1, output_tokens: 1 }),
      E.blockStart(0, { type: "thinking", thinking: "" }),
      E.thinkingDelta(0, "x".repeat(400)),
      E.blockStop(0),
      E.messageDelta("max_tokens", { output_tokens: 20 }),
      E.messageStop()
    ])
    expect(events.slice(-2)).toEqual([{ _tag: "Finish", reason: "length" }, usage(1, 20, 20)])
  })

  it("drops thinking that comes after the answer started (reasoning always precedes content)", () => {
    const { events } = decode([
      E.messageStart({ input_tokens: 5, output_tokens: 1 }),
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "Answer"),
      E.blockStop(0),
      E.blockStart(1, { type: "thinking", thinking: "" }),
      E.thinkingDelta(1, "late thought"), // 12 characters -> 3 tokens, still generated and billed
      E.blockStop(1),
      E.messageDelta("end_turn", { output_tokens: 30 }),
      E.messageStop()
    ])
    expect(events).toEqual([{ _tag: "Content", text: "Answer" }, { _tag: "Finish", reason: "stop" }, usage(5, 30, 3)])
  })

  it("decodes tool_use blocks: ToolCallStart with a derived id, then input_json fragments split mid-token", () => {
    const { end, events } = decode([
      E.messageStart({ input_tokens: 300, output_tokens: 1 }),
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "Checking both."),
      E.blockStop(0),
      E.blockStart(1, { type: "tool_use", id: "toolu_01A09q90qw90lq917835lq9", name: "weather", input: {} }),
      E.jsonDelta(1, ""),
      E.jsonDelta(1, "{\"ci"),
      E.jsonDelta(1, "ty\": \"Seo"),
      E.jsonDelta(1, "ul\"}"),
      E.blockStop(1),
      E.blockStart(2, { type: "tool_use", id: "toolu_01B7mJzqY2M8xk3PwTq9Rn4e", name: "weather", input: {} }),
      E.jsonDelta(2, "{\"city\": \"Busan\"}"),
      E.blockStop(2),
      E.messageDelta("tool_use", { output_tokens: 90 }),
      E.messageStop()
    ])
    expect(end).toBeUndefined()
    expect(events).toEqual([
      { _tag: "Content", text: "Checking both." },
      { _tag: "ToolCallStart", index: 0, id: derived("toolu_01A09q90qw90lq917835lq9"), name: "weather" },
      { _tag: "ToolCallArgs", index: 0, fragment: "{\"ci" },
      { _tag: "ToolCallArgs", index: 0, fragment: "ty\": \"Seo" },
      { _tag: "ToolCallArgs", index: 0, fragment: "ul\"}" },
      { _tag: "ToolCallStart", index: 1, id: derived("toolu_01B7mJzqY2M8xk3PwTq9Rn4e"), name: "weather" },
      { _tag: "ToolCallArgs", index: 1, fragment: "{\"city\": \"Busan\"}" },
      { _tag: "Finish", reason: "tool_calls" },
      usage(300, 90)
    ])
    expect(derived("toolu_01A09q90qw90lq917835lq9")).toMatch(/^call_[0-9a-f]{32}$/)
  })

  it("gives a tool call without input deltas the arguments {}", () => {
    const { events } = decode([
      E.messageStart(),
      E.blockStart(0, { type: "tool_use", id: "toolu_01NoArgsNoArgsNoArgs", name: "now", input: {} }),
      E.jsonDelta(0, ""),
      E.blockStop(0),
      E.messageDelta("tool_use"),
      E.messageStop()
    ])
    expect(events.slice(0, 2)).toEqual([
      { _tag: "ToolCallStart", index: 0, id: derived("toolu_01NoArgsNoArgsNoArgs"), name: "now" },
      { _tag: "ToolCallArgs", index: 0, fragment: "{}" }
    ])
  })

  it("gives short or repeated upstream ids random ids, never the same twice", () => {
    const { events } = decode([
      E.messageStart(),
      E.blockStart(0, { type: "tool_use", id: "1", name: "f", input: {} }),
      E.blockStop(0),
      E.blockStart(1, { type: "tool_use", id: "toolu_01SameSameSameSame", name: "f", input: {} }),
      E.blockStop(1),
      E.blockStart(2, { type: "tool_use", id: "toolu_01SameSameSameSame", name: "f", input: {} }),
      E.blockStop(2),
      E.messageDelta("tool_use"),
      E.messageStop()
    ])
    const ids = events.flatMap((e) => (e._tag === "ToolCallStart" ? [e.id] : []))
    expect(ids).toHaveLength(3)
    for (const id of ids) expect(id).toMatch(/^call_[0-9a-f]{32}$/)
    expect(new Set(ids).size).toBe(3)
    expect(ids[1]).toBe(derived("toolu_01SameSameSameSame"))
    const again = decode([
      E.messageStart(),
      E.blockStart(0, { type: "tool_use", id: "1", name: "f", input: {} }),
      E.blockStop(0),
      E.messageDelta("tool_use"),
      E.messageStop()
    ]).events[0] as { id: string }
    expect(again.id).not.toBe(ids[0])
  })

  it.each([
    ["end_turn", "stop"],
    ["stop_sequence", "stop"],
    ["max_tokens", "length"],
    ["model_context_window_exceeded", "length"],
    ["tool_use", "tool_calls"],
    ["pause_turn", "stop"],
    ["refusal", "stop"],
    [null, "stop"],
    ["something_new", "stop"]
  ])("maps stop_reason %s to finish %s", (reason, finish) => {
    const { events } = decode([
      E.messageStart(),
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "x"),
      E.blockStop(0),
      E.messageDelta(reason),
      E.messageStop()
    ])
    expect(events.find((e) => e._tag === "Finish")).toEqual({ _tag: "Finish", reason: finish })
  })

  it("reports a tool answer that stopped with end_turn as tool_calls", () => {
    const { events } = decode([
      E.messageStart(),
      E.blockStart(0, { type: "tool_use", id: "toolu_01EndTurnEndTurnEnd", name: "f", input: {} }),
      E.jsonDelta(0, "{}"),
      E.blockStop(0),
      E.messageDelta("end_turn"),
      E.messageStop()
    ])
    expect(events.find((e) => e._tag === "Finish")).toEqual({ _tag: "Finish", reason: "tool_calls" })
  })

  it("takes message_delta usage field by field over message_start's (cumulative figures)", () => {
    const { events } = decode([
      E.messageStart({ input_tokens: 10, cache_read_input_tokens: 4, output_tokens: 1 }),
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "x"),
      E.blockStop(0),
      E.messageDelta("end_turn", { input_tokens: 12, output_tokens: 9 }),
      E.messageStop()
    ])
    expect(events.at(-1)).toEqual(usage(16, 9, 0, 4))
  })

  it("omits Usage when the upstream reported none", () => {
    const { events } = decode([
      { type: "message_start", message: { id: "m", content: [] } },
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "x"),
      E.blockStop(0),
      { type: "message_delta", delta: { stop_reason: "end_turn" } },
      E.messageStop()
    ])
    expect(events).toEqual([{ _tag: "Content", text: "x" }, { _tag: "Finish", reason: "stop" }])
  })

  it("ignores ping, unknown events, unknown block and delta types, redacted thinking and citations", () => {
    const { end, events } = decode([
      E.messageStart({ input_tokens: 2, output_tokens: 1 }),
      E.ping(),
      { type: "some_future_event", data: 1 },
      E.blockStart(0, { type: "redacted_thinking", data: "EmwKAhgBEgy3va3pzix" }),
      E.blockStop(0),
      E.blockStart(1, { type: "text", text: "" }),
      { type: "content_block_delta", index: 1, delta: { type: "citations_delta", citation: { cited_text: "c" } } },
      E.textDelta(1, "ok"),
      E.blockStop(1),
      E.blockStart(2, { type: "server_tool_use", id: "srvtoolu_01", name: "web_search", input: {} } as any),
      { type: "content_block_delta", index: 2, delta: { type: "input_json_delta", partial_json: "{}" } },
      E.blockStop(2),
      E.messageDelta("end_turn", { output_tokens: 3 }),
      E.messageStop()
    ])
    expect(end).toBeUndefined()
    expect(events).toEqual([{ _tag: "Content", text: "ok" }, { _tag: "Finish", reason: "stop" }, usage(2, 3)])
  })

  it("fails on an error event mid-stream, keeping what came before; overloaded is rate_limited (529)", () => {
    const decoder = new StreamDecoder()
    const { end, events } = decode([
      E.messageStart(),
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "partial"),
      E.error("overloaded_error", "Overloaded"),
      E.textDelta(0, "after the error"),
      E.messageStop()
    ], decoder)
    expect(events).toEqual([{ _tag: "Content", text: "partial" }])
    expect(end).toBeInstanceOf(UpstreamError)
    expect(end).toMatchObject({ kind: "rate_limited", status: 529 })
    expect(end!.detail).toContain("overloaded_error")
    expect(decoder.error).toBe(end)
    expect(upstreamFailure(end!).code).toBe("upstream_rate_limited")
  })

  it.each([
    ["api_error", "status", 500, "upstream_error"],
    ["rate_limit_error", "rate_limited", 429, "upstream_rate_limited"],
    ["timeout_error", "timeout", 504, "upstream_timeout"],
    ["invalid_request_error", "status", 400, "upstream_rejected"],
    ["permission_error", "status", 403, "upstream_error"],
    ["brand_new_error", "status", 500, "upstream_error"]
  ])("maps an error event of type %s to %s %i (%s)", (type, kind, status, code) => {
    const { end } = decode([E.messageStart(), E.error(type, "boom")])
    expect(end).toMatchObject({ kind, status })
    expect(upstreamFailure(end!).code).toBe(code)
  })

  it("keeps the final usage for an error after message_delta", () => {
    const { decoder, end } = decode([
      E.messageStart({ input_tokens: 8, output_tokens: 1 }),
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "x"),
      E.blockStop(0),
      E.messageDelta("end_turn", { output_tokens: 4 }),
      E.error("api_error", "late")
    ])
    expect(end).toMatchObject({ kind: "status", status: 500 })
    expect(decoder.usage).toEqual(usage(8, 4).usage)
  })

  it("fails a stream that ends before message_delta, and completes one cut after it", () => {
    const cut = decode([E.messageStart(), E.blockStart(0, { type: "text", text: "" }), E.textDelta(0, "x")])
    expect(cut.end).toMatchObject({ kind: "protocol", detail: "upstream ended the stream before finishing" })
    expect(cut.events).toEqual([{ _tag: "Content", text: "x" }])
    const late = decode([
      E.messageStart({ input_tokens: 1, output_tokens: 1 }),
      E.blockStart(0, { type: "tool_use", id: "toolu_01CutAfterDeltaCutAf", name: "f", input: {} }),
      E.jsonDelta(0, "{\"a\":1}"),
      E.messageDelta("tool_use", { output_tokens: 2 })
    ])
    expect(late.end).toBeUndefined()
    expect(late.events.slice(-2)).toEqual([{ _tag: "Finish", reason: "tool_calls" }, usage(1, 2)])
  })

  it("emits Finish and Usage once, however often end() is called", () => {
    const decoder = new StreamDecoder()
    decode([E.messageStart(), E.messageDelta("end_turn"), E.messageStop()], decoder)
    expect(decoder.end()).toBeUndefined()
    expect(decoder.take()).toEqual([])
  })

  describe("bounds and protocol errors", () => {
    const fails = (events: ReadonlyArray<object | string>, detail: RegExp) => {
      const decoder = new StreamDecoder()
      for (const e of events) decoder.onData(typeof e === "string" ? e : JSON.stringify(e))
      const end = decoder.end()
      expect(end).toMatchObject({ kind: "protocol" })
      expect(end!.detail).toMatch(detail)
      expect(upstreamFailure(end!).code).toBe("upstream_error")
    }

    it("refuses an event over MAX_EVENT_CHARS", () => {
      const huge = E.textDelta(0, "x".repeat(MAX_EVENT_CHARS))
      fails([E.messageStart(), E.blockStart(0, { type: "text", text: "" }), huge], /longer than/)
    })

    it("refuses more than 128 tool calls", () => {
      const events: Array<object> = [E.messageStart()]
      for (let i = 0; i < 129; i++) {
        const id = `toolu_01Tool${String(i).padStart(12, "0")}`
        events.push(E.blockStart(i, { type: "tool_use", id, name: "f", input: {} }))
        events.push(E.blockStop(i))
      }
      fails(events, /more than 128 tool calls/)
      // 128 are fine
      const ok = decode([...events.slice(0, 1 + 128 * 2), E.messageDelta("tool_use"), E.messageStop()])
      expect(ok.end).toBeUndefined()
      expect(ok.events.filter((e) => e._tag === "ToolCallStart")).toHaveLength(128)
    })

    it("refuses more than 4096 content blocks", () => {
      const events: Array<object> = [E.messageStart()]
      for (let i = 0; i < 4097; i++) events.push(E.blockStart(i, { type: "text", text: "" }), E.blockStop(i))
      fails(events, /more than 4096 content blocks/)
    })

    it("refuses undecodable JSON and non-object events", () => {
      fails([E.messageStart(), "{\"type\":\"content_block_delta\",\"index\":0,"], /undecodable event/)
      fails([E.messageStart(), "42"], /not a JSON object/)
    })

    it("refuses deltas for blocks that are not open, mismatched deltas, and a block started twice", () => {
      fails([E.messageStart(), E.textDelta(0, "x")], /not open/)
      fails([E.messageStart(), E.blockStart(0, { type: "text", text: "" }), E.blockStop(0), E.textDelta(0, "x")], /not open/)
      fails([E.messageStart(), E.blockStop(3)], /not open/)
      const toolStart = E.blockStart(0, { type: "tool_use", id: "toolu_01abcdefghijklmnop", name: "f", input: {} })
      fails([E.messageStart(), toolStart, E.textDelta(0, "x")], /text_delta outside/)
      fails([E.messageStart(), E.blockStart(0, { type: "text", text: "" }), E.jsonDelta(0, "{")], /input_json_delta outside/)
      fails([E.messageStart(), E.blockStart(0, { type: "text", text: "" }), E.thinkingDelta(0, "t")], /thinking_delta outside/)
      fails([E.messageStart(), E.blockStart(0, { type: "text", text: "" }), E.blockStart(0, { type: "text", text: "" })], /started twice/)
      fails([E.messageStart(), { type: "content_block_start", content_block: { type: "text", text: "" } }], /without an index/)
      const nameless = { type: "tool_use", id: "toolu_01abcdefghijklmnop", input: {} }
      fails([E.messageStart(), { type: "content_block_start", index: 0, content_block: nameless }], /without a name/)
    })
  })

  describe("through the SSE parser (AnthropicSse)", () => {
    const message: FakeMessage = {
      content: [
        { type: "thinking", thinking: "Hmm, 한국어 생각 🤔." },
        { type: "text", text: "Calling the tool — ok." },
        { type: "tool_use", id: "toolu_01SplitSplitSplitSplit", name: "lookup", input: { q: "서울 날씨", n: 3 } }
      ],
      stop_reason: "tool_use",
      usage: { input_tokens: 100, output_tokens: 50, cache_read_input_tokens: 20 }
    }
    const text = wire(streamEvents(message, 4))
    const whole = decodeText([text])

    it("decodes the recorded-shape stream (event: lines, ping, empty first json delta)", () => {
      expect(whole.end).toBeUndefined()
      const args = whole.events.filter((e) => e._tag === "ToolCallArgs").map((e) => (e as any).fragment).join("")
      expect(JSON.parse(args)).toEqual({ q: "서울 날씨", n: 3 })
      expect(whole.events.filter((e) => e._tag === "Reasoning").map((e) => (e as any).text).join("")).toBe(
        "Hmm, 한국어 생각 🤔."
      )
      expect(whole.events.filter((e) => e._tag === "Content").map((e) => (e as any).text).join("")).toBe(
        "Calling the tool — ok."
      )
      expect(whole.events.slice(-2)).toEqual([{ _tag: "Finish", reason: "tool_calls" }, usage(120, 50, 4, 20)])
    })

    it("gives the same events wherever the text is split (every single cut, and one character at a time)", () => {
      for (let cut = 1; cut < text.length; cut++) {
        const split = decodeText([text.slice(0, cut), text.slice(cut)])
        expect(split.end).toBeUndefined()
        expect(split.events).toEqual(whole.events)
      }
      expect(decodeText([...text]).events).toEqual(whole.events)
    })

    it("decodes CRLF line endings", () => {
      expect(decodeText([text.replace(/\n/g, "\r\n")]).events).toEqual(whole.events)
    })

    it("fails on a line longer than the event bound", () => {
      const { end } = decodeText([`data: ${"x".repeat(MAX_EVENT_CHARS + 100)}`])
      expect(end).toMatchObject({ kind: "protocol" })
    })

    it("ignores everything after message_stop", () => {
      const { end, events } = decodeText([text, wire([E.error("api_error", "after the end")])])
      expect(end).toBeUndefined()
      expect(events).toEqual(whole.events)
    })
  })
})

describe("lean delta decoding", () => {
  /** Runs raw `data` payloads through a lean decoder and a JSON.parse-only one; both must agree exactly. */
  const both = (frames: ReadonlyArray<string>) => {
    const run = (lean: boolean) => {
      const decoder = new StreamDecoder([], lean)
      for (const f of frames) decoder.onData(f)
      const before = decoder.take()
      const end = decoder.end()
      return { before, end: end === undefined ? undefined : { kind: end.kind, detail: end.detail }, after: decoder.take() }
    }
    const lean = run(true)
    expect(lean).toEqual(run(false))
    return lean
  }
  const J = JSON.stringify
  const start = (index: number, type: string) =>
    J(type === "tool_use"
      ? E.blockStart(index, { type: "tool_use", id: "toolu_01LeanLeanLeanLean", name: "f", input: {} })
      : E.blockStart(index, type === "text" ? { type: "text", text: "" } : { type: "thinking", thinking: "" }))
  const text = (index: number, raw: string) =>
    `{"type":"content_block_delta","index":${index},"delta":{"type":"text_delta","text":"${raw}"}}`
  const open = [J(E.messageStart()), start(0, "text")]
  const close = [J(E.blockStop(0)), J(E.messageDelta("end_turn")), J(E.messageStop())]

  it.each([
    ["plain", "Hello"],
    ["empty", ""],
    ["escaped quote", "say \\\"hi\\\""],
    ["escaped backslash at the end", "C:\\\\"],
    ["newline and tab escapes", "a\\nb\\tc"],
    ["unicode escapes and a surrogate pair", "caf\\u00e9 \\ud83d\\ude00"],
    ["raw unicode", "한국어 🤔"],
    ["slash escape", "a\\/b"]
  ])("decodes a text delta with %s like JSON.parse", (_, raw) => {
    const out = both([...open, text(0, raw), ...close])
    expect(out.end).toBeUndefined()
    expect(out.before).toEqual(raw === "" ? [] : [{ _tag: "Content", text: JSON.parse(`"${raw}"`) }])
  })

  it.each([
    ["an invalid escape", text(0, "bad \\x escape")],
    ["a backslash escaping the closing quote", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"abc\\"}}`],
    ["a raw control character", text(0, "a\u0001b")],
    ["a cut frame", text(0, "x").slice(0, -1)]
  ])("fails %s like JSON.parse", (_, frame) => {
    const out = both([...open, frame, ...close])
    expect(out.end).toMatchObject({ kind: "protocol" })
  })

  it.each([
    ["another member after the text", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a","x":"b"}}`],
    ["a string that looks like the end", text(0, "a\\\"}},\\\"b")],
    ["another index", text(1, "x")],
    ["spaces", `{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}`],
    ["members in another order", `{"index":0,"type":"content_block_delta","delta":{"text":"x","type":"text_delta"}}`],
    ["a delta after the block stopped", "stop"]
  ])("decodes %s like JSON.parse", (_, frame) => {
    const frames = frame === "stop" ? [...open, J(E.blockStop(0)), text(0, "late")] : [...open, frame, ...close]
    both(frames)
  })

  it("decodes thinking and input_json deltas (escaped JSON in JSON) like JSON.parse", () => {
    const out = both([
      J(E.messageStart()),
      start(0, "thinking"),
      J(E.thinkingDelta(0, "think \"hard\"")),
      J(E.signatureDelta(0)),
      J(E.blockStop(0)),
      start(1, "tool_use"),
      J(E.jsonDelta(1, "")),
      J(E.jsonDelta(1, "{\"city\": \"Seo")),
      J(E.jsonDelta(1, "ul\\n\"}")),
      J(E.blockStop(1)),
      J(E.messageDelta("tool_use")),
      J(E.messageStop())
    ])
    expect(out.before.filter((e) => e._tag !== "ToolCallStart")).toEqual([
      { _tag: "Reasoning", text: "think \"hard\"" },
      { _tag: "ToolCallArgs", index: 0, fragment: "{\"city\": \"Seo" },
      { _tag: "ToolCallArgs", index: 0, fragment: "ul\\n\"}" }
    ])
  })
})

describe("Anthropic whole-answer decoding", () => {
  const messages: ReadonlyArray<[string, FakeMessage]> = [
    ["text", FakeMessages.text("Hello there", { input_tokens: 12, output_tokens: 3 })],
    ["thinking and text", FakeMessages.thinkingThenText("Step by step.", "Done.", { input_tokens: 5, output_tokens: 40 })],
    ["tool calls", FakeMessages.toolUse([
      { id: "toolu_01WholeWholeWholeWhole", name: "weather", input: { city: "Seoul", days: [1, 2] } },
      { id: "toolu_01EmptyEmptyEmptyEmpty", name: "now", input: {} }
    ], "Let me check.")],
    ["cache usage", FakeMessages.text("cached", {
      input_tokens: 3,
      cache_creation_input_tokens: 7,
      cache_read_input_tokens: 90,
      output_tokens: 2
    })],
    ["max tokens", { content: [{ type: "text", text: "cut" }], stop_reason: "max_tokens" }],
    ["redacted thinking", { content: [{ type: "redacted_thinking", data: "abc" }, { type: "text", text: "hi" }] }]
  ]

  it.each(messages)("gives the same events as the stream of the same answer (%s)", (_, message) => {
    const whole = decodeResponse(messageBody(message))
    expect(whole).not.toBeInstanceOf(UpstreamError)
    const streamed = decode(streamEvents(message, 3) as Array<object>)
    expect(streamed.end).toBeUndefined()
    const join = (events: ReadonlyArray<UpstreamEvent>) => {
      // Streamed text arrives in pieces: compare joined texts per kind and the rest exactly.
      const out: Array<unknown> = []
      for (const e of events) {
        const last = out.at(-1) as any
        if (last && (e._tag === "Content" || e._tag === "Reasoning") && last._tag === e._tag) last.text += e.text
        else if (last && e._tag === "ToolCallArgs" && last._tag === e._tag && last.index === e.index) {
          last.fragment += e.fragment
        } else out.push({ ...e })
      }
      return out
    }
    expect(join(streamed.events)).toEqual(join(whole as ReadonlyArray<UpstreamEvent>))
  })

  it("decodes a tool answer exactly", () => {
    const events = decodeResponse({
      id: "msg_1",
      type: "message",
      role: "assistant",
      content: [
        { type: "thinking", thinking: "Need weather.", signature: "sig" },
        { type: "tool_use", id: "toolu_01ExactExactExactExact", name: "weather", input: { city: "Seoul" } }
      ],
      stop_reason: "tool_use",
      usage: { input_tokens: 20, output_tokens: 30, cache_read_input_tokens: 10, cache_creation_input_tokens: 0 }
    })
    expect(events).toEqual([
      { _tag: "Reasoning", text: "Need weather." },
      { _tag: "ToolCallStart", index: 0, id: derived("toolu_01ExactExactExactExact"), name: "weather" },
      { _tag: "ToolCallArgs", index: 0, fragment: "{\"city\":\"Seoul\"}" },
      { _tag: "Finish", reason: "tool_calls" },
      usage(30, 30, 4, 10)
    ])
  })

  it("maps an error body and refuses what is not a Messages answer", () => {
    expect(decodeResponse({ type: "error", error: { type: "overloaded_error", message: "Overloaded" } })).toMatchObject({
      kind: "rate_limited",
      status: 529
    })
    expect(decodeResponse([])).toMatchObject({ kind: "protocol" })
    expect(decodeResponse("text")).toMatchObject({ kind: "protocol" })
    expect(decodeResponse({ type: "message" })).toMatchObject({ kind: "protocol", detail: "answer has no content array" })
    const many = {
      content: Array.from({ length: 129 }, (_, i) => ({
        type: "tool_use",
        id: `toolu_01Many${String(i).padStart(12, "0")}`,
        name: "f",
        input: {}
      }))
    }
    expect(decodeResponse(many)).toMatchObject({ kind: "protocol", detail: "more than 128 tool calls" })
  })
})
