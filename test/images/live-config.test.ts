/**
 * The `images` section reloads live: a changed switch or threshold is seen at the next reload; an invalid
 * section is refused and the previous one stays.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { LiveImages } from "../../src/images/LiveConfig.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"

let gw: TestGateway
beforeAll(async () => {
  gw = await startGateway({ configure: (doc) => void (doc.images = { congestion_threshold: 7 }) })
})
afterAll(() => gw?.stop())

const current = () => gw.run(Effect.map(LiveImages, (live) => live.current()))
const reload = () => gw.run(Effect.flatMap(LiveImages, (live) => live.reload))

describe("images settings", () => {
  it("starts from the file and follows edits; a bad section keeps the previous one", async () => {
    expect((await current()).congestion_threshold).toBe(7)
    gw.rewriteConfig((doc) => void (doc.images = { congestion_threshold: 9, maintenance: true }))
    expect(await reload()).toBe(true)
    expect(await current()).toMatchObject({ congestion_threshold: 9, maintenance: true })
    gw.rewriteConfig((doc) => void (doc.images = { congestion_threshold: -1, typo_field: 1 }))
    expect(await reload()).toBe(false)
    expect(await current()).toMatchObject({ congestion_threshold: 9, maintenance: true })
  })
})
