/**
 * The OpenAI-compatible adapter's Stream-free APIs, over real HTTP: `complete` (one Effect with the
 * whole answer) and `open` (push-based, sink callbacks, back-pressure).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Logger } from "effect"
import { TestClock } from "effect/testing"
import * as Http from "node:http"
import * as Net from "node:net"
import {
  type OpenAiCompatibleProviderConfig,
  openAiCompatibleAdapter
} from "../../src/upstream/openai-compatible/Adapter.js"
import type {
  UpstreamCall,
  UpstreamError,
  UpstreamEvent,
  UpstreamRequest,
  UpstreamSink
} from "../../src/upstream/Upstream.js"
import { completeChat } from "../../src/upstream/Complete.js"
import { Behaviour, Chunks, type MockUpstream, raw, startMockUpstream } from "../support/MockUpstream.js"

type Timeouts = OpenAiCompatibleProviderConfig["timeouts"]

const mockUpstream = Effect.acquireRelease(
  Effect.promise(() => startMockUpstream()),
  (mock) => Effect.promise(() => mock.close())
)

const providerFor = (baseUrl: string, timeouts: Partial<Timeouts> = {}): OpenAiCompatibleProviderConfig => ({
  kind: "openai-compatible",
  base_url: baseUrl,
  connections: 4,
  timeouts: { connect_ms: 2_000, first_token_ms: 5_000, idle_ms: 5_000, total_ms: 10_000, ...timeouts }
})

const setup = (options: { timeouts?: Partial<Timeouts> } = {}) =>
  Effect.gen(function*() {
    const mock = yield* mockUpstream
    const adapter = yield* openAiCompatibleAdapter(providerFor(mock.url, options.timeouts))
    return { mock, adapter }
  })

const ask = (extra: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
  model: "up-model",
  stream: true,
  max_tokens: 100,
  messages: [{ role: "user", content: "hi" }],
  ...extra
})

/** Real-time polling (HTTP happens outside the Effect clock). */
const until = (condition: () => boolean, what = "condition") =>
  Effect.promise(() =>
    new Promise<void>((resolve, reject) => {
      const started = Date.now()
      const check = () => {
        if (condition()) return resolve()
        if (Date.now() - started > 5_000) return reject(new Error(`${what} not met within 5 s`))
        setTimeout(check, 5)
      }
      check()
    })
  )

const realSleep = (ms: number) => Effect.promise(() => new Promise((resolve) => setTimeout(resolve, ms)))

const waitAborts = (mock: MockUpstream, n: number) => Effect.promise(() => mock.waitForClientAborts(n))

const closedPort = Effect.promise(() =>
  new Promise<number>((resolve) => {
    const server = Net.createServer().listen(0, "127.0.0.1", () => {
      const port = (server.address() as Net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })
)

/** A TCP server that accepts connections and never answers (a TLS handshake never completes). */
const silentServer = Effect.acquireRelease(
  Effect.promise(() =>
    new Promise<{ server: Net.Server; sockets: Array<Net.Socket> }>((resolve) => {
      const sockets: Array<Net.Socket> = []
      const server = Net.createServer((s) => void sockets.push(s)).listen(0, "127.0.0.1", () =>
        resolve({ server, sockets }))
    })
  ),
  ({ server, sockets }) => Effect.sync(() => (sockets.forEach((s) => s.destroy()), server.close()))
)

/** A sink that records everything, including callbacks made after it should have stopped. */
const recorder = (onEvents: (events: ReadonlyArray<UpstreamEvent>) => boolean = () => true) => {
  const events: Array<UpstreamEvent> = []
  const batches: Array<number> = []
  const errors: Array<UpstreamError> = []
  let ends = 0
  let settle: () => void = () => {}
  const settled = new Promise<void>((resolve) => (settle = resolve))
  const sink: UpstreamSink = {
    onEvents(batch) {
      batches.push(batch.length)
      events.push(...batch)
      return onEvents(batch)
    },
    onEnd() {
      ends++
      settle()
    },
    onError(error) {
      errors.push(error)
      settle()
    }
  }
  return {
    sink,
    events,
    batches,
    errors,
    ends: () => ends,
    callbacks: () => batches.length + ends + errors.length,
    settled: Effect.promise(() => settled)
  }
}

type Recorder = ReturnType<typeof recorder>

/** Opens, takes `first`, resumes, and waits for the end or the error. */
const drain = (call: UpstreamCall, rec: Recorder) =>
  Effect.gen(function*() {
    rec.events.unshift(...call.first)
    call.resume()
    yield* rec.settled
    return rec.events
  })

const usage = { prompt: 12, completion: 34, reasoning: 5, cached: 6 }
const normalizedUsage = { prompt_tokens: 12, completion_tokens: 34, reasoning_tokens: 5, cached_tokens: 6 }

// ---------------------------------------------------------------------------------------------

describe("openai-compatible adapter: complete", () => {
  it.live("normalizes a JSON answer: reasoning, content, tool calls with normalized ids, finish, usage", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.json(Chunks.completion({
        reasoning: "hmm",
        content: "Sure.",
        tool_calls: [{ id: "toolu_1", name: "f", arguments: "{\"a\":1}" }, {
          id: "call_0123456789abcdef0123456789abcdef",
          name: "g",
          arguments: "{}"
        }],
        finish: "stop",
        usage
      })))
      const events = yield* completeChat(adapter, ask({ stream: false }))
      expect(mock.requests[0]!.body.stream).toBe(false)
      expect(mock.requests[0]!.body).not.toHaveProperty("stream_options")
      expect(mock.requests[0]!.headers.accept).toBe("application/json")
      expect(events).toEqual([
        { _tag: "Reasoning", text: "hmm" },
        { _tag: "Content", text: "Sure." },
        { _tag: "ToolCallStart", index: 0, id: expect.stringMatching(/^call_[0-9a-f]{32}$/), name: "f" },
        { _tag: "ToolCallArgs", index: 0, fragment: "{\"a\":1}" },
        { _tag: "ToolCallStart", index: 1, id: "call_0123456789abcdef0123456789abcdef", name: "g" },
        { _tag: "ToolCallArgs", index: 1, fragment: "{}" },
        // A forced tool call answered with "stop" is a tool_calls finish.
        { _tag: "Finish", reason: "tool_calls" },
        { _tag: "Usage", usage: normalizedUsage }
      ])
    }))

  it.live("collects a streamed answer when the request asks for one", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.slow([
        Chunks.role(),
        Chunks.reasoning("a"),
        Chunks.content("b"),
        Chunks.content("c"),
        Chunks.finish("length"),
        Chunks.usage(usage)
      ], 5))
      const events = yield* completeChat(adapter, ask())
      expect(mock.requests[0]!.headers.accept).toBe("text/event-stream")
      expect(events).toEqual([
        { _tag: "Reasoning", text: "a" },
        { _tag: "Content", text: "b" },
        { _tag: "Content", text: "c" },
        { _tag: "Finish", reason: "length" },
        { _tag: "Usage", usage: normalizedUsage }
      ])
    }))

  it.live("logs skipped undecodable frames", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const logs: Array<string> = []
      const logger = Logger.make(({ message }) => {
        logs.push(Array.isArray(message) ? message.join(" ") : String(message))
      })
      mock.script(Behaviour.stream([Chunks.content("a"), "{broken json", Chunks.finish("stop")]))
      const events = yield* completeChat(adapter, ask()).pipe(Effect.provide(Logger.layer([logger])))
      expect(events.map((e) => e._tag)).toEqual(["Content", "Finish"])
      expect(logs.some((l) => l.includes("undecodable"))).toBe(true)
    }))

  it.live("maps status answers: 429 rate_limited, other non-2xx status with the upstream message", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(
        Behaviour.rateLimited("slow down"),
        Behaviour.status(503, { error: { message: "overloaded" } }),
        Behaviour.status(400, "plain text problem")
      )
      const request = ask({ stream: false })
      const limited = yield* Effect.flip(completeChat(adapter, request))
      expect(limited).toMatchObject({ _tag: "UpstreamError", kind: "rate_limited", status: 429 })
      expect(limited.detail).toContain("slow down")
      const unavailable = yield* Effect.flip(completeChat(adapter, request))
      expect(unavailable).toMatchObject({ kind: "status", status: 503 })
      expect(unavailable.detail).toContain("overloaded")
      const bad = yield* Effect.flip(completeChat(adapter, request))
      expect(bad).toMatchObject({ kind: "status", status: 400 })
      expect(bad.detail).toContain("plain text problem")
    }))

  it.live("connection failures: refused and dropped before headers are connect errors", () =>
    Effect.gen(function*() {
      const refused = yield* openAiCompatibleAdapter(providerFor(`http://127.0.0.1:${yield* closedPort}/v1`))
      const error = yield* Effect.flip(completeChat(refused, ask({ stream: false })))
      expect(error.kind).toBe("connect")
      expect(error.detail).toContain("ECONNREFUSED")

      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.dropBeforeHeaders())
      expect((yield* Effect.flip(completeChat(adapter, ask({ stream: false })))).kind).toBe("connect")
    }))

  it.live("bad bodies are protocol errors: not JSON, no message, error, dropped mid-body, cut stream", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(
        Behaviour.json("{\"choices\": ["),
        Behaviour.json({ choices: [] }),
        Behaviour.json({ error: { message: "backend crashed" } }),
        Behaviour.stream([raw("{\"choices\":[{\"message\"")], {
          then: "drop",
          done: false,
          contentType: "application/json"
        }),
        Behaviour.stream([Chunks.content("a")], { done: false })
      )
      const request = ask({ stream: false })
      const json = yield* Effect.flip(completeChat(adapter, request))
      expect(json).toMatchObject({ kind: "protocol" })
      expect(json.detail).toContain("not JSON")
      expect(yield* Effect.flip(completeChat(adapter, request))).toMatchObject({
        kind: "protocol",
        detail: "answer has no choices[0].message"
      })
      const crashed = yield* Effect.flip(completeChat(adapter, request))
      expect(crashed).toMatchObject({ kind: "protocol" })
      expect(crashed.detail).toContain("backend crashed")
      const dropped = yield* Effect.flip(completeChat(adapter, request))
      expect(dropped).toMatchObject({ kind: "protocol" })
      expect(dropped.detail).toContain("connection lost mid-answer")
      expect(yield* Effect.flip(completeChat(adapter, ask()))).toMatchObject({
        kind: "protocol",
        detail: "upstream ended the stream before finishing"
      })
    }))

  it.live("first_token_ms runs until the headers of a non-streamed answer", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 150, idle_ms: 1_000 } })
      mock.script(
        Behaviour.hangBeforeHeaders(),
        // Headers at once, body after 300 ms: longer than first_token_ms, shorter than idle_ms.
        Behaviour.stream([raw(JSON.stringify(Chunks.completion({ content: "late" })))], {
          firstDelayMs: 300,
          done: false,
          contentType: "application/json"
        })
      )
      const started = Date.now()
      const error = yield* Effect.flip(completeChat(adapter, ask({ stream: false })))
      expect(error).toMatchObject({ kind: "timeout", detail: "no first token within 150 ms" })
      expect(Date.now() - started).toBeGreaterThanOrEqual(140)
      yield* waitAborts(mock, 1)
      expect(yield* completeChat(adapter, ask({ stream: false }))).toEqual([
        { _tag: "Content", text: "late" },
        { _tag: "Finish", reason: "stop" }
      ])
    }))

  it.live("idle_ms and total_ms", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { idle_ms: 150, total_ms: 400 } })
      const json = { then: "hang", done: false, contentType: "application/json" } as const
      mock.script(
        Behaviour.stream([raw("{\"choices\":")], json),
        Behaviour.stream(Array.from({ length: 40 }, () => raw(" ")), { delayMs: 40, contentType: "application/json" })
      )
      const idle = yield* Effect.flip(completeChat(adapter, ask({ stream: false })))
      expect(idle).toMatchObject({ kind: "timeout", detail: "upstream idle for 150 ms" })
      yield* waitAborts(mock, 1)
      const total = yield* Effect.flip(completeChat(adapter, ask({ stream: false })))
      expect(total).toMatchObject({ kind: "timeout", detail: "answer took longer than 400 ms" })
      yield* waitAborts(mock, 2)
    }))

  it.live("connect_ms: a TLS handshake that never completes", () =>
    Effect.gen(function*() {
      const { server } = yield* silentServer
      const port = (server.address() as Net.AddressInfo).port
      const adapter = yield* openAiCompatibleAdapter(providerFor(`https://127.0.0.1:${port}/v1`, { connect_ms: 150 }))
      const error = yield* Effect.flip(completeChat(adapter, ask({ stream: false })))
      expect(error).toMatchObject({ kind: "timeout" })
      expect(error.detail).toContain("connect timed out after 150 ms")
    }))

  it.effect("first_token_ms on the TestClock", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 3_000, idle_ms: 10_000 } })
      mock.script(Behaviour.hangBeforeHeaders())
      const fiber = yield* Effect.forkChild(Effect.flip(completeChat(adapter, ask({ stream: false }))))
      yield* until(() => mock.requests.length === 1)
      yield* TestClock.adjust("2999 millis")
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("1 millis")
      expect(yield* Fiber.join(fiber)).toMatchObject({ kind: "timeout", detail: "no first token within 3000 ms" })
    }))

  it.live("interruption aborts the upstream request", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.hangBeforeHeaders())
      const fiber = yield* Effect.forkChild(completeChat(adapter, ask({ stream: false })))
      yield* until(() => mock.requests.length === 1)
      yield* Fiber.interrupt(fiber)
      yield* waitAborts(mock, 1)
    }))

  it.live("keeps pooled connections alive", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.json(Chunks.completion({ content: "x" })))
      for (let i = 0; i < 5; i++) yield* completeChat(adapter, ask({ stream: false }))
      // The Effect may resume before undici has put the connection back: a second one may open.
      expect(mock.connections().closed).toBe(0)
      expect(mock.connections().opened).toBeLessThanOrEqual(2)
    }))
})

// ---------------------------------------------------------------------------------------------

describe("openai-compatible adapter: open", () => {
  it.live("delivers normalized events in order: first, then the sink after resume(), then onEnd", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.slow([
        Chunks.role(),
        Chunks.reasoning("Let me "),
        Chunks.reasoning("think.", "reasoning"),
        Chunks.toolStart(0, "toolu_abc", "get_weather"),
        Chunks.toolArgs(0, "{\"city\":"),
        Chunks.toolStart(1, "call_0123456789abcdef0123456789abcdef", "search", "{\"q\""),
        Chunks.toolArgs(0, "\"Paris\"}"),
        Chunks.toolArgs(1, ":\"x\"}"),
        Chunks.finish("tool_calls"),
        Chunks.usage(usage)
      ], 5))
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink)
      expect(call.first.length).toBeGreaterThan(0)
      expect(call.first[0]).toEqual({ _tag: "Reasoning", text: "Let me " })
      // Nothing reaches the sink before the first resume(), though more frames arrive meanwhile.
      yield* realSleep(100)
      expect(rec.callbacks()).toBe(0)
      const events = yield* drain(call, rec)
      expect(events).toEqual([
        { _tag: "Reasoning", text: "Let me " },
        { _tag: "Reasoning", text: "think." },
        { _tag: "ToolCallStart", index: 0, id: expect.stringMatching(/^call_[0-9a-f]{32}$/), name: "get_weather" },
        { _tag: "ToolCallArgs", index: 0, fragment: "{\"city\":" },
        { _tag: "ToolCallStart", index: 1, id: "call_0123456789abcdef0123456789abcdef", name: "search" },
        { _tag: "ToolCallArgs", index: 1, fragment: "{\"q\"" },
        { _tag: "ToolCallArgs", index: 0, fragment: "\"Paris\"}" },
        { _tag: "ToolCallArgs", index: 1, fragment: ":\"x\"}" },
        { _tag: "Finish", reason: "tool_calls" },
        { _tag: "Usage", usage: normalizedUsage }
      ])
      expect(rec.batches.every((n) => n > 0)).toBe(true)
      yield* realSleep(50)
      expect(rec.ends()).toBe(1)
      expect(rec.errors).toEqual([])
      // abort() after the end is a no-op: the connection stays pooled.
      call.abort()
      call.abort()
      expect(mock.connections().closed).toBe(0)
    }))

  it.live("a whole answer in one read: everything in first, onEnd at resume(); a JSON answer too", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(
        Behaviour.stream([Chunks.content("a"), Chunks.content("b"), Chunks.finish("stop")]),
        Behaviour.json(Chunks.completion({ content: "whole", usage }))
      )
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink)
      yield* until(() => mock.requests.length === 1)
      const events = yield* drain(call, rec)
      expect(events).toEqual([
        { _tag: "Content", text: "a" },
        { _tag: "Content", text: "b" },
        { _tag: "Finish", reason: "stop" }
      ])
      expect(rec.ends()).toBe(1)

      const rec2 = recorder()
      const call2 = yield* adapter.open(ask({ stream: false }), rec2.sink)
      expect(call2.first).toEqual([
        { _tag: "Content", text: "whole" },
        { _tag: "Finish", reason: "stop" },
        { _tag: "Usage", usage: normalizedUsage }
      ])
      expect(rec2.callbacks()).toBe(0)
      call2.resume()
      expect(rec2.batches).toEqual([])
      expect(rec2.ends()).toBe(1)
    }))

  it.live("the HTTP chunks of one read reach the consumer together: in first, then in one onEvents", () =>
    Effect.gen(function*() {
      // An upstream that writes a chunk per event, several chunks per socket write (one read on loopback).
      const chunk = (text: string) => {
        const data = `data: ${JSON.stringify(Chunks.content(text))}\n\n`
        return `${Buffer.byteLength(data).toString(16)}\r\n${data}\r\n`
      }
      const group = (from: number) => ["a", "b", "c", "d", "e"].map((t) => chunk(`${t}${from}`)).join("")
      let socket: Net.Socket | undefined
      const server = yield* Effect.acquireRelease(
        Effect.promise(() =>
          new Promise<Net.Server>((resolve) => {
            const s = Net.createServer((c) => {
              socket = c
              c.once("data", () =>
                c.write(
                  "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + group(1)
                ))
            }).listen(0, "127.0.0.1", () => resolve(s))
          })
        ),
        (s) => Effect.promise(() => new Promise<void>((resolve) => { socket?.destroy(); s.close(() => resolve()) }))
      )
      const port = (server.address() as Net.AddressInfo).port
      const adapter = yield* openAiCompatibleAdapter(providerFor(`http://127.0.0.1:${port}/v1`))
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink)
      expect(call.first).toEqual(["a1", "b1", "c1", "d1", "e1"].map((text) => ({ _tag: "Content", text })))
      call.resume()
      socket!.write(group(2))
      yield* until(() => rec.batches.length > 0, "a batch")
      socket!.write("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
      yield* rec.settled
      // The five chunks of the second write in one batch (then what the end adds, in its own).
      expect(rec.batches[0]).toBe(5)
      expect(rec.events.slice(0, 5)).toEqual(["a2", "b2", "c2", "d2", "e2"].map((text) => ({ _tag: "Content", text })))
      expect(rec.ends()).toBe(1)
    }))

  it.live("failures before the first event fail the Effect and never call the sink", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 150, idle_ms: 1_000 } })
      mock.script(
        Behaviour.rateLimited("slow down"),
        Behaviour.status(502, { error: { message: "bad gateway" } }),
        Behaviour.dropBeforeHeaders(),
        Behaviour.dropAfter([Chunks.role()]),
        Behaviour.hangAfter([Chunks.role()]),
        Behaviour.stream([{ error: { message: "no capacity" } }])
      )
      const rec = recorder()
      expect(yield* Effect.flip(adapter.open(ask(), rec.sink))).toMatchObject({ kind: "rate_limited", status: 429 })
      expect(yield* Effect.flip(adapter.open(ask(), rec.sink))).toMatchObject({ kind: "status", status: 502 })
      expect(yield* Effect.flip(adapter.open(ask(), rec.sink))).toMatchObject({ kind: "connect" })
      expect(yield* Effect.flip(adapter.open(ask(), rec.sink))).toMatchObject({
        kind: "protocol",
        detail: expect.stringContaining("connection lost mid-answer")
      })
      expect(yield* Effect.flip(adapter.open(ask(), rec.sink))).toMatchObject({
        kind: "timeout",
        detail: "no first token within 150 ms"
      })
      yield* waitAborts(mock, 1)
      expect(yield* Effect.flip(adapter.open(ask(), rec.sink))).toMatchObject({
        kind: "protocol",
        detail: "upstream error: no capacity"
      })
      const refused = yield* openAiCompatibleAdapter(providerFor(`http://127.0.0.1:${yield* closedPort}/v1`))
      expect(yield* Effect.flip(refused.open(ask(), rec.sink))).toMatchObject({ kind: "connect" })
      yield* realSleep(50)
      expect(rec.callbacks()).toBe(0)
    }))

  it.live("a drop mid-stream: the events before it, then onError once", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.dropAfter([Chunks.content("a"), Chunks.content("b"), Chunks.content("c")]))
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink)
      yield* drain(call, rec)
      expect(rec.events).toEqual([
        { _tag: "Content", text: "a" },
        { _tag: "Content", text: "b" },
        { _tag: "Content", text: "c" }
      ])
      yield* realSleep(50)
      expect(rec.errors).toHaveLength(1)
      expect(rec.errors[0]).toMatchObject({ kind: "protocol" })
      expect(rec.errors[0]!.detail).toContain("connection lost mid-answer")
      expect(rec.ends()).toBe(0)
      call.abort()
      expect(rec.callbacks()).toBe(rec.batches.length + 1)
    }))

  it.live("an error frame and a stream cut short go to onError", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(
        Behaviour.slow([Chunks.content("a"), { error: { message: "backend crashed" } }], 20),
        Behaviour.stream([Chunks.content("a")], { delayMs: 20, done: false })
      )
      for (const expected of ["upstream error: backend crashed", "upstream ended the stream before finishing"]) {
        const rec = recorder()
        const call = yield* adapter.open(ask(), rec.sink)
        yield* drain(call, rec)
        expect(rec.events).toEqual([{ _tag: "Content", text: "a" }])
        expect(rec.errors).toEqual([expect.objectContaining({ kind: "protocol", detail: expected })])
        expect(rec.ends()).toBe(0)
      }
    }))

  it.live("idle_ms: silence after the first events goes to onError and aborts the upstream", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 5_000, idle_ms: 150 } })
      mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("a")]))
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink)
      const started = Date.now()
      yield* drain(call, rec)
      expect(Date.now() - started).toBeGreaterThanOrEqual(100)
      expect(rec.events).toEqual([{ _tag: "Content", text: "a" }])
      expect(rec.errors).toEqual([expect.objectContaining({ kind: "timeout", detail: "upstream idle for 150 ms" })])
      yield* waitAborts(mock, 1)
      yield* realSleep(50)
      expect(rec.errors).toHaveLength(1)
      expect(rec.ends()).toBe(0)
    }))

  it.live("total_ms: a steady stream that takes too long goes to onError", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { idle_ms: 5_000, total_ms: 300 } })
      mock.script(Behaviour.slow(Array.from({ length: 50 }, () => Chunks.content("x")), 40))
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink)
      yield* drain(call, rec)
      expect(rec.events.length).toBeGreaterThan(2)
      expect(rec.errors).toEqual([
        expect.objectContaining({ kind: "timeout", detail: "answer took longer than 300 ms" })
      ])
      yield* waitAborts(mock, 1)
    }))

  it.effect("idle_ms on the TestClock, after open resolved", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 60_000, idle_ms: 5_000 } })
      mock.script(Behaviour.hangAfter([Chunks.content("a")]))
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink)
      expect(call.first).toEqual([{ _tag: "Content", text: "a" }])
      call.resume()
      yield* TestClock.adjust("4 seconds")
      expect(rec.errors).toEqual([])
      yield* TestClock.adjust("2 seconds")
      yield* until(() => rec.errors.length > 0, "onError")
      expect(rec.errors).toEqual([expect.objectContaining({ kind: "timeout", detail: "upstream idle for 5000 ms" })])
      yield* waitAborts(mock, 1)
    }))

  it.effect("first_token_ms on the TestClock fails the Effect", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 3_000, idle_ms: 10_000 } })
      mock.script(Behaviour.hangAfter([Chunks.role()]))
      const rec = recorder()
      const fiber = yield* Effect.forkChild(Effect.flip(adapter.open(ask(), rec.sink)))
      yield* until(() => mock.requests.length === 1)
      yield* TestClock.adjust("2999 millis")
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("1 millis")
      expect(yield* Fiber.join(fiber)).toMatchObject({ kind: "timeout", detail: "no first token within 3000 ms" })
      expect(rec.callbacks()).toBe(0)
    }))

  it.live("abort() closes the upstream socket and stops every callback; it is idempotent", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.slow(Array.from({ length: 100 }, (_, i) => Chunks.content(`${i},`)), 10))
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink)
      call.resume()
      yield* until(() => rec.events.length >= 3, "3 events")
      call.abort()
      const seen = rec.callbacks()
      yield* waitAborts(mock, 1)
      yield* until(() => mock.connections().closed === 1, "socket closed")
      call.abort()
      call.resume()
      yield* realSleep(100)
      expect(rec.callbacks()).toBe(seen)
      expect(rec.ends()).toBe(0)
      expect(rec.errors).toEqual([])
    }))

  it.live("abort() from inside onEvents stops the batch loop at once", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const numbers = Array.from({ length: 20 }, (_, i) => Chunks.content(`${i}`))
      mock.script(Behaviour.slow([...numbers, Chunks.finish("stop")], 5))
      let call: UpstreamCall | undefined
      const rec = recorder(() => {
        call!.abort()
        return true
      })
      call = yield* adapter.open(ask(), rec.sink)
      yield* realSleep(60) // frames pile up while held
      call.resume()
      yield* waitAborts(mock, 1)
      yield* realSleep(50)
      expect(rec.batches).toHaveLength(1)
      expect(rec.ends()).toBe(0)
      expect(rec.errors).toEqual([])
    }))

  it.live("a resume() from inside onEvents cancels that call's false return", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const numbers = Array.from({ length: 10 }, (_, i) => Chunks.content(`${i}`))
      mock.script(Behaviour.slow([...numbers, Chunks.finish("stop")], 5))
      let call: UpstreamCall | undefined
      const rec = recorder(() => {
        call!.resume()
        return false
      })
      call = yield* adapter.open(ask(), rec.sink)
      const events = yield* drain(call, rec)
      expect(events).toHaveLength(11)
      expect(rec.ends()).toBe(1)
    }))

  it.live("a throwing sink aborts the call and the throw is logged", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const logs: Array<string> = []
      const logger = Logger.make(({ message }) => {
        logs.push(Array.isArray(message) ? message.join(" ") : String(message))
      })
      // "b" comes in a later read than "a": it reaches the sink (the events of one read come with the first).
      mock.script(Behaviour.stream([Chunks.content("a"), Chunks.content("b")], { delayMs: 50, then: "hang", done: false }))
      const rec = recorder(() => {
        throw new Error("consumer bug")
      })
      const call = yield* adapter.open(ask(), rec.sink).pipe(
        Effect.provide(Logger.layer([logger]))
      )
      call.resume()
      yield* waitAborts(mock, 1)
      yield* until(() => logs.some((l) => l.includes("sink callback threw")), "log")
      expect(rec.ends() + rec.errors.length).toBe(0)
    }))

  it.live("interrupting open before it resolves aborts the request, before or after the headers", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.hangBeforeHeaders(), Behaviour.hangAfter([Chunks.role()]))
      const rec = recorder()
      const waiting = yield* Effect.forkChild(adapter.open(ask(), rec.sink))
      yield* until(() => mock.requests.length === 1)
      yield* realSleep(20)
      expect(mock.clientAborts()).toBe(0)
      yield* Fiber.interrupt(waiting)
      expect(Exit.hasInterrupts(yield* Fiber.await(waiting))).toBe(true)
      yield* waitAborts(mock, 1)

      const headers = yield* Effect.forkChild(adapter.open(ask(), rec.sink))
      yield* until(() => mock.requests.length === 2)
      yield* realSleep(20)
      yield* Fiber.interrupt(headers)
      yield* waitAborts(mock, 2)
      expect(rec.callbacks()).toBe(0)
    }))

  it.live("logs skipped undecodable frames", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const logs: Array<string> = []
      const logger = Logger.make(({ message }) => {
        logs.push(Array.isArray(message) ? message.join(" ") : String(message))
      })
      mock.script(Behaviour.slow(["{broken", Chunks.content("a"), "{broken again", Chunks.finish("stop")], 10))
      const rec = recorder()
      const call = yield* adapter.open(ask(), rec.sink).pipe(
        Effect.provide(Logger.layer([logger]))
      )
      yield* drain(call, rec)
      expect(rec.events.map((e) => e._tag)).toEqual(["Content", "Finish"])
      yield* until(() => logs.filter((l) => l.includes("undecodable")).length === 2, "two warnings")
    }))
})

// ---------------------------------------------------------------------------------------------

/** An SSE upstream that writes `frames` content frames as fast as the socket takes them (honouring drain). */
const floodServer = (frames: number, text: string) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ url: string; written: () => number; total: number; server: Http.Server }>((resolve) => {
        const frame = (i: number) =>
          `data: ${JSON.stringify(Chunks.content(`${i}:${text}`))}\n\n`
        let total = 0
        for (let i = 0; i < frames; i++) total += Buffer.byteLength(frame(i))
        let written = 0
        const server = Http.createServer((req, res) => {
          req.resume()
          req.on("end", () => {
            res.writeHead(200, { "content-type": "text/event-stream" })
            let i = 0
            const pump = () => {
              while (i < frames) {
                const chunk = frame(i++)
                written += Buffer.byteLength(chunk)
                if (!res.write(chunk)) return void res.once("drain", pump)
              }
              res.end(`data: ${JSON.stringify(Chunks.finish("stop"))}\n\ndata: [DONE]\n\n`)
            }
            pump()
          })
        })
        server.listen(0, "127.0.0.1", () =>
          resolve({
            url: `http://127.0.0.1:${(server.address() as Net.AddressInfo).port}/v1`,
            written: () => written,
            total,
            server
          }))
      })
    ),
    ({ server }) =>
      Effect.promise(() =>
        new Promise<void>((resolve) => {
          server.closeAllConnections()
          server.close(() => resolve())
        })
      )
  )

describe("openai-compatible adapter: open back-pressure", () => {
  it.live("onEvents returning false pauses the socket read until resume(); nothing is delivered meanwhile", () =>
    Effect.gen(function*() {
      // About 64 MB: more than the loopback socket buffers on both sides can hold.
      const frames = 16_000
      const flood = yield* floodServer(frames, "x".repeat(4_000))
      // 64 MB through a loaded machine can take longer than the default total_ms of these tests (10 s).
      const adapter = yield* openAiCompatibleAdapter(providerFor(flood.url, { total_ms: 60_000 }))
      let paused = false
      let pausedOnce = false
      let deliveredWhilePaused = 0
      const rec = recorder((events) => {
        if (paused) deliveredWhilePaused += events.length
        if (!pausedOnce && rec.events.length >= 500) {
          pausedOnce = true
          paused = true
          return false
        }
        return true
      })
      const call = yield* adapter.open(ask(), rec.sink)
      rec.events.unshift(...call.first)
      call.resume()
      yield* until(() => paused, "pause")
      const eventsAtPause = rec.events.length
      // Let the socket buffers fill up, then check that the upstream is stuck.
      yield* realSleep(300)
      const stalled = flood.written()
      yield* realSleep(300)
      expect(flood.written()).toBe(stalled)
      expect(stalled).toBeLessThan(flood.total / 2)
      expect(rec.events.length).toBe(eventsAtPause)
      expect(deliveredWhilePaused).toBe(0)
      expect(rec.ends() + rec.errors.length).toBe(0)

      paused = false
      call.resume()
      yield* rec.settled
      expect(rec.errors).toEqual([])
      expect(rec.ends()).toBe(1)
      expect(flood.written()).toBe(flood.total)
      expect(rec.events).toHaveLength(frames + 1)
      for (let i = 0; i < frames; i++) {
        const e = rec.events[i]!
        if (e._tag !== "Content" || !e.text.startsWith(`${i}:`)) throw new Error(`event ${i} out of order`)
      }
      expect(rec.events[frames]).toEqual({ _tag: "Finish", reason: "stop" })
    }), { timeout: 30_000 })

  it.live("a paused consumer is not idle: only total_ms applies, its failure waits for resume()", () =>
    Effect.gen(function*() {
      const flood = yield* floodServer(16_000, "y".repeat(4_000))
      const adapter = yield* openAiCompatibleAdapter(providerFor(flood.url, { idle_ms: 100, total_ms: 600 }))
      const rec = recorder(() => false)
      const call = yield* adapter.open(ask(), rec.sink)
      call.resume()
      // Paused for longer than idle_ms: no idle timeout, and nothing delivered while paused.
      yield* realSleep(400)
      expect(rec.batches).toHaveLength(1)
      expect(rec.errors).toEqual([])
      yield* realSleep(400)
      // total_ms passed while paused: the failure waits until resume(), behind any held events.
      expect(rec.errors).toEqual([])
      for (let i = 0; i < 100 && rec.errors.length === 0; i++) call.resume()
      expect(rec.errors).toEqual([
        expect.objectContaining({ kind: "timeout", detail: "answer took longer than 600 ms" })
      ])
      expect(rec.ends()).toBe(0)
    }), { timeout: 30_000 })
})
