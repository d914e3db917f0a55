/**
 * The private gallery (issue 17) on embedded PGlite and PostgreSQL: save, pages, download, delete, bounds on
 * what is stored, retention (expired images hidden at once, deleted by the sweep; the sweep fiber on a
 * TestClock), and bytes that survive a restart of the gateway.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer, ManagedRuntime, Queue } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll } from "vitest"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import { type GalleryEntry, ImageGallery } from "../../src/images/Contracts.js"
import * as LiveImages from "../../src/images/LiveConfig.js"
import { layerConfigFile } from "../../src/config/Live.js"
import * as Gallery from "../../src/images/Gallery.js"
import { GalleryRepo } from "../../src/images/Gallery.js"
import { DEFAULT_PRESET } from "../../src/images/Presets.js"
import { call, newUser } from "../accounts/support.js"
import { freshDatabase } from "../support/Db.js"
import { startGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { DAY_MS, entry, fakePng } from "./support.js"
import { backends, type StoreServices } from "../storage/backends.js"

const postgres = await serviceGate("postgres")

for (const backend of backends(postgres)) {
  describe(`gallery repository (${backend.name})`, () => {
    type R = StoreServices | GalleryRepo | ImageGallery
    let runtime: ManagedRuntime.ManagedRuntime<R, unknown>
    let close: () => Promise<void>
    const run = <A>(effect: Effect.Effect<A, unknown, R>) => runtime.runPromise(effect)
    const repo = <A>(f: (repo: GalleryRepo["Service"]) => Effect.Effect<A>) => run(Effect.flatMap(GalleryRepo, f))
    const save = (e: GalleryEntry) => run(Effect.flatMap(ImageGallery, (g) => g.save(e)))
    const sql = <A extends object>(f: (sql: SqlClient.SqlClient) => Effect.Effect<ReadonlyArray<A>, unknown>) =>
      run(Effect.flatMap(SqlClient.SqlClient, f))
    const newAccount = () =>
      run(Effect.flatMap(AccountsRepo, (accounts) =>
        accounts.createAccount({ username: `u_${Crypto.randomBytes(4).toString("hex")}`, displayName: "테스터" })))

    beforeAll(async () => {
      const opened = await backend.open()
      close = opened.close
      runtime = ManagedRuntime.make(Layer.provideMerge(Gallery.layer, Layer.provideMerge(LiveImages.layer, Layer.provideMerge(layerConfigFile, opened.layer))))
      await runtime.runPromise(Effect.void)
    })
    afterAll(async () => {
      await runtime?.dispose()
      await close?.()
    })

    it("saves, pages newest first (ties by id), downloads the same bytes, deletes; other accounts see nothing", async () => {
      const owner = await newAccount()
      const other = await newAccount()
      const saved = Array.from({ length: 5 }, () => entry(owner.id))
      for (const e of saved) await save(e)
      // Two share a creation time: the cursor must still visit each image exactly once.
      await sql((s) => s`UPDATE images SET created_at = (SELECT created_at FROM images WHERE id = ${saved[1]!.id})
        WHERE id = ${saved[2]!.id}`)
      const expected = (await sql<{ id: string }>((s) =>
        s`SELECT id FROM images WHERE account_id = ${owner.id} ORDER BY created_at DESC, id DESC`)).map((r) => r.id)
      const seen: Array<string> = []
      let before: Gallery.Cursor | null = null
      for (let page = 0; page < 5; page++) {
        const rows: ReadonlyArray<Gallery.ImageRow> = await repo((r) => r.list(owner.id, 2, before))
        seen.push(...rows.map((row) => row.id))
        if (rows.length < 2) break
        before = Gallery.decodeCursor(Gallery.encodeCursor(rows[rows.length - 1]!))
      }
      expect(seen).toEqual(expected)
      expect(new Set(seen)).toEqual(new Set(saved.map((e) => e.id)))

      const first = saved[0]!
      const got = await repo((r) => r.download(owner.id, first.id))
      expect(Buffer.from(got!.png).equals(Buffer.from(first.png))).toBe(true)
      expect(got!.row).toMatchObject({
        prompt: first.prompt,
        negative_prompt: "lowres",
        width: 832,
        height: 1216,
        steps: 28,
        scale: 5.5,
        seed: 4_294_967_295,
        preset_name: DEFAULT_PRESET.name,
        bytes: first.png.byteLength
      })
      expect(got!.row.expires_at!.getTime() - got!.row.created_at.getTime()).toBe(30 * DAY_MS)

      expect(await repo((r) => r.list(other.id, 50, null))).toEqual([])
      expect(await repo((r) => r.download(other.id, first.id))).toBeNull()
      expect(await repo((r) => r.remove(other.id, first.id))).toBe(false)
      expect(await repo((r) => r.remove(owner.id, first.id))).toBe(true)
      expect(await repo((r) => r.remove(owner.id, first.id))).toBe(false)
      expect(await repo((r) => r.download(owner.id, first.id))).toBeNull()
    })

    it("bounds what it stores: prompt 8000, negative 10000, preset name 40 characters; NUL removed", async () => {
      const owner = await newAccount()
      const e = entry(owner.id, { prompt: "가\u0000".repeat(9000) })
      const long = entry(owner.id, {
        spec: { ...e.spec, negative_prompt: "😀".repeat(12_000), preset: { ...DEFAULT_PRESET, name: "p".repeat(60) } }
      })
      await save(e)
      await save(long)
      const a = (await repo((r) => r.download(owner.id, e.id)))!.row
      expect(a.prompt).toBe("가".repeat(8000))
      const b = (await repo((r) => r.download(owner.id, long.id)))!.row
      expect(Array.from(b.negative_prompt)).toHaveLength(10_000)
      expect(b.preset_name).toBe("p".repeat(40))
    })

    it("an expired image is hidden at once and deleted by the sweep; unexpired and kept ones stay", async () => {
      const owner = await newAccount()
      const [expired, fresh, kept] = [entry(owner.id), entry(owner.id), entry(owner.id)]
      for (const e of [expired, fresh, kept]) await save(e)
      await sql((s) => s`UPDATE images SET expires_at = now() - interval '1 second' WHERE id = ${expired.id}`)
      await sql((s) => s`UPDATE images SET expires_at = NULL WHERE id = ${kept.id}`)
      const listed = (await repo((r) => r.list(owner.id, 50, null))).map((row) => row.id)
      expect(listed.sort()).toEqual([fresh.id, kept.id].sort())
      expect(await repo((r) => r.download(owner.id, expired.id))).toBeNull()
      expect(await repo((r) => r.remove(owner.id, expired.id))).toBe(false)
      expect(await sql((s) => s`SELECT id FROM images WHERE id = ${expired.id}`)).toHaveLength(1)

      expect(await repo((r) => r.sweep)).toBeGreaterThanOrEqual(1)
      const left = (await sql<{ id: string }>((s) => s`SELECT id FROM images WHERE account_id = ${owner.id}`))
        .map((r) => r.id)
      expect(left.sort()).toEqual([fresh.id, kept.id].sort())
    })

    it.effect("the sweep fiber runs every 10 minutes of the Effect clock", () =>
      Effect.gen(function*() {
        const context = yield* Effect.promise(() => runtime.runPromise(Effect.context<R>()))
        yield* Effect.gen(function*() {
          const accounts = yield* AccountsRepo
          const gallery = yield* GalleryRepo
          const sql = yield* SqlClient.SqlClient
          const owner = yield* accounts.createAccount({ username: `u_${Crypto.randomBytes(4).toString("hex")}`, displayName: "t" })
          // Saved at time 0 of the TestClock: expires 30 days later; `kept` never expires.
          const [expiring, kept] = [entry(owner.id), entry(owner.id)]
          yield* gallery.save(expiring)
          yield* gallery.save(kept)
          yield* Effect.orDie(sql`UPDATE images SET expires_at = NULL WHERE id = ${kept.id}`)
          expect(yield* gallery.list(owner.id, 50, null)).toHaveLength(2)

          yield* TestClock.setTime(30 * DAY_MS)
          expect((yield* gallery.list(owner.id, 50, null)).map((r) => r.id)).toEqual([kept.id])

          const swept = yield* Queue.unbounded<number>()
          const fiber = yield* Effect.forkChild(Gallery.sweepLoop((n) => Queue.offer(swept, n).pipe(Effect.asVoid)))
          yield* TestClock.adjust("9 minutes")
          expect(yield* Queue.size(swept)).toBe(0)
          yield* TestClock.adjust("1 minute")
          expect(yield* Queue.take(swept)).toBeGreaterThanOrEqual(1)
          const rows = yield* Effect.orDie(sql<{ id: string }>`SELECT id FROM images WHERE account_id = ${owner.id}`)
          expect(rows.map((r) => r.id)).toEqual([kept.id])
          yield* Fiber.interrupt(fiber)
        }).pipe(Effect.provideContext(context))
      }))
  })
}

describe.each([
  { name: "embedded PGlite", postgres: false },
  { name: "PostgreSQL", postgres: true }
])("gallery across a restart ($name)", ({ postgres: onPostgres }) => {
  it.skipIf(onPostgres && !postgres)("a stopped and restarted gateway serves the same bytes", async () => {
    const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-gallery-"))
    const db = onPostgres ? await freshDatabase("gallery") : undefined
    const options = {
      dataDir,
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc: Record<string, any>) => {
        doc.images = { gallery: { retention_days: 0 } }
      }
    }
    try {
      const first = await startGateway(options)
      const user = await newUser(first)
      const e = entry(user.account.id, { png: fakePng(300_000) })
      try {
        await first.run(Effect.flatMap(ImageGallery, (g) => g.save(e)))
      } finally {
        await first.stop()
      }
      const second = await startGateway(options)
      try {
        const listed = await call(second, "GET", "/api/user/me/images", { key: user.key })
        expect(listed.status).toBe(200)
        expect(listed.body.data.images).toHaveLength(1)
        // retention_days 0: kept until deleted.
        expect(listed.body.data.images[0]).toMatchObject({ id: e.id, expires_at: null })
        const res = await fetch(`${second.url}/api/user/me/images/${e.id}`, { headers: { authorization: `Bearer ${user.key}` } })
        expect(res.status).toBe(200)
        expect(Buffer.from(await res.arrayBuffer()).equals(Buffer.from(e.png))).toBe(true)
      } finally {
        await second.stop()
      }
    } finally {
      Fs.rmSync(dataDir, { recursive: true, force: true })
      await db?.drop()
    }
  })
})
