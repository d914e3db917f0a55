import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Logger, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as Net from "node:net"
import { type OpenAiCompatibleProviderConfig, openAiCompatibleAdapter } from "../../src/upstream/openai-compatible/Adapter.js"
import { encodeChatRequest } from "../../src/upstream/openai-compatible/Encode.js"
import type { UpstreamError, UpstreamEvent, UpstreamRequest } from "../../src/upstream/Upstream.js"
import { Behaviour, Chunks, type MockUpstream, raw, startMockUpstream } from "../support/MockUpstream.js"
import { upstreamStream } from "../support/UpstreamStream.js"

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

const setup = (options: { timeouts?: Partial<Timeouts>; apiKey?: string } = {}) =>
  Effect.gen(function*() {
    const mock = yield* mockUpstream
    const adapter = yield* openAiCompatibleAdapter(providerFor(mock.url, options.timeouts), options.apiKey)
    return { mock, adapter }
  })

const ask = (extra: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
  model: "up-model",
  stream: true,
  max_tokens: 100,
  messages: [{ role: "user", content: "hi" }],
  ...extra
})

const collect = <E>(stream: Stream.Stream<UpstreamEvent, E>): Effect.Effect<ReadonlyArray<UpstreamEvent>, E> =>
  Stream.runCollect(stream)

/** Real-time polling for a condition on the mock (HTTP happens outside the Effect clock). */
const until = (condition: () => boolean) =>
  Effect.promise(() =>
    new Promise<void>((resolve, reject) => {
      const started = Date.now()
      const check = () => {
        if (condition()) return resolve()
        if (Date.now() - started > 5_000) return reject(new Error("condition not met within 5 s"))
        setTimeout(check, 5)
      }
      check()
    })
  )

const waitAborts = (mock: MockUpstream, n: number) => Effect.promise(() => mock.waitForClientAborts(n))

const usage = { prompt: 12, completion: 34, reasoning: 5, cached: 6 }
const normalizedUsage = { prompt_tokens: 12, completion_tokens: 34, reasoning_tokens: 5, cached_tokens: 6 }

describe("openai-compatible adapter: events", () => {
  it.live("normalizes reasoning, content, finish and usage from a stream", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.stream([
        Chunks.role(),
        Chunks.reasoning("Let me "),
        Chunks.reasoning("think.", "reasoning"),
        Chunks.content("Hello"),
        Chunks.content(" world"),
        Chunks.finish("stop"),
        Chunks.usage(usage)
      ]))
      expect(yield* collect(upstreamStream(adapter, ask()))).toEqual([
        { _tag: "Reasoning", text: "Let me " },
        { _tag: "Reasoning", text: "think." },
        { _tag: "Content", text: "Hello" },
        { _tag: "Content", text: " world" },
        { _tag: "Finish", reason: "stop" },
        { _tag: "Usage", usage: normalizedUsage }
      ])
    }))

  it.live("sends only contract fields, stream_options and the bearer key", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ apiKey: "sk-upstream-1" })
      const request = {
        ...ask({
          temperature: 0.5,
          top_p: 0.9,
          stop: ["\n\n"],
          reasoning_effort: "low",
          tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }],
          tool_choice: "auto",
          parallel_tool_calls: false,
          messages: [
            { role: "user", content: "hi" },
            { role: "assistant", content: "prior", reasoning: "private" },
            { role: "user", content: "again" }
          ]
        }),
        seed: 42,
        n: 3
      } as UpstreamRequest
      yield* collect(upstreamStream(adapter, request))
      const recorded = mock.requests[0]!
      expect(recorded.method).toBe("POST")
      expect(recorded.path).toBe("/v1/chat/completions")
      expect(recorded.headers.authorization).toBe("Bearer sk-upstream-1")
      expect(recorded.headers.accept).toBe("text/event-stream")
      expect(recorded.body).toEqual({
        model: "up-model",
        messages: [
          { role: "user", content: "hi" },
          { role: "assistant", content: "prior" },
          { role: "user", content: "again" }
        ],
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 100,
        temperature: 0.5,
        top_p: 0.9,
        stop: ["\n\n"],
        reasoning_effort: "low",
        tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }],
        tool_choice: "auto",
        parallel_tool_calls: false
      })
      expect(JSON.parse(encodeChatRequest(ask({ stream: false })))).not.toHaveProperty("stream_options")
    }))

  it.live("normalizes tool call ids and streams start then argument fragments per index", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const kept = "call_0123456789abcdef0123456789abcdef"
      mock.script(Behaviour.stream([
        Chunks.role(),
        Chunks.toolStart(0, "toolu_abc", "get_weather"),
        Chunks.toolArgs(0, "{\"city\":"),
        Chunks.toolStart(1, kept, "search", "{\"q\""),
        Chunks.toolArgs(0, "\"Paris\"}"),
        Chunks.toolArgs(1, ":\"x\"}"),
        Chunks.finish("tool_calls"),
        Chunks.usage(usage)
      ]))
      const events = yield* collect(upstreamStream(adapter, ask()))
      const start = events.find((e) => e._tag === "ToolCallStart")
      const id = start?._tag === "ToolCallStart" ? start.id : ""
      expect(id).toMatch(/^call_[0-9a-f]{32}$/)
      expect(events).toEqual([
        { _tag: "ToolCallStart", index: 0, id, name: "get_weather" },
        { _tag: "ToolCallArgs", index: 0, fragment: "{\"city\":" },
        { _tag: "ToolCallStart", index: 1, id: kept, name: "search" },
        { _tag: "ToolCallArgs", index: 1, fragment: "{\"q\"" },
        { _tag: "ToolCallArgs", index: 0, fragment: "\"Paris\"}" },
        { _tag: "ToolCallArgs", index: 1, fragment: ":\"x\"}" },
        { _tag: "Finish", reason: "tool_calls" },
        { _tag: "Usage", usage: normalizedUsage }
      ])
    }))

  it.live("maps finish reasons: length, content_filter -> stop, forced tool call with stop -> tool_calls", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const finishOf = (events: ReadonlyArray<UpstreamEvent>) => events.find((e) => e._tag === "Finish")
      mock.script(
        Behaviour.stream([Chunks.content("a"), Chunks.finish("length")]),
        Behaviour.stream([Chunks.content("a"), Chunks.finish("content_filter")]),
        Behaviour.stream([Chunks.toolStart(0, "x", "f", "{}"), Chunks.finish("stop")])
      )
      expect(finishOf(yield* collect(upstreamStream(adapter, ask())))).toEqual({ _tag: "Finish", reason: "length" })
      expect(finishOf(yield* collect(upstreamStream(adapter, ask())))).toEqual({ _tag: "Finish", reason: "stop" })
      expect(finishOf(yield* collect(upstreamStream(adapter, ask())))).toEqual({ _tag: "Finish", reason: "tool_calls" })
    }))

  it.live("reads a non-streaming JSON answer", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.json(Chunks.completion({
        reasoning: "hmm",
        content: "Sure.",
        tool_calls: [{ id: "toolu_1", name: "f", arguments: "{\"a\":1}" }],
        finish: "tool_calls",
        usage
      })))
      const events = yield* collect(upstreamStream(adapter, ask({ stream: false })))
      expect(mock.requests[0]!.body.stream).toBe(false)
      expect(mock.requests[0]!.headers.accept).toBe("application/json")
      expect(events).toEqual([
        { _tag: "Reasoning", text: "hmm" },
        { _tag: "Content", text: "Sure." },
        { _tag: "ToolCallStart", index: 0, id: expect.stringMatching(/^call_[0-9a-f]{32}$/), name: "f" },
        { _tag: "ToolCallArgs", index: 0, fragment: "{\"a\":1}" },
        { _tag: "Finish", reason: "tool_calls" },
        { _tag: "Usage", usage: normalizedUsage }
      ])
    }))

  it.live("parses SSE split anywhere on the wire, with CRLF, comments and split UTF-8", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const frame = `data: ${JSON.stringify(Chunks.content("héllo 👋"))}\r\n\r\n`
      const bytes = Buffer.from(frame, "utf8")
      const emoji = bytes.indexOf(Buffer.from("👋", "utf8"))
      mock.script(Behaviour.stream([
        raw(": ping\r\n\r\n"),
        raw(bytes.subarray(0, 9)),
        raw(bytes.subarray(9, emoji + 2)),
        raw(bytes.subarray(emoji + 2, bytes.length - 1)),
        raw(bytes.subarray(bytes.length - 1)),
        raw("event: message\r\ndata: " + JSON.stringify(Chunks.finish("stop")).slice(0, 20)),
        raw(JSON.stringify(Chunks.finish("stop")).slice(20) + "\r"),
        raw("\n\r\n")
      ], { delayMs: 15 }))
      expect(yield* collect(upstreamStream(adapter, ask()))).toEqual([
        { _tag: "Content", text: "héllo 👋" },
        { _tag: "Finish", reason: "stop" }
      ])
    }))

  it.live("skips an undecodable frame among good ones and logs it", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const logs: Array<string> = []
      const logger = Logger.make(({ message }) => {
        logs.push(Array.isArray(message) ? message.join(" ") : String(message))
      })
      mock.script(Behaviour.stream([Chunks.content("a"), "{broken json", Chunks.content("b"), Chunks.finish("stop")]))
      const events = yield* collect(upstreamStream(adapter, ask())).pipe(
        Effect.provide(Logger.layer([logger]))
      )
      expect(events).toEqual([
        { _tag: "Content", text: "a" },
        { _tag: "Content", text: "b" },
        { _tag: "Finish", reason: "stop" }
      ])
      expect(logs.some((l) => l.includes("undecodable"))).toBe(true)
    }))

  it.live("keeps pooled connections alive across completed requests", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const answer = Behaviour.stream([Chunks.content("x"), Chunks.finish("stop")])
      mock.script(answer, answer, answer, answer, Behaviour.json(Chunks.completion({ content: "x" })))
      for (let i = 0; i < 4; i++) yield* collect(upstreamStream(adapter, ask()))
      yield* collect(upstreamStream(adapter, ask({ stream: false })))
      expect(mock.requests).toHaveLength(5)
      // The stream ends at `[DONE]`, possibly before the response terminator is read, so a request
      // right after may take a second connection; none is closed and they do not grow per request.
      expect(mock.connections().closed).toBe(0)
      expect(mock.connections().opened).toBeLessThanOrEqual(2)
    }))

  it.live("delivers a long fast stream to a slow consumer completely and in order", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      const n = 3_000
      mock.script(Behaviour.stream([
        ...Array.from({ length: n }, (_, i) => Chunks.content(`${i},`)),
        Chunks.finish("stop")
      ]))
      let first = true
      const events = yield* collect(upstreamStream(adapter, ask()).pipe(
        Stream.tap(() => (first ? ((first = false), Effect.sleep("300 millis")) : Effect.void))
      ))
      expect(events).toHaveLength(n + 1)
      expect(events.slice(0, n).map((e) => (e._tag === "Content" ? e.text : "")).join("")).toBe(
        Array.from({ length: n }, (_, i) => `${i},`).join("")
      )
    }))
})

describe("openai-compatible adapter: errors", () => {
  const failure = <A>(effect: Effect.Effect<A, UpstreamError>) => Effect.flip(effect)

  it.live("429 is rate_limited, other non-2xx are status errors with the upstream message", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(
        Behaviour.rateLimited("slow down"),
        Behaviour.status(503, { error: { message: "overloaded" } }),
        Behaviour.status(400, "plain text problem")
      )
      const limited = yield* failure(collect(upstreamStream(adapter, ask())))
      expect(limited).toMatchObject({ _tag: "UpstreamError", kind: "rate_limited", status: 429 })
      expect(limited.detail).toContain("slow down")
      const unavailable = yield* failure(collect(upstreamStream(adapter, ask())))
      expect(unavailable).toMatchObject({ kind: "status", status: 503 })
      expect(unavailable.detail).toContain("overloaded")
      const bad = yield* failure(collect(upstreamStream(adapter, ask())))
      expect(bad).toMatchObject({ kind: "status", status: 400 })
      expect(bad.detail).toContain("plain text problem")
    }))

  it.live("a refused connection and a socket dropped before headers are connect errors", () =>
    Effect.gen(function*() {
      const closedPort = yield* Effect.promise(() =>
        new Promise<number>((resolve) => {
          const server = Net.createServer().listen(0, "127.0.0.1", () => {
            const port = (server.address() as Net.AddressInfo).port
            server.close(() => resolve(port))
          })
        })
      )
      const refused = yield* openAiCompatibleAdapter(providerFor(`http://127.0.0.1:${closedPort}/v1`))
      const error = yield* failure(collect(upstreamStream(refused, ask())))
      expect(error.kind).toBe("connect")
      expect(error.detail).toContain("ECONNREFUSED")

      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.dropBeforeHeaders())
      expect((yield* failure(collect(upstreamStream(adapter, ask())))).kind).toBe("connect")
    }))

  it.live("a bad body is a protocol error: broken JSON, stream cut short, socket dropped mid-stream, error frame", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(
        Behaviour.json("{\"choices\": [", {}),
        Behaviour.stream([Chunks.content("a")], { done: false }),
        Behaviour.dropAfter([Chunks.content("a"), Chunks.content("b")]),
        Behaviour.stream([Chunks.content("a"), { error: { message: "backend crashed" } }])
      )
      const json = yield* failure(collect(upstreamStream(adapter, ask({ stream: false }))))
      expect(json).toMatchObject({ kind: "protocol" })
      expect(json.detail).toContain("not JSON")

      const cut = yield* failure(collect(upstreamStream(adapter, ask())))
      expect(cut).toMatchObject({ kind: "protocol", detail: "upstream ended the stream before finishing" })

      const seen: Array<UpstreamEvent> = []
      const dropped = yield* failure(collect(upstreamStream(adapter, ask()).pipe(Stream.tap((e) => Effect.sync(() => seen.push(e))))))
      expect(dropped.kind).toBe("protocol")
      expect(seen).toEqual([{ _tag: "Content", text: "a" }, { _tag: "Content", text: "b" }])

      const frame = yield* failure(collect(upstreamStream(adapter, ask())))
      expect(frame).toMatchObject({ kind: "protocol" })
      expect(frame.detail).toContain("backend crashed")
    }))
})

describe("openai-compatible adapter: timeouts (real time, small values)", () => {
  it.live("first_token_ms: no answer at all", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 150, idle_ms: 1_000 } })
      mock.script(Behaviour.hangBeforeHeaders())
      const started = Date.now()
      const error = yield* Effect.flip(collect(upstreamStream(adapter, ask())))
      expect(error).toMatchObject({ kind: "timeout" })
      expect(error.detail).toContain("first token")
      expect(Date.now() - started).toBeGreaterThanOrEqual(140)
      yield* waitAborts(mock, 1)
    }))

  it.live("first_token_ms: headers and a role chunk are not a first token", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 150, idle_ms: 1_000 } })
      mock.script(Behaviour.hangAfter([Chunks.role()]))
      const error = yield* Effect.flip(collect(upstreamStream(adapter, ask())))
      expect(error.detail).toContain("first token")
      yield* waitAborts(mock, 1)
    }))

  it.live("idle_ms: silence after some chunks", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 5_000, idle_ms: 150 } })
      mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("a")]))
      const seen: Array<UpstreamEvent> = []
      const error = yield* Effect.flip(collect(upstreamStream(adapter, ask()).pipe(Stream.tap((e) => Effect.sync(() => seen.push(e))))))
      expect(error).toMatchObject({ kind: "timeout" })
      expect(error.detail).toContain("idle")
      expect(seen).toEqual([{ _tag: "Content", text: "a" }])
      yield* waitAborts(mock, 1)
    }))

  it.live("idle_ms counts from the last chunk: a slow but steady stream completes", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 5_000, idle_ms: 200 } })
      // Six chunks 80 ms apart: longer than idle_ms in total, never idle that long.
      mock.script(Behaviour.slow([Chunks.content("a"), Chunks.content("b"), raw(": ping\n\n"), Chunks.content("c"),
        Chunks.finish("stop")], 80))
      const events = yield* collect(upstreamStream(adapter, ask()))
      expect(events.map((e) => e._tag)).toEqual(["Content", "Content", "Content", "Finish"])
    }))

  it.live("total_ms: a steady stream that takes too long", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 5_000, idle_ms: 5_000, total_ms: 300 } })
      mock.script(Behaviour.slow(Array.from({ length: 50 }, () => Chunks.content("x")), 40))
      const error = yield* Effect.flip(collect(upstreamStream(adapter, ask())))
      expect(error).toMatchObject({ kind: "timeout" })
      expect(error.detail).toContain("longer than 300 ms")
      yield* waitAborts(mock, 1)
    }))

  it.live("connect_ms: a TLS handshake that never completes", () =>
    Effect.gen(function*() {
      const sockets: Array<Net.Socket> = []
      const silent = yield* Effect.acquireRelease(
        Effect.promise(() =>
          new Promise<Net.Server>((resolve) => {
            const server = Net.createServer((s) => void sockets.push(s)).listen(0, "127.0.0.1", () => resolve(server))
          })
        ),
        (server) => Effect.sync(() => (sockets.forEach((s) => s.destroy()), server.close()))
      )
      const port = (silent.address() as Net.AddressInfo).port
      const adapter = yield* openAiCompatibleAdapter(
        providerFor(`https://127.0.0.1:${port}/v1`, { connect_ms: 150, first_token_ms: 5_000 })
      )
      const error = yield* Effect.flip(collect(upstreamStream(adapter, ask())))
      expect(error).toMatchObject({ kind: "timeout" })
      expect(error.detail).toContain("connect")
    }))
})

describe("openai-compatible adapter: timeouts on the TestClock", () => {
  it.effect("first_token_ms fires when the clock passes it", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 3_000, idle_ms: 10_000 } })
      mock.script(Behaviour.hangBeforeHeaders())
      const fiber = yield* Effect.forkChild(Effect.flip(collect(upstreamStream(adapter, ask()))))
      yield* until(() => mock.requests.length === 1)
      yield* TestClock.adjust("2999 millis")
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("1 millis")
      const error = yield* Fiber.join(fiber)
      expect(error.kind).toBe("timeout")
      expect(error.detail).toBe("no first token within 3000 ms")
    }))

  it.effect("idle_ms fires after the last chunk when the clock passes it", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { first_token_ms: 60_000, idle_ms: 5_000 } })
      mock.script(Behaviour.hangAfter([Chunks.content("a")]))
      const first = yield* Deferred.make<void>()
      const fiber = yield* Effect.forkChild(Effect.flip(collect(upstreamStream(adapter, ask()).pipe(
        Stream.tap(() => Deferred.succeed(first, undefined))
      ))))
      yield* Deferred.await(first)
      yield* TestClock.adjust("4 seconds")
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("2 seconds")
      const error = yield* Fiber.join(fiber)
      expect(error.kind).toBe("timeout")
      expect(error.detail).toBe("upstream idle for 5000 ms")
    }))
})

describe("openai-compatible adapter: interruption", () => {
  it.live("ending the stream early aborts the upstream request", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.hangAfter([Chunks.content("a"), Chunks.content("b")]))
      const events = yield* collect(upstreamStream(adapter, ask()).pipe(Stream.take(1)))
      expect(events).toEqual([{ _tag: "Content", text: "a" }])
      yield* waitAborts(mock, 1)
      yield* until(() => mock.connections().closed === 1)
    }))

  it.live("interrupting the consuming fiber aborts the upstream request, before or after headers", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup()
      mock.script(Behaviour.hangAfter([Chunks.role()]), Behaviour.hangBeforeHeaders())
      const streaming = yield* Effect.forkChild(collect(upstreamStream(adapter, ask())))
      yield* until(() => mock.requests.length === 1)
      yield* Effect.sleep("20 millis")
      expect(mock.clientAborts()).toBe(0)
      yield* Fiber.interrupt(streaming)
      yield* waitAborts(mock, 1)

      const waiting = yield* Effect.forkChild(collect(upstreamStream(adapter, ask())))
      yield* until(() => mock.requests.length === 2)
      yield* Fiber.interrupt(waiting)
      yield* waitAborts(mock, 2)
    }))
})

describe("openai-compatible adapter: embeddings", () => {
  it.live("posts to /embeddings and orders vectors by index, decoding base64 too", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ apiKey: "k" })
      const second = Buffer.from(new Float32Array([0.5, -0.25]).buffer).toString("base64")
      mock.script(Behaviour.json({
        object: "list",
        data: [{ object: "embedding", index: 1, embedding: second }, { object: "embedding", index: 0, embedding: [1, 0] }],
        usage: { prompt_tokens: 7, total_tokens: 7 }
      }))
      const result = yield* adapter.embed("emb-model", ["a", "b"])
      expect(result).toEqual({ vectors: [[1, 0], [0.5, -0.25]], prompt_tokens: 7 })
      expect(mock.requests[0]).toMatchObject({
        path: "/v1/embeddings",
        body: { model: "emb-model", input: ["a", "b"], encoding_format: "float" }
      })
      expect(mock.requests[0]!.headers.authorization).toBe("Bearer k")
    }))

  it.live("maps embedding failures", () =>
    Effect.gen(function*() {
      const { adapter, mock } = yield* setup({ timeouts: { total_ms: 200 } })
      mock.script(
        Behaviour.status(500, { error: { message: "boom" } }),
        Behaviour.json({ data: [] }),
        Behaviour.hangBeforeHeaders()
      )
      expect(yield* Effect.flip(adapter.embed("m", ["a"]))).toMatchObject({ kind: "status", status: 500 })
      expect(yield* Effect.flip(adapter.embed("m", ["a"]))).toMatchObject({ kind: "protocol" })
      expect(yield* Effect.flip(adapter.embed("m", ["a"]))).toMatchObject({ kind: "timeout" })
      yield* waitAborts(mock, 1)
    }))
})
