import { NodeRuntime } from "@effect/platform-node"
import { Effect } from "effect"
import { appLayer, bootstrapDevAccount } from "./App.js"
import { ConfigLoadError, loadConfig, parseFlags } from "./config/GatewayConfig.js"
import { BoundListeners } from "./http/Server.js"

// Everything the gateway creates (data folder, database files, key file, socket) is owner-only.
process.umask(0o077)

const boot = () => {
  try {
    return loadConfig({ flags: parseFlags(process.argv.slice(2)) })
  } catch (error) {
    if (error instanceof ConfigLoadError) {
      process.stderr.write(`wellspring: ${error.message}\n`)
      process.exit(2)
    }
    throw error
  }
}

const { config, path } = boot()
const started = performance.now()

const program = Effect.gen(function*() {
  const key = yield* bootstrapDevAccount
  const { listeners } = yield* BoundListeners
  for (const l of listeners) {
    yield* Effect.logInfo(`listening on http://${l.host}:${l.port} (${l.origins.join(", ")})`)
  }
  yield* Effect.logInfo(`ready in ${Math.round(performance.now() - started)} ms`).pipe(
    Effect.annotateLogs({ mode: config.database_url ? "production" : "embedded" })
  )
  if (key) {
    // Printed once, on the first start only.
    process.stdout.write("\nDev account created; its key is shown only this once:\n")
    process.stdout.write(`API key: ${key}\n\n`)
  }
  return yield* Effect.never
})

/** Boot failures (database down, port taken, ...) end in one clear line, not a stack trace. */
const bootFailure = (error: unknown) =>
  Effect.sync(() => {
    const message = error instanceof Error || (typeof error === "object" && error !== null && "message" in error)
      ? String((error as { message: unknown }).message)
      : String(error)
    process.stderr.write(`wellspring: cannot start: ${message}\n`)
    process.exit(1)
  })

program.pipe(
  Effect.provide(appLayer(config, path)),
  Effect.catchAll(bootFailure),
  Effect.tapDefect((defect) => Effect.logError("gateway stopped", defect)),
  NodeRuntime.runMain({ disableErrorReporting: true })
)
