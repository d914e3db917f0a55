/**
 * `GET /v1/openapi.json` (spec: Versioning 1; issue [2/4] §8): version 1.0.0, generated from the same
 * Schema that validates chat requests.
 */
import { Schema } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ChatRequest } from "../../src/inference/ChatRequest.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"

describe("GET /v1/openapi.json", () => {
  let gw: TestGateway
  let doc: any

  beforeAll(async () => {
    gw = await startGateway({ admission: makeUnlimitedAdmission().layer })
    const res = await fetch(`${gw.url}/v1/openapi.json`)
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toContain("application/json")
    doc = await res.json()
  })
  afterAll(() => gw?.stop())

  it("is an OpenAPI 3 document of version 1.0.0", () => {
    expect(doc.openapi).toMatch(/^3\./)
    expect(doc.info.version).toBe("1.0.0")
    for (const path of ["/v1/chat/completions", "/v1/embeddings", "/v1/models", "/v1/me", "/v1/usage"]) {
      expect(doc.paths, path).toHaveProperty([path])
    }
  })

  it("the chat request schema is the validating Schema, with reasoning_effort and at most 128 tools", () => {
    const body = doc.paths["/v1/chat/completions"].post.requestBody.content["application/json"].schema
    expect(body).toEqual({ $ref: "#/components/schemas/ChatCompletionRequest" })
    const request = doc.components.schemas.ChatCompletionRequest
    expect(request.required).toEqual(["model", "messages"])
    expect(request.properties.reasoning_effort).toEqual({ type: "string" })
    expect(request.properties.tools).toMatchObject({ type: "array", maxItems: 128 })
    expect(request.properties.tools.items.properties.function.properties.name.pattern).toBe("^[a-zA-Z0-9_-]{1,64}$")
    expect(request.properties.messages.minItems).toBe(1)
    expect(request.properties.max_tokens).toBeDefined()
    // Fields outside the contract are not described.
    for (const field of ["n", "seed", "response_format", "stream_options", "logprobs", "presence_penalty", "frequency_penalty"]) {
      expect(request.properties, field).not.toHaveProperty([field])
    }
    expect(Object.keys(request.properties).sort()).toEqual(
      ["max_completion_tokens", "max_tokens", "messages", "model", "parallel_tool_calls", "reasoning_effort", "stop", "stream", "temperature", "tool_choice", "tools", "top_p"]
    )
    // Generated from the very Schema that decodes requests, not a hand-written copy.
    // (OpenApi.fromApi generates with `onExcessProperty: "error"`: objects are `additionalProperties: false`.)
    const generated = Schema.toJsonSchemaDocument(ChatRequest, { onExcessProperty: "error" })
    expect(generated.schema).toEqual({ $ref: "#/$defs/ChatCompletionRequest" })
    expect(JSON.parse(JSON.stringify(generated.definitions.ChatCompletionRequest))).toEqual(request)
  })

  it("documents the response with usage and the receipt, and the stream", () => {
    const post = doc.paths["/v1/chat/completions"].post
    const ok = post.responses["200"].content["application/json"].schema
    expect(ok).toEqual({ $ref: "#/components/schemas/ChatCompletion" })
    expect(post.responses["200"].content).toHaveProperty(["text/event-stream"])
    const completion = doc.components.schemas.ChatCompletion
    expect(completion.properties.choices.items.properties.finish_reason.enum).toEqual(["stop", "length", "tool_calls"])
    expect(Object.keys(completion.properties)).toEqual(expect.arrayContaining(["id", "object", "created", "model", "choices", "usage", "wellspring"]))
    expect(completion.required).not.toContain("wellspring")
  })

  it("errors are our envelope, never the HttpApi decode error the server does not send; the bearer key is required", () => {
    const envelope = { $ref: "#/components/schemas/ErrorEnvelope" }
    expect(doc.components.schemas.ErrorEnvelope.properties.error.required).toEqual(["message", "type"])
    expect(JSON.stringify(doc)).not.toContain("HttpApiDecodeError")
    const chat = doc.paths["/v1/chat/completions"].post
    expect(Object.keys(chat.responses).sort()).toEqual(["200", "400", "401", "403", "413", "429", "500", "503", "529"])
    // Grouped from the error catalog: a deterministic upstream refusal is a 400, never a retryable 5xx.
    expect(chat.responses["400"].description).toContain("upstream_rejected")
    expect(chat.responses["500"].description).not.toContain("upstream_rejected")
    expect(chat.responses["429"].description).toContain("too_many_failed_requests")
    expect(chat.responses["413"].description).toBe("payload_too_large")
    for (const [status, response] of Object.entries<any>(chat.responses)) {
      if (status !== "200") expect(response.content["application/json"].schema, status).toEqual(envelope)
    }
    expect(doc.components.securitySchemes.bearer).toMatchObject({ type: "http", scheme: "bearer" })
    for (const path of ["/v1/chat/completions", "/v1/models", "/v1/me"]) {
      const operation = Object.values<any>(doc.paths[path])[0]
      expect(operation.security, path).toEqual([{ bearer: [] }])
      expect(operation.responses["401"].content["application/json"].schema).toEqual(envelope)
    }
  })
})
