/**
 * `RefreshStore` over Redis: one replica per period computes a shared resource. Keys, under the configured prefix:
 * `r:<name>:lock` (`SET NX PX`, holder = this process's random id) and `r:<name>:value` (the published JSON).
 * A Redis failure never blocks a refresh: the claim then answers true (compute locally) and a read null.
 */
import { Effect, Layer, type Redacted } from "effect"
import * as Crypto from "node:crypto"
import * as StoreRedis from "../store/Redis.js"
import { RefreshStore } from "./Refresh.js"

/** Key version: a replica of another version does not read this one's values. */
const VERSION = "v1"

export const make = (prefix: string) =>
  Effect.map(StoreRedis.RedisClient, ({ client }) => {
    const owner = Crypto.randomBytes(8).toString("hex")
    const key = (name: string, part: "lock" | "value") => `${prefix}r:${VERSION}:${name}:${part}`
    return RefreshStore.of({
      kind: "redis",
      claim: (name, ttlMs) =>
        StoreRedis.command("refresh claim", () => client.set(key(name, "lock"), owner, "PX", ttlMs, "NX")).pipe(
          Effect.map((reply) => reply === "OK"),
          Effect.catch(() => Effect.succeed(true))
        ),
      publish: (name, text, ttlMs) =>
        StoreRedis.command("refresh publish", () => client.set(key(name, "value"), text, "PX", ttlMs)).pipe(Effect.ignore),
      read: (name) =>
        StoreRedis.command("refresh read", () => client.get(key(name, "value"))).pipe(
          Effect.catch(() => Effect.succeed(null))
        )
    })
  })

/** Opens its own client on `url` for the layer's lifetime. */
export const layer = (url: string | Redacted.Redacted<string>, prefix: string): Layer.Layer<RefreshStore> =>
  Layer.effect(RefreshStore, make(prefix)).pipe(Layer.provide(StoreRedis.layer({ url })))
