/**
 * The BYOK runtime of one process: the effective switch and sealing key (`resolveByok`), the provider catalog,
 * and the address guard (it owns two undici Agents, closed with the layer). The per-credential model-list cache
 * belongs to the credential's actor (`Credentials.ts`).
 *
 * Live settings: the provider catalog (`providers.<id>` enable, base URLs, regions), `max_per_provider`,
 * `fallback_default_on` and `rate_limit_rpm` are taken from each changed version of the config file, as the config
 * file watcher hands it over (`config/Live.ts` `ConfigFile`); an invalid `byok` section is refused and the
 * previous settings stay. The switch, the
 * sealing key, the guard's allow-lists, timeouts and cache lifetimes are read at boot.
 */
import { Context, Effect, Layer } from "effect"
import { ConfigFile, type FileRead, sectionOf, Settings } from "../config/Live.js"
import type { AddressGuard, GuardOptions } from "./AddressGuard.js"
import { type ByokConfig, decodeByokConfig } from "../config/Byok.js"
import { type ByokSwitch, resolveByok } from "./Switch.js"
import { makeByokGuard } from "./Probe.js"
import { makeProviderCatalog, type ProviderCatalog } from "./Providers.js"

export class Byok extends Context.Service<Byok, {
  /** The current settings (live parts reloaded, see the module comment). */
  readonly config: ByokConfig
  /** Gate 3 of the BYOK router: on with a sealing key, or off with the reason. */
  readonly switch: ByokSwitch
  /** The current provider catalog (a new object after each accepted reload). */
  readonly catalog: ProviderCatalog
  readonly guard: AddressGuard
}>()("wellspring/byok/Byok") {}

/** `extra`: the guard's resolver and TLS roots (tests; the system's otherwise). */
export const make = (extra: GuardExtras = {}) => Effect.gen(function*() {
  const settings = yield* Settings
  const config = settings.config.byok
  const byokSwitch = resolveByok(config, { embedded: settings.embedded, dataDir: settings.config.data_dir })
  if (!byokSwitch.enabled) yield* Effect.logInfo("BYOK is off").pipe(Effect.annotateLogs("reason", byokSwitch.reason))
  const guard = yield* Effect.acquireRelease(
    Effect.sync(() => makeByokGuard(config, extra)),
    (g) => Effect.promise(() => g.close())
  )
  let live = config
  let catalog = makeProviderCatalog(config)
  /** The live parts as last taken (the boot config may carry the env key: never compared). */
  const comparable = ({ encryption_key: _, ...rest }: ByokConfig) => JSON.stringify(rest)
  let seen = comparable(config)
  /** Takes the live parts of a changed `byok` section; boot-time parts keep their boot values. */
  const onRead = (read: FileRead): Effect.Effect<void> => {
    let next: ByokConfig
    try {
      if (read._tag === "Unparsable") throw new Error(read.error)
      next = decodeByokConfig(sectionOf(read.raw, "byok"))
    } catch (error) {
      const why = (error as Error).message.slice(0, 500)
      return Effect.logWarning("byok settings reload rejected; keeping the previous ones").pipe(Effect.annotateLogs({ why }))
    }
    const text = comparable(next)
    if (text === seen) return Effect.void
    seen = text
    live = {
      ...config,
      providers: next.providers,
      max_per_provider: next.max_per_provider,
      fallback_default_on: next.fallback_default_on,
      rate_limit_rpm: next.rate_limit_rpm
    }
    catalog = makeProviderCatalog(live)
    return Effect.logInfo("byok provider catalog reloaded").pipe(
      Effect.annotateLogs({ providers: catalog.providers.map((p) => p.id).join(",") })
    )
  }
  yield* Effect.flatMap(ConfigFile, (file) => file.subscribe(onRead))
  return Byok.of({
    get config() {
      return live
    },
    switch: byokSwitch,
    get catalog() {
      return catalog
    },
    guard
  })
})

export type GuardExtras = Pick<GuardOptions, "resolver" | "tls">

export const layer = Layer.effect(Byok, make())

export const layerWith = (extra: GuardExtras) => Layer.effect(Byok, make(extra))
