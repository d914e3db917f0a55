/**
 * The OpenAI Responses API: `POST /v1/responses` as a wire codec on the inference pipeline
 * (inference/Pipeline.ts: auth, gates, admission, upstream, rows are the pipeline's), and
 * `GET` / `DELETE /v1/responses/{id}` over the account's stored responses (Store.ts).
 *
 * Per request the codec keeps its turn (the response id, the decoded call, the stream encoder) keyed by the
 * exchange's view, from `decode` to the answer.
 */
import { Clock, Context, Effect, Layer, Result } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { Auth } from "../../auth/Auth.js"
import { isByokModel } from "../../byok/Reference.js"
import { LiveCatalog } from "../../config/Live.js"
import { fail, type GatewayError } from "../../errors/Catalog.js"
import { renderInference } from "../../errors/Render.js"
import { handle, headersOf, json } from "../../http/Respond.js"
import type { Answer } from "../../inference/ChatWire.js"
import type { WireCodec } from "../../inference/Codec.js"
import type { ExchangeView } from "../../inference/Exchange.js"
import { lookupModel, pipelineRoute } from "../../inference/Pipeline.js"
import { PING_FRAME } from "../../inference/SseBody.js"
import type { Message } from "../../upstream/Upstream.js"
import {
  chatRequestOf,
  decodeResponsesRequest,
  nearestEffort,
  RESPONSE_ID_CHARS,
  type ResponsesCall,
  ResponsesMessages
} from "./Request.js"
import { ResponseStore } from "./Store.js"
import {
  assistantMessage,
  newId,
  type OutputItem,
  outputOf,
  responseObject,
  type ResponseMeta,
  statusOf,
  StreamEncoder
} from "./Wire.js"

/** Efforts a BYOK model may take (its provider refuses what its model lacks), as in chat. */
const BYOK_EFFORTS = ["none", "low", "high", "max"]

/**
 * Top-level fields of the Responses API that the gateway accepts and drops (named in
 * `x-wellspring-ignored-fields`). Only these names are ever echoed, never a client's own key.
 */
const IGNORED_FIELDS = [
  "include",
  "user",
  "truncation",
  "service_tier",
  "prompt_cache_key",
  "prompt_cache_retention",
  "safety_identifier",
  "stream_options",
  "top_logprobs",
  "max_tool_calls"
] as const

/** One request's state between `decode` and the answer. */
interface Turn {
  readonly id: string
  readonly call: ResponsesCall
  readonly createdAt: number
  encoder: StreamEncoder | null
  output: ReadonlyArray<OutputItem> | null
}

const notFound = () => fail("not_found", { message: ResponsesMessages.responseNotFound })

export const makeResponsesCodec = (
  store: typeof ResponseStore.Service,
  catalog: typeof LiveCatalog.Service
): WireCodec => {
  const turns = new WeakMap<ExchangeView, Turn>()

  const meta = (exchange: ExchangeView, turn: Turn): ResponseMeta => ({
    id: turn.id,
    createdAt: Math.floor(turn.createdAt / 1000),
    model: exchange.modelId,
    call: turn.call
  })

  /** The effort the model takes for a Responses effort (see `nearestEffort`). */
  const effortFor = (model: string, effort: string): string | undefined => {
    if (isByokModel(model)) return nearestEffort(effort, BYOK_EFFORTS)
    const config = lookupModel(catalog.current(), model)
    // An unknown model fails its own gate; the effort is left as sent.
    if (config === undefined) return effort
    return nearestEffort(effort, config.supports_reasoning ? config.reasoning_efforts : [])
  }

  const decode = Effect.fnUntraced(function*(
    body: unknown,
    exchange: ExchangeView,
    limits: Parameters<WireCodec["decode"]>[2]
  ) {
    const decoded = decodeResponsesRequest(body, limits)
    if (Result.isFailure(decoded)) return yield* Effect.fail(decoded.failure)
    const call = decoded.success
    const now = yield* Clock.currentTimeMillis
    let history: ReadonlyArray<Message> = []
    if (call.previousResponseId !== null) {
      const chain = yield* store.chain(exchange.accountId, call.previousResponseId, now, limits.messages)
      if (chain._tag === "NotFound") return yield* Effect.fail(notFound())
      if (chain._tag === "TooLong") return yield* Effect.fail(fail("invalid_request", { message: ResponsesMessages.storedTooLong }))
      history = chain.messages
    }
    const stream = call.chat.stream === true
    const chat = chatRequestOf(call, history, stream)
    const request = chat.reasoning_effort === undefined ? chat : (() => {
      const { reasoning_effort, ...rest } = chat
      const effort = effortFor(chat.model, reasoning_effort)
      return effort === undefined ? rest : { ...rest, reasoning_effort: effort }
    })()
    turns.set(exchange, { id: newId("resp"), call, createdAt: now, encoder: null, output: null })
    const present = body as Record<string, unknown>
    const ignored = IGNORED_FIELDS.filter((f) => present[f] !== undefined && present[f] !== null)
    return ignored.length > 0 ? { request, ignored } : { request }
  })

  /** Keeps the finished response (the stream's or the whole answer's output) when the client asked to store it. */
  const completed = (exchange: ExchangeView, answer: Answer): Effect.Effect<void> =>
    Effect.suspend(() => {
      const turn = turns.get(exchange)
      if (turn === undefined) return Effect.void
      let output: ReadonlyArray<OutputItem>
      if (turn.encoder !== null) {
        turn.encoder.finish()
        output = turn.encoder.output()
      } else output = outputOf(answer)
      turn.output = output
      if (!turn.call.store) return Effect.void
      const response = responseObject(meta(exchange, turn), {
        status: statusOf(answer.finish),
        output,
        usage: exchange.chargeable()
      })
      const reply = assistantMessage(output)
      const kept = store.put({
        id: turn.id,
        accountId: exchange.accountId,
        previousId: turn.call.previousResponseId,
        createdAt: turn.createdAt,
        messages: reply === null ? turn.call.input : [...turn.call.input, reply],
        response
      })
      return kept ? Effect.void : Effect.logWarning("response not stored: larger than responses.max_response_bytes").pipe(
        Effect.annotateLogs({ request: exchange.rowId })
      )
    })

  return {
    api: "responses",
    render: renderInference,
    decode,
    answer: (exchange, answer, delivery) => {
      const turn = turns.get(exchange)!
      const output = turn.output ?? outputOf(answer)
      const body = responseObject(meta(exchange, turn), {
        status: statusOf(answer.finish),
        output,
        usage: exchange.chargeable(),
        receipt: delivery.receipt
      })
      return json(body, 200, { ...delivery.headers })
    },
    stream: (exchange, meter) => {
      const turn = turns.get(exchange)!
      const encoder = new StreamEncoder(meta(exchange, turn), meter)
      turn.encoder = encoder
      return {
        head: encoder.head(),
        frames: (events) => encoder.frames(events),
        last: (receipt) => encoder.last(exchange.chargeable(), receipt),
        failed: (error: GatewayError) => encoder.failed(error, exchange.chargeable())
      }
    },
    ping: PING_FRAME,
    completed
  }
}

/** `POST /v1/responses` on the pipeline. */
export const createResponse = pipelineRoute(
  "/v1/responses",
  (context: Context.Context<ResponseStore | LiveCatalog>) =>
    makeResponsesCodec(Context.get(context, ResponseStore), Context.get(context, LiveCatalog))
)

/** The caller of a stored-response route (key and account gates), and the path's id when it can be one. */
type StoredStep<A> = (
  store: typeof ResponseStore.Service,
  accountId: string,
  id: string,
  now: number
) => Effect.Effect<A, GatewayError>

const storedRoute = <A>(f: StoredStep<A>) => storedHandler(f as StoredStep<unknown>)

const storedHandler = Effect.fnUntraced(function*(f: StoredStep<unknown>) {
  const request = yield* HttpServerRequest.HttpServerRequest
  const auth = yield* Auth
  const store = yield* ResponseStore
  return yield* handle(renderInference, storedAnswer(request, auth, store, f))
})

/** The stored-response route's steps, made once (see "No generator function per request" in docs/decisions.md). */
const storedAnswer = Effect.fnUntraced(function*(
  request: HttpServerRequest.HttpServerRequest,
  auth: typeof Auth.Service,
  store: typeof ResponseStore.Service,
  f: StoredStep<unknown>
) {
  const caller = yield* auth.bearer(request)
  yield* auth.gate(caller, headersOf(request))
  const params = yield* HttpRouter.params
  const id = params.id ?? ""
  if (id.length === 0 || id.length > RESPONSE_ID_CHARS) return yield* Effect.fail(notFound())
  const now = yield* Clock.currentTimeMillis
  return json(yield* f(store, caller.account.id, id, now))
})

/** `GET /v1/responses/{id}`: the account's stored response; another account's, expired or unknown: 404. */
export const retrieveResponse = HttpRouter.add(
  "GET",
  "/v1/responses/:id",
  storedRoute((store, accountId, id, now) =>
    Effect.flatMap(store.get(accountId, id, now), (found) => found === null ? Effect.fail(notFound()) : Effect.succeed(found))
  )
)

/** `DELETE /v1/responses/{id}`: deletes the account's stored response (`{id, object, deleted}`); else 404. */
export const deleteResponse = HttpRouter.add(
  "DELETE",
  "/v1/responses/:id",
  storedRoute((store, accountId, id) =>
    Effect.flatMap(store.remove(accountId, id), (deleted) =>
      deleted ? Effect.succeed({ id, object: "response.deleted", deleted: true }) : Effect.fail(notFound()))
  )
)

export const responsesRoutes = Layer.mergeAll(createResponse, retrieveResponse, deleteResponse)
