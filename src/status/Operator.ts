/**
 * The `operator` origin: `GET /metrics` in the Prometheus text format (telemetry/Telemetry.ts). A listener serves
 * it only when its `origins` name `operator`; the default config has no such listener, so metrics are off the
 * public origins unless an operator adds one (README: Metrics), e.g.
 *
 *   listeners:
 *     - { host: 0.0.0.0, port: 8080, origins: [inference, account, status] }
 *     - { host: 127.0.0.1, port: 9464, origins: [operator] }
 *
 * Values owned by other services (the request-log queue, the key cache, the image queue when the image domain is
 * present) are read at scrape time, not on the request path.
 */
import { Effect, Layer, Option } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { Auth } from "../auth/Auth.js"
import { Lifecycle } from "../http/Lifecycle.js"
import { ImageQueue } from "../images/Contracts.js"
import { RequestLog } from "../telemetry/RequestLog.js"
import { CurrentTelemetry } from "../telemetry/Telemetry.js"

/** The image queue's figures, bounded by 1 s (null without an image domain, or when it does not answer). */
const imageFigures = Effect.gen(function*() {
  const queue = yield* Effect.serviceOption(ImageQueue)
  if (Option.isNone(queue)) return null
  const figures = yield* Effect.all({ waiting: queue.value.waiting, workersOnline: queue.value.workersOnline }).pipe(
    Effect.timeoutOption("1 second")
  )
  return Option.getOrNull(figures)
})

const metrics = HttpRouter.add(
  "GET",
  "/metrics",
  Effect.gen(function*() {
    const telemetry = yield* CurrentTelemetry
    const log = yield* RequestLog
    const auth = yield* Auth
    const body = telemetry.scrape({
      logQueue: log.pending(),
      logDropped: log.dropped(),
      keyCache: auth.keyCache(),
      images: yield* imageFigures,
      busy: (yield* Lifecycle).busy()
    })
    return HttpServerResponse.text(body, {
      contentType: "text/plain; version=0.0.4; charset=utf-8",
      headers: { "cache-control": "no-store" }
    })
  })
)

/** Routes of the `operator` origin. */
export const operatorRouter = Layer.mergeAll(metrics)
