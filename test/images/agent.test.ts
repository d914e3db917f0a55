/**
 * The worker agent (src/images/worker/agent.ts) over real HTTP, between a gateway exposing the worker routes
 * (with an in-test ImageWork) and a fake ComfyUI (FakeComfyUi.ts): the round trip with the exact workflow and
 * the exact PNG bytes, cancellation, ComfyUI errors, ComfyUI down, a revoked token, stopping (in process and
 * by SIGTERM) and dying (SIGKILL) in the middle of a job.
 */
import { Effect } from "effect"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { buildWorkflow, NODE } from "../../src/images/worker/Workflow.js"
import {
  type AgentHandle,
  type AgentOptions,
  decodeJob,
  describeRefusal,
  parseAgentArgs,
  readHistory,
  startAgent
} from "../../src/images/worker/agent.js"
import { WorkerTokens } from "../../src/images/WorkerTokens.js"
import { cleanEnv, type Running, startTs } from "../foundation/spawn.js"
import { eventually } from "../support/Eventually.js"
import { type FakeComfyUi, type FakePrompt, startFakeComfyUi } from "./FakeComfyUi.js"
import { makePng, makeTestWork, sampleJob, sampleSpec, startWorkerGateway, type TestWork, type WorkerGateway } from "./workerSupport.js"

let gw: WorkerGateway
let work: TestWork
let fake: FakeComfyUi
let token = ""
let tokenId = 0
const png = makePng(32, 48)
let agent: AgentHandle | null = null
let logs: Array<string> = []

beforeAll(async () => {
  work = makeTestWork()
  gw = await startWorkerGateway({ work })
  fake = await startFakeComfyUi(png)
  const issued = await gw.run(Effect.flatMap(WorkerTokens, (t) => t.issue("agent-tests")))
  token = issued.token
  tokenId = issued.row.id
})
afterAll(async () => {
  await fake?.close()
  await gw?.stop()
})
afterEach(async () => {
  if (agent) {
    await agent.stop()
    // Its long poll may reach the gateway after its connection closed: no later job goes to it.
    work.retire(scoped(agent.status().workerId))
  }
  agent = null
  Object.assign(fake.behaviour, { autoRun: true, refuse: false, failWith: null, viewBody: null })
  await fake.setDown(false)
})

const start = (overrides: Partial<AgentOptions> = {}): AgentHandle => {
  logs = []
  agent = startAgent({
    gateway: gw.url,
    comfyui: fake.url,
    token,
    name: "test box",
    heartbeatMs: 100,
    waitMs: 500,
    pollMs: 20,
    progressMs: 40,
    callTimeoutMs: 5_000,
    downBackoff: { initialMs: 50, maxMs: 200 },
    authBackoff: { initialMs: 200, maxMs: 2_000 },
    graceMs: 0,
    log: (line) => void logs.push(line),
    ...overrides
  })
  return agent
}

const scoped = (workerId: string, tid = tokenId) => `t${tid}:${workerId}`

/** The prompt the fake received for a client, once it runs. */
const running = (clientId: string) =>
  eventually(() => fake.prompts.find((p) => p.clientId === clientId && p.state === "running"), { what: "a running prompt" })

const outcomeOf = (jobId: string) => ({
  completed: work.completed.filter((c) => c.jobId === jobId),
  failed: work.failed.filter((f) => f.jobId === jobId)
})

describe("the agent between the gateway and ComfyUI", () => {
  it("round trip: job → the workflow submitted → steps reported → the exact PNG posted back", async () => {
    fake.behaviour.autoRun = false
    const job = sampleJob({ preset: { ...sampleSpec().preset, upscaler: "4x-UltraSharp.pth" } })
    work.enqueue(job)
    const a = start()
    const { workerId } = a.status()
    const prompt: FakePrompt = await running(workerId)

    // The workflow: exactly the builder's, with the job's values in the right nodes.
    expect(prompt.workflow).toEqual(JSON.parse(JSON.stringify(buildWorkflow(job.spec))))
    const classes = Object.values(prompt.workflow).map((n) => n.class_type).sort()
    expect(classes).toEqual([
      "CLIPTextEncode", "CLIPTextEncode", "CheckpointLoaderSimple", "EmptyLatentImage", "ImageUpscaleWithModel", "KSampler",
      "LoraLoader", "LoraLoader", "SaveImage", "UpscaleModelLoader", "VAEDecode"
    ])
    expect(prompt.workflow[NODE.sampler]!.inputs).toMatchObject({
      seed: job.spec.seed,
      steps: job.spec.steps,
      cfg: job.spec.scale,
      sampler_name: "euler_ancestral",
      scheduler: "karras"
    })
    expect(prompt.workflow[NODE.latent]!.inputs).toMatchObject({ width: 832, height: 1216 })
    expect(prompt.workflow[NODE.positive]!.inputs.text).toBe(job.spec.prompt)
    expect(prompt.workflow[NODE.upscaleLoader]!.inputs.model_name).toBe("4x-UltraSharp.pth")
    expect(work.taken.get(job.id)).toBe(scoped(workerId))
    expect(a.status()).toMatchObject({ state: "working", jobId: job.id })

    // Heartbeats go on while it works.
    const beats = work.heartbeats.get(scoped(workerId))!.count
    await eventually(() => work.heartbeats.get(scoped(workerId))!.count >= beats + 3, { what: "heartbeats during the job" })

    // Steps from the websocket reach the gateway as progress.
    await eventually(() => fake.sockets() > 0, { what: "the websocket" })
    fake.step(prompt.id, 10)
    await eventually(() => work.progress.some((p) => p.jobId === job.id && p.step === 10 && p.total === job.spec.steps), {
      what: "progress 10/28"
    })
    fake.complete(prompt.id)
    const [done] = (await eventually(() => outcomeOf(job.id).completed.length > 0 && outcomeOf(job.id).completed))!
    expect(Buffer.from(done!.png).equals(png)).toBe(true)
    expect(done!.workerId).toBe(scoped(workerId))
    expect(outcomeOf(job.id).failed).toEqual([])
    expect(fake.calls).toEqual(expect.arrayContaining(["GET /system_stats", "POST /prompt", `GET /history/${prompt.id}`, "GET /view", "GET /ws"]))
    await eventually(() => a.status().state === "idle" && a.status().jobsDone === 1)
    expect(work.heartbeats.get(scoped(workerId))?.info).toEqual({ id: scoped(workerId), name: "test box", kind: "comfyui" })
    expect(logs.join("\n")).toMatch(/ComfyUI 0\.3\.40 at .*: cuda:0 NVIDIA GeForce RTX 4090/)
  })

  it("a job cancelled on the gateway is removed from ComfyUI's queue, interrupted, and dropped without a report", async () => {
    fake.behaviour.autoRun = false
    const job = sampleJob()
    work.enqueue(job)
    const a = start()
    const prompt = await running(a.status().workerId)
    work.cancel(job.id)
    await eventually(() => fake.interrupts.some((b) => (b as { prompt_id?: string }).prompt_id === prompt.id), { what: "/interrupt" })
    expect(fake.queueDeletes).toContainEqual({ delete: [prompt.id] })
    expect(prompt.state).toBe("interrupted")
    await eventually(() => a.status().jobsCancelled === 1 && a.status().state === "idle")
    expect(outcomeOf(job.id)).toEqual({ completed: [], failed: [] })

    // And it goes on with the next job.
    fake.behaviour.autoRun = true
    const next = sampleJob()
    work.enqueue(next)
    await eventually(() => outcomeOf(next.id).completed.length === 1, { what: "the next job done" })
  })

  it("ComfyUI errors become failures: an execution error, a refused workflow, an oversized or broken image", async () => {
    const a = start()
    const cases: ReadonlyArray<[string, () => void, RegExp]> = [
      ["execution error", () => void (fake.behaviour.failWith = "CUDA out of memory. Tried to allocate 2.00 GiB"), /^ComfyUI error: KSampler: CUDA out of memory\. Tried to allocate 2\.00 GiB$/],
      ["refused workflow", () => void (fake.behaviour.refuse = true), /^ComfyUI refused the workflow: Prompt outputs failed validation \| node 1 \(CheckpointLoaderSimple\): Value not in list: ckpt_name: 'missing\.safetensors'/],
      ["a 40 MB image", () => void (fake.behaviour.viewBody = Buffer.alloc(40 * 1024 * 1024, 1)), /larger than 33554432 bytes/],
      ["not a PNG", () => void (fake.behaviour.viewBody = Buffer.from("<html>oops</html>")), /not a valid PNG: too short/]
    ]
    for (const [name, arrange, reason] of cases) {
      Object.assign(fake.behaviour, { autoRun: true, refuse: false, failWith: null, viewBody: null })
      arrange()
      const job = sampleJob()
      work.enqueue(job)
      const { failed } = (await eventually(() => outcomeOf(job.id).failed.length > 0 && outcomeOf(job.id), { what: name }))!
      expect(failed[0]!.reason, name).toMatch(reason)
      expect(failed[0]!.workerId).toBe(scoped(a.status().workerId))
      expect(outcomeOf(job.id).completed, name).toEqual([])
    }
    expect(a.status().jobsFailed).toBe(cases.length)
  })

  it("ComfyUI down: no job is taken while heartbeats go on; it is taken once ComfyUI is back", async () => {
    const a = start()
    const id = scoped(a.status().workerId)
    await eventually(() => work.waiting() === 1, { what: "the agent polling" })
    await fake.setDown(true)
    await eventually(() => a.status().state === "comfy_down", { what: "ComfyUI seen down" })
    expect(work.waiting()).toBe(0)
    const job = sampleJob()
    work.enqueue(job)
    const beats = work.heartbeats.get(id)!.count
    const waits = work.waits.length
    await eventually(() => work.heartbeats.get(id)!.count >= beats + 4, { what: "heartbeats while ComfyUI is down" })
    expect(work.taken.has(job.id)).toBe(false)
    expect(work.waits.length).toBe(waits)
    expect(logs.join("\n")).toMatch(/is not answering; no jobs are taken/)

    await fake.setDown(false)
    await eventually(() => outcomeOf(job.id).completed.length === 1, { what: "the job done after ComfyUI came back" })
    expect(logs.join("\n")).toMatch(/ComfyUI answers again/)
  })

  it("a revoked token: 401, the agent stops polling and backs off its probes", async () => {
    const issued = await gw.run(Effect.flatMap(WorkerTokens, (t) => t.issue("to-revoke")))
    const a = start({ token: issued.token })
    const id = scoped(a.status().workerId, issued.row.id)
    await eventually(() => (work.heartbeats.get(id)?.count ?? 0) > 0 && work.waiting() === 1)
    await gw.run(Effect.flatMap(WorkerTokens, (t) => t.revoke(issued.row.id)))
    // The long poll under way ends with 401 at once.
    await eventually(() => a.status().state === "unauthorized", { what: "the agent refused" })
    const refusedAt = Date.now()
    const waits = work.waits.length
    const beats = work.heartbeats.get(id)!.count
    await eventually(() => a.status().refusals >= 3, { what: "three refusals", timeoutMs: 5_000 })
    // Backed off: 200 then 400 ms between the probes after the first refusal, nothing in between.
    expect(Date.now() - refusedAt).toBeGreaterThanOrEqual(550)
    expect(work.waits.length).toBe(waits)
    expect(work.heartbeats.get(id)!.count).toBe(beats)
    expect(a.status().state).toBe("unauthorized")
    expect(logs.join("\n")).toMatch(/refused the worker token \(401: unknown or revoked\)/)
  })

  it("stopped mid-job without a grace period: ComfyUI is interrupted and the job reported failed", async () => {
    fake.behaviour.autoRun = false
    const job = sampleJob()
    work.enqueue(job)
    const a = start({ graceMs: 0 })
    const prompt = await running(a.status().workerId)
    await a.stop()
    work.retire(scoped(a.status().workerId))
    expect(a.status().state).toBe("stopped")
    expect(fake.interrupts).toContainEqual({ prompt_id: prompt.id })
    expect(outcomeOf(job.id).failed.map((f) => f.reason)).toEqual(["the worker is shutting down"])
    agent = null
  })

  it("stopped mid-job with a grace period: the job finishes, then the agent stops without polling again", async () => {
    fake.behaviour.autoRun = false
    const job = sampleJob()
    work.enqueue(job)
    const a = start({ graceMs: 60_000 })
    const prompt = await running(a.status().workerId)
    const waits = work.waits.length
    const stopped = a.stop()
    fake.complete(prompt.id)
    await stopped
    expect(outcomeOf(job.id).completed.length).toBe(1)
    expect(outcomeOf(job.id).failed).toEqual([])
    expect(work.waits.length).toBe(waits)
    work.retire(scoped(a.status().workerId))
    agent = null
  })
})

describe("the agent as a process (npm run worker)", () => {
  const spawn = (id: string): Running =>
    startTs(
      "src/images/worker/agent.ts",
      ["--gateway", gw.url, "--comfyui", fake.url, "--id", id, "--name", "spawned", "--heartbeat-seconds", "0.2", "--grace-seconds", "60"],
      cleanEnv({ WELLSPRING_WORKER_TOKEN: token })
    )

  it("SIGTERM mid-job: the job finishes and is delivered, then the process exits 0", async () => {
    fake.behaviour.autoRun = false
    const job = sampleJob()
    work.enqueue(job)
    const proc = spawn("spawned-term")
    try {
      const prompt = await running("spawned-term")
      process.kill(proc.pid, "SIGTERM")
      await proc.waitFor(/stopping: job img_\w+ gets up to 60 s to finish/)
      fake.complete(prompt.id)
      expect(await proc.exited).toBe(0)
      expect(outcomeOf(job.id).completed.length).toBe(1)
      expect(proc.output()).toMatch(/worker stopped/)
    } finally {
      await proc.stop(1_000)
      work.retire(scoped("spawned-term"))
    }
  })

  it("SIGKILL mid-job: heartbeats stop, so the gateway sees the worker gone (the queue requeues its job)", async () => {
    fake.behaviour.autoRun = false
    const job = sampleJob()
    work.enqueue(job)
    const proc = spawn("spawned-kill")
    const id = scoped("spawned-kill")
    try {
      await running("spawned-kill")
      await eventually(() => (work.heartbeats.get(id)?.count ?? 0) >= 2, { what: "heartbeats of the process" })
      process.kill(proc.pid, "SIGKILL")
      await proc.exited
      const beats = work.heartbeats.get(id)!.count
      // Offline by the gateway's rule (no heartbeat for three intervals), and nothing reported for its job.
      await eventually(() => Date.now() - work.heartbeats.get(id)!.at > 600, { what: "the worker seen offline" })
      expect(work.heartbeats.get(id)!.count).toBe(beats)
      expect(outcomeOf(job.id)).toEqual({ completed: [], failed: [] })
    } finally {
      await proc.stop(1_000)
      work.retire(id)
      // The dead worker's prompt is still "running" on the fake: cleared for later tests.
      for (const p of fake.prompts) if (p.state === "running") fake.complete(p.id)
    }
  })
})

describe("pieces", () => {
  it("arguments: required flags, URLs, the token from the environment", () => {
    const ok = parseAgentArgs(["--gateway", "http://gw:8080", "--comfyui=http://127.0.0.1:8188", "--heartbeat-seconds", "2"], {
      WELLSPRING_WORKER_TOKEN: "wsw_x"
    })
    expect(ok).toMatchObject({ gateway: "http://gw:8080", comfyui: "http://127.0.0.1:8188", token: "wsw_x", heartbeatMs: 2000, graceMs: 30_000 })
    expect(parseAgentArgs(["--gateway", "http://gw", "--comfyui", "http://c"], {})).toMatch(/missing --token/)
    expect(parseAgentArgs(["--gateway", "ftp://gw", "--comfyui", "http://c", "--token", "t"], {})).toMatch(/--gateway must be an http/)
    expect(parseAgentArgs(["--gateway", "http://gw", "--comfyui", "http://c", "--token", "t", "--bogus", "1"], {})).toMatch(/unknown flag --bogus/)
    expect(parseAgentArgs(["--gateway", "http://gw", "--comfyui", "http://c", "--token", "t", "--heartbeat-seconds", "0"], {})).toMatch(/--heartbeat-seconds/)
    expect(parseAgentArgs(["--gateway", "http://gw", "--comfyui", "http://c", "--token", "t", "--id", "a b"], {})).toMatch(/--id/)
    expect(parseAgentArgs(["--help"], {})).toMatch(/^Usage: npm run worker/)
  })

  it("decodeJob takes only a well-formed job", () => {
    const job = sampleJob()
    expect(decodeJob({ job: { id: job.id, spec: job.spec } })).toEqual({ id: job.id, spec: job.spec })
    expect(decodeJob({ job: { id: job.id, spec: { ...job.spec, steps: "28" } } })).toBeNull()
    expect(decodeJob({ job: { id: "../x", spec: job.spec } })).toBeNull()
    expect(decodeJob({ job: { id: job.id, spec: { ...job.spec, preset: { ...job.spec.preset, loras: [{ name: 1 }] } } } })).toBeNull()
    expect(decodeJob(null)).toBeNull()
  })

  it("readHistory and describeRefusal read ComfyUI's shapes", () => {
    expect(readHistory({}, "p")).toEqual({ _tag: "Running" })
    expect(readHistory({ p: { outputs: { "7": { images: [{ filename: "a.png", subfolder: "s", type: "output" }] } }, status: { status_str: "success", completed: true, messages: [] } } }, "p"))
      .toEqual({ _tag: "Done", image: { filename: "a.png", subfolder: "s", type: "output" } })
    expect(readHistory({ p: { outputs: {}, status: { status_str: "success", completed: true, messages: [] } } }, "p"))
      .toEqual({ _tag: "Failed", message: "ComfyUI finished without an image" })
    expect(readHistory({ p: { outputs: {}, status: { status_str: "error", completed: false, messages: [["execution_interrupted", {}]] } } }, "p"))
      .toEqual({ _tag: "Failed", message: "interrupted on ComfyUI" })
    expect(describeRefusal({ error: { message: "Cannot execute" }, node_errors: {} })).toBe("ComfyUI refused the workflow: Cannot execute")
    expect(describeRefusal("nope")).toBe("ComfyUI refused the workflow")
  })
})
