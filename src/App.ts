import { Effect, Layer, References } from "effect"
import { SqlClient } from "effect/sql"
import { accountRoutes } from "./accounts/AccountRoutes.js"
import { signInRoutes } from "./accounts/SignIn.js"
import { dashboardRoutes } from "./dashboard/Assets.js"
import { dashboardGenerate } from "./images/DashboardGenerate.js"
import * as AccountsRepo from "./accounts/AccountsRepo.js"
import * as Leaderboard from "./accounts/Leaderboard.js"
import * as Auth from "./auth/Auth.js"
import * as Byok from "./byok/Byok.js"
import * as Credentials from "./byok/Credentials.js"
import * as CredentialsRepo from "./byok/CredentialsRepo.js"
import { byokRoutes } from "./byok/Routes.js"
import type { GatewayConfig, Origin } from "./config/GatewayConfig.js"
import * as Live from "./config/Live.js"
import * as FailedRequests from "./http/FailedRequests.js"
import * as Images from "./images/layer.js"
import * as Server from "./http/Server.js"
import { imageAccountRoutes } from "./images/AccountRoutes.js"
import { ImageGallery, ImagePresets, ImageQueue, ImageSlots, ImageWork } from "./images/Contracts.js"
import * as Gallery from "./images/Gallery.js"
import * as LiveImages from "./images/LiveConfig.js"
import * as Presets from "./images/Presets.js"
import { generateImage } from "./images/Route.js"
import { workerRoutes } from "./images/WorkerRoutes.js"
import * as WorkerTokens from "./images/WorkerTokens.js"
import { chatCompletions } from "./inference/Chat.js"
import { embeddings } from "./inference/Embeddings.js"
import { me, usage } from "./inference/IdentityRoutes.js"
import { listModels, retrieveModel } from "./inference/ModelsRoute.js"
import { openApiRoute } from "./inference/OpenApi.js"
import { countTokens, messages } from "./protocols/anthropic/Routes.js"
import { responsesRoutes } from "./protocols/responses/Route.js"
import * as ResponseStore from "./protocols/responses/Store.js"
import type { Admission } from "./quota/Admission.js"
import * as AdmissionLayer from "./quota/layer.js"
import * as Refresh from "./runtime/Refresh.js"
import * as RefreshRedis from "./runtime/RefreshRedis.js"
import { pageRoutes, publicStatsRoutes, quotaRoute } from "./status/Routes.js"
import * as Status from "./status/Status.js"
import * as Sql from "./store/Sql.js"
import * as GatewayLogger from "./telemetry/GatewayLogger.js"
import * as Health from "./telemetry/Health.js"
import { operatorRouter } from "./status/Operator.js"
import * as RequestLog from "./telemetry/RequestLog.js"
import * as Telemetry from "./telemetry/Telemetry.js"
import * as Tracing from "./telemetry/Tracing.js"
import * as Upstreams from "./upstream/Upstreams.js"
import * as HealthRedis from "./deployments/HealthRedis.js"
import * as LiveRouting from "./deployments/LiveRouting.js"
import * as Router from "./deployments/Router.js"
import { deploymentRoutes } from "./deployments/Routes.js"

/** Inference API (`/v1/*`): one `HttpRouter.add` route layer per endpoint. */
export const inferenceRouter = Layer.mergeAll(
  chatCompletions,
  messages,
  countTokens,
  responsesRoutes,
  embeddings,
  listModels,
  retrieveModel,
  me,
  usage,
  openApiRoute,
  generateImage,
  workerRoutes
)
/**
 * Account API (`/api/user/*`) on the dashboard origin (src/accounts/AccountRoutes.ts), with `/api/quota` and the
 * public status endpoints (src/status/Routes.ts); dashboard sign-in (src/accounts/SignIn.ts), its generate form
 * and its built files under `/dashboard/` (src/dashboard/Assets.ts).
 */
export const accountRouter = Layer.mergeAll(
  accountRoutes,
  byokRoutes,
  imageAccountRoutes,
  quotaRoute,
  publicStatsRoutes,
  signInRoutes,
  dashboardGenerate,
  dashboardRoutes
)
/**
 * The status origin: the status page at `/` and the public status endpoints. `publicStatsRoutes` is the same layer
 * value as the account origin's, so a listener serving both registers it once.
 */
export const statusRouter = Layer.mergeAll(pageRoutes, publicStatsRoutes)

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

/**
 * Catalog models to their deployments: health local, or shared by replicas through Redis when configured; the
 * `routing` settings follow the config file.
 */
const deploymentsLayer = (config: GatewayConfig, random: (() => number) | undefined) => {
  const router = Layer.unwrap(Effect.map(LiveRouting.make, (routing) => {
    const options = { routing, random }
    return config.redis_url === undefined
      ? Router.layer(options)
      : HealthRedis.layer(config.redis_url, config.redis_key_prefix, options)
  }))
  return Layer.provideMerge(router, upstreamsLayer)
}

/** In-memory actors persisted to SQL, or Redis when `redis_url` is set. */
const defaultAdmission: Layer.Layer<Admission, never, SqlClient.SqlClient | Live.Settings> = Layer.unwrap(
  Effect.map(Live.Settings, ({ config }) =>
    AdmissionLayer.layerFromConfigWithSql({
      abuse: config.abuse,
      redisUrl: config.redis_url,
      keyPrefix: config.redis_key_prefix
    }))
)

/** The services behind the image endpoint (issue 17). */
export type ImageServices = ImageQueue | ImageSlots | ImagePresets | ImageGallery

export interface AppOptions {
  /** Replaces the image services (tests: in-process fakes of the queue, slots, presets and gallery). */
  readonly images?: Layer.Layer<ImageServices, never, SqlClient.SqlClient | Live.Settings | LiveImages.LiveImages>
  /** Replaces the admission engine chosen from config (tests). */
  readonly admission?: Layer.Layer<Admission, never, SqlClient.SqlClient | Live.Settings>
  /** Where log lines go (default: stdout); tests keep them. */
  readonly logSink?: GatewayLogger.LineSink
  /** The BYOK address guard's resolver and TLS roots (tests: names that resolve where they say). */
  readonly byokGuard?: Byok.GuardExtras
  /** Replaces the worker side of the image queue (tests). */
  readonly imageWork?: Layer.Layer<ImageWork, never, SqlClient.SqlClient | Live.Settings>
  /** Sees every database connection (tests count the statements sent). */
  readonly sqlTap?: Sql.WireTap
  /** The deployment balancer's chance (tests: a seeded generator). */
  readonly deploymentRandom?: () => number
}

/** The worker side when a test replaces the queue with its own: no job ever comes to a remote worker. */
const noImageWork = Layer.succeed(ImageWork, ImageWork.of({
  heartbeat: () => Effect.void,
  take: (_worker, waitMs) => Effect.as(Effect.sleep(waitMs), null),
  progress: () => Effect.succeed({ cancelled: true }),
  complete: () => Effect.void,
  fail: () => Effect.void
}))

/**
 * Where background refreshes (status resources, leaderboard) agree on one replica's work per period: Redis when
 * configured, else each process on its own.
 */
const refreshStore = (config: GatewayConfig): Layer.Layer<Refresh.RefreshStore> =>
  config.redis_url === undefined ? Refresh.layerLocal : RefreshRedis.layer(config.redis_url, config.redis_key_prefix)

/** Everything except the HTTP listeners: config, storage, services. */
export const servicesLayer = (config: GatewayConfig, configPath: string, options: AppOptions = {}) => {
  // Metrics and (when OTEL_* configures an exporter) traces, under everything that records them.
  const observed = Layer.provideMerge(Telemetry.layer, Layer.merge(Live.layer(config, configPath), Tracing.layer()))
  const base = Layer.provideMerge(
    LiveImages.layer,
    Layer.mergeAll(
      observed,
      Sql.layerSql({ databaseUrl: config.database_url, dataDir: config.data_dir, tap: options.sqlTap }),
      refreshStore(config)
    )
  )
  const admission = options.admission ?? defaultAdmission
  const domain = Layer.mergeAll(
    Layer.provide(Auth.layer, Layer.provideMerge(AccountsRepo.layer, base)),
    AccountsRepo.layer,
    RequestLog.layer,
    ResponseStore.layer,
    FailedRequests.layer(config.limits.failed_requests_per_minute),
    deploymentsLayer(config, options.deploymentRandom),
    admission,
    options.byokGuard ? Byok.layerWith(options.byokGuard) : Byok.layer,
    CredentialsRepo.layer,
    Presets.layer,
    Gallery.layer,
    // Slots, queue and workers (memory, or Redis with redis_url; the simulated worker in embedded mode). Later in
    // the merge, so a test's image services replace the real ones.
    options.images ? Layer.merge(options.images, noImageWork) : Images.layer,
    Health.layer
  )
  // Credentials in use need the BYOK runtime, their rows and Auth's invalidation path; worker tokens need Auth too.
  // A test's worker side replaces the queue's (outer layers win). The status resources and the leaderboard refresh
  // in the background from storage, admission and the image queue (domain). Background fibers make no spans
  // (requests do, when tracing is on: http/Server.ts).
  const images = options.imageWork ? Layer.merge(WorkerTokens.layer, options.imageWork) : WorkerTokens.layer
  return Layer.provideMerge(
    Layer.mergeAll(Credentials.layer, images, Status.layer, Leaderboard.layer),
    Layer.provideMerge(domain, base)
  ).pipe(Layer.provide(Layer.succeed(References.TracerEnabled, false)))
}

/**
 * The whole gateway. Everything in it logs through the gateway logger (`telemetry/GatewayLogger.ts`: one escaped,
 * bounded line per call), provided underneath so that fibers started while building inherit it.
 */
export const appLayer = (config: GatewayConfig, configPath: string, options: AppOptions = {}) => {
  const services = servicesLayer(config, configPath, options)
  const server = Server.layer(
    {
      inference: inferenceRouter,
      account: accountRouter,
      status: statusRouter,
      operator: Layer.mergeAll(operatorRouter, deploymentRoutes)
    } satisfies Record<Origin, Layer.Layer<never, never, any>>,
    config,
    { everyListener: Health.routes }
  )
  return Layer.provideMerge(Layer.provideMerge(server, services), GatewayLogger.layer(options.logSink))
}

