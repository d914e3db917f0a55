import { Effect, Layer, References } from "effect"
import { SqlClient } from "effect/sql"
import { accountRoutes } from "./accounts/AccountRoutes.js"
import * as AccountsRepo from "./accounts/AccountsRepo.js"
import * as Auth from "./auth/Auth.js"
import * as Byok from "./byok/Byok.js"
import * as Credentials from "./byok/Credentials.js"
import * as CredentialsRepo from "./byok/CredentialsRepo.js"
import { byokRoutes } from "./byok/Routes.js"
import type { GatewayConfig } from "./config/GatewayConfig.js"
import * as Live from "./config/Live.js"
import * as FailedRequests from "./http/FailedRequests.js"
import * as Server from "./http/Server.js"
import { chatCompletions } from "./inference/Chat.js"
import { embeddings } from "./inference/Embeddings.js"
import { me, usage } from "./inference/IdentityRoutes.js"
import { listModels } from "./inference/ModelsRoute.js"
import { openApiRoute } from "./inference/OpenApi.js"
import type { Admission } from "./quota/Admission.js"
import * as AdmissionLayer from "./quota/layer.js"
import * as Sql from "./store/Sql.js"
import * as GatewayLogger from "./telemetry/GatewayLogger.js"
import * as Health from "./telemetry/Health.js"
import { operatorRouter } from "./telemetry/Operator.js"
import * as RequestLog from "./telemetry/RequestLog.js"
import * as Telemetry from "./telemetry/Telemetry.js"
import * as Tracing from "./telemetry/Tracing.js"
import * as Upstreams from "./upstream/Upstreams.js"

/** Inference API (`/v1/*`): one `HttpRouter.add` route layer per endpoint. */
export const inferenceRouter = Layer.mergeAll(
  chatCompletions,
  embeddings,
  listModels,
  me,
  usage,
  openApiRoute
)
/** Account API (`/api/user/*`) on the dashboard origin; see src/accounts/AccountRoutes.ts. */
export const accountRouter = Layer.mergeAll(accountRoutes, byokRoutes)
/** The status origin serves no routes yet (every path is a 404). */
export const statusRouter: Layer.Layer<never> = Layer.empty

/**
 * Creates the admin dev account `dev` when the database has no account yet, and returns its key (null when
 * accounts exist). Used by `bootstrapDevAccount` in embedded mode, and by tests that want a key on any database.
 */
export const ensureDevAccount = Effect.gen(function*() {
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

/**
 * First start in embedded mode (with `dev_account`): creates the dev account; main prints its key once.
 * Production (DATABASE_URL) never does: an admin key printed to a server log is a credential in the log;
 * accounts there come from the operator CLI.
 */
export const bootstrapDevAccount = Effect.gen(function*() {
  const settings = yield* Live.Settings
  if (!settings.embedded || !settings.config.dev_account) return null
  return yield* ensureDevAccount
})

const upstreamsLayer = Upstreams.layerEffect(
  Effect.map(Live.LiveCatalog, (live) => Effect.sync(() => live.current().catalog.providers))
)

/** In-memory actors persisted to SQL, or Redis when `redis_url` is set. */
const defaultAdmission: Layer.Layer<Admission, never, SqlClient.SqlClient | Live.Settings> = Layer.unwrap(
  Effect.map(Live.Settings, ({ config }) =>
    AdmissionLayer.layerFromConfigWithSql({
      abuse: config.abuse,
      redisUrl: config.redis_url,
      keyPrefix: config.redis_key_prefix
    }))
)

export interface AppOptions {
  /** Replaces the admission engine chosen from config (tests). */
  readonly admission?: Layer.Layer<Admission, never, SqlClient.SqlClient | Live.Settings>
  /** Where log lines go (default: stdout); tests keep them. */
  readonly logSink?: GatewayLogger.LineSink
  /** The BYOK address guard's resolver and TLS roots (tests: names that resolve where they say). */
  readonly byokGuard?: Byok.GuardExtras
}

/** Everything except the HTTP listeners: config, storage, services. */
export const servicesLayer = (config: GatewayConfig, configPath: string, options: AppOptions = {}) => {
  // Metrics and (when OTEL_* configures an exporter) traces, under everything that records them.
  const observed = Layer.provideMerge(Telemetry.layer, Layer.merge(Live.layer(config, configPath), Tracing.layer()))
  const base = Layer.merge(observed, Sql.layerSql({ databaseUrl: config.database_url, dataDir: config.data_dir }))
  const admission = options.admission ?? defaultAdmission
  const domain = Layer.mergeAll(
    Layer.provide(Auth.layer, Layer.provideMerge(AccountsRepo.layer, base)),
    AccountsRepo.layer,
    RequestLog.layer,
    FailedRequests.layer,
    upstreamsLayer,
    admission,
    options.byokGuard ? Byok.layerWith(options.byokGuard) : Byok.layer,
    CredentialsRepo.layer,
    Health.layer
  )
  // Credentials in use need the BYOK runtime, their rows and Auth's invalidation path. Background fibers make no
  // spans (requests do, when tracing is on: http/Server.ts).
  return Layer.provideMerge(Credentials.layer, Layer.provideMerge(domain, base)).pipe(
    Layer.provide(Layer.succeed(References.TracerEnabled, false))
  )
}

/**
 * The whole gateway. Everything in it logs through the gateway logger (`telemetry/GatewayLogger.ts`: one escaped,
 * bounded line per call), provided underneath so that fibers started while building inherit it.
 */
export const appLayer = (config: GatewayConfig, configPath: string, options: AppOptions = {}) => {
  const services = servicesLayer(config, configPath, options)
  const server = Server.layer(
    { inference: inferenceRouter, account: accountRouter, status: statusRouter, operator: operatorRouter },
    { everyListener: Health.routes }
  )
  return Layer.provideMerge(Layer.provideMerge(server, services), GatewayLogger.layer(options.logSink))
}

