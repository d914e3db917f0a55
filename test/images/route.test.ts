/**
 * `POST /v1/images/nai/generate-image` over HTTP against a real gateway, with in-test image services (queue, slots,
 * presets, gallery) given through `AppOptions.images`: the ZIP with one PNG of the snapped size, the settings the
 * job carries, every error status in the `{statusCode, message}` shape with its Korean message, the order of the
 * checks (nothing queued or held for a refused request), the 504 that interrupts the job, a client disconnect that
 * interrupts it, and the request row of each outcome.
 *
 * The `images` switches are live config (the file is rewritten and reloaded); `access` is read per request from the
 * gateway's settings, which tests flip on the
 * running gateway (`setImages`, `setAccess`) instead of booting one gateway per switch.
 */
import { Effect, Layer } from "effect"
import { unzipSync } from "fflate"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { AccountsRepo, type NewAccount } from "../../src/accounts/AccountsRepo.js"
import { Settings } from "../../src/config/Live.js"
import { LiveImages } from "../../src/images/LiveConfig.js"
import { Catalog, fail, type GatewayError } from "../../src/errors/Catalog.js"
import {
  type GalleryEntry,
  ImageGallery,
  type ImageJob,
  ImagePresets,
  ImageQueue,
  ImageSlots,
  type JobOutcome,
  type Preset
} from "../../src/images/Contracts.js"
import { eventually } from "../support/Eventually.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { afterFlush } from "../support/Rows.js"
import { rowById, rowIdOf } from "../inference/helpers.js"
import { ihdrSize, makePng } from "./png.js"

const PATH = "/v1/images/nai/generate-image"
const HANGUL = /[\uac00-\ud7a3]/

const basePreset: Preset = {
  id: 1,
  name: "기본",
  checkpoint: "model.safetensors",
  loras: [],
  sampler: "euler_ancestral",
  scheduler: "karras",
  quality_prompt: "best quality",
  negative_prompt: "lowres",
  upscaler: null,
  steps: 28,
  scale: 6,
  width: 832,
  height: 1216,
  active: true,
  created_at: "2026-01-01T00:00:00.000Z",
  updated_at: "2026-01-01T00:00:00.000Z"
}

type Behaviour = (job: ImageJob) => Effect.Effect<JobOutcome, GatewayError>

const done: Behaviour = (job) =>
  Effect.succeed({ _tag: "Done", png: makePng(job.spec.width, job.spec.height), workerId: "fake-worker" })

/** In-process image services whose behaviour a test sets, and what they saw. */
const makeFakes = () => {
  const fakes = {
    behaviour: done,
    preset: basePreset,
    slotLimit: 2,
    galleryFails: false,
    jobs: [] as Array<ImageJob>,
    interrupted: [] as Array<string>,
    saved: [] as Array<GalleryEntry>,
    presetReads: 0,
    held: new Map<string, number>(),
    reset() {
      fakes.behaviour = done
      fakes.preset = basePreset
      fakes.galleryFails = false
    },
    heldBy: (accountId: string) => fakes.held.get(accountId) ?? 0
  }
  const layer = Layer.mergeAll(
    Layer.succeed(ImageQueue, ImageQueue.of({
      run: (job) =>
        Effect.suspend(() => {
          fakes.jobs.push(job)
          return fakes.behaviour(job)
        }).pipe(Effect.onInterrupt(() => Effect.sync(() => void fakes.interrupted.push(job.id)))),
      waiting: Effect.succeed(0),
      workersOnline: Effect.succeed(1)
    })),
    Layer.succeed(ImageSlots, ImageSlots.of({
      acquire: (accountId) =>
        Effect.acquireRelease(
          Effect.suspend(() => {
            const n = fakes.heldBy(accountId)
            if (n >= fakes.slotLimit) return Effect.fail(fail("image_pending_full"))
            fakes.held.set(accountId, n + 1)
            return Effect.void
          }),
          () => Effect.sync(() => void fakes.held.set(accountId, fakes.heldBy(accountId) - 1))
        ),
      held: (accountId) => Effect.sync(() => fakes.heldBy(accountId))
    })),
    Layer.succeed(ImagePresets, ImagePresets.of({
      active: () =>
        Effect.sync(() => {
          fakes.presetReads++
          return fakes.preset
        })
    })),
    Layer.succeed(ImageGallery, ImageGallery.of({
      save: (entry) => (fakes.galleryFails ? Effect.die(new Error("gallery down")) : Effect.sync(() => void fakes.saved.push(entry)))
    }))
  )
  return { fakes, layer }
}

interface User {
  readonly id: string
  readonly key: string
}

describe("POST /v1/images/nai/generate-image", () => {
  let gw: TestGateway
  const { fakes, layer } = makeFakes()
  let admin: User
  let member: User
  let sfw: User
  let guest: User
  let unlinked: User
  let noEmail: User

  /** Edits the `images` section of the config file and reloads it, as an operator's edit is picked up. */
  let imagesDoc: Record<string, unknown> = {
    content_policy: {
      blocked: [{ name: "폭력", terms: ["gore", "blood bath"] }],
      safe_mode_blocked: [{ name: "성인", terms: ["nude"] }],
      safe_mode_negative: "nsfw, explicit"
    }
  }
  const setImages = async (patch: Record<string, unknown>) => {
    imagesDoc = { ...imagesDoc, ...patch }
    gw.rewriteConfig((doc) => void (doc.images = imagesDoc))
    expect(await gw.run(Effect.flatMap(LiveImages, (live) => live.reload))).toBe(true)
  }
  const setAccess = (patch: Record<string, unknown>) =>
    gw.run(Effect.map(Settings, (s) => void Object.assign(s.config.access, patch)))

  const createUser = (name: string, extra: Partial<NewAccount> = {}) =>
    gw.run(Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const account = yield* repo.createAccount({
        username: `${name}_${Date.now().toString(36)}`,
        displayName: name,
        email: `${name}@example.com`,
        emailVerified: true,
        ...extra
      })
      const { key } = yield* repo.createKey(account.id, "images")
      return { id: account.id, key }
    }))

  const post = (body: unknown, key: string | null = admin.key, init: RequestInit = {}) =>
    fetch(`${gw.url}${PATH}`, {
      method: "POST",
      headers: key === null ? { "content-type": "application/json" } : authed(key),
      body: typeof body === "string" ? body : JSON.stringify(body),
      ...init
    })

  /** Asserts `{statusCode, message}` with this status and message; returns the response's row id when it has one. */
  const expectImageError = async (res: Response, status: number, message: string | RegExp) => {
    const text = await res.text()
    expect(res.status, text).toBe(status)
    expect(res.headers.get("content-type")).toMatch(/^application\/json/)
    expect(res.headers.get("x-wellspring-request-id")).toMatch(/^req_/)
    const body = JSON.parse(text)
    expect(Object.keys(body).sort()).toEqual(["message", "statusCode"])
    expect(body.statusCode).toBe(status)
    expect(body.message).toMatch(HANGUL)
    if (typeof message === "string") expect(body.message).toBe(message)
    else expect(body.message).toMatch(message)
    return res.headers.get("x-request-id") === null ? null : rowIdOf(res)
  }

  const expectRow = async (rowId: number | null, fields: Record<string, unknown>) => {
    expect(rowId).not.toBe(null)
    const row = await rowById(gw, rowId!)
    expect(row).toMatchObject({ model_id: "nai-image", input_tokens: 0, output_tokens: 0, weighted_cost: 0, stream: false, ...fields })
    return row
  }

  beforeAll(async () => {
    gw = await startGateway({
      images: layer,
      configure: (doc) => void (doc.images = imagesDoc)
    })
    admin = { id: "", key: gw.key }
    member = await createUser("member")
    sfw = await createUser("sfw")
    await gw.run(Effect.flatMap(AccountsRepo, (repo) => repo.setSfw(sfw.id, true)))
    guest = await createUser("guest", { isGuest: true, guestExpiresAt: new Date(Date.now() + 86_400_000) })
    unlinked = await createUser("unlinked", { status: "unlinked" })
    noEmail = await createUser("noemail", { email: undefined, emailVerified: false })
  })
  afterAll(async () => {
    await gw?.stop()
  })
  afterEach(async () => {
    fakes.reset()
    await setImages({ enabled: true, maintenance: false, admin_only: false, max_wait_seconds: 180 })
    await setAccess({ email_enforcement: false })
  })

  describe("success", () => {
    it("answers a ZIP holding one PNG of the snapped size, and records the job, the gallery entry and the row", async () => {
      const jobsBefore = fakes.jobs.length
      const res = await post({
        input: "{{1girl}}, smile",
        model: "nai-diffusion-4-full",
        action: "generate",
        parameters: { width: 1000, height: 1500, steps: 500, scale: 12, negative_prompt: "[[blurry]]", n_samples: 1 }
      })
      expect(res.status).toBe(200)
      expect(res.headers.get("content-type")).toBe("application/zip")
      expect(res.headers.get("x-wellspring-request-id")).toMatch(/^req_/)
      const files = unzipSync(new Uint8Array(await res.arrayBuffer()))
      const names = Object.keys(files)
      expect(names).toEqual(["image_0.png"])
      const png = files["image_0.png"]!
      expect([...png.subarray(0, 8)]).toEqual([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
      expect(ihdrSize(png)).toEqual({ width: 832, height: 1216 })

      expect(fakes.jobs.length).toBe(jobsBefore + 1)
      const job = fakes.jobs[fakes.jobs.length - 1]!
      expect(job.id).toMatch(/^img_[0-9a-f]{24}$/)
      expect(job.spec).toMatchObject({
        prompt: "best quality, (1girl:1.1025), smile",
        negative_prompt: "(blurry:0.907), lowres",
        width: 832,
        height: 1216,
        steps: 60,
        scale: 6,
        preset: { name: "기본", checkpoint: "model.safetensors", sampler: "euler_ancestral" }
      })
      expect(Number.isInteger(job.spec.seed) && job.spec.seed >= 0 && job.spec.seed <= 2 ** 32 - 1).toBe(true)

      const entry = fakes.saved.find((e) => e.id === job.id)!
      expect(entry).toMatchObject({ accountId: job.accountId, prompt: "{{1girl}}, smile", spec: job.spec })
      expect(Buffer.from(entry.png).equals(Buffer.from(png))).toBe(true)
      expect(fakes.heldBy(job.accountId)).toBe(0)

      const row = await expectRow(rowIdOf(res), { status: "success", http_status: 200, error_code: null })
      expect(row.request_id).toBe(res.headers.get("x-wellspring-request-id"))
    })

    it("takes the request's seed and the preset's size when the request gives one side only", async () => {
      const res = await post({ input: "cat", parameters: { seed: 4294967295, width: 1216 } })
      expect(res.status).toBe(200)
      await res.arrayBuffer()
      expect(fakes.jobs[fakes.jobs.length - 1]!.spec).toMatchObject({ seed: 4294967295, width: 832, height: 1216 })
    })

    it("uses the request's scale when the preset has none; safe mode appends its negative", async () => {
      fakes.preset = { ...basePreset, scale: null, negative_prompt: "" }
      const res = await post({ input: "cat", parameters: { scale: 9.5, negative_prompt: "blurry" } }, sfw.key)
      expect(res.status).toBe(200)
      await res.arrayBuffer()
      expect(fakes.jobs[fakes.jobs.length - 1]!.spec).toMatchObject({ scale: 9.5, negative_prompt: "blurry, nsfw, explicit" })
    })

    it("answers even when the gallery cannot save", async () => {
      fakes.galleryFails = true
      const saved = fakes.saved.length
      const res = await post({ input: "cat" })
      expect(res.status).toBe(200)
      expect(Object.keys(unzipSync(new Uint8Array(await res.arrayBuffer())))).toEqual(["image_0.png"])
      expect(fakes.saved.length).toBe(saved)
    })
  })

  describe("errors", () => {
    it("401 without a key, or with a wrong one", async () => {
      expect(await expectImageError(await post({ input: "cat" }, null), 401, Catalog.invalid_api_key.message)).toBe(null)
      await expectImageError(await post({ input: "cat" }, "sk-ws-" + "x".repeat(43)), 401, Catalog.invalid_api_key.message)
    })

    it("400 for a body that is not JSON, with its row", async () => {
      const rowId = await expectImageError(await post("{\"input\": "), 400, /JSON/)
      await expectRow(rowId, { status: "error", error_code: "invalid_json", http_status: 400 })
    })

    it("400 image_invalid naming the field, never echoing it, with its row", async () => {
      const secret = "zz-secret-zz"
      const rowId = await expectImageError(
        await post({ input: secret, parameters: { width: secret } }),
        400,
        "parameters.width 은(는) 64 이상 4096 이하의 정수여야 합니다."
      )
      await expectRow(rowId, { status: "error", error_code: "image_invalid", http_status: 400 })
      await expectImageError(await post({ parameters: {} }), 400, "input 필드가 필요합니다. 프롬프트를 문자열로 보내세요.")
      await expectImageError(await post({ input: "x".repeat(8001) }), 400, "input 이(가) 너무 깁니다. 최대 8000자까지 허용됩니다.")
    })

    it("413 past the endpoint's 256 KB body bound, 415 for a non-JSON content type", async () => {
      await expectImageError(await post({ input: "x".repeat(300_000) }), 413, "요청 본문이 너무 큽니다. 최대 256 KB까지 보낼 수 있습니다.")
      const res = await post("input=cat", admin.key, { headers: { ...authed(admin.key), "content-type": "multipart/form-data; boundary=x" } })
      await expectImageError(res, 415, Catalog.unsupported_content_type.message)
    })

    it("400 image_unsupported_action", async () => {
      const rowId = await expectImageError(await post({ input: "cat", action: "img2img" }), 400, Catalog.image_unsupported_action.message)
      await expectRow(rowId, { error_code: "image_unsupported_action" })
    })

    it("400 image_blocked names the category; checked before a preset read, a slot or the queue", async () => {
      const before = { jobs: fakes.jobs.length, presets: fakes.presetReads }
      for (const input of ["GORE", "{{g_o_r_e}}", "1.2::ｇｏｒｅ::", "blood-bath"]) {
        await expectImageError(await post({ input }), 400, "금지된 내용(폭력)이 포함된 프롬프트입니다.")
      }
      expect({ jobs: fakes.jobs.length, presets: fakes.presetReads }).toEqual(before)
      // The safe-mode category is blocked for an account in safe mode only.
      await expectImageError(await post({ input: "nude" }, sfw.key), 400, "금지된 내용(성인)이 포함된 프롬프트입니다.")
      const res = await post({ input: "nude" }, member.key)
      expect(res.status).toBe(200)
      await res.arrayBuffer()
      // A negative prompt is not checked: it names what the image must not show.
      const negative = await post({ input: "cat", parameters: { negative_prompt: "gore" } })
      expect(negative.status).toBe(200)
      await negative.arrayBuffer()
    })

    it("400 image_blocked for a blocked quality prompt in the active preset", async () => {
      fakes.preset = { ...basePreset, quality_prompt: "masterpiece, {gore}" }
      const before = fakes.jobs.length
      await expectImageError(await post({ input: "cat" }), 400, "금지된 내용(폭력)이 포함된 프롬프트입니다.")
      expect(fakes.jobs.length).toBe(before)
    })

    it("403 in admin-only mode for everyone but admins", async () => {
      await setImages({ admin_only: true })
      const rowId = await expectImageError(await post({ input: "cat" }, member.key), 403, Catalog.image_admin_only.message)
      await expectRow(rowId, { error_code: "image_admin_only", http_status: 403 })
      const res = await post({ input: "cat" }, admin.key)
      expect(res.status).toBe(200)
      await res.arrayBuffer()
    })

    it("403 for accounts that are not eligible: unlinked, guests, no email while it is enforced", async () => {
      await expectImageError(await post({ input: "cat" }, unlinked.key), 403, Catalog.account_unlinked.message)
      await expectImageError(await post({ input: "cat" }, guest.key), 403, Catalog.image_not_eligible.message)
      const withoutEnforcement = await post({ input: "cat" }, noEmail.key)
      expect(withoutEnforcement.status).toBe(200)
      await withoutEnforcement.arrayBuffer()
      await setAccess({ email_enforcement: true })
      await expectImageError(await post({ input: "cat" }, noEmail.key), 403, Catalog.email_required.message)
    })

    it("403 before the body is looked at", async () => {
      await expectImageError(await post("not json", unlinked.key), 403, Catalog.account_unlinked.message)
    })

    it("503 when the feature is off or in maintenance, before the body", async () => {
      await setImages({ enabled: false })
      const rowId = await expectImageError(await post("not json"), 503, Catalog.image_disabled.message)
      await expectRow(rowId, { error_code: "image_disabled", http_status: 503 })
      await setImages({ enabled: true, maintenance: true })
      await expectImageError(await post({ input: "cat" }), 503, Catalog.image_maintenance.message)
    })

    it("503 from the queue: congested, no worker", async () => {
      fakes.behaviour = () => Effect.fail(fail("image_congested"))
      await expectImageError(await post({ input: "cat" }), 503, Catalog.image_congested.message)
      fakes.behaviour = () => Effect.fail(fail("image_no_worker"))
      const rowId = await expectImageError(await post({ input: "cat" }), 503, Catalog.image_no_worker.message)
      await expectRow(rowId, { error_code: "image_no_worker", http_status: 503 })
    })

    it("500 when generation fails; the worker's reason stays out of the answer and the row", async () => {
      fakes.behaviour = () => Effect.succeed({ _tag: "Failed", reason: "CUDA out of memory at 10.0.0.7" })
      const res = await post({ input: "cat" })
      const text = await res.clone().text()
      expect(text).not.toContain("CUDA")
      const rowId = await expectImageError(res, 500, Catalog.image_failed.message)
      const row = await expectRow(rowId, { status: "error", error_code: "image_failed", http_status: 500 })
      expect(row.error).toBe("image_failed (500)")
    })

    it("500 when the worker's bytes are not a PNG", async () => {
      fakes.behaviour = () => Effect.succeed({ _tag: "Done", png: new TextEncoder().encode("<html>"), workerId: "w" })
      await expectImageError(await post({ input: "cat" }), 500, Catalog.image_failed.message)
    })

    it("429 for a third pending request; the slots come back when the first two finish", async () => {
      const user = await createUser("pending")
      let release!: () => void
      const gate = new Promise<void>((resolve) => (release = resolve))
      fakes.behaviour = (job) => Effect.andThen(Effect.promise(() => gate), done(job))
      const first = post({ input: "cat" }, user.key)
      const second = post({ input: "dog" }, user.key)
      await eventually(() => fakes.heldBy(user.id) === 2, { what: "two pending slots" })
      const queued = fakes.jobs.length
      const rowId = await expectImageError(await post({ input: "bird" }, user.key), 429, Catalog.image_pending_full.message)
      await expectRow(rowId, { error_code: "image_pending_full", http_status: 429 })
      expect(fakes.jobs.length).toBe(queued)
      // Another account's slots are its own.
      const other = post({ input: "fish" }, member.key)
      await eventually(() => fakes.heldBy(member.id) === 1, { what: "another account's slot" })
      release()
      for (const res of await Promise.all([first, second, other])) {
        expect(res.status).toBe(200)
        await res.arrayBuffer()
      }
      expect(fakes.heldBy(user.id)).toBe(0)
      const again = await post({ input: "bird" }, user.key)
      expect(again.status).toBe(200)
      await again.arrayBuffer()
    })

    it("504 past images.max_wait_seconds: the job is interrupted and the slot released", async () => {
      await setImages({ max_wait_seconds: 1 })
      fakes.behaviour = () => Effect.never
      const user = await createUser("slow")
      const started = Date.now()
      const res = await post({ input: "cat" }, user.key)
      const rowId = await expectImageError(res, 504, "이미지 생성 시간이 1초를 넘어 취소되었습니다.")
      expect(Date.now() - started).toBeGreaterThanOrEqual(900)
      const job = fakes.jobs[fakes.jobs.length - 1]!
      expect(job.accountId).toBe(user.id)
      expect(fakes.interrupted).toContain(job.id)
      expect(fakes.heldBy(user.id)).toBe(0)
      await expectRow(rowId, { status: "error", error_code: "image_timeout", http_status: 504 })
    })
  })

  it("a client that disconnects interrupts its job, releases its slot and leaves a cancelled row", async () => {
    fakes.behaviour = () => Effect.never
    const user = await createUser("leaver")
    const abort = new AbortController()
    const pending = post({ input: "cat" }, user.key, { signal: abort.signal }).catch((error: unknown) => error)
    const job = await eventually(() => fakes.jobs.find((j) => j.accountId === user.id), { what: "the job queued" })
    expect(fakes.heldBy(user.id)).toBe(1)
    abort.abort()
    expect(await pending).toBeInstanceOf(Error)
    await eventually(() => fakes.interrupted.includes(job.id), { what: "the job interrupted" })
    await eventually(() => fakes.heldBy(user.id) === 0, { what: "the slot released" })
    const row = await eventually(async () => {
      const rows = await afterFlush(gw, (sql) =>
        sql<{ status: string; error_code: string | null; http_status: number; model_id: string }>`
          SELECT status, error_code, http_status, model_id FROM request_log WHERE account_id = ${user.id}`)
      return rows[0] ?? null
    }, { what: "the cancelled row" })
    expect(row).toEqual({ status: "cancelled", error_code: "cancelled", http_status: 499, model_id: "nai-image" })
  })
})
