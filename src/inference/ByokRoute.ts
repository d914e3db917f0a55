/**
 * A request through the caller's own credential (`@provider[:label]/model`, chat and embeddings): the gates, the
 * credential, admission (RPM and the abuse cooldown only), the dispatch, and what a failed dispatch does.
 *
 * - A guest is refused (403 `byok_disabled`, the guest message); so is every account while BYOK is off.
 * - A `rejected` credential is not called: the request falls back, or fails with 400 `byok_credential_rejected`.
 * - A dispatch that fails before anything reached the client: an auth or permission failure marks the credential
 *   `rejected` with the kind as `last_error_code` (here at once, every replica soon); then, when the account's
 *   effective fallback is on and the credential names a `fallback_model_id` that can take the request, the request
 *   runs again on that pool model, admitted and charged as a pool request (row: `fell_back`).
 * - A failure after the first byte cannot fall back: the stream ends without `[DONE]`.
 */
import { Effect } from "effect"
import { Byok } from "../byok/Byok.js"
import { Credentials } from "../byok/Credentials.js"
import { type ByokReference, rpmWindowOf } from "../byok/Reference.js"
import type { ModelConfig } from "../config/GatewayConfig.js"
import { LiveCatalog, Settings } from "../config/Live.js"
import { AccountMessages, fail, type GatewayError } from "../errors/Catalog.js"
import { Admission } from "../quota/Admission.js"
import type { UpstreamAdapter, UpstreamError } from "../upstream/Upstream.js"
import type { Admitter, ExchangeView } from "./Exchange.js"
import { classify, type Failure } from "../upstream/Failure.js"
import type { PlannedStep, Step } from "./Plan.js"

const admissionModels = new Map<string, ModelConfig>()

/**
 * The model admission sees for a BYOK request: only its id (the RPM window, one per provider) and its RPM limit
 * are read, since BYOK requests take no pool, daily cap or in-flight slot.
 */
export const byokAdmissionModel = (provider: string, rpm: number): ModelConfig => {
  const id = rpmWindowOf(provider)
  const cached = admissionModels.get(id)
  if (cached !== undefined && cached.rate_limit_rpm === rpm) return cached
  const model: ModelConfig = {
    id,
    owned_by: provider,
    created: 0,
    supports_tools: true,
    supports_reasoning: true,
    supports_images: true,
    supports_embeddings: true,
    supports_chat: true,
    reasoning_efforts: [],
    max_input_tokens: Number.MAX_SAFE_INTEGER,
    max_output_tokens: Number.MAX_SAFE_INTEGER,
    rate_limit_rpm: rpm,
    concurrency: Number.MAX_SAFE_INTEGER,
    daily_cap: null,
    weights: { input: 0, output: 0 },
    disabled: false,
    route: { provider: `byok:${provider}`, model: "" }
  }
  admissionModels.set(id, model)
  return model
}

export interface ByokPlan<A, R> {
  /** The call through the credential; its upstream failures go through `mapFailure`. */
  readonly attempt: (
    adapter: UpstreamAdapter,
    mapFailure: (error: UpstreamError) => GatewayError
  ) => Effect.Effect<A, GatewayError, R>
  /**
   * Prepares the same request on the pool model (its gates and limits): the pool step (Plan.ts) that records the
   * fallback, admits and runs it; fails when that model cannot take it, and the BYOK failure is answered instead.
   */
  readonly fallback: (model: ModelConfig) => Effect.Effect<Step<A, R>, GatewayError>
}

/** A BYOK request's resolved credential: where it goes (the row's `provider`, with `byok`) and the plan's steps. */
export interface ByokSteps<A, R> {
  readonly provider: string
  readonly steps: ReadonlyArray<PlannedStep<A, R>>
}

/**
 * The steps of a BYOK request: the credential (skipped when it is rejected), then, when the account's fallback is
 * on and the credential names a pool model that can take the request, that model. Changes nothing on the
 * exchange but its ticket (`admit`): the pipeline records the route it returns.
 */
export const byokSteps = <A, R>(exchange: ExchangeView & Admitter, reference: ByokReference, plan: ByokPlan<A, R>) =>
  resolveSteps(exchange, reference, plan) as Effect.Effect<
    ByokSteps<A, R>,
    GatewayError,
    Effect.Services<ReturnType<typeof resolveSteps>>
  >

/**
 * `byokSteps`, made once: a generator function made per request would keep the request alive (docs/decisions.md,
 * "No generator function per request").
 */
const resolveSteps = Effect.fnUntraced(function*(
  exchange: ExchangeView & Admitter,
  reference: ByokReference,
  plan: ByokPlan<any, any>
) {
  // The plan's answer and requirements pass through unchanged; `byokSteps` restores their types.
  type A = any
  type R = any
  const account = exchange.caller.account
  if (account.is_guest) return yield* Effect.fail(fail("byok_disabled", { message: AccountMessages.byokGuest }))
  const byok = yield* Byok
  const credentials = yield* Credentials
  const admission = yield* Admission
  const settings = yield* Settings
  const catalog = yield* LiveCatalog
  const credential = yield* credentials.resolve(account.id, reference)

  const fallbackOn = account.byok_fallback_override ?? byok.config.fallback_default_on
  const fallbackModel = fallbackOn && credential.fallbackModelId !== null
    ? catalog.current().byId.get(credential.fallbackModelId)
    : undefined

  const throughCredential: PlannedStep<A, R> = () => {
    if (credential.status === "rejected") {
      return Effect.succeed(fail("byok_credential_rejected", {
        detail: `credential ${credential.id} is rejected (${credential.lastErrorCode ?? "unknown"})`
      }))
    }
    let dispatchFailure: Failure | null = null
    const mapFailure = (error: UpstreamError): GatewayError => {
      const failure = classify(error, "byok")
      dispatchFailure = failure
      return failure.error
    }
    return Effect.succeed({
      admit: Effect.asVoid(exchange.admit(admission, {
        accountId: account.id,
        plan: settings.planFor(account.plan),
        model: byokAdmissionModel(credential.provider.id, byok.config.rate_limit_rpm),
        estimatedInputTokens: exchange.estimatedInput,
        byok: true
      })),
      run: plan.attempt(credential.adapter, mapFailure),
      // Only a failed dispatch moves on (not, say, a refusal of the answer's own); it may condemn the credential.
      movesOn: () =>
        Effect.suspend(() => {
          const failed = dispatchFailure as Failure | null
          if (failed === null) return Effect.succeed(false)
          return Effect.as(failed.condemns ? credentials.reject(credential, failed.kind) : Effect.void, true)
        })
    })
  }

  /** The pool model when it can take the request; otherwise the BYOK failure is the answer. */
  const toPool: PlannedStep<A, R> = (previous) => {
    const original = previous!
    if (fallbackModel === undefined || fallbackModel.disabled) return Effect.fail(original)
    return Effect.catch(plan.fallback(fallbackModel), (refused) =>
      Effect.logInfo("BYOK fallback model cannot take the request").pipe(
        Effect.annotateLogs({ fallback_model: fallbackModel.id, code: refused.code }),
        Effect.andThen(Effect.fail(original))
      ))
  }
  const steps: ByokSteps<A, R> = { provider: credential.provider.id, steps: [throughCredential, toPool] }
  return steps
})
