/**
 * V8's settings the gateway runs with: no allocation-site pretenuring, an earlier optimizing tier-up,
 * young-generation sizing under a heap bound (and, in embedded mode, the WebAssembly tier and malloc arenas).
 *
 * Since V8 13 (Node 24), the young generation is sized from the machine's memory, not from
 * `--max-old-space-size`: on a 24 GB host each semi-space is 64 MB. Under `--max-old-space-size=160` the heap
 * limit becomes ~369 MB, and the old generation runs a mark-compact every ~100 ms at ~65 MB used (measured:
 * 92 mark-compacts in 15 s, 5-10x lower throughput than without the bound). Capping the semi-space restores the
 * Node 20 behaviour. Flags cannot change after V8 starts, so a process missing one of these flags replaces itself
 * once (`process.execve`: same PID, same arguments) with them added.
 */

/**
 * Semi-space cap in MB applied under a heap bound in embedded mode, where the embedded database leaves little room
 * under the memory line; measured in docs/decisions.md ("Heap bound on Node 24", "The embedded young generation at
 * 4 MB").
 */
export const SEMI_SPACE_MB = 4

/**
 * Semi-space cap in MB in production mode (no database in the process). Each request waits on Redis twice, so more
 * requests are in flight at a scavenge; 8 MB promoted them to the old generation wholesale (at 256 connections the
 * GC helper threads took a third of the CPU). 32 MB costs ~50 MB of resident memory and halves the CPU per request
 * at 256 connections (docs/decisions.md, "Redis on the hot path").
 */
export const PRODUCTION_SEMI_SPACE_MB = 32

/**
 * Calls of a function before V8 optimizes it with TurboFan (V8's default: 3,000). Measured with `--trace-opt`, the
 * functions a request runs through reached TurboFan only after 10,000-15,000 requests, so a fresh process served
 * its first ~5 s of load on Maglev code while compiling; at 1,000 they are optimized within ~3,500 requests
 * (docs/decisions.md, "TurboFan sooner after a start").
 */
export const TURBOFAN_INVOCATIONS = 1000

const flagsOf = (execArgv: ReadonlyArray<string>, nodeOptions: string | undefined): ReadonlyArray<string> => [
  ...execArgv,
  ...(nodeOptions ?? "").split(/\s+/).filter((s) => s.length > 0)
]

/** `name` (`--a-b`) given in either spelling V8 accepts (`--a-b`, `--a_b`), with or without a value. */
const hasFlag = (flags: ReadonlyArray<string>, name: string): boolean => {
  const underscored = `--${name.slice(2).replaceAll("-", "_")}`
  return flags.some((f) => f === name || f.startsWith(`${name}=`) || f === underscored || f.startsWith(`${underscored}=`))
}

/**
 * The node arguments to restart with, or null when the process should run as it is. Four flags may be added:
 * - `--no-allocation-site-pretenuring` unless the operator chose either form: V8 allocates the objects of an
 *   allocation site straight into the old generation once most of them survived a scavenge, and under load a
 *   request's own objects qualify (a scavenge finds the requests in flight). Those old objects then point at the
 *   young ones of their request, which survive every scavenge until the next mark-compact: measured, 6.8 KB promoted
 *   per request and a mark-compact every ~200 ms, against 1.2 KB without it; 30 % less CPU per request
 *   (docs/decisions.md, "No generator function per request");
 * - `--invocation-count-for-turbofan=TURBOFAN_INVOCATIONS` unless the operator chose a count;
 * - `--max-semi-space-size` under a heap bound (`--max-old-space-size`) unless the operator chose a size:
 *   `SEMI_SPACE_MB` in embedded mode, `PRODUCTION_SEMI_SPACE_MB` in production;
 * - `--liftoff-only` in embedded mode (no `DATABASE_URL`) unless the operator chose a WebAssembly tier: V8's
 *   optimizing compile of PGlite's 25 MB module takes ~500 MB for a second or two after boot (measured: peak RSS
 *   819 MB against 310 MB without it), for no measurable gain in CPU per request (the database runs in its own
 *   worker and sees a few batched writes per second).
 * Null with none to add, with the opt-out (`WELLSPRING_HEAP_TUNING=0`), or on a runtime without `process.execve`.
 */
export const boundedRestartArgs = (input: {
  readonly execArgv: ReadonlyArray<string>
  readonly nodeOptions: string | undefined
  readonly optOut: string | undefined
  readonly canExec: boolean
  readonly embedded?: boolean
}): ReadonlyArray<string> | null => {
  if (!input.canExec || input.optOut === "0") return null
  const flags = flagsOf(input.execArgv, input.nodeOptions)
  const added: Array<string> = []
  if (!hasFlag(flags, "--allocation-site-pretenuring") && !hasFlag(flags, "--no-allocation-site-pretenuring")) {
    added.push("--no-allocation-site-pretenuring")
  }
  if (!hasFlag(flags, "--invocation-count-for-turbofan")) {
    added.push(`--invocation-count-for-turbofan=${TURBOFAN_INVOCATIONS}`)
  }
  if (hasFlag(flags, "--max-old-space-size") && !hasFlag(flags, "--max-semi-space-size")) {
    added.push(`--max-semi-space-size=${input.embedded === false ? PRODUCTION_SEMI_SPACE_MB : SEMI_SPACE_MB}`)
  }
  if (input.embedded === true && !hasFlag(flags, "--liftoff-only") && !hasFlag(flags, "--no-liftoff-only")) {
    added.push("--liftoff-only")
  }
  return added.length === 0 ? null : [...input.execArgv, ...added]
}

/**
 * The semi-space cap in MB this process runs with (`--max-semi-space-size` in its arguments or `NODE_OPTIONS`), or
 * undefined when V8 sizes the young generation itself.
 */
export const semiSpaceMb = (
  execArgv: ReadonlyArray<string> = process.execArgv,
  nodeOptions: string | undefined = process.env["NODE_OPTIONS"]
): number | undefined => {
  let found: number | undefined
  for (const flag of flagsOf(execArgv, nodeOptions)) {
    const match = /^--max[-_]semi[-_]space[-_]size=(\d+)$/.exec(flag)
    if (match !== null) found = Number(match[1])
  }
  return found
}

/** glibc malloc arenas in embedded mode; measured in docs/decisions.md ("Embedded memory"). */
export const MALLOC_ARENAS = 2

/**
 * The environment variables to restart with, or null when none is missing: `MALLOC_ARENA_MAX` in embedded mode
 * unless the operator set it. glibc gives each thread that allocates its own arena (up to 8 per core) and keeps
 * what they freed; the embedded database's worker, V8's compiler and GC threads and libuv's pool made several,
 * ~15 MB of resident memory together. Null with the opt-out (`WELLSPRING_HEAP_TUNING=0`) or without `execve`.
 */
export const boundedRestartEnv = (input: {
  readonly env: Readonly<Record<string, string | undefined>>
  readonly optOut: string | undefined
  readonly canExec: boolean
  readonly embedded?: boolean
}): Readonly<Record<string, string>> | null => {
  if (!input.canExec || input.optOut === "0" || input.embedded !== true) return null
  if (input.env["MALLOC_ARENA_MAX"] !== undefined) return null
  return { MALLOC_ARENA_MAX: String(MALLOC_ARENAS) }
}

/** Restarts the process in place with the flags of `boundedRestartArgs` and the environment of `boundedRestartEnv`, when either adds any. */
export const applyHeapBound = (): void => {
  const canExec = typeof process.execve === "function" && process.platform !== "win32"
  const optOut = process.env["WELLSPRING_HEAP_TUNING"]
  const embedded = !process.env["DATABASE_URL"]
  const args = boundedRestartArgs({
    execArgv: process.execArgv,
    nodeOptions: process.env["NODE_OPTIONS"],
    optOut,
    canExec,
    embedded
  })
  const env = boundedRestartEnv({ env: process.env, optOut, canExec, embedded })
  if (args === null && env === null) return
  process.execve!(process.execPath, [process.execPath, ...(args ?? process.execArgv), ...process.argv.slice(1)], {
    ...process.env,
    ...env
  })
}
