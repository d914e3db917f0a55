import { NodeRuntime } from "@effect/platform-node"
import { Cause, Effect, Exit } from "effect"
import type { Runtime } from "effect"
import { appLayer, bootstrapDevAccount } from "./App.js"
import type { GatewayConfig } from "./config/GatewayConfig.js"
import { ConfigLoadError, loadConfig, parseFlags } from "./config/GatewayConfig.js"
import { BoundListeners } from "./http/Server.js"
import * as GatewayLogger from "./telemetry/GatewayLogger.js"
import { escapeControl } from "./telemetry/LogText.js"

// Everything the gateway creates (data folder, database files, key file, socket) is owner-only.
process.umask(0o077)

/** The layered config (file, env, flags). A bad one fails with ConfigLoadError; anything else is a defect. */
const loadBootConfig = Effect.suspend(() => {
  try {
    return Effect.succeed(loadConfig({ flags: parseFlags(process.argv.slice(2)) }))
  } catch (error) {
    if (error instanceof ConfigLoadError) return Effect.fail(error)
    throw error
  }
})

/** A bad config, flag or env variable: one line naming it, exit code 2. */
const configFailure = (error: ConfigLoadError) =>
  Effect.sync(() => {
    process.stderr.write(`wellspring: ${escapeControl(error.message)}\n`)
    return process.exit(2)
  })

/**
 * SIGINT / SIGTERM: the runtime interrupts the main fiber (the drain runs as the layers close); this says so, with
 * the open requests, and a second signal ends the process at once (exit 128 + signal number).
 */
const onSignals = (config: GatewayConfig, openRequests: () => number) =>
  Effect.gen(function*() {
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    let received = 0
    const handler = (signal: NodeJS.Signals) => {
      received++
      const open = openRequests()
      if (received === 1) {
        const delay = config.shutdown_delay_seconds
        runFork(Effect.logWarning(
          `${signal} received: draining ${open} open request${open === 1 ? "" : "s"} (` +
            (delay > 0 ? `not ready for ${delay} s, then ` : "") +
            `up to ${config.shutdown_grace_seconds} s); send ${signal} again to exit at once`
        ))
        return
      }
      process.stderr.write(`wellspring: second ${signal}: exiting now with ${open} request${open === 1 ? "" : "s"} open\n`)
      process.exit(signal === "SIGINT" ? 130 : 143)
    }
    // Kept until the process exits: a second signal during the drain must still be heard.
    process.on("SIGINT", handler)
    process.on("SIGTERM", handler)
  })

const serve = (config: GatewayConfig, started: number) =>
  Effect.gen(function*() {
    const key = yield* bootstrapDevAccount
    const { listeners, lifecycle } = yield* BoundListeners
    yield* onSignals(config, lifecycle.openRequests)
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
    process.stderr.write(`wellspring: cannot start: ${escapeControl(message)}\n`)
    return process.exit(1)
  })

/**
 * Exit codes as before: 0 for a clean stop (including SIGINT / SIGTERM, which interrupt the main fiber), 1 for
 * anything else. Effect 4's default teardown would give 130 for an interrupted main fiber.
 */
const teardown: Runtime.Teardown = (exit, onExit) =>
  onExit(Exit.isFailure(exit) && !Cause.hasInterruptsOnly(exit.cause) ? 1 : 0)

const program = Effect.gen(function*() {
  const { config, path } = yield* Effect.catch(loadBootConfig, configFailure)
  const started = performance.now()
  return yield* serve(config, started).pipe(
    Effect.provide(appLayer(config, path)),
    Effect.catch(bootFailure)
  )
})

program.pipe(
  Effect.tapDefect((defect) => Effect.logError("gateway stopped", defect)),
  Effect.provide(GatewayLogger.layer()),
  NodeRuntime.runMain({ disableErrorReporting: true, teardown })
)
