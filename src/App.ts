import { HttpRouter } from "@effect/platform"
import { SqlClient } from "@effect/sql"
import { Effect, Layer } from "effect"
import * as AccountsRepo from "./accounts/AccountsRepo.js"
import * as Auth from "./auth/Auth.js"
import type { GatewayConfig } from "./config/GatewayConfig.js"
import * as Live from "./config/Live.js"
import * as Server from "./http/Server.js"
import { listModels } from "./inference/ModelsRoute.js"
import * as Sql from "./store/Sql.js"

export const inferenceRouter = HttpRouter.empty.pipe(listModels)
export const accountRouter = HttpRouter.empty
export const statusRouter = HttpRouter.empty


/** Creates the dev account and prints its key, only when the database has no account yet. */
export const bootstrapDevAccount = Effect.gen(function*() {
  const settings = yield* Live.Settings
  if (!settings.config.dev_account) return null
  const sql = yield* SqlClient.SqlClient
  const repo = yield* AccountsRepo.AccountsRepo
  const [{ n }] = (yield* Effect.orDie(sql<{ n: number }>`SELECT count(*)::int AS n FROM accounts`)) as unknown as [
    { n: number }
  ]
  if (n > 0) return null
  const account = yield* repo.createAccount({
    username: "dev",
    displayName: "Developer",
    email: "dev@localhost",
    emailVerified: true,
    isAdmin: true
  })
  const { key } = yield* repo.createKey(account.id, "dev")
  return key
})

/** Everything except the HTTP listeners: config, storage, services. */
export const servicesLayer = (config: GatewayConfig, configPath: string) => {
  const settings = Live.layer(config, configPath)
  const sql = Sql.layerSql({ databaseUrl: config.database_url, dataDir: config.data_dir })
  const repo = AccountsRepo.layer
  const auth = Auth.layer
  return Layer.provideMerge(auth, Layer.provideMerge(repo, Layer.merge(settings, sql)))
}

export const appLayer = (config: GatewayConfig, configPath: string) =>
  Layer.provideMerge(Server.layer({ inference: inferenceRouter, account: accountRouter, status: statusRouter }), servicesLayer(config, configPath))
