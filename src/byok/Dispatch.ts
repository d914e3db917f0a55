/**
 * Calls through a user's credential: the upstream adapter of one opened credential, on the shared HTTP transport
 * and the same codecs as catalog providers (OpenAI-compatible, Anthropic Messages).
 *
 * - Connections: one undici pool per provider origin, shared by every credential on it; the credential only adds
 *   its headers. A user-shaped origin (custom base URL, Azure resource) connects through the address guard's
 *   connector, which checks every resolved address at connect time; only a provider's operator-configured origin
 *   connects without it. Redirects are never followed (a 3xx is an upstream failure).
 * - Secrets: the secret lives in the header set of the adapter and nowhere else. Providers echo rejected keys, in
 *   whole or in pieces: the codecs remove every run of 6 characters of the secret from upstream text before they
 *   bound it (`telemetry/LogText.ts`), and every failure leaving the adapter is redacted once more.
 */
import { Effect } from "effect"
import type { Timeouts } from "../config/GatewayConfig.js"
import { type Redactor, secretRedactor } from "../telemetry/LogText.js"
import { anthropicChatCodec, anthropicEmbed } from "../upstream/anthropic/Adapter.js"
import { openChat } from "../upstream/http/ChatCall.js"
import { HttpTransport } from "../upstream/http/Transport.js"
import { openAiChatCodecWith } from "../upstream/openai-compatible/Chat.js"
import { openAiEmbedWith } from "../upstream/openai-compatible/Embeddings.js"
import { type UpstreamAdapter, UpstreamError } from "../upstream/Upstream.js"
import { type AddressGuard, type Refusal, refusal } from "./AddressGuard.js"
import type { ByokConfig } from "../config/Byok.js"
import {
  type AuthScheme,
  isOperatorUrl,
  type Meta,
  type ProviderDef,
  requestHeaders,
  requestUrl,
  resolveBaseUrl
} from "./Providers.js"

/** A credential with its secret and meta opened (never stored beyond the credential's own state). */
export interface OpenedCredential {
  readonly provider: ProviderDef
  readonly scheme: AuthScheme
  readonly secret: string
  readonly meta: Meta
}

/** Most provider origins with open pools at once; the least recently used closes first. */
export const MAX_ORIGINS = 256

/** `scheme://host[:port]` exactly as written at the start of `url` (what a request URL is sliced after). */
const rawOriginOf = (url: string): string => /^[a-z][a-z0-9+.-]*:\/\/[^/?#]*/i.exec(url)?.[0] ?? ""

/** `open` with every failure redacted, before it resolves (`mapError`) and after (the sink's `onError`). */
const redactedOpen = (open: UpstreamAdapter["open"], mapError: (e: UpstreamError) => UpstreamError): UpstreamAdapter["open"] =>
  (request, sink) =>
    Effect.mapError(
      open(request, {
        onEvents: (events) => sink.onEvents(events),
        onEnd: () => sink.onEnd(),
        onError: (error) => sink.onError(mapError(error))
      }),
      mapError
    )

const redactError = (redact: Redactor) => (error: UpstreamError): UpstreamError => {
  const detail = redact(error.detail)
  return detail === error.detail
    ? error
    : new UpstreamError({
      kind: error.kind,
      detail,
      ...(error.status !== undefined ? { status: error.status } : {}),
      ...(error.usage !== undefined ? { usage: error.usage } : {})
    })
}

/** The pools of BYOK calls, per origin and trust; closed with the BYOK runtime. */
export class CredentialTransports {
  private readonly pools = new Map<string, HttpTransport>()
  readonly timeouts: Timeouts

  constructor(private readonly guard: AddressGuard, private readonly config: ByokConfig) {
    this.timeouts = { connect_ms: config.connect_timeout_ms, ...config.dispatch_timeouts }
  }

  get(origin: string, trusted: boolean): HttpTransport {
    const key = `${trusted ? "t" : "u"} ${origin}`
    const found = this.pools.get(key)
    if (found !== undefined) {
      // Most recently used last.
      this.pools.delete(key)
      this.pools.set(key, found)
      return found
    }
    if (this.pools.size >= MAX_ORIGINS) {
      const [oldestKey, oldest] = this.pools.entries().next().value!
      this.pools.delete(oldestKey)
      Effect.runFork(oldest.close())
    }
    const transport = new HttpTransport(
      origin,
      this.config.connections_per_origin,
      this.timeouts,
      trusted ? undefined : this.guard.connector
    )
    this.pools.set(key, transport)
    return transport
  }

  close(): Effect.Effect<void> {
    return Effect.suspend(() => {
      const all = [...this.pools.values()]
      this.pools.clear()
      return Effect.forEach(all, (t) => t.close("2 seconds"), { concurrency: "unbounded", discard: true })
    })
  }
}

/**
 * The adapter of one credential, or the guard's refusal of its base URL (a URL saved under an older policy).
 * Built once per credential state and reused for every request through it.
 */
export const credentialAdapter = (
  transports: CredentialTransports,
  guard: AddressGuard,
  credential: OpenedCredential
): UpstreamAdapter | Refusal => {
  const { provider, scheme, secret, meta } = credential
  const base = resolveBaseUrl(provider, meta).url
  const trusted = isOperatorUrl(provider, base)
  let origin: string
  if (trusted) {
    try {
      origin = new URL(base).origin
    } catch {
      return refusal("invalid_url", "operator base URL")
    }
  } else {
    const checked = guard.check(base)
    if (!checked.ok) return checked.refusal
    origin = checked.url.origin
  }
  const raw = rawOriginOf(base)
  const pathOf = (operation: "chat" | "embeddings") => (model: string): string => {
    const url = requestUrl(provider, meta, operation, model)
    return url === null ? "/" : url.slice(raw.length)
  }
  const transport = transports.get(origin, trusted)
  const credentialHeaders = requestHeaders(provider, scheme, secret, meta)
  const redact = secretRedactor([secret])
  const mapError = redactError(redact)
  /** Every embeddings failure redacted too (transport failures included). */
  const redactedEmbed = (embed: UpstreamAdapter["embed"]): UpstreamAdapter["embed"] => (model, input) =>
    Effect.mapError(embed(model, input), mapError)

  if (provider.wire === "anthropic") {
    const codec = anthropicChatCodec(
      "",
      secret,
      scheme.id === "bearer" ? "bearer" : "x-api-key",
      pathOf("chat")(""),
      provider.staticHeaders
    )
    return { open: redactedOpen(openChat(transport, codec), mapError), embed: anthropicEmbed }
  }

  const headers = (accept: string) => ({ ...credentialHeaders, "content-type": "application/json", accept })
  const open = openChat(
    transport,
    openAiChatCodecWith({
      path: pathOf("chat"),
      sseHeaders: headers("text/event-stream"),
      jsonHeaders: headers("application/json"),
      maxTokensField: provider.id === "openai" ? "max_completion_tokens" : "max_tokens",
      mapError,
      redact
    })
  )
  const embedPath = provider.embeddingsPath === null ? null : pathOf("embeddings")
  return {
    open: redactedOpen(open, mapError),
    embed: embedPath === null
      ? anthropicEmbed
      : redactedEmbed(openAiEmbedWith(transport, embedPath, headers("application/json"), mapError, redact))
  }
}

export const isRefusal = (value: UpstreamAdapter | Refusal): value is Refusal => "kind" in value
