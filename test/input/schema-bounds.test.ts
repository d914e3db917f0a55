/**
 * Issue #8 findings 4 and 12 (validation messages): sampling values out of range (`temperature: 1e999`,
 * `-5`, `top_p: -3`) are a 400 naming the field; every part of a chat request is bounded (message count,
 * text sizes, image URLs, ids, `stop`, `model`, tool size and depth); a 1 MB invalid content part gives a
 * small error. Messages are Korean, name the field and its path, and never carry the client's value or
 * Effect's English schema text. Boundary values pass and are forwarded unchanged.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { postChat, user } from "../inference/helpers.js"
import type { TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { expectRejected, startInputGateway } from "./support.js"

const LIMITS = { messages: 8, text_chars: 1000, image_url_chars: 2000, tool_schema_bytes: 4096 }
const MARK = "QZXW" // a marker of client values: never in an error body
const text = (n: number) => MARK + "a".repeat(n - MARK.length)
const ENGLISH_SCHEMA_TEXT = /Expected|actual|is missing|must match|Schema|ParseError|Predicate|refinement/i

describe("chat request bounds", () => {
  let gw: TestGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startInputGateway({ mock, limits: LIMITS })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  const base = { model: "ws-mock", messages: [user("hi")] }

  /** Sends `body`, asserts the rejection and returns its message; nothing reaches the upstream. */
  const rejected = async (body: unknown, code: "invalid_request" | "invalid_messages", field: string) => {
    const before = mock.requests.length
    const res = await postChat(gw, body)
    const envelope = await expectRejected(gw, res, 400, code, [MARK])
    const message: string = envelope.error.message
    expect(message).toContain(field)
    expect(message).not.toMatch(ENGLISH_SCHEMA_TEXT)
    expect(mock.requests.length).toBe(before)
    return message
  }

  /** Sends `body`, expects 200 and returns what the upstream received. */
  const forwarded = async (body: unknown) => {
    mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 1, completion: 1 } })))
    const res = await postChat(gw, body)
    expect(res.status, (await res.clone().text()).slice(0, 300)).toBe(200)
    await res.text()
    return mock.requests.at(-1)!.body
  }

  describe("sampling values", () => {
    it("temperature: 1e999 (Infinity once parsed) is a 400, not forwarded as null", async () => {
      const body = `{"model":"ws-mock","messages":[{"role":"user","content":"hi"}],"temperature":1e999}`
      const message = await rejected(body, "invalid_request", "temperature")
      expect(message).toMatch(/0 이상 2 이하/)
    })

    it.each([
      ["temperature", -5],
      ["temperature", 2.0001],
      ["temperature", "1"],
      ["top_p", -3],
      ["top_p", 1.5],
      ["max_tokens", 0],
      ["max_tokens", -1],
      ["max_tokens", 1.5],
      ["max_tokens", 2 ** 53],
      ["max_tokens", "100"]
    ])("%s = %s is a 400 naming the field", async (field, value) => {
      await rejected({ ...base, [field]: value }, "invalid_request", field)
    })

    it.each(["top_p", "max_tokens"])("%s: 1e999 is a 400", async (field) => {
      await rejected(`{"model":"ws-mock","messages":[{"role":"user","content":"hi"}],"${field}":1e999}`, "invalid_request", field)
    })

    it("the bounds themselves pass and are forwarded unchanged", async () => {
      expect(await forwarded({ ...base, temperature: 0, top_p: 1, max_tokens: 1 })).toMatchObject({ temperature: 0, top_p: 1, max_tokens: 1 })
      expect(await forwarded({ ...base, temperature: 2, top_p: 0 })).toMatchObject({ temperature: 2, top_p: 0 })
    })
  })

  describe("stop and model", () => {
    it("stop: at most 4 sequences of at most 256 characters", async () => {
      const four = ["a", "b", "c", "d".repeat(256)]
      expect((await forwarded({ ...base, stop: four })).stop).toEqual(four)
      await rejected({ ...base, stop: [...four, "e"] }, "invalid_request", "stop")
      await rejected({ ...base, stop: ["a", text(257)] }, "invalid_request", "stop")
      await rejected({ ...base, stop: text(257) }, "invalid_request", "stop")
      await rejected({ ...base, stop: [1] }, "invalid_request", "stop")
    })

    it("stop with half a million entries is rejected by count, not decoded", async () => {
      await rejected({ ...base, stop: Array.from({ length: 500_000 }, () => MARK) }, "invalid_request", "stop")
    })

    it("model: longer than 256 characters is a 400 that does not echo it", async () => {
      await rejected({ ...base, model: text(257) }, "invalid_request", "model")
      await rejected({ ...base, model: 5 }, "invalid_request", "model")
      await rejected({ messages: base.messages }, "invalid_request", "model")
    })
  })

  describe("messages", () => {
    it("at most limits.messages (8) messages", async () => {
      const many = (n: number) => Array.from({ length: n }, (_, i) => user(`m${i}`))
      expect((await forwarded({ ...base, messages: many(8) })).messages).toHaveLength(8)
      const message = await rejected({ ...base, messages: many(9) }, "invalid_messages", "messages")
      expect(message).toContain("8")
    })

    it("at most 4096 content parts and 4096 tool calls over the whole request, counted before decoding", async () => {
      const parts = (n: number) => Array.from({ length: n }, () => ({ type: "text", text: "x" }))
      const split = [{ role: "user", content: parts(2048) }, { role: "user", content: parts(2048) }]
      expect((await forwarded({ ...base, messages: split })).messages[1].content).toHaveLength(2048)
      const over = [{ role: "user", content: parts(2048) }, { role: "user", content: parts(2049) }]
      expect(await rejected({ ...base, messages: over }, "invalid_messages", "4096")).toContain("콘텐츠 파트")
      // Nearly 4 MB of tiny parts: rejected by count, not decoded (decoding 160,000 took 300 ms).
      await rejected({ ...base, messages: [{ role: "user", content: parts(140_000) }] }, "invalid_messages", "4096")
      const calls = (n: number) => Array.from({ length: n }, (_, i) => call("{}", `call_${i}`))
      await rejected({ ...base, messages: [user("hi"), assistant({ tool_calls: calls(4097) })] }, "invalid_messages", "tool_calls")
    })

    const call = (args: string, id = "call_1") => ({ id, type: "function", function: { name: "f", arguments: args } })
    const assistant = (fields: Record<string, unknown>) => ({ role: "assistant", content: null, ...fields })

    it.each([
      ["string content", (t: string) => [user(t)], "messages[0].content"],
      ["a text part", (t: string) => [{ role: "user", content: [{ type: "text", text: "ok" }, { type: "text", text: t }] }], "messages[0].content[1].text"],
      ["a system message", (t: string) => [{ role: "system", content: t }, user("hi")], "messages[0].content"],
      ["reasoning", (t: string) => [user("hi"), assistant({ content: "x", reasoning: t }), user("again")], "messages[1].reasoning"],
      ["tool call arguments", (t: string) => [user("hi"), assistant({ tool_calls: [call(t)] }), { role: "tool", tool_call_id: "call_1", content: "42" }], "messages[1].tool_calls[0].function.arguments"],
      ["tool content", (t: string) => [user("hi"), assistant({ tool_calls: [call("{}")] }), { role: "tool", tool_call_id: "call_1", content: t }], "messages[2].content"]
    ])("each text is at most limits.text_chars (1000): %s", async (_name, messages, path) => {
      await forwarded({ ...base, messages: messages(text(1000)) })
      const message = await rejected({ ...base, messages: messages(text(1001)) }, "invalid_messages", path)
      expect(message).toContain("1000")
    })

    it("image_url.url is at most limits.image_url_chars (2000)", async () => {
      const image = (url: string) => [{ role: "user", content: [{ type: "image_url", image_url: { url } }] }]
      const url = (n: number) => `https://example.com/${MARK}` + "a".repeat(n - 20 - MARK.length)
      await forwarded({ ...base, messages: image(url(2000)) })
      await rejected({ ...base, messages: image(url(2001)) }, "invalid_messages", "messages[0].content[0].image_url.url")
    })

    it("ids and names the client echoes back are at most 256 characters", async () => {
      const long = text(257)
      await rejected(
        { ...base, messages: [user("hi"), assistant({ tool_calls: [call("{}", long)] })] },
        "invalid_messages",
        "messages[1].tool_calls[0].id"
      )
      await rejected(
        { ...base, messages: [user("hi"), { role: "tool", tool_call_id: long, content: "1" }] },
        "invalid_messages",
        "messages[1].tool_call_id"
      )
      const tools = [{ type: "function", function: { name: "f" } }]
      await rejected({ ...base, tools, tool_choice: { type: "function", function: { name: long } } }, "invalid_request", "tool_choice")
    })
  })

  describe("tools", () => {
    it("one tool's serialized size is at most limits.tool_schema_bytes (4096)", async () => {
      const tool = (description: string) => ({ type: "function", function: { name: "t", description, parameters: { type: "object" } } })
      await forwarded({ ...base, tools: [tool("d".repeat(3900))] })
      const message = await rejected({ ...base, tools: [tool("ok"), tool(text(5000))] }, "invalid_request", "tools[1]")
      expect(message).toContain("4096")
    })

    it("more than 128 tools is rejected before decoding them", async () => {
      const tools = Array.from({ length: 10_000 }, () => ({ type: "function", function: { name: MARK } }))
      const message = await rejected({ ...base, tools }, "invalid_request", "tools")
      expect(message).toContain("128")
    })
  })

  describe("errors stay small and Korean", () => {
    it.each([
      ["a text part whose text is a 1 MB object", { type: "text", text: { junk: text(1_000_000) } }],
      ["an unknown part type carrying 1 MB", { type: "audio", data: text(1_000_000) }],
      ["a 1 MB string as a part", text(1_000_000)]
    ])("%s: a small error naming the path", async (_name, part) => {
      await rejected({ ...base, messages: [{ role: "user", content: [part] }] }, "invalid_messages", "messages[0].content")
    })

    it.each([
      ["a missing role", { content: "hi" }, "messages[0]"],
      ["an unknown role", { role: "robot", content: "hi" }, "messages[0]"],
      ["a missing content", { role: "user" }, "messages[0]"],
      ["an image URL that is not https", { role: "user", content: [{ type: "image_url", image_url: { url: `http://${MARK}` } }] }, "messages[0].content"]
    ])("%s: Korean, with the path", async (_name, message, path) => {
      await rejected({ ...base, messages: [message] }, "invalid_messages", path)
    })

    it("a body that is not an object", async () => {
      for (const body of ["[1,2]", "\"text\"", "42", "null"]) {
        const res = await postChat(gw, body)
        const envelope = await expectRejected(gw, res, 400, "invalid_request")
        expect(envelope.error.message).toContain("JSON 객체")
      }
    })
  })
})
