/**
 * Issue #8 finding 12: with the database unreachable, requests that need it get 503 `service_unavailable`
 * (retryable, says what is wrong), not 500 `internal_error`; when it comes back, they succeed again.
 * Real PostgreSQL: the gateway's database stops accepting connections and its sessions are terminated.
 * (Embedded PGlite runs inside the gateway process, so it cannot go away on its own.)
 */
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { POSTGRES, serviceGate } from "../support/Services.js"
import { eventually, HANGUL } from "../inference/helpers.js"
import { newUser } from "../accounts/support.js"

const postgres = await serviceGate("postgres")

const admin = async (text: string) => {
  const client = new pg.Client({ ...POSTGRES })
  await client.connect()
  try {
    await client.query(text)
  } finally {
    await client.end()
  }
}

describe.skipIf(!postgres)("database down", () => {
  let db: FreshDatabase
  let gw: TestGateway
  let key: string

  beforeAll(async () => {
    db = await freshDatabase("edgedown")
    gw = await startGateway({ databaseUrl: db.url })
    key = (await newUser(gw)).key
  })
  afterAll(async () => {
    await admin(`ALTER DATABASE ${db.name} ALLOW_CONNECTIONS true`).catch(() => undefined)
    await gw?.stop()
    await db?.drop()
  })

  const listKeys = () => fetch(`${gw.url}/api/user/me/keys`, { headers: { authorization: `Bearer ${key}` } })

  it("is 503 service_unavailable while the database is unreachable, and recovers", async () => {
    const up = await listKeys()
    expect(up.status).toBe(200)
    await up.arrayBuffer()

    await admin(`ALTER DATABASE ${db.name} ALLOW_CONNECTIONS false`)
    await admin(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '${db.name}' AND pid <> pg_backend_pid()`)

    // Every call while it is down: 503 with the service_unavailable envelope, never 500.
    for (let i = 0; i < 3; i++) {
      const res = await listKeys()
      const body = (await res.json()) as any
      expect(res.status, JSON.stringify(body)).toBe(503)
      expect([body.success, body.error.code, body.error.type]).toEqual([false, "service_unavailable", "service_unavailable"])
      expect(body.error.message).toMatch(HANGUL)
    }
    const me = await fetch(`${gw.url}/api/user/me`, { headers: { authorization: `Bearer ${key}` } })
    expect(me.status).toBe(503)
    expect(((await me.json()) as any).error.code).toBe("service_unavailable")

    await admin(`ALTER DATABASE ${db.name} ALLOW_CONNECTIONS true`)
    await eventually(async () => {
      const res = await listKeys()
      expect(res.status).toBe(200)
      expect(((await res.json()) as any).success).toBe(true)
    }, 15_000)
  })
})
