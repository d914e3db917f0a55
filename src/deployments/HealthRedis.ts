/**
 * The router of a replica in production mode (Redis configured):
 *
 * - Deployment health shared by replicas through Redis pub/sub: every change one replica makes (a circuit opened or
 *   closed, a `Retry-After` cooling) is published on `<prefix>deployments:health`, and every replica applies the
 *   others' to its own book. Nothing is read from Redis for health on a request's path. A message is a change, not
 *   the state: a replica that starts later learns of ejections from the failures it sees itself.
 * - Per-deployment `concurrency` and `rate_limit_rpm` counted for the fleet (`CapsRedis.ts`): one script call per
 *   attempt on a deployment that has a cap; none for a deployment without one.
 */
import { Effect, Layer, type Redacted } from "effect"
import * as Crypto from "node:crypto"
import * as StoreRedis from "../store/Redis.js"
import type { HealthEvent } from "./Health.js"
import * as CapsRedis from "./CapsRedis.js"
import { Deployments, makeRouter, type RouterOptions } from "./Router.js"
import type { Upstreams } from "../upstream/Upstream.js"

/** Longest message accepted from the channel (a change is well under 1 KB). */
const MAX_MESSAGE = 2_048
const MAX_KEY = 256
/** Longest duration a message may carry (a day). */
const MAX_FOR_MS = 86_400_000

const validDuration = (n: unknown): n is number => typeof n === "number" && Number.isFinite(n) && n >= 0 && n <= MAX_FOR_MS

/** A change published by another replica, or null when the message is not one (or is this replica's own). */
export const parseMessage = (message: string, self: string): HealthEvent | null => {
  if (message.length > MAX_MESSAGE) return null
  let raw: unknown
  try {
    raw = JSON.parse(message)
  } catch {
    return null
  }
  const m = raw as Record<string, unknown> | null
  if (m === null || typeof m !== "object" || m.origin === self) return null
  const key = m.key
  if (typeof key !== "string" || key.length === 0 || key.length > MAX_KEY) return null
  switch (m._tag) {
    case "Opened":
      return validDuration(m.forMs) && typeof m.openings === "number" && Number.isInteger(m.openings) &&
          m.openings >= 0 && m.openings <= 64
        ? { _tag: "Opened", key, forMs: m.forMs, openings: m.openings }
        : null
    case "Closed":
      return { _tag: "Closed", key }
    case "Cooling":
      return validDuration(m.forMs) ? { _tag: "Cooling", key, forMs: m.forMs } : null
    default:
      return null
  }
}

/** The router's options in production mode; the shared caps are built here. */
export interface RedisRouterOptions extends Omit<RouterOptions, "share" | "caps"> {
  /** Options of the shared caps (tests: `time: "clock"`). */
  readonly caps?: CapsRedis.CapsRedisOptions | undefined
}

export const make = (prefix: string, options: RedisRouterOptions) =>
  Effect.gen(function*() {
    const { client } = yield* StoreRedis.RedisClient
    const self = Crypto.randomBytes(8).toString("hex")
    const channel = `${prefix}deployments:health`
    const share = (event: HealthEvent): void => {
      client.publish(channel, JSON.stringify({ ...event, origin: self })).catch(() => {})
    }
    const caps = yield* CapsRedis.make(client, prefix, options.caps)
    const router = yield* makeRouter({ ...options, share, caps })
    const subscriber = yield* Effect.acquireRelease(
      // A subscriber waits for its connection (and resubscribes after a reconnect) rather than failing fast.
      Effect.sync(() => client.duplicate({ enableOfflineQueue: true, lazyConnect: false, commandTimeout: 2_000 })),
      (connection) => Effect.promise(() => connection.quit().then(() => undefined, () => connection.disconnect()))
    )
    subscriber.on("error", () => {})
    subscriber.on("message", (from: string, message: string) => {
      if (from !== channel) return
      const event = parseMessage(message, self)
      if (event !== null) router.apply(event)
    })
    yield* Effect.promise(() => StoreRedis.within(subscriber.subscribe(channel), 2_000))
    return router
  })

/** The router with health and caps shared through Redis at `url` (its own connections, closed with the layer). */
export const layer = (
  url: string | Redacted.Redacted<string>,
  prefix: string,
  options: RedisRouterOptions
): Layer.Layer<Deployments, never, Upstreams> =>
  Layer.effect(Deployments, make(prefix, options)).pipe(Layer.provide(StoreRedis.layer({ url })))
