import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { spawn } from "node:child_process"
import OpenAI from "openai"
import { embedText, planChat } from "../../src/upstream/simulated/Engine.js"
import { parseSimOptions, type SimServer, startSimServer } from "../../src/upstream/simulated/server.js"
import type { UpstreamRequest } from "../../src/upstream/Upstream.js"

const simServer = (options: Parameters<typeof startSimServer>[0] = {}) =>
  Effect.acquireRelease(
    Effect.promise(() => startSimServer({ port: 0, ...options })),
    (server) => Effect.promise(() => server.close())
  )

const clientFor = (server: SimServer) => new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 })

const question = "What is the weather in Paris today?"
const weatherTool = {
  type: "function" as const,
  function: {
    name: "get_weather",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, days: { type: "integer" } },
      required: ["city", "days"]
    }
  }
}

describe("simulated upstream server", () => {
  it.live("answers a non-streaming completion with the engine's plan", () =>
    Effect.gen(function*() {
      const client = clientFor(yield* simServer())
      const completion = yield* Effect.promise(() =>
        client.chat.completions.create({ model: "sim-pro", messages: [{ role: "user", content: question }] })
      )
      const plan = planChat({
        model: "sim-pro",
        stream: false,
        max_tokens: 4096,
        messages: [{ role: "user", content: question }]
      })
      expect(completion.object).toBe("chat.completion")
      expect(completion.choices[0]!.message.content).toBe(plan.content)
      expect(completion.choices[0]!.message.content).toContain("Echo: What is the weather in Paris today?")
      expect(completion.choices[0]!.finish_reason).toBe("stop")
      expect(completion.usage).toMatchObject({
        prompt_tokens: plan.usage.prompt_tokens,
        completion_tokens: plan.usage.completion_tokens,
        total_tokens: plan.usage.prompt_tokens + plan.usage.completion_tokens
      })
    }))

  it.live("streams role first, content deltas, finish, a usage chunk and [DONE]", () =>
    Effect.gen(function*() {
      const server = yield* simServer()
      const client = clientFor(server)
      const chunks = yield* Effect.promise(async () => {
        const stream = await client.chat.completions.create({
          model: "sim-pro",
          stream: true,
          stream_options: { include_usage: true },
          max_tokens: 12,
          messages: [{ role: "user", content: question }]
        })
        const out = []
        for await (const chunk of stream) out.push(chunk)
        return out
      })
      expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant")
      const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")
      expect(text).toBe(planChat({
        model: "sim-pro",
        stream: true,
        max_tokens: 12,
        messages: [{ role: "user", content: question }]
      }).content)
      expect(chunks.filter((c) => c.choices[0]?.delta.content).length).toBeGreaterThan(3)
      const finish = chunks.find((c) => c.choices[0]?.finish_reason)
      expect(finish!.choices[0]!.finish_reason).toBe("length")
      const last = chunks.at(-1)!
      expect(last.choices).toEqual([])
      expect(last.usage!.completion_tokens).toBe(12)

      const raw = yield* Effect.promise(() =>
        fetch(`${server.url}/v1/chat/completions`, {
          method: "POST",
          body: JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] })
        }).then((r) => r.text())
      )
      expect(raw.endsWith("data: [DONE]\n\n")).toBe(true)
      expect(raw).not.toContain("\"usage\"")
    }))

  it.live("streams reasoning_content before content", () =>
    Effect.gen(function*() {
      const client = clientFor(yield* simServer())
      const deltas = yield* Effect.promise(async () => {
        const stream = await client.chat.completions.create({
          model: "sim-reasoner",
          stream: true,
          reasoning_effort: "high" as never,
          messages: [{ role: "user", content: question }]
        })
        const out: Array<Record<string, unknown>> = []
        for await (const chunk of stream) if (chunk.choices[0]) out.push(chunk.choices[0].delta as never)
        return out
      })
      const firstContent = deltas.findIndex((d) => typeof d.content === "string" && d.content !== "")
      const reasoning = deltas.flatMap((d, i) => (typeof d.reasoning_content === "string" ? [i] : []))
      expect(reasoning.length).toBeGreaterThan(10)
      expect(Math.max(...reasoning)).toBeLessThan(firstContent)
    }))

  it.live("streams tool calls in OpenAI delta format and answers them without streaming too", () =>
    Effect.gen(function*() {
      const client = clientFor(yield* simServer())
      const request = {
        model: "sim-pro",
        tools: [weatherTool],
        messages: [{ role: "user" as const, content: question }]
      }
      const chunks = yield* Effect.promise(async () => {
        const stream = await client.chat.completions.create({ ...request, stream: true })
        const out = []
        for await (const chunk of stream) out.push(chunk)
        return out
      })
      const calls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? [])
      expect(calls[0]).toMatchObject({ index: 0, type: "function", function: { name: "get_weather", arguments: "" } })
      expect(calls[0]!.id).toMatch(/^call_[0-9a-f]{32}$/)
      expect(calls.slice(1).every((c) => c.id === undefined && c.index === 0)).toBe(true)
      const args = calls.map((c) => c.function?.arguments ?? "").join("")
      expect(JSON.parse(args)).toEqual({ city: "today", days: 1 })
      expect(chunks.find((c) => c.choices[0]?.finish_reason)!.choices[0]!.finish_reason).toBe("tool_calls")

      const completion = yield* Effect.promise(() => client.chat.completions.create(request))
      const message = completion.choices[0]!.message
      expect(message.content).toBeNull()
      expect(message.tool_calls![0]).toMatchObject({ id: calls[0]!.id, function: { name: "get_weather", arguments: args } })
      expect(completion.choices[0]!.finish_reason).toBe("tool_calls")
    }))

  it.live("embeds with 1024 dimensions, as base64 (SDK default) and as floats", () =>
    Effect.gen(function*() {
      const server = yield* simServer()
      const client = clientFor(server)
      const result = yield* Effect.promise(() => client.embeddings.create({ model: "sim-embed", input: ["one", "two"] }))
      expect(result.data).toHaveLength(2)
      expect(result.data[0]!.embedding).toHaveLength(1024)
      expect(result.data[0]!.embedding[5]).toBeCloseTo(embedText("one")[5]!, 6)
      expect(result.usage.prompt_tokens).toBe(2)
      const floats = yield* Effect.promise(() =>
        client.embeddings.create({ model: "sim-embed", input: "one", encoding_format: "float" })
      )
      expect(floats.data[0]!.embedding).toEqual(embedText("one"))
    }))

  it.live("lists models and rejects bad requests", () =>
    Effect.gen(function*() {
      const server = yield* simServer()
      const models = yield* Effect.promise(() => clientFor(server).models.list())
      expect(models.data.map((m) => m.id)).toContain("sim-pro")
      const status = (body: string) =>
        Effect.promise(() =>
          fetch(`${server.url}/v1/chat/completions`, { method: "POST", body }).then((r) => r.status)
        )
      expect(yield* status("{nope")).toBe(400)
      expect(yield* status(JSON.stringify({ model: "m", messages: [] }))).toBe(400)
      expect(yield* Effect.promise(() => fetch(`${server.url}/v1/nothing`).then((r) => r.status))).toBe(404)
    }))

  it.live("paces the answer with first_token_ms and tokens_per_second", () =>
    Effect.gen(function*() {
      const server = yield* simServer({ first_token_ms: 60, tokens_per_second: 1000 })
      const body = { model: "m", stream: true, max_tokens: 40, messages: [{ role: "user", content: question }] }
      const plan = planChat({ ...body, stream: true } as UpstreamRequest)
      const outputMs = plan.costs.slice(1).reduce((a, b) => a + b, 0)
      const started = performance.now()
      const text = yield* Effect.promise(() =>
        fetch(`${server.url}/v1/chat/completions`, { method: "POST", body: JSON.stringify(body) }).then((r) => r.text())
      )
      expect(performance.now() - started).toBeGreaterThanOrEqual(60 + outputMs - 2)
      expect(text).toContain("[DONE]")
    }))

  it("reads options from flags over environment over defaults", () => {
    expect(parseSimOptions([], {})).toEqual({ port: 9100, host: "127.0.0.1", first_token_ms: 0, tokens_per_second: 0 })
    expect(parseSimOptions(["--port", "0", "--tokens-per-second=50"], { SIM_PORT: "9200", SIM_FIRST_TOKEN_MS: "20" }))
      .toEqual({ port: 0, host: "127.0.0.1", first_token_ms: 20, tokens_per_second: 50 })
    expect(() => parseSimOptions(["--nope", "1"], {})).toThrow(/unknown flag/)
    expect(() => parseSimOptions(["--port", "-1"], {})).toThrow(/non-negative/)
  })

  it.live("runs as a script and prints its address", () =>
    Effect.gen(function*() {
      const line = yield* Effect.callback<string, Error>((resume) => {
        const child = spawn(process.execPath, ["--import", "tsx", "src/upstream/simulated/server.ts", "--port", "0"], {
          cwd: process.cwd(),
          stdio: ["ignore", "pipe", "inherit"]
        })
        let out = ""
        let done = false
        child.stdout.on("data", (d: Buffer) => {
          out += d.toString()
          if (out.includes("\n") && !done) {
            done = true
            child.kill("SIGTERM")
            resume(Effect.succeed(out.trim()))
          }
        })
        child.on("exit", (code) => {
          if (!done) resume(Effect.fail(new Error(`exited with ${code}: ${out}`)))
        })
        return Effect.sync(() => child.kill("SIGKILL"))
      })
      expect(line).toMatch(/^listening on http:\/\/127\.0\.0\.1:\d+$/)
    }), 30_000)
})
