import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"

describe("chat smoke", () => {
  let gw: TestGateway
  const adm = makeUnlimitedAdmission()
  beforeAll(async () => {
    gw = await startGateway({ admission: adm.layer })
  })
  afterAll(() => gw?.stop())

  it("non-streaming", async () => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers: authed(gw.key), body: JSON.stringify({ model: "ws-pro", messages: [{ role: "user", content: "hello there" }] }) })
    const body = await res.json()
    console.log(res.status, JSON.stringify(body), [...res.headers])
    expect(res.status).toBe(200)
  })
  it("streaming", async () => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers: authed(gw.key), body: JSON.stringify({ model: "ws-pro", stream: true, reasoning_effort: "low", messages: [{ role: "user", content: "hello there" }] }) })
    const text = await res.text()
    console.log(res.status, text, [...res.headers])
    expect(res.status).toBe(200)
    expect(adm.stats.open).toBe(0)
  })
})
