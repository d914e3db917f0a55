/**
 * GET /v1/models (exact Model entry fields) and request ids on every response, against a running gateway.
 */
import { Effect, Layer, ManagedRuntime, References } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadConfig } from "../../src/config/GatewayConfig.js"
import { Settings } from "../../src/config/Live.js"
import * as Server from "../../src/http/Server.js"
import { authed, defaultConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"

const MODEL_FIELDS = [
  "created",
  "id",
  "max_input_tokens",
  "max_output_tokens",
  "object",
  "owned_by",
  "rate_limit_rpm",
  "supports_embeddings",
  "supports_images",
  "supports_reasoning",
  "supports_tools"
]

describe("GET /v1/models", () => {
  let gw: TestGateway
  beforeAll(async () => {
    gw = await startGateway()
  })
  afterAll(() => gw?.stop())

  it("lists exactly the spec's fields for each enabled model, in catalog order", async () => {
    const res = await fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) })
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toMatch(/^application\/json/)
    const body = await res.json() as { object: string; data: Array<Record<string, unknown>> }
    expect(Object.keys(body).sort()).toEqual(["data", "object"])
    expect(body.object).toBe("list")
    const doc = defaultConfigDoc()
    const enabled = (doc.catalog.models as Array<Record<string, any>>).filter((m) => !m.disabled)
    expect(body.data.map((m) => m.id)).toEqual(enabled.map((m) => m.id))
    for (const entry of body.data) {
      expect(Object.keys(entry).sort()).toEqual(MODEL_FIELDS)
      const source = enabled.find((m) => m.id === entry.id)!
      expect(entry).toEqual({
        id: source.id,
        object: "model",
        created: expect.any(Number),
        owned_by: source.owned_by,
        supports_tools: source.supports_tools ?? false,
        supports_reasoning: source.supports_reasoning ?? false,
        supports_images: source.supports_images ?? false,
        supports_embeddings: source.supports_embeddings ?? false,
        max_output_tokens: source.max_output_tokens,
        max_input_tokens: source.max_input_tokens,
        rate_limit_rpm: source.rate_limit_rpm
      })
      expect(Number.isInteger(entry.created)).toBe(true)
    }
    // Internal catalog fields never leak.
    const text = JSON.stringify(body)
    for (const secret of ["\"weights\"", "\"route\"", "concurrency", "daily_cap", "sim-pro", "Wellspring Pro", "supports_chat"]) {
      expect(text).not.toContain(secret)
    }
  })

  it("omits disabled models and lists the embedding model with supports_embeddings", async () => {
    const body = await (await fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) })).json() as {
      data: Array<Record<string, unknown>>
    }
    expect(body.data.map((m) => m.id)).not.toContain("ws-legacy")
    const embed = body.data.find((m) => m.id === "ws-embed")!
    expect(embed).toMatchObject({ supports_embeddings: true, supports_tools: false, supports_reasoning: false })
    const pro = body.data.find((m) => m.id === "ws-pro")!
    expect(pro).toMatchObject({ supports_tools: true, supports_reasoning: true, supports_images: true })
  })

  it("works with the official openai SDK, including its 401 error", async () => {
    const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.key, maxRetries: 0 })
    const ids: Array<string> = []
    for await (const model of client.models.list()) ids.push(model.id)
    expect(ids).toEqual(["ws-pro", "ws-reasoner", "ws-lite", "ws-embed"])

    const bad = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: "sk-ws-nope", maxRetries: 0 })
    const error = await bad.models.list().then(() => null, (e: unknown) => e)
    expect(error).toBeInstanceOf(OpenAI.AuthenticationError)
    expect((error as InstanceType<typeof OpenAI.AuthenticationError>).status).toBe(401)
    expect((error as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe("invalid_api_key")
  })

  it("every response carries a distinct x-wellspring-request-id: 200, 401, 404", async () => {
    const responses = await Promise.all([
      fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) }),
      fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) }),
      fetch(`${gw.url}/v1/models`),
      fetch(`${gw.url}/v1/models`, { headers: { authorization: "Bearer sk-ws-unknown0000000000000000" } }),
      fetch(`${gw.url}/v1/nothing-here`, { headers: authed(gw.key) }),
      // (`/` is the status page of the status origin, which this listener serves too.)
      fetch(`${gw.url}/no-such-page`),
      fetch(`${gw.url}/v1/models`, { method: "DELETE", headers: authed(gw.key) })
    ])
    expect(responses.map((r) => r.status)).toEqual([200, 200, 401, 401, 404, 404, 404])
    const ids = responses.map((r) => r.headers.get("x-wellspring-request-id"))
    for (const id of ids) expect(id).toMatch(/^req_[0-9a-f]{8}[0-9a-z]{8,}$/)
    expect(new Set(ids).size).toBe(ids.length)
    const notFound = await responses[4]!.json() as { error: { code: string; type: string } }
    expect(notFound.error).toMatchObject({ code: "not_found", type: "not_found_error" })
  })
})

describe("request ids outside the handlers", () => {
  const { config, path } = loadConfig({ path: "config/gateway.yaml", env: { WELLSPRING_PORT: "0" } })
  const routes = {
    inference: Layer.mergeAll(
      HttpRouter.add("GET", "/boom", Effect.die("boom")),
      HttpRouter.add("GET", "/raw", HttpServerResponse.text("raw"))
    ),
    account: Layer.empty,
    status: Layer.empty
  }
  const settings = Layer.succeed(Settings, {
    config,
    path,
    encryptionKey: null,
    embedded: true,
    planFor: () => config.plans[config.default_plan]!
  })
  const runtime = ManagedRuntime.make(
    Layer.provideMerge(Server.layer(routes, config), settings).pipe(Layer.provide(Layer.succeed(References.MinimumLogLevel, "None")))
  )
  afterAll(() => runtime.dispose())

  it("a route that dies and a route that skips `handle` still get an id", async () => {
    const { listeners } = await runtime.runPromise(Server.BoundListeners)
    const url = `http://127.0.0.1:${listeners[0]!.port}`
    const boom = await fetch(`${url}/boom`)
    expect(boom.status).toBe(500)
    expect(boom.headers.get("x-wellspring-request-id")).toMatch(/^req_/)
    expect(((await boom.json()) as { error: { type: string } }).error.type).toBe("server_error")
    const raw = await fetch(`${url}/raw`)
    expect(raw.status).toBe(200)
    expect(await raw.text()).toBe("raw")
    expect(raw.headers.get("x-wellspring-request-id")).toMatch(/^req_/)
  })
})
