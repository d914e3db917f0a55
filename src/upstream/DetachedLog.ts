/**
 * Logging from plain callbacks (socket, timer) of a call that outlived the fiber that started it:
 * the fiber's context (which holds its loggers, log level, annotations and spans) is captured when
 * the call starts (one lookup, no copy), and a later log runs in a fiber of its own with it. For
 * rare events only (skipped frames, a throwing sink).
 */
import { type Context, Effect, type Fiber } from "effect"

export class DetachedLog {
  private readonly context: Context.Context<never>

  constructor(fiber: Fiber.Fiber<unknown, unknown>) {
    this.context = fiber.context
  }

  /** Runs `log` (a log effect) now, in a new fiber, with the captured log settings. */
  run(log: Effect.Effect<void>): void {
    Effect.runForkWith(this.context)(log)
  }
}
