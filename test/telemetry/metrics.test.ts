/**
 * Issue 18 (5): `/metrics` on the operator listener, after real traffic through a mock upstream, read with a strict
 * exposition reader (test/support/Exposition.ts) and, when `promtool` (Prometheus' own checker) is installed,
 * `promtool check metrics`: names, types, label sets and values; label values bounded (catalog ids, `byok`,
 * `unknown`); not served on the public listener.
 */
import * as ChildProcess from "node:child_process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { BoundListeners } from "../../src/http/Server.js"
import { type Family, histograms, parseExposition } from "../support/Exposition.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { addMockModel, readBody, user } from "../inference/helpers.js"

const hasPromtool = ChildProcess.spawnSync("promtool", ["--version"], { stdio: "ignore" }).status === 0

/** Every family the gateway exposes after chat and embeddings traffic, with its type and label names. */
const EXPECTED: ReadonlyArray<readonly [string, string, ReadonlyArray<string>]> = [
  ["gen_ai_client_token_usage", "histogram", ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"]],
  ["gen_ai_server_request_duration_seconds", "histogram", ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"]],
  ["gen_ai_server_time_to_first_token_seconds", "histogram", ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"]],
  ["gen_ai_server_time_per_output_token_seconds", "histogram", ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model"]],
  ["wellspring_requests_total", "counter", ["operation", "model", "status", "code"]],
  ["wellspring_admission_rejections_total", "counter", ["operation", "model", "reason"]],
  ["wellspring_requests_in_flight", "gauge", ["operation", "model"]],
  ["wellspring_pool_remaining_ratio", "histogram", ["pool"]],
  ["wellspring_quota_store_duration_seconds", "histogram", ["operation", "backend"]],
  ["wellspring_request_log_queue_rows", "gauge", []],
  ["wellspring_request_log_dropped_rows_total", "counter", []],
  ["wellspring_key_cache_lookups_total", "counter", ["result"]],
  ["wellspring_key_cache_hit_ratio", "gauge", []],
  ["wellspring_http_requests_working", "gauge", []],
  ["wellspring_http_requests_held", "gauge", []],
  ["wellspring_http_connections_paused", "gauge", []],
  ["wellspring_http_saturated", "gauge", []]
]

const labelNames = (family: Family) =>
  new Set(family.samples.map((s) => Object.keys(s.labels).filter((k) => k !== "le").sort().join(",")))

const value = (family: Family | undefined, labels: Record<string, string>): number | undefined =>
  family?.samples.find((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value

describe("Prometheus /metrics on the operator listener", () => {
  let gw: TestGateway
  let mock: MockUpstream
  let operator: string
  const models = new Set<string>()

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({
      configure: (doc) => {
        doc.listeners = [
          { host: "127.0.0.1", port: 8080, origins: ["inference", "account", "status"] },
          { host: "127.0.0.1", port: 0, origins: ["operator"] }
        ]
        addMockModel(doc, { baseUrl: mock.url })
        addMockModel(doc, { baseUrl: mock.url, id: "ws-tight", model: { rate_limit_rpm: 1 } })
        for (const m of doc.catalog.models) models.add(m.id)
      }
    })
    const { listeners } = await gw.run(BoundListeners)
    expect(listeners[1]!.origins).toEqual(["operator"])
    operator = `http://127.0.0.1:${listeners[1]!.port}`
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  const chat = (body: Record<string, unknown>) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers: authed(gw.key), body: JSON.stringify(body) })

  it("exposes every metric with its type, bounded labels and the values of the traffic", async () => {
    // 1. A stream with cached and reasoning tokens.
    mock.script(
      Behaviour.stream([
        Chunks.role(),
        Chunks.reasoning("thinking"),
        Chunks.content("hello"),
        Chunks.finish("stop"),
        Chunks.usage({ prompt: 120, completion: 9, reasoning: 4, cached: 100 })
      ]),
      // 2. A JSON answer.
      Behaviour.json(Chunks.completion({ content: "hi", usage: { prompt: 7, completion: 3 } })),
      // 3. An upstream failure before the first byte.
      Behaviour.status(500, { error: { message: "boom" } }),
      // 4. ws-tight, admitted once.
      Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 5, completion: 2 } }))
    )
    const streamed = await chat({ model: "ws-mock", stream: true, messages: [user("hi")] })
    expect(streamed.status).toBe(200)
    expect((await readBody(streamed)).text).toContain("[DONE]")
    const json = await chat({ model: "ws-mock", messages: [user("hi")] })
    expect(json.status).toBe(200)
    await json.text()
    const failed = await chat({ model: "ws-mock", messages: [user("hi")] })
    const failedCode = ((await failed.json()) as { error: { code: string } }).error.code
    expect(failed.status).toBeGreaterThanOrEqual(500)
    const tight1 = await chat({ model: "ws-tight", messages: [user("hi")] })
    expect(tight1.status).toBe(200)
    await tight1.text()
    // 5. Refused by admission (RPM 1).
    const tight2 = await chat({ model: "ws-tight", messages: [user("hi")] })
    expect(tight2.status).toBe(429)
    expect(((await tight2.json()) as { error: { code: string } }).error.code).toBe("rate_limited")
    // 6. Models that are not in the catalog (one hostile) become `unknown`, never a label of their own.
    for (const model of ["no-such-model", "evil\"}{le=\"1\n"]) {
      const res = await chat({ model, messages: [user("hi")] })
      expect(res.status).toBeGreaterThanOrEqual(400)
      await res.text()
    }
    // 7. Embeddings on the simulated provider.
    const embedded = await fetch(`${gw.url}/v1/embeddings`, {
      method: "POST",
      headers: authed(gw.key),
      body: JSON.stringify({ model: "ws-embed", input: ["one", "two"] })
    })
    expect(embedded.status).toBe(200)
    await embedded.text()

    const scraped = await fetch(`${operator}/metrics`)
    expect(scraped.status).toBe(200)
    expect(scraped.headers.get("content-type")).toBe("text/plain; version=0.0.4; charset=utf-8")
    const text = await scraped.text()
    const families = parseExposition(text)

    for (const [name, type, labels] of EXPECTED) {
      const family = families.get(name)
      expect(family, `${name} in\n${text}`).toBeDefined()
      expect(family!.type, name).toBe(type)
      expect(family!.help, name).toBeTruthy()
      expect([...labelNames(family!)], name).toEqual([[...labels].sort().join(",")])
    }
    // Nothing else but the image metrics, which appear with the image domain.
    const known = new Set(EXPECTED.map(([name]) => name))
    for (const name of families.keys()) {
      if (!known.has(name)) expect(name, "unexpected family").toMatch(/^wellspring_image_/)
    }

    // Bounded label values: catalog model ids, `byok`, `unknown`; error codes are catalog codes.
    for (const family of families.values()) {
      for (const sample of family.samples) {
        for (const key of ["model", "gen_ai_request_model"]) {
          const model = sample.labels[key]
          if (model !== undefined) expect(models.has(model) || model === "byok" || model === "unknown", model).toBe(true)
        }
        for (const v of Object.values(sample.labels)) expect(v).toMatch(/^[A-Za-z0-9_.:+\-]*$/)
      }
    }

    // Requests by model, status and code.
    const requests = families.get("wellspring_requests_total")
    expect(value(requests, { operation: "chat", model: "ws-mock", status: "success", code: "none" })).toBe(2)
    expect(value(requests, { operation: "chat", model: "ws-mock", status: "failed", code: failedCode })).toBe(1)
    expect(value(requests, { operation: "chat", model: "ws-tight", status: "success" })).toBe(1)
    expect(value(requests, { operation: "chat", model: "ws-tight", status: "failed", code: "rate_limited" })).toBe(1)
    expect(value(requests, { operation: "chat", model: "unknown", status: "failed", code: "model_not_found" })).toBe(2)
    expect(value(requests, { operation: "embeddings", model: "ws-embed", status: "success" })).toBe(1)
    // Rejections by reason; nothing left in flight.
    expect(value(families.get("wellspring_admission_rejections_total"), { model: "ws-tight", reason: "rate_limited" })).toBe(1)
    for (const sample of families.get("wellspring_requests_in_flight")!.samples) expect(sample.value).toBe(0)

    // GenAI token usage by type: the upstream's figures.
    const tokens = histograms(families.get("gen_ai_client_token_usage")!)
    const tokenSum = (model: string, type: string) =>
      tokens.filter((h) => h.labels.gen_ai_request_model === model && h.labels.gen_ai_token_type === type)
        .reduce((n, h) => n + h.sum, 0)
    expect(tokenSum("ws-mock", "input")).toBe(127)
    expect(tokenSum("ws-mock", "output")).toBe(12)
    expect(tokenSum("ws-mock", "cached")).toBe(100)
    expect(tokenSum("ws-mock", "reasoning")).toBe(4)
    expect(tokens.find((h) => h.labels.gen_ai_request_model === "ws-mock")!.labels.gen_ai_provider_name).toBe("mock")
    expect(tokens.find((h) => h.labels.gen_ai_operation_name === "embeddings")!.labels.gen_ai_request_model).toBe("ws-embed")
    // Stream timings only for the stream.
    const ttft = histograms(families.get("gen_ai_server_time_to_first_token_seconds")!)
    expect(ttft.filter((h) => h.labels.gen_ai_request_model === "ws-mock").map((h) => h.count)).toEqual([1])
    const tpot = histograms(families.get("gen_ai_server_time_per_output_token_seconds")!)
    expect(tpot.filter((h) => h.labels.gen_ai_request_model === "ws-mock").map((h) => h.count)).toEqual([1])
    // Duration of every completed request with a provider or not.
    const durations = histograms(families.get("gen_ai_server_request_duration_seconds")!)
    expect(durations.filter((h) => h.labels.gen_ai_request_model === "ws-mock").reduce((n, h) => n + h.count, 0)).toBe(3)

    // Pool standing after each settled pool request (stream, JSON, ws-tight, embeddings), no account labels.
    const pools = histograms(families.get("wellspring_pool_remaining_ratio")!)
    expect(pools.map((h) => [h.labels.pool, h.count]).sort()).toEqual([["session", 4], ["weekly", 4]])
    for (const h of pools) expect(h.sum).toBeGreaterThan(3.9)
    // Quota store: every admission (5 admitted or refused + embeddings) and every settle or refund.
    const store = histograms(families.get("wellspring_quota_store_duration_seconds")!)
    const trips = (operation: string) => store.find((h) => h.labels.operation === operation)?.count ?? 0
    expect(store.every((h) => h.labels.backend === "memory")).toBe(true)
    expect(trips("admit")).toBe(6)
    expect(trips("settle")).toBe(4)
    expect(trips("refund")).toBe(1)

    // Request log and key cache.
    expect(value(families.get("wellspring_request_log_dropped_rows_total"), {})).toBe(0)
    const hits = value(families.get("wellspring_key_cache_lookups_total"), { result: "hit" })!
    const misses = value(families.get("wellspring_key_cache_lookups_total"), { result: "miss" })!
    // Eight requests with the same key: one read from the database, the rest from the cache.
    expect([hits, misses]).toEqual([7, 1])
    expect(value(families.get("wellspring_key_cache_hit_ratio"), {})).toBeCloseTo(hits / (hits + misses), 6)

    if (hasPromtool) {
      const lint = ChildProcess.spawnSync("promtool", ["check", "metrics"], { input: text, encoding: "utf8" })
      expect(lint.status, `${lint.stdout}${lint.stderr}`).toBe(0)
    }
  })

  it("counters only grow between scrapes; the scrape-time counters add what is new", async () => {
    const read = async () => parseExposition(await (await fetch(`${operator}/metrics`)).text())
    const before = await read()
    const res = await fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) })
    await res.text()
    const after = await read()
    const hits = (f: ReadonlyMap<string, Family>) => value(f.get("wellspring_key_cache_lookups_total"), { result: "hit" })!
    expect(hits(after)).toBe(hits(before) + 1)
    for (const [name, family] of before) {
      if (family.type !== "counter") continue
      for (const sample of family.samples) {
        expect(value(after.get(name), sample.labels), name).toBeGreaterThanOrEqual(sample.value)
      }
    }
  })

  it("is not served on the public listener, and the operator listener serves no public route", async () => {
    expect((await fetch(`${gw.url}/metrics`)).status).toBe(404)
    const models = await fetch(`${operator}/v1/models`, { headers: authed(gw.key) })
    expect(models.status).toBe(404)
    await models.text()
  })
})
