/**
 * Chooses the admission backend from configuration (ARCHITECTURE §2): Redis when a URL is given (production:
 * shared by all replicas), otherwise in-process actors (embedded mode). With a SqlClient, the memory backend
 * persists write-behind to PostgreSQL and the Redis backend snapshots to / rebuilds from it.
 *
 * The Redis client is the `store/Redis.ts` service, opened here from the URL for the admission layer's lifetime.
 */
import { Effect, Layer, type Redacted } from "effect"
import { SqlClient } from "effect/sql"
import * as StoreRedis from "../store/Redis.js"
import type { Admission } from "./Admission.js"
import { layerMemory } from "./AdmissionMemory.js"
import { layerRedisFromStore } from "./AdmissionRedis.js"
import type { AbuseSettings } from "./Policy.js"

export interface AdmissionConfig {
  readonly abuse: AbuseSettings
  /** Redis URL; when absent the in-process backend is used. */
  readonly redisUrl?: string | Redacted.Redacted<string> | undefined
  /** Key prefix in Redis (default `ws:q:`). */
  readonly keyPrefix?: string | undefined
  /** PostgreSQL persistence (memory: write-behind; Redis: snapshot + rebuild). */
  readonly sql?: SqlClient.SqlClient | undefined
}

export const layerFromConfig = (config: AdmissionConfig): Layer.Layer<Admission> =>
  config.redisUrl === undefined
    ? layerMemory({ abuse: config.abuse, sql: config.sql })
    : layerRedisFromStore({ abuse: config.abuse, keyPrefix: config.keyPrefix, sql: config.sql }).pipe(
      Layer.provide(StoreRedis.layer({ url: config.redisUrl }))
    )

/** Same, with persistence through the context's SqlClient. */
export const layerFromConfigWithSql = (
  config: Omit<AdmissionConfig, "sql">
): Layer.Layer<Admission, never, SqlClient.SqlClient> =>
  Layer.unwrap(Effect.map(SqlClient.SqlClient, (sql) => layerFromConfig({ ...config, sql })))
