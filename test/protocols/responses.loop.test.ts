/**
 * A multi-turn tool loop on `POST /v1/responses`, the way agents (Codex) drive it: the model calls a tool, the
 * client runs it and answers with `function_call_output`, until the model answers in text. Once with the whole
 * history resent each turn (`store: false`, as Codex does) and once by `previous_response_id`; against the
 * simulated models and against a fake OpenAI-compatible upstream, whose recorded requests show what the gateway
 * forwarded: tool-call ids one to one, reasoning kept on its own channel, instructions first.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { addMockModel } from "../inference/helpers.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"

const post = async (gw: TestGateway, body: unknown) => {
  const res = await fetch(`${gw.url}/v1/responses`, { method: "POST", headers: authed(gw.key), body: JSON.stringify(body) })
  const json = await res.json() as any
  expect(res.status, JSON.stringify(json)).toBe(200)
  return json
}

const tools = [
  { type: "function", name: "read_file", parameters: { type: "object", properties: { path: { type: "string" } } } }
]

describe("Responses tool loop", () => {
  let gw: TestGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({ configure: (doc) => addMockModel(doc, { baseUrl: mock.url }) })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  describe("simulated model", () => {
    it("three tool turns with the whole history resent (store: false), then text", async () => {
      const input: Array<any> = [{ role: "user", content: [{ type: "input_text", text: "Summarise the file notes" }] }]
      const seen = new Set<string>()
      for (let turn = 0; turn < 3; turn++) {
        // The simulated model calls a tool when the last message is the user's.
        const response = await post(gw, { model: "ws-pro", input, tools, store: false, instructions: "You are terse." })
        const calls = response.output.filter((item: any) => item.type === "function_call")
        expect(calls).toHaveLength(1)
        expect(seen.has(calls[0].call_id)).toBe(false)
        seen.add(calls[0].call_id)
        input.push(...response.output)
        input.push({ type: "function_call_output", call_id: calls[0].call_id, output: `contents ${turn}` })
        const answer = await post(gw, { model: "ws-pro", input, tools, store: false })
        expect(answer.output.map((item: any) => item.type)).toEqual(["message"])
        expect(answer.output[0].content[0].text).toMatch(new RegExp(`^The read_file tool returned: contents ${turn}\\.`))
        input.push(...answer.output)
        input.push({ role: "user", content: `Next file ${turn}` })
      }
    })

    it("the same loop by previous_response_id, reasoning included", async () => {
      let previous: string | null = null
      for (let turn = 0; turn < 3; turn++) {
        const ask: any = await post(gw, {
          model: "ws-pro",
          input: `Read file number ${turn}`,
          tools,
          reasoning: { effort: "low" },
          ...(previous ? { previous_response_id: previous } : {})
        })
        expect(ask.output.map((item: any) => item.type)).toEqual(["reasoning", "function_call"])
        const call = ask.output[1]
        const answer: any = await post(gw, {
          model: "ws-pro",
          previous_response_id: ask.id,
          input: [{ type: "function_call_output", call_id: call.call_id, output: `file ${turn} body` }],
          tools
        })
        expect(answer.output.at(-1).content[0].text).toMatch(new RegExp(`^The read_file tool returned: file ${turn} body\\.`))
        previous = answer.id
      }
    })
  })

  describe("fake OpenAI-compatible upstream", () => {
    it("previous_response_id replays the stored turns; call ids and reasoning go through unchanged", async () => {
      const call = `call_${"c1".repeat(16)}`
      mock.script(
        Behaviour.json(Chunks.completion({
          reasoning: "I should read it",
          tool_calls: [{ id: call, name: "read_file", arguments: "{\"path\":\"a.txt\"}" }],
          finish: "tool_calls",
          usage: { prompt: 20, completion: 9, reasoning: 4 }
        })),
        Behaviour.stream([
          Chunks.role(),
          Chunks.content("The file says hello."),
          Chunks.finish("stop"),
          Chunks.usage({ prompt: 35, completion: 6, cached: 20 })
        ])
      )
      const first = await post(gw, {
        model: "ws-mock",
        instructions: "Be helpful.",
        input: [{ role: "developer", content: "Use tools." }, { role: "user", content: "What is in a.txt?" }],
        tools
      })
      expect(first.output.map((item: any) => item.type)).toEqual(["reasoning", "function_call"])
      expect(first.output[1].call_id).toBe(call)
      const firstRequest = mock.requests.at(-1)!.body
      expect(firstRequest.messages).toEqual([
        { role: "system", content: "Be helpful." },
        { role: "system", content: "Use tools." },
        { role: "user", content: "What is in a.txt?" }
      ])
      expect(firstRequest.tools).toEqual([{ type: "function", function: { name: "read_file", parameters: tools[0]!.parameters } }])

      const res = await fetch(`${gw.url}/v1/responses`, {
        method: "POST",
        headers: authed(gw.key),
        body: JSON.stringify({
          model: "ws-mock",
          stream: true,
          previous_response_id: first.id,
          input: [{ type: "function_call_output", call_id: call, output: "hello" }],
          tools
        })
      })
      expect(res.status).toBe(200)
      const text = await res.text()
      expect(text).toContain("event: response.completed")
      const second = mock.requests.at(-1)!.body
      // Instructions are not carried over (as in OpenAI's API); the stored turn and this input are.
      expect(second.messages).toEqual([
        { role: "system", content: "Use tools." },
        { role: "user", content: "What is in a.txt?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: call, type: "function", function: { name: "read_file", arguments: "{\"path\":\"a.txt\"}" } }]
        },
        { role: "tool", tool_call_id: call, content: "hello" }
      ])
      const completed = JSON.parse(text.split("\n\n").filter((b) => b.startsWith("event: response.completed"))[0]!
        .split("\n")[1]!.slice(6))
      expect(completed.response.usage.input_tokens_details.cached_tokens).toBe(20)
      expect(completed.response.output_text).toBeUndefined()
      expect(completed.response.output[0].content[0].text).toBe("The file says hello.")
    })

    it("history sent back as items: reasoning rides on the assistant turn it preceded", async () => {
      const call = `call_${"d2".repeat(16)}`
      mock.script(Behaviour.json(Chunks.completion({ content: "ok" })))
      await post(gw, {
        model: "ws-mock",
        store: false,
        input: [
          { role: "user", content: "q" },
          { type: "reasoning", id: "rs_1", summary: [], content: [{ type: "reasoning_text", text: "thinking" }] },
          { type: "message", role: "assistant", content: [{ type: "output_text", text: "Let me look." }] },
          { type: "function_call", id: "fc_1", call_id: call, name: "read_file", arguments: "{}" },
          { type: "function_call_output", call_id: call, output: [{ type: "input_text", text: "data" }] }
        ]
      })
      const sent = mock.requests.at(-1)!.body
      // The openai-compatible adapter strips the gateway's own `reasoning` field before forwarding.
      expect(sent.messages).toEqual([
        { role: "user", content: "q" },
        {
          role: "assistant",
          content: "Let me look.",
          tool_calls: [{ id: call, type: "function", function: { name: "read_file", arguments: "{}" } }]
        },
        { role: "tool", tool_call_id: call, content: "data" }
      ])
    })
  })
})
