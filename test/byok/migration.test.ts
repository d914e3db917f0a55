/**
 * Migration 0003 (BYOK credentials) on both databases: the table and its rules (label unique among non-revoked
 * credentials of one provider and scheme and reusable after revocation, one primary per provider, status and
 * revocation consistent, bounded text columns).
 */
import { Cause, Effect, Exit, type Layer, ManagedRuntime, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Sql from "../../src/store/Sql.js"
import { freshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"

const postgres = await serviceGate("postgres")

interface Backend {
  readonly name: string
  readonly enabled: boolean
  readonly open: () => Promise<{ readonly layer: Layer.Layer<SqlClient.SqlClient, unknown>; readonly close: () => Promise<void> }>
}

const backends: ReadonlyArray<Backend> = [
  {
    name: "embedded PGlite",
    enabled: true,
    open: async () => {
      const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-byok-mig-"))
      return {
        layer: Sql.layerSql({ dataDir: dir }) as Layer.Layer<SqlClient.SqlClient, unknown>,
        close: async () => Fs.rmSync(dir, { recursive: true, force: true })
      }
    }
  },
  {
    name: "PostgreSQL",
    enabled: postgres,
    open: async () => {
      const db = await freshDatabase("byok_mig")
      return {
        layer: Sql.layerSql({ databaseUrl: Redacted.make(db.url), dataDir: "unused" }) as Layer.Layer<SqlClient.SqlClient, unknown>,
        close: db.drop
      }
    }
  }
]

for (const backend of backends) {
  describe.skipIf(!backend.enabled)(`migration 0003_byok on ${backend.name}`, () => {
    let runtime: ManagedRuntime.ManagedRuntime<SqlClient.SqlClient, unknown>
    let close: () => Promise<void>
    beforeAll(async () => {
      const opened = await backend.open()
      close = opened.close
      runtime = ManagedRuntime.make(opened.layer)
      await runtime.runPromise(Effect.void)
      for (const id of ["acct_a", "acct_b"]) {
        await exec(`INSERT INTO accounts (id, username, display_name) VALUES ('${id}', '${id}', '${id}')`)
      }
    })
    afterAll(async () => {
      await runtime?.dispose()
      await close?.()
    })

    const exec = (text: string, params: ReadonlyArray<unknown> = []) =>
      runtime.runPromise(
        Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe<Record<string, unknown>>(text, params as Array<unknown>))
      )
    /** The database's error message of a statement expected to fail. */
    const failure = async (text: string, params: ReadonlyArray<unknown> = []): Promise<string> => {
      const exit = await runtime.runPromiseExit(
        Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(text, params as Array<unknown>))
      )
      if (Exit.isSuccess(exit)) throw new Error(`expected failure: ${text}`)
      return Sql.rootMessage(Cause.squash(exit.cause))
    }

    let seq = 0
    const insert = (fields: Record<string, unknown> = {}) => {
      const row: Record<string, unknown> = {
        account_id: "acct_a",
        provider: "openai",
        auth_scheme: "bearer",
        label: `key-${++seq}`,
        secret_ciphertext: "v1.AAAA",
        meta_ciphertext: "v1.BBBB",
        masked_hint: "sk-pr…",
        ...fields
      }
      const names = Object.keys(row)
      return exec(
        `INSERT INTO byok_credentials (${names.join(", ")}) VALUES (${names.map((_, i) => `$${i + 1}`).join(", ")}) RETURNING *`,
        names.map((n) => row[n])
      ).then((rows) => rows[0]!)
    }

    it("is recorded and creates the table with its defaults", async () => {
      const applied = await exec("SELECT name FROM wellspring_migrations ORDER BY migration_id")
      expect(applied.map((r) => r.name)).toContain("byok")
      const row = await insert({ label: "defaults" })
      expect(row).toMatchObject({
        status: "active",
        is_primary: false,
        pinned: false,
        has_org_id: false,
        has_project_id: false,
        fallback_model_id: null,
        last_error_code: null,
        last_verified_at: null,
        last_used_at: null,
        revoked_at: null,
        base_url_origin: null,
        region: null
      })
      expect(typeof row.id).toBe("number")
      expect(row.created_at).toBeInstanceOf(Date)
    })

    it("a label is unique among live credentials of one provider and scheme; reusable once revoked", async () => {
      await insert({ label: "work" })
      expect(await failure(
        `INSERT INTO byok_credentials (account_id, provider, auth_scheme, label, secret_ciphertext, meta_ciphertext, masked_hint)
         VALUES ('acct_a', 'openai', 'bearer', 'work', 'v1.x', 'v1.y', 'h…')`
      )).toContain("byok_credentials_label")
      // Same label under another scheme, provider or account is fine.
      await insert({ label: "work", auth_scheme: "api-key" })
      await insert({ label: "work", provider: "anthropic", auth_scheme: "x-api-key" })
      await insert({ label: "work", account_id: "acct_b" })
      // A rejected credential still holds its label.
      await exec(`UPDATE byok_credentials SET status = 'rejected', last_error_code = 'auth_failed'
                  WHERE account_id = 'acct_a' AND provider = 'openai' AND auth_scheme = 'bearer' AND label = 'work'`)
      expect(await failure(
        `INSERT INTO byok_credentials (account_id, provider, auth_scheme, label, secret_ciphertext, meta_ciphertext, masked_hint)
         VALUES ('acct_a', 'openai', 'bearer', 'work', 'v1.x', 'v1.y', 'h…')`
      )).toContain("byok_credentials_label")
      await exec(`UPDATE byok_credentials SET status = 'revoked', revoked_at = now()
                  WHERE account_id = 'acct_a' AND provider = 'openai' AND auth_scheme = 'bearer' AND label = 'work'`)
      const again = await insert({ label: "work" })
      expect(again.status).toBe("active")
    })

    it("one live primary per account and provider", async () => {
      const first = await insert({ provider: "gemini", is_primary: true })
      expect(await failure(
        `INSERT INTO byok_credentials (account_id, provider, auth_scheme, label, secret_ciphertext, meta_ciphertext, masked_hint, is_primary)
         VALUES ('acct_a', 'gemini', 'bearer', 'other', 'v1.x', 'v1.y', 'h…', true)`
      )).toContain("byok_credentials_primary")
      // Promote another in one transaction-free step: demote, then promote.
      const second = await insert({ provider: "gemini" })
      await exec("UPDATE byok_credentials SET is_primary = false WHERE id = $1", [first.id])
      await exec("UPDATE byok_credentials SET is_primary = true WHERE id = $1", [second.id])
      const primaries = await exec(
        "SELECT id FROM byok_credentials WHERE account_id = 'acct_a' AND provider = 'gemini' AND is_primary"
      )
      expect(primaries.map((r) => r.id)).toEqual([second.id])
    })

    it("status and revocation stay consistent; a revoked credential is never primary", async () => {
      expect(await failure(
        `INSERT INTO byok_credentials (account_id, provider, auth_scheme, label, secret_ciphertext, meta_ciphertext, masked_hint, status)
         VALUES ('acct_a', 'openai', 'bearer', 'bad-status', 'v1.x', 'v1.y', 'h…', 'deleted')`
      )).toMatch(/check constraint/)
      const row = await insert()
      expect(await failure("UPDATE byok_credentials SET status = 'revoked' WHERE id = $1", [row.id])).toContain(
        "byok_credentials_revoked"
      )
      const primary = await insert({ provider: "openrouter", is_primary: true })
      expect(
        await failure("UPDATE byok_credentials SET status = 'revoked', revoked_at = now() WHERE id = $1", [primary.id])
      ).toContain("byok_credentials_revoked_not_primary")
    })

    it("text columns are bounded", async () => {
      expect(await failure(
        `INSERT INTO byok_credentials (account_id, provider, auth_scheme, label, secret_ciphertext, meta_ciphertext, masked_hint)
         VALUES ('acct_a', 'openai', 'bearer', $1, 'v1.x', 'v1.y', 'h…')`,
        ["가".repeat(41)]
      )).toMatch(/check constraint/)
      await insert({ label: "가".repeat(40) })
      expect(await failure(
        `INSERT INTO byok_credentials (account_id, provider, auth_scheme, label, secret_ciphertext, meta_ciphertext, masked_hint, fallback_model_id)
         VALUES ('acct_a', 'openai', 'bearer', 'long-fallback', 'v1.x', 'v1.y', 'h…', $1)`,
        ["m".repeat(129)]
      )).toMatch(/check constraint/)
    })

    it("a credential needs an existing account", async () => {
      expect(await failure(
        `INSERT INTO byok_credentials (account_id, provider, auth_scheme, label, secret_ciphertext, meta_ciphertext, masked_hint)
         VALUES ('nobody', 'openai', 'bearer', 'x', 'v1.x', 'v1.y', 'h…')`
      )).toMatch(/foreign key/)
    })

    it("the account keeps its fallback override column (null = follow the operator default)", async () => {
      const rows = await exec("SELECT byok_fallback_override FROM accounts WHERE id = 'acct_a'")
      expect(rows[0]!.byok_fallback_override).toBeNull()
    })
  })
}
