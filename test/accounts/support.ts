import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import * as Crypto from "node:crypto"
import { AccountsRepo, type AccountRow, type NewAccount } from "../../src/accounts/AccountsRepo.js"
import type { TestGateway } from "../support/Gateway.js"

export const unique = (label: string) => `${label}_${Crypto.randomBytes(4).toString("hex")}`

export const newAccount = (gw: TestGateway, input: Partial<NewAccount> = {}): Promise<AccountRow> =>
  gw.run(Effect.flatMap(AccountsRepo, (repo) =>
    repo.createAccount({
      username: unique("user"),
      displayName: "테스터",
      email: `${unique("mail")}@example.com`,
      emailVerified: true,
      ...input
    })))

export const newKey = (gw: TestGateway, accountId: string, label = "test", legacy = false): Promise<{ key: string; id: number }> =>
  gw.run(Effect.flatMap(AccountsRepo, (repo) =>
    repo.createKey(accountId, label, { legacy }).pipe(Effect.map(({ key, row }) => ({ key, id: row.id })))))

export const newSession = (gw: TestGateway, accountId: string): Promise<string> =>
  gw.run(Effect.flatMap(AccountsRepo, (repo) => repo.createSession(accountId, 24)))

/** An account with one key and one session. */
export const newUser = async (gw: TestGateway, input: Partial<NewAccount> = {}) => {
  const account = await newAccount(gw, input)
  const { key, id } = await newKey(gw, account.id, "first")
  const session = await newSession(gw, account.id)
  return { account, key, keyId: id, session }
}

export { flushRequestLog, query } from "../support/Rows.js"

export interface FixtureRow {
  id: number
  request_id: string
  account_id: string
  key_id: number | null
  model_id: string
  status: string
  error_code: string | null
  http_status: number
  stream: boolean
  input_tokens: number
  output_tokens: number
  reasoning_tokens: number
  prompt_cached_tokens: number
  weighted_cost: number
  ttfb_ms: number | null
  duration_ms: number
  tps: number
  had_tools: boolean
  tool_choice: string | null
  byok: boolean
  provider: string | null
  fell_back: boolean
  error: string | null
  created_at: Date
}

let nextRowId = 500_000_000

export const row = (accountId: string, over: Partial<FixtureRow> = {}): FixtureRow => {
  const id = nextRowId++
  return {
    id,
    request_id: `fx_${id}`,
    account_id: accountId,
    key_id: null,
    model_id: "ws-pro",
    status: "success",
    error_code: null,
    http_status: 200,
    stream: false,
    input_tokens: 100,
    output_tokens: 50,
    reasoning_tokens: 0,
    prompt_cached_tokens: 0,
    weighted_cost: 300,
    ttfb_ms: 100,
    duration_ms: 1000,
    tps: 50,
    had_tools: false,
    tool_choice: null,
    byok: false,
    provider: "sim",
    fell_back: false,
    error: null,
    created_at: new Date(Date.now() - 60_000),
    ...over
  }
}

/** A failed row with the status and code the chat pipeline would record. */
export const errorRow = (accountId: string, code: string | null, httpStatus: number, over: Partial<FixtureRow> = {}) =>
  row(accountId, {
    status: httpStatus === 499 ? "cancelled" : "error",
    error_code: code,
    http_status: httpStatus,
    input_tokens: 0,
    output_tokens: 0,
    weighted_cost: 0,
    ttfb_ms: null,
    tps: 0,
    error: httpStatus === 499 ? null : `diagnostic for ${code}`,
    ...over
  })

export const insertRows = (gw: TestGateway, rows: ReadonlyArray<FixtureRow>) =>
  gw.run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.orDie(sql`INSERT INTO request_log ${
      sql.insert(rows as unknown as readonly [Record<string, unknown>, ...Array<Record<string, unknown>>])
    }`)))

export interface Reply {
  readonly status: number
  readonly headers: Headers
  readonly body: any
  readonly text: string
}

export interface CallOptions {
  readonly key?: string
  readonly session?: string
  /** An object is sent as JSON; a string is sent verbatim. */
  readonly body?: unknown
  /** With `session`, a mutation gets the dashboard's `Origin` and a JSON content type unless given here. */
  readonly headers?: Record<string, string>
}

export const call = async (gw: TestGateway, method: string, path: string, options: CallOptions = {}): Promise<Reply> => {
  const headers: Record<string, string> = { ...options.headers }
  if (options.key !== undefined) headers.authorization = `Bearer ${options.key}`
  if (options.session !== undefined) headers.cookie = `ws-session=${options.session}`
  let body: string | undefined
  if (options.body !== undefined) {
    body = typeof options.body === "string" ? options.body : JSON.stringify(options.body)
    headers["content-type"] = "application/json"
  }
  if (options.session !== undefined) {
    // What the dashboard's own page sends (SameOrigin.ts): its origin and a JSON type, unless a test says otherwise.
    const given = new Set(Object.keys(headers).map((name) => name.toLowerCase()))
    if (!given.has("origin") && !given.has("sec-fetch-site")) headers.origin = gw.url
    if (!["GET", "HEAD"].includes(method) && !given.has("content-type")) headers["content-type"] = "application/json"
  }
  const res = await fetch(`${gw.url}${path}`, { method, headers, ...(body !== undefined ? { body } : {}) })
  const text = await res.text()
  let parsed: unknown = undefined
  try {
    parsed = JSON.parse(text)
  } catch {
    parsed = undefined
  }
  return { status: res.status, headers: res.headers, body: parsed, text }
}

export const chat = (gw: TestGateway, key: string, body: Record<string, unknown> = {}) =>
  call(gw, "POST", "/v1/chat/completions", {
    key,
    body: { model: "ws-pro", messages: [{ role: "user", content: "안녕하세요, 테스트입니다." }], ...body }
  })

export const sortedKeys = (o: object) => Object.keys(o).sort()
