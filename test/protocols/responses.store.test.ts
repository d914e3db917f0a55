/**
 * Stored responses (protocols/responses/Store.ts) on the embedded database and on PostgreSQL: the write comes
 * after the answer (no statement on `stored_responses` while the request runs, and none until the writer
 * flushes, yet the response is already retrievable), expiry (never read past it, deleted by the sweep), the
 * per-account bounds (count and bytes, oldest first), the per-response bound, and conversation chains across
 * the queue and the table.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ResponseStore } from "../../src/protocols/responses/Store.js"
import { newAccount } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { query } from "../support/Rows.js"
import { POSTGRES, reachable, requireServices } from "../support/Services.js"
import { makeSqlCounter } from "../support/SqlCounter.js"

const HOUR = 3_600_000
const postgresUp = await reachable(POSTGRES.host, POSTGRES.port)

const user = (text: string) => [{ role: "user" as const, content: text }]

describe.each([
  ["embedded PGlite", false],
  ["PostgreSQL", true]
])("stored responses on %s", (_name, postgres) => {
  const skip = postgres && !postgresUp && !requireServices
  let gw: TestGateway
  let db: FreshDatabase | null = null
  const counter = makeSqlCounter()
  const store = <A>(f: (s: typeof ResponseStore.Service) => Effect.Effect<A>) => gw.run(Effect.flatMap(ResponseStore, f))
  const count = async (accountId: string) =>
    (await query<{ n: number }>(gw, "SELECT count(*)::int AS n FROM stored_responses WHERE account_id = $1", [accountId]))[0]!.n
  const idsOf = async (accountId: string) =>
    (await query<{ id: string }>(gw, "SELECT id FROM stored_responses WHERE account_id = $1 ORDER BY created_at", [accountId]))
      .map((r) => r.id)

  beforeAll(async () => {
    if (skip) return
    db = postgres ? await freshDatabase("responses") : null
    gw = await startGateway({
      ...(db ? { databaseUrl: db.url } : {}),
      sqlTap: counter.tap,
      configure: (doc) => {
        doc.responses = {
          store_hours: 24,
          max_response_bytes: 20_000,
          max_account_bytes: 5_000,
          max_account_responses: 3,
          // Written only when a test flushes.
          flush_ms: 3_600_000
        }
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
  })

  it.skipIf(skip)("the write comes after the answer: no statement on the table while the request runs", async () => {
    const before = counter.texts().length
    const res = await fetch(`${gw.url}/v1/responses`, {
      method: "POST",
      headers: authed(gw.key),
      body: JSON.stringify({ model: "ws-pro", input: "keep me" })
    })
    expect(res.status).toBe(200)
    const body = await res.json() as { id: string; output: Array<unknown> }
    const during = counter.texts().slice(before)
    expect(during.filter((t) => t.includes("stored_responses"))).toEqual([])
    const owner = (await query<{ id: string }>(gw, "SELECT id FROM accounts WHERE username = 'dev'"))[0]!.id
    expect(await count(owner)).toBe(0)
    // Retrievable before it is written (from the writer's queue)...
    const queued = await fetch(`${gw.url}/v1/responses/${body.id}`, { headers: authed(gw.key) })
    expect(queued.status).toBe(200)
    expect((await queued.json() as { output: unknown }).output).toEqual(body.output)
    // ...and after.
    await store((s) => s.flush)
    expect(await count(owner)).toBe(1)
    expect(await store((s) => Effect.sync(() => s.pending()))).toBe(0)
    const written = await fetch(`${gw.url}/v1/responses/${body.id}`, { headers: authed(gw.key) })
    expect((await written.json() as { id: string }).id).toBe(body.id)
  })

  it.skipIf(skip)("expired responses are never read and are deleted by the sweep", async () => {
    const account = await newAccount(gw)
    const now = Date.now()
    const id = `resp_expiry_${postgres ? "pg" : "lite"}`
    expect(await store((s) => Effect.sync(() =>
      s.put({ id, accountId: account.id, previousId: null, createdAt: now, messages: user("x"), response: { id } })
    ))).toBe(true)
    // Queued: the expiry applies as well.
    expect(await store((s) => s.get(account.id, id, now + 25 * HOUR))).toBeNull()
    await store((s) => s.flush)
    expect(await store((s) => s.get(account.id, id, now + HOUR))).toEqual({ id })
    expect(await store((s) => s.get(account.id, id, now + 24 * HOUR))).toBeNull()
    expect((await store((s) => s.chain(account.id, id, now + 24 * HOUR, 10)))._tag).toBe("NotFound")
    expect(await store((s) => s.sweep(now + 23 * HOUR))).toBe(0)
    expect(await count(account.id)).toBe(1)
    expect(await store((s) => s.sweep(now + 24 * HOUR))).toBeGreaterThanOrEqual(1)
    expect(await count(account.id)).toBe(0)
  })

  it.skipIf(skip)("per account: past the count or the bytes, the oldest go; other accounts are untouched", async () => {
    const [a, b, c] = [await newAccount(gw), await newAccount(gw), await newAccount(gw)]
    const now = Date.now()
    const put = (accountId: string, id: string, at: number, text: string) =>
      store((s) =>
        Effect.sync(() => s.put({ id, accountId, previousId: null, createdAt: at, messages: user(text), response: { id } }))
      )
    for (let i = 0; i < 5; i++) await put(a.id, `resp_a${i}_${a.id}`, now + i, "small")
    await put(b.id, `resp_b0_${b.id}`, now, "small")
    // About 2,000 bytes each: two fit in 5,000.
    for (let i = 0; i < 3; i++) await put(c.id, `resp_c${i}_${c.id}`, now + i, "y".repeat(2_000))
    await store((s) => s.flush)
    expect(await idsOf(a.id)).toEqual([2, 3, 4].map((i) => `resp_a${i}_${a.id}`))
    expect(await idsOf(b.id)).toEqual([`resp_b0_${b.id}`])
    expect(await idsOf(c.id)).toEqual([1, 2].map((i) => `resp_c${i}_${c.id}`))
  })

  it.skipIf(skip)("a response over max_response_bytes is answered but not kept", async () => {
    const res = await fetch(`${gw.url}/v1/responses`, {
      method: "POST",
      headers: authed(gw.key),
      body: JSON.stringify({ model: "ws-lite", input: "z".repeat(25_000) })
    })
    expect(res.status).toBe(200)
    const { id } = await res.json() as { id: string }
    await store((s) => s.flush)
    const got = await fetch(`${gw.url}/v1/responses/${id}`, { headers: authed(gw.key) })
    expect(got.status).toBe(404)
  })

  it.skipIf(skip)("a conversation chain spans the table and the queue; depth is bounded; another account sees nothing", async () => {
    const [owner, other] = [await newAccount(gw), await newAccount(gw)]
    const now = Date.now()
    const link = (id: string, previousId: string | null, text: string, at: number) =>
      store((s) =>
        Effect.sync(() => s.put({ id, accountId: owner.id, previousId, createdAt: at, messages: user(text), response: { id } }))
      )
    await link(`r1_${owner.id}`, null, "one", now)
    await link(`r2_${owner.id}`, `r1_${owner.id}`, "two", now + 1)
    await store((s) => s.flush)
    await link(`r3_${owner.id}`, `r2_${owner.id}`, "three", now + 2)
    const chain = await store((s) => s.chain(owner.id, `r3_${owner.id}`, now + 3, 10))
    expect(chain).toEqual({ _tag: "Found", messages: [...user("one"), ...user("two"), ...user("three")] })
    expect((await store((s) => s.chain(owner.id, `r3_${owner.id}`, now + 3, 2)))._tag).toBe("TooLong")
    // Bounded within the queue too.
    await link(`r4_${owner.id}`, `r3_${owner.id}`, "four", now + 3)
    expect((await store((s) => s.chain(owner.id, `r4_${owner.id}`, now + 4, 1)))._tag).toBe("TooLong")
    expect((await store((s) => s.chain(owner.id, `r4_${owner.id}`, now + 4, 4)))._tag).toBe("Found")
    expect((await store((s) => s.chain(owner.id, `r2_${owner.id}`, now + 3, 1)))._tag).toBe("TooLong")
    expect(await store((s) => s.chain(owner.id, `r2_${owner.id}`, now + 3, 2))).toEqual({
      _tag: "Found",
      messages: [...user("one"), ...user("two")]
    })
    expect((await store((s) => s.chain(other.id, `r3_${owner.id}`, now + 3, 10)))._tag).toBe("NotFound")
    expect((await store((s) => s.chain(other.id, `r2_${owner.id}`, now + 3, 10)))._tag).toBe("NotFound")
    expect(await store((s) => s.get(other.id, `r2_${owner.id}`, now + 3))).toBeNull()
    expect(await store((s) => s.remove(other.id, `r2_${owner.id}`))).toBe(false)
    expect(await store((s) => s.remove(owner.id, `r3_${owner.id}`))).toBe(true)
    expect((await store((s) => s.chain(owner.id, `r3_${owner.id}`, now + 3, 10)))._tag).toBe("NotFound")
  })
})
