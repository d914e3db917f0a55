import { PGlite } from "@electric-sql/pglite"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import type { TestProject } from "vitest/node"
import { postgresUp, redisUp, requireServices } from "./Services.js"

declare module "vitest" {
  export interface ProvidedContext {
    /** A freshly initialised, empty PGlite cluster that test gateways copy instead of running initdb. */
    readonly pgliteTemplate: string
  }
}

/**
 * Fails the whole run early when services are required and absent, and initialises one empty embedded database
 * cluster for the run: PGlite's initdb takes seconds (5-7 s on a slow machine), and every test gateway in
 * embedded mode would run it (test/support/Gateway.ts copies this one instead; migrations still run per gateway).
 */
export default async function setup(project: TestProject) {
  if (requireServices) {
    const [pg, redis] = await Promise.all([postgresUp(), redisUp()])
    const missing = [!pg && "PostgreSQL at 127.0.0.1:5432", !redis && "Redis at 127.0.0.1:6379"].filter(Boolean)
    if (missing.length > 0) throw new Error(`GATEWAY_REQUIRE_SERVICES=1 but unreachable: ${missing.join(", ")}`)
  }
  const root = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-pglite-template-"))
  const template = Path.join(root, "pglite")
  const db = await PGlite.create(template)
  await db.close()
  project.provide("pgliteTemplate", template)
  return () => Fs.rmSync(root, { recursive: true, force: true })
}
