import { it } from "vitest"
import { startGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, startMockUpstream } from "../support/MockUpstream.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { addMockModel, postChat, eventually, user } from "./helpers.js"

for (const stream of [true]) {
  it("probe abort " + stream, async () => {
    const adm = makeUnlimitedAdmission()
    const mock = await startMockUpstream()
    const gw = await startGateway({ admission: adm.layer, configure: (doc) => addMockModel(doc, { baseUrl: mock.url, timeouts: { first_token_ms: 400, idle_ms: 400, total_ms: 5_000 } }) })
    mock.script(stream ? Behaviour.hangAfter([Chunks.role(), Chunks.content("partial")]) : Behaviour.hangBeforeHeaders())
    const controller = new AbortController()
    const p = postChat(gw, { model: "ws-mock", messages: [user("hi")], stream }, { signal: controller.signal }).catch(e => e)
    if (stream) { const res = await p; const r = res.body.getReader(); await r.read(); } else await eventually(() => { if (mock.requests.length < 1) throw new Error() })
    controller.abort()
    await p
    await new Promise(r => setTimeout(r, 200))
    const t0 = Date.now(); console.log("STOPSTART", new Date().toISOString())
    await gw.stop()
    console.log("STOP", stream, Date.now() - t0)
    await mock.close()
  }, 120_000)
}
