/**
 * The `routing` section reloads live, like the catalog: an edit of the ejection threshold applies to the next
 * requests, while the circuits keep their state (an open deployment stays open, a failure streak counts on); an
 * invalid edit is refused and the previous settings stay.
 */
import { Effect } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import { LiveCatalog } from "../../src/config/Live.js"
import { seeded } from "../../src/deployments/Balancer.js"
import { Deployments } from "../../src/deployments/Router.js"
import { type FakeDeployment, providerFor, startFakeDeployment } from "../support/FakeDeployment.js"
import { authed, type ConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

const configure = (ups: ReadonlyArray<FakeDeployment>, consecutive: number) => (doc: ConfigDoc) => {
  doc.abuse = { burst: 100_000, window_seconds: 10, cooldown_seconds: 60 }
  doc.limits = { ...doc.limits, failed_requests_per_minute: 100_000 }
  doc.routing = {
    health: { consecutive_failures: consecutive, failure_rate: 1, min_requests: 1_000, open_seconds: 600 },
    failover: { max_attempts: 3 }
  }
  for (const up of ups) doc.catalog.providers[up.name] = providerFor(up)
  doc.catalog.models.push({
    id: "multi",
    owned_by: "test",
    max_input_tokens: 10_000,
    max_output_tokens: 100,
    rate_limit_rpm: 100_000,
    concurrency: 1_000,
    // a and b first (priority 0), c only while neither of them is available or both were tried.
    deployments: [
      { provider: "a", model: "a-model" },
      { provider: "b", model: "b-model" },
      { provider: "c", model: "c-model", priority: 1 }
    ]
  })
}

const chat = (gw: TestGateway) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: authed(gw.key),
    body: JSON.stringify({ model: "multi", messages: [{ role: "user", content: "hi" }] })
  }).then(async (r) => ({ status: r.status, text: await r.text() }))

const states = (gw: TestGateway) =>
  gw.run(Effect.gen(function*() {
    const deployments = yield* Deployments
    const catalog = yield* LiveCatalog
    const all = yield* deployments.status(catalog.current().catalog.models)
    return Object.fromEntries(
      all.filter((d) => d.model === "multi").map((d) => [d.deployment, { state: d.state, streak: d.consecutiveFailures }])
    )
  }))

const reload = (gw: TestGateway) => gw.run(Effect.flatMap(LiveCatalog, (catalog) => catalog.reload))

describe("live routing settings", () => {
  it("a lower consecutive_failures applies to the next requests; open circuits and streaks survive the reload", async () => {
    const ups = await Promise.all(["a", "b", "c"].map((n) => startFakeDeployment(n)))
    cleanups.push(() => Promise.all(ups.map((u) => u.kill())))
    const [a, b, c] = ups as [FakeDeployment, FakeDeployment, FakeDeployment]
    const lines: Array<string> = []
    const gw = await startGateway({
      configure: configure(ups, 4),
      deploymentRandom: seeded(3),
      logSink: (line) => void lines.push(line)
    })
    cleanups.push(() => gw.stop())

    // a fails until the boot threshold (4 in a row) ejects it.
    a.mode = { _tag: "status", status: 500 }
    while (a.requests() < 4) expect((await chat(gw)).status).toBe(200)
    expect((await states(gw)).a?.state).toBe("open")

    // b fails once: a streak of 1, far from 4.
    b.mode = { _tag: "status", status: 500 }
    const healthyB = b.requests()
    while (b.requests() < healthyB + 1) expect((await chat(gw)).status).toBe(200)
    expect((await states(gw)).b).toEqual({ state: "closed", streak: 1 })

    // The threshold drops to 2.
    gw.rewriteConfig((doc) => {
      doc.routing.health.consecutive_failures = 2
    })
    expect(await reload(gw)).toBe(true)
    expect(lines.some((l) => l.includes("routing settings reloaded"))).toBe(true)
    expect(lines.some((l) => l.includes("sections read only at boot"))).toBe(false)
    const after = await states(gw)
    expect(after.a?.state).toBe("open")
    expect(after.b).toEqual({ state: "closed", streak: 1 })

    // b's next failure is its second in a row: ejected under the new threshold (the old one needed two more).
    const seenByB = b.requests()
    while (b.requests() < seenByB + 1) expect((await chat(gw)).status).toBe(200)
    expect((await states(gw)).b?.state).toBe("open")
    const [seenA, seenB, seenC] = [a.requests(), b.requests(), c.requests()]
    for (let i = 0; i < 10; i++) expect(await chat(gw)).toMatchObject({ status: 200, text: expect.stringContaining("from c") })
    expect([a.requests(), b.requests(), c.requests()]).toEqual([seenA, seenB, seenC + 10])
  }, 60_000)

  it("an invalid routing edit is refused and the previous settings stay", async () => {
    const ups = await Promise.all(["a", "b", "c"].map((n) => startFakeDeployment(n)))
    cleanups.push(() => Promise.all(ups.map((u) => u.kill())))
    const [a, b] = ups as [FakeDeployment, FakeDeployment, FakeDeployment]
    const lines: Array<string> = []
    const gw = await startGateway({
      configure: configure(ups, 3),
      deploymentRandom: seeded(5),
      logSink: (line) => void lines.push(line)
    })
    cleanups.push(() => gw.stop())

    gw.rewriteConfig((doc) => {
      doc.routing.health.consecutive_failures = 1
      doc.routing.health.consecutive_failurez = 1
    })
    expect(await reload(gw)).toBe(false)
    expect(lines.some((l) => l.includes("routing settings reload rejected") && l.includes("consecutive_failurez"))).toBe(true)

    // Still 3: two failures in a row leave a closed; the third ejects it.
    a.mode = { _tag: "status", status: 500 }
    b.mode = { _tag: "status", status: 500 }
    while (a.requests() < 2) expect((await chat(gw)).status).toBe(200)
    expect((await states(gw)).a).toEqual({ state: "closed", streak: 2 })
    while (a.requests() < 3) expect((await chat(gw)).status).toBe(200)
    expect((await states(gw)).a?.state).toBe("open")
  }, 60_000)
})
