// `npm install` (the `prepare` script) builds the dashboard into dashboard/dist, which the gateway serves under
// /dashboard/. An install without dev dependencies (`npm ci --omit=dev`) has no Vite: it keeps an existing
// build and says so instead of failing the install.
import { spawnSync } from "node:child_process"
import { existsSync } from "node:fs"
import { createRequire } from "node:module"

const require = createRequire(import.meta.url)
let vite
try {
  vite = new URL("bin/vite.js", `file://${require.resolve("vite/package.json")}`).pathname
} catch {
  const built = existsSync(new URL("./dist/index.html", import.meta.url))
  console.warn(`dashboard: vite is not installed (dev dependencies omitted); ${built ? "keeping the existing build" : "the dashboard is not built"}`)
  process.exit(0)
}
const config = new URL("./vite.config.ts", import.meta.url).pathname
const run = spawnSync(process.execPath, [vite, "build", "--config", config, "--logLevel", "warn"], { stdio: "inherit" })
process.exit(run.status ?? 1)
