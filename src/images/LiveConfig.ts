/**
 * The `images` section, live: handed over by the config file watcher (`config/Live.ts` `ConfigFile`, every
 * `catalog_reload_seconds`, on the Effect clock) after each change of the file. An invalid section is refused with
 * a warning and the previous one stays. Switches, thresholds, resolutions, the content policy and retention take
 * effect at the next request.
 */
import { Context, Effect, Layer, Schema } from "effect"
import { ImagesConfig } from "../config/Images.js"
import { ConfigFile, type FileRead, sectionOf, Settings } from "../config/Live.js"

export class LiveImages extends Context.Service<LiveImages, {
  /** The current section (synchronous, for the request path). */
  readonly current: () => ImagesConfig
  /** Checks the file now (tests); false when the section of its current version was refused. */
  readonly reload: Effect.Effect<boolean>
}>()("wellspring/images/LiveImages") {}

const decode = Schema.decodeUnknownSync(ImagesConfig, { onExcessProperty: "error" })

export const make = Effect.gen(function*() {
  const settings = yield* Settings
  const file = yield* ConfigFile
  let live = settings.config.images
  let accepted = true
  let lastRejection = ""
  const refuse = (why: string) => {
    accepted = false
    const log = why === lastRejection
      ? Effect.void
      : Effect.logWarning("images settings reload rejected; keeping the previous ones").pipe(Effect.annotateLogs({ why }))
    lastRejection = why
    return log
  }
  const onRead = (read: FileRead): Effect.Effect<void> => {
    if (read._tag === "Unparsable") return refuse(read.error.slice(0, 500))
    try {
      live = decode(sectionOf(read.raw, "images"))
    } catch (error) {
      return refuse((error as Error).message.slice(0, 500))
    }
    accepted = true
    lastRejection = ""
    return Effect.void
  }
  yield* file.subscribe(onRead)
  return LiveImages.of({ current: () => live, reload: Effect.andThen(file.poll, Effect.sync(() => accepted)) })
})

export const layer = Layer.effect(LiveImages, make)
