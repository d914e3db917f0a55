/** LogText (issue 16): secrets removed in any run of 6 characters, control characters escaped, bounded text. */
import { describe, expect, it } from "vitest"
import {
  clip,
  escapeControl,
  hasControl,
  logText,
  MAX_REDACTED_CHARS,
  REDACTED,
  secretRedactor
} from "../../src/telemetry/LogText.js"

const SECRET = "sk-proj-Q7vXk2LmN9pR4tYw8zA1bC3dE5fG"

/** Every run of 6 characters of `secret` still in `text`. */
const runsLeft = (text: string, secret: string) => {
  const left: Array<string> = []
  for (let i = 0; i + 6 <= secret.length; i++) if (text.includes(secret.slice(i, i + 6))) left.push(secret.slice(i, i + 6))
  return left
}

describe("secretRedactor", () => {
  const redact = secretRedactor([SECRET])

  it("removes the whole secret, its middle, its end and every 6-character window", () => {
    const windows = Array.from({ length: SECRET.length - 5 }, (_, i) => SECRET.slice(i, i + 6))
    const text = [
      `Incorrect API key provided: ${SECRET}.`,
      `key ${SECRET.slice(9, 21)} is wrong`,
      `ends with ${SECRET.slice(-10)}`,
      windows.join(" "),
      windows.join("")
    ].join("\n")
    const out = redact(text)
    expect(runsLeft(out, SECRET)).toEqual([])
    expect(out).toContain(`Incorrect API key provided: ${REDACTED}.`)
    expect(out).toContain(`key ${REDACTED} is wrong`)
    expect(out).toContain(`ends with ${REDACTED}`)
  })

  it("leaves runs of 5 characters and unrelated text as they are", () => {
    const five = `${SECRET.slice(3, 8)} and ${SECRET.slice(20, 25)}`
    expect(redact(five)).toBe(five)
    expect(redact("nothing to see")).toBe("nothing to see")
  })

  it("redacts before any clip: a secret straddling the clip point leaves no run", () => {
    const text = "y".repeat(495) + SECRET + "z".repeat(100)
    const out = clip(redact(text), 500)
    expect(runsLeft(out, SECRET)).toEqual([])
  })

  it("several secrets at once; a secret under 6 characters only where it appears whole", () => {
    const other = "AbCdEfGhIjKlMnOp"
    const both = secretRedactor([SECRET, other, "xyz12", ""])
    const out = both(`${SECRET.slice(4, 14)} ${other.slice(2, 9)} xyz12 xyz1`)
    expect(out).toBe(`${REDACTED} ${REDACTED} ${REDACTED} xyz1`)
  })

  it("reads at most 64 KiB and is linear: a 64 KiB body of near misses is redacted quickly", () => {
    const nearMiss = SECRET.slice(0, 5) + "!"
    const text = nearMiss.repeat(Math.ceil(MAX_REDACTED_CHARS / nearMiss.length)) + SECRET
    const started = performance.now()
    const out = redact(text + SECRET)
    expect(performance.now() - started).toBeLessThan(200)
    expect(out.length).toBeLessThanOrEqual(MAX_REDACTED_CHARS)
    expect(runsLeft(out, SECRET)).toEqual([])
  })
})

describe("escapeControl and logText", () => {
  it("escapes C0, DEL, C1, ESC sequences, U+2028/2029 and bidi controls", () => {
    const text = "a\nb\rc\td\u0000e\u001b[31mf\u007fg\u0085h\u009b2Ji\u2028j\u2029k\u202el\u2066m\u200fn\u061co"
    const out = escapeControl(text)
    expect(hasControl(out)).toBe(false)
    expect(out).toBe(
      "a\\nb\\rc\\td\\x00e\\x1b[31mf\\x7fg\\x85h\\x9b2Ji\\u2028j\\u2029k\\u202el\\u2066m\\u200fn\\u061co"
    )
    expect(escapeControl("한국어 text, unchanged")).toBe("한국어 text, unchanged")
  })

  it("clips without splitting a surrogate pair and says how much was cut", () => {
    expect(clip("abcdef", 10)).toBe("abcdef")
    expect(clip("abcdef", 3)).toBe("abc...(3 more)")
    expect(clip("ab😀cd", 3)).toBe("ab...(4 more)")
    expect(logText("\n".repeat(5_000), 100)).toBe("\\n".repeat(100) + "...(4900 more)")
  })
})
