/**
 * The `images` section, live: re-read with the catalog (`catalog_reload_seconds`, on the Effect clock). An invalid
 * section is refused with a warning and the previous one stays. Switches, thresholds, resolutions, the content
 * policy and retention take effect at the next request.
 */
import { Context, Duration, Effect, Layer, Schedule, Schema } from "effect"
import { readConfigSection } from "../config/GatewayConfig.js"
import { fileStamp, Settings } from "../config/Live.js"
import { ImagesConfig } from "../config/Images.js"

export class LiveImages extends Context.Service<LiveImages, {
  /** The current section (synchronous, for the request path). */
  readonly current: () => ImagesConfig
  /** Re-reads the file now (tests); false when the section was refused. */
  readonly reload: Effect.Effect<boolean>
}>()("wellspring/images/LiveImages") {}

const decode = Schema.decodeUnknownSync(ImagesConfig, { onExcessProperty: "error" })

export const make = Effect.gen(function*() {
  const settings = yield* Settings
  let live = settings.config.images
  let stamp = fileStamp(settings.path)
  let lastRejection = ""
  const reload = Effect.suspend(() => {
    const now = fileStamp(settings.path)
    if (now === null || now === stamp) return Effect.succeed(true)
    stamp = now
    try {
      live = decode(readConfigSection(settings.path, "images"))
      lastRejection = ""
      return Effect.succeed(true)
    } catch (error) {
      const why = (error as Error).message.slice(0, 500)
      const log = why === lastRejection
        ? Effect.void
        : Effect.logWarning("images settings reload rejected; keeping the previous ones").pipe(Effect.annotateLogs({ why }))
      lastRejection = why
      return Effect.as(log, false)
    }
  })
  yield* reload.pipe(
    Effect.repeat(Schedule.spaced(Duration.seconds(settings.config.catalog_reload_seconds))),
    Effect.forkScoped
  )
  return LiveImages.of({ current: () => live, reload })
})

export const layer = Layer.effect(LiveImages, make)
