/**
 * The image queue in Redis (production, several replicas): the same `ImageQueue` and `ImageWork` as `Queue.ts`, with
 * the state in Redis so that a job submitted on one replica can be taken by a worker polling another, and its
 * result reaches the request waiting on the first.
 *
 * Keys under the prefix: `job:<id>` (hash: account, spec, state q/h/c/d/f, worker, losses, owner lease, result),
 * `line:<account>` (list of job ids), `ring` (list of accounts with jobs waiting, in round-robin order), `nwait`
 * (jobs waiting), `workers` (sorted set: worker id by last seen), `held` (hash: job id -> worker). Every change is
 * one Lua script, so the queue is consistent whatever the replicas interleave.
 *
 * - Take: pops the ring's first account, takes the first job of its line and puts the account back at the end of
 *   the ring if it has more (round-robin, as in memory).
 * - Results: the worker's PNG is stored in the job's hash (kept 60 s) and announced on the channel `done`; the
 *   waiting replica reads and deletes it. New jobs are announced on `new`, which wakes a waiting take.
 * - Each replica ticks every second (Effect clock): it renews the owner lease of the jobs its requests wait for
 *   (`ownerLeaseMs`, 9 s: a dead replica's jobs are dropped by the next take, or cancelled on their worker), picks up
 *   results whose announcement it missed, and sweeps silent workers' jobs (requeued once at the front of their line,
 *   then failed). A take waiting for a job polls at least every second, so a lost announcement delays it by at most
 *   that, and each poll counts as the worker's heartbeat.
 * - Interruption: a queued job is withdrawn (removed from its line), a held one marked cancelled (`c`), and the
 *   worker's next progress answers cancelled.
 *
 * Single Redis primary only (the scripts build keys from the prefix). Time is Redis `TIME`, or the Effect clock with
 * `time: "clock"` (tests).
 */
import { Clock, Deferred, Effect, Exit, type Scope } from "effect"
import type { Redis } from "ioredis"
import { type GatewayError, unavailable } from "../errors/Catalog.js"
import * as StoreRedis from "../store/Redis.js"
import { CurrentTelemetry } from "../telemetry/Telemetry.js"
import type { ImagesConfig } from "../config/Images.js"
import { type ImageJob, ImageQueue, ImageWork, type JobOutcome, type JobSpec, type WorkerInfo } from "./Contracts.js"
import {
  congested,
  duplicateJob,
  type ImageQueues,
  LOST_TWICE,
  MAX_REASON,
  MAX_TAKE_WAIT_MS,
  noWorker,
  SWEEP_MS
} from "./Queue.js"
import { makeTakers } from "./Takers.js"

/** One Redis command; no answer is 503 `service_unavailable`. */
const command = <A>(what: string, f: () => Promise<A>) => Effect.mapError(StoreRedis.command(what, f), unavailable)

/** What a request learns when its job's record vanished from Redis. */
export const JOB_LOST = "the job's record was lost"
/** How long a finished job's result waits in Redis for its request. */
const RESULT_TTL_MS = 60_000
/** Garbage backstop of a job's hash (renewed while its request waits). */
const JOB_TTL_MS = 15 * 60_000

const HEAD = `${StoreRedis.LUA_NOW}
local P = ARGV[2]
`

/** ARGV: 3 hb ms, 4 threshold, 5 id, 6 account, 7 spec, 8 owner lease ms, 9 job ttl ms. 0 queued, 1 no worker,
 *  2 congested, 3 duplicate. */
const SUBMIT = `${HEAD}
local hb, threshold, id, acct = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6]
if redis.call('ZCOUNT', P .. 'workers', string.format('(%d', now - hb), '+inf') == 0 then return 1 end
if tonumber(redis.call('GET', P .. 'nwait') or '0') >= threshold then return 2 end
local jk = P .. 'job:' .. id
if redis.call('EXISTS', jk) == 1 then return 3 end
redis.call('HSET', jk, 'a', acct, 's', ARGV[7], 'st', 'q', 'w', '', 'l', 0, 'e', now + tonumber(ARGV[8]))
redis.call('PEXPIRE', jk, tonumber(ARGV[9]))
if redis.call('RPUSH', P .. 'line:' .. acct, id) == 1 then redis.call('RPUSH', P .. 'ring', acct) end
redis.call('INCR', P .. 'nwait')
redis.call('PUBLISH', P .. 'new', id)
return 0
`

/**
 * ARGV: 3 worker, 4 how long the take will wait if nothing comes (ms). The next job in round-robin order, now held
 * by the worker: {id, account, spec}; or nil, and the worker counts as seen until its wait ends.
 */
const TAKE = `${HEAD}
local w = ARGV[3]
redis.call('ZADD', P .. 'workers', now, w)
for i = 1, 64 do
  local acct = redis.call('LPOP', P .. 'ring')
  if not acct then
    redis.call('ZADD', P .. 'workers', 'GT', now + tonumber(ARGV[4]), w)
    return false
  end
  local lk = P .. 'line:' .. acct
  local id = redis.call('LPOP', lk)
  if redis.call('LLEN', lk) > 0 then redis.call('RPUSH', P .. 'ring', acct) end
  if id then
    redis.call('DECR', P .. 'nwait')
    local jk = P .. 'job:' .. id
    local f = redis.call('HMGET', jk, 'st', 'e', 's')
    if f[1] == 'q' and tonumber(f[2]) > now then
      redis.call('HSET', jk, 'st', 'h', 'w', w)
      redis.call('HSET', P .. 'held', id, w)
      return {id, acct, f[3]}
    end
    -- its request's replica stopped renewing it: nobody waits for it
    redis.call('DEL', jk)
  end
end
return false
`

/** ARGV: 3 id. 1 withdrawn, 2 cancelled on its worker, 0 nothing to do. */
const CANCEL = `${HEAD}
local id = ARGV[3]
local jk = P .. 'job:' .. id
local f = redis.call('HMGET', jk, 'st', 'a')
if f[1] == 'q' then
  local lk = P .. 'line:' .. f[2]
  if redis.call('LREM', lk, 1, id) > 0 then
    redis.call('DECR', P .. 'nwait')
    if redis.call('LLEN', lk) == 0 then redis.call('LREM', P .. 'ring', 0, f[2]) end
  end
  redis.call('DEL', jk)
  return 1
elseif f[1] == 'h' then
  redis.call('HSET', jk, 'st', 'c')
  return 2
end
redis.call('DEL', jk)
return 0
`

/** ARGV: 3 owner lease ms, 4 job ttl ms, 5.. ids. Renews the waiting ones; returns the others (finished or gone). */
const TOUCH = `${HEAD}
local lease, ttl, out = tonumber(ARGV[3]), tonumber(ARGV[4]), {}
for i = 5, #ARGV do
  local jk = P .. 'job:' .. ARGV[i]
  local st = redis.call('HGET', jk, 'st')
  if st == 'q' or st == 'h' then
    redis.call('HSET', jk, 'e', now + lease)
    redis.call('PEXPIRE', jk, ttl)
  else
    out[#out + 1] = ARGV[i]
  end
end
return out
`

/** ARGV: 3 worker, 4 id. 1 cancelled (or not this worker's), 0 go on. */
const PROGRESS = `${HEAD}
local w = ARGV[3]
redis.call('ZADD', P .. 'workers', now, w)
local f = redis.call('HMGET', P .. 'job:' .. ARGV[4], 'st', 'w', 'e')
if f[2] == w and f[1] == 'h' and tonumber(f[3]) > now then return 0 end
return 1
`

/** ARGV: 3 worker, 4 id, 5 result ttl ms, 6 'd' or 'f', 7 png or reason. 1 recorded, 0 ignored. */
const REPORT = `${HEAD}
local w, id = ARGV[3], ARGV[4]
redis.call('ZADD', P .. 'workers', now, w)
local jk = P .. 'job:' .. id
local f = redis.call('HMGET', jk, 'st', 'w')
if f[2] ~= w then return 0 end
if f[1] == 'h' then
  redis.call('HDEL', P .. 'held', id)
  if ARGV[6] == 'd' then redis.call('HSET', jk, 'st', 'd', 'png', ARGV[7])
  else redis.call('HSET', jk, 'st', 'f', 'r', ARGV[7]) end
  redis.call('PEXPIRE', jk, tonumber(ARGV[5]))
  redis.call('PUBLISH', P .. 'done', id)
  return 1
elseif f[1] == 'c' then
  redis.call('HDEL', P .. 'held', id)
  redis.call('DEL', jk)
end
return 0
`

/** ARGV: 3 id. {state, worker, reason, png} of a finished job (then deleted); {state} otherwise; nil when gone. */
const RESULT = `${HEAD}
local jk = P .. 'job:' .. ARGV[3]
local f = redis.call('HMGET', jk, 'st', 'w', 'r', 'png')
if not f[1] then return false end
if f[1] == 'd' or f[1] == 'f' then
  redis.call('DEL', jk)
  return {f[1], f[2] or '', f[3] or '', f[4] or ''}
end
return {f[1]}
`

/** ARGV: 3 hb ms, 4 result ttl ms, 5 reason. Requeues (once) or fails the jobs of silent workers. */
const SWEEP = `${HEAD}
local hb = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', P .. 'workers', '-inf', string.format('%d', now - 4 * hb))
local held = redis.call('HGETALL', P .. 'held')
local changed = 0
for i = 1, #held, 2 do
  local id, w = held[i], held[i + 1]
  local seen = tonumber(redis.call('ZSCORE', P .. 'workers', w) or '0')
  local jk = P .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'st', 'w', 'l', 'a')
  if f[2] ~= w or (f[1] ~= 'h' and f[1] ~= 'c') then
    redis.call('HDEL', P .. 'held', id)
  elseif now - seen >= hb then
    redis.call('HDEL', P .. 'held', id)
    changed = changed + 1
    if f[1] == 'c' then
      redis.call('DEL', jk)
    elseif tonumber(f[3]) + 1 >= 2 then
      redis.call('HSET', jk, 'st', 'f', 'w', '', 'l', tonumber(f[3]) + 1, 'r', ARGV[5])
      redis.call('PEXPIRE', jk, tonumber(ARGV[4]))
      redis.call('PUBLISH', P .. 'done', id)
    else
      redis.call('HSET', jk, 'st', 'q', 'w', '', 'l', tonumber(f[3]) + 1)
      local lk = P .. 'line:' .. f[4]
      redis.call('LPUSH', lk, id)
      if redis.call('LLEN', lk) == 1 then redis.call('RPUSH', P .. 'ring', f[4]) end
      redis.call('INCR', P .. 'nwait')
      redis.call('PUBLISH', P .. 'new', id)
    end
  end
end
return changed
`

/** ARGV: 3 worker. */
const HEARTBEAT = `${HEAD}
redis.call('ZADD', P .. 'workers', now, ARGV[3])
return 0
`

/** ARGV: 3 hb ms. Workers seen within the heartbeat time. */
const ONLINE = `${HEAD}
return redis.call('ZCOUNT', P .. 'workers', string.format('(%d', now - tonumber(ARGV[3])), '+inf')
`

type Arg = string | number | Buffer
interface Commands {
  wsImgSubmit(...args: Array<Arg>): Promise<number>
  wsImgTake(...args: Array<Arg>): Promise<[string, string, string] | null>
  wsImgCancel(...args: Array<Arg>): Promise<number>
  wsImgTouch(...args: Array<Arg>): Promise<Array<string>>
  wsImgProgress(...args: Array<Arg>): Promise<number>
  wsImgReport(...args: Array<Arg>): Promise<number>
  wsImgResultBuffer(...args: Array<Arg>): Promise<Array<Buffer> | null>
  wsImgSweep(...args: Array<Arg>): Promise<number>
  wsImgHeartbeat(...args: Array<Arg>): Promise<number>
  wsImgOnline(...args: Array<Arg>): Promise<number>
}

const defineScripts = (redis: Redis): Redis & Commands => {
  const define = (name: string, lua: string) => {
    if (!(name in redis)) redis.defineCommand(name, { numberOfKeys: 0, lua })
  }
  define("wsImgSubmit", SUBMIT)
  define("wsImgTake", TAKE)
  define("wsImgCancel", CANCEL)
  define("wsImgTouch", TOUCH)
  define("wsImgProgress", PROGRESS)
  define("wsImgReport", REPORT)
  // ioredis adds `wsImgResultBuffer` (replies as Buffers)
  define("wsImgResult", RESULT)
  define("wsImgSweep", SWEEP)
  define("wsImgHeartbeat", HEARTBEAT)
  define("wsImgOnline", ONLINE)
  return redis as Redis & Commands
}

export interface RedisQueueOptions {
  readonly config: () => ImagesConfig
  /** Prefix of the keys and channels (the layer passes `<redis_key_prefix>img:`). */
  readonly keyPrefix: string
  /** A waiting request's claim on its job, renewed every tick. Default 9 s. */
  readonly ownerLeaseMs?: number | undefined
  /** `redis` (server TIME, production) or `clock` (the Effect clock, tests). Default `redis`. */
  readonly time?: "redis" | "clock" | undefined
}


/**
 * Builds both services on `client` in the current scope: a subscriber connection (a duplicate of `client`) and the
 * tick fiber live in it.
 */
/** The field of a stored spec that carries its submit time. */
const QUEUED_AT = "_queued_at"

export const makeRedis = (client: Redis, options: RedisQueueOptions): Effect.Effect<ImageQueues, never, Scope.Scope> =>
  Effect.gen(function*() {
    const redis = defineScripts(client)
    const clock = yield* Clock.Clock
    const telemetry = yield* CurrentTelemetry
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    const P = options.keyPrefix
    const { config } = options
    const ownerLeaseMs = options.ownerLeaseMs ?? 9_000
    const now = () => (options.time === "clock" ? String(clock.currentTimeMillisUnsafe()) : "")
    const hbMs = () => config().worker_heartbeat_seconds * 1000
    /** A take waiting for a job tries again at least this often. */
    const pollMs = () => Math.min(SWEEP_MS, Math.floor(hbMs() / 3))

    /** Requests of this replica waiting for their jobs. */
    const waiters = new Map<string, Deferred.Deferred<JobOutcome>>()
    /** The waiters whose job is in Redis (submitted): the tick renews those. */
    const submitted = new Set<string>()
    /** Results being read (a job announced twice is read once). */
    const reading = new Set<string>()
    const takers = makeTakers(clock)
    const wakeOne = takers.wakeOne
    const waitForJob = takers.wait


    const logged = (what: string) => (error: GatewayError) => Effect.logWarning(`image queue: ${what} failed`, error.detail)

    /** Reads a finished job's outcome and hands it to its waiting request. */
    const deliver = (id: string): Effect.Effect<void> =>
      Effect.suspend(() => {
        if (!waiters.has(id) || reading.has(id)) return Effect.void
        reading.add(id)
        return command("image result", () => redis.wsImgResultBuffer(now(), P, id)).pipe(
          Effect.flatMap((reply) =>
            Effect.sync(() => {
              let outcome: JobOutcome
              if (reply === null) outcome = { _tag: "Failed", reason: JOB_LOST }
              else if (reply.length < 4) return
              else if (reply[0]!.toString() === "d") {
                outcome = { _tag: "Done", png: new Uint8Array(reply[3]!), workerId: reply[1]!.toString() }
              } else outcome = { _tag: "Failed", reason: reply[2]!.toString() }
              const waiter = waiters.get(id)
              waiters.delete(id)
              submitted.delete(id)
              if (waiter !== undefined) Deferred.doneUnsafe(waiter, Exit.succeed(outcome))
            })
          ),
          Effect.catch(logged("reading a result")),
          Effect.ensuring(Effect.sync(() => reading.delete(id)))
        )
      })

    // --- announcements ------------------------------------------------------------------------------------------
    const doneChannel = `${P}done`
    const newChannel = `${P}new`
    const sub = yield* Effect.acquireRelease(
      Effect.sync(() => {
        const s = client.duplicate()
        s.on("error", () => {}) // the main client logs connection trouble
        // (re)subscribe on every connect: nothing is queued while disconnected
        s.on("ready", () => void s.subscribe(doneChannel, newChannel).catch(() => {}))
        s.on("message", (channel: string, message: string) => {
          if (channel === newChannel) wakeOne()
          else if (channel === doneChannel && waiters.has(message)) runFork(deliver(message))
        })
        return s
      }),
      (s) => Effect.sync(() => s.disconnect())
    )
    // Redis reachable: subscribed before the first job. Unreachable: connect in the background (the `ready`
    // handler subscribes), so start-up is not delayed twice.
    const subscribed = sub.connect().then(() => sub.subscribe(doneChannel, newChannel))
    yield* Effect.promise(() => StoreRedis.within(subscribed, client.status === "ready" ? 2_000 : 0))

    const sweepNow = command("image sweep", () => redis.wsImgSweep(now(), P, hbMs(), RESULT_TTL_MS, LOST_TWICE)).pipe(
      Effect.catch(logged("the sweep")),
      Effect.asVoid
    )

    // --- the tick: owner leases, missed results, silent workers ----------------------------------------------------
    const tick = Effect.suspend(() => {
      const ids = [...submitted]
      const touch = ids.length === 0 ? Effect.void : command(
        "image touch",
        () => redis.wsImgTouch(now(), P, ownerLeaseMs, JOB_TTL_MS, ...ids)
      ).pipe(
        Effect.flatMap((finished) => Effect.forEach(finished, deliver, { concurrency: "unbounded", discard: true })),
        Effect.catch(logged("renewing jobs"))
      )
      return Effect.all([touch, sweepNow], { concurrency: "unbounded", discard: true })
    })
    yield* Effect.sleep(SWEEP_MS).pipe(Effect.andThen(tick), Effect.forever, Effect.forkScoped)

    // --- the request side ---------------------------------------------------------------------------------------
    const run = (job: ImageJob): Effect.Effect<JobOutcome, GatewayError> =>
      Effect.uninterruptibleMask((restore) =>
        Effect.suspend(() => {
          const cfg = config()
          const waiter = Deferred.makeUnsafe<JobOutcome>()
          if (waiters.has(job.id)) return Effect.fail(duplicateJob(job.id))
          // waiting before the job exists: its result may be announced before the submit's reply arrives
          waiters.set(job.id, waiter)
          const submit = command("image submit", () =>
            redis.wsImgSubmit(
              now(),
              P,
              hbMs(),
              cfg.congestion_threshold,
              job.id,
              job.accountId,
              // The submit time rides with the spec (stripped at take) so any replica can measure the wait.
              JSON.stringify({ ...job.spec, [QUEUED_AT]: clock.currentTimeMillisUnsafe() }),
              ownerLeaseMs,
              JOB_TTL_MS
            )).pipe(
              Effect.flatMap((code) =>
                code === 0
                  ? Effect.sync(() => void (waiters.has(job.id) && submitted.add(job.id)))
                  : Effect.fail(code === 1 ? noWorker() : code === 2 ? congested() : duplicateJob(job.id))
              )
            )
          const cancel = Effect.suspend(() => {
            submitted.delete(job.id)
            if (!waiters.delete(job.id)) return Effect.void
            // on failure the job's owner lease lapses: a take drops it, its worker hears it was cancelled
            return command("image cancel", () => redis.wsImgCancel(now(), P, job.id)).pipe(Effect.catch(logged("cancel")))
          })
          return submit.pipe(
            Effect.tapError(() => Effect.sync(() => waiters.delete(job.id))),
            Effect.andThen(restore(Deferred.await(waiter)).pipe(Effect.onInterrupt(() => cancel)))
          )
        })
      )

    // --- the worker side ----------------------------------------------------------------------------------------
    const heartbeat = (info: WorkerInfo) =>
      command("image heartbeat", () => redis.wsImgHeartbeat(now(), P, info.id)).pipe(
        Effect.catch(logged("heartbeat")),
        Effect.asVoid
      )

    const report = (workerId: string, jobId: string, kind: "d" | "f", body: Buffer | string) =>
      command("image report", () => redis.wsImgReport(now(), P, workerId, jobId, RESULT_TTL_MS, kind, body)).pipe(
        Effect.catch(logged("a worker's report")),
        Effect.asVoid
      )

    const takeOnce = (workerId: string, waitMs: number): Effect.Effect<ImageJob | null> =>
      command("image take", () => redis.wsImgTake(now(), P, workerId, waitMs)).pipe(
        Effect.flatMap((reply) => {
          if (reply === null) return Effect.succeed(null)
          try {
            const { [QUEUED_AT]: queuedAt, ...spec } = JSON.parse(reply[2]) as JobSpec & { readonly [QUEUED_AT]?: number }
            if (typeof queuedAt === "number") telemetry.imageWait(Math.max(0, clock.currentTimeMillisUnsafe() - queuedAt) / 1000)
            return Effect.succeed({ id: reply[0], accountId: reply[1], spec: spec as JobSpec })
          } catch {
            // a record this code did not write: the job fails instead of staying held
            return Effect.as(report(workerId, reply[0], "f", "unreadable job record"), null)
          }
        }),
        Effect.catch((error) => Effect.as(logged("take")(error), null))
      )


    const take = (info: WorkerInfo, waitMs: number): Effect.Effect<ImageJob | null> =>
      // The take script is not interruptible (a job it hands over must reach the caller); the wait is.
      Effect.uninterruptibleMask((restore) =>
        Effect.suspend(() => {
          const deadline = clock.currentTimeMillisUnsafe() + Math.min(MAX_TAKE_WAIT_MS, Math.max(0, waitMs))
          const attempt = (): Effect.Effect<ImageJob | null> => {
            const left = Math.max(0, deadline - clock.currentTimeMillisUnsafe())
            return Effect.flatMap(takeOnce(info.id, left), (job) => {
              const rest = deadline - clock.currentTimeMillisUnsafe()
              if (job !== null || rest <= 0) return Effect.succeed(job)
              const taker = takers.make()
              return restore(waitForJob(Math.min(rest, pollMs()), taker)).pipe(
                Effect.onInterrupt(() =>
                  Effect.suspend(() => {
                    if (taker.woken) wakeOne()
                    // the wait ended early: the worker is no longer seen until its deadline
                    return heartbeat(info)
                  })
                ),
                Effect.andThen(Effect.suspend(attempt))
              )
            })
          }
          return attempt()
        })
      )

    return {
      sweep: sweepNow,
      queue: ImageQueue.of({
        run,
        waiting: command("image waiting", () => redis.get(`${P}nwait`)).pipe(
          Effect.map((n) => Math.max(0, Number(n ?? 0))),
          Effect.orElseSucceed(() => 0)
        ),
        workersOnline: command("image workers", () => redis.wsImgOnline(now(), P, hbMs())).pipe(
          Effect.orElseSucceed(() => 0)
        )
      }),
      work: ImageWork.of({
        heartbeat,
        take,
        progress: (workerId, jobId) =>
          command("image progress", () => redis.wsImgProgress(now(), P, workerId, jobId)).pipe(
            Effect.map((cancelled) => ({ cancelled: cancelled === 1 })),
            Effect.catch((error) => Effect.as(logged("progress")(error), { cancelled: false }))
          ),
        complete: (workerId, jobId, png) =>
          report(workerId, jobId, "d", Buffer.from(png.buffer, png.byteOffset, png.byteLength)),
        fail: (workerId, jobId, reason) => report(workerId, jobId, "f", reason.slice(0, MAX_REASON))
      })
    }
  })
