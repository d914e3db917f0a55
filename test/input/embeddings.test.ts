/**
 * Issue #8 finding 10: `/v1/embeddings` answers `encoding_format` "float" (default) and "base64" (the
 * 1024-dimension vector as little-endian float32, base64-encoded); the official `openai` SDK's default
 * `embeddings.create()` (which asks for base64 and decodes it) works end to end and gets the float answer.
 * Inputs are bounded (count, size); token-array inputs get a clear Korean 400.
 */
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { HANGUL } from "../inference/helpers.js"
import { authed, type TestGateway } from "../support/Gateway.js"
import { type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { expectRejected, startInputGateway } from "./support.js"

const LIMITS = { embedding_inputs: 4, text_chars: 1000 }
const MARK = "QZXW"

const decodeBase64 = (text: string): Array<number> => {
  const bytes = Buffer.from(text, "base64")
  const out: Array<number> = []
  for (let i = 0; i < bytes.length; i += 4) out.push(bytes.readFloatLE(i))
  return out
}

describe("embeddings: encoding formats and bounds", () => {
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

  const post = (body: unknown) =>
    fetch(`${gw.url}/v1/embeddings`, {
      method: "POST",
      headers: authed(gw.key),
      body: typeof body === "string" ? body : JSON.stringify(body)
    })

  const floats = async (input: string | Array<string>): Promise<Array<Array<number>>> => {
    const res = await post({ model: "ws-embed", input })
    expect(res.status).toBe(200)
    const body = (await res.json()) as any
    return body.data.map((d: any) => d.embedding)
  }

  it("float is the default: 1024 numbers per input, in order", async () => {
    const [a, b] = await floats(["one", "two"])
    expect(a).toHaveLength(1024)
    expect(b).toHaveLength(1024)
    expect(a!.every((v) => typeof v === "number")).toBe(true)
    expect(a).not.toEqual(b)
    const explicit = await post({ model: "ws-embed", input: "one", encoding_format: "float" })
    expect(((await explicit.json()) as any).data[0].embedding).toEqual(a)
  })

  it("base64 is the same vector as little-endian float32", async () => {
    const [one, two] = await floats(["one", "two"])
    const res = await post({ model: "ws-embed", input: ["one", "two"], encoding_format: "base64" })
    expect(res.status).toBe(200)
    const body = (await res.json()) as any
    expect(body.data.map((d: any) => d.index)).toEqual([0, 1])
    for (const [i, expected] of [one!, two!].entries()) {
      const encoded = body.data[i].embedding
      expect(typeof encoded).toBe("string")
      expect(Buffer.from(encoded, "base64")).toHaveLength(1024 * 4)
      expect(decodeBase64(encoded)).toEqual(expected.map(Math.fround))
    }
  })

  it("the official openai SDK's default embeddings.create() works and decodes to the float answer", async () => {
    const sent: Array<any> = []
    const client = new OpenAI({
      baseURL: `${gw.url}/v1`,
      apiKey: gw.key,
      maxRetries: 0,
      fetch: (url, init) => {
        sent.push(JSON.parse(String(init?.body)))
        return fetch(url, init)
      }
    })
    const [expected] = await floats("hello from the SDK")
    const result = await client.embeddings.create({ model: "ws-embed", input: "hello from the SDK" })
    // The SDK asked for base64 on its own and decoded it.
    expect(sent.at(-1)).toMatchObject({ encoding_format: "base64" })
    expect(result.data[0]!.embedding).toHaveLength(1024)
    expect(result.data[0]!.embedding).toEqual(expected!.map(Math.fround))
    expect(result.usage.prompt_tokens).toBeGreaterThan(0)

    const explicit = await client.embeddings.create({ model: "ws-embed", input: ["hello from the SDK"], encoding_format: "float" })
    expect(sent.at(-1)).toMatchObject({ encoding_format: "float" })
    expect(explicit.data[0]!.embedding).toEqual(expected)

    // A token-array input is refused in a way the SDK surfaces.
    const refused = await client.embeddings.create({ model: "ws-embed", input: [1, 2, 3] }).then(() => null, (e) => e)
    expect(refused).toBeInstanceOf(OpenAI.BadRequestError)
    expect([refused.status, refused.code]).toEqual([400, "invalid_request"])
    expect(refused.message).toMatch(HANGUL)
  })

  it.each([
    ["an array of token ids", [1, 2, 3]],
    ["an array of token arrays", [[1, 2], [3]]]
  ])("token input (%s) is a Korean 400 saying so", async (_name, input) => {
    const res = await post({ model: "ws-embed", input })
    const body = await expectRejected(gw, res, 400, "invalid_request")
    expect(body.error.message).toContain("토큰 배열")
  })

  it("at most limits.embedding_inputs (4) inputs, each at most limits.text_chars (1000)", async () => {
    const ok = await post({ model: "ws-embed", input: ["a", "b", "c", "d".repeat(1000)] })
    expect(ok.status).toBe(200)
    expect(((await ok.json()) as any).data).toHaveLength(4)
    const many = await post({ model: "ws-embed", input: Array.from({ length: 5_000 }, () => MARK) })
    expect((await expectRejected(gw, many, 400, "invalid_request", [MARK])).error.message).toContain("4")
    const long = await post({ model: "ws-embed", input: ["a", MARK + "x".repeat(1000)] })
    expect((await expectRejected(gw, long, 400, "invalid_request", [MARK])).error.message).toContain("input[1]")
    const single = await post({ model: "ws-embed", input: MARK + "x".repeat(1000) })
    expect((await expectRejected(gw, single, 400, "invalid_request", [MARK])).error.message).toContain("input")
  })

  it.each([
    ["an unknown encoding_format", { model: "ws-embed", input: "a", encoding_format: MARK }, "encoding_format"],
    ["an empty input list", { model: "ws-embed", input: [] }, "input"],
    ["a missing input", { model: "ws-embed" }, "input"],
    ["a mixed input list", { model: "ws-embed", input: ["a", 5] }, "input[1]"],
    ["a 1 MB object as input", { model: "ws-embed", input: { junk: MARK.repeat(250_000) } }, "input"],
    ["a model longer than 256 characters", { model: MARK.repeat(100), input: "a" }, "model"]
  ])("%s: 400 naming the field, small, without the value", async (_name, body, field) => {
    const res = await post(body)
    const envelope = await expectRejected(gw, res, 400, "invalid_request", [MARK])
    expect(envelope.error.message).toContain(field)
  })

  it("a chat model is model_not_embedding; an unknown one model_not_found", async () => {
    await expectRejected(gw, await post({ model: "ws-pro", input: "a" }), 400, "model_not_embedding")
    await expectRejected(gw, await post({ model: "nope", input: "a", encoding_format: "base64" }), 400, "model_not_found")
  })
})
