/**
 * The live check of a credential (verify, save, and the model listing): the provider's probe request sent through
 * the address guard, its outcome classified into `{ ok: true, ... } | { ok: false, kind, message }`.
 *
 * The `kind` is the spec's probe code (verify answers it with HTTP 200 `ok: false`; save answers 400 with it as
 * `code`). The message is Korean and fixed per kind: nothing the provider answered is ever repeated (a custom
 * endpoint could echo the key), and neither is the URL. An address guard refusal is its public `code`
 * (`address_not_allowed` for anything about where the URL leads); its detailed kind goes to `detail`.
 *
 * The whole probe (connect, answer, body) runs under one timeout on the Effect clock; interruption (the timeout,
 * a client that went away) aborts the request.
 */
import { Effect } from "effect"
import type { Dispatcher } from "undici"
import { classifyStatus, classifyTransportError, codeOf, type FailureKind } from "../upstream/Failure.js"
import { type AddressGuard, type GuardOptions, makeAddressGuard, type Refusal, type RefusalCode } from "./AddressGuard.js"
import type { ByokConfig } from "./Config.js"
import {
  type AuthScheme,
  isOperatorUrl,
  type Meta,
  type ModelListItem,
  parseModelList,
  type ProviderDef,
  requestHeaders,
  requestUrl,
  resolveBaseUrl
} from "./Providers.js"

export type ProbeFailureKind = FailureKind

export const PROBE_MESSAGES: Readonly<Record<Exclude<ProbeFailureKind, RefusalCode>, string>> = {
  auth_failed: "공급자가 API 키를 거부했습니다(인증 실패). 키를 확인하세요.",
  permission_denied: "이 키로는 해당 공급자 기능을 사용할 권한이 없습니다.",
  not_found: "공급자에서 요청한 경로를 찾지 못했습니다. 주소, 리소스 이름, API 버전을 확인하세요.",
  rate_limited: "공급자가 요청 한도 초과로 거절했습니다. 잠시 후 다시 시도하세요.",
  upstream_rejected: "공급자가 요청을 거절했습니다. 입력한 값을 확인하세요.",
  upstream_error: "공급자 서버에 오류가 발생했습니다. 잠시 후 다시 시도하세요.",
  timeout: "공급자가 제한 시간 안에 응답하지 않았습니다.",
  network_error: "공급자에 연결하지 못했습니다. 주소를 확인하세요.",
  tls_error: "공급자의 TLS 인증서를 확인하지 못했습니다.",
  bad_response: "공급자의 응답을 이해하지 못했습니다. OpenAI 호환 주소인지 확인하세요."
}

export interface ProbeFailure {
  readonly ok: false
  readonly kind: ProbeFailureKind
  /** Korean, fixed per kind. */
  readonly message: string
  /** For logs only (HTTP status, error code, refusal detail); never provider text, never a secret or URL. */
  readonly detail: string
}

/** A guard refusal as a probe failure: the user sees its code, the log its kind and detail. */
const refused = (r: Refusal): ProbeFailure => failure(r.code, `${r.kind}: ${r.detail}`, r.message)

export interface ProbeSuccess {
  readonly ok: true
  /** Models of the listing; null when the provider has none or its listing could not be read. */
  readonly models: ReadonlyArray<ModelListItem> | null
  readonly model_count: number | null
  /** The assembled base URL, when a user value shaped it (spec: `resolved_base_url`); else null. */
  readonly resolved_base_url: string | null
}

export type ProbeResult = ProbeSuccess | ProbeFailure

export type ListResult =
  | { readonly ok: true; readonly models: ReadonlyArray<ModelListItem> }
  | ProbeFailure
  | { readonly ok: false; readonly kind: "no_listing"; readonly message: string; readonly detail: string }

export const failure = (kind: ProbeFailureKind, detail: string, message?: string): ProbeFailure => ({
  ok: false,
  kind,
  message: message ?? (PROBE_MESSAGES as Record<string, string>)[kind]!,
  detail
})

/** Largest body read from a listing (OpenRouter's catalog is a few MB). */
export const MAX_LISTING_BYTES = 16 * 1024 * 1024
/** Error bodies are read up to this size, for classification only. */
const MAX_ERROR_BYTES = 16 * 1024

type Exchange =
  | { readonly _tag: "Ok"; readonly text: string }
  | { readonly _tag: "Failed"; readonly failure: ProbeFailure }

const readBounded = async (body: Dispatcher.ResponseData["body"], max: number): Promise<string | null> => {
  const chunks: Array<Buffer> = []
  let size = 0
  for await (const chunk of body as AsyncIterable<Buffer>) {
    size += chunk.length
    if (size > max) {
      body.destroy()
      return null
    }
    chunks.push(chunk)
  }
  return Buffer.concat(chunks).toString("utf8")
}

/** One GET through the guard (operator origins of the provider trusted); never rejects. */
const exchange = (
  guard: AddressGuard,
  provider: ProviderDef,
  url: string,
  headers: Record<string, string>,
  maxBytes: number
) =>
  Effect.promise(async (signal): Promise<Exchange> => {
    try {
      const trusted = isOperatorUrl(provider, url)
      const result = await guard.request({ url, headers, signal, allowQuery: true, trusted })
      if (!result.ok) return { _tag: "Failed", failure: refused(result.refusal) }
      const { statusCode, body } = result.response
      if (statusCode < 200 || statusCode >= 300) {
        const text = (await readBounded(body, MAX_ERROR_BYTES).catch(() => null)) ?? ""
        return { _tag: "Failed", failure: failure(classifyStatus(statusCode, text), `status ${statusCode}`) }
      }
      const length = Number(result.response.headers["content-length"])
      if (Number.isFinite(length) && length > maxBytes) {
        body.destroy()
        return { _tag: "Failed", failure: failure("bad_response", `body of ${length} bytes`) }
      }
      const text = await readBounded(body, maxBytes)
      if (text === null) return { _tag: "Failed", failure: failure("bad_response", `body over ${maxBytes} bytes`) }
      return { _tag: "Ok", text }
    } catch (error) {
      const code = codeOf(error)
      return { _tag: "Failed", failure: failure(classifyTransportError(error), code || (error as Error)?.name || "error") }
    }
  })

const parseListing = (provider: ProviderDef, text: string): ReadonlyArray<ModelListItem> | null => {
  try {
    return parseModelList(provider.modelsFormat, JSON.parse(text))
  } catch {
    return null
  }
}

export interface ProbeCredential {
  readonly provider: ProviderDef
  readonly scheme: AuthScheme
  readonly secret: string
  readonly meta: Meta
}

export interface ProbeOptions {
  readonly timeoutMs: number
  readonly maxListingBytes?: number
}

/** A user-shaped base URL must itself be a clean base: no query, and it passes the static check. */
const checkBase = (guard: AddressGuard, credential: ProbeCredential): ProbeFailure | null => {
  const base = resolveBaseUrl(credential.provider, credential.meta)
  if (!base.userShaped || isOperatorUrl(credential.provider, base.url)) return null
  const check = guard.check(base.url)
  return check.ok ? null : refused(check.refusal)
}

const withTimeout = <A extends { readonly ok: boolean }>(effect: Effect.Effect<A>, timeoutMs: number) =>
  Effect.timeoutOrElse(effect, {
    duration: timeoutMs,
    orElse: () => Effect.succeed(failure("timeout", `over ${timeoutMs} ms`))
  })

const list = (guard: AddressGuard, credential: ProbeCredential, maxBytes: number) =>
  Effect.gen(function*() {
    const url = requestUrl(credential.provider, credential.meta, "models")
    if (url === null) return null
    const headers = requestHeaders(credential.provider, credential.scheme, credential.secret, credential.meta)
    const answer = yield* exchange(guard, credential.provider, url, headers, maxBytes)
    if (answer._tag === "Failed") return answer.failure
    const models = parseListing(credential.provider, answer.text)
    return models === null ? failure("bad_response", "not a model listing") : models
  })

/**
 * Verify/save: the provider's probe. When the probe is the listing itself its models are counted; otherwise
 * (OpenRouter) the listing is fetched afterwards, and a failure there leaves `model_count` null (the key passed).
 */
export const probe = (guard: AddressGuard, credential: ProbeCredential, options: ProbeOptions): Effect.Effect<ProbeResult> =>
  Effect.suspend(() => {
    const refused = checkBase(guard, credential)
    if (refused !== null) return Effect.succeed<ProbeResult>(refused)
    const maxBytes = options.maxListingBytes ?? MAX_LISTING_BYTES
    const base = resolveBaseUrl(credential.provider, credential.meta)
    const resolved_base_url = base.userShaped ? base.url : null
    const { provider } = credential
    const probeIsListing = provider.probePath === provider.modelsPath
    const run = Effect.gen(function*() {
      const url = requestUrl(provider, credential.meta, "probe")!
      const headers = requestHeaders(provider, credential.scheme, credential.secret, credential.meta)
      const answer = yield* exchange(guard, credential.provider, url, headers, maxBytes)
      if (answer._tag === "Failed") return answer.failure as ProbeResult
      let models: ReadonlyArray<ModelListItem> | null = null
      if (probeIsListing) {
        models = parseListing(provider, answer.text)
        if (models === null) return failure("bad_response", "not a model listing") as ProbeResult
      } else {
        const listed = yield* list(guard, credential, maxBytes)
        models = Array.isArray(listed) ? listed : null
      }
      return { ok: true, models, model_count: models === null ? null : models.length, resolved_base_url } as ProbeResult
    })
    return withTimeout(run, options.timeoutMs)
  })

/** `GET /:id/models`: the provider's listing (no listing: `no_listing`, the spec's 501 `byok_upstream_error`). */
export const listModels = (guard: AddressGuard, credential: ProbeCredential, options: ProbeOptions): Effect.Effect<ListResult> =>
  Effect.suspend(() => {
    if (credential.provider.modelsPath === null) {
      return Effect.succeed<ListResult>({
        ok: false,
        kind: "no_listing",
        message: "이 공급자는 모델 목록을 제공하지 않습니다.",
        detail: "no listing"
      })
    }
    const refused = checkBase(guard, credential)
    if (refused !== null) return Effect.succeed<ListResult>(refused)
    const run = Effect.map(
      list(guard, credential, options.maxListingBytes ?? MAX_LISTING_BYTES),
      (listed): ListResult => Array.isArray(listed) ? { ok: true, models: listed } : (listed as ProbeFailure)
    )
    return withTimeout(run, options.timeoutMs)
  })

/**
 * Guard options for BYOK: the operator's http allow-list for user URLs, the allowed private ranges and the
 * connect timeout. (A provider's own operator-configured origins need no entry: requests to them are sent as
 * trusted, see `ProviderDef.operatorOrigins`.) Rebuild the guard when the config changes.
 */
export const guardOptionsFor = (config: ByokConfig): GuardOptions => ({
  allowlist: config.http_allowlist,
  allowedCidrs: config.allowed_cidrs,
  connectTimeoutMs: config.connect_timeout_ms
})

export const makeByokGuard = (config: ByokConfig, extra: Pick<GuardOptions, "resolver" | "tls"> = {}): AddressGuard =>
  makeAddressGuard({ ...guardOptionsFor(config), ...extra })
