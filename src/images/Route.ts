/**
 * `POST /v1/images/nai/generate-image` (spec "Image request", "Image endpoint rules"): the shared `/v1` skeleton
 * (Exchange.ts `exchangeRoute`: key, failed-request guard, request row, account gates), then, in order:
 * admin-only mode (403), account eligibility (403: guests), `images.enabled` and `images.maintenance` (503), the body
 * (400), the content policy (400, before a slot is taken), the active preset, a pending slot (429), the queue
 * (503) and the wait for the PNG under `images.max_wait_seconds` (504). The answer is a ZIP with one PNG; every
 * error is `{statusCode, message}`.
 *
 * Interruption is the cancel path: a timeout or a client disconnect interrupts the wait, which withdraws the job
 * (or cancels it on its worker) and releases the slot when its scope closes. Nothing around the wait is
 * uninterruptible.
 */
import { Effect } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { renderImage } from "../errors/Render.js"
import { exchangeRoute } from "../inference/Exchange.js"
import { IMAGE_MODEL_ID, runGeneration } from "./Generate.js"
import { zipImage } from "./Zip.js"

export const IMAGE_PATH = "/v1/images/nai/generate-image"

export const generateImage = HttpRouter.add(
  "POST",
  IMAGE_PATH,
  exchangeRoute({ render: renderImage, modelId: IMAGE_MODEL_ID, operation: "image_generation" }, (exchange, request) =>
    Effect.gen(function*() {
      const generated = yield* runGeneration(exchange, exchange, request)
      const zip = zipImage(generated.png)
      yield* exchange.succeed()
      return HttpServerResponse.uint8Array(zip, {
        status: 200,
        contentType: "application/zip",
        headers: { "x-request-id": String(exchange.rowId) }
      })
    }))
)
