import { Context, Duration, Effect, Layer, Redacted, Schedule, Stream, SubscriptionRef } from "effect"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import { BodyLimits } from "../http/Body.js"
import * as Sealer from "../store/Sealer.js"
import type { Catalog, GatewayConfig, ModelConfig, PlanConfig } from "./GatewayConfig.js"
import { decodeCatalog, decodeLayered, parseYaml } from "./GatewayConfig.js"

/** Modification time and size of the config file; null when it cannot be read. */
export const fileStamp = (path: string): string | null => {
  try {
    const stat = Fs.statSync(path)
    return `${stat.mtimeMs}:${stat.size}`
  } catch {
    return null
  }
}

/** Static settings decided at boot. */
export class Settings extends Context.Service<Settings, {
  readonly config: GatewayConfig
  /** Path of the config file, watched for catalog changes. */
  readonly path: string
  /** Key-encryption key; null disables key reveal and BYOK. */
  readonly encryptionKey: Buffer | null
  readonly embedded: boolean
  readonly planFor: (name: string | null) => PlanConfig
}>()("wellspring/config/Settings") {}

/** An indexed, immutable view of one catalog version. */
export interface CatalogView {
  readonly catalog: Catalog
  readonly version: number
  readonly byId: ReadonlyMap<string, ModelConfig>
  /** Enabled models, in file order. */
  readonly listed: ReadonlyArray<ModelConfig>
}

export const indexCatalog = (catalog: Catalog, version: number): CatalogView => ({
  catalog,
  version,
  byId: new Map(catalog.models.map((m) => [m.id, m])),
  listed: catalog.models.filter((m) => !m.disabled)
})

export class LiveCatalog extends Context.Service<LiveCatalog, {
  /** Synchronous read for the hot path. */
  readonly current: () => CatalogView
  readonly changes: Stream.Stream<CatalogView>
  /** Re-reads the file now; false when the new file was rejected. */
  readonly reload: Effect.Effect<boolean>
}>()("wellspring/config/LiveCatalog") {}

const fingerprint = (path: string): string | null => {
  try {
    const stat = Fs.statSync(path)
    return `${stat.mtimeMs}:${stat.size}:${Crypto.createHash("sha1").update(Fs.readFileSync(path)).digest("hex")}`
  } catch {
    return null
  }
}

/** Parts of the `byok` section that `byok/Byok.ts` takes live; the rest of it is read at boot only. */
const LIVE_BYOK = new Set(["providers", "max_per_provider", "fallback_default_on", "rate_limit_rpm"])

/**
 * Each boot-only section of a decoded config (everything but `catalog` and the live parts of `byok`) as a
 * comparable text; secrets are compared by hash, never kept.
 */
export const bootOnlySections = (config: GatewayConfig): ReadonlyMap<string, string> => {
  const sections = new Map<string, string>()
  for (const [key, value] of Object.entries(config)) {
    if (key === "catalog") continue
    const part = key === "byok"
      ? Object.fromEntries(Object.entries(value as object).filter(([k]) => !LIVE_BYOK.has(k)))
      : value
    sections.set(
      key,
      JSON.stringify(part, function(this: Record<string, unknown>, k, v) {
        const original = this[k]
        return Redacted.isRedacted(original)
          ? Crypto.createHash("sha256").update(String(Redacted.value(original))).digest("hex")
          : v
      }) ?? ""
    )
  }
  return sections
}

/** The whole file decoded as at boot (file, then the environment); throws ConfigLoadError. */
const readWhole = (path: string, env: NodeJS.ProcessEnv) => {
  const raw = parseYaml(Fs.readFileSync(path, "utf8"), path)
  return { catalog: decodeCatalog(raw, path), config: () => decodeLayered(raw, path, env) }
}

/**
 * Polls the config file every `catalog_reload_seconds` (on the Effect clock, so TestClock drives it).
 * A changed file is validated whole, as a restart would read it: when valid, its catalog replaces the current one;
 * when not (in the catalog or anywhere else), the previous catalog stays and the log says why. A changed
 * boot-only section (listeners, limits, plans, ...) is logged as taking effect only at the next restart.
 */
export const makeLiveCatalog = (path: string, initial: Catalog, every: Duration.Input, env: NodeJS.ProcessEnv = process.env) =>
  Effect.gen(function*() {
    let view = indexCatalog(initial, 1)
    let seen = fingerprint(path)
    let lastRejection = ""
    let lastPending = ""
    /** The boot-only sections as the process started with them (null if the file could not be read then). */
    let booted: ReadonlyMap<string, string> | null = null
    try {
      booted = bootOnlySections(readWhole(path, env).config())
    } catch {
      // Compared from the first valid reload on.
    }
    const ref = yield* SubscriptionRef.make(view)
    const reject = (message: string, why: string) => {
      const log = why === lastRejection
        ? Effect.void
        : Effect.logWarning(message).pipe(Effect.annotateLogs({ why }))
      lastRejection = why
      return Effect.as(log, false)
    }
    const reload = Effect.suspend(() => {
      const print = fingerprint(path)
      if (print === null || print === seen) return Effect.succeed(true)
      seen = print
      let whole: ReturnType<typeof readWhole>
      try {
        whole = readWhole(path, env)
      } catch (error) {
        return reject("catalog reload rejected; keeping previous catalog", (error as Error).message)
      }
      let config: GatewayConfig
      try {
        config = whole.config()
      } catch (error) {
        return reject(
          "config reload rejected; keeping previous catalog (a restart with this file would fail)",
          (error as Error).message
        )
      }
      const sections = bootOnlySections(config)
      booted ??= sections
      const pending = [...sections].filter(([key, text]) => booted!.get(key) !== text).map(([key]) => key).join(", ")
      const warnPending = pending === "" || pending === lastPending
        ? Effect.void
        : Effect.logWarning("config changed in sections read only at boot; they take effect at the next restart")
          .pipe(Effect.annotateLogs({ sections: pending }))
      lastPending = pending
      const next = indexCatalog(whole.catalog, view.version + 1)
      view = next
      lastRejection = ""
      return SubscriptionRef.set(ref, next).pipe(
        Effect.andThen(Effect.logInfo("catalog reloaded").pipe(
          Effect.annotateLogs({ version: next.version, models: next.catalog.models.length })
        )),
        Effect.andThen(warnPending),
        Effect.as(true)
      )
    })
    yield* reload.pipe(Effect.repeat(Schedule.spaced(every)), Effect.forkScoped)
    return LiveCatalog.of({ current: () => view, changes: SubscriptionRef.changes(ref), reload })
  })

const KEY_FILE = "encryption.key"
const KEY_NAME = "encryption_key"

/**
 * Creates `<data_dir>/encryption.key` (0600) with a new key unless the file exists (then its key wins); see
 * `store/Sealer.ts` for how two processes starting together end up with the same key.
 */
export const createKeyFile = (dataDir: string): Buffer => Sealer.createKeyFile(dataDir, KEY_FILE, KEY_NAME)

/** The embedded key-encryption key: read from `<data_dir>/encryption.key`, or created there on the first start. */
export const loadOrCreateKeyFile = (dataDir: string): Buffer => Sealer.loadOrCreateKeyFile(dataDir, KEY_FILE, KEY_NAME)

const loadOrCreateKey = (config: GatewayConfig): Buffer | null => {
  if (config.encryption_key) return Sealer.decodeKey32OrThrow(Redacted.value(config.encryption_key), KEY_NAME)
  if (config.database_url) return null
  return loadOrCreateKeyFile(config.data_dir)
}

export const makeSettings = (config: GatewayConfig, path: string): Context.Service.Shape<typeof Settings> => ({
  config,
  path,
  encryptionKey: loadOrCreateKey(config),
  embedded: !config.database_url,
  planFor: (name) => config.plans[name ?? config.default_plan] ?? config.plans[config.default_plan]!
})

export const layer = (config: GatewayConfig, path: string) =>
  Layer.mergeAll(
    Layer.sync(Settings, () => makeSettings(config, path)),
    // The HTTP kit's body bounds, from `limits` (read at boot).
    Layer.succeed(BodyLimits, config.limits),
    Layer.effect(LiveCatalog, makeLiveCatalog(path, config.catalog, Duration.seconds(config.catalog_reload_seconds)))
  )
