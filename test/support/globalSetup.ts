import { postgresUp, redisUp, requireServices } from "./Services.js"

/** Fails the whole run early when services are required and absent. */
export default async function setup() {
  if (!requireServices) return
  const [pg, redis] = await Promise.all([postgresUp(), redisUp()])
  const missing = [!pg && "PostgreSQL at 127.0.0.1:5432", !redis && "Redis at 127.0.0.1:6379"].filter(Boolean)
  if (missing.length > 0) throw new Error(`GATEWAY_REQUIRE_SERVICES=1 but unreachable: ${missing.join(", ")}`)
}
