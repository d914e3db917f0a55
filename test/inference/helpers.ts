/**
 * Shared helpers of the inference suites: HTTP calls, SSE parsing, request rows, and a catalog entry
 * routed to the scripted mock upstream.
 */
import { Effect } from "effect"
import { expect } from "vitest"
import { authed, type ConfigDoc, type TestGateway } from "../support/Gateway.js"
import { afterFlush } from "../support/Rows.js"

export const HANGUL = /[\uac00-\ud7a3]/

export interface MockModelOptions {
  readonly id?: string
  readonly provider?: string
  readonly baseUrl: string
  readonly timeouts?: {
    readonly connect_ms?: number
    readonly first_token_ms?: number
    readonly idle_ms?: number
    readonly total_ms?: number
  }
  readonly model?: Record<string, unknown>
}

/** Adds an openai-compatible provider at `baseUrl` and a model `ws-mock` (tools, reasoning, images) routed to it. */
export const addMockModel = (doc: ConfigDoc, options: MockModelOptions) => {
  const provider = options.provider ?? "mock"
  doc.catalog.providers[provider] = {
    kind: "openai-compatible",
    base_url: options.baseUrl,
    timeouts: { connect_ms: 2_000, first_token_ms: 5_000, idle_ms: 5_000, total_ms: 20_000, ...options.timeouts }
  }
  doc.catalog.models.push({
    id: options.id ?? "ws-mock",
    owned_by: "test",
    supports_tools: true,
    supports_reasoning: true,
    supports_images: true,
    reasoning_efforts: ["low", "high"],
    max_input_tokens: 100_000,
    max_output_tokens: 512,
    rate_limit_rpm: 100_000,
    concurrency: 1_000,
    weights: { input: 1, output: 2 },
    route: { provider, model: "mock-model" },
    ...options.model
  })
}

export const chatUrl = (gw: TestGateway) => `${gw.url}/v1/chat/completions`

/** POSTs a chat request; `body` is JSON-encoded unless it is already a string. */
export const postChat = (gw: TestGateway, body: unknown, init: RequestInit = {}) =>
  fetch(chatUrl(gw), {
    method: "POST",
    headers: authed(gw.key),
    body: typeof body === "string" ? body : JSON.stringify(body),
    ...init
  })

export const user = (content: string) => ({ role: "user", content })

export interface SseFrames {
  /** Raw event blocks in order (`data: ...` or `: ping`). */
  readonly blocks: ReadonlyArray<string>
  /** Parsed JSON of every `data:` frame except `[DONE]`. */
  readonly chunks: ReadonlyArray<any>
  readonly done: boolean
  /** `[DONE]` is the last block. */
  readonly doneLast: boolean
}

export const parseSse = (text: string): SseFrames => {
  const blocks = text.split("\n\n").filter((b) => b.length > 0)
  const chunks: Array<any> = []
  let done = false
  for (const block of blocks) {
    if (!block.startsWith("data: ")) continue
    const data = block.slice(6)
    if (data === "[DONE]") done = true
    else chunks.push(JSON.parse(data))
  }
  return { blocks, chunks, done, doneLast: blocks[blocks.length - 1] === "data: [DONE]" }
}

/** Reads a response body to its end; resolves with the text and whether the body ended with an error. */
export const readBody = async (res: Response): Promise<{ text: string; error: unknown }> => {
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let text = ""
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      text += decoder.decode(value, { stream: true })
    }
    return { text, error: null }
  } catch (error) {
    return { text, error }
  }
}

export interface RequestRowView {
  readonly id: number
  readonly request_id: string
  readonly model_id: string
  readonly status: string
  readonly error_code: string | null
  readonly http_status: number
  readonly stream: boolean
  readonly input_tokens: number
  readonly output_tokens: number
  readonly reasoning_tokens: number
  readonly weighted_cost: number
  readonly ttfb_ms: number | null
  readonly duration_ms: number
  readonly had_tools: boolean
  readonly tool_choice: string | null
  readonly provider: string | null
  readonly error: string | null
}

/** Flushes the batch writer, then reads the rows with these ids. */
export const rowsById = (gw: TestGateway, ids: ReadonlyArray<number>) =>
  afterFlush(gw, (sql) =>
    ids.length === 0
      ? Effect.succeed([] as Array<RequestRowView>)
      : Effect.map(sql<RequestRowView>`SELECT * FROM request_log WHERE id IN ${sql.in(ids)} ORDER BY id`, (rows) => [...rows]))

/** Flushes, then reads the `n` rows with the highest ids, newest first. */
export const latestRows = (gw: TestGateway, n: number) =>
  afterFlush(gw, (sql) => Effect.map(sql<RequestRowView>`SELECT * FROM request_log ORDER BY id DESC LIMIT ${n}`, (rows) => [...rows]))

export const rowById = async (gw: TestGateway, id: number): Promise<RequestRowView> => {
  const rows = await rowsById(gw, [id])
  expect(rows, `request row ${id}`).toHaveLength(1)
  return rows[0]!
}

/** Flushes, then counts the rows. */
export const countRows = (gw: TestGateway) =>
  afterFlush(gw, (sql) => Effect.map(sql<{ n: number }>`SELECT count(*)::int AS n FROM request_log`, (rows) => rows[0]!.n))

export const rowIdOf = (res: Response): number => {
  const raw = res.headers.get("x-request-id")
  expect(raw, "x-request-id header").toMatch(/^\d+$/)
  return Number(raw)
}

/** Asserts the error envelope of the inference API; returns the body. */
export const expectError = async (res: Response, status: number, code: string, type = "invalid_request_error") => {
  const text = await res.text()
  let body: any
  try {
    body = JSON.parse(text)
  } catch {
    throw new Error(`expected a JSON error envelope, got ${res.status}: ${text.slice(0, 300)}`)
  }
  expect({ status: res.status, code: body?.error?.code, type: body?.error?.type }, text).toEqual({ status, code, type })
  expect(typeof body.error.message).toBe("string")
  expect(body.error.message).toMatch(HANGUL)
  expect(res.headers.get("x-wellspring-request-id")).toMatch(/^req_/)
  return body
}

/** Polls `check` until it passes (effects that complete after the response, e.g. a cancelled stream's row). */
export { eventuallyPasses as eventually } from "../support/Eventually.js"
