import { Effect, type Layer, ManagedRuntime } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { inject } from "vitest"
import * as Yaml from "yaml"
import { appLayer, type AppOptions, ensureDevAccount } from "../../src/App.js"
import { loadConfig } from "../../src/config/GatewayConfig.js"
import { BoundListeners } from "../../src/http/Server.js"

export type ConfigDoc = Record<string, any>

export const defaultConfigDoc = (): ConfigDoc =>
  Yaml.parse(Fs.readFileSync(Path.resolve("config/gateway.yaml"), "utf8")) as ConfigDoc

export interface GatewayOptions {
  /** Edits the default config before boot. */
  readonly configure?: (doc: ConfigDoc) => void
  /** Real PostgreSQL instead of embedded PGlite. */
  readonly databaseUrl?: string
  readonly redisUrl?: string
  /** Prefix of the admission keys in Redis (`WELLSPRING_REDIS_PREFIX`); use one per run (`uniquePrefix`). */
  readonly redisPrefix?: string
  /**
   * Data folder to use (and keep on `stop`) instead of a fresh temporary one: a second gateway started on the
   * same folder after the first stopped sees the same embedded database (restart tests).
   */
  readonly dataDir?: string
  readonly admission?: AppOptions["admission"]
  /** In-process image services (the queue, slots, presets and gallery) instead of the configured ones. */
  readonly images?: AppOptions["images"]
  /** Sees every database connection (support/SqlCounter.ts). */
  readonly sqlTap?: AppOptions["sqlTap"]
  /** An in-test worker side of the image queue (test/images/workerSupport.ts). */
  readonly imageWork?: AppOptions["imageWork"]
  /** Where log lines go (default: stdout). */
  readonly logSink?: AppOptions["logSink"]
  /** The deployment balancer's chance (a seeded generator makes choices repeatable). */
  readonly deploymentRandom?: AppOptions["deploymentRandom"]
}

type AppServices = Layer.Success<ReturnType<typeof appLayer>>

export interface TestGateway {
  readonly url: string
  readonly port: number
  /** The dev account's key (printed once at first start; empty when the database already had accounts). */
  readonly key: string
  readonly dir: string
  readonly configPath: string
  readonly runtime: ManagedRuntime.ManagedRuntime<AppServices, unknown>
  readonly run: <A, E>(effect: Effect.Effect<A, E, AppServices>) => Promise<A>
  /** Rewrites the config file (the catalog reload picks it up). */
  readonly rewriteConfig: (configure: (doc: ConfigDoc) => void) => void
  readonly stop: () => Promise<void>
}

/**
 * Copies the run's empty PGlite cluster (test/support/globalSetup.ts) to where embedded mode keeps its database
 * (`<data folder>/pglite`), so the gateway opens it instead of running initdb. The gateway makes the copied files
 * private and runs its migrations as on any start.
 */
export const seedEmbeddedCluster = (dataDir: string): void => {
  Fs.mkdirSync(dataDir, { recursive: true, mode: 0o700 })
  Fs.cpSync(inject("pgliteTemplate"), Path.join(dataDir, "pglite"), { recursive: true })
}

/** Boots the whole gateway in this process on a random loopback port. */
export const startGateway = async (options: GatewayOptions = {}): Promise<TestGateway> => {
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-test-"))
  if (options.databaseUrl === undefined && options.dataDir === undefined) {
    seedEmbeddedCluster(Path.join(dir, "data"))
  }
  const configPath = Path.join(dir, "gateway.yaml")
  let doc = defaultConfigDoc()
  options.configure?.(doc)
  Fs.writeFileSync(configPath, Yaml.stringify(doc))
  const { config, path } = loadConfig({
    path: configPath,
    env: {
      WELLSPRING_PORT: "0",
      WELLSPRING_DATA_DIR: options.dataDir ?? Path.join(dir, "data"),
      ...(options.databaseUrl ? { DATABASE_URL: options.databaseUrl } : {}),
      ...(options.redisUrl ? { REDIS_URL: options.redisUrl } : {}),
      ...(options.redisPrefix ? { WELLSPRING_REDIS_PREFIX: options.redisPrefix } : {})
    }
  })
  const runtime = ManagedRuntime.make(appLayer(config, path, {
    ...(options.admission ? { admission: options.admission } : {}),
    ...(options.images ? { images: options.images } : {}),
    ...(options.sqlTap ? { sqlTap: options.sqlTap } : {}),
    ...(options.imageWork ? { imageWork: options.imageWork } : {}),
    ...(options.logSink ? { logSink: options.logSink } : {}),
    ...(options.deploymentRandom ? { deploymentRandom: options.deploymentRandom } : {})
  }))
  const key = await runtime.runPromise(ensureDevAccount)
  const { listeners } = await runtime.runPromise(BoundListeners)
  const port = listeners[0]!.port
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    key: key ?? "",
    dir,
    configPath,
    runtime,
    run: (effect) => runtime.runPromise(effect),
    rewriteConfig: (configure) => {
      doc = structuredClone(doc)
      configure(doc)
      Fs.writeFileSync(configPath, Yaml.stringify(doc))
    },
    stop: async () => {
      await runtime.dispose()
      Fs.rmSync(dir, { recursive: true, force: true })
    }
  }
}

export const authed = (key: string, extra: Record<string, string> = {}) => ({
  authorization: `Bearer ${key}`,
  "content-type": "application/json",
  ...extra
})

export const runEffect = <A, E>(effect: Effect.Effect<A, E>) => Effect.runPromise(effect)
