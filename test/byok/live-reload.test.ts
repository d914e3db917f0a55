/**
 * The BYOK provider catalog is live server data: an edit of the config file's `byok` section (a provider hidden, a
 * base URL moved, the cap changed) is taken without a restart, like the model catalog, and credentials in use are
 * dispatched to the new base URL. An invalid section is refused and the previous settings stay.
 */
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, newUser } from "../accounts/support.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { type FakeOpenAi, GOOD, startFakeOpenAi } from "./FakeOpenAi.js"
import { eventually } from "../support/Eventually.js"

const BASE = "/api/user/me/byok"


describe("BYOK provider catalog reload", () => {
  let gw: TestGateway
  let first: FakeOpenAi
  let second: FakeOpenAi

  beforeAll(async () => {
    first = await startFakeOpenAi()
    second = await startFakeOpenAi()
    gw = await startGateway({
      configure: (doc) => {
        doc.catalog_reload_seconds = 0.2
        doc.byok = { providers: { openai: { base_url: `${first.origin}/v1` } } }
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await first?.close()
    await second?.close()
  })

  it("hiding a provider, moving a base URL and changing the cap apply without a restart", async () => {
    const u = await newUser(gw)
    const saved = await call(gw, "POST", BASE, {
      key: u.key,
      body: { provider: "openai", secret: `${GOOD}${Crypto.randomBytes(6).toString("hex")}` }
    })
    expect(saved.status, saved.text).toBe(200)
    const chat = () =>
      call(gw, "POST", "/v1/chat/completions", {
        key: u.key,
        body: { model: "@openai/gpt-fake", messages: [{ role: "user", content: "hi" }] }
      })
    expect((await chat()).status).toBe(200)
    expect(first.chatCalls()).toBe(1)

    const before = await call(gw, "GET", BASE, { key: u.key })
    expect(before.body.data.max_per_provider).toBe(5)
    expect(before.body.data.providers.some((p: any) => p.id === "openrouter")).toBe(true)

    gw.rewriteConfig((doc) => {
      doc.byok = {
        max_per_provider: 2,
        providers: { openai: { base_url: `${second.origin}/v1` }, openrouter: { enabled: false } }
      }
    })
    let listed: any
    await eventually(async () => {
      listed = await call(gw, "GET", BASE, { key: u.key })
      return listed.body.data.max_per_provider === 2
    })
    expect(listed.body.data.providers.some((p: any) => p.id === "openrouter")).toBe(false)
    // The saved credential now goes to the new base URL.
    expect((await chat()).status).toBe(200)
    expect(second.chatCalls()).toBe(1)
    expect(first.chatCalls()).toBe(1)

    // An invalid section is refused: the previous settings stay.
    gw.rewriteConfig((doc) => {
      doc.byok = { max_per_provider: "many", providers: { openai: { base_url: `${first.origin}/v1` } } }
    })
    // A valid model-catalog edit in the same file shows the reload ran after the bad edit.
    gw.rewriteConfig((doc) => {
      doc.catalog.models = doc.catalog.models.filter((m: any) => m.id !== "ws-legacy")
    })
    await eventually(async () => {
      const models = await call(gw, "GET", "/v1/models", { key: u.key })
      return !models.body.data.some((m: any) => m.id === "ws-legacy")
    })
    const kept = await call(gw, "GET", BASE, { key: u.key })
    expect(kept.body.data.max_per_provider).toBe(2)
    expect((await chat()).status).toBe(200)
    expect(second.chatCalls()).toBe(2)
  })
})
