/**
 * The Redis client's writes (`store/Redis.ts`), on real Redis: commands sent in one turn of the event loop leave in
 * one `writev`, commands of later turns are not held back (each is answered), and a reconnected client coalesces
 * on its new socket too. The socket's own `_writev` / `_write` are counted: what reaches the kernel, not a mock.
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import type { Redis } from "ioredis"
import type { Writable } from "node:stream"
import * as StoreRedis from "../../src/store/Redis.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"

const redisUp = await serviceGate("redis")
const prefix = uniquePrefix("redis-writes")

/** Counts the socket's kernel writes (one `writev` of many chunks, or one `write`) from now on. */
const countWrites = (client: Redis) => {
  type Chunks = Parameters<NonNullable<Writable["_writev"]>>[0]
  const socket = client.stream as unknown as {
    _writev: (chunks: Chunks, cb: (e?: Error | null) => void) => void
    _write: (chunk: unknown, encoding: BufferEncoding, cb: (e?: Error | null) => void) => void
  }
  const counts = { writes: 0, chunks: 0 }
  const writev = socket._writev.bind(socket)
  const write = socket._write.bind(socket)
  socket._writev = (chunks, cb) => {
    counts.writes++
    counts.chunks += chunks.length
    writev(chunks, cb)
  }
  socket._write = (chunk, encoding, cb) => {
    counts.writes++
    counts.chunks++
    write(chunk, encoding, cb)
  }
  return counts
}

const waitReady = (client: Redis) =>
  Effect.promise(() =>
    client.status === "ready" ? Promise.resolve() : new Promise<void>((resolve) => client.once("ready", () => resolve()))
  )

describe.skipIf(!redisUp)("Redis writes are coalesced per turn of the event loop", () => {
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, prefix)
  })

  it.effect("twenty commands sent in one turn leave in one write, and all are answered in order", () =>
    Effect.gen(function*() {
      const { client } = yield* StoreRedis.make({ url: REDIS_URL })
      yield* waitReady(client)
      const counts = countWrites(client)
      const replies = yield* Effect.promise(() =>
        Promise.all(Array.from({ length: 20 }, (_, i) => client.incrby(`${prefix}n`, i + 1)))
      )
      expect(replies).toEqual(Array.from({ length: 20 }, (_, i) => ((i + 1) * (i + 2)) / 2))
      expect(counts).toEqual({ writes: 1, chunks: 20 })
    }).pipe(Effect.scoped))

  it.effect("commands of successive turns each go out without waiting for more", () =>
    Effect.gen(function*() {
      const { client } = yield* StoreRedis.make({ url: REDIS_URL })
      yield* waitReady(client)
      const counts = countWrites(client)
      for (let i = 0; i < 5; i++) {
        // Each awaits its answer before the next is sent: nothing may stay corked.
        expect(yield* Effect.promise(() => client.set(`${prefix}k${i}`, String(i)))).toBe("OK")
      }
      expect(counts).toEqual({ writes: 5, chunks: 5 })
      expect(yield* Effect.promise(() => client.mget([0, 1, 2, 3, 4].map((i) => `${prefix}k${i}`)))).toEqual(
        ["0", "1", "2", "3", "4"]
      )
    }).pipe(Effect.scoped))

  it.effect("a reconnected client coalesces on its new socket", () =>
    Effect.gen(function*() {
      const { client } = yield* StoreRedis.make({ url: REDIS_URL })
      yield* waitReady(client)
      const first = client.stream
      client.disconnect(true)
      yield* Effect.promise(() => new Promise<void>((resolve) => client.once("ready", () => resolve())))
      expect(client.stream).not.toBe(first)
      const counts = countWrites(client)
      const replies = yield* Effect.promise(() =>
        Promise.all(Array.from({ length: 8 }, () => client.incr(`${prefix}after`)))
      )
      expect(replies).toEqual([1, 2, 3, 4, 5, 6, 7, 8])
      expect(counts).toEqual({ writes: 1, chunks: 8 })
    }).pipe(Effect.scoped))
})
