/**
 * Issue 18 (6): OpenTelemetry traces when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. A local OTLP/HTTP receiver started
 * here collects what `effect`'s OTLP exporter sends: from the real gateway process (OTLP/JSON), a request's server
 * span (continuing the caller's `traceparent`) with children for auth, admission, the upstream call (`gen_ai.*`
 * attributes) and the settlement; probes are not traced. In process: protobuf by default, and the settings read from
 * the environment (off unless configured).
 */
import { Effect, Layer, ManagedRuntime } from "effect"
import * as Fs from "node:fs"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Yaml from "yaml"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Tracing from "../../src/telemetry/Tracing.js"
import { cleanEnv, closedPort, type Running, startTs } from "../foundation/spawn.js"
import { eventually } from "../support/Eventually.js"
import { authed, defaultConfigDoc } from "../support/Gateway.js"
import { readBody, user } from "../inference/helpers.js"

const enabled = Effect.gen(function*() {
  return yield* Tracing.TracingEnabled
})

interface Received {
  readonly path: string
  readonly contentType: string | undefined
  readonly body: Buffer
}

/** A tiny OTLP/HTTP receiver: records every POST and answers 200 `{}`. */
const startReceiver = async () => {
  const received: Array<Received> = []
  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      received.push({ path: req.url ?? "", contentType: req.headers["content-type"], body: Buffer.concat(chunks) })
      res.writeHead(200, { "content-type": "application/json" }).end("{}")
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    received,
    close: () => new Promise<void>((resolve) => server.close(() => resolve()))
  }
}

interface JsonSpan {
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly name: string
  readonly kind: number
  readonly attributes: ReadonlyArray<{ readonly key: string; readonly value: Record<string, unknown> }>
}

const spansOf = (received: ReadonlyArray<Received>): Array<JsonSpan & { service: string }> =>
  received.filter((r) => r.path === "/v1/traces").flatMap((r) => {
    const data = JSON.parse(r.body.toString("utf8")) as {
      resourceSpans: Array<{
        resource: { attributes: Array<{ key: string; value: { stringValue?: string } }> }
        scopeSpans: Array<{ spans: Array<JsonSpan> }>
      }>
    }
    return data.resourceSpans.flatMap((rs) => {
      const service = rs.resource.attributes.find((a) => a.key === "service.name")?.value.stringValue ?? ""
      return rs.scopeSpans.flatMap((ss) => ss.spans.map((span) => ({ ...span, service })))
    })
  })

const attribute = (span: JsonSpan, key: string): unknown => {
  const value = span.attributes.find((a) => a.key === key)?.value
  return value === undefined ? undefined : Object.values(value)[0]
}

/** OTLP span kinds. */
const SERVER = 2
const CLIENT = 3

describe("OTLP traces from the real process", () => {
  let receiver: Awaited<ReturnType<typeof startReceiver>>
  let gateway: Running | undefined
  let dir: string
  let url: string
  let key: string

  beforeAll(async () => {
    receiver = await startReceiver()
    dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-otlp-"))
    const configPath = Path.join(dir, "gateway.yaml")
    Fs.writeFileSync(configPath, Yaml.stringify(defaultConfigDoc()))
    const port = await closedPort()
    gateway = startTs("src/main.ts", [], cleanEnv({
      WELLSPRING_CONFIG: configPath,
      WELLSPRING_PORT: String(port),
      WELLSPRING_DATA_DIR: Path.join(dir, "data"),
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_BSP_SCHEDULE_DELAY: "100"
    }))
    key = (await gateway.waitFor(/^API key: (\S+)$/m, 120_000))[1]!
    await gateway.waitFor(/ready in \d+ ms/)
    url = `http://127.0.0.1:${port}`
  })
  afterAll(async () => {
    await gateway?.stop(10_000)
    await receiver?.close()
    if (dir) Fs.rmSync(dir, { recursive: true, force: true })
  })

  it("exports a request's server span with auth, admission, upstream (gen_ai.*) and settle children", async () => {
    const traceId = "4bf92f3577b34da6a3ce929d0e0e4736"
    const callerSpan = "00f067aa0ba902b7"
    const probe = await fetch(`${url}/healthz`)
    expect(probe.status).toBe(200)
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: authed(key, { traceparent: `00-${traceId}-${callerSpan}-01` }),
      body: JSON.stringify({ model: "ws-pro", stream: true, messages: [user("hello")] })
    })
    expect(res.status).toBe(200)
    expect((await readBody(res)).text).toContain("[DONE]")

    let trace: Array<JsonSpan & { service: string }> = []
    await eventually(() => {
      trace = spansOf(receiver.received).filter((s) => s.traceId === traceId)
      const names = new Set(trace.map((s) => s.name))
      return names.has("wellspring.settle") && names.has("chat ws-pro") && trace.some((s) => s.kind === SERVER)
    }, { timeoutMs: 15_000, what: "the request's spans at the receiver" })
    expect(receiver.received.every((r) => r.contentType?.startsWith("application/json"))).toBe(true)
    expect(trace.every((s) => s.service === "wellspring")).toBe(true)

    // The server span continues the caller's trace.
    const server = trace.find((s) => s.kind === SERVER)!
    expect(server, JSON.stringify(trace.map((s) => s.name))).toBeDefined()
    expect(server.parentSpanId).toBe(callerSpan)
    expect(attribute(server, "http.response.status_code")).toBe(200)
    // Its children: auth, admission, the upstream call, the settlement.
    const child = (name: string) => {
      const span = trace.find((s) => s.name === name)
      expect(span, `${name} in ${JSON.stringify(trace.map((s) => s.name))}`).toBeDefined()
      expect(span!.parentSpanId, name).toBe(server.spanId)
      return span!
    }
    child("wellspring.auth")
    const admission = child("wellspring.admission")
    expect(attribute(admission, "gen_ai.request.model")).toBe("ws-pro")
    const upstream = child("chat ws-pro")
    expect(upstream.kind).toBe(CLIENT)
    expect(attribute(upstream, "gen_ai.operation.name")).toBe("chat")
    expect(attribute(upstream, "gen_ai.provider.name")).toBe("sim")
    expect(attribute(upstream, "gen_ai.request.model")).toBe("ws-pro")
    expect(Number(attribute(upstream, "gen_ai.usage.input_tokens"))).toBeGreaterThan(0)
    expect(Number(attribute(upstream, "gen_ai.usage.output_tokens"))).toBeGreaterThan(0)
    expect(attribute(upstream, "wellspring.status")).toBe("success")
    expect(attribute(child("wellspring.settle"), "wellspring.operation")).toBe("settle")

    // Probes make no spans; no header (the API key) is recorded.
    const all = spansOf(receiver.received)
    expect(all.some((s) => attribute(s, "url.path") === "/healthz")).toBe(false)
    expect(JSON.stringify(all)).not.toContain(key)
  })
})

describe("tracing settings and the exporter in process", () => {
  it("is off unless an endpoint is configured, and names a bad variable", () => {
    expect(Tracing.tracingSettings({})).toBeNull()
    expect(Tracing.tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_SDK_DISABLED: "true" })).toBeNull()
    expect(Tracing.tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318", OTEL_TRACES_EXPORTER: "none" })).toBeNull()
    expect(Tracing.tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318/" })).toMatchObject({
      url: "http://c:4318/v1/traces",
      protocol: "http/protobuf",
      serviceName: "wellspring"
    })
    expect(Tracing.tracingSettings({
      OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "https://c/custom",
      OTEL_EXPORTER_OTLP_HEADERS: "authorization=Bearer%20x, x-tenant=a",
      OTEL_SERVICE_NAME: "gw-eu"
    })).toMatchObject({
      url: "https://c/custom",
      headers: { authorization: "Bearer x", "x-tenant": "a" },
      serviceName: "gw-eu"
    })
    expect(() => Tracing.tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "c:4318" })).toThrow(/OTEL_EXPORTER_OTLP_ENDPOINT/)
    expect(() => Tracing.tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" }))
      .toThrow(/OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported/)
    expect(() => Tracing.tracingSettings({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c", OTEL_EXPORTER_OTLP_HEADERS: "nokey" }))
      .toThrow(/OTEL_EXPORTER_OTLP_HEADERS/)
  })

  it("without an endpoint provides nothing: TracingEnabled stays false", async () => {
    const runtime = ManagedRuntime.make(Tracing.layer({}))
    expect(await runtime.runPromise(enabled)).toBe(false)
    await runtime.dispose()
  })

  it("exports OTLP/protobuf by default, flushing on shutdown", async () => {
    const receiver = await startReceiver()
    try {
      const runtime = ManagedRuntime.make(
        Layer.fresh(Tracing.layer({ OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_SERVICE_NAME: "probe-test" }))
      )
      expect(await runtime.runPromise(enabled)).toBe(true)
      await runtime.runPromise(Effect.void.pipe(Effect.withSpan("wellspring.test-span")))
      await runtime.dispose()
      expect(receiver.received.map((r) => [r.path, r.contentType])).toEqual([["/v1/traces", "application/x-protobuf"]])
      const body = receiver.received[0]!.body
      expect(body.includes(Buffer.from("wellspring.test-span"))).toBe(true)
      expect(body.includes(Buffer.from("probe-test"))).toBe(true)
    } finally {
      await receiver.close()
    }
  })
})
