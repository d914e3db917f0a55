/**
 * The `status` section of the gateway config (issue 18): how often the public status resources are refreshed,
 * the per-address limit of the public endpoints, and the rules that turn real traffic into a model's health.
 * Defaults are listed in the README ("Public status").
 */
import { Effect, Schema } from "effect"

const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))
const Share = Schema.Number.check(Schema.isGreaterThan(0), Schema.isLessThanOrEqualTo(1))
const withDefault = <S extends Schema.Top>(value: () => S["Type"]) => (schema: S) =>
  Schema.withDecodingDefaultType<S>(Effect.sync(value))(schema)

export const HealthRules = Schema.Struct({
  /** Requests of the last this many minutes decide `degraded`. */
  window_minutes: PositiveInt.pipe(withDefault(() => 15)),
  /** Fewer counted requests than this (in the window, or among the recent ones) decide nothing: `ok`. */
  min_requests: PositiveInt.pipe(withDefault(() => 3)),
  /** `degraded` when at least this share of the window's counted requests failed. */
  degraded_error_rate: Share.pipe(withDefault(() => 0.1)),
  /** `down` looks at this many most recent counted requests (within the window)... */
  down_recent: PositiveInt.pipe(withDefault(() => 10)),
  /** ...and is `down` when more than this share of them failed. */
  down_error_rate: Share.pipe(withDefault(() => 0.5)),
  /** `idle` when a model had no request at all for this many hours. */
  idle_hours: PositiveInt.pipe(withDefault(() => 24))
})
export type HealthRules = typeof HealthRules.Type

export const StatusConfig = Schema.Struct({
  /** Every public status resource is re-aggregated this often; also its `Cache-Control: max-age`. */
  refresh_seconds: PositiveInt.pipe(withDefault(() => 5)),
  /** The all-time totals of `/api/stats/server` (a scan of the whole request log) are re-aggregated this often. */
  all_time_refresh_seconds: PositiveInt.pipe(withDefault(() => 300)),
  /** Requests per minute per client address, all public status endpoints together (spec: 60). */
  per_minute: PositiveInt.pipe(withDefault(() => 60)),
  /** `users` of `/api/stats/server`: accounts with a request in the last this many hours. */
  active_users_hours: PositiveInt.pipe(withDefault(() => 24)),
  health: HealthRules.pipe(withDefault(() => Schema.decodeSync(HealthRules)({})))
})
export type StatusConfig = typeof StatusConfig.Type
