/**
 * The BYOK runtime of one process: the effective switch and sealing key (`resolveByok`), the provider catalog,
 * the address guard (it owns two undici Agents, closed with the layer) and the short per-credential model-list
 * cache of `GET /api/user/me/byok/:id/models`.
 *
 * The catalog and guard are built from the config at boot; a change to `byok` in the config file takes effect
 * on restart (the live reload covers the model catalog only).
 */
import { Clock, Context, Effect, Layer } from "effect"
import { Settings } from "../config/Live.js"
import type { AddressGuard } from "./AddressGuard.js"
import { type ByokConfig, type ByokSwitch, resolveByok } from "./Config.js"
import { makeByokGuard } from "./Probe.js"
import { makeProviderCatalog, type ModelListItem, type ProviderCatalog } from "./Providers.js"

/** Most credentials whose listing is cached at once; the oldest entry leaves first. */
export const MODEL_CACHE_ENTRIES = 10_000

export interface ModelCache {
  /** The cached listing of a credential, unless expired (the Effect clock). */
  readonly get: (credentialId: number) => Effect.Effect<ReadonlyArray<ModelListItem> | null>
  readonly put: (credentialId: number, models: ReadonlyArray<ModelListItem>) => Effect.Effect<void>
  readonly drop: (credentialId: number) => void
}

export const makeModelCache = (ttlMs: number, maxEntries = MODEL_CACHE_ENTRIES): ModelCache => {
  const entries = new Map<number, { readonly models: ReadonlyArray<ModelListItem>; readonly expiresAt: number }>()
  return {
    get: (id) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        const entry = entries.get(id)
        if (entry === undefined) return null
        if (entry.expiresAt <= now) {
          entries.delete(id)
          return null
        }
        return entry.models
      }),
    put: (id, models) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        entries.delete(id)
        if (entries.size >= maxEntries) entries.delete(entries.keys().next().value!)
        entries.set(id, { models, expiresAt: now + ttlMs })
      }),
    drop: (id) => {
      entries.delete(id)
    }
  }
}

export class Byok extends Context.Service<Byok, {
  readonly config: ByokConfig
  /** Gate 3 of the BYOK router: on with a sealing key, or off with the reason. */
  readonly switch: ByokSwitch
  readonly catalog: ProviderCatalog
  readonly guard: AddressGuard
  readonly models: ModelCache
}>()("wellspring/byok/Byok") {}

export const make = Effect.gen(function*() {
  const settings = yield* Settings
  const config = settings.config.byok
  const byokSwitch = resolveByok(config, { embedded: settings.embedded, dataDir: settings.config.data_dir })
  if (!byokSwitch.enabled) yield* Effect.logInfo("BYOK is off").pipe(Effect.annotateLogs("reason", byokSwitch.reason))
  const guard = yield* Effect.acquireRelease(
    Effect.sync(() => makeByokGuard(config)),
    (g) => Effect.promise(() => g.close())
  )
  return Byok.of({
    config,
    switch: byokSwitch,
    catalog: makeProviderCatalog(config),
    guard,
    models: makeModelCache(config.model_list_cache_seconds * 1000)
  })
})

export const layer = Layer.effect(Byok, make)
