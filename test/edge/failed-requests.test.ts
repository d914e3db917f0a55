/**
 * Issue #8 finding 8: a key that keeps sending invalid requests gets 429 `too_many_failed_requests` after
 * `limits.failed_requests_per_minute`, before its body is read: no parsing, no request row. Other keys and valid
 * requests are unaffected. On embedded PGlite and on real PostgreSQL (the rows are the point).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { newUser } from "../accounts/support.js"
import { countRows, HANGUL, rowById } from "../inference/helpers.js"
import { connect, head, within } from "./raw.js"

const postgres = await serviceGate("postgres")
const LIMIT = 5

const suite = (label: string, database: () => Promise<FreshDatabase | null>) =>
  describe(label, () => {
    let gw: TestGateway
    let db: FreshDatabase | null = null

    beforeAll(async () => {
      db = await database()
      gw = await startGateway({
        ...(db ? { databaseUrl: db.url } : {}),
        configure: (doc) => void (doc.limits.failed_requests_per_minute = LIMIT)
      })
    })
    afterAll(async () => {
      await gw?.stop()
      await db?.drop()
    })

    const post = (key: string, path: string, body: string) =>
      fetch(`${gw.url}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body
      })
    const unknownModel = JSON.stringify({ model: "no-such-model", messages: [{ role: "user", content: "x" }] })
    const valid = JSON.stringify({ model: "ws-lite", messages: [{ role: "user", content: "hello" }] })

    it("a flood of invalid requests gets 429 after the limit and leaves no rows for them", async () => {
      const { key } = await newUser(gw)
      const rowsBefore = await countRows(gw)

      for (let i = 0; i < LIMIT; i++) {
        const res = await post(key, "/v1/chat/completions", i % 2 === 0 ? unknownModel : "{broken")
        expect(res.status).toBe(400)
        await res.arrayBuffer()
      }
      const refused = await Promise.all(Array.from({ length: 40 }, (_, i) =>
        post(key, i % 2 === 0 ? "/v1/chat/completions" : "/v1/embeddings", "{broken").then(async (res) => ({
          status: res.status,
          retryAfter: Number(res.headers.get("retry-after")),
          body: (await res.json()) as any
        }))))
      for (const r of refused) {
        expect(r.status).toBe(429)
        expect(r.body.error.code).toBe("too_many_failed_requests")
        expect(r.body.error.type).toBe("rate_limit_error")
        expect(r.body.error.message).toMatch(HANGUL)
        expect(r.retryAfter).toBeGreaterThan(0)
        expect(r.retryAfter).toBeLessThanOrEqual(61)
      }
      // Only the LIMIT failures that were parsed left rows; the 40 refusals left none.
      expect(await countRows(gw)).toBe(rowsBefore + LIMIT)

      // Even a valid request of this key waits out the window.
      expect((await post(key, "/v1/chat/completions", valid)).status).toBe(429)
    })

    it("the refusal does not read the body and closes the connection", async () => {
      const { key } = await newUser(gw)
      for (let i = 0; i < LIMIT; i++) await (await post(key, "/v1/embeddings", "[")).arrayBuffer()
      const conn = await connect(gw.port)
      await conn.write(head("POST", "/v1/chat/completions", {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        "content-length": 50_000_000
      }))
      await conn.write(Buffer.alloc(1024, "{"))
      const res = await conn.response(5_000)
      expect(res.status).toBe(429)
      expect(res.headers.connection).toBe("close")
      expect(Number(res.headers["retry-after"])).toBeGreaterThan(0)
      expect(JSON.parse(res.body).error.code).toBe("too_many_failed_requests")
      await within(conn.closed, 5_000, "server closes the connection")
      expect(conn.sent()).toBeLessThan(4096)
    })

    it("other keys are unaffected and a valid request is answered and recorded", async () => {
      const flooder = await newUser(gw)
      for (let i = 0; i < LIMIT + 3; i++) await (await post(flooder.key, "/v1/chat/completions", unknownModel)).arrayBuffer()
      expect((await post(flooder.key, "/v1/chat/completions", unknownModel)).status).toBe(429)

      const other = await newUser(gw)
      const res = await post(other.key, "/v1/chat/completions", valid)
      expect(res.status).toBe(200)
      await res.arrayBuffer()
      const row = await rowById(gw, Number(res.headers.get("x-request-id")))
      expect([row.status, row.http_status, row.model_id]).toEqual(["success", 200, "ws-lite"])
    })

    it("413s count as failures, 401s do not block anyone", async () => {
      const { key } = await newUser(gw)
      for (let i = 0; i < 3 * LIMIT; i++) {
        const res = await post("sk-ws-unknownkeyunknownkeyunknownkey", "/v1/chat/completions", unknownModel)
        expect(res.status).toBe(401)
        await res.arrayBuffer()
      }
      for (let i = 0; i < LIMIT; i++) {
        const conn = await connect(gw.port)
        await conn.write(head("POST", "/v1/chat/completions", {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
          "content-length": 999_999_999
        }))
        expect((await conn.response(5_000)).status).toBe(413)
        conn.destroy()
      }
      expect((await post(key, "/v1/chat/completions", valid)).status).toBe(429)
    })
  })

suite("failed-request limit (PGlite)", async () => null)
describe.skipIf(!postgres)("on PostgreSQL", () => {
  suite("failed-request limit (PostgreSQL)", () => freshDatabase("edge"))
})
