/**
 * The Messages and Responses APIs ride the same pipeline as chat: a model with several deployments fails over
 * before the first byte in both formats (rows record api, deployment and attempts), and a BYOK reference through
 * `/v1/messages` goes through the caller's credential.
 */
import Anthropic from "@anthropic-ai/sdk"
import * as Crypto from "node:crypto"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, flushRequestLog, newUser, query } from "../accounts/support.js"
import { type FakeOpenAi, GOOD, startFakeOpenAi } from "../byok/FakeOpenAi.js"
import { type FakeDeployment, providerFor, startFakeDeployment } from "../support/FakeDeployment.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"

describe("Messages and Responses over deployments and BYOK", () => {
  let gw: TestGateway
  let bad: FakeDeployment
  let good: FakeDeployment
  let fake: FakeOpenAi

  beforeAll(async () => {
    bad = await startFakeDeployment("bad")
    good = await startFakeDeployment("good")
    bad.mode = { _tag: "status", status: 503 }
    fake = await startFakeOpenAi()
    gw = await startGateway({
      configure: (doc) => {
        doc.routing = { health: { consecutive_failures: 1_000 } }
        doc.catalog.providers.bad = providerFor(bad)
        doc.catalog.providers.good = providerFor(good)
        doc.catalog.models.push({
          id: "multi",
          owned_by: "test",
          max_input_tokens: 10_000,
          max_output_tokens: 100,
          rate_limit_rpm: 10_000,
          concurrency: 100,
          deployments: [{ provider: "bad", model: "m" }, { provider: "good", model: "m" }]
        })
        doc.byok = { providers: { openai: { base_url: `${fake.origin}/v1` } } }
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await bad?.kill()
    await good?.kill()
    await fake?.close()
  })

  const rows = async (api: string) => {
    await flushRequestLog(gw)
    return query(gw, "SELECT api, deployment, attempts, status FROM request_log WHERE api = $1 AND model_id = 'multi'", [api])
  }

  it("Messages (whole and streamed) fail over to the healthy deployment", async () => {
    const anthropic = new Anthropic({ apiKey: gw.key, baseURL: gw.url, maxRetries: 0 })
    for (let i = 0; i < 10; i++) {
      const message = await anthropic.messages.create({
        model: "multi",
        max_tokens: 50,
        messages: [{ role: "user", content: "hi" }]
      })
      expect(message.content).toEqual([{ type: "text", text: "from good" }])
      const stream = anthropic.messages.stream({ model: "multi", max_tokens: 50, messages: [{ role: "user", content: "hi" }] })
      expect((await stream.finalMessage()).content).toEqual([{ type: "text", text: "from good" }])
    }
    const recorded = await rows("messages")
    expect(recorded).toHaveLength(20)
    expect(recorded.every((r) => r.deployment === "good" && r.status === "success")).toBe(true)
    expect(recorded.filter((r) => r.attempts === 2).length).toBe(bad.requests())
  })

  it("Responses (whole and streamed) fail over to the healthy deployment", async () => {
    const before = bad.requests()
    const openai = new OpenAI({ apiKey: gw.key, baseURL: `${gw.url}/v1`, maxRetries: 0 })
    for (let i = 0; i < 10; i++) {
      const response = await openai.responses.create({ model: "multi", input: "hi", store: false })
      expect(response.output_text).toBe("from good")
      const stream = openai.responses.stream({ model: "multi", input: "hi", store: false })
      expect((await stream.finalResponse()).output_text).toBe("from good")
    }
    const recorded = await rows("responses")
    expect(recorded).toHaveLength(20)
    expect(recorded.every((r) => r.deployment === "good" && r.status === "success")).toBe(true)
    expect(recorded.filter((r) => r.attempts === 2).length).toBe(bad.requests() - before)
  })

  it("a BYOK reference through /v1/messages goes through the caller's credential", async () => {
    const u = await newUser(gw)
    const secret = `${GOOD}msg-${Crypto.randomBytes(6).toString("hex")}`
    const saved = await call(gw, "POST", "/api/user/me/byok", { key: u.key, body: { provider: "openai", secret } })
    expect(saved.status, saved.text).toBe(200)
    const anthropic = new Anthropic({ apiKey: u.key, baseURL: gw.url, maxRetries: 0 })
    const message = await anthropic.messages.create({
      model: "@openai/gpt-fake",
      max_tokens: 50,
      system: "sys",
      messages: [{ role: "user", content: "hi" }]
    })
    expect(message.content).toEqual([{ type: "text", text: "echo:gpt-fake" }])
    const sent = fake.requests.at(-1)!
    expect(sent.headers.authorization).toBe(`Bearer ${secret}`)
    expect(sent.body.messages).toEqual([{ role: "system", content: "sys" }, { role: "user", content: "hi" }])
    await flushRequestLog(gw)
    const recorded = await query(gw, "SELECT api, byok, provider, status FROM request_log WHERE byok AND api = 'messages'")
    expect(recorded).toHaveLength(1)
    expect(recorded[0]).toMatchObject({ api: "messages", byok: true, provider: "openai", status: "success" })
  })
})
