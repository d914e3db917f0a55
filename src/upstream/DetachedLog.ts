/**
 * Logging from plain callbacks (socket, timer) of a call that outlived the fiber that started it:
 * the fiber's loggers, log level, annotations and spans are captured when the call starts (four
 * lookups, no copy), and a later log runs in a fiber of its own with them. For rare events only
 * (skipped frames, a throwing sink).
 */
import {
  Effect,
  type Fiber,
  FiberRef,
  type HashMap,
  type HashSet,
  type List,
  type Logger,
  type LogLevel,
  type LogSpan
} from "effect"

export class DetachedLog {
  private readonly loggers: HashSet.HashSet<Logger.Logger<unknown, any>>
  private readonly level: LogLevel.LogLevel
  private readonly annotations: HashMap.HashMap<string, unknown>
  private readonly spans: List.List<LogSpan.LogSpan>

  constructor(fiber: Fiber.RuntimeFiber<unknown, unknown>) {
    this.loggers = fiber.getFiberRef(FiberRef.currentLoggers)
    this.level = fiber.getFiberRef(FiberRef.currentMinimumLogLevel)
    this.annotations = fiber.getFiberRef(FiberRef.currentLogAnnotations)
    this.spans = fiber.getFiberRef(FiberRef.currentLogSpan)
  }

  /** Runs `log` (a log effect) now, in a new fiber, with the captured log settings. */
  run(log: Effect.Effect<void>): void {
    Effect.runFork(log.pipe(
      Effect.locally(FiberRef.currentLoggers, this.loggers),
      Effect.locally(FiberRef.currentMinimumLogLevel, this.level),
      Effect.locally(FiberRef.currentLogAnnotations, this.annotations),
      Effect.locally(FiberRef.currentLogSpan, this.spans)
    ))
  }
}
