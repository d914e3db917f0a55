/**
 * The chat rules on `POST /v1/responses` (it runs on the same pipeline): RPM (429 with `retry-after`, OpenAI's
 * envelope), `input_too_long` measured over the stored conversation a `previous_response_id` replays, a BYOK
 * reference (`@provider/model`) through the caller's credential, with rows that say `api = responses`; and
 * `/api/user/me/requests` keeps its shape.
 */
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, flushRequestLog, newUser, query } from "../accounts/support.js"
import { type FakeOpenAi, GOOD, startFakeOpenAi } from "../byok/FakeOpenAi.js"
import { addMockModel } from "../inference/helpers.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"

describe("Responses on the pipeline's gates", () => {
  let gw: TestGateway
  let mock: MockUpstream
  let fake: FakeOpenAi

  const respond = (key: string, body: unknown) => call(gw, "POST", "/v1/responses", { key, body })

  beforeAll(async () => {
    mock = await startMockUpstream()
    fake = await startFakeOpenAi()
    gw = await startGateway({
      configure: (doc) => {
        addMockModel(doc, { id: "ws-rpm", baseUrl: mock.url, model: { rate_limit_rpm: 1 } })
        addMockModel(doc, { id: "ws-small", provider: "mock2", baseUrl: mock.url, model: { max_input_tokens: 60 } })
        doc.byok = { providers: { openai: { base_url: `${fake.origin}/v1` } } }
        doc.catalog.aliases = { "gpt-5-codex": "ws-pro" }
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
    await fake?.close()
  })

  it("an alias (what Codex asks for) resolves to its catalog model, and Codex's default effort maps to it", async () => {
    const u = await newUser(gw)
    const r = await respond(u.key, { model: "gpt-5-codex", input: "Plan the change", reasoning: { effort: "medium" } })
    expect(r.status, r.text).toBe(200)
    expect(r.body.model).toBe("ws-pro")
    expect(r.body.reasoning).toEqual({ effort: "medium", summary: null })
    // ws-pro lists [none, low, high]: medium runs as low (12 words of simulated reasoning).
    expect(r.body.output.map((item: any) => item.type)).toEqual(["reasoning", "message"])
    expect(r.body.output[0].content[0].text.split(" ").length).toBeLessThan(30)
    const refused = await respond(u.key, { model: "ws-lite", input: "x", reasoning: { effort: "high" } })
    expect([refused.status, refused.body.error.code]).toEqual([400, "invalid_reasoning_effort"])
    const dropped = await respond(u.key, { model: "ws-lite", input: "x", reasoning: { effort: "none" } })
    expect(dropped.status).toBe(200)
  })

  it("RPM: the second request in the minute is 429 rate_limited with retry-after", async () => {
    const u = await newUser(gw)
    const first = await respond(u.key, { model: "ws-rpm", input: "one" })
    expect(first.status).toBe(200)
    const second = await respond(u.key, { model: "ws-rpm", input: "two" })
    expect(second.status).toBe(429)
    expect(second.body.error).toMatchObject({ code: "rate_limited", type: "rate_limit_error" })
    expect(Number(second.headers.get("retry-after"))).toBeGreaterThan(0)
  })

  it("input_too_long counts the stored conversation replayed by previous_response_id", async () => {
    const u = await newUser(gw)
    const words = (n: number) => Array.from({ length: n }, (_, i) => `word${i}`).join(" ")
    const first = await respond(u.key, { model: "ws-small", input: words(15) })
    expect(first.status, first.text).toBe(200)
    // Alone this input fits; after the stored turn it does not.
    const alone = await respond(u.key, { model: "ws-small", input: words(15), store: false })
    expect(alone.status).toBe(200)
    const continued = await respond(u.key, { model: "ws-small", input: words(15), previous_response_id: first.body.id })
    expect(continued.status).toBe(400)
    expect(continued.body.error.code).toBe("input_too_long")
  })

  it("a BYOK reference goes through the caller's credential; the row says api responses", async () => {
    const u = await newUser(gw)
    const secret = `${GOOD}resp-${Crypto.randomBytes(6).toString("hex")}`
    const saved = await call(gw, "POST", "/api/user/me/byok", { key: u.key, body: { provider: "openai", secret } })
    expect(saved.status, saved.text).toBe(200)
    const r = await respond(u.key, { model: "@openai/gpt-fake", input: "hi", instructions: "sys" })
    expect(r.status, r.text).toBe(200)
    expect(r.body.output[0].content[0].text).toBe("echo:gpt-fake")
    expect(r.body.model).toBe("@openai/gpt-fake")
    const sent = fake.requests.at(-1)!
    expect(sent.headers.authorization).toBe(`Bearer ${secret}`)
    expect(sent.body.messages).toEqual([{ role: "system", content: "sys" }, { role: "user", content: "hi" }])
    await flushRequestLog(gw)
    const rows = await query(gw, "SELECT api, byok, provider, status FROM request_log WHERE id = $1", [
      Number(r.headers.get("x-request-id"))
    ])
    expect(rows[0]).toMatchObject({ api: "responses", byok: true, provider: "openai", status: "success" })
    const recent = await call(gw, "GET", "/api/user/me/requests", { key: u.key })
    expect(recent.status).toBe(200)
    expect(recent.body.requests[0]).not.toHaveProperty("api")
    expect(recent.body.requests[0]).toMatchObject({ byok: true })
  })
})
