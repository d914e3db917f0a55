import { Context, Effect, Exit, Layer, ManagedRuntime, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Accounts from "../../src/accounts/AccountsRepo.js"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import { KeyStore } from "../../src/auth/KeyStore.js"
import * as KeyStoreModule from "../../src/auth/KeyStore.js"
import { loadConfig } from "../../src/config/GatewayConfig.js"
import { Settings } from "../../src/config/Live.js"
import * as EmbeddedLock from "../../src/store/EmbeddedLock.js"
import * as Sql from "../../src/store/Sql.js"
import { freshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"

const postgres = await serviceGate("postgres")

const { config, path } = loadConfig({ path: "config/gateway.yaml", env: {} })

const settings = (encryptionKey: Buffer | null): Context.Service.Shape<typeof Settings> => ({
  config,
  path,
  encryptionKey,
  embedded: false,
  planFor: () => config.plans[config.default_plan]!
})

const KEK = Crypto.randomBytes(32)
const repoWith = (encryptionKey: Buffer | null) =>
  Layer.merge(Accounts.layer.pipe(Layer.provide(Layer.succeed(Settings, settings(encryptionKey)))), KeyStoreModule.layer)

const sha256 = (s: string) => Crypto.createHash("sha256").update(s).digest("hex")

interface Backend {
  readonly name: string
  readonly enabled: boolean
  readonly open: () => Promise<{ readonly layer: ReturnType<typeof Sql.layerSql>; readonly close: () => Promise<void> }>
}

const backends: ReadonlyArray<Backend> = [
  {
    name: "embedded PGlite",
    enabled: true,
    open: async () => {
      const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-store-"))
      return {
        layer: Sql.layerSql({ dataDir: dir }),
        close: async () => Fs.rmSync(dir, { recursive: true, force: true })
      }
    }
  },
  {
    name: "PostgreSQL",
    enabled: postgres,
    open: async () => {
      const db = await freshDatabase("store")
      return { layer: Sql.layerSql({ databaseUrl: Redacted.make(db.url), dataDir: "unused" }), close: db.drop }
    }
  }
]

for (const backend of backends) {
  describe.skipIf(!backend.enabled)(`storage on ${backend.name}`, () => {
    type R = SqlClient.SqlClient
    let runtime: ManagedRuntime.ManagedRuntime<R, unknown>
    let close: () => Promise<void>
    const run = <A>(effect: Effect.Effect<A, never, R | AccountsRepo | KeyStore>, kek: Buffer | null = KEK) =>
      runtime.runPromise(Effect.provide(effect, repoWith(kek)))
    const sql = <A extends object>(query: (sql: SqlClient.SqlClient) => Effect.Effect<ReadonlyArray<A>, unknown>) =>
      runtime.runPromise(Effect.flatMap(SqlClient.SqlClient, query).pipe(Effect.orDie))
    let seq = 0
    const newAccount = (extra: Partial<Accounts.NewAccount> = {}) =>
      run(Effect.flatMap(AccountsRepo, (repo) =>
        repo.createAccount({ username: `user${++seq}_${Date.now()}`, displayName: "이용자", ...extra })
      ))

    beforeAll(async () => {
      const opened = await backend.open()
      close = opened.close
      runtime = ManagedRuntime.make(opened.layer as Layer.Layer<R, unknown>)
      await runtime.runPromise(Effect.void)
    })
    afterAll(async () => {
      await runtime?.dispose()
      await close?.()
    })

    it("migrations apply every table, and a second run is a no-op", async () => {
      const tables = await sql<{ table_name: string }>((s) =>
        s`SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'`
      )
      const names = tables.map((t) => t.table_name)
      for (const t of ["accounts", "api_keys", "sessions", "request_log", "audit_log", "wellspring_migrations"]) {
        expect(names).toContain(t)
      }
      const known = await Effect.runPromise(Sql.migrations)
      const applied = await sql<{ migration_id: number; name: string }>((s) =>
        s`SELECT migration_id, name FROM wellspring_migrations ORDER BY migration_id`
      )
      expect(applied.map((a) => [a.migration_id, a.name])).toEqual(known.map(([id, name]) => [id, name]))
      expect(applied[0]).toEqual({ migration_id: 1, name: "init" })
      const again = await runtime.runPromise(Sql.runMigrations.pipe(Effect.orDie))
      expect(again).toEqual([])
      expect(await sql((s) => s`SELECT name FROM wellspring_migrations`)).toHaveLength(known.length)
    })

    it("creates and finds accounts; usernames are unique", async () => {
      const guestUntil = new Date(Date.now() + 3_600_000)
      const created = await newAccount({
        communityId: "c-1",
        communityType: "discord",
        email: "a@example.com",
        isAdmin: true,
        isGuest: true,
        guestExpiresAt: guestUntil,
        plan: "community",
        status: "unlinked"
      })
      expect(created.id).toMatch(/^acc_[0-9a-f]{20}$/)
      expect(Number.isInteger(created.display_id)).toBe(true)
      expect(created).toMatchObject({
        display_name: "이용자",
        community_id: "c-1",
        community_type: "discord",
        email: "a@example.com",
        status: "unlinked",
        is_admin: true,
        is_guest: true,
        is_legacy: false,
        needs_migration: false,
        plan: "community"
      })
      expect(created.email_verified_at).toBeInstanceOf(Date)
      expect(created.guest_expires_at!.getTime()).toBe(guestUntil.getTime())
      const byId = await run(Effect.flatMap(AccountsRepo, (r) => r.findAccount(created.id)))
      const byName = await run(Effect.flatMap(AccountsRepo, (r) => r.findAccountByUsername(created.username)))
      expect(byId).toEqual(created)
      expect(byName).toEqual(created)
      expect(await run(Effect.flatMap(AccountsRepo, (r) => r.findAccount("acc_nope")))).toBeNull()

      const plain = await newAccount()
      expect(plain).toMatchObject({ status: "active", is_admin: false, is_guest: false, email: null, plan: null })
      expect(plain.email_verified_at).toBeNull()
      expect(plain.display_id).toBeGreaterThan(created.display_id)

      const duplicate = await runtime.runPromiseExit(Effect.provide(
        Effect.flatMap(AccountsRepo, (r) => r.createAccount({ username: created.username, displayName: "x" })),
        repoWith(KEK)
      ))
      expect(Exit.isFailure(duplicate)).toBe(true)

      expect(await run(Effect.flatMap(AccountsRepo, (r) => r.setStatus(plain.id, "revoked")))).toBe(true)
      expect((await run(Effect.flatMap(AccountsRepo, (r) => r.findAccount(plain.id))))!.status).toBe("revoked")
      expect(await run(Effect.flatMap(AccountsRepo, (r) => r.setStatus("acc_nope", "active")))).toBe(false)
    })

    it("creates keys: prefix, hash and 16-char prefix stored, never the plaintext", async () => {
      const account = await newAccount()
      const { key, row } = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, "첫 키")))
      expect(key).toMatch(new RegExp(`^${config.key_prefix}[0-9A-Za-z]{43}$`))
      expect(typeof row.id).toBe("number")
      expect(row).toMatchObject({
        account_id: account.id,
        label: "첫 키",
        key_hash: sha256(key),
        key_prefix: key.slice(0, 16),
        legacy: false,
        revoked_at: null,
        last_used_at: null
      })
      const dump = await sql<{ t: string }>((s) => s`SELECT api_keys::text AS t FROM api_keys`)
      const secret = key.slice(16)
      for (const { t } of dump) {
        expect(t).not.toContain(key)
        expect(t).not.toContain(secret)
      }
      const legacy = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, "old", { legacy: true })))
      expect(legacy.key).toMatch(/^ws-[0-9A-Za-z]{43}$/)
      expect(legacy.row).toMatchObject({ legacy: true, key_prefix: legacy.key.slice(0, 16), ciphertext: null })

      const long = "가".repeat(45)
      const truncated = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, long)))
      expect(truncated.row.label).toBe("가".repeat(40))

      const found = await run(Effect.flatMap(KeyStore, (r) => r.findActiveKeyByHash(sha256(key))))
      expect(found!.key.id).toBe(row.id)
      expect(found!.account.id).toBe(account.id)
      expect(await run(Effect.flatMap(KeyStore, (r) => r.findActiveKeyByHash(sha256(key + "x"))))).toBeNull()
    })

    it("lists active keys oldest first, revokes only the owner's, rotates in one step", async () => {
      const owner = await newAccount()
      const other = await newAccount()
      const keys = await run(Effect.flatMap(AccountsRepo, (r) =>
        Effect.forEach(["a", "b", "c"], (label) => r.createKey(owner.id, label))
      ))
      const list = () => run(Effect.flatMap(AccountsRepo, (r) => r.listActiveKeys(owner.id)))
      expect((await list()).map((k) => k.label)).toEqual(["a", "b", "c"])
      expect(await run(Effect.flatMap(AccountsRepo, (r) => r.countActiveKeys(owner.id)))).toBe(3)

      const target = keys[1]!.row.id
      expect(await run(Effect.flatMap(AccountsRepo, (r) => r.revokeKey(other.id, target)))).toBeNull()
      const revoked = await run(Effect.flatMap(AccountsRepo, (r) => r.revokeKey(owner.id, target)))
      expect(revoked!.revoked_at).toBeInstanceOf(Date)
      expect(await run(Effect.flatMap(AccountsRepo, (r) => r.revokeKey(owner.id, target)))).toBeNull()
      expect(await run(Effect.flatMap(AccountsRepo, (r) => r.revokeKeyById(target)))).toBeNull()
      expect((await list()).map((k) => k.label)).toEqual(["a", "c"])
      expect(await run(Effect.flatMap(KeyStore, (r) => r.findActiveKeyByHash(sha256(keys[1]!.key))))).toBeNull()

      const byId = await run(Effect.flatMap(AccountsRepo, (r) => r.revokeKeyById(keys[0]!.row.id)))
      expect(byId!.id).toBe(keys[0]!.row.id)

      const rotated = await run(Effect.flatMap(AccountsRepo, (r) => r.rotate(owner.id)))
      expect(rotated.revoked.map((k) => k.label)).toEqual(["c"])
      const after = await list()
      expect(after).toHaveLength(1)
      expect(after[0]!.label).toBe(Accounts.ROTATED_KEY_LABEL)
      expect(after[0]!.key_hash).toBe(sha256(rotated.key))
      const account = await run(Effect.flatMap(AccountsRepo, (r) => r.findAccount(owner.id)))
      expect(account!.last_rotated_at).toBeInstanceOf(Date)
      for (const { key } of keys) {
        expect(await run(Effect.flatMap(KeyStore, (r) => r.findActiveKeyByHash(sha256(key))))).toBeNull()
      }
    })

    it("reveals only with an encryption key, and the ciphertext is bound to its row", async () => {
      const account = await newAccount()
      const a = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, "a")))
      const b = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, "b")))
      expect(a.row.ciphertext).not.toBeNull()
      expect(await run(Effect.map(AccountsRepo, (r) => r.reveal(a.row)))).toBe(a.key)
      // The same row read back from the database.
      const stored = (await run(Effect.flatMap(AccountsRepo, (r) => r.listActiveKeys(account.id))))[0]!
      expect(await run(Effect.map(AccountsRepo, (r) => r.reveal(stored)))).toBe(a.key)
      // Another key-encryption key, or none, cannot open it.
      expect(await run(Effect.map(AccountsRepo, (r) => r.reveal(a.row)), Crypto.randomBytes(32))).toBeNull()
      expect(await run(Effect.map(AccountsRepo, (r) => r.reveal(a.row)), null)).toBeNull()
      // A ciphertext moved to another row does not open there.
      await sql((s) => s`UPDATE api_keys SET ciphertext = ${a.row.ciphertext} WHERE id = ${b.row.id} RETURNING id`)
      const moved = (await run(Effect.flatMap(AccountsRepo, (r) => r.listActiveKeys(account.id)))).find((k) =>
        k.id === b.row.id
      )!
      expect(moved.ciphertext).toBe(a.row.ciphertext)
      expect(await run(Effect.map(AccountsRepo, (r) => r.reveal(moved)))).toBeNull()
      // Without an encryption key nothing is sealed at all; legacy keys never are.
      const plain = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, "p")), null)
      expect(plain.row.ciphertext).toBeNull()
      expect(await run(Effect.map(AccountsRepo, (r) => r.reveal(plain.row)))).toBeNull()
      const legacy = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, "l", { legacy: true })))
      expect(await run(Effect.map(AccountsRepo, (r) => r.reveal(legacy.row)))).toBeNull()
    })

    it("touches last_used_at of the key and its account, with the stamp it was given", async () => {
      const account = await newAccount()
      const { row } = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, "t")))
      const other = await run(Effect.flatMap(AccountsRepo, (r) => r.createKey(account.id, "u")))
      const at = new Date(Date.now() - 5_000)
      const earlier = new Date(at.getTime() - 60_000)
      await run(Effect.flatMap(KeyStore, (r) => r.touchKeys([{ keyId: row.id, at }, { keyId: other.row.id, at: earlier }])))
      const keys = await run(Effect.flatMap(AccountsRepo, (r) => r.listActiveKeys(account.id)))
      expect(keys.find((k) => k.id === row.id)!.last_used_at!.getTime()).toBe(at.getTime())
      expect(keys.find((k) => k.id === other.row.id)!.last_used_at!.getTime()).toBe(earlier.getTime())
      // The account's stamp is the latest of its keys' (the caller's clock, not the database's).
      expect((await run(Effect.flatMap(AccountsRepo, (r) => r.findAccount(account.id))))!.last_used_at!.getTime())
        .toBe(at.getTime())
    })

    it("sessions: stored as a hash, found until expiry or revocation", async () => {
      const account = await newAccount()
      const token = await run(Effect.flatMap(AccountsRepo, (r) => r.createSession(account.id, 24)))
      expect(token).toMatch(/^[0-9A-Za-z]{48}$/)
      expect((await run(Effect.flatMap(KeyStore, (r) => r.findSession(token))))!.id).toBe(account.id)
      expect(await run(Effect.flatMap(KeyStore, (r) => r.findSession(token + "x")))).toBeNull()
      const rows = await sql<{ token_hash: string }>((s) => s`SELECT token_hash FROM sessions WHERE account_id = ${account.id}`)
      expect(rows.map((r) => r.token_hash)).toEqual([sha256(token)])
      const dump = await sql<{ t: string }>((s) => s`SELECT sessions::text AS t FROM sessions`)
      expect(dump.some(({ t }) => t.includes(token))).toBe(false)

      const expired = await run(Effect.flatMap(AccountsRepo, (r) => r.createSession(account.id, -1)))
      expect(await run(Effect.flatMap(KeyStore, (r) => r.findSession(expired)))).toBeNull()
      await sql((s) => s`UPDATE sessions SET revoked_at = now() WHERE token_hash = ${sha256(token)} RETURNING 1 AS x`)
      expect(await run(Effect.flatMap(KeyStore, (r) => r.findSession(token)))).toBeNull()
    })

    it("audit rows record actions without secrets", async () => {
      const account = await newAccount()
      await run(Effect.flatMap(AccountsRepo, (r) => r.audit(account.id, "key_create", "7", { label: "x" })))
      const rows = await sql<{ action: string; target: string; meta: unknown }>((s) =>
        s`SELECT action, target, meta FROM audit_log WHERE account_id = ${account.id}`
      )
      expect(rows).toEqual([{ action: "key_create", target: "7", meta: { label: "x" } }])
    })
  })
}

describe("embedded data folder lock", () => {
  it("a second open of the same folder fails while the first is open, and works after", async () => {
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-lock-"))
    try {
      const first = ManagedRuntime.make(Sql.layerSql({ dataDir: dir }) as Layer.Layer<SqlClient.SqlClient, unknown>)
      await first.runPromise(Effect.void)
      const owner = EmbeddedLock.currentOwner(dir)
      // The lock names the Unix socket in the data folder (there is no TCP port).
      expect(owner).toEqual({ pid: process.pid, socket: Path.join(Path.resolve(dir), ".s.PGSQL.5432") })
      expect(Fs.statSync(owner!.socket!).isSocket()).toBe(true)

      const second = ManagedRuntime.make(Sql.layerSql({ dataDir: dir }) as Layer.Layer<SqlClient.SqlClient, unknown>)
      const exit = await second.runPromiseExit(Effect.void)
      expect(Exit.isFailure(exit)).toBe(true)
      expect(String(Exit.isFailure(exit) ? exit.cause : "")).toMatch(/in use by process \d+/)
      await second.dispose()

      await first.dispose()
      expect(EmbeddedLock.currentOwner(dir)).toBeNull()
      expect(Fs.existsSync(EmbeddedLock.lockFile(dir))).toBe(false)

      // A stale lock (its process is gone) does not block.
      Fs.writeFileSync(EmbeddedLock.lockFile(dir), JSON.stringify({ pid: 2 ** 22 + 12345, socket: "/nowhere" }))
      expect(EmbeddedLock.currentOwner(dir)).toBeNull()
      const third = ManagedRuntime.make(Sql.layerSql({ dataDir: dir }) as Layer.Layer<SqlClient.SqlClient, unknown>)
      const rows = await third.runPromise(Effect.flatMap(SqlClient.SqlClient, (s) => s`SELECT count(*)::int AS n FROM accounts`).pipe(Effect.orDie))
      expect(rows).toEqual([{ n: 0 }])
      await third.dispose()
    } finally {
      Fs.rmSync(dir, { recursive: true, force: true })
    }
  })
})
