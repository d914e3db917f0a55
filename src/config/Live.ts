import { Context, Duration, Effect, Layer, Redacted, Schedule, Semaphore, Stream, SubscriptionRef } from "effect"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import { BodyLimits } from "../http/Body.js"
import * as Sealer from "../store/Sealer.js"
import type { Catalog, GatewayConfig, ModelConfig, PlanConfig } from "./GatewayConfig.js"
import { decodeCatalog, decodeLayered, parseYaml } from "./GatewayConfig.js"

/** Static settings decided at boot. */
export class Settings extends Context.Service<Settings, {
  readonly config: GatewayConfig
  /** Path of the config file, watched by `ConfigFile` for live changes. */
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
  /** Polls the file now; false while its current version is rejected. */
  readonly reload: Effect.Effect<boolean>
}>()("wellspring/config/LiveCatalog") {}

/** What one poll of the config file read: the parsed document, or why it could not be parsed. */
export type FileRead =
  | { readonly _tag: "Parsed"; readonly raw: unknown }
  | { readonly _tag: "Unparsable"; readonly error: string }

/**
 * The config file after boot: the one poller of it. Every `catalog_reload_seconds` (on the Effect clock) it
 * compares the file's fingerprint (mtime, size, content hash); on a change it parses the file once and hands the
 * result to every listener, in the order they subscribed (the catalog first, then `images`, `byok` and `routing`).
 */
export class ConfigFile extends Context.Service<ConfigFile, {
  readonly path: string
  /** Adds a listener, run after each change of the file with what was read. */
  readonly subscribe: (listener: (read: FileRead) => Effect.Effect<void>) => Effect.Effect<void>
  /** Checks the file now (the background poll does the same); listeners run when it changed. */
  readonly poll: Effect.Effect<void>
}>()("wellspring/config/ConfigFile") {}

/** The file's bytes and fingerprint; null when it cannot be read. */
const readStamped = (path: string): { readonly text: string; readonly print: string } | null => {
  try {
    const stat = Fs.statSync(path)
    const bytes = Fs.readFileSync(path)
    const hash = Crypto.createHash("sha1").update(bytes).digest("hex")
    return { text: bytes.toString("utf8"), print: `${stat.mtimeMs}:${stat.size}:${hash}` }
  } catch {
    return null
  }
}

/** Starts polling `path` every `every` in the current scope. */
export const makeConfigFile = (path: string, every: Duration.Input) =>
  Effect.gen(function*() {
    let seen = readStamped(path)?.print ?? null
    const listeners: Array<(read: FileRead) => Effect.Effect<void>> = []
    // One poll at a time: an explicit poll returns after the listeners have seen the change.
    const lock = yield* Semaphore.make(1)
    const poll = lock.withPermit(Effect.suspend(() => {
      const stamped = readStamped(path)
      if (stamped === null || stamped.print === seen) return Effect.void
      seen = stamped.print
      let read: FileRead
      try {
        read = { _tag: "Parsed", raw: parseYaml(stamped.text, path) }
      } catch (error) {
        read = { _tag: "Unparsable", error: (error as Error).message }
      }
      return Effect.forEach(listeners, (listener) => listener(read), { discard: true })
    }))
    yield* poll.pipe(Effect.repeat(Schedule.spaced(every)), Effect.forkScoped)
    return ConfigFile.of({ path, subscribe: (listener) => Effect.sync(() => void listeners.push(listener)), poll })
  })

/** The file watcher of `Settings.path`, for layers that build the live sections without `layer` below. */
export const layerConfigFile = Layer.effect(
  ConfigFile,
  Effect.flatMap(
    Settings,
    (settings) => makeConfigFile(settings.path, Duration.seconds(settings.config.catalog_reload_seconds))
  )
)

/** One top-level section of a parsed config file as written; `{}` when absent. */
export const sectionOf = (raw: unknown, name: string): unknown => {
  const section = typeof raw === "object" && raw !== null ? (raw as Record<string, unknown>)[name] : undefined
  return section ?? {}
}

/** Parts of the `byok` section that `byok/Byok.ts` takes live; the rest of it is read at boot only. */
const LIVE_BYOK = new Set(["providers", "max_per_provider", "fallback_default_on", "rate_limit_rpm"])

/** Whole sections taken live: the catalog (here), `routing` (`deployments/LiveRouting.ts`). */
const LIVE_SECTIONS = new Set(["catalog", "routing"])

/**
 * Each boot-only section of a decoded config (everything but `catalog`, `routing` and the live parts of `byok`) as
 * a comparable text; secrets are compared by hash, never kept.
 */
export const bootOnlySections = (config: GatewayConfig): ReadonlyMap<string, string> => {
  const sections = new Map<string, string>()
  for (const [key, value] of Object.entries(config)) {
    if (LIVE_SECTIONS.has(key)) continue
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

/** A parsed file decoded as at boot (file, then the environment); throws ConfigLoadError. */
const decodeWhole = (raw: unknown, path: string, env: NodeJS.ProcessEnv) => ({
  catalog: decodeCatalog(raw, path),
  config: () => decodeLayered(raw, path, env)
})

/**
 * The live catalog, fed by the config file watcher. A changed file is validated whole, as a restart would read it:
 * when valid, its catalog replaces the current one; when not (in the catalog or anywhere else), the previous
 * catalog stays and the log says why. A changed boot-only section (listeners, limits, plans, ...) is logged as
 * taking effect only at the next restart. `reload` polls the file now and says whether its current version was
 * accepted.
 */
export const makeLiveCatalogOn = (file: ConfigFile["Service"], initial: Catalog, env: NodeJS.ProcessEnv = process.env) =>
  Effect.gen(function*() {
    const path = file.path
    let view = indexCatalog(initial, 1)
    let accepted = true
    let lastRejection = ""
    let lastPending = ""
    /** The boot-only sections as the process started with them (null if the file could not be read then). */
    let booted: ReadonlyMap<string, string> | null = null
    try {
      booted = bootOnlySections(decodeWhole(parseYaml(Fs.readFileSync(path, "utf8"), path), path, env).config())
    } catch {
      // Compared from the first valid reload on.
    }
    const ref = yield* SubscriptionRef.make(view)
    const reject = (message: string, why: string) => {
      const log = why === lastRejection
        ? Effect.void
        : Effect.logWarning(message).pipe(Effect.annotateLogs({ why }))
      lastRejection = why
      accepted = false
      return log
    }
    const onRead = (read: FileRead): Effect.Effect<void> => {
      if (read._tag === "Unparsable") return reject("catalog reload rejected; keeping previous catalog", read.error)
      let whole: ReturnType<typeof decodeWhole>
      try {
        whole = decodeWhole(read.raw, path, env)
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
      accepted = true
      return SubscriptionRef.set(ref, next).pipe(
        Effect.andThen(Effect.logInfo("catalog reloaded").pipe(
          Effect.annotateLogs({ version: next.version, models: next.catalog.models.length })
        )),
        Effect.andThen(warnPending)
      )
    }
    yield* file.subscribe(onRead)
    return LiveCatalog.of({
      current: () => view,
      changes: SubscriptionRef.changes(ref),
      reload: Effect.andThen(file.poll, Effect.sync(() => accepted))
    })
  })

/** A watcher of `path` and the live catalog on it (tests build the catalog alone with this). */
export const makeLiveCatalog = (path: string, initial: Catalog, every: Duration.Input, env: NodeJS.ProcessEnv = process.env) =>
  Effect.flatMap(makeConfigFile(path, every), (file) => makeLiveCatalogOn(file, initial, env))

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

/** Settings, the HTTP kit's body bounds (`limits`, read at boot), the config file watcher and the live catalog. */
export const layer = (config: GatewayConfig, path: string) =>
  Layer.mergeAll(
    Layer.sync(Settings, () => makeSettings(config, path)),
    Layer.succeed(BodyLimits, config.limits),
    Layer.effectContext(Effect.gen(function*() {
      const file = yield* makeConfigFile(path, Duration.seconds(config.catalog_reload_seconds))
      const catalog = yield* makeLiveCatalogOn(file, config.catalog)
      return Context.make(ConfigFile, file).pipe(Context.add(LiveCatalog, catalog))
    }))
  )
