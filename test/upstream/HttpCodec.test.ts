/**
 * The HTTP chat codec interface (`src/upstream/http/Codec.ts`) carries a second wire format: the Anthropic codec
 * (`src/upstream/anthropic/`, pure) plugged into the shared transport and push call by the adapter's glue
 * (`anthropicChatCodec`, `src/upstream/anthropic/Adapter.ts`), against the fake Anthropic server.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Stream } from "effect"
import { anthropicChatCodec, anthropicEmbed } from "../../src/upstream/anthropic/Adapter.js"
import { completeChat } from "../../src/upstream/Complete.js"
import { openChat } from "../../src/upstream/http/ChatCall.js"
import { HttpTransport } from "../../src/upstream/http/Transport.js"
import {
  type UpstreamAdapter,
  UpstreamError,
  type UpstreamEvent,
  type UpstreamRequest
} from "../../src/upstream/Upstream.js"
import { FakeBehaviour, FakeEvents as E, FakeMessages, startFakeAnthropic } from "../support/FakeAnthropic.js"
import { upstreamStream } from "../support/UpstreamStream.js"

const KEY = "sk-ant-api03-codec-test-key-0123456789"

const fakeAnthropic = Effect.acquireRelease(
  Effect.promise(() => startFakeAnthropic({ apiKey: KEY })),
  (fake) => Effect.promise(() => fake.close())
)

const adapterFor = (url: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      const transport = new HttpTransport(url, 2, {
        connect_ms: 2_000,
        first_token_ms: 5_000,
        idle_ms: 5_000,
        total_ms: 10_000
      })
      const adapter: UpstreamAdapter = {
        open: openChat(transport, anthropicChatCodec("", KEY)),
        embed: anthropicEmbed
      }
      return { adapter, transport }
    }),
    ({ transport }) => transport.close()
  )

const ask = (extra: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
  model: "claude-fake-4",
  stream: true,
  max_tokens: 512,
  messages: [{ role: "system", content: "be brief" }, { role: "user", content: "hi" }],
  ...extra
})

const collect = (adapter: UpstreamAdapter, request: UpstreamRequest) =>
  Stream.runCollect(upstreamStream(adapter, request))

describe("the HTTP codec interface with the Anthropic codec", () => {
  it.live("streamed and whole answers decode to the same events over the shared transport", () =>
    Effect.gen(function*() {
      const fake = yield* fakeAnthropic
      const { adapter } = yield* adapterFor(fake.url)
      const message = FakeMessages.thinkingThenText("Let me think.", "Hello there, friend.", {
        input_tokens: 12,
        output_tokens: 30
      })
      fake.script(FakeBehaviour.message(message, 4))
      const streamed: ReadonlyArray<UpstreamEvent> = yield* collect(adapter, ask({ reasoning_effort: "low" }))
      expect(fake.requests[0]).toMatchObject({ path: "/v1/messages", headers: { "x-api-key": KEY } })
      expect(fake.requests[0]!.body.stream).toBe(true)
      const text = (tag: string) =>
        streamed.flatMap((e) => (e._tag === tag && "text" in e ? [e.text] : [])).join("")
      expect(text("Reasoning")).toBe("Let me think.")
      expect(text("Content")).toBe("Hello there, friend.")
      expect(streamed.at(-2)).toEqual({ _tag: "Finish", reason: "stop" })
      expect(streamed.at(-1)).toMatchObject({ _tag: "Usage", usage: { prompt_tokens: 12, completion_tokens: 30 } })

      const whole = yield* completeChat(adapter, ask({ stream: false, reasoning_effort: "low" }))
      expect(fake.requests[1]!.body.stream).toBe(false)
      expect(whole).toEqual([
        { _tag: "Reasoning", text: "Let me think." },
        { _tag: "Content", text: "Hello there, friend." },
        ...streamed.slice(-2)
      ])
    }))

  it.live("errors: a non-2xx answer through statusError, an error event mid-stream through the decoder", () =>
    Effect.gen(function*() {
      const fake = yield* fakeAnthropic
      const { adapter } = yield* adapterFor(fake.url)
      fake.script(
        FakeBehaviour.error(429, "rate_limit_error", "slow down"),
        FakeBehaviour.events([
          E.messageStart(),
          E.blockStart(0, { type: "text", text: "" }),
          E.textDelta(0, "partial"),
          E.error("overloaded_error", "Overloaded")
        ])
      )
      const limited = yield* Effect.flip(completeChat(adapter, ask({ stream: false })))
      expect(limited).toMatchObject({ kind: "rate_limited", status: 429 })
      const seen: Array<UpstreamEvent> = []
      const failed = yield* Effect.flip(Stream.runForEach(upstreamStream(adapter, ask()), (e) =>
        Effect.sync(() => seen.push(e))))
      expect(seen).toEqual([{ _tag: "Content", text: "partial" }])
      expect(failed).toMatchObject({ kind: "rate_limited" })
      expect(failed.detail).toContain("Overloaded")
    }))

  it.effect("a request the format cannot express fails before anything is sent", () =>
    Effect.gen(function*() {
      const fake = yield* fakeAnthropic
      const { adapter } = yield* adapterFor(fake.url)
      const image = { type: "image_url" as const, image_url: { url: "ftp://example.com/cat.png" } }
      const error = yield* Effect.flip(completeChat(adapter, ask({ messages: [{ role: "user", content: [image] }] })))
      expect(error).toBeInstanceOf(UpstreamError)
      expect(fake.requests).toHaveLength(0)
    }))
})
