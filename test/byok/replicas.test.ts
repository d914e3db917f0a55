/**
 * BYOK across two gateway replicas on one PostgreSQL database (same sealing key): what one replica learns or is
 * told about a credential (a provider rejecting it, a re-verification, a deletion, a new fallback model) reaches
 * the other through PG NOTIFY (`byok:<account>` on `wellspring_auth`), whose cached credential would otherwise
 * be served for a minute. Replica two is observed through its own `Credentials` service (no provider call) until
 * the announcement arrived (≤ 5 s), then asked over HTTP; the fake provider counts every call.
 */
import * as Crypto from "node:crypto"
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Credentials } from "../../src/byok/Credentials.js"
import { layerFromConfig } from "../../src/quota/layer.js"
import { call, newUser } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"
import { type FakeOpenAi, GOOD, startFakeOpenAi } from "./FakeOpenAi.js"
import { type CapturingGateway, startCapturingGateway } from "./support.js"
import { eventually } from "../support/Eventually.js"

const postgresAvailable = await serviceGate("postgres")
const BASE = "/api/user/me/byok"
const REFERENCE = { provider: "openai", label: null, model: "gpt-fake" } as const

const good = (tag: string) => `${GOOD}${tag}-${Crypto.randomBytes(8).toString("hex")}`

/** Polls until `check` holds, at most 5 s (NOTIFY delivery is asynchronous; the row cache lives 60 s). */
const within5s = <A>(check: () => Promise<A>, what: string) => eventually(check, { timeoutMs: 5_000, what })

type Seen = { readonly status: string; readonly fallback: string | null } | { readonly code: string }

/** What a replica's router currently believes about the account's primary `openai` credential (no provider call). */
const believed = (gw: CapturingGateway, accountId: string): Promise<Seen> =>
  gw.run(Effect.flatMap(Credentials, (credentials) =>
    credentials.resolve(accountId, REFERENCE).pipe(
      Effect.match({
        onFailure: (e): Seen => ({ code: e.code }),
        onSuccess: (c): Seen => ({ status: c.status, fallback: c.fallbackModelId })
      })
    )))

/** The status (or failure code) a replica's router would act on. */
const stateOn = async (gw: CapturingGateway, accountId: string): Promise<string> => {
  const seen = await believed(gw, accountId)
  return "status" in seen ? seen.status : seen.code
}

describe.skipIf(!postgresAvailable)("BYOK across replicas (PostgreSQL)", () => {
  let db: FreshDatabase
  let fake: FakeOpenAi
  let one: CapturingGateway
  let two: CapturingGateway

  const chat = (gw: CapturingGateway, key: string) =>
    call(gw, "POST", "/v1/chat/completions", {
      key,
      body: { model: "@openai/gpt-fake", messages: [{ role: "user", content: "hello" }] }
    })
  const save = async (key: string, secret: string) => {
    const r = await call(one, "POST", BASE, { key, body: { provider: "openai", secret } })
    expect(r.status, r.text).toBe(200)
    return r.body.data.credential as { id: number }
  }
  const callsWith = (secret: string) =>
    fake.requests.filter((r) => r.path.includes("/chat/completions") && r.headers.authorization === `Bearer ${secret}`).length

  beforeAll(async () => {
    fake = await startFakeOpenAi()
    db = await freshDatabase("byokrepl")
    const encryptionKey = Crypto.randomBytes(32).toString("hex")
    const start = () =>
      startCapturingGateway({
        databaseUrl: db.url,
        admission: layerFromConfig({ abuse: { burst: 1000, window_seconds: 10, cooldown_seconds: 60 } }),
        configure: (doc) => {
          doc.byok = {
            enabled: true,
            encryption_key: encryptionKey,
            providers: { openai: { base_url: `${fake.origin}/v1` } }
          }
        }
      })
    one = await start()
    two = await start()
  })
  afterAll(async () => {
    await one?.stop()
    await two?.stop()
    await fake?.close()
    await db?.drop()
  })

  it("rejected through replica one: replica two refuses without calling the provider; re-verified: routes again", async () => {
    const u = await newUser(one)
    const secret = good("reject")
    const credential = await save(u.key, secret)
    // Replica two routes once: it now holds the credential (active) in its cache.
    const first = await chat(two, u.key)
    expect(first.status, first.text).toBe(200)
    expect(callsWith(secret)).toBe(1)
    expect(await believed(two, u.account.id)).toEqual({ status: "active", fallback: null })

    // The provider revokes the key; one request through replica one finds out.
    fake.revoked.add(secret)
    const refused = await chat(one, u.key)
    expect(refused.status, refused.text).toBe(400)
    expect(refused.body.error.code).toBe("byok_credential_rejected")
    expect(callsWith(secret)).toBe(2)

    await within5s(async () => (await stateOn(two, u.account.id)) === "rejected", "replica two sees rejected")
    // Were replica two still serving its stale copy, this call would reach the provider (and, with the key
    // working again, succeed).
    fake.revoked.delete(secret)
    const onTwo = await chat(two, u.key)
    expect(onTwo.status, onTwo.text).toBe(400)
    expect(onTwo.body.error.code).toBe("byok_credential_rejected")
    expect(callsWith(secret)).toBe(2)
    const listed = await call(two, "GET", BASE, { key: u.key })
    expect(listed.body.data.credentials[0]).toMatchObject({ id: credential.id, status: "rejected", last_error_code: "auth_failed" })

    // Re-verification on replica one (the provider lists models again) is obeyed by replica two.
    const models = await call(one, "GET", `${BASE}/${credential.id}/models`, { key: u.key })
    expect(models.status, models.text).toBe(200)
    await within5s(async () => (await stateOn(two, u.account.id)) === "active", "replica two sees active")
    const again = await chat(two, u.key)
    expect(again.status, again.text).toBe(200)
    expect(callsWith(secret)).toBe(3)
  })

  it("deleted on replica one: replica two answers byok_credential_missing without calling the provider", async () => {
    const u = await newUser(one)
    const secret = good("delete")
    const credential = await save(u.key, secret)
    expect((await chat(two, u.key)).status).toBe(200)
    expect(callsWith(secret)).toBe(1)
    const deleted = await call(one, "DELETE", `${BASE}/${credential.id}`, { key: u.key })
    expect(deleted.status, deleted.text).toBe(200)
    await within5s(async () => (await stateOn(two, u.account.id)) === "byok_credential_missing", "replica two sees the deletion")
    expect(await believed(two, u.account.id)).toEqual({ code: "byok_credential_missing" })
    const r = await chat(two, u.key)
    expect(r.status, r.text).toBe(400)
    expect(r.body.error.code).toBe("byok_credential_missing")
    expect(callsWith(secret)).toBe(1)
  })

  it("a fallback model patched on replica one is obeyed by replica two", async () => {
    const u = await newUser(one)
    const secret = good("patch")
    const credential = await save(u.key, secret)
    const on = await call(one, "PUT", `${BASE}/fallback`, { key: u.key, body: { enabled: true } })
    expect(on.status, on.text).toBe(200)
    // Replica two caches the credential without a fallback model.
    expect((await chat(two, u.key)).status).toBe(200)
    expect(await believed(two, u.account.id)).toEqual({ status: "active", fallback: null })
    fake.fail.set(secret, 500)
    const patched = await call(one, "PATCH", `${BASE}/${credential.id}`, { key: u.key, body: { fallback_model_id: "ws-lite" } })
    expect(patched.status, patched.text).toBe(200)
    await within5s(async () => {
      const seen = await believed(two, u.account.id)
      return "fallback" in seen && seen.fallback === "ws-lite"
    }, "replica two sees the fallback model")
    // A stale copy would answer the provider's 500.
    const r = await chat(two, u.key)
    expect(r.status, r.text).toBe(200)
    expect(r.body.model).toBe("ws-lite")
    expect(callsWith(secret)).toBe(2)
  })
})
