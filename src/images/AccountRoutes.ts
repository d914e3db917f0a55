/**
 * Presets and the private gallery on the account API (dashboard origin), snake_case, wrapped `{success, data}`;
 * errors `{success: false, error: {message, type, code}}` (renderAccount).
 *
 * Every route authenticates first (cookie or Bearer key; cookie mutations must be same-origin JSON, inherited from
 * `authenticateAccount`), then counts one hit on its per-account limit (reads and changes have separate
 * budgets), then parses the id and only then reads a body (at most `PRESET_BODY_BYTES`). Any authenticated account
 * may use them: image generation itself is where the account's status is checked.
 *
 * A malformed id is answered like a missing one (404), and so is another account's preset or image.
 */
import { Effect, Layer } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { enforce, type EndpointLimit, endpointLimit } from "../accounts/Limits.js"
import { authenticateAccount } from "../accounts/SessionAuth.js"
import { fail, type GatewayError, ImageAccountMessages as M } from "../errors/Catalog.js"
import { renderAccount } from "../errors/Render.js"
import { readJson } from "../http/Body.js"
import { handle, json } from "../http/Respond.js"
import { decodeCursor, encodeCursor, GalleryRepo, IMAGE_ID, type ImageRow } from "./Gallery.js"
import { MAX_PRESETS, PresetsRepo, validateNewPreset, validatePresetFields } from "./Presets.js"

/** Three GET routes share it: the preset list, the image list and downloads. */
export const IMAGE_READ_LIMIT: EndpointLimit = endpointLimit("images_read", 120, 60, M.readLimited(120))
/** Preset create, update, delete, activate and image delete share it. */
export const IMAGE_WRITE_LIMIT: EndpointLimit = endpointLimit("images_write", 60, 60, M.writeLimited(60))

/** The largest preset is a few kilobytes of text (two 2000-character prompts, eight LoRA names). */
export const PRESET_BODY_BYTES = 64 * 1024

export const GALLERY_LIMIT_DEFAULT = 20
export const GALLERY_LIMIT_MAX = 50

/** `limit`: absent, not a number or below 1 → 20; fractions floored; above 50 → 50 (like `/requests`). */
export const parseGalleryLimit = (raw: string | null): number => {
  const n = Number(raw?.trim() || Number.NaN)
  if (!Number.isFinite(n) || Math.floor(n) <= 0) return GALLERY_LIMIT_DEFAULT
  return Math.min(Math.floor(n), GALLERY_LIMIT_MAX)
}

export const downloadPath = (id: string) => `/api/user/me/images/${id}`

export const imageView = (row: ImageRow) => ({
  id: row.id,
  prompt: row.prompt,
  negative_prompt: row.negative_prompt,
  width: row.width,
  height: row.height,
  steps: row.steps,
  scale: row.scale,
  seed: Number(row.seed),
  preset_name: row.preset_name,
  bytes: row.bytes,
  created_at: row.created_at.toISOString(),
  expires_at: row.expires_at === null ? null : row.expires_at.toISOString(),
  download_url: downloadPath(row.id)
})

const query = (request: HttpServerRequest.HttpServerRequest): URLSearchParams => {
  const i = request.url.indexOf("?")
  return new URLSearchParams(i < 0 ? "" : request.url.slice(i + 1))
}

const caller = (limit: EndpointLimit) =>
  Effect.flatMap(authenticateAccount, (c) => Effect.as(enforce(limit, c.account.id), c.account.id))

const presetId = Effect.flatMap(HttpRouter.params, (params) => {
  const raw = params.id
  if (raw === undefined || !/^[1-9][0-9]{0,14}$/.test(raw)) return Effect.fail(fail("preset_not_found"))
  return Effect.succeed(Number(raw))
})

const imageId = Effect.flatMap(HttpRouter.params, (params) => {
  const raw = params.id
  return raw !== undefined && IMAGE_ID.test(raw) ? Effect.succeed(raw) : Effect.fail(fail("image_not_found"))
})

const body = Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
  readJson(request, { maxBytes: PRESET_BODY_BYTES, emptyIsAbsent: true }))

const invalid = (message: string) => fail("preset_invalid", { message })

const route = <R>(
  method: "GET" | "POST" | "PATCH" | "DELETE",
  path: HttpRouter.PathInput,
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse, GatewayError, R>
) => HttpRouter.add(method, path, handle(renderAccount, handler))

const listPresets = Effect.gen(function*() {
  const accountId = yield* caller(IMAGE_READ_LIMIT)
  const presets = yield* Effect.flatMap(PresetsRepo, (repo) => repo.list(accountId))
  return json({
    success: true,
    data: { presets, active_id: presets.find((p) => p.active)?.id ?? null, max: MAX_PRESETS }
  })
})

const createPreset = Effect.gen(function*() {
  const accountId = yield* caller(IMAGE_WRITE_LIMIT)
  const input = validateNewPreset(yield* body)
  if (!input.ok) return yield* Effect.fail(invalid(input.message))
  const outcome = yield* Effect.flatMap(PresetsRepo, (repo) => repo.create(accountId, input.value, MAX_PRESETS))
  if (outcome._tag === "Cap") return yield* Effect.fail(fail("preset_cap_reached", { message: M.presetCap(outcome.max) }))
  return json({ success: true, data: { preset: outcome.preset } })
})

const updatePreset = Effect.gen(function*() {
  const accountId = yield* caller(IMAGE_WRITE_LIMIT)
  const id = yield* presetId
  const input = validatePresetFields(yield* body)
  if (!input.ok) return yield* Effect.fail(invalid(input.message))
  const preset = yield* Effect.flatMap(PresetsRepo, (repo) => repo.update(accountId, id, input.value))
  if (preset === null) return yield* Effect.fail(fail("preset_not_found"))
  return json({ success: true, data: { preset } })
})

const deletePreset = Effect.gen(function*() {
  const accountId = yield* caller(IMAGE_WRITE_LIMIT)
  const id = yield* presetId
  const removed = yield* Effect.flatMap(PresetsRepo, (repo) => repo.remove(accountId, id))
  if (removed === null) return yield* Effect.fail(fail("preset_not_found"))
  return json({ success: true, data: { active_id: removed.active?.id ?? null } })
})

const activatePreset = Effect.gen(function*() {
  const accountId = yield* caller(IMAGE_WRITE_LIMIT)
  const id = yield* presetId
  const preset = yield* Effect.flatMap(PresetsRepo, (repo) => repo.activate(accountId, id))
  if (preset === null) return yield* Effect.fail(fail("preset_not_found"))
  return json({ success: true, data: { preset } })
})

const listImages = Effect.gen(function*() {
  const accountId = yield* caller(IMAGE_READ_LIMIT)
  const q = query(yield* HttpServerRequest.HttpServerRequest)
  const limit = parseGalleryLimit(q.get("limit"))
  const rawBefore = q.get("before")
  const before = rawBefore === null || rawBefore === "" ? null : decodeCursor(rawBefore)
  if (before === null && rawBefore !== null && rawBefore !== "") {
    return yield* Effect.fail(fail("invalid_request", { message: M.before }))
  }
  // One more than the page tells whether there is a next one.
  const rows = yield* Effect.flatMap(GalleryRepo, (repo) => repo.list(accountId, limit + 1, before))
  const page = rows.slice(0, limit)
  return json({
    success: true,
    data: {
      images: page.map(imageView),
      limit,
      next_before: rows.length > limit ? encodeCursor(page[page.length - 1]!) : null
    }
  })
})

const downloadImage = Effect.gen(function*() {
  const accountId = yield* caller(IMAGE_READ_LIMIT)
  const id = yield* imageId
  const found = yield* Effect.flatMap(GalleryRepo, (repo) => repo.download(accountId, id))
  if (found === null) return yield* Effect.fail(fail("image_not_found"))
  return HttpServerResponse.uint8Array(found.png, {
    contentType: "image/png",
    headers: {
      "content-disposition": `attachment; filename="${id}.png"`,
      "cache-control": "private, no-store",
      "x-content-type-options": "nosniff"
    }
  })
})

const deleteImage = Effect.gen(function*() {
  const accountId = yield* caller(IMAGE_WRITE_LIMIT)
  const id = yield* imageId
  if (!(yield* Effect.flatMap(GalleryRepo, (repo) => repo.remove(accountId, id)))) {
    return yield* Effect.fail(fail("image_not_found"))
  }
  return json({ success: true })
})

export const imageAccountRoutes = Layer.mergeAll(
  route("GET", "/api/user/me/image-presets", listPresets),
  route("POST", "/api/user/me/image-presets", createPreset),
  route("PATCH", "/api/user/me/image-presets/:id", updatePreset),
  route("DELETE", "/api/user/me/image-presets/:id", deletePreset),
  route("POST", "/api/user/me/image-presets/:id/activate", activatePreset),
  route("GET", "/api/user/me/images", listImages),
  route("GET", "/api/user/me/images/:id", downloadImage),
  route("DELETE", "/api/user/me/images/:id", deleteImage)
)
