import { spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { describe, expect, it } from "vitest"
import {
  boundedRestartArgs,
  boundedRestartEnv,
  MALLOC_ARENAS,
  PRODUCTION_SEMI_SPACE_MB,
  SEMI_SPACE_MB,
  TURBOFAN_INVOCATIONS
} from "../../src/runtime/HeapBound.js"

const base = { nodeOptions: undefined, optOut: undefined, canExec: true }
const NO_PRETENURING = "--no-allocation-site-pretenuring"
const TIER_UP = `--invocation-count-for-turbofan=${TURBOFAN_INVOCATIONS}`
/** The same restart with the operator's choice of pretenuring and tier-up, so each test below isolates its own flag. */
const chosen = ["--allocation-site-pretenuring", "--invocation-count-for-turbofan=3000"]

describe("heap bound: young generation capped under --max-old-space-size", () => {
  it("turns allocation-site pretenuring off unless the operator chose either form, in both modes", () => {
    expect(boundedRestartArgs({ ...base, execArgv: [TIER_UP] })).toEqual([TIER_UP, NO_PRETENURING])
    expect(boundedRestartArgs({ ...base, execArgv: ["--inspect", TIER_UP], embedded: false }))
      .toEqual(["--inspect", TIER_UP, NO_PRETENURING])
    expect(boundedRestartArgs({ ...base, execArgv: [NO_PRETENURING, TIER_UP] })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: ["--allocation_site_pretenuring", TIER_UP] })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: [TIER_UP], nodeOptions: "--allocation-site-pretenuring" })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: [], optOut: "0" })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: [], canExec: false })).toBeNull()
  })

  it("adds the TurboFan tier-up count unless the operator chose one, in both modes", () => {
    const pretenuring = ["--allocation-site-pretenuring"]
    expect(TURBOFAN_INVOCATIONS).toBeLessThan(3000)
    expect(boundedRestartArgs({ ...base, execArgv: pretenuring, embedded: false })).toEqual([...pretenuring, TIER_UP])
    expect(boundedRestartArgs({ ...base, execArgv: ["--no-liftoff-only", ...pretenuring], embedded: true }))
      .toEqual(["--no-liftoff-only", ...pretenuring, TIER_UP])
    expect(boundedRestartArgs({ ...base, execArgv: [...pretenuring, "--invocation_count_for_turbofan=500"] })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: pretenuring, nodeOptions: "--invocation-count-for-turbofan=3000" }))
      .toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: pretenuring, optOut: "0" })).toBeNull()
  })

  it("adds the semi-space cap only when the heap is bounded and the operator chose none", () => {
    expect(boundedRestartArgs({ ...base, execArgv: ["--max-old-space-size=160", ...chosen] }))
      .toEqual(["--max-old-space-size=160", ...chosen, `--max-semi-space-size=${SEMI_SPACE_MB}`])
    expect(boundedRestartArgs({ ...base, execArgv: [...chosen] })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: ["--max-old-space-size=160", "--max-semi-space-size=32", ...chosen] }))
      .toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: ["--max_old_space_size=160", "--max_semi_space_size=4", ...chosen] }))
      .toBeNull()
    // A bound given through NODE_OPTIONS counts; the restart keeps NODE_OPTIONS in the environment.
    expect(boundedRestartArgs({ ...base, execArgv: [...chosen], nodeOptions: "--max-old-space-size=200" }))
      .toEqual([...chosen, `--max-semi-space-size=${SEMI_SPACE_MB}`])
    expect(boundedRestartArgs({ ...base, execArgv: ["--max-old-space-size=160", ...chosen], optOut: "0" })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: ["--max-old-space-size=160", ...chosen], canExec: false })).toBeNull()
  })

  it("sizes the young generation by mode: small beside the embedded database, larger in production", () => {
    expect(PRODUCTION_SEMI_SPACE_MB).toBeGreaterThan(SEMI_SPACE_MB)
    expect(boundedRestartArgs({ ...base, execArgv: ["--max-old-space-size=160", ...chosen], embedded: false }))
      .toEqual(["--max-old-space-size=160", ...chosen, `--max-semi-space-size=${PRODUCTION_SEMI_SPACE_MB}`])
    expect(boundedRestartArgs({ ...base, execArgv: ["--max-old-space-size=160", ...chosen], embedded: true }))
      .toEqual(["--max-old-space-size=160", ...chosen, `--max-semi-space-size=${SEMI_SPACE_MB}`, "--liftoff-only"])
    // The operator's size wins in production too.
    expect(
      boundedRestartArgs({ ...base, execArgv: ["--max-old-space-size=160", "--max-semi-space-size=8", ...chosen], embedded: false })
    ).toBeNull()
  })

  it("embedded mode adds --liftoff-only unless a WebAssembly tier was chosen; production does not", () => {
    expect(boundedRestartArgs({ ...base, execArgv: [...chosen], embedded: true })).toEqual([...chosen, "--liftoff-only"])
    expect(boundedRestartArgs({ ...base, execArgv: ["--max-old-space-size=160", ...chosen], embedded: true }))
      .toEqual(["--max-old-space-size=160", ...chosen, `--max-semi-space-size=${SEMI_SPACE_MB}`, "--liftoff-only"])
    expect(boundedRestartArgs({ ...base, execArgv: [...chosen], embedded: false })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: ["--no-liftoff-only", ...chosen], embedded: true })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: [...chosen], nodeOptions: "--liftoff-only", embedded: true })).toBeNull()
    expect(boundedRestartArgs({ ...base, execArgv: [...chosen], embedded: true, optOut: "0" })).toBeNull()
  })

  it("embedded mode caps glibc's malloc arenas unless the operator set them; production does not", () => {
    const env = (vars: Record<string, string>, embedded: boolean, more: { optOut?: string; canExec?: boolean } = {}) =>
      boundedRestartEnv({ ...base, ...more, env: vars, embedded })
    expect(env({}, true)).toEqual({ MALLOC_ARENA_MAX: String(MALLOC_ARENAS) })
    expect(env({ MALLOC_ARENA_MAX: "8" }, true)).toBeNull()
    expect(env({}, false)).toBeNull()
    expect(env({}, true, { optOut: "0" })).toBeNull()
    expect(env({}, true, { canExec: false })).toBeNull()
  })

  it("an embedded process restarts once in place (same PID) with the arena cap, its flags kept", () => {
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "heap-bound-"))
    const script = Path.join(dir, "probe.mjs")
    const module = new URL("../../src/runtime/HeapBound.ts", import.meta.url).href
    Fs.writeFileSync(script, `
      const { applyHeapBound } = await import(${JSON.stringify(module)})
      console.log(JSON.stringify({ pid: process.pid, arenas: process.env.MALLOC_ARENA_MAX ?? null,
        args: process.execArgv.filter((a) => a.startsWith("--liftoff")) }))
      applyHeapBound()
    `)
    try {
      const env: Record<string, string | undefined> = { ...process.env, WELLSPRING_HEAP_TUNING: "" }
      delete env["DATABASE_URL"]
      delete env["MALLOC_ARENA_MAX"]
      // --liftoff-only given: the environment (and the tier-up count) are missing, and one restart adds them.
      const run = spawnSync(process.execPath, ["--liftoff-only", "--import", "tsx", script], { encoding: "utf8", env })
      expect(run.status).toBe(0)
      const lines = run.stdout.trim().split("\n").map((l) => JSON.parse(l) as { pid: number; arenas: string | null; args: string[] })
      expect(lines.map((l) => l.arenas)).toEqual([null, String(MALLOC_ARENAS)])
      expect(lines.every((l) => l.pid === lines[0]!.pid && l.args.join() === "--liftoff-only")).toBe(true)
    } finally {
      Fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  it("a bounded process restarts itself in place (same PID) with a heap limit close to its bound", () => {
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "heap-bound-"))
    const script = Path.join(dir, "probe.mjs")
    const module = new URL("../../src/runtime/HeapBound.ts", import.meta.url).href
    Fs.writeFileSync(script, `
      import v8 from "node:v8"
      const { applyHeapBound } = await import(${JSON.stringify(module)})
      console.log(JSON.stringify({ pid: process.pid, args: process.execArgv.filter((a) => a.startsWith("--max")),
        pretenuring: process.execArgv.filter((a) => a.includes("pretenuring")),
        tierUp: process.execArgv.filter((a) => a.includes("invocation-count")),
        limitMb: Math.round(v8.getHeapStatistics().heap_size_limit / 1048576) }))
      applyHeapBound()
    `)
    try {
      const run = spawnSync(process.execPath, ["--max-old-space-size=160", "--import", "tsx", script], {
        encoding: "utf8",
        env: { ...process.env, WELLSPRING_HEAP_TUNING: "", DATABASE_URL: "postgres://unused" }
      })
      expect(run.status).toBe(0)
      const lines = run.stdout.trim().split("\n").map((l) =>
        JSON.parse(l) as { pid: number; args: string[]; pretenuring: string[]; tierUp: string[]; limitMb: number }
      )
      const last = lines.at(-1)!
      // Production mode (DATABASE_URL set): the larger young generation.
      expect(last.args).toEqual(["--max-old-space-size=160", `--max-semi-space-size=${PRODUCTION_SEMI_SPACE_MB}`])
      expect(lines.map((l) => l.pretenuring)).toEqual([[], [NO_PRETENURING]])
      expect(lines.map((l) => l.tierUp)).toEqual([[], [TIER_UP]])
      expect(lines.every((l) => l.pid === lines[0]!.pid)).toBe(true)
      // Old space 160 MB plus a young generation of three capped semi-spaces.
      expect(last.limitMb).toBeLessThanOrEqual(160 + 3 * PRODUCTION_SEMI_SPACE_MB + 8)
      // First run as started, second after the in-place restart.
      expect(lines).toHaveLength(2)
      expect(lines[0]!.args).toEqual(["--max-old-space-size=160"])
    } finally {
      Fs.rmSync(dir, { recursive: true, force: true })
    }
  })
})
