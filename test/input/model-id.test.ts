/**
 * Issue #8 findings 1 and 12 (empty `model_id`): a request that fails before or during parsing still records a
 * meaningful, bounded `model_id`: the body's `model` when it is a string (control characters and lone
 * surrogates dropped, at most 128 characters), else `(unknown)`. Chat and embeddings, on embedded PGlite and
 * on PostgreSQL; the request log keeps recording afterwards.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { postChat, rowById, rowIdOf, user } from "../inference/helpers.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { authed, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { serviceGate } from "../support/Services.js"
import { nestedArrays, startInputGateway } from "./support.js"

const postgres = await serviceGate("postgres")
const hi = [user("hi")]
const LONG = "a\u0000" + "b".repeat(6000)

/** Body, expected status and code, expected `model_id`. */
const CHAT_CASES: ReadonlyArray<readonly [string, unknown, number, string, string]> = [
  ["invalid JSON", "{broken", 400, "invalid_json", "(unknown)"],
  ["JSON nested too deep", nestedArrays(1000), 400, "invalid_request", "(unknown)"],
  ["a body that is not an object", "[1,2]", 400, "invalid_request", "(unknown)"],
  ["a model that is not a string", { model: 5, messages: hi }, 400, "invalid_request", "(unknown)"],
  ["an empty model", { model: "", messages: hi }, 400, "model_not_found", "(unknown)"],
  ["a model with NUL", { model: "x\u0000y", messages: hi }, 400, "model_not_found", "xy"],
  ["a 6,000-character model with NUL", { model: LONG, messages: hi }, 400, "invalid_request", "a" + "b".repeat(127)],
  ["lone surrogates and control characters", { model: "\ud800ab\u0007c\udfff", messages: hi }, 400, "model_not_found", "abc"],
  ["a pair of surrogates is kept", { model: "모델😀", messages: hi }, 400, "model_not_found", "모델😀"],
  ["a known model with bad messages", { model: "ws-mock", messages: [] }, 400, "invalid_messages", "ws-mock"],
  ["a known model with a bad temperature", { model: "ws-mock", messages: hi, temperature: -5 }, 400, "invalid_request", "ws-mock"]
]

const EMBEDDING_CASES: ReadonlyArray<readonly [string, string, number, string, string]> = [
  ["invalid JSON", "{broken", 400, "invalid_json", "(unknown)"],
  ["a model with NUL", JSON.stringify({ model: "x\u0000y", input: "a" }), 400, "model_not_found", "xy"],
  ["a 6,000-character model", JSON.stringify({ model: LONG, input: "a" }), 400, "invalid_request", "a" + "b".repeat(127)],
  ["a token array", JSON.stringify({ model: "ws-embed", input: [1, 2, 3] }), 400, "invalid_request", "ws-embed"]
]

const suite = (name: string, databaseUrl: () => string | undefined) =>
  describe(`request rows' model_id (${name})`, () => {
    let gw: TestGateway
    let mock: MockUpstream

    beforeAll(async () => {
      mock = await startMockUpstream()
      const url = databaseUrl()
      gw = await startInputGateway({ mock, ...(url ? { databaseUrl: url } : {}) })
    })
    afterAll(async () => {
      await gw?.stop()
      await mock?.close()
    })

    it.each(CHAT_CASES)("chat, %s", async (_name, body, status, code, modelId) => {
      const res = await postChat(gw, body)
      const text = await res.text()
      expect([res.status, JSON.parse(text).error.code], text).toEqual([status, code])
      const row = await rowById(gw, rowIdOf(res))
      expect(row).toMatchObject({ status: "error", error_code: code, model_id: modelId })
    })

    it.each(EMBEDDING_CASES)("embeddings, %s", async (_name, body, status, code, modelId) => {
      const res = await fetch(`${gw.url}/v1/embeddings`, { method: "POST", headers: authed(gw.key), body })
      const text = await res.text()
      expect([res.status, JSON.parse(text).error.code], text).toEqual([status, code])
      const row = await rowById(gw, rowIdOf(res))
      expect(row).toMatchObject({ status: "error", error_code: code, model_id: modelId })
    })

    it("a valid request afterwards is answered and recorded under its model", async () => {
      mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 1, completion: 1 } })))
      const res = await postChat(gw, { model: "ws-mock", messages: hi })
      expect(res.status).toBe(200)
      expect(((await res.json()) as any).model).toBe("ws-mock")
      expect(await rowById(gw, rowIdOf(res))).toMatchObject({ status: "success", model_id: "ws-mock" })
    })
  })

suite("embedded PGlite", () => undefined)

describe.skipIf(!postgres)("on PostgreSQL", () => {
  let db: FreshDatabase
  beforeAll(async () => {
    db = await freshDatabase("input")
  })
  afterAll(async () => {
    await db?.drop()
  })
  suite("PostgreSQL", () => db.url)
})
