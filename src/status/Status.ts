/**
 * The public status resources (issue 18), each a background-refreshed snapshot (`runtime/Refresh.ts`): computed
 * from aggregated SQL (and the admission engine's live daily totals) every `status.refresh_seconds`, on one
 * replica per period when Redis is configured. A request only reads memory: the snapshots, the live catalog and
 * the clock (`views` below).
 *
 * Image workers: when an `ImageQueue` service (`images/Contracts.ts`) is in the context this layer is built in,
 * the fleet resource gains `images: {workers_online, queue_depth}`; without it the field is absent.
 */
import { Clock, Context, Effect, Layer, Option, type Scope } from "effect"
import { SqlClient } from "effect/sql"
import type { ModelConfig } from "../config/GatewayConfig.js"
import { parseLimit } from "../accounts/Metrics.js"
import { type CatalogView, LiveCatalog, Settings } from "../config/Live.js"
import { ImageQueue } from "../images/Contracts.js"
import { Admission } from "../quota/Admission.js"
import { DAY_MS } from "../quota/Policy.js"
import * as Refresh from "../runtime/Refresh.js"
import { allTimeRow, fleetRows, requestsSince, serverRow, SPARK_BUCKET_MS } from "../telemetry/RequestQueries.js"
import type { StatusConfig } from "../config/Status.js"
import { fleetHealth, type ModelHealth, type ModelStatus } from "./Health.js"
import { type Incident, INCIDENTS_DEFAULT, INCIDENTS_MAX, recentIncidents } from "./Incidents.js"

export interface ImageFleet {
  /** Image workers with a fresh heartbeat. */
  readonly workers_online: number
  /** Image jobs waiting for a worker. */
  readonly queue_depth: number
}

export interface FleetSnapshot {
  readonly models: Readonly<Record<string, ModelHealth>>
  readonly images?: ImageFleet
}

export interface QuotaSnapshot {
  /** Raw tokens used today per capped model (the admission engine's live totals). */
  readonly used: Readonly<Record<string, number>>
  /** Successful pool requests since the last 09:00 KST. */
  readonly requests: number
}

export interface ServerSnapshot {
  readonly users: number
  readonly tps: number
}

export interface AllTime {
  readonly requests: number
  readonly tokens: number
  readonly input: number
  readonly output: number
}

export interface IncidentsSnapshot {
  /** The newest `INCIDENTS_MAX`, newest first. */
  readonly incidents: ReadonlyArray<Incident>
  readonly active: number
}

export class StatusCache extends Context.Service<StatusCache, {
  readonly fleet: Refresh.Refresher<FleetSnapshot>
  readonly quota: Refresh.Refresher<QuotaSnapshot>
  readonly server: Refresh.Refresher<ServerSnapshot>
  readonly allTime: Refresh.Refresher<AllTime>
  readonly incidents: Refresh.Refresher<IncidentsSnapshot>
}>()("wellspring/status/StatusCache") {}

/** The next quota reset (09:00 KST = 00:00 UTC) after `now`. */
export const nextReset = (now: number): number => (Math.floor(now / DAY_MS) + 1) * DAY_MS

/** Enabled models with a daily cap: the rows of the quota block. */
const cappedModels = (view: CatalogView): ReadonlyArray<ModelConfig & { readonly daily_cap: number }> =>
  view.listed.filter((m): m is ModelConfig & { daily_cap: number } => m.daily_cap !== null)

const round2 = (x: number) => Math.round(x * 100) / 100

export const make = (config: StatusConfig): Effect.Effect<
  Context.Service.Shape<typeof StatusCache>,
  never,
  Scope.Scope | Refresh.RefreshStore | SqlClient.SqlClient | LiveCatalog | Admission
> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const catalog = yield* LiveCatalog
    const admission = yield* Admission
    const images = yield* Effect.serviceOption(ImageQueue)
    const every = config.refresh_seconds * 1000
    const rules = config.health

    const fleet = yield* Refresh.make<FleetSnapshot>({
      name: "status-fleet",
      every,
      shared: Refresh.jsonCodec(),
      load: Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const models = catalog.current().listed.map((m) => m.id)
        const rows = yield* fleetRows(sql, {
          models,
          now,
          windowMs: rules.window_minutes * 60_000,
          recent: rules.down_recent,
          idleMs: rules.idle_hours * 3_600_000
        })
        const health = fleetHealth(rows, models, rules)
        if (Option.isNone(images)) return { models: health }
        const [workers_online, queue_depth] = yield* Effect.all([images.value.workersOnline, images.value.waiting])
        return { models: health, images: { workers_online, queue_depth } }
      })
    })

    const quota = yield* Refresh.make<QuotaSnapshot>({
      name: "status-quota",
      every,
      shared: Refresh.jsonCodec(),
      load: Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const view = catalog.current()
        const used: Record<string, number> = {}
        for (const model of cappedModels(view)) used[model.id] = yield* Effect.orDie(admission.dailyUsage(model.id))
        const requests = yield* requestsSince(sql, view.catalog.models.map((m) => m.id), new Date(Math.floor(now / DAY_MS) * DAY_MS))
        return { used, requests }
      })
    })

    const server = yield* Refresh.make<ServerSnapshot>({
      name: "status-server",
      every,
      shared: Refresh.jsonCodec(),
      load: Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const row = yield* serverRow(sql, new Date(now - config.active_users_hours * 3_600_000), new Date(now))
        return { users: row.users, tps: round2(Number(row.output_tokens) / (SPARK_BUCKET_MS / 1000)) }
      })
    })

    const allTime = yield* Refresh.make<AllTime>({
      name: "status-all-time",
      every: config.all_time_refresh_seconds * 1000,
      shared: Refresh.jsonCodec(),
      load: Effect.map(allTimeRow(sql), (row) => ({
        requests: Number(row.requests),
        tokens: Number(row.input) + Number(row.output),
        input: Number(row.input),
        output: Number(row.output)
      }))
    })

    const incidents = yield* Refresh.make<IncidentsSnapshot>({
      name: "status-incidents",
      every,
      shared: Refresh.jsonCodec(),
      load: recentIncidents(sql, INCIDENTS_MAX)
    })

    return StatusCache.of({ fleet, quota, server, allTime, incidents })
  })

export const layer: Layer.Layer<
  StatusCache,
  never,
  Refresh.RefreshStore | SqlClient.SqlClient | LiveCatalog | Admission | Settings
> = Layer.effect(StatusCache, Effect.flatMap(Settings, (settings) => make(settings.config.status)))

// ---------------------------------------------------------------------------------------------------------
// The response bodies, from memory only

const iso = (ms: number) => new Date(ms).toISOString()

export interface FleetModel {
  readonly id: string
  readonly display_name: string
  readonly status: ModelStatus
  readonly sparkline: ReadonlyArray<number>
  readonly tps: number | null
  readonly ttfb_ms: number | null
  readonly max_input_tokens: number
}

const EMPTY_SPARK: ReadonlyArray<number> = [0, 0, 0, 0, 0, 0, 0]

/**
 * `GET /api/stats/fleet`: the enabled models of the live catalog (in catalog order), each with its health from
 * the last refresh (a model enabled since then is `idle` until the next), and the disabled ones.
 */
export const fleetBody = (view: CatalogView, snapshot: Refresh.Snapshot<FleetSnapshot>) => ({
  models: view.listed.map((m): FleetModel => {
    const health = snapshot.value.models[m.id]
    return {
      id: m.id,
      display_name: m.display_name ?? m.id,
      status: health?.status ?? "idle",
      sparkline: health?.sparkline ?? EMPTY_SPARK,
      tps: health?.tps ?? null,
      ttfb_ms: health?.ttfb_ms ?? null,
      max_input_tokens: m.max_input_tokens
    }
  }),
  disabled: view.catalog.models.filter((m) => m.disabled).map((m) => ({
    id: m.id,
    displayName: m.display_name ?? m.id,
    note: m.disabled_note ?? null
  })),
  ...(snapshot.value.images !== undefined ? { images: snapshot.value.images } : {}),
  updated_at: iso(snapshot.at)
})

/**
 * The quota block of `GET /api/quota` and `/api/stats/server`: every enabled model with a daily cap, its limit
 * from the live catalog and its use from the last refresh; `global` is their display sum, not a ceiling.
 */
export const quotaBody = (view: CatalogView, snapshot: Refresh.Snapshot<QuotaSnapshot>, now: number) => {
  const models: Record<string, { used: number; limit: number; remaining: number }> = {}
  let used = 0
  let limit = 0
  for (const m of cappedModels(view)) {
    const u = snapshot.value.used[m.id] ?? 0
    models[m.id] = { used: u, limit: m.daily_cap, remaining: Math.max(0, m.daily_cap - u) }
    used += u
    limit += m.daily_cap
  }
  return {
    global: { used, limit, remaining: Math.max(0, limit - used), reset_at: iso(nextReset(now)) },
    requests: snapshot.value.requests,
    models,
    updated_at: iso(snapshot.at)
  }
}

/** `GET /api/stats/server`. */
export const serverBody = (
  view: CatalogView,
  snapshots: {
    readonly quota: Refresh.Snapshot<QuotaSnapshot>
    readonly server: Refresh.Snapshot<ServerSnapshot>
    readonly allTime: Refresh.Snapshot<AllTime>
  },
  now: number
) => ({
  quota: quotaBody(view, snapshots.quota, now),
  users: snapshots.server.value.users,
  tps: snapshots.server.value.tps,
  allTime: snapshots.allTime.value,
  updated_at: iso(snapshots.server.at),
  all_time_updated_at: iso(snapshots.allTime.at)
})

/** `limit` of `GET /api/incidents`: the rule of the requests `limit` (accounts/Metrics.ts), default 10, cap 50. */
export const parseIncidentsLimit = (raw: string | null): number => parseLimit(raw, INCIDENTS_DEFAULT, INCIDENTS_MAX)

/** `GET /api/incidents?limit=`. */
export const incidentsBody = (snapshot: Refresh.Snapshot<IncidentsSnapshot>, limit: number) => ({
  incidents: snapshot.value.incidents.slice(0, limit),
  active: snapshot.value.active,
  limit,
  updated_at: iso(snapshot.at)
})
