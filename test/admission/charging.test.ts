/**
 * Reserve, settle, refund over HTTP with the real engine, in both modes (issue [3/4] §3): a stream the upstream
 * cuts, or the client abandons, is charged for the output delivered (estimated at 4 characters a token when the
 * upstream sent no usage), never for `max_tokens`; a failure before any output refunds the reservation; and the
 * account's pools always equal the sum of its request rows' `weighted_cost` (the model's daily total the sum of
 * their raw tokens).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { eventually, readBody } from "../inference/helpers.js"
import {
  account,
  addQuotaModel,
  chat,
  dailyUsage,
  estimateOf,
  MODES,
  postgresUp,
  type QuotaGateway,
  quotaConfig,
  rowsOf,
  standing,
  startQuotaGateway,
  type TestAccount,
  user
} from "./helpers.js"
import type { TestGateway } from "../support/Gateway.js"

const MAX_TOKENS = 512 // the mock model's max_output_tokens
const hi = [user("hello")]
const E = estimateOf("hello")

/** Reads a stream until `marker` shows up, then drops the connection. */
const abandonAfter = async (res: Response, controller: AbortController, marker: string) => {
  const reader = res.body!.getReader()
  const decoder = new TextDecoder()
  let text = ""
  while (!text.includes(marker)) {
    const { value, done } = await reader.read()
    if (done) throw new Error(`stream ended before ${marker}: ${text}`)
    text += decoder.decode(value, { stream: true })
  }
  controller.abort()
  return text
}

/** Pools (and daily total) equal what the rows say was charged. */
const expectLedgerBalanced = async (gw: TestGateway, who: TestAccount, modelId: string) => {
  const rows = await rowsOf(gw, who)
  const charged = rows.reduce((sum, r) => sum + r.weighted_cost, 0)
  const s = await standing(gw, who)
  expect(s.session.used).toBe(charged)
  expect(s.weekly.used).toBe(charged)
  const raw = rows.filter((r) => r.model_id === modelId).reduce((sum, r) => sum + r.input_tokens + r.output_tokens, 0)
  expect(await dailyUsage(gw, modelId)).toBe(raw)
  return { rows, charged }
}

describe.skipIf(!postgresUp).each(MODES)("charging over HTTP (%s admission)", (mode) => {
  let q: QuotaGateway
  let mock: MockUpstream
  let gw: TestGateway
  let a: TestAccount

  beforeAll(async () => {
    mock = await startMockUpstream()
    q = await startQuotaGateway(mode, (doc) => {
      quotaConfig(doc)
      // weights: input 1, output 2
      addQuotaModel(doc, { id: "ws-charge", baseUrl: mock.url })
    }, "charging")
    gw = q.gw
    a = await account(gw)
  })
  afterAll(async () => {
    await q?.stop()
    await mock?.close()
  })

  it("a completed request is charged its upstream usage", async () => {
    mock.script(Behaviour.json(Chunks.completion({ content: "done", usage: { prompt: 40, completion: 10 } })))
    const res = await chat(gw, a, { model: "ws-charge", messages: hi })
    expect(res.status).toBe(200)
    await res.text()
    expect((await standing(gw, a)).session.used).toBe(40 + 10 * 2)
    const { rows } = await expectLedgerBalanced(gw, a, "ws-charge")
    expect(rows.at(-1)).toMatchObject({ status: "success", input_tokens: 40, output_tokens: 10, weighted_cost: 60 })
  })

  it("a stream the upstream cuts mid-way is charged for the delivered output (estimate), not max_tokens", async () => {
    const before = (await standing(gw, a)).session.used
    // 20 characters delivered, no usage from the upstream -> 5 output tokens estimated.
    mock.script(Behaviour.dropAfter([Chunks.role(), Chunks.content("0123456789"), Chunks.content("abcdefghij")]))
    const res = await chat(gw, a, { model: "ws-charge", messages: hi, stream: true, max_tokens: MAX_TOKENS })
    expect(res.status).toBe(200)
    const body = await readBody(res)
    expect(body.text).toContain("abcdefghij")
    expect(body.text).not.toContain("[DONE]")
    const charge = E * 1 + 5 * 2
    await eventually(async () => expect((await standing(gw, a)).session.used).toBe(before + charge))
    expect(charge).toBeLessThan(E + MAX_TOKENS * 2)
    const { rows } = await expectLedgerBalanced(gw, a, "ws-charge")
    expect(rows.at(-1)).toMatchObject({ status: "error", input_tokens: E, output_tokens: 5, weighted_cost: charge })
  })

  it("a client that disconnects mid-stream is charged for what was delivered", async () => {
    const before = (await standing(gw, a)).session.used
    const aborts = mock.clientAborts()
    // 40 characters, then the upstream goes quiet with the response open.
    mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("x".repeat(32)), Chunks.content("END-MARK")]))
    const controller = new AbortController()
    const res = await chat(gw, a, { model: "ws-charge", messages: hi, stream: true }, { signal: controller.signal })
    expect(res.status).toBe(200)
    await abandonAfter(res, controller, "END-MARK")
    // The gateway cancels the upstream call, settles and releases.
    await mock.waitForClientAborts(aborts + 1)
    const charge = E + 10 * 2
    await eventually(async () => expect((await standing(gw, a)).session.used).toBe(before + charge))
    const { rows } = await expectLedgerBalanced(gw, a, "ws-charge")
    expect(rows.at(-1)).toMatchObject({ status: "cancelled", input_tokens: E, output_tokens: 10, weighted_cost: charge })
  })

  it("failures before any output refund the reservation: standing unchanged", async () => {
    const before = await standing(gw, a)
    const daily = await dailyUsage(gw, "ws-charge")
    mock.script(
      Behaviour.status(500, { error: { message: "boom" } }),
      Behaviour.dropBeforeHeaders(),
      Behaviour.dropAfter([Chunks.role()])
    )
    expect((await chat(gw, a, { model: "ws-charge", messages: hi })).status).toBe(500)
    expect((await chat(gw, a, { model: "ws-charge", messages: hi, stream: true })).status).toBe(503)
    const third = await chat(gw, a, { model: "ws-charge", messages: hi, stream: true })
    await readBody(third)
    expect(third.status).toBeGreaterThanOrEqual(500)
    // A client that gives up before the first token: refunded too.
    mock.script(Behaviour.hangBeforeHeaders())
    const controller = new AbortController()
    const aborts = mock.clientAborts()
    const seen = mock.requests.length
    const pending = chat(gw, a, { model: "ws-charge", messages: hi, stream: true }, { signal: controller.signal }).catch(() => null)
    await eventually(() => expect(mock.requests.length).toBe(seen + 1))
    controller.abort()
    await pending
    await mock.waitForClientAborts(aborts + 1)
    await eventually(async () => {
      const rows = await rowsOf(gw, a)
      expect(rows.at(-1)?.status).toBe("cancelled")
    })
    expect(await standing(gw, a)).toEqual({
      session: { ...before.session, resets_in_seconds: expect.any(Number) },
      weekly: { ...before.weekly, resets_in_seconds: expect.any(Number) }
    })
    expect(await dailyUsage(gw, "ws-charge")).toBe(daily)
    const { rows } = await expectLedgerBalanced(gw, a, "ws-charge")
    expect(rows.slice(-4).map((r) => r.weighted_cost)).toEqual([0, 0, 0, 0])
  })

  it("after all of that, session used = weekly used = sum of the rows' weighted_cost", async () => {
    const { rows, charged } = await expectLedgerBalanced(gw, a, "ws-charge")
    expect(rows.map((r) => r.status)).toEqual(["success", "error", "cancelled", "error", "error", "error", "cancelled"])
    expect(charged).toBe(60 + (E + 10) + (E + 20))
  })
})
