import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import * as Crypto from "node:crypto"
import * as Net from "node:net"
import { Redis } from "ioredis"
import { reachable } from "./Services.js"
import { eventually } from "./Eventually.js"

/** A key prefix no other run uses. */
export const uniquePrefix = (label: string): string =>
  `wst:${label}:${Date.now().toString(36)}${Crypto.randomBytes(3).toString("hex")}:`

/** Deletes every key under `prefix` (SCAN, never KEYS). */
export const deleteByPrefix = async (url: string, prefix: string): Promise<number> => {
  const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  await redis.connect()
  let deleted = 0
  try {
    let cursor = "0"
    do {
      const [next, keys] = await redis.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 1000)
      cursor = next
      if (keys.length > 0) deleted += await redis.unlink(...keys)
    } while (cursor !== "0")
  } finally {
    redis.disconnect()
  }
  return deleted
}

export const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = Net.createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as Net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })

export interface PrivateRedis {
  readonly url: string
  readonly port: number
  /** Starts (or restarts) the server; resolves once it accepts connections. */
  readonly start: () => Promise<void>
  /** Stops the server (the child this helper spawned). */
  readonly stop: () => Promise<void>
  /** Freezes / thaws the server process (SIGSTOP / SIGCONT): commands hang instead of failing. */
  readonly pause: () => void
  readonly resume: () => void
}

export const hasRedisServer = (): boolean => spawnSync("redis-server", ["--version"], { stdio: "ignore" }).status === 0

/** A throw-away redis-server on a free port, for outage tests. Memory only, no persistence. */
export const privateRedis = async (): Promise<PrivateRedis> => {
  const port = await freePort()
  let child: ChildProcess | undefined
  const start = async () => {
    if (child !== undefined) return
    child = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], {
      stdio: "ignore"
    })
    await eventually(() => reachable("127.0.0.1", port, 200), {
      timeoutMs: 5_000,
      everyMs: 50,
      what: `redis-server on port ${port} starting`
    })
  }
  const stop = async () => {
    const c = child
    child = undefined
    if (c === undefined || c.exitCode !== null) return
    await new Promise<void>((resolve) => {
      c.once("exit", () => resolve())
      c.kill("SIGTERM")
    })
  }
  const signal = (sig: NodeJS.Signals) => {
    if (child !== undefined && child.exitCode === null) child.kill(sig)
  }
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    start,
    stop: async () => {
      signal("SIGCONT")
      await stop()
    },
    pause: () => signal("SIGSTOP"),
    resume: () => signal("SIGCONT")
  }
}
