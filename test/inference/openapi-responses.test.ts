/**
 * `GET /v1/openapi.json` checked against real responses (issue 9, Structure 6): a gateway on 127.0.0.1 answers
 * real requests (successes of every documented operation, and errors of several codes), and each body is
 * validated against the schema the document declares for that path and status. Error bodies must also match
 * the catalog-generated example of their code (type and code). A renamed response field fails: the document's
 * objects are closed (`additionalProperties: false`) and list their required fields.
 *
 * The account API (`/api/user/*`) is not part of this document (spec: Versioning 1 describes the inference API),
 * so nothing of it is checked here.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { newAccount, newKey } from "../accounts/support.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { addMockModel, user } from "./helpers.js"

// ---------------------------------------------------------------------------------------------------------
// A validator for the JSON Schema subset the document uses. An unknown keyword is an error, never skipped.

type JsonSchema = Record<string, any>

const ANNOTATIONS = new Set(["description", "title", "examples", "default", "$comment"])

const kindOf = (value: unknown): string =>
  value === null ? "null" : Array.isArray(value) ? "array" : typeof value

const hasType = (value: unknown, type: string): boolean => {
  switch (type) {
    case "integer":
      return Number.isInteger(value)
    case "number":
      return typeof value === "number" && Number.isFinite(value)
    case "object":
      return kindOf(value) === "object"
    default:
      return kindOf(value) === type
  }
}

const sameJson = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b)

/** Every violation of `schema` by `value`, each with its JSON path; `[]` when it conforms. */
const validate = (root: any, schema: JsonSchema, value: unknown, at = "$"): Array<string> => {
  const errors: Array<string> = []
  for (const [keyword, argument] of Object.entries(schema)) {
    switch (keyword) {
      case "$ref": {
        const prefix = "#/components/schemas/"
        if (typeof argument !== "string" || !argument.startsWith(prefix)) throw new Error(`unsupported $ref ${argument}`)
        const target = root.components.schemas[argument.slice(prefix.length)]
        if (target === undefined) throw new Error(`dangling $ref ${argument}`)
        errors.push(...validate(root, target, value, at))
        break
      }
      case "type": {
        const types: Array<string> = Array.isArray(argument) ? argument : [argument]
        if (!types.some((t) => hasType(value, t))) errors.push(`${at}: expected ${types.join(" | ")}, got ${kindOf(value)}`)
        break
      }
      case "enum":
        if (!(argument as Array<unknown>).some((option) => sameJson(option, value))) {
          errors.push(`${at}: ${JSON.stringify(value)} is not one of ${JSON.stringify(argument)}`)
        }
        break
      case "const":
        if (!sameJson(argument, value)) errors.push(`${at}: expected ${JSON.stringify(argument)}`)
        break
      case "properties":
        if (kindOf(value) === "object") {
          for (const [name, sub] of Object.entries<JsonSchema>(argument)) {
            if (Object.hasOwn(value as object, name)) errors.push(...validate(root, sub, (value as any)[name], `${at}.${name}`))
          }
        }
        break
      case "required":
        if (kindOf(value) === "object") {
          for (const name of argument as Array<string>) {
            if (!Object.hasOwn(value as object, name)) errors.push(`${at}: missing required property "${name}"`)
          }
        }
        break
      case "additionalProperties":
        if (kindOf(value) === "object") {
          const declared = new Set(Object.keys(schema.properties ?? {}))
          for (const [name, sub] of Object.entries(value as object)) {
            if (declared.has(name)) continue
            if (argument === false) errors.push(`${at}: unexpected property "${name}"`)
            else if (typeof argument === "object") errors.push(...validate(root, argument, sub, `${at}.${name}`))
          }
        }
        break
      case "items":
        if (Array.isArray(value)) value.forEach((item, i) => errors.push(...validate(root, argument, item, `${at}[${i}]`)))
        break
      case "minItems":
        if (Array.isArray(value) && value.length < argument) errors.push(`${at}: fewer than ${argument} items`)
        break
      case "maxItems":
        if (Array.isArray(value) && value.length > argument) errors.push(`${at}: more than ${argument} items`)
        break
      case "minLength":
        if (typeof value === "string" && [...value].length < argument) errors.push(`${at}: shorter than ${argument}`)
        break
      case "maxLength":
        if (typeof value === "string" && [...value].length > argument) errors.push(`${at}: longer than ${argument}`)
        break
      case "pattern":
        if (typeof value === "string" && !new RegExp(argument, "u").test(value)) errors.push(`${at}: does not match ${argument}`)
        break
      case "minimum":
        if (typeof value === "number" && value < argument) errors.push(`${at}: below ${argument}`)
        break
      case "maximum":
        if (typeof value === "number" && value > argument) errors.push(`${at}: above ${argument}`)
        break
      case "exclusiveMinimum":
        if (typeof value === "number" && value <= argument) errors.push(`${at}: not above ${argument}`)
        break
      case "exclusiveMaximum":
        if (typeof value === "number" && value >= argument) errors.push(`${at}: not below ${argument}`)
        break
      case "anyOf":
        if (!(argument as Array<JsonSchema>).some((option) => validate(root, option, value, at).length === 0)) {
          errors.push(`${at}: matches none of anyOf (${JSON.stringify(value)?.slice(0, 120)})`)
        }
        break
      case "oneOf": {
        const matching = (argument as Array<JsonSchema>).filter((option) => validate(root, option, value, at).length === 0)
        if (matching.length !== 1) errors.push(`${at}: matches ${matching.length} of oneOf, not exactly one`)
        break
      }
      case "allOf":
        for (const option of argument as Array<JsonSchema>) errors.push(...validate(root, option, value, at))
        break
      default:
        if (!ANNOTATIONS.has(keyword)) throw new Error(`the validator does not support the keyword "${keyword}" (at ${at})`)
    }
  }
  return errors
}

// ---------------------------------------------------------------------------------------------------------

describe("OpenAPI response schemas against real responses", () => {
  let gw: TestGateway
  let mock: MockUpstream
  let doc: any
  /** `METHOD path status` of every response checked, to show every documented success was exercised. */
  const checked = new Set<string>()

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({
      configure: (config) => {
        config.limits.body_bytes = 65_536
        config.plans.tiny = { session_limit: 1, weekly_limit: 1_000_000, session_hours: 5, hide_absolutes: false, show_request_pct: true }
        addMockModel(config, { baseUrl: mock.url })
        addMockModel(config, { id: "ws-rpm1", baseUrl: mock.url, model: { rate_limit_rpm: 1 } })
      }
    })
    const res = await fetch(`${gw.url}/v1/openapi.json`)
    expect(res.status).toBe(200)
    doc = await res.json()
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  /** The JSON media type the document declares for this operation and status (failing when undocumented). */
  const declared = (method: string, path: string, status: number) => {
    const operation = doc.paths[path]?.[method.toLowerCase()]
    if (operation === undefined) throw new Error(`${method} ${path} is not in the document`)
    const response = operation.responses[String(status)]
    if (response === undefined) {
      throw new Error(`${method} ${path} answered ${status}, which the document does not list (${Object.keys(operation.responses)})`)
    }
    return response.content["application/json"]
  }

  /** Validates a real response against the document; returns its body. */
  const conforms = async (method: string, path: string, res: Response): Promise<any> => {
    const text = await res.text()
    expect(res.headers.get("content-type"), text).toContain("application/json")
    const body = JSON.parse(text)
    const media = declared(method, path, res.status)
    expect(validate(doc, media.schema, body), `${method} ${path} ${res.status}: ${text.slice(0, 400)}`).toEqual([])
    if (res.status >= 400) {
      // The catalog-generated examples of this status name the code with its type.
      const documented = Object.values<any>(media.examples ?? {}).map((example) => example.value.error)
      expect(documented, `${method} ${path} ${res.status}: ${body.error.code} is not among the documented codes`)
        .toContainEqual(expect.objectContaining({ type: body.error.type, code: body.error.code }))
    }
    checked.add(`${method} ${path} ${res.status}`)
    return body
  }

  const get = (path: string, key: string) => fetch(`${gw.url}${path}`, { headers: authed(key) })
  const post = (path: string, key: string, body: unknown) =>
    fetch(`${gw.url}${path}`, { method: "POST", headers: authed(key), body: typeof body === "string" ? body : JSON.stringify(body) })
  const chat = (key: string, body: unknown) => post("/v1/chat/completions", key, body)
  const embed = (key: string, body: unknown) => post("/v1/embeddings", key, body)

  it("the validator rejects a renamed field, a missing field, a wrong type and an unknown keyword", () => {
    const account = {
      object: "account",
      id: "acc_1",
      display_id: 1,
      display_name: "이름",
      username: "u",
      is_legacy: false,
      is_admin: false,
      key_label: "기본",
      created_at: 1,
      last_rotated_at: 1,
      email_registered: true
    }
    const schema = declared("GET", "/v1/me", 200).schema
    expect(validate(doc, schema, account)).toEqual([])
    const { display_name, ...renamed } = account
    expect(validate(doc, schema, { ...renamed, displayName: display_name })).toEqual([
      `$: missing required property "display_name"`,
      `$: unexpected property "displayName"`
    ])
    expect(validate(doc, schema, { ...account, display_id: "1" })).toEqual(["$.display_id: expected integer, got string"])
    expect(() => validate(doc, { type: "string", format: "date-time" }, "x")).toThrow(/format/)
    // Numbers are documented as numbers only (JSON has no Infinity; a string "Infinity" is not a percentage).
    expect(doc.components.schemas.Pool.properties.used_pct).toEqual({ type: "number" })
    expect(validate(doc, doc.components.schemas.Pool.properties.used_pct, "Infinity")).toEqual(["$: expected number, got string"])
    const envelope = declared("GET", "/v1/me", 401).schema
    expect(validate(doc, envelope, { error: { message: "m", kind: "invalid_request_error" } })).toEqual([
      `$.error: missing required property "type"`,
      `$.error: unexpected property "kind"`
    ])
  })

  it("GET /v1/models, /v1/me and /v1/usage", async () => {
    const models = await conforms("GET", "/v1/models", await get("/v1/models", gw.key))
    expect(models.data.length).toBeGreaterThan(0)
    const me = await conforms("GET", "/v1/me", await get("/v1/me", gw.key))
    expect(me.username).toBe("dev")
    await conforms("GET", "/v1/usage", await get("/v1/usage", gw.key))
  })

  it("POST /v1/chat/completions, non-streaming: plain answer with its receipt, and tool calls with reasoning", async () => {
    const plain = await conforms("POST", "/v1/chat/completions", await chat(gw.key, { model: "ws-pro", messages: [user("안녕")], max_tokens: 16 }))
    expect(plain.wellspring).toBeDefined()
    mock.script(Behaviour.json(Chunks.completion({
      content: null,
      reasoning: "생각",
      tool_calls: [{ id: "call_1", name: "lookup", arguments: "{\"q\":1}" }],
      finish: "tool_calls",
      usage: { prompt: 5, completion: 3 }
    })))
    const tools = [{ type: "function", function: { name: "lookup", parameters: { type: "object" } } }]
    const called = await conforms("POST", "/v1/chat/completions", await chat(gw.key, { model: "ws-mock", messages: [user("찾아줘")], tools }))
    expect(called.choices[0].message.tool_calls[0].function.name).toBe("lookup")
    expect(called.choices[0].message.reasoning).toBe("생각")
    // The usage after spending.
    await conforms("GET", "/v1/usage", await get("/v1/usage", gw.key))
  })

  it("POST /v1/embeddings, float and base64", async () => {
    const float = await conforms("POST", "/v1/embeddings", await embed(gw.key, { model: "ws-embed", input: ["하나", "둘"] }))
    expect(float.data).toHaveLength(2)
    const base64 = await conforms("POST", "/v1/embeddings", await embed(gw.key, { model: "ws-embed", input: "셋", encoding_format: "base64" }))
    expect(typeof base64.data[0].embedding).toBe("string")
  })

  it("401 invalid_api_key on every operation", async () => {
    const bad = "sk-ws-" + "x".repeat(43)
    for (const [method, path] of [["GET", "/v1/models"], ["GET", "/v1/me"], ["GET", "/v1/usage"]] as const) {
      expect((await conforms(method, path, await get(path, bad))).error.code).toBe("invalid_api_key")
    }
    expect((await conforms("POST", "/v1/chat/completions", await chat(bad, { model: "ws-pro", messages: [user("x")] }))).error.code)
      .toBe("invalid_api_key")
    expect((await conforms("POST", "/v1/embeddings", await embed(bad, { model: "ws-embed", input: "x" }))).error.code)
      .toBe("invalid_api_key")
  })

  it("400s of request validation, 413, and 403 account_unlinked", async () => {
    const code = async (path: string, res: Response) => (await conforms("POST", path, res)).error.code
    const chatPath = "/v1/chat/completions"
    expect(await code(chatPath, await chat(gw.key, "{"))).toBe("invalid_json")
    expect(await code(chatPath, await chat(gw.key, { model: "ws-nope", messages: [user("x")] }))).toBe("model_not_found")
    expect(await code(chatPath, await chat(gw.key, { model: "ws-embed", messages: [user("x")] }))).toBe("model_not_chat")
    expect(await code(chatPath, await chat(gw.key, { model: "ws-pro", messages: [] }))).toMatch(/^invalid_/)
    expect(await code("/v1/embeddings", await embed(gw.key, { model: "ws-pro", input: "x" }))).toBe("model_not_embedding")
    expect(await code("/v1/embeddings", await embed(gw.key, { model: "ws-embed", input: [1, 2] }))).toBe("invalid_request")
    const big = JSON.stringify({ model: "ws-pro", messages: [user("가".repeat(40_000))] })
    expect(await code(chatPath, await chat(gw.key, big))).toBe("payload_too_large")

    const unlinked = await newAccount(gw, { status: "unlinked" })
    const { key } = await newKey(gw, unlinked.id)
    expect(await code(chatPath, await chat(key, { model: "ws-pro", messages: [user("x")] }))).toBe("account_unlinked")
    expect(await code("/v1/embeddings", await embed(key, { model: "ws-embed", input: "x" }))).toBe("account_unlinked")
  })

  it("429 rate_limited and session_exhausted (with resets_at) from the real admission engine", async () => {
    mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 3, completion: 1 } })))
    const first = await chat(gw.key, { model: "ws-rpm1", messages: [user("x")] })
    await conforms("POST", "/v1/chat/completions", first)
    const limited = await conforms("POST", "/v1/chat/completions", await chat(gw.key, { model: "ws-rpm1", messages: [user("x")] }))
    expect(limited.error.code).toBe("rate_limited")

    const tiny = await newAccount(gw, { plan: "tiny" })
    const { key } = await newKey(gw, tiny.id)
    let exhausted: any = null
    for (let attempt = 0; attempt < 3 && exhausted === null; attempt++) {
      const body = await conforms("POST", "/v1/chat/completions", await chat(key, { model: "ws-mock", messages: [user("x")] }))
      if (body.error) exhausted = body
    }
    expect(exhausted?.error.code).toBe("session_exhausted")
    expect(typeof exhausted.error.resets_at).toBe("string")
    await conforms("GET", "/v1/usage", await get("/v1/usage", key))
  })

  it("upstream failures: 400 upstream_rejected, 500 upstream_error, 503 upstream_rate_limited", async () => {
    const cases: Array<[ReturnType<typeof Behaviour.status>, string]> = [
      [Behaviour.status(422, { error: { message: "messages.0.content: field required" } }), "upstream_rejected"],
      [Behaviour.status(500, { error: { message: "boom", type: "server_error" } }), "upstream_error"],
      [Behaviour.rateLimited(), "upstream_rate_limited"]
    ]
    for (const [behaviour, expected] of cases) {
      mock.script(behaviour)
      const body = await conforms("POST", "/v1/chat/completions", await chat(gw.key, { model: "ws-mock", messages: [user("x")] }))
      expect(body.error.code).toBe(expected)
    }
    mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 1, completion: 1 } })))
  })

  it("every operation's documented success and several error statuses were checked against a real response", () => {
    for (const [path, operations] of Object.entries<any>(doc.paths)) {
      if (path === "/v1/openapi.json") continue
      for (const method of Object.keys(operations)) expect(checked, `${method} ${path}`).toContain(`${method.toUpperCase()} ${path} 200`)
    }
    for (const status of [400, 401, 403, 413, 429, 500, 503]) {
      expect(checked).toContain(`POST /v1/chat/completions ${status}`)
    }
  })
})
