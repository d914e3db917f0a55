import { type Context, Layer, Redacted } from "effect"
import type { SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Accounts from "../../src/accounts/AccountsRepo.js"
import { type GatewayConfig, loadConfig } from "../../src/config/GatewayConfig.js"
import { Settings } from "../../src/config/Live.js"
import * as Sql from "../../src/store/Sql.js"
import { freshDatabase } from "../support/Db.js"

export const shipped = loadConfig({ path: "config/gateway.yaml", env: {} })

export const settingsFor = (
  embedded: boolean,
  edit: (config: GatewayConfig) => GatewayConfig = (c) => c
): Context.Service.Shape<typeof Settings> => {
  const config = edit(shipped.config)
  return {
    config,
    path: shipped.path,
    encryptionKey: null,
    embedded,
    planFor: () => config.plans[config.default_plan]!
  }
}

export type StoreServices = SqlClient.SqlClient | Accounts.AccountsRepo | Settings

export interface OpenedStore {
  readonly layer: Layer.Layer<StoreServices, unknown>
  readonly close: () => Promise<void>
}

export interface Backend {
  readonly name: string
  readonly embedded: boolean
  readonly open: (edit?: (config: GatewayConfig) => GatewayConfig) => Promise<OpenedStore>
}

const withRepo = (sql: Layer.Layer<SqlClient.SqlClient, unknown>, settings: Context.Service.Shape<typeof Settings>) =>
  Layer.provideMerge(Accounts.layer, Layer.merge(Layer.succeed(Settings, settings), sql)) as Layer.Layer<
    StoreServices,
    unknown
  >

/** Embedded PGlite always; PostgreSQL when it is reachable. */
export const backends = (postgres: boolean): ReadonlyArray<Backend> => [
  {
    name: "embedded PGlite",
    embedded: true,
    open: async (edit) => {
      const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-storage-"))
      return {
        layer: withRepo(Sql.layerSql({ dataDir: dir }), settingsFor(true, edit)),
        close: async () => Fs.rmSync(dir, { recursive: true, force: true })
      }
    }
  },
  ...(postgres
    ? [{
      name: "PostgreSQL",
      embedded: false,
      open: async (edit?: (config: GatewayConfig) => GatewayConfig) => {
        const db = await freshDatabase("storage")
        return {
          layer: withRepo(Sql.layerSql({ databaseUrl: Redacted.make(db.url), dataDir: "unused" }), settingsFor(false, edit)),
          close: db.drop
        }
      }
    }]
    : [])
]
