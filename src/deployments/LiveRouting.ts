/**
 * The `routing` section (health thresholds, failover budget), live: handed over by the config file watcher
 * (`config/Live.ts` `ConfigFile`, every `catalog_reload_seconds`) after each change of the file, like the catalog.
 * An invalid section is refused with a warning and the previous one stays. The router reads it at each request and
 * at each outcome, so a change applies to the next requests; the circuits themselves (state, streak, window,
 * ejection end) are kept as they are.
 */
import { Effect, Schema } from "effect"
import { RoutingConfig } from "../config/GatewayConfig.js"
import { ConfigFile, type FileRead, sectionOf, Settings } from "../config/Live.js"

const decode = Schema.decodeUnknownSync(RoutingConfig, { onExcessProperty: "error" })

/** Longest refusal reason logged (the decoder's message quotes the file). */
const MAX_WHY = 500

/** Subscribes to the config file; returns the current `routing` settings (a synchronous read). */
export const make: Effect.Effect<() => RoutingConfig, never, ConfigFile | Settings> = Effect.gen(function*() {
  const settings = yield* Settings
  const file = yield* ConfigFile
  let live = settings.config.routing
  let text = JSON.stringify(live)
  let lastRejection = ""
  const refuse = (why: string) => {
    const log = why === lastRejection
      ? Effect.void
      : Effect.logWarning("routing settings reload rejected; keeping the previous ones").pipe(
        Effect.annotateLogs({ why })
      )
    lastRejection = why
    return log
  }
  const onRead = (read: FileRead): Effect.Effect<void> => {
    if (read._tag === "Unparsable") return refuse(read.error.slice(0, MAX_WHY))
    let next: RoutingConfig
    try {
      next = decode(sectionOf(read.raw, "routing"))
    } catch (error) {
      return refuse((error as Error).message.slice(0, MAX_WHY))
    }
    lastRejection = ""
    const nextText = JSON.stringify(next)
    if (nextText === text) return Effect.void
    live = next
    text = nextText
    return Effect.logInfo("routing settings reloaded").pipe(Effect.annotateLogs({ routing: nextText }))
  }
  yield* file.subscribe(onRead)
  return () => live
})
