/**
 * `POST /v1/responses` streams byte for byte, against a scripted OpenAI-wire upstream: event names and their
 * order, `sequence_number` from 0 up by one, each `data.type` equal to its `event:` line, the final usage
 * (cached and reasoning tokens passed through) and receipt; a mid-stream failure ends with `response.failed`;
 * a failure before the first event is a JSON error in OpenAI's envelope; request rows say `api = responses`.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { addMockModel, readBody } from "../inference/helpers.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { afterFlush } from "../support/Rows.js"
import { Effect } from "effect"

const CALL = `call_${"ab".repeat(16)}`

interface SseEvent {
  readonly event: string
  readonly data: any
}

/** Splits an SSE body into `event:`/`data:` pairs (comments such as `: ping` skipped), checking each block's form. */
const parseEvents = (text: string): Array<SseEvent> => {
  const events: Array<SseEvent> = []
  for (const block of text.split("\n\n")) {
    if (block.length === 0 || block.startsWith(":")) continue
    const lines = block.split("\n")
    expect(lines, block).toHaveLength(2)
    expect(lines[0]).toMatch(/^event: response\.[a-z_.]+$/)
    expect(lines[1]).toMatch(/^data: \{/)
    events.push({ event: lines[0]!.slice(7), data: JSON.parse(lines[1]!.slice(6)) })
  }
  return events
}

const post = (gw: TestGateway, body: unknown) =>
  fetch(`${gw.url}/v1/responses`, { method: "POST", headers: authed(gw.key), body: JSON.stringify(body) })

const apiOfRow = (gw: TestGateway, id: number) =>
  afterFlush(gw, (sql) =>
    Effect.map(
      sql<{ api: string; status: string; stream: boolean; had_tools: boolean; input_tokens: number; error_code: string | null }>`
        SELECT api, status, stream, had_tools, input_tokens, error_code FROM request_log WHERE id = ${id}`,
      (rows) => rows[0]
    ))

describe("Responses SSE on the wire", () => {
  let gw: TestGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({
      configure: (doc) => addMockModel(doc, { baseUrl: mock.url, timeouts: { first_token_ms: 2_000, idle_ms: 2_000 } })
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  it("reasoning, text and a function call: every event in order, numbered, with the final usage", async () => {
    mock.script(Behaviour.stream([
      Chunks.role(),
      Chunks.reasoning("Let me think"),
      Chunks.content("Hello"),
      Chunks.content(" world"),
      Chunks.toolStart(0, CALL, "get_weather"),
      Chunks.toolArgs(0, "{\"city\":"),
      Chunks.toolArgs(0, "\"Seoul\"}"),
      Chunks.finish("tool_calls"),
      Chunks.usage({ prompt: 40, completion: 12, reasoning: 3, cached: 5 })
    ]))
    const res = await post(gw, {
      model: "ws-mock",
      stream: true,
      input: "hi",
      tools: [{ type: "function", name: "get_weather", parameters: { type: "object" } }]
    })
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toBe("text/event-stream")
    expect(res.headers.get("x-session-remaining-pct")).not.toBeNull()
    expect(res.headers.get("x-weekly-remaining-pct")).not.toBeNull()
    const rowId = Number(res.headers.get("x-request-id"))
    const { text, error } = await readBody(res)
    expect(error).toBeNull()
    const events = parseEvents(text)
    expect(events.map((e) => e.event)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed"
    ])
    events.forEach((e, i) => {
      expect(e.data.type).toBe(e.event)
      expect(e.data.sequence_number).toBe(i)
    })
    const id = events[0]!.data.response.id
    expect(id).toMatch(/^resp_[0-9a-f]{48}$/)
    expect(events[0]!.data.response).toMatchObject({ status: "in_progress", output: [], usage: null })
    expect(events[2]!.data).toMatchObject({ output_index: 0, item: { type: "reasoning" } })
    expect(events[5]!.data).toMatchObject({ output_index: 0, content_index: 0, text: "Let me think" })
    expect(events[12]!.data).toMatchObject({ output_index: 1, text: "Hello world" })
    expect(events[15]!.data.item).toMatchObject({ type: "function_call", call_id: CALL, name: "get_weather", arguments: "" })
    expect(events[18]!.data).toMatchObject({ output_index: 2, arguments: "{\"city\":\"Seoul\"}", name: "get_weather" })

    const final = events.at(-1)!.data.response
    expect(final.id).toBe(id)
    expect(final.status).toBe("completed")
    expect(final.output.map((item: any) => item.type)).toEqual(["reasoning", "message", "function_call"])
    expect(final.output[2]).toMatchObject({ call_id: CALL, arguments: "{\"city\":\"Seoul\"}", status: "completed" })
    expect(final.output[2].id).toBe(events[15]!.data.item.id)
    expect(final.usage).toEqual({
      input_tokens: 40,
      input_tokens_details: { cached_tokens: 5 },
      output_tokens: 12,
      output_tokens_details: { reasoning_tokens: 3 },
      total_tokens: 52
    })
    expect(final.wellspring.request_id).toBe(String(rowId))

    const row = await apiOfRow(gw, rowId)
    expect(row).toMatchObject({ api: "responses", status: "success", stream: true, had_tools: true, input_tokens: 40 })
  })

  it("output cut by max_output_tokens: response.incomplete with the reason", async () => {
    mock.script(Behaviour.stream([Chunks.role(), Chunks.content("trunc"), Chunks.finish("length")]))
    const res = await post(gw, { model: "ws-mock", stream: true, input: "long", max_output_tokens: 1 })
    const events = parseEvents((await readBody(res)).text)
    const last = events.at(-1)!
    expect(last.event).toBe("response.incomplete")
    expect(last.data.response.status).toBe("incomplete")
    expect(last.data.response.incomplete_details).toEqual({ reason: "max_output_tokens" })
    expect(mock.requests.at(-1)!.body.max_tokens ?? mock.requests.at(-1)!.body.max_completion_tokens).toBe(1)
  })

  it("a failure mid-stream ends with response.failed (the output so far, the error) and a failed row", async () => {
    mock.script(Behaviour.dropAfter([Chunks.role(), Chunks.content("partial")]))
    const res = await post(gw, { model: "ws-mock", stream: true, input: "fail me" })
    expect(res.status).toBe(200)
    const rowId = Number(res.headers.get("x-request-id"))
    const { text } = await readBody(res)
    const events = parseEvents(text)
    const last = events.at(-1)!
    expect(last.event).toBe("response.failed")
    expect(last.data.sequence_number).toBe(events.length - 1)
    expect(last.data.response.status).toBe("failed")
    expect(last.data.response.error.code).toBeTypeOf("string")
    expect(last.data.response.error.message).toMatch(/[\uac00-\ud7a3]/)
    expect(last.data.response.output).toEqual([
      expect.objectContaining({ type: "message", status: "incomplete", content: [expect.objectContaining({ text: "partial" })] })
    ])
    const row = await apiOfRow(gw, rowId)
    expect(row).toMatchObject({ api: "responses", status: "error" })
  })

  it("a failure before the first event is a JSON error in OpenAI's envelope", async () => {
    mock.script(Behaviour.status(500, { error: { message: "boom" } }))
    const res = await post(gw, { model: "ws-mock", stream: true, input: "x" })
    expect(res.status).toBe(500)
    expect(res.headers.get("content-type")).toContain("application/json")
    const body = await res.json() as { error: { code: string; type: string; message: string } }
    expect(body.error).toMatchObject({ code: "upstream_error", type: "server_error" })
    const row = await apiOfRow(gw, Number(res.headers.get("x-request-id")))
    expect(row).toMatchObject({ api: "responses", status: "error", error_code: "upstream_error" })
  })

  it("non-stream: the upstream's cached and reasoning tokens reach usage; unknown fields are named as ignored", async () => {
    mock.script(Behaviour.json(Chunks.completion({
      content: "Done",
      reasoning: "thought",
      usage: { prompt: 30, completion: 8, reasoning: 2, cached: 7 }
    })))
    const res = await post(gw, {
      model: "ws-mock",
      input: "x",
      include: ["reasoning.encrypted_content"],
      prompt_cache_key: "abc",
      service_tier: "auto"
    })
    expect(res.status).toBe(200)
    expect(res.headers.get("x-wellspring-ignored-fields")).toBe("include, service_tier, prompt_cache_key")
    const body = await res.json() as any
    expect(body.usage).toEqual({
      input_tokens: 30,
      input_tokens_details: { cached_tokens: 7 },
      output_tokens: 8,
      output_tokens_details: { reasoning_tokens: 2 },
      total_tokens: 38
    })
    expect(body.output.map((item: any) => item.type)).toEqual(["reasoning", "message"])
    expect(body.output[0].content[0].text).toBe("thought")
    const row = await apiOfRow(gw, Number(res.headers.get("x-request-id")))
    expect(row).toMatchObject({ api: "responses", status: "success", stream: false })
  })
})
