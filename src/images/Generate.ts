/**
 * One image for an authenticated exchange, shared by the `/v1` endpoint (Route.ts) and the dashboard's generate
 * form (DashboardGenerate.ts): the checks after authentication in the order of Route.ts's module comment, the
 * queue and the wait, and the gallery entry.
 */
import { Duration, Effect } from "effect"
import type { HttpServerRequest } from "effect/http"
import * as Crypto from "node:crypto"
import { fail, ImageMessages } from "../errors/Catalog.js"
import { readJson } from "../http/Body.js"
import type { AnswerMeter, ExchangeView } from "../inference/Exchange.js"
import { IMAGE_MODEL } from "../telemetry/Telemetry.js"
import { ImageGallery, type ImageJob, ImagePresets, ImageQueue, ImageSlots } from "./Contracts.js"
import { LiveImages } from "./LiveConfig.js"
import { blockedCategory } from "./Policy.js"
import { decodeImageRequest, IMAGE_BODY_BYTES, MAX_SEED } from "./Request.js"
import { resolveSettings } from "./Settings.js"
import { isPng } from "./Zip.js"

/** The `model_id` of every image request row (the body's `model` is ignored, so it is not recorded either). */
export const IMAGE_MODEL_ID = IMAGE_MODEL

/** `img_` + 24 hex. */
export const newJobId = (): string => `img_${Crypto.randomBytes(12).toString("hex")}`

const blocked = (category: string) => fail("image_blocked", { message: ImageMessages.blocked(category) })

/** What one generation produced: the PNG, kept in the gallery under `id`. */
export interface Generated {
  readonly id: string
  readonly png: Uint8Array
  readonly width: number
  readonly height: number
  readonly seed: number
}

/**
 * One image for the exchange's caller, from the checks after authentication to the saved gallery entry (the order
 * of Route.ts's module comment). Shared by the `/v1` endpoint and the dashboard's generate form
 * (`POST /api/user/me/images/generate`, DashboardGenerate.ts), which differ only in how the caller authenticates and
 * how the answer is rendered. Reads the exchange through its view and times the job on its meter.
 */
export const runGeneration = (
  exchange: ExchangeView,
  /** Times the job (dispatched to the queue, the image back): the row's `ttfb_ms`. */
  meter: AnswerMeter,
  request: HttpServerRequest.HttpServerRequest
) =>
  Effect.gen(function*() {
    const live = yield* LiveImages
    const slots = yield* ImageSlots
    const queue = yield* ImageQueue
    const presets = yield* ImagePresets
    const gallery = yield* ImageGallery
    const images = live.current()
    const account = exchange.caller.account
    if (images.admin_only && !account.is_admin) return yield* Effect.fail(fail("image_admin_only"))
    if (account.is_guest) return yield* Effect.fail(fail("image_not_eligible"))
    if (!images.enabled) return yield* Effect.fail(fail("image_disabled"))
    if (images.maintenance) return yield* Effect.fail(fail("image_maintenance"))

    const body = yield* readJson(request, { maxBytes: IMAGE_BODY_BYTES })
    const req = yield* Effect.fromResult(decodeImageRequest(body))
    const policy = images.content_policy
    const inInput = blockedCategory(policy, account.sfw_mode, req.input)
    if (inInput !== null) return yield* Effect.fail(blocked(inInput))

    const preset = yield* presets.active(account.id)
    // The quality prompt is the account's own text too: it must not carry what the input may not.
    const inPreset = blockedCategory(policy, account.sfw_mode, preset.quality_prompt)
    if (inPreset !== null) return yield* Effect.fail(blocked(inPreset))

    const job: ImageJob = {
      id: newJobId(),
      accountId: account.id,
      spec: resolveSettings({
        request: req,
        preset,
        resolutions: images.resolutions,
        safeMode: account.sfw_mode,
        safeModeNegative: policy.safe_mode_negative,
        randomSeed: Crypto.randomInt(0, MAX_SEED + 1)
      })
    }

    const seconds = images.max_wait_seconds
    const outcome = yield* Effect.scoped(
      Effect.andThen(
        slots.acquire(account.id),
        Effect.suspend(() => {
          meter.markDispatched()
          return queue.run(job)
        }).pipe(Effect.timeoutOrElse({
          duration: Duration.seconds(seconds),
          orElse: () => Effect.fail(fail("image_timeout", { message: ImageMessages.timeout(seconds) }))
        }))
      )
    )
    if (outcome._tag === "Failed") return yield* Effect.fail(fail("image_failed", { detail: outcome.reason }))
    if (!isPng(outcome.png)) {
      return yield* Effect.fail(fail("image_failed", { detail: `worker ${outcome.workerId} returned bytes that are not a PNG` }))
    }
    meter.markFirstByte()

    // The image exists: keep it in the gallery even if the client has gone; a failed save only costs the copy.
    yield* gallery.save({ id: job.id, accountId: account.id, prompt: req.input, spec: job.spec, png: outcome.png }).pipe(
      Effect.catchCause((cause) =>
        Effect.logWarning("image not saved to the gallery", cause).pipe(Effect.annotateLogs({ job: job.id }))
      ),
      Effect.uninterruptible
    )
    const generated: Generated = {
      id: job.id,
      png: outcome.png,
      width: job.spec.width,
      height: job.spec.height,
      seed: job.spec.seed
    }
    return generated
  })

