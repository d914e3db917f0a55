/**
 * Request rows (issue [2/4] §5, ARCHITECTURE §8): every request, success or error, leaves exactly one
 * `request_log` row, written by the batched writer off the response path; ids are unique across id
 * blocks. Runs against embedded PGlite and against real PostgreSQL.
 */
import { SqlClient } from "effect/sql"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { RequestLog } from "../../src/telemetry/RequestLog.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { parseSse, postChat, user } from "./helpers.js"

const postgres = await serviceGate("postgres")

const tool = { type: "function", function: { name: "t" } }
/** Mixed traffic: what each request sends and the status and row it must leave. */
const KINDS = [
  { body: { model: "ws-lite", messages: [user("plain")] }, status: 200, row: ["success", null] },
  { body: { model: "ws-lite", messages: [user("streamed")], stream: true }, status: 200, row: ["success", null] },
  { body: "{broken", status: 400, row: ["error", "invalid_json"] },
  { body: { model: "no-such-model", messages: [user("x")] }, status: 400, row: ["error", "model_not_found"] },
  { body: { model: "ws-lite", messages: [user("x")], tools: [tool] }, status: 400, row: ["error", "tools_not_supported"] },
  { body: { model: "ws-lite", messages: [] }, status: 400, row: ["error", "invalid_messages"] },
  { body: { model: "ws-pro", messages: [user("think")], stream: true, reasoning_effort: "low" }, status: 200, row: ["success", null] }
] as const

interface Sent {
  readonly kind: number
  readonly rowId: number
  readonly correlation: string
}

/** `total` requests with at most `concurrency` in flight; checks each response as it completes. */
const burst = async (gw: TestGateway, total: number, concurrency: number): Promise<Array<Sent>> => {
  const sent: Array<Sent> = []
  let next = 0
  const worker = async () => {
    while (next < total) {
      const i = next++
      const kind = i % KINDS.length
      const spec = KINDS[kind]!
      const res = await postChat(gw, spec.body)
      const text = await res.text()
      expect(res.status, text).toBe(spec.status)
      if (typeof spec.body === "object" && "stream" in spec.body) expect(parseSse(text).doneLast).toBe(true)
      sent.push({ kind, rowId: Number(res.headers.get("x-request-id")), correlation: res.headers.get("x-wellspring-request-id")! })
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
  return sent
}

interface Row {
  readonly id: number
  readonly request_id: string
  readonly status: string
  readonly error_code: string | null
}

const allRows = (gw: TestGateway) =>
  gw.run(Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    return (yield* sql<Row>`SELECT id, request_id, status, error_code FROM request_log ORDER BY id`) as Array<Row>
  }).pipe(Effect.orDie))

/** Every response has exactly one row, with its ids, status and code. */
const expectRows = (sent: ReadonlyArray<Sent>, rows: ReadonlyArray<Row>) => {
  expect(rows).toHaveLength(sent.length)
  expect(new Set(rows.map((r) => r.id)).size).toBe(sent.length)
  expect(new Set(sent.map((s) => s.rowId)).size).toBe(sent.length)
  const byId = new Map(rows.map((r) => [Number(r.id), r]))
  for (const s of sent) {
    const row = byId.get(s.rowId)
    expect(row, `row ${s.rowId}`).toBeDefined()
    expect([row!.request_id, row!.status, row!.error_code]).toEqual([s.correlation, ...KINDS[s.kind]!.row])
  }
}

const suite = (name: string, databaseUrl: () => Promise<FreshDatabase | undefined>) =>
  describe(`request rows (${name})`, () => {
    let gw: TestGateway
    let db: FreshDatabase | undefined
    const adm = makeUnlimitedAdmission()

    beforeAll(async () => {
      db = await databaseUrl()
      gw = await startGateway({
        admission: adm.layer,
        ...(db ? { databaseUrl: db.url } : {}),
        // The periodic flush never fires during the test: rows wait in the writer's queue.
        configure: (doc) => {
          doc.request_log = { batch_size: 200, flush_ms: 600_000 }
          // The invalid kinds are deliberate: keep the per-key failure limit out of this count.
          doc.limits = { failed_requests_per_minute: 100_000 }
        }
      })
    })
    afterAll(async () => {
      await gw?.stop()
      await db?.drop()
    })

    it("1,000 mixed requests: the responses never wait on the database; after a flush exactly 1,000 rows with unique ids", async () => {
      const sent = await burst(gw, 1_000, 32)
      // Every response is complete, and not one row has been written: the writer is off the response path.
      expect(await gw.run(RequestLog.pipe(Effect.map((log) => log.pending())))).toBe(1_000)
      expect(await allRows(gw)).toHaveLength(0)
      await gw.run(Effect.flatMap(RequestLog, (log) => log.flush))
      expect(await gw.run(RequestLog.pipe(Effect.map((log) => log.pending())))).toBe(0)
      expectRows(sent, await allRows(gw))
      expect(adm.stats.open).toBe(0)
    })

    it("concurrent ids across several id blocks (1000 each) are unique and never fail", async () => {
      const ids = await gw.run(Effect.flatMap(RequestLog, (log) =>
        Effect.all(Array.from({ length: 3_500 }, () => log.nextId), { concurrency: "unbounded" })))
      expect(new Set(ids).size).toBe(3_500)
      expect(ids.every((id) => Number.isInteger(id) && id > 0)).toBe(true)
    })
  })

suite("embedded PGlite", async () => undefined)

describe.skipIf(!postgres)("real PostgreSQL", () => {
  suite("PostgreSQL", () => freshDatabase("rows"))

  describe("request rows with the periodic writer busy (PostgreSQL)", () => {
    let gw: TestGateway
    let db: FreshDatabase
    const adm = makeUnlimitedAdmission()

    beforeAll(async () => {
      db = await freshDatabase("rows_busy")
      gw = await startGateway({
        admission: adm.layer,
        databaseUrl: db.url,
        // Small batches written every few ms: an explicit flush often meets a write in progress.
        configure: (doc) => {
          doc.request_log = { batch_size: 25, flush_ms: 5 }
          doc.limits = { failed_requests_per_minute: 100_000 }
        }
      })
    })
    afterAll(async () => {
      await gw?.stop()
      await db?.drop()
    })

    it("flush waits for batches already being written: no row is missing right after it", async () => {
      for (let round = 0; round < 5; round++) {
        const sent = await burst(gw, 140, 32)
        await gw.run(Effect.flatMap(RequestLog, (log) => log.flush))
        const rows = await allRows(gw)
        const ids = new Set(rows.map((r) => Number(r.id)))
        const missing = sent.filter((s) => !ids.has(s.rowId))
        expect(missing, `round ${round}`).toEqual([])
      }
      const total = await allRows(gw)
      expect(total).toHaveLength(700)
      expect(new Set(total.map((r) => r.id)).size).toBe(700)
    })
  })
})
