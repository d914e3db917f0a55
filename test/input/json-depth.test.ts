/**
 * Issue #8 finding 3: JSON nested 100,000 levels (the body, inside `tools[].function.parameters`, inside
 * `content`, inside an unknown field) is a 400 `invalid_request` naming the depth limit, never a 500; the
 * depth is read off the text before parsing, skipping string contents.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fc from "fast-check"
import { exceedsJsonDepth, makeDepthScanner } from "../../src/http/Json.js"
import { chatUrl, postChat, user } from "../inference/helpers.js"
import { authed, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { expectRejected, nestedArrays, nestedObjects, startInputGateway } from "./support.js"

const DEEP = 100_000
const hi = JSON.stringify([user("hi")])

describe("JSON depth", () => {
  let gw: TestGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startInputGateway({ mock })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  const answerOk = () => mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 1, completion: 1 } })))

  it.each([
    ["the whole body", nestedArrays(DEEP)],
    ["tools[].function.parameters", `{"model":"ws-mock","messages":${hi},"tools":[{"type":"function","function":{"name":"t","parameters":{"p":${nestedArrays(DEEP)}}}}]}`],
    ["a message's content", `{"model":"ws-mock","messages":[{"role":"user","content":${nestedArrays(DEEP)}}]}`],
    ["an unknown field", `{"model":"ws-mock","messages":${hi},"extra":${nestedArrays(DEEP, "{}")}}`],
    ["objects, not arrays", `{"model":"ws-mock","messages":${hi},"extra":${"{\"a\":".repeat(DEEP)}1${"}".repeat(DEEP)}}`]
  ])("100,000 levels in %s: 400 invalid_request naming the limit, nothing forwarded", async (_name, body) => {
    const before = mock.requests.length
    const res = await postChat(gw, body)
    const envelope = await expectRejected(gw, res, 400, "invalid_request")
    expect(envelope.error.message).toContain("64")
    expect(mock.requests.length).toBe(before)
  })

  it.each([
    ["the whole body", nestedArrays(DEEP)],
    ["an input", `{"model":"ws-embed","input":${nestedArrays(DEEP, "\"x\"")}}`]
  ])("embeddings: 100,000 levels in %s is a 400", async (_name, body) => {
    const res = await fetch(`${gw.url}/v1/embeddings`, { method: "POST", headers: authed(gw.key), body })
    await expectRejected(gw, res, 400, "invalid_request")
  })

  it("the limit is exact: 64 levels pass, 65 are rejected (unknown fields are stripped, not forwarded)", async () => {
    answerOk()
    // The body object is level 1, so 63 arrays inside it make 64.
    const ok = await postChat(gw, `{"model":"ws-mock","messages":${hi},"extra":${nestedArrays(63)}}`)
    expect(ok.status, await ok.clone().text()).toBe(200)
    await ok.text()
    expect(mock.requests.at(-1)!.body).not.toHaveProperty("extra")
    const over = await postChat(gw, `{"model":"ws-mock","messages":${hi},"extra":${nestedArrays(64)}}`)
    await expectRejected(gw, over, 400, "invalid_request")
  })

  it("brackets and escaped quotes inside strings do not count", async () => {
    answerOk()
    const tricky = "[{".repeat(20_000) + "\\\"[[\"" + "\\".repeat(3) + "{".repeat(1000)
    const res = await postChat(gw, { model: "ws-mock", messages: [user(tricky)] })
    expect(res.status, (await res.clone().text()).slice(0, 300)).toBe(200)
    await res.text()
    expect(mock.requests.at(-1)!.body.messages[0].content).toBe(tricky)
  })

  it("tool parameters deeper than limits.tool_schema_depth (16): 400 naming the path; 16 levels pass", async () => {
    const tool = (depth: number) => ({ type: "function", function: { name: "t", parameters: nestedObjects(depth - 1, {}) } })
    answerOk()
    const ok = await postChat(gw, { model: "ws-mock", messages: [user("hi")], tools: [tool(16)] })
    expect(ok.status, await ok.clone().text()).toBe(200)
    await ok.text()
    const res = await postChat(gw, { model: "ws-mock", messages: [user("hi")], tools: [tool(1), tool(17)] })
    const envelope = await expectRejected(gw, res, 400, "invalid_request")
    expect(envelope.error.message).toContain("tools[1]")
    expect(envelope.error.message).toContain("parameters")
    expect(envelope.error.message).toContain("16")
  })

  it("a valid request afterwards is answered", async () => {
    answerOk()
    const res = await fetch(chatUrl(gw), { method: "POST", headers: authed(gw.key), body: `{"model":"ws-mock","messages":${hi}}` })
    expect(res.status).toBe(200)
    expect(((await res.json()) as any).choices[0].message.content).toBe("ok")
  })
})

describe("exceedsJsonDepth", () => {
  it.each([
    ["flat", "{\"a\":1}", 1, false],
    ["one too deep", "{\"a\":[1]}", 1, true],
    ["brackets in a string", "{\"a\":\"[[[[{{{{\"}", 1, false],
    ["an escaped quote does not end the string", "{\"a\":\"\\\"[[[[\"}", 1, false],
    ["an escaped backslash does end it", "{\"a\":\"\\\\\",\"b\":[[1]]}", 2, true],
    ["an unterminated string", "[\"[[[[[", 1, false],
    ["not JSON at all", "[[[[", 3, true]
  ])("%s", (_name, text, max, expected) => {
    expect(exceedsJsonDepth(text, max)).toBe(expected)
  })
})

describe("makeDepthScanner", () => {
  /** Feeds `text` in pieces cut at `cuts`; whether any piece reported the depth passed. */
  const scanInPieces = (text: string, max: number, cuts: ReadonlyArray<number>) => {
    const feed = makeDepthScanner(max)
    let from = 0
    for (const cut of [...cuts].sort((a, b) => a - b)) {
      if (feed(text.slice(from, cut))) return true
      from = cut
    }
    return feed(text.slice(from))
  }

  it("agrees with exceedsJsonDepth however the text is cut (escapes and quotes split across pieces)", () => {
    // Strings heavy in backslashes and quotes, so that cuts fall between a backslash and what it escapes.
    const piece = fc.constantFrom("[", "]", "{", "}", "\"", "\\", "\\\\", "\\\"", "a", ",", ":")
    fc.assert(fc.property(
      fc.array(piece, { maxLength: 60 }).map((parts) => parts.join("")),
      fc.integer({ min: 0, max: 6 }),
      fc.array(fc.nat(), { maxLength: 8 }),
      (text, max, rawCuts) => {
        const cuts = rawCuts.map((c) => c % (text.length + 1))
        expect(scanInPieces(text, max, cuts)).toBe(exceedsJsonDepth(text, max))
      }
    ), { numRuns: 3000 })
  })

  it("answers at the first piece past the depth, without the rest", () => {
    const feed = makeDepthScanner(64)
    expect(feed("[".repeat(60))).toBe(false)
    expect(feed("[".repeat(10))).toBe(true)
  })
})
