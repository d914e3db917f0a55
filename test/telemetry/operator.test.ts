/**
 * The `/metrics` route alone, with the services it reads at scrape time stubbed: the image metrics appear once an
 * `ImageQueue` is provided (the image domain is optional), a queue that does not answer does not hold the scrape,
 * and the image wait histogram is recorded through the recorder.
 */
import { Context, Effect } from "effect"
import { HttpRouter } from "effect/http"
import { describe, expect, it } from "vitest"
import { Auth } from "../../src/auth/Auth.js"
import { indexCatalog } from "../../src/config/Live.js"
import { loadConfig } from "../../src/config/GatewayConfig.js"
import { Lifecycle } from "../../src/http/Lifecycle.js"
import { ImageQueue } from "../../src/images/Contracts.js"
import { operatorRouter } from "../../src/status/Operator.js"
import { RequestLog } from "../../src/telemetry/RequestLog.js"
import { CurrentTelemetry, Telemetry } from "../../src/telemetry/Telemetry.js"
import { histograms, parseExposition } from "../support/Exposition.js"

const { config } = loadConfig({ path: "config/gateway.yaml", env: {} })
const view = indexCatalog(config.catalog, 1)

const scrape = async (queue: Context.Service.Shape<typeof ImageQueue> | null, telemetry = new Telemetry(true, false, () => view, undefined, undefined, "memory")) => {
  const { handler, dispose } = HttpRouter.toWebHandler(operatorRouter, { disableLogger: true })
  let context = Context.make(CurrentTelemetry, telemetry).pipe(
    Context.add(RequestLog, { pending: () => 3, dropped: () => 2 } as unknown as Context.Service.Shape<typeof RequestLog>),
    Context.add(Auth, { keyCache: () => ({ hits: 9, misses: 1 }) } as unknown as Context.Service.Shape<typeof Auth>),
    Context.add(Lifecycle, {
      draining: () => false,
      openRequests: () => 7,
      busy: () => ({ working: 4, held: 6, paused: 2, saturated: true })
    })
  )
  if (queue !== null) context = Context.add(context, ImageQueue, queue)
  try {
    const started = Date.now()
    const res = await handler(new Request("http://operator/metrics"), context as Context.Context<Auth | RequestLog | Lifecycle>)
    expect(res.status).toBe(200)
    return { families: parseExposition(await res.text()), ms: Date.now() - started }
  } finally {
    await dispose()
  }
}

const queue = (waiting: Effect.Effect<number>): Context.Service.Shape<typeof ImageQueue> => ({
  run: () => Effect.die("not used"),
  waiting,
  workersOnline: Effect.succeed(2)
})

describe("/metrics route", () => {
  it("reads the request log and the key cache at scrape time", async () => {
    const { families } = await scrape(null)
    expect(families.get("wellspring_request_log_queue_rows")!.samples[0]!.value).toBe(3)
    expect(families.get("wellspring_request_log_dropped_rows_total")!.samples[0]!.value).toBe(2)
    expect(families.get("wellspring_key_cache_hit_ratio")!.samples[0]!.value).toBeCloseTo(0.9)
    // The busy gate's figures, read from the listeners' lifecycle.
    expect(families.get("wellspring_http_requests_working")!.samples[0]!.value).toBe(4)
    expect(families.get("wellspring_http_requests_held")!.samples[0]!.value).toBe(6)
    expect(families.get("wellspring_http_connections_paused")!.samples[0]!.value).toBe(2)
    expect(families.get("wellspring_http_saturated")!.samples[0]!.value).toBe(1)
    // No image domain: no image gauges.
    expect([...families.keys()].filter((n) => n.startsWith("wellspring_image_"))).toEqual([])
  })

  it("shows the image queue once the image domain provides it, and the wait time it records", async () => {
    const telemetry = new Telemetry(true, false, () => view, undefined, undefined, "memory")
    telemetry.imageWait(4.2)
    telemetry.imageWait(0.3)
    const { families } = await scrape(queue(Effect.succeed(5)), telemetry)
    expect(families.get("wellspring_image_queue_waiting_jobs")).toMatchObject({ type: "gauge" })
    expect(families.get("wellspring_image_queue_waiting_jobs")!.samples[0]!.value).toBe(5)
    expect(families.get("wellspring_image_workers_online")!.samples[0]!.value).toBe(2)
    const [wait] = histograms(families.get("wellspring_image_queue_wait_seconds")!)
    expect([wait!.count, wait!.sum]).toEqual([2, 4.5])
  })

  it("a queue that does not answer does not hold the scrape (1 s bound)", async () => {
    const { families, ms } = await scrape(queue(Effect.never))
    expect(ms).toBeLessThan(3_000)
    expect(families.has("wellspring_image_queue_waiting_jobs")).toBe(false)
    expect(families.has("wellspring_request_log_queue_rows")).toBe(true)
  })
})

describe("metric labels", () => {
  it("are catalog ids, `byok` for a user's own credential, `unknown` for anything else", () => {
    const telemetry = new Telemetry(true, false, () => view, undefined, undefined, "memory")
    expect(telemetry.modelLabel("ws-pro", false)).toBe("ws-pro")
    expect(telemetry.modelLabel("@openai/gpt-4o", true)).toBe("byok")
    expect(telemetry.modelLabel("gpt-4o", false)).toBe("unknown")
    expect(telemetry.modelLabel("ws-pro\"}", false)).toBe("unknown")
    // One series object per pair, made once.
    expect(telemetry.series("chat", "ws-pro")).toBe(telemetry.series("chat", "ws-pro"))
    // The default recorder (no gateway) records nothing.
    expect(Telemetry.disabled.enabled).toBe(false)
  })
})
