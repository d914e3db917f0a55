/** The gateway logger (issue 16): one line per call, every part escaped and bounded, whatever it is given. */
import { Cause, Effect } from "effect"
import { describe, expect, it } from "vitest"
import * as GatewayLogger from "../../src/telemetry/GatewayLogger.js"
import { hasControl } from "../../src/telemetry/LogText.js"

const capture = async (effect: Effect.Effect<void>) => {
  const lines: Array<string> = []
  await Effect.runPromise(Effect.provide(effect, GatewayLogger.layer((line) => void lines.push(line))))
  return lines
}

const FORGED = "x\n2026-01-01T00:00:00.000Z level=ERROR message=forged\r\x1b[2J\u2028\u202e\u0085\u007f"

describe("gateway logger", () => {
  it("escapes control characters in messages, annotations, labels and causes; one line per call", async () => {
    const lines = await capture(
      Effect.logWarning("request failed", FORGED, { nested: FORGED }).pipe(
        Effect.annotateLogs({ detail: FORGED, [`key${FORGED}`]: 1 }),
        Effect.andThen(Effect.logError("boom", Cause.fail(new Error(FORGED)))),
        Effect.withLogSpan(`span${FORGED}`)
      )
    )
    expect(lines).toHaveLength(2)
    for (const line of lines) {
      expect(hasControl(line), JSON.stringify(line)).toBe(false)
      expect(line).toMatch(/^timestamp=\S+ level=(WARN|ERROR) fiber=#\d+ message=/)
    }
    expect(lines[0]).toContain(`message="x\\n2026-01-01T00:00:00.000Z level=ERROR message=forged\\r\\x1b[2J\\u2028\\u202e\\x85\\x7f"`)
    expect(lines[0]).toContain("detail=")
    expect(lines[1]).toContain("cause=")
  })

  it("bounds every field and the number of annotations", async () => {
    const huge = "a".repeat(100_000)
    const many = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`k${i}`, huge]))
    const [line] = await capture(Effect.logInfo(huge, huge).pipe(Effect.annotateLogs(many)))
    expect(line!.length).toBeLessThan((2 + 32) * (GatewayLogger.MAX_FIELD_CHARS + 40) + 200)
    expect(line).toContain(`...(${100_000 - GatewayLogger.MAX_FIELD_CHARS} more)`)
  })

  it("logs plain text as it is (bare words unquoted, others quoted)", async () => {
    const [line] = await capture(Effect.logInfo("hello", "two words").pipe(Effect.annotateLogs({ provider: "openai" })))
    expect(line).toMatch(/ message=hello message="two words" provider=openai$/)
  })
})
