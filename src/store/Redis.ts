/**
 * The Redis client (ARCHITECTURE §3 `store/`): one ioredis connection per layer, configured to fail fast.
 *
 * - Every command is bounded (`commandTimeoutMs`, default 500 ms); the offline queue is disabled, so while Redis is
 *   unreachable a command fails at once (callers fail closed with 503) and ioredis keeps reconnecting in the
 *   background.
 * - Building the layer waits up to `connectWaitMs` (2 s) for the first connection; if Redis is down the layer is
 *   still built and commands fail until it comes back.
 * - Connection errors are logged at most once per 10 s.
 * - Closing the layer sends QUIT (bounded by 1 s), then disconnects.
 *
 * The connect wait and the QUIT bound are real time (timers), not the Effect clock: they bound I/O against a real
 * server, also under `TestClock`, which would never fire them.
 */
import { Context, Data, Effect, Layer, Redacted } from "effect"
import { Redis, type RedisOptions } from "ioredis"
import { coalesceWrites } from "./TurnWrites.js"

export interface RedisClientOptions {
  /** `redis://host:port/db`. Default `redis://127.0.0.1:6379`. */
  readonly url?: string | Redacted.Redacted<string> | undefined
  /** Per-command timeout. Default 500 ms. */
  readonly commandTimeoutMs?: number | undefined
  /** How long building the layer waits for the first connection. Default 2 s. */
  readonly connectWaitMs?: number | undefined
}

export class RedisClient extends Context.Service<RedisClient, {
  readonly client: Redis
}>()("wellspring/store/RedisClient") {}

/** Lua prelude of every script here: \`now\` from ARGV[1] (epoch ms), or Redis \`TIME\` when it is empty. */
export const LUA_NOW = `
local now
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`

/**
 * ioredis options for fail-fast behaviour: bounded commands, no offline queue, background reconnects. Each command
 * is written when it is sent, not gathered into a pipeline per tick: ioredis's automatic pipelining costs more CPU
 * per command than the writes it saves at gateway loads (docs/decisions.md, "Redis on the hot path").
 */
export const clientOptions = (commandTimeoutMs: number): RedisOptions => ({
  lazyConnect: true,
  enableOfflineQueue: false,
  autoResendUnfulfilledCommands: false,
  maxRetriesPerRequest: 0,
  commandTimeout: commandTimeoutMs,
  connectTimeout: 2_000,
  enableAutoPipelining: false,
  retryStrategy: (times) => Math.min(times * 100, 2_000)
})

/** Settles when `promise` does or after `ms` of real time, whichever is first; never rejects. */
export const within = (promise: Promise<unknown>, ms: number): Promise<void> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  return Promise.race([
    promise.then(() => undefined, () => undefined),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, ms)
    })
  ]).finally(() => clearTimeout(timer))
}

const urlOf = (url: RedisClientOptions["url"]): string =>
  url === undefined ? "redis://127.0.0.1:6379" : Redacted.isRedacted(url) ? Redacted.value(url) : url

/** Opens the client in the current scope (closed with it). */
export const make = (options: RedisClientOptions = {}) =>
  Effect.gen(function*() {
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    const clock = yield* Effect.clockWith(Effect.succeed)
    const client = yield* Effect.acquireRelease(
      Effect.sync(() => {
        const redis = new Redis(urlOf(options.url), clientOptions(options.commandTimeoutMs ?? 500))
        // Commands of one turn leave in one write; each connection (the first and every reconnect) gets a new socket.
        redis.on("connect", () => coalesceWrites(redis.stream))
        let lastLog = Number.NEGATIVE_INFINITY
        redis.on("error", (error: Error) => {
          const now = clock.currentTimeMillisUnsafe()
          if (now - lastLog < 10_000) return
          lastLog = now
          runFork(Effect.logWarning("redis connection error", error.message))
        })
        return redis
      }),
      (redis) =>
        Effect.promise(() => within(redis.quit(), 1_000)).pipe(
          Effect.ensuring(Effect.sync(() => redis.disconnect()))
        )
    )
    yield* Effect.promise(() => within(client.connect(), options.connectWaitMs ?? 2_000))
    return RedisClient.of({ client })
  })

export const layer = (options: RedisClientOptions = {}): Layer.Layer<RedisClient> =>
  Layer.effect(RedisClient, make(options))

/** A client the caller owns (not closed by the layer). */
export const layerFromClient = (client: Redis): Layer.Layer<RedisClient> =>
  Layer.succeed(RedisClient, RedisClient.of({ client }))

/**
 * A Redis command that did not answer: a timeout, the connection down, a script error. What the client sees is
 * the caller's decision (quota and images answer 503 `service_unavailable`); `detail` is for logs and rows.
 */
export class RedisError extends Data.TaggedError("RedisError")<{
  /** `redis <what>: <message>`. */
  readonly detail: string
}> {}

/** Runs one command: a rejection becomes a `RedisError` naming the command. */
export const command = <A>(what: string, f: () => Promise<A>): Effect.Effect<A, RedisError> =>
  Effect.tryPromise({
    try: f,
    catch: (cause) => new RedisError({ detail: `redis ${what}: ${cause instanceof Error ? cause.message : String(cause)}` })
  })
