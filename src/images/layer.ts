/**
 * Pending slots, the queue and its worker side, chosen by configuration (ARCHITECTURE §2): in-process actors and
 * state in embedded mode; Redis (shared by every replica) when `redis_url` is set, on a connection of its own under
 * `<redis_key_prefix>img:`. The simulated worker runs in the layer's scope whenever
 * `images.simulated.enabled` says so (absent: in embedded mode), read live.
 */
import { Context, Effect, Layer, type Redacted } from "effect"
import * as Live from "../config/Live.js"
import * as StoreRedis from "../store/Redis.js"
import type { ImagesConfig } from "../config/Images.js"
import { ImageQueue, ImageSlots, ImageWork } from "./Contracts.js"
import { LiveImages } from "./LiveConfig.js"
import * as Queue from "./Queue.js"
import * as QueueRedis from "./QueueRedis.js"
import * as Simulated from "./Simulated.js"
import * as Slots from "./Slots.js"
import * as SlotsRedis from "./SlotsRedis.js"

export interface ImagesLayerOptions {
  /** The live `images` config, read at every decision. */
  readonly config: () => ImagesConfig
  /** Embedded mode: the simulated worker is on unless the config says otherwise. */
  readonly embedded: boolean
  /** Redis URL; absent: in-process state. */
  readonly redisUrl?: string | Redacted.Redacted<string> | undefined
  /** Key prefix in Redis (default `ws:q:`); the image keys live under `<prefix>img:`. */
  readonly keyPrefix?: string | undefined
}

export const layerWith = (options: ImagesLayerOptions): Layer.Layer<ImageSlots | ImageQueue | ImageWork> =>
  Layer.effectContext(Effect.gen(function*() {
    const { config } = options
    let slots: Context.Service.Shape<typeof ImageSlots>
    let queues: Queue.ImageQueues
    if (options.redisUrl === undefined) {
      slots = yield* Slots.makeMemory({ config })
      queues = yield* Queue.makeMemory({ config })
    } else {
      const { client } = yield* StoreRedis.make({ url: options.redisUrl })
      const keyPrefix = `${options.keyPrefix ?? "ws:q:"}img:`
      slots = (yield* SlotsRedis.makeRedis(client, { config, keyPrefix })).slots
      queues = yield* QueueRedis.makeRedis(client, { config, keyPrefix })
    }
    yield* Simulated.start({
      work: queues.work,
      config,
      enabled: () => Simulated.enabledFor(config(), options.embedded)
    })
    return Context.make(ImageSlots, slots).pipe(
      Context.add(ImageQueue, queues.queue),
      Context.add(ImageWork, queues.work)
    )
  }))

/** From the gateway's settings: the live `images` section, `redis_url`, `redis_key_prefix`, embedded or not. */
export const layer: Layer.Layer<ImageSlots | ImageQueue | ImageWork, never, Live.Settings | LiveImages> = Layer.unwrap(
  Effect.map(Effect.all([Live.Settings, LiveImages]), ([settings, images]) =>
    layerWith({
      config: images.current,
      embedded: settings.embedded,
      redisUrl: settings.config.redis_url,
      keyPrefix: settings.config.redis_key_prefix
    }))
)
