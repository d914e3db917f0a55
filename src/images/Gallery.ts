/**
 * The private gallery (issue 17, spec image rule 6): every finished image is kept in its owner's gallery, never in
 * a public feed. The PNG lives in its `images` row (migration 0004), so it survives a restart with the database.
 *
 * Retention: `images.gallery.retention_days` (0 keeps images until deleted) sets `expires_at` when an image is
 * saved. An expired image is neither listed, served nor deletable from the moment it expires; one background
 * fiber deletes expired rows every `SWEEP_INTERVAL`, on the Effect clock (a TestClock drives it).
 *
 * Times (`created_at`, `expires_at`, "now" in the expiry filters) come from the Effect clock, not from SQL `now()`.
 */
import { Cause, Clock, Context, Duration, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { LiveImages } from "./LiveConfig.js"
import { type GalleryEntry, ImageGallery } from "./Contracts.js"

export const SWEEP_INTERVAL = Duration.minutes(10)
/** Rows deleted per statement by the sweep (each holds a PNG). */
export const SWEEP_BATCH = 200
export const PROMPT_MAX = 8000
export const NEGATIVE_MAX = 10000
export const PRESET_NAME_MAX = 40
const DAY_MS = 86_400_000

/** An image's metadata (everything but the PNG). */
export interface ImageRow {
  readonly id: string
  readonly account_id: string
  readonly prompt: string
  readonly negative_prompt: string
  readonly width: number
  readonly height: number
  readonly steps: number
  readonly scale: number
  readonly seed: number
  readonly preset_name: string | null
  readonly bytes: number
  readonly created_at: Date
  readonly expires_at: Date | null
}

/** Where a page of the listing starts: strictly older than this image. */
export interface Cursor {
  readonly createdAtMs: number
  readonly id: string
}

/** Gallery image ids: what the endpoint issues (`img_` + 24 hex) fits; anything else is no image. */
export const IMAGE_ID = /^[A-Za-z0-9_-]{1,64}$/

export const encodeCursor = (row: Pick<ImageRow, "id" | "created_at">): string => `${row.created_at.getTime()}.${row.id}`

export const decodeCursor = (raw: string): Cursor | null => {
  const match = /^([0-9]{1,15})\.([A-Za-z0-9_-]{1,64})$/.exec(raw)
  return match === null ? null : { createdAtMs: Number(match[1]), id: match[2]! }
}

/** At most `max` code points, NUL removed (PostgreSQL text cannot hold it), lone surrogates replaced. */
export const bounded = (s: string, max: number): string => {
  const clean = s.replace(/\u0000/g, "").replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "\ufffd")
  if (clean.length <= max) return clean
  let out = ""
  let n = 0
  for (const ch of clean) {
    if (n++ === max) break
    out += ch
  }
  return out
}

export class GalleryRepo extends Context.Service<GalleryRepo, {
  /** Stores the image; expiry from `images.gallery.retention_days`. Failures are defects (the caller logs them). */
  readonly save: (entry: GalleryEntry) => Effect.Effect<void>
  /** The account's unexpired images, newest first, at most `limit`, older than `before` when given. */
  readonly list: (accountId: string, limit: number, before: Cursor | null) => Effect.Effect<ReadonlyArray<ImageRow>>
  /** One of the account's unexpired images with its PNG; null otherwise (another account's, expired, none). */
  readonly download: (accountId: string, id: string) => Effect.Effect<{ readonly row: ImageRow; readonly png: Uint8Array } | null>
  /** Deletes one of the account's unexpired images; false when there is none such. */
  readonly remove: (accountId: string, id: string) => Effect.Effect<boolean>
  /** Deletes every expired image (in batches); how many. */
  readonly sweep: Effect.Effect<number>
}>()("wellspring/images/GalleryRepo") {}

const METADATA = "id, account_id, prompt, negative_prompt, width, height, steps, scale, seed, preset_name, bytes, created_at, expires_at"

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const images = yield* LiveImages
  const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))
  const metadata = sql.literal(METADATA)

  const sweepBatch = (at: Date) =>
    sql<{ id: string }>`
      DELETE FROM images WHERE id IN (
        SELECT id FROM images WHERE expires_at IS NOT NULL AND expires_at <= ${at} LIMIT ${SWEEP_BATCH})
      RETURNING id`.pipe(Effect.map((rows) => rows.length))

  return GalleryRepo.of({
    save: (entry) =>
      Effect.orDie(Effect.gen(function*() {
        const at = yield* now
        const days = images.current().gallery.retention_days
        const { spec } = entry
        yield* sql`
          INSERT INTO images ${
          sql.insert({
            id: entry.id,
            account_id: entry.accountId,
            prompt: bounded(entry.prompt, PROMPT_MAX),
            negative_prompt: bounded(spec.negative_prompt, NEGATIVE_MAX),
            width: spec.width,
            height: spec.height,
            steps: spec.steps,
            scale: spec.scale,
            seed: spec.seed,
            preset_name: bounded(spec.preset.name, PRESET_NAME_MAX),
            png: entry.png,
            bytes: entry.png.byteLength,
            created_at: at,
            expires_at: days > 0 ? new Date(at.getTime() + days * DAY_MS) : null
          })
        }`
      })),
    list: (accountId, limit, before) =>
      Effect.orDie(Effect.flatMap(now, (at) =>
        before === null
          ? sql<ImageRow>`
              SELECT ${metadata} FROM images
              WHERE account_id = ${accountId} AND (expires_at IS NULL OR expires_at > ${at})
              ORDER BY created_at DESC, id DESC LIMIT ${limit}`
          : sql<ImageRow>`
              SELECT ${metadata} FROM images
              WHERE account_id = ${accountId} AND (expires_at IS NULL OR expires_at > ${at})
                AND (created_at < ${new Date(before.createdAtMs)}
                  OR (created_at = ${new Date(before.createdAtMs)} AND id < ${before.id}))
              ORDER BY created_at DESC, id DESC LIMIT ${limit}`)),
    download: (accountId, id) =>
      Effect.orDie(Effect.flatMap(now, (at) =>
        sql<ImageRow & { readonly png: Uint8Array }>`
          SELECT ${metadata}, png FROM images
          WHERE id = ${id} AND account_id = ${accountId} AND (expires_at IS NULL OR expires_at > ${at})`.pipe(
          Effect.map((rows) => (rows[0] === undefined ? null : { row: rows[0], png: rows[0].png }))
        ))),
    remove: (accountId, id) =>
      Effect.orDie(Effect.flatMap(now, (at) =>
        sql`
          DELETE FROM images
          WHERE id = ${id} AND account_id = ${accountId} AND (expires_at IS NULL OR expires_at > ${at})
          RETURNING id`.pipe(Effect.map((rows) => rows.length > 0)))),
    sweep: Effect.orDie(Effect.gen(function*() {
      const at = yield* now
      let total = 0
      for (;;) {
        const n = yield* sweepBatch(at)
        total += n
        if (n < SWEEP_BATCH) return total
      }
    }))
  })
})

/**
 * Every `SWEEP_INTERVAL` (first after one interval), deletes expired images and hands the count to `onSwept`. A
 * failed sweep is logged and the loop goes on.
 */
export const sweepLoop = (onSwept: (deleted: number) => Effect.Effect<void>) =>
  Effect.flatMap(GalleryRepo, (repo) =>
    Effect.forever(
      Effect.sleep(SWEEP_INTERVAL).pipe(
        Effect.andThen(repo.sweep),
        Effect.flatMap(onSwept),
        Effect.catchCause((cause) =>
          Cause.hasInterruptsOnly(cause) ? Effect.failCause(cause) : Effect.logWarning("gallery sweep failed", cause)
        )
      )
    ))

const logSwept = (deleted: number) =>
  deleted === 0 ? Effect.void : Effect.logInfo("expired gallery images deleted").pipe(Effect.annotateLogs({ deleted }))

export const repoLayer = Layer.effect(GalleryRepo, make)

/** `GalleryRepo`, the `ImageGallery` seam the image endpoint saves through, and the retention sweep. */
export const layer = Layer.provideMerge(
  Layer.effect(
    ImageGallery,
    Effect.gen(function*() {
      const repo = yield* GalleryRepo
      yield* Effect.forkScoped(sweepLoop(logSwept))
      return ImageGallery.of({ save: repo.save })
    })
  ),
  repoLayer
)
