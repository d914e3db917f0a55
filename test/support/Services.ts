import * as Net from "node:net"

/** With GATEWAY_REQUIRE_SERVICES=1 a missing PostgreSQL or Redis fails the suite instead of skipping it. */
export const requireServices = process.env.GATEWAY_REQUIRE_SERVICES === "1"

export const POSTGRES = { host: "127.0.0.1", port: 5432, user: "root", database: "test" }
export const REDIS_URL = process.env.TEST_REDIS_URL ?? "redis://127.0.0.1:6379"

export const reachable = (host: string, port: number, timeoutMs = 1000): Promise<boolean> =>
  new Promise((resolve) => {
    const socket = Net.connect({ host, port })
    const done = (ok: boolean) => {
      socket.destroy()
      resolve(ok)
    }
    socket.setTimeout(timeoutMs, () => done(false))
    socket.once("connect", () => done(true))
    socket.once("error", () => done(false))
  })

export const postgresUp = () => reachable(POSTGRES.host, POSTGRES.port)
export const redisUp = () => reachable("127.0.0.1", 6379)

/** True when the suite should run; throws when services are required but absent. */
export const serviceGate = async (name: "postgres" | "redis"): Promise<boolean> => {
  const up = name === "postgres" ? await postgresUp() : await redisUp()
  if (!up && requireServices) throw new Error(`${name} is required (GATEWAY_REQUIRE_SERVICES=1) but unreachable`)
  return up
}
