import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startGateway, type TestGateway } from "./support/Gateway.js"

describe("embedded gateway boots", () => {
  let gw: TestGateway
  beforeAll(async () => {
    gw = await startGateway()
  })
  afterAll(() => gw?.stop())

  it("serves /v1/models with the dev key and a request id", async () => {
    const res = await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${gw.key}` } })
    expect(res.status).toBe(200)
    expect(res.headers.get("x-wellspring-request-id")).toMatch(/^req_/)
    const body = await res.json() as { data: Array<{ id: string }> }
    expect(body.data.map((m) => m.id)).not.toContain("ws-legacy")
  })
})
