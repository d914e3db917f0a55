/**
 * Presets and the gallery on the account API over HTTP, once per storage back end (embedded PGlite and
 * PostgreSQL): envelopes, CRUD, the cap, exactly one active preset under concurrent activations, one default
 * under concurrent first uses, field validation without echo, CSRF (inherited), gallery pages, downloads,
 * deletes, other accounts' images, expiry, and the per-account limits.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { IMAGE_READ_LIMIT, IMAGE_WRITE_LIMIT } from "../../src/images/AccountRoutes.js"
import { ImageGallery, ImagePresets } from "../../src/images/Contracts.js"
import { GalleryRepo } from "../../src/images/Gallery.js"
import { DEFAULT_PRESET, PRESET_FIELDS } from "../../src/images/Presets.js"
import { call, newUser, query, type Reply, sortedKeys } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { entry, fakePng } from "./support.js"

const postgresAvailable = await serviceGate("postgres")

const PRESET_KEYS = ["id", ...PRESET_FIELDS, "active", "created_at", "updated_at"].sort()
const IMAGE_KEYS = [
  "id", "prompt", "negative_prompt", "width", "height", "steps", "scale", "seed", "preset_name", "bytes", "created_at",
  "expires_at", "download_url"
].sort()
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/
const EVIL = "https://evil.example"
const SECRET = "SECRET-VALUE-9f3a"

const expectError = (res: Reply, status: number, code: string) => {
  expect(res.status, res.text).toBe(status)
  expect(res.body.success).toBe(false)
  expect(res.body.error.code).toBe(code)
  expect(typeof res.body.error.message).toBe("string")
}

const backends = [
  { name: "embedded PGlite", postgres: false },
  { name: "PostgreSQL", postgres: true }
] as const

describe.each(backends)("image account API on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  let gw: TestGateway
  let db: FreshDatabase | undefined

  beforeAll(async () => {
    if (skip) return
    db = postgres ? await freshDatabase("imgacct") : undefined
    gw = await startGateway(db ? { databaseUrl: db.url } : {})
  })
  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
  })

  const presets = (key: string) => call(gw, "GET", "/api/user/me/image-presets", { key })
  const create = (key: string, body: unknown) => call(gw, "POST", "/api/user/me/image-presets", { key, body })
  const counts = (accountId: string) =>
    query<{ n: number; a: number }>(
      gw,
      "SELECT count(*)::int AS n, (count(*) FILTER (WHERE active))::int AS a FROM image_presets WHERE account_id = $1",
      [accountId]
    ).then((rows) => rows[0]!)

  describe.skipIf(skip)("presets", () => {
    it("every route needs a cookie or a key: 401 in the wrapped form", async () => {
      const routes: Array<[string, string]> = [
        ["GET", "/api/user/me/image-presets"],
        ["POST", "/api/user/me/image-presets"],
        ["PATCH", "/api/user/me/image-presets/1"],
        ["DELETE", "/api/user/me/image-presets/1"],
        ["POST", "/api/user/me/image-presets/1/activate"],
        ["GET", "/api/user/me/images"],
        ["GET", "/api/user/me/images/img_1"],
        ["DELETE", "/api/user/me/images/img_1"]
      ]
      for (const [method, path] of routes) {
        const res = await call(gw, method, path, method === "GET" ? {} : { body: { name: "x" } })
        expect(res.status, `${method} ${path}`).toBe(401)
        expect(res.body.success).toBe(false)
      }
    })

    it("the list creates the default on first use and says which is active and the cap", async () => {
      const user = await newUser(gw)
      const res = await presets(user.key)
      expect(res.status).toBe(200)
      expect(sortedKeys(res.body)).toEqual(["data", "success"])
      expect(sortedKeys(res.body.data)).toEqual(["active_id", "max", "presets"])
      expect(res.body.data.max).toBe(10)
      const [preset] = res.body.data.presets
      expect(res.body.data.presets).toHaveLength(1)
      expect(sortedKeys(preset)).toEqual(PRESET_KEYS)
      expect(preset).toMatchObject({ ...DEFAULT_PRESET, active: true })
      expect(preset.created_at).toMatch(ISO)
      expect(res.body.data.active_id).toBe(preset.id)
      // The endpoint's seam sees the same preset.
      const active = await gw.run(Effect.flatMap(ImagePresets, (p) => p.active(user.account.id)))
      expect(active.id).toBe(preset.id)
    })

    it("create, update, activate, delete (the most recently updated takes over), delete the last, recreate", async () => {
      const user = await newUser(gw)
      const defaultId = (await presets(user.key)).body.data.active_id as number
      const created = await create(user.key, { name: "수채화", sampler: "dpmpp_2m", scheduler: "karras", scale: null })
      expect(created.status, created.text).toBe(200)
      const preset = created.body.data.preset
      expect(sortedKeys(preset)).toEqual(PRESET_KEYS)
      expect(preset).toMatchObject({ name: "수채화", sampler: "dpmpp_2m", scale: null, active: false, steps: 28 })

      const patched = await call(gw, "PATCH", `/api/user/me/image-presets/${preset.id}`, {
        key: user.key,
        body: { steps: 40, loras: [{ name: "watercolor.safetensors", weight: 0.8 }], width: 1024, height: 1024 }
      })
      expect(patched.status, patched.text).toBe(200)
      expect(patched.body.data.preset).toMatchObject({
        id: preset.id,
        name: "수채화",
        steps: 40,
        loras: [{ name: "watercolor.safetensors", weight: 0.8 }],
        width: 1024,
        active: false
      })

      const activated = await call(gw, "POST", `/api/user/me/image-presets/${preset.id}/activate`, { key: user.key })
      expect(activated.status).toBe(200)
      expect(activated.body.data.preset).toMatchObject({ id: preset.id, active: true })
      const listed = await presets(user.key)
      expect(listed.body.data.active_id).toBe(preset.id)
      expect(listed.body.data.presets.map((p: { id: number; active: boolean }) => [p.id, p.active])).toEqual([
        [defaultId, false],
        [preset.id, true]
      ])
      expect((await gw.run(Effect.flatMap(ImagePresets, (p) => p.active(user.account.id)))).steps).toBe(40)

      // Activating the active one again changes nothing.
      const again = await call(gw, "POST", `/api/user/me/image-presets/${preset.id}/activate`, { key: user.key })
      expect(again.body.data.preset.active).toBe(true)

      const removed = await call(gw, "DELETE", `/api/user/me/image-presets/${preset.id}`, { key: user.key })
      expect(removed.status).toBe(200)
      expect(removed.body).toEqual({ success: true, data: { active_id: defaultId } })
      const last = await call(gw, "DELETE", `/api/user/me/image-presets/${defaultId}`, { key: user.key })
      expect(last.body).toEqual({ success: true, data: { active_id: null } })
      expect(await counts(user.account.id)).toEqual({ n: 0, a: 0 })
      const recreated = await presets(user.key)
      expect(recreated.body.data.presets).toHaveLength(1)
      expect(recreated.body.data.presets[0]).toMatchObject({ name: DEFAULT_PRESET.name, active: true })
    })

    it("unknown, malformed and other accounts' preset ids: 404 preset_not_found, the same answer", async () => {
      const owner = await newUser(gw)
      const other = await newUser(gw)
      const id = (await presets(owner.key)).body.data.active_id as number
      const answers: Array<Reply> = []
      for (const target of [String(id), "999999999", "abc", "0", "-1", "1e3", "9".repeat(40)]) {
        answers.push(await call(gw, "PATCH", `/api/user/me/image-presets/${target}`, { key: other.key, body: { name: "x" } }))
        answers.push(await call(gw, "DELETE", `/api/user/me/image-presets/${target}`, { key: other.key }))
        answers.push(await call(gw, "POST", `/api/user/me/image-presets/${target}/activate`, { key: other.key }))
      }
      for (const res of answers) {
        expectError(res, 404, "preset_not_found")
        expect(res.body).toEqual(answers[0]!.body)
      }
      expect(await counts(owner.account.id)).toEqual({ n: 1, a: 1 })
    })

    it("at most 10 presets: the 11th is 400 preset_cap_reached; deleting one makes room", async () => {
      const user = await newUser(gw)
      await presets(user.key) // the default: one of the ten
      for (let i = 0; i < 9; i++) expect((await create(user.key, { name: `p${i}` })).status).toBe(200)
      const over = await create(user.key, { name: "one too many" })
      expectError(over, 400, "preset_cap_reached")
      expect(over.body.error.message).toContain("10")
      expect(await counts(user.account.id)).toEqual({ n: 10, a: 1 })
      const victim = (await presets(user.key)).body.data.presets[3].id
      expect((await call(gw, "DELETE", `/api/user/me/image-presets/${victim}`, { key: user.key })).status).toBe(200)
      expect((await create(user.key, { name: "room" })).status).toBe(200)
    })

    it("10 concurrent activations of different presets: all answered, exactly one active", async () => {
      const user = await newUser(gw)
      await presets(user.key)
      for (let i = 0; i < 9; i++) await create(user.key, { name: `p${i}` })
      const ids: Array<number> = (await presets(user.key)).body.data.presets.map((p: { id: number }) => p.id)
      expect(ids).toHaveLength(10)
      const answers = await Promise.all(
        ids.map((id) => call(gw, "POST", `/api/user/me/image-presets/${id}/activate`, { key: user.key }))
      )
      expect(answers.map((r) => r.status)).toEqual(ids.map(() => 200))
      expect(await counts(user.account.id)).toEqual({ n: 10, a: 1 })
      const listed = await presets(user.key)
      expect(listed.body.data.presets.filter((p: { active: boolean }) => p.active)).toHaveLength(1)
    })

    it("concurrent first uses (list route and the endpoint's seam) create one default", async () => {
      const user = await newUser(gw)
      const results = await Promise.all(Array.from({ length: 16 }, (_, i) =>
        i % 2 === 0
          ? presets(user.key).then((r) => r.body.data.active_id as number)
          : gw.run(Effect.flatMap(ImagePresets, (p) => p.active(user.account.id))).then((p) => p.id)))
      expect(new Set(results).size).toBe(1)
      expect(await counts(user.account.id)).toEqual({ n: 1, a: 1 })
    })

    const invalid: Array<[string, unknown, string]> = [
      ["name too long", { name: SECRET.repeat(5) }, "name"],
      ["name empty", { name: "" }, "name"],
      ["checkpoint too long", { name: "a", checkpoint: SECRET.repeat(20) }, "checkpoint"],
      ["checkpoint number", { name: "a", checkpoint: 7 }, "checkpoint"],
      ["loras too many", { name: "a", loras: Array.from({ length: 9 }, () => ({ name: "l", weight: 1 })) }, "loras"],
      ["lora weight", { name: "a", loras: [{ name: "l", weight: 9 }] }, "loras[0].weight"],
      ["lora name", { name: "a", loras: [{ name: "", weight: 1 }] }, "loras[0].name"],
      ["sampler", { name: "a", sampler: SECRET }, "sampler"],
      ["scheduler", { name: "a", scheduler: SECRET }, "scheduler"],
      ["quality_prompt", { name: "a", quality_prompt: SECRET.repeat(200) }, "quality_prompt"],
      ["negative_prompt", { name: "a", negative_prompt: { text: SECRET } }, "negative_prompt"],
      ["upscaler", { name: "a", upscaler: SECRET.repeat(20) }, "upscaler"],
      ["steps 0", { name: "a", steps: 0 }, "steps"],
      ["steps 61", { name: "a", steps: 61 }, "steps"],
      ["steps fraction", { name: "a", steps: 20.5 }, "steps"],
      ["scale 31", { name: "a", scale: 31 }, "scale"],
      ["scale string", { name: "a", scale: SECRET }, "scale"],
      ["width 4160", { name: "a", width: 4160 }, "width"],
      ["width 836", { name: "a", width: 836 }, "width"],
      ["height 32", { name: "a", height: 32 }, "height"],
      ["unknown field", { name: "a", [`x_${"z".repeat(5)}`]: SECRET }, "x_zzzzz"],
      ["active is read-only", { name: "a", active: true }, "active"],
      ["name missing", { steps: 20 }, "name"]
    ]

    it("every invalid field: 400 preset_invalid naming the field, never the value; nothing stored", async () => {
      const user = await newUser(gw)
      const id = (await presets(user.key)).body.data.active_id as number
      for (const [what, body, field] of invalid) {
        const created = await create(user.key, body)
        expectError(created, 400, "preset_invalid")
        expect(created.body.error.type).toBe("invalid_request_error")
        expect(created.body.error.message.startsWith(`${field} `), `${what}: ${created.body.error.message}`).toBe(true)
        expect(created.text).not.toContain(SECRET)
        if (what === "name missing") continue
        const patched = await call(gw, "PATCH", `/api/user/me/image-presets/${id}`, {
          key: user.key,
          body: { ...(body as object), name: (body as { name?: unknown }).name === "a" ? undefined : (body as { name?: unknown }).name }
        })
        expectError(patched, 400, "preset_invalid")
        expect(patched.body.error.message.startsWith(`${field} `), `${what} (PATCH)`).toBe(true)
        expect(patched.text).not.toContain(SECRET)
      }
      expect(await counts(user.account.id)).toEqual({ n: 1, a: 1 })
      const unchanged = (await presets(user.key)).body.data.presets[0]
      expect(unchanged).toMatchObject(DEFAULT_PRESET)
    }, 120_000)

    it("bodies that are not an object or not JSON", async () => {
      const user = await newUser(gw)
      for (const body of ["[]", "\"x\"", "null", ""]) {
        const res = await create(user.key, body)
        expectError(res, 400, "preset_invalid")
        expect(res.body.error.message).toBe("요청 본문은 JSON 객체여야 합니다.")
      }
      expectError(await create(user.key, "{\"name\":"), 400, "invalid_json")
      const big = await create(user.key, { name: "a", quality_prompt: "q".repeat(70_000) })
      expectError(big, 413, "payload_too_large")
    })

    it("a cookie mutation from another origin is refused (403 cross_site_request) and changes nothing", async () => {
      const user = await newUser(gw)
      const id = (await presets(user.key)).body.data.active_id as number
      const cross = await call(gw, "POST", "/api/user/me/image-presets", {
        session: user.session,
        body: { name: "csrf" },
        headers: { origin: EVIL, "sec-fetch-site": "cross-site" }
      })
      expectError(cross, 403, "cross_site_request")
      const crossDelete = await call(gw, "DELETE", `/api/user/me/image-presets/${id}`, {
        session: user.session,
        headers: { origin: EVIL }
      })
      expectError(crossDelete, 403, "cross_site_request")
      expect(await counts(user.account.id)).toEqual({ n: 1, a: 1 })
      // The dashboard's own page (same origin, JSON) is served.
      const same = await call(gw, "POST", "/api/user/me/image-presets", { session: user.session, body: { name: "ok" } })
      expect(same.status, same.text).toBe(200)
    })
  })

  describe.skipIf(skip)("gallery", () => {
    const save = (e: ReturnType<typeof entry>) => gw.run(Effect.flatMap(ImageGallery, (g) => g.save(e)))

    it("lists newest first with metadata and a download URL, pages with next_before, downloads the PNG", async () => {
      const user = await newUser(gw)
      const saved = Array.from({ length: 5 }, () => entry(user.account.id))
      for (const e of saved) await save(e)
      const first = await call(gw, "GET", "/api/user/me/images?limit=2", { key: user.key })
      expect(first.status).toBe(200)
      expect(sortedKeys(first.body.data)).toEqual(["images", "limit", "next_before"])
      expect(first.body.data.limit).toBe(2)
      const image = first.body.data.images[0]
      expect(sortedKeys(image)).toEqual(IMAGE_KEYS)
      expect(image).toMatchObject({ width: 832, height: 1216, steps: 28, scale: 5.5, seed: 4_294_967_295, preset_name: "기본" })
      expect(image.created_at).toMatch(ISO)
      expect(image.expires_at).toMatch(ISO)
      expect(image.download_url).toBe(`/api/user/me/images/${image.id}`)

      const ids: Array<string> = first.body.data.images.map((i: { id: string }) => i.id)
      let before: string | null = first.body.data.next_before
      while (before !== null) {
        const page = await call(gw, "GET", `/api/user/me/images?limit=2&before=${encodeURIComponent(before)}`, { key: user.key })
        expect(page.status).toBe(200)
        ids.push(...page.body.data.images.map((i: { id: string }) => i.id))
        before = page.body.data.next_before
      }
      // Newest first; images saved within the same millisecond by id, descending.
      const order = await query<{ id: string }>(
        gw,
        "SELECT id FROM images WHERE account_id = $1 ORDER BY created_at DESC, id DESC",
        [user.account.id]
      )
      expect(ids).toEqual(order.map((r) => r.id))
      expect(new Set(ids)).toEqual(new Set(saved.map((e) => e.id)))

      const all = await call(gw, "GET", "/api/user/me/images?limit=500", { key: user.key })
      expect(all.body.data.limit).toBe(50)
      expect(all.body.data.next_before).toBeNull()
      expect((await call(gw, "GET", "/api/user/me/images?limit=abc", { key: user.key })).body.data.limit).toBe(20)
      expectError(await call(gw, "GET", "/api/user/me/images?before=yesterday", { key: user.key }), 400, "invalid_request")

      const target = saved[2]!
      const res = await fetch(`${gw.url}${image.download_url.replace(image.id, target.id)}`, {
        headers: { authorization: `Bearer ${user.key}` }
      })
      expect(res.status).toBe(200)
      expect(res.headers.get("content-type")).toBe("image/png")
      expect(res.headers.get("content-disposition")).toBe(`attachment; filename="${target.id}.png"`)
      expect(Buffer.from(await res.arrayBuffer()).equals(Buffer.from(target.png))).toBe(true)
    })

    it("another account cannot read or delete an image: 404 image_not_found, as for a missing id", async () => {
      const owner = await newUser(gw)
      const other = await newUser(gw)
      const e = entry(owner.account.id)
      await save(e)
      expect((await call(gw, "GET", "/api/user/me/images", { key: other.key })).body.data.images).toEqual([])
      const read = await call(gw, "GET", `/api/user/me/images/${e.id}`, { key: other.key })
      const missing = await call(gw, "GET", "/api/user/me/images/img_000000000000000000000000", { key: other.key })
      const malformed = await call(gw, "GET", `/api/user/me/images/${"%3Cx%3E"}`, { key: other.key })
      const del = await call(gw, "DELETE", `/api/user/me/images/${e.id}`, { key: other.key })
      for (const res of [read, missing, malformed, del]) {
        expectError(res, 404, "image_not_found")
        expect(res.body).toEqual(missing.body)
      }
      // Still the owner's.
      expect((await call(gw, "GET", `/api/user/me/images/${e.id}`, { key: owner.key })).status).toBe(200)
    })

    it("delete: the image is gone from the list and the download; a second delete is 404", async () => {
      const user = await newUser(gw)
      const e = entry(user.account.id, { png: fakePng(50_000) })
      await save(e)
      const del = await call(gw, "DELETE", `/api/user/me/images/${e.id}`, { session: user.session })
      expect(del.status, del.text).toBe(200)
      expect(del.body).toEqual({ success: true })
      expectError(await call(gw, "GET", `/api/user/me/images/${e.id}`, { key: user.key }), 404, "image_not_found")
      expectError(await call(gw, "DELETE", `/api/user/me/images/${e.id}`, { key: user.key }), 404, "image_not_found")
      expect((await call(gw, "GET", "/api/user/me/images", { key: user.key })).body.data.images).toEqual([])
    })

    it("an expired image is neither listed nor served before the sweep, and the sweep deletes it", async () => {
      const user = await newUser(gw)
      const [old, recent] = [entry(user.account.id), entry(user.account.id)]
      await save(old)
      await save(recent)
      await query(gw, "UPDATE images SET expires_at = now() - interval '1 minute' WHERE id = $1", [old.id])
      const listed = await call(gw, "GET", "/api/user/me/images", { key: user.key })
      expect(listed.body.data.images.map((i: { id: string }) => i.id)).toEqual([recent.id])
      expectError(await call(gw, "GET", `/api/user/me/images/${old.id}`, { key: user.key }), 404, "image_not_found")
      expect(await gw.run(Effect.flatMap(GalleryRepo, (g) => g.sweep))).toBeGreaterThanOrEqual(1)
      expect(await query(gw, "SELECT id FROM images WHERE id = $1", [old.id])).toEqual([])
      expect(await query(gw, "SELECT id FROM images WHERE id = $1", [recent.id])).toHaveLength(1)
    })
  })

  describe.skipIf(skip)("limits", () => {
    it(`reads: ${IMAGE_READ_LIMIT.max} a minute shared by the three GET routes, then 429 rate_limited with Retry-After`, async () => {
      const user = await newUser(gw)
      const paths = ["/api/user/me/image-presets", "/api/user/me/images", "/api/user/me/images/img_1"]
      for (let i = 0; i < IMAGE_READ_LIMIT.max; i++) {
        const res = await call(gw, "GET", paths[i % 3]!, { key: user.key })
        expect(res.status).not.toBe(429)
      }
      const over = await call(gw, "GET", "/api/user/me/images", { key: user.key })
      expectError(over, 429, "rate_limited")
      expect(Number(over.headers.get("retry-after"))).toBeGreaterThan(0)
      // Changes have their own budget.
      expect((await create(user.key, { name: "still" })).status).toBe(200)
    })

    it(`changes: ${IMAGE_WRITE_LIMIT.max} a minute, then 429 before the body is looked at`, async () => {
      const user = await newUser(gw)
      for (let i = 0; i < IMAGE_WRITE_LIMIT.max; i++) {
        expect((await call(gw, "DELETE", "/api/user/me/images/img_1", { key: user.key })).status).toBe(404)
      }
      expectError(await create(user.key, { name: "late" }), 429, "rate_limited")
      expect(await counts(user.account.id)).toEqual({ n: 0, a: 0 })
    })
  })
})
