/**
 * Issue #8 finding 2 (tokenizer part): counting tokens never holds the event loop. A ~4 MB text is counted in
 * chunks with the loop free between them (every event-loop gap measured while another client keeps being
 * answered; `monitorEventLoopDelay` reported alongside), counting stops once the limit is passed, input over
 * `max_input_tokens × 32` bytes is rejected without tokenizing, and special-token text (`<|endoftext|>`) is
 * counted, not a 500.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { addMockModel, chatUrl, postChat, user } from "../inference/helpers.js"
import { authed, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { expectRejected, startInputGateway } from "./support.js"

/** Deterministic pseudo-random words of about `bytes` bytes: `letters` picks each character. */
const randomWords = (bytes: number, seed: number, letters: (r: number) => string, bytesPerLetter: number) => {
  let x = seed
  const next = () => (x = (x * 1103515245 + 12345) % 2147483648) / 2147483648
  const words: Array<string> = []
  let size = 0
  while (size < bytes) {
    const length = 2 + Math.floor(next() * 6)
    let word = ""
    for (let i = 0; i < length; i++) word += letters(next())
    words.push(word)
    size += length * bytesPerLetter + 1
  }
  return words.join(" ")
}
/** Lowercase ASCII words: cheap to read and parse, ~2 bytes per token, so counting is the work. */
const latinText = (bytes: number, seed = 1) => randomWords(bytes, seed, (r) => String.fromCharCode(97 + Math.floor(r * 26)), 1)
/** Korean words of random syllables (~1.5 bytes per token). */
const koreanText = (bytes: number, seed = 1) =>
  randomWords(bytes, seed, (r) => String.fromCharCode(0xac00 + Math.floor(r * 11172)), 3)

/** Longest event-loop stall we accept while a big input is counted. */
const MAX_STALL_MS = 100

/**
 * Event-loop stalls with the CPU the event loop's thread spent in each: a 2 ms ticker records every gap between
 * its turns (wall time) and this thread's CPU time (`process.threadCpuUsage`) used meanwhile. A stall our code
 * causes is work on this thread, so its CPU time is as long as its wall time; a stall where the OS ran another
 * process (CI machines are shared) has little CPU time. The process's other threads (the embedded database's
 * worker, V8's helpers) are left out: their CPU is not the loop's, and under load the OS runs them while this
 * thread waits. `worst` is the longest gap counting only the work.
 */
const stallMonitor = () => {
  let lastWall = performance.now()
  let lastCpu = process.threadCpuUsage()
  let worst = 0
  let worstWall = 0
  const timer = setInterval(() => {
    const wall = performance.now() - lastWall
    const used = process.threadCpuUsage(lastCpu)
    const cpu = (used.user + used.system) / 1000
    worst = Math.max(worst, Math.min(wall, cpu))
    worstWall = Math.max(worstWall, wall)
    lastWall = performance.now()
    lastCpu = process.threadCpuUsage()
  }, 2)
  return {
    stop: () => {
      clearInterval(timer)
      return { worst, worstWall }
    }
  }
}

describe("token counting", () => {
  let gw: TestGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 1, completion: 1 } })))
    gw = await startInputGateway({
      mock,
      limits: { body_bytes: 16 * 1024 * 1024, text_chars: 4 * 1024 * 1024 },
      configure: (doc) => {
        // 4 MB of `latinText` is ~1.9M tokens: counting passes 1.1M about 60% in.
        addMockModel(doc, { id: "ws-big", baseUrl: mock.url, model: { max_input_tokens: 1_100_000 } })
        addMockModel(doc, { id: "ws-small", baseUrl: mock.url, model: { max_input_tokens: 10_000 } })
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  it("a ~4 MB text is counted without stalling another client's requests (no turn over 100 ms)", async () => {
    const text = latinText(4_000_000)
    // Encoded up front: the client's own work on the body is not what is measured.
    const body = Buffer.from(JSON.stringify({ model: "ws-big", messages: [user(text)] }))
    expect(body.length).toBeGreaterThan(4_000_000)
    // Warm up the tokenizer and the request path on the same kind of text (first-use compilation is not the point).
    await expectRejected(gw, await postChat(gw, { model: "ws-small", messages: [user(latinText(100_000, 2))] }), 400, "input_too_long")

    const delay = monitorEventLoopDelay({ resolution: 10 })
    let bigDone = false
    let answeredMeanwhile = 0
    delay.enable()
    const stalls = stallMonitor()
    const big = fetch(chatUrl(gw), { method: "POST", headers: authed(gw.key), body }).then(async (res) => {
      const text = await res.text()
      bigDone = true
      return { status: res.status, text }
    })
    // Another client keeps sending small requests while the big one is counted.
    const other = (async () => {
      while (!bigDone) {
        const res = await postChat(gw, { model: "ws-mock", messages: [user("hi")] })
        expect(res.status).toBe(200)
        await res.text()
        if (!bigDone) answeredMeanwhile++
      }
    })()
    const result = await big
    const { worst, worstWall } = stalls.stop()
    delay.disable()
    await other

    // Counting stopped once past the limit: the estimate is just over it, not the ~1.9M of the whole text.
    expect(result.status, result.text.slice(0, 300)).toBe(400)
    const envelope = JSON.parse(result.text)
    expect(envelope.error.code).toBe("input_too_long")
    const estimate = Number(/추정 (\d+)/.exec(envelope.error.message)?.[1])
    expect(estimate).toBeGreaterThan(1_100_000)
    expect(estimate).toBeLessThan(1_200_000)
    expect(answeredMeanwhile).toBeGreaterThanOrEqual(3)
    // The loop was never held for long by this process's work. On an idle machine the wall-clock delay
    // (monitorEventLoopDelay) stays under the bound too; on a shared one it also counts time the OS gave to
    // other processes, so the bound applies to stalls with their CPU time.
    const observed = `monitorEventLoopDelay max ${(delay.max / 1e6).toFixed(1)} ms, p99 ${
      (delay.percentile(99) / 1e6).toFixed(1)
    } ms; longest gap ${worstWall.toFixed(1)} ms wall, ${worst.toFixed(1)} ms of it working`
    expect(worst, observed).toBeLessThan(MAX_STALL_MS)
  })

  it("input over max_input_tokens × 32 bytes is rejected without tokenizing (the estimate is bytes / 32)", async () => {
    // 10,000 tokens × 32 = 320,000 bytes; this text is about 400,000.
    const text = koreanText(400_000, 3)
    const bytes = Buffer.byteLength(text) + 4 // plus the message framing
    const res = await postChat(gw, { model: "ws-small", messages: [user(text)] })
    const envelope = await expectRejected(gw, res, 400, "input_too_long")
    expect(envelope.error.message).toContain(`추정 ${Math.ceil(bytes / 32)}`)
  })

  it("special-token text is counted as text: under the limit it is answered, over it is input_too_long", async () => {
    // 11,200 bytes (over 10,000, so the tokenizer runs) but fewer than 10,000 tokens.
    const special = "<|endoftext|><|im_start|> x ".repeat(400)
    const ok = await postChat(gw, { model: "ws-small", messages: [user(special)] })
    expect(ok.status, (await ok.clone().text()).slice(0, 300)).toBe(200)
    await ok.text()
    expect(mock.requests.at(-1)!.body.messages[0].content).toBe(special)
    const over = await postChat(gw, { model: "ws-small", messages: [user(special.repeat(20))] })
    await expectRejected(gw, over, 400, "input_too_long")
  })
})
