/**
 * The lean frame decoding (`LeanScanner` + templates) must give exactly what JSON.parse gives: every
 * case runs through a lean normalizer and a reference one (`new ChatNormalizer(false)`) and compares
 * events, finish, errors, skipped frames and thrown exceptions.
 */
import { describe, expect, it } from "vitest"
import { ChatNormalizer } from "../../src/upstream/openai-compatible/Normalize.js"
import type { UpstreamError, UpstreamEvent } from "../../src/upstream/Upstream.js"

const head = `{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1767225600,"model":"m",`
const delta = (d: string, finish = "null") => `${head}"choices":[{"index":0,"delta":${d},"finish_reason":${finish}}]}`

interface ErrorOutcome {
  readonly kind: UpstreamError["kind"]
  readonly detail: string
}

const errorOutcome = (error: UpstreamError | undefined): ErrorOutcome | undefined =>
  error === undefined ? undefined : { kind: error.kind, detail: error.detail }

interface Outcome {
  readonly events: unknown
  readonly error: ErrorOutcome | undefined
  readonly skipped: number
  readonly sawDone: boolean
  readonly end: ErrorOutcome | undefined
  readonly threw: string | undefined
}

/** Tool call ids are random: compared by form only. */
const sameIds = (events: ReadonlyArray<UpstreamEvent>) =>
  events.map((e) => (e._tag === "ToolCallStart" && /^call_[0-9a-f]{32}$/.test(e.id) ? { ...e, id: "call_<id>" } : e))

const run = (lean: boolean, frames: ReadonlyArray<string>): Outcome => {
  const n = new ChatNormalizer(lean)
  let threw: string | undefined
  try {
    for (const f of frames) n.onData(f)
  } catch (e) {
    threw = (e as Error).constructor.name
  }
  const before = [...n.events]
  const error = errorOutcome(n.error)
  const end = threw === undefined ? errorOutcome(n.end()) : undefined
  return { events: [before, n.events].map(sameIds), error, skipped: n.skipped, sawDone: n.sawDone, end, threw }
}

const same = (frames: ReadonlyArray<string>) => {
  const reference = run(false, frames)
  expect(run(true, frames), JSON.stringify(frames)).toEqual(reference)
  return reference
}

describe("lean frame decoding", () => {
  it("decodes content, reasoning and finish frames like JSON.parse, using templates", () => {
    const frames = [
      delta(`{"role":"assistant","content":""}`),
      delta(`{"reasoning_content":"Let me "}`),
      delta(`{"reasoning_content":"think \\"hard\\"\\n"}`),
      delta(`{"reasoning":"also \\u00e9\\ud83d\\udc4b"}`),
      delta(`{"content":"Hello"}`),
      delta(`{"content":" w\\u006frld \\/ \\\\ \\b\\f\\r\\t"}`),
      delta(`{"content":""}`),
      delta(`{"reasoning_content":"late reasoning is dropped"}`),
      delta(`{"content":"héllo 👋"}`),
      delta(`{}`, `"length"`),
      "[DONE]"
    ]
    const outcome = same(frames)
    expect(outcome.events).toEqual([[
      { _tag: "Reasoning", text: "Let me " },
      { _tag: "Reasoning", text: "think \"hard\"\n" },
      { _tag: "Reasoning", text: "also é👋" },
      { _tag: "Content", text: "Hello" },
      { _tag: "Content", text: " world / \\ \b\f\r\t" },
      { _tag: "Content", text: "héllo 👋" }
    ], [
      { _tag: "Reasoning", text: "Let me " },
      { _tag: "Reasoning", text: "think \"hard\"\n" },
      { _tag: "Reasoning", text: "also é👋" },
      { _tag: "Content", text: "Hello" },
      { _tag: "Content", text: " world / \\ \b\f\r\t" },
      { _tag: "Content", text: "héllo 👋" },
      { _tag: "Finish", reason: "length" }
    ]])
  })

  it("falls back to JSON.parse for everything that is not a plain delta, with the same result", () => {
    const cases: Array<ReadonlyArray<string>> = [
      // usage, errors, tool calls
      [delta(`{"content":"a"}`), `${head}"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}`],
      [`${head}"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":null}`],
      [`${head}"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"error":null}`],
      [`${head}"error":{"message":"boom"}}`],
      [`{"error":"plain"}`],
      [delta(`{"tool_calls":[{"index":0,"id":"x","type":"function","function":{"name":"f","arguments":"{}"}}]}`)],
      [delta(`{"content":"a","tool_calls":null}`)],
      [delta(`{"content":"a","tool_calls":null,"tool_calls":[{"index":0,"id":"x","function":{"name":"f"}}]}`)],
      // duplicate and escaped keys: the last value wins in JSON.parse
      [delta(`{"content":"a","content":"b"}`)],
      [delta(`{"cont\\u0065nt":"a"}`)],
      [`${head}"choices":[{"index":0,"delta":{"content":"a"}}],"choices":[]}`],
      [`${head}"choices":[{"delta":{"content":"a"},"delta":{"content":"b"}}]}`],
      [`${head}"choices":[{"delta":{"content":"a"},"finish_reason":"stop","finish_reason":null}]}`],
      [`${head}"choices":[{"delta":{"content":"a"},"fin\\u0069sh_reason":"length"}]}`],
      [delta(`{"reasoning_content":null,"reasoning":"r"}`)],
      [delta(`{"reasoning_content":"","reasoning":"r"}`)],
      [delta(`{"reasoning_content":"a","reasoning":"r","content":"c"}`)],
      // odd types
      [delta(`{"content":5}`)],
      [delta(`{"content":["a"]}`)],
      [delta(`"text"`)],
      [delta(`null`)],
      [delta(`false`)],
      [`${head}"choices":[null]}`],
      [`${head}"choices":[5]}`],
      [`${head}"choices":{"0":{"delta":{"content":"a"}}}}`],
      [`${head}"choices":null}`],
      [`${head}"choices":[{"delta":{"content":"a"},"finish_reason":5}]}`],
      [`${head}"choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}},null,[1,{"x":[]}]]}`],
      [`[1,2]`],
      [`"just a string"`],
      [`42`],
      [`null`],
      // whitespace and numbers
      [` \t\r\n{ "choices" : [ { "delta" : { "content" : "a" } , "finish_reason" : null } ] } \n`],
      [`{"n":[0,-0,1.5,-2e10,3E+2,4e-1,123456789012345678901234567890],"choices":[{"delta":{"content":"a"}}]}`],
      [`{"t":true,"f":false,"z":null,"o":{"a":{"b":{"c":[[[]]]}}},"choices":[{"delta":{"content":"a"}}]}`],
      // not JSON: skipped
      [`{"choices":[{"delta":{"content":"a"}}],}`],
      [`{"choices":[{"delta":{"content":"a"}},]}`],
      [`{"n":01,"choices":[{"delta":{"content":"a"}}]}`],
      [`{"n":1.,"choices":[{"delta":{"content":"a"}}]}`],
      [`{"n":.5,"choices":[{"delta":{"content":"a"}}]}`],
      [`{"n":-,"choices":[{"delta":{"content":"a"}}]}`],
      [`{"n":1e,"choices":[{"delta":{"content":"a"}}]}`],
      [`{"n":+1,"choices":[{"delta":{"content":"a"}}]}`],
      [`{"n":tru,"choices":[{"delta":{"content":"a"}}]}`],
      [`{"n":nul,"choices":[{"delta":{"content":"a"}}]}`],
      [`{"choices":[{"delta":{"content":"a\\x"}}]}`],
      [`{"choices":[{"delta":{"content":"a\\u12"}}]}`],
      [`{"choices":[{"delta":{"content":"a\\u12G4"}}]}`],
      [`{"choices":[{"delta":{"content":"tab\there"}}]}`],
      [`{"choices":[{"delta":{"content":"a"}}]} x`],
      [`{"choices":[{"delta":{"content":"a"}}]}{}`],
      [`{"choices":[{"delta":{"content":"a}}]}`],
      [`{"choices":[{"delta":{"content":"a"}}]`],
      [`{'choices':[]}`],
      [`\uFEFF{"choices":[{"delta":{"content":"a"}}]}`],
      [`{"deep":${"[".repeat(200)}${"]".repeat(200)},"choices":[{"delta":{"content":"a"}}]}`],
      [`{"deep":${"[".repeat(200)}${"]".repeat(199)},"choices":[{"delta":{"content":"a"}}]}`],
      [""],
      ["{}"]
    ]
    for (const frames of cases) same(frames)
  })

  it("only reuses a template for exactly one string token between its prefix and suffix", () => {
    const base = delta(`{"content":"first"}`)
    same([
      base,
      delta(`{"content":"a","content":"b"}`),
      delta(`{"content":"a" }`),
      delta(`{"content":"a\\"}`),
      delta(`{"content":"a"+"b"}`),
      delta(`{"content":"a\\u0022}`),
      delta(`{"content":"\\u0022"}`),
      delta(`{"content":null}`),
      delta(`{"content":""}`),
      delta(`{"content":"x\ny"}`),
      delta(`{"content":"ok"}`),
      delta(`{"reasoning_content":"r1"}`),
      delta(`{"reasoning_content":"r2","content":"c"}`),
      delta(`{"reasoning_content":"r3"}`),
      delta(`{"content":"c2"}`, `"stop"`),
      delta(`{"content":"c3"}`)
    ])
  })

  it("agrees with JSON.parse on randomly mutated frames (seeded)", () => {
    let seed = 12345
    const random = () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0
      return seed / 4294967296
    }
    const pick = <A>(items: ReadonlyArray<A>): A => items[Math.floor(random() * items.length)]!
    const samples = [
      delta(`{"role":"assistant","content":""}`),
      delta(`{"content":"Hello \\"you\\" \\u00e9"}`),
      delta(`{"reasoning_content":"hmm"}`),
      delta(`{"reasoning":"hmm","content":null}`),
      delta(`{}`, `"stop"`),
      `${head}"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
      delta(`{"tool_calls":[{"index":0,"function":{"arguments":"{\\"a\\":1}"}}]}`),
      `{"choices":[{"delta":{"content":"x"},"logprobs":{"content":[{"token":"x","logprob":-0.5e-3}]}}],"usage":null}`
    ]
    const alphabet = [..."{}[]:,\"\\ 0123456789-+.eEtrufalsn\n\tuxcontent"]
    const mutate = (s: string): string => {
      const at = Math.floor(random() * (s.length + 1))
      switch (Math.floor(random() * 4)) {
        case 0:
          return s.slice(0, at) + s.slice(at + 1)
        case 1:
          return s.slice(0, at) + pick(alphabet) + s.slice(at)
        case 2:
          return s.slice(0, at) + pick(alphabet) + s.slice(at + 1)
        default: {
          const to = Math.min(s.length, at + Math.floor(random() * 12))
          return s.slice(0, to) + s.slice(at, to) + s.slice(to)
        }
      }
    }
    let parsedOk = 0
    for (let i = 0; i < 4000; i++) {
      const frames: Array<string> = []
      const length = 1 + Math.floor(random() * 6)
      for (let j = 0; j < length; j++) {
        let frame = pick(samples)
        const edits = random() < 0.3 ? 0 : 1 + Math.floor(random() * 3)
        for (let k = 0; k < edits; k++) frame = mutate(frame)
        frames.push(frame)
      }
      const outcome = same(frames)
      if (outcome.skipped < frames.length) parsedOk++
    }
    // The corpus exercises both decodable and undecodable frames.
    expect(parsedOk).toBeGreaterThan(1000)
  })
})
