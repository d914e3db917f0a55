/**
 * A fake ComfyUI server for the worker agent's tests: real HTTP on 127.0.0.1 speaking ComfyUI's wire format.
 *
 * - `POST /prompt` `{prompt, client_id}` → `{prompt_id, number, node_errors: {}}`; 400 `{error, node_errors}` when
 *   told to refuse the workflow;
 * - `GET /history/{id}` → `{}` while the prompt is queued or running, then `{[id]: {prompt, outputs, status, meta}}`
 *   (`status: {status_str, completed, messages}`, `execution_error` / `execution_interrupted` among the messages);
 * - `GET /view?filename=&subfolder=&type=` → the PNG;
 * - `GET /system_stats` → `{system: {...}, devices: [...]}`;
 * - `POST /interrupt` (`{prompt_id}` optional), `POST /queue` `{delete: [ids]}`;
 * - `GET /ws?clientId=` (websocket): `status`, then `progress` `{value, max, prompt_id, node}` and `executing`
 *   `{node: null, prompt_id}` events to the client that submitted the prompt.
 *
 * Prompts run by themselves (a step every `stepMs`) unless `autoRun` is off; then the test moves them with
 * `step`, `complete` and `fail`. `setDown(true)` closes the port (connections refused) until `setDown(false)`.
 */
import * as Crypto from "node:crypto"
import * as Http from "node:http"
import type { AddressInfo, Socket } from "node:net"
import type { Duplex } from "node:stream"

export type PromptState = "pending" | "running" | "done" | "error" | "interrupted" | "deleted"

export interface Node {
  readonly class_type: string
  readonly inputs: Record<string, unknown>
}

export interface FakePrompt {
  readonly id: string
  readonly number: number
  readonly clientId: string
  readonly workflow: Record<string, Node>
  state: PromptState
  step: number
  readonly total: number
  error: string | null
  filename: string | null
}

export interface Behaviour {
  /** Prompts advance by themselves; off: the test calls `step`/`complete`/`fail`. */
  autoRun: boolean
  /** Delay between steps when running by itself. */
  stepMs: number
  /** `POST /prompt` refuses the workflow (400, a node error on the checkpoint). */
  refuse: boolean
  /** Running prompts end in this execution error after their first step. */
  failWith: string | null
  /** What `/view` answers (default: `png`). */
  viewBody: Buffer | null
  png: Buffer
}

export interface FakeComfyUi {
  readonly url: string
  readonly port: number
  readonly behaviour: Behaviour
  readonly prompts: Array<FakePrompt>
  readonly interrupts: Array<unknown>
  readonly queueDeletes: Array<unknown>
  readonly calls: Array<string>
  /** Websocket clients connected now. */
  readonly sockets: () => number
  readonly step: (promptId: string, steps?: number) => void
  readonly complete: (promptId: string) => void
  readonly fail: (promptId: string, message: string) => void
  readonly setDown: (down: boolean) => Promise<void>
  readonly close: () => Promise<void>
}

const WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

const textFrame = (text: string): Buffer => {
  const payload = Buffer.from(text)
  let head: Buffer
  if (payload.length < 126) head = Buffer.from([0x81, payload.length])
  else if (payload.length < 65_536) {
    head = Buffer.alloc(4)
    head[0] = 0x81
    head[1] = 126
    head.writeUInt16BE(payload.length, 2)
  } else {
    head = Buffer.alloc(10)
    head[0] = 0x81
    head[1] = 127
    head.writeBigUInt64BE(BigInt(payload.length), 2)
  }
  return Buffer.concat([head, payload])
}

const readBody = (request: Http.IncomingMessage, max = 1024 * 1024): Promise<string> =>
  new Promise((resolve, reject) => {
    const parts: Array<Buffer> = []
    let size = 0
    request.on("data", (chunk: Buffer) => {
      size += chunk.length
      if (size > max) {
        request.destroy()
        reject(new Error("body too large"))
      } else parts.push(chunk)
    })
    request.on("end", () => resolve(Buffer.concat(parts).toString("utf8")))
    request.on("error", reject)
  })

export const startFakeComfyUi = async (png: Buffer): Promise<FakeComfyUi> => {
  const behaviour: Behaviour = { autoRun: true, stepMs: 5, refuse: false, failWith: null, viewBody: null, png }
  const prompts: Array<FakePrompt> = []
  const interrupts: Array<unknown> = []
  const queueDeletes: Array<unknown> = []
  const calls: Array<string> = []
  const connections = new Set<Socket | Duplex>()
  const websockets = new Map<Duplex, string>()
  let counter = 0
  let fileCounter = 0

  const send = (clientId: string, message: unknown) => {
    const frame = textFrame(JSON.stringify(message))
    for (const [socket, id] of websockets) if (id === clientId && socket.writable) socket.write(frame)
  }

  const find = (id: string) => prompts.find((p) => p.id === id)
  const saveNode = (p: FakePrompt) => Object.entries(p.workflow).find(([, n]) => n.class_type === "SaveImage")?.[0] ?? "9"

  const finish = (p: FakePrompt, state: "done" | "error" | "interrupted", error: string | null = null) => {
    if (p.state !== "running" && p.state !== "pending") return
    p.state = state
    p.error = error
    if (state === "done") p.filename = `wellspring_${String(++fileCounter).padStart(5, "0")}_.png`
    send(p.clientId, { type: "executing", data: { node: null, prompt_id: p.id } })
    startNext()
  }

  const advance = (p: FakePrompt, steps = 1) => {
    if (p.state !== "running") return
    p.step = Math.min(p.total, p.step + steps)
    send(p.clientId, { type: "progress", data: { value: p.step, max: p.total, prompt_id: p.id, node: "5" } })
  }

  const run = (p: FakePrompt) => {
    const tick = () => {
      if (p.state !== "running" || !behaviour.autoRun) return
      advance(p)
      if (behaviour.failWith !== null) return finish(p, "error", behaviour.failWith)
      if (p.step >= p.total) return finish(p, "done")
      setTimeout(tick, behaviour.stepMs)
    }
    setTimeout(tick, behaviour.stepMs)
  }

  /** One prompt runs at a time, in order. */
  const startNext = () => {
    if (prompts.some((p) => p.state === "running")) return
    const next = prompts.find((p) => p.state === "pending")
    if (!next) return
    next.state = "running"
    send(next.clientId, { type: "executing", data: { node: "5", prompt_id: next.id } })
    if (behaviour.autoRun) run(next)
  }

  const json = (response: Http.ServerResponse, status: number, body: unknown) => {
    const text = JSON.stringify(body)
    response.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) })
    response.end(text)
  }

  const historyOf = (p: FakePrompt) => {
    const t = Date.now()
    const start = ["execution_start", { prompt_id: p.id, timestamp: t }]
    const base = { prompt: [p.number, p.id, p.workflow, { client_id: p.clientId }, [saveNode(p)]], meta: {} }
    if (p.state === "done") {
      const node = saveNode(p)
      return {
        ...base,
        outputs: { [node]: { images: [{ filename: p.filename, subfolder: "", type: "output" }] } },
        status: { status_str: "success", completed: true, messages: [start, ["execution_cached", { nodes: [], prompt_id: p.id, timestamp: t }], ["execution_success", { prompt_id: p.id, timestamp: t }]] },
        meta: { [node]: { node_id: node, display_node: node, parent_node: null, real_node_id: node } }
      }
    }
    const event = p.state === "error"
      ? ["execution_error", {
        prompt_id: p.id,
        node_id: "5",
        node_type: "KSampler",
        executed: ["1", "2", "3", "4"],
        exception_message: p.error,
        exception_type: "torch.OutOfMemoryError",
        traceback: ["  File \"execution.py\", line 1\n"],
        current_inputs: {},
        current_outputs: {},
        timestamp: t
      }]
      : ["execution_interrupted", { prompt_id: p.id, node_id: "5", node_type: "KSampler", executed: [], timestamp: t }]
    return { ...base, outputs: {}, status: { status_str: "error", completed: false, messages: [start, event] } }
  }

  const handler = async (request: Http.IncomingMessage, response: Http.ServerResponse) => {
    const url = new URL(request.url ?? "/", "http://fake")
    calls.push(`${request.method} ${url.pathname}`)
    try {
      if (request.method === "GET" && url.pathname === "/system_stats") {
        return json(response, 200, {
          system: {
            os: "posix",
            ram_total: 67_000_000_000,
            ram_free: 50_000_000_000,
            comfyui_version: "0.3.40",
            python_version: "3.12.3",
            pytorch_version: "2.7.0+cu128",
            embedded_python: false,
            argv: ["main.py", "--listen", "127.0.0.1"]
          },
          devices: [{
            name: "cuda:0 NVIDIA GeForce RTX 4090 : cudaMallocAsync",
            type: "cuda",
            index: 0,
            vram_total: 25_386_352_640,
            vram_free: 23_000_000_000,
            torch_vram_total: 0,
            torch_vram_free: 0
          }]
        })
      }
      if (request.method === "POST" && url.pathname === "/prompt") {
        const body = JSON.parse(await readBody(request)) as { prompt?: unknown; client_id?: unknown }
        if (body.prompt === null || typeof body.prompt !== "object") {
          return json(response, 400, {
            error: { type: "invalid_prompt", message: "Cannot execute because a node is missing the class_type property.", details: "", extra_info: {} },
            node_errors: {}
          })
        }
        if (behaviour.refuse) {
          return json(response, 400, {
            error: { type: "prompt_outputs_failed_validation", message: "Prompt outputs failed validation", details: "", extra_info: {} },
            node_errors: {
              "1": {
                errors: [{
                  type: "value_not_in_list",
                  message: "Value not in list",
                  details: "ckpt_name: 'missing.safetensors' not in ['sdxl_base_1.0.safetensors']",
                  extra_info: {}
                }],
                dependent_outputs: ["7"],
                class_type: "CheckpointLoaderSimple"
              }
            }
          })
        }
        const workflow = body.prompt as Record<string, Node>
        const sampler = Object.values(workflow).find((n) => n.class_type === "KSampler")
        const p: FakePrompt = {
          id: Crypto.randomUUID(),
          number: counter++,
          clientId: typeof body.client_id === "string" ? body.client_id : "",
          workflow,
          state: "pending",
          step: 0,
          total: typeof sampler?.inputs.steps === "number" ? sampler.inputs.steps : 20,
          error: null,
          filename: null
        }
        prompts.push(p)
        json(response, 200, { prompt_id: p.id, number: p.number, node_errors: {} })
        return startNext()
      }
      if (request.method === "GET" && url.pathname.startsWith("/history/")) {
        const p = find(decodeURIComponent(url.pathname.slice("/history/".length)))
        if (!p || p.state === "pending" || p.state === "running" || p.state === "deleted") return json(response, 200, {})
        return json(response, 200, { [p.id]: historyOf(p) })
      }
      if (request.method === "GET" && url.pathname === "/view") {
        const name = url.searchParams.get("filename")
        if (!prompts.some((p) => p.filename !== null && p.filename === name) || url.searchParams.get("type") !== "output") {
          response.writeHead(404)
          return response.end()
        }
        const bytes = behaviour.viewBody ?? behaviour.png
        response.writeHead(200, { "content-type": "image/png", "content-length": bytes.length })
        return response.end(bytes)
      }
      if (request.method === "POST" && url.pathname === "/interrupt") {
        const text = await readBody(request)
        const body = text === "" ? {} : JSON.parse(text) as { prompt_id?: string }
        interrupts.push(body)
        const target = body.prompt_id !== undefined ? find(body.prompt_id) : prompts.find((p) => p.state === "running")
        if (target && target.state === "running") finish(target, "interrupted")
        response.writeHead(200)
        return response.end()
      }
      if (request.method === "POST" && url.pathname === "/queue") {
        const body = JSON.parse(await readBody(request)) as { delete?: Array<string> }
        queueDeletes.push(body)
        for (const id of body.delete ?? []) {
          const p = find(id)
          if (p && p.state === "pending") p.state = "deleted"
        }
        response.writeHead(200)
        return response.end()
      }
      response.writeHead(404)
      response.end()
    } catch (error) {
      json(response, 500, { error: String(error) })
    }
  }

  const server = Http.createServer((request, response) => void handler(request, response))
  server.on("connection", (socket) => {
    connections.add(socket)
    socket.on("close", () => connections.delete(socket))
  })
  server.on("upgrade", (request: Http.IncomingMessage, socket: Duplex) => {
    const url = new URL(request.url ?? "/", "http://fake")
    const key = request.headers["sec-websocket-key"]
    if (url.pathname !== "/ws" || typeof key !== "string") return void socket.destroy()
    calls.push("GET /ws")
    const accept = Crypto.createHash("sha1").update(key + WS_GUID).digest("base64")
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`)
    const clientId = url.searchParams.get("clientId") ?? ""
    websockets.set(socket, clientId)
    connections.add(socket)
    socket.on("data", (data: Buffer) => {
      // A close frame from the client: answered, then the socket ends. Other frames are ignored.
      if ((data[0]! & 0x0f) === 0x8) {
        socket.end(Buffer.from([0x88, 0x00]))
      }
    })
    socket.on("error", () => undefined)
    socket.on("close", () => {
      websockets.delete(socket)
      connections.delete(socket)
    })
    socket.write(textFrame(JSON.stringify({ type: "status", data: { status: { exec_info: { queue_remaining: 0 } }, sid: clientId } })))
  })

  const listen = (port: number) =>
    new Promise<number>((resolve, reject) => {
      server.once("error", reject)
      server.listen(port, "127.0.0.1", () => {
        server.off("error", reject)
        resolve((server.address() as AddressInfo).port)
      })
    })
  const port = await listen(0)
  let down = false

  const closeAll = () =>
    new Promise<void>((resolve) => {
      server.close(() => resolve())
      for (const socket of connections) socket.destroy()
    })

  return {
    url: `http://127.0.0.1:${port}`,
    port,
    behaviour,
    prompts,
    interrupts,
    queueDeletes,
    calls,
    sockets: () => websockets.size,
    step: (id, steps = 1) => {
      const p = find(id)
      if (p) advance(p, steps)
    },
    complete: (id) => {
      const p = find(id)
      if (p) finish(p, "done")
    },
    fail: (id, message) => {
      const p = find(id)
      if (p) finish(p, "error", message)
    },
    setDown: async (value) => {
      if (value === down) return
      down = value
      if (value) await closeAll()
      else await listen(port)
    },
    close: async () => {
      if (!down) await closeAll()
    }
  }
}
