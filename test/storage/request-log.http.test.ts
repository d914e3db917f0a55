/**
 * Finding 1 of issue #8 over HTTP, on embedded PGlite and PostgreSQL: requests whose model is `"x\u0000y"`, a
 * 6,000-character name or a lone surrogate, mixed with valid requests of other accounts, never stop the request
 * log. After a flush every valid request has its row, the hostile ones are stored cleaned (or dropped and
 * counted), and a later request is recorded too.
 */
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import { RequestLog } from "../../src/telemetry/RequestLog.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"

const postgres = await serviceGate("postgres")

const HOSTILE_MODELS = ["x\u0000y", "m".repeat(6_000), Crypto.randomBytes(3_000).toString("hex"), "\ud800lone", "tab\there\u001b"]

interface Sent {
  readonly rowId: number
  readonly account: string
  readonly hostile: boolean
  readonly status: number
}

const suite = (name: string, database: () => Promise<FreshDatabase | undefined>) =>
  describe(`request log under hostile model names (${name})`, () => {
    let gw: TestGateway
    let db: FreshDatabase | undefined
    const users: Array<{ account: string; key: string }> = []

    beforeAll(async () => {
      db = await database()
      gw = await startGateway({
        admission: makeUnlimitedAdmission().layer,
        ...(db ? { databaseUrl: db.url } : {}),
        // Rows wait for the explicit flush: every row of the test goes through one writer pass.
        configure: (doc) => void (doc.request_log = { batch_size: 200, flush_ms: 600_000 })
      })
      for (let i = 0; i < 3; i++) {
        users.push(await gw.run(Effect.gen(function*() {
          const repo = yield* AccountsRepo
          const account = yield* repo.createAccount({
            username: `rl_${i}_${Crypto.randomBytes(3).toString("hex")}`,
            displayName: "기록",
            email: `rl${i}@example.com`,
            emailVerified: true
          })
          const { key } = yield* repo.createKey(account.id, "rl")
          return { account: account.id, key }
        })))
      }
    })
    afterAll(async () => {
      await gw?.stop()
      await db?.drop()
    })

    const send = async (user: { account: string; key: string }, model: string, hostile: boolean): Promise<Sent> => {
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${user.key}`, "content-type": "application/json" },
        body: JSON.stringify({ model, messages: [{ role: "user", content: "안녕" }] })
      })
      const text = await res.text()
      expect(res.status, text.slice(0, 300)).toBeLessThan(500)
      expect(text.length).toBeLessThan(16_384)
      if (!hostile) expect(res.status, text.slice(0, 300)).toBe(200)
      const rowId = Number(res.headers.get("x-request-id"))
      expect(Number.isSafeInteger(rowId) && rowId > 0).toBe(true)
      return { rowId, account: user.account, hostile, status: res.status }
    }

    const rows = (ids: ReadonlyArray<number>) =>
      gw.run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql<{ id: number; account_id: string; model_id: string; error: string | null }>`
          SELECT id, account_id, model_id, error FROM request_log WHERE id IN ${sql.in(ids)}`).pipe(Effect.orDie))

    const log = () => gw.run(RequestLog)

    it("valid rows of every account are written; hostile ones are cleaned or counted; the log keeps going", async () => {
      const droppedBefore = (await log()).dropped()
      const sent: Array<Sent> = []
      // Interleaved: each account's valid request sits next to hostile ones in the same batch.
      for (const model of HOSTILE_MODELS) {
        for (const user of users) {
          sent.push(await send(user, "ws-lite", false))
          sent.push(await send(user, model, true))
        }
      }
      expect((await log()).pending()).toBe(sent.length)
      await gw.run(Effect.flatMap(RequestLog, (l) => l.flush))
      expect((await log()).pending()).toBe(0)

      const stored = await rows(sent.map((s) => s.rowId))
      const byId = new Map(stored.map((r) => [Number(r.id), r]))
      for (const s of sent.filter((s) => !s.hostile)) {
        expect(byId.get(s.rowId)?.account_id, `valid row ${s.rowId}`).toBe(s.account)
        expect(byId.get(s.rowId)?.model_id).toBe("ws-lite")
      }
      const hostile = sent.filter((s) => s.hostile)
      const storedHostile = hostile.filter((s) => byId.has(s.rowId))
      expect(storedHostile.length + ((await log()).dropped() - droppedBefore)).toBe(hostile.length)
      for (const s of storedHostile) {
        const r = byId.get(s.rowId)!
        expect(r.account_id).toBe(s.account)
        expect(r.model_id.length).toBeLessThanOrEqual(128)
        expect(r.model_id).not.toMatch(/[\u0000-\u001f\u007f]/)
        expect(r.model_id).not.toMatch(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/)
        expect((r.error ?? "").length).toBeLessThanOrEqual(500)
        expect(r.error ?? "").not.toContain("\u0000")
      }

      // Later requests of every account are recorded: the log did not stop.
      const later = await Promise.all(users.map((u) => send(u, "ws-lite", false)))
      await gw.run(Effect.flatMap(RequestLog, (l) => l.flush))
      expect((await rows(later.map((s) => s.rowId))).map((r) => r.account_id).sort()).toEqual(users.map((u) => u.account).sort())
    })
  })

suite("embedded PGlite", async () => undefined)
describe.skipIf(!postgres)("real PostgreSQL", () => {
  suite("PostgreSQL", () => freshDatabase("rl_http"))
})
