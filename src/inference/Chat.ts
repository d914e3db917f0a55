import { Cause, type Context, Effect, Exit, Scope } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { Auth, type Caller } from "../auth/Auth.js"
import type { ModelConfig, PlanConfig } from "../config/GatewayConfig.js"
import { LiveCatalog, Settings } from "../config/Live.js"
import { Catalog, fail, GatewayError } from "../errors/Catalog.js"
import { inferenceBody, renderInference } from "../errors/Render.js"
import { currentRequestId, defectCode, handle, headersOf } from "../http/Respond.js"
import { readText } from "../http/Body.js"
import { guard as guardFailures, recordFailure } from "../http/FailedRequests.js"
import { Admission, type AdmitInput, type Standing, type Ticket } from "../quota/Admission.js"
import { RequestLog } from "../telemetry/RequestLog.js"
import {
  type FinishReason,
  type UpstreamError,
  type UpstreamAdapter,
  type UpstreamEvent,
  type UpstreamRequest,
  Upstreams,
  type Usage
} from "../upstream/Upstream.js"
import { completeChat } from "../upstream/Complete.js"
import { type ChatRequest, decodeChatRequest } from "./ChatRequest.js"
import { modelIdOfBody, readJsonBody, UNKNOWN_MODEL_ID } from "./JsonGuard.js"
import { sseBody, sseResponse } from "./SseBody.js"
import { isUpstreamFailure, upstreamFailure } from "./UpstreamErrors.js"
import { quotaHeaders, receipt } from "./Receipt.js"
import { exceedsLimit, measure } from "./Tokens.js"

export { upstreamFailure }

/** Streams measured from first event to end over less than this (one burst) measure tps from dispatch. */
const MIN_STREAM_SPAN_MS = 50

/**
 * Output tokens per second of generation, rounded to 2 decimals; 0 without output or time. Generation time is
 * from dispatch to the answer for a non-stream, from the first event to the end for a stream (from dispatch
 * when the whole stream came in one burst).
 */
export const tokensPerSecond = (outputTokens: number, generationMs: number | null): number => {
  if (!(outputTokens > 0) || generationMs === null || !(generationMs > 0)) return 0
  const tps = Math.round((outputTokens / (generationMs / 1000)) * 100) / 100
  return Number.isFinite(tps) ? tps : 0
}

/**
 * Everything one request accumulates; `finish` settles the ticket, releases its slot and writes the
 * request row exactly once, whichever way the request ends.
 */
export class Exchange {
  readonly startedAt = performance.now()
  readonly createdAt = new Date()
  /** The catalog id, the body's bounded `model` while unresolved, or a placeholder before the body is read. */
  modelId = UNKNOWN_MODEL_ID
  stream = false
  hadTools = false
  toolChoice: string | null = null
  provider: string | null = null
  estimatedInput = 0
  ticket: Ticket | null = null
  scope: Scope.Closeable | null = null
  ttfbMs: number | null = null
  /** When the upstream request was sent, and when its first event came (performance.now()). */
  dispatchedAt: number | null = null
  firstEventAt: number | null = null
  deliveredChars = 0
  usage: Usage | null = null
  private finished = false

  constructor(
    readonly caller: Caller,
    readonly rowId: number,
    readonly requestId: string,
    readonly log: Context.Service.Shape<typeof RequestLog>
  ) {}

  markFirstByte() {
    if (this.ttfbMs === null) this.ttfbMs = Math.round(performance.now() - this.startedAt)
  }

  markDispatched() {
    this.dispatchedAt = performance.now()
  }

  markFirstEvent() {
    if (this.firstEventAt === null) this.firstEventAt = performance.now()
    this.markFirstByte()
  }

  /** Milliseconds of upstream generation up to `now` (see `tokensPerSecond`); null if never dispatched. */
  generationMs(now: number): number | null {
    const first = this.firstEventAt
    const from = this.stream && first !== null && now - first >= MIN_STREAM_SPAN_MS ? first : this.dispatchedAt
    return from === null ? null : now - from
  }

  /** Usage to charge: the upstream's figures, else an estimate of what was delivered. */
  chargeable(): Usage {
    return this.usage ?? {
      prompt_tokens: this.estimatedInput,
      completion_tokens: Math.ceil(this.deliveredChars / 4),
      reasoning_tokens: 0,
      cached_tokens: 0
    }
  }

  /**
   * Reserves through admission into a scope this exchange owns (closed by `finish`); the request's scope,
   * which closes after the response is written, is the backstop that finishes it as cancelled.
   */
  admit(admission: Context.Service.Shape<typeof Admission>, input: AdmitInput) {
    return Effect.gen({ self: this }, function*() {
      const scope = yield* Scope.make()
      this.scope = scope
      yield* Effect.addFinalizer(() => this.finish({ status: "cancelled" }))
      this.ticket = yield* Scope.provide(admission.admit(input), scope)
    })
  }

  finish(
    outcome: { readonly status: "success" | "error" | "cancelled"; readonly error?: GatewayError | undefined }
  ): Effect.Effect<{ readonly standing: Standing; readonly weighted: number } | null> {
    return Effect.suspend(() => {
      if (this.finished) return Effect.succeed(null)
      this.finished = true
      const usage = this.chargeable()
      const delivered = outcome.status === "success" || this.deliveredChars > 0 || this.usage !== null
      const ticket = this.ticket
      type Settled = { readonly standing: Standing; readonly weighted: number } | null
      const settle: Effect.Effect<Settled> = ticket === null
        ? Effect.succeed(null)
        : delivered
        ? ticket.settle({ inputTokens: usage.prompt_tokens, outputTokens: usage.completion_tokens })
        : Effect.as(ticket.refund, null)
      const error = outcome.error
      // The row's `error` is shown to the account (`recentRequests`): a server-side failure records its code and
      // status only; its detail (upstream answer text, addresses) goes to the log, as `detail` is meant to.
      // So is an upstream's refusal text (4xx), whatever its status.
      const serverSide = error !== undefined && error.detail !== undefined &&
        (error.status >= 500 || isUpstreamFailure(error))
      return (serverSide ? Effect.logWarning("request failed", error.detail) : Effect.void).pipe(
        Effect.andThen(settle),
        Effect.map((settled) => {
          const now = performance.now()
          const duration = Math.max(0, Math.round(now - this.startedAt))
          const counted = delivered ? usage : null
          this.log.record({
            id: this.rowId,
            request_id: this.requestId,
            account_id: this.caller.account.id,
            key_id: this.caller.key?.id ?? null,
            model_id: this.modelId,
            status: outcome.status,
            // A cancelled row says so in `error_code` too, as the metrics' `errors.by_code` does.
            error_code: outcome.error
              ? Catalog[outcome.error.code].wire ?? outcome.error.code
              : outcome.status === "cancelled"
              ? "cancelled"
              : null,
            http_status: outcome.error ? outcome.error.status : outcome.status === "cancelled" ? 499 : 200,
            stream: this.stream,
            input_tokens: counted?.prompt_tokens ?? 0,
            output_tokens: counted?.completion_tokens ?? 0,
            reasoning_tokens: counted?.reasoning_tokens ?? 0,
            prompt_cached_tokens: counted?.cached_tokens ?? 0,
            weighted_cost: settled?.weighted ?? 0,
            ttfb_ms: this.ttfbMs,
            duration_ms: duration,
            tps: counted ? tokensPerSecond(counted.completion_tokens, this.generationMs(now)) : 0,
            had_tools: this.hadTools,
            tool_choice: this.toolChoice,
            byok: false,
            provider: this.provider,
            fell_back: false,
            error: error === undefined
              ? null
              : serverSide
              ? `${Catalog[error.code].wire ?? error.code} (${error.status})`
              : (error.detail ?? error.userMessage).slice(0, 500),
            created_at: this.createdAt
          })
          return settled
        }),
        Effect.ensuring(this.scope ? Scope.close(this.scope, Exit.void) : Effect.void)
      )
    })
  }
}

/** What a failed request's row records: its GatewayError, `internal_error` for a defect, null when interrupted. */
const failureOf = (cause: Cause.Cause<GatewayError>): GatewayError | null => {
  const failure = Cause.findErrorOption(cause)
  if (failure._tag === "Some") return failure.value
  if (Cause.hasInterruptsOnly(cause)) return null
  // The defect itself is logged by `handle`; the row records the code it answered with.
  return fail(defectCode(cause))
}

const toolChoiceLabel = (choice: ChatRequest["tool_choice"]): string | null =>
  choice === undefined ? null : typeof choice === "string" ? choice : `function:${choice.function.name}`.slice(0, 80)

const upstreamRequest = (req: ChatRequest, model: ModelConfig, maxTokens: number, stream: boolean): UpstreamRequest => {
  const out: { -readonly [K in keyof UpstreamRequest]?: UpstreamRequest[K] } = {
    model: model.route.model,
    messages: req.messages,
    stream,
    max_tokens: maxTokens
  }
  if (req.temperature !== undefined) out.temperature = req.temperature
  if (req.top_p !== undefined) out.top_p = req.top_p
  if (req.stop !== undefined) out.stop = req.stop
  if (req.reasoning_effort !== undefined) out.reasoning_effort = req.reasoning_effort as "none" | "low" | "high" | "max"
  // The tool options only go with tools: OpenAI-compatible upstreams reject them alone.
  if (req.tools !== undefined && req.tools.length > 0) {
    out.tools = req.tools
    if (req.tool_choice !== undefined) out.tool_choice = req.tool_choice
    if (req.parallel_tool_calls !== undefined) out.parallel_tool_calls = req.parallel_tool_calls
  }
  return out as UpstreamRequest
}

const outputUsage = (usage: Usage) => ({
  prompt_tokens: usage.prompt_tokens,
  completion_tokens: usage.completion_tokens,
  total_tokens: usage.prompt_tokens + usage.completion_tokens
})

/** Receipt and quota headers; omitted (null) rather than failing the request. */
const safeReceipt = (
  exchange: Exchange,
  plan: PlanConfig,
  settled: { readonly standing: Standing; readonly weighted: number } | null
) => {
  try {
    if (!settled || !exchange.ticket) return null
    return receipt(String(exchange.rowId), settled.standing, exchange.ticket.rpm, plan, settled.weighted)
  } catch {
    return null
  }
}

interface Accumulated {
  content: string
  reasoning: string
  tools: Array<{ id: string; name: string; args: string }>
  finish: FinishReason
}

const accumulate = (acc: Accumulated, event: UpstreamEvent, exchange: Exchange): Accumulated => {
  switch (event._tag) {
    case "Content":
      acc.content += event.text
      exchange.deliveredChars += event.text.length
      break
    case "Reasoning":
      acc.reasoning += event.text
      exchange.deliveredChars += event.text.length
      break
    case "ToolCallStart":
      acc.tools[event.index] = { id: event.id, name: event.name, args: "" }
      break
    case "ToolCallArgs": {
      const call = acc.tools[event.index]
      if (call) call.args += event.fragment
      exchange.deliveredChars += event.fragment.length
      break
    }
    case "Finish":
      acc.finish = event.reason
      break
    case "Usage":
      exchange.usage = event.usage
      break
  }
  return acc
}

const complete = (
  exchange: Exchange,
  plan: PlanConfig,
  answer: Effect.Effect<ReadonlyArray<UpstreamEvent>, UpstreamError>
) =>
  Effect.gen(function*() {
    exchange.markDispatched()
    const events = yield* Effect.mapError(answer, upstreamFailure)
    const acc: Accumulated = { content: "", reasoning: "", tools: [], finish: "stop" }
    for (const event of events) accumulate(acc, event, exchange)
    exchange.markFirstByte()
    const settled = yield* exchange.finish({ status: "success" })
    const usage = exchange.chargeable()
    const tools = acc.tools.filter(Boolean)
    const wellspring = safeReceipt(exchange, plan, settled)
    const body = {
      id: `chatcmpl-${exchange.requestId}`,
      object: "chat.completion",
      created: Math.floor(exchange.createdAt.getTime() / 1000),
      model: exchange.modelId,
      choices: [{
        index: 0,
        message: {
          role: "assistant",
          content: acc.content.length > 0 || tools.length === 0 ? acc.content : null,
          ...(acc.reasoning.length > 0 ? { reasoning: acc.reasoning } : {}),
          ...(tools.length > 0
            ? {
              tool_calls: tools.map((t) => ({ id: t.id, type: "function", function: { name: t.name, arguments: t.args } }))
            }
            : {})
        },
        finish_reason: acc.finish
      }],
      usage: outputUsage(usage),
      ...(wellspring ? { wellspring } : {})
    }
    const headers = settled && exchange.ticket
      ? quotaHeaders(settled.standing, exchange.ticket.rpm, exchange.rowId)
      : { "x-request-id": String(exchange.rowId) }
    return HttpServerResponse.jsonUnsafe(body, { headers })
  })

/** SSE framing of one answer; the last data frame carries usage, receipt and finish_reason. */
const sseFraming = (exchange: Exchange, plan: PlanConfig) => {
  const created = Math.floor(exchange.createdAt.getTime() / 1000)
  const id = `chatcmpl-${exchange.requestId}`
  const prefix = `data: {"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${
    JSON.stringify(exchange.modelId)
  },"choices":[{"index":0,"delta":`
  const frame = (delta: string) => `${prefix}${delta},"finish_reason":null}]}\n\n`
  let finish: FinishReason = "stop"

  const toFrame = (event: UpstreamEvent): string => {
    switch (event._tag) {
      case "Content":
        exchange.deliveredChars += event.text.length
        return frame(`{"content":${JSON.stringify(event.text)}}`)
      case "Reasoning":
        exchange.deliveredChars += event.text.length
        return frame(`{"reasoning":${JSON.stringify(event.text)}}`)
      case "ToolCallStart":
        return frame(`{"tool_calls":[{"index":${event.index},"id":${JSON.stringify(event.id)},"type":"function","function":{"name":${
          JSON.stringify(event.name)
        },"arguments":""}}]}`)
      case "ToolCallArgs":
        exchange.deliveredChars += event.fragment.length
        return frame(`{"tool_calls":[{"index":${event.index},"function":{"arguments":${JSON.stringify(event.fragment)}}}]}`)
      case "Finish":
        finish = event.reason
        return ""
      case "Usage":
        exchange.usage = event.usage
        return ""
    }
  }

  return {
    head: frame(`{"role":"assistant","content":""}`),
    frames: (events: ReadonlyArray<UpstreamEvent>) => {
      let out = ""
      for (const event of events) out += toFrame(event)
      return out
    },
    end: Effect.gen(function*() {
      const settled = yield* exchange.finish({ status: "success" })
      const wellspring = safeReceipt(exchange, plan, settled)
      const final = {
        id,
        object: "chat.completion.chunk",
        created,
        model: exchange.modelId,
        choices: [{ index: 0, delta: {}, finish_reason: finish }],
        usage: outputUsage(exchange.chargeable()),
        ...(wellspring ? { wellspring } : {})
      }
      return `data: ${JSON.stringify(final)}\n\ndata: [DONE]\n\n`
    })
  }
}

const streamed = (
  exchange: Exchange,
  plan: PlanConfig,
  adapter: UpstreamAdapter,
  request: UpstreamRequest
) =>
  Effect.gen(function*() {
    const context = yield* Effect.context<never>()
    const framing = sseFraming(exchange, plan)
    exchange.markDispatched()
    // A failure before the first event (or before the wait for it ran out) is still a JSON error.
    const body = yield* sseBody(
      context,
      exchange.scope!,
      (sink) => adapter.open(request, sink),
      framing.head,
      {
        started: () => exchange.markFirstEvent(),
        frames: framing.frames,
        end: framing.end,
        failed: (error) =>
          Effect.suspend(() => {
            if (error.usage) exchange.usage = error.usage
            return exchange.finish({ status: "error", error: upstreamFailure(error) })
          }).pipe(Effect.asVoid),
        cancelled: exchange.finish({ status: "cancelled" }).pipe(Effect.asVoid)
      }
    ).pipe(Effect.mapError(upstreamFailure))
    const headers = {
      ...quotaHeaders(exchange.ticket!.reserved, exchange.ticket!.rpm, exchange.rowId),
      "cache-control": "no-cache",
      "x-accel-buffering": "no"
    }
    return yield* sseResponse(body, headers)
  })

/** Parses a body no deeper than `maxDepth`, a large one on a turn of its own (see `readJsonBody`). */
export const parseBody = (text: string, maxDepth: number): Effect.Effect<unknown, GatewayError> =>
  readJsonBody(text, maxDepth)

const validate = (req: ChatRequest, model: ModelConfig | undefined) => {
  if (model === undefined || model.disabled) {
    return req.model.startsWith("@")
      ? fail("model_not_found", { message: "BYOK 모델 참조를 사용할 수 없습니다. 등록된 자격 증명이 없거나 기능이 꺼져 있습니다." })
      : fail("model_not_found")
  }
  if (!model.supports_chat) return fail("model_not_chat")
  if (req.tools !== undefined && req.tools.length > 0 && !model.supports_tools) return fail("tools_not_supported")
  if (req.reasoning_effort !== undefined) {
    const allowed = model.supports_reasoning ? model.reasoning_efforts : []
    if (!allowed.includes(req.reasoning_effort as never)) {
      return fail("invalid_reasoning_effort", {
        message: allowed.length > 0
          ? `이 모델에서 허용되지 않는 reasoning_effort 값입니다. 허용 값: ${allowed.join(", ")}`
          : "이 모델은 reasoning_effort 를 지원하지 않습니다. 허용 값: 없음"
      })
    }
  }
  return null
}

export const chatCompletions = HttpRouter.add(
  "POST",
  "/v1/chat/completions",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const auth = yield* Auth
    const catalog = yield* LiveCatalog
    const settings = yield* Settings
    const admission = yield* Admission
    const upstreams = yield* Upstreams
    const log = yield* RequestLog

    const pipeline = Effect.gen(function*() {
      const caller = yield* auth.authenticateKey(request.headers.authorization)
      yield* guardFailures(caller)
      const requestId = yield* currentRequestId
      const exchange = new Exchange(caller, yield* log.nextId, requestId, log)

      const run = Effect.gen(function*() {
        yield* auth.gate(caller, headersOf(request))
        const text = yield* readText(request)
        const limits = settings.config.limits
        const body = yield* parseBody(text, limits.json_depth)
        exchange.modelId = modelIdOfBody(body)
        const req = yield* Effect.fromResult(decodeChatRequest(body, limits))
        exchange.stream = req.stream === true
        exchange.hadTools = (req.tools?.length ?? 0) > 0
        exchange.toolChoice = toolChoiceLabel(req.tool_choice)
        const model = catalog.current().byId.get(req.model)
        const invalid = validate(req, model)
        if (invalid) return yield* Effect.fail(invalid)
        const m = model!
        exchange.modelId = m.id
        const size = measure(req.messages, req.tools)
        if (size.images > 0 && !m.supports_images) return yield* Effect.fail(fail("images_not_supported"))
        const { exceeds, tokens } = yield* exceedsLimit(size, m.max_input_tokens)
        if (exceeds) {
          return yield* Effect.fail(fail("input_too_long", {
            message: `입력이 모델의 최대 입력 토큰 수(${m.max_input_tokens})를 초과했습니다. (추정 ${tokens})`
          }))
        }
        exchange.estimatedInput = tokens
        const maxTokens = Math.min(req.max_tokens ?? m.max_output_tokens, m.max_output_tokens)
        const plan = settings.planFor(caller.account.plan)
        exchange.provider = m.route.provider

        yield* exchange.admit(admission, {
          accountId: caller.account.id,
          plan,
          model: m,
          estimatedInputTokens: exchange.estimatedInput,
          byok: false
        })
        const adapter = yield* upstreams.get(m.route.provider).pipe(Effect.mapError(upstreamFailure))
        const upstreamReq = upstreamRequest(req, m, maxTokens, exchange.stream)
        return exchange.stream
          ? yield* streamed(exchange, plan, adapter, upstreamReq)
          : yield* complete(exchange, plan, completeChat(adapter, upstreamReq))
      })

      return yield* finishing(exchange, run)
    })

    return yield* handle(renderInference, pipeline)
  })
)

const renderWithRow = (error: GatewayError, rowId: number) =>
  HttpServerResponse.setHeader(renderInference(error), "x-request-id", String(rowId))

/**
 * Runs a request's work so that its exchange always finishes: an error (or a defect, rendered by `handle`
 * as 500 internal_error) finishes it as an error, an interruption as cancelled. Errors are rendered with the
 * request row id.
 */
export const finishing = <R>(
  exchange: Exchange,
  run: Effect.Effect<HttpServerResponse.HttpServerResponse, GatewayError, R>
) =>
  run.pipe(
    Effect.tapCause((cause) => {
      const error = failureOf(cause)
      return error ? exchange.finish({ status: "error", error }) : Effect.void
    }),
    Effect.onInterrupt(() => exchange.finish({ status: "cancelled" })),
    Effect.tapError((error) => recordFailure(exchange.caller, error)),
    Effect.catch((error) => Effect.succeed(renderWithRow(error, exchange.rowId)))
  )

export { inferenceBody }
