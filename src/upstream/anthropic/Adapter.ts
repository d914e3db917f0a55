/**
 * The adapter for Anthropic's Messages API: the shared HTTP transport (`../http/Transport.ts`, one undici `Pool`
 * per provider origin) and push call (`../http/ChatCall.ts`) with the Anthropic chat codec below (`Encode.ts`,
 * `Decode.ts`, `Errors.ts`). `complete` is derived from `open` for every adapter (`../Complete.ts`).
 *
 * Anthropic has no embeddings API: `embed` fails with a 400 (`upstream_rejected`) without sending anything, and the
 * catalog refuses `supports_embeddings` on a model routed to an anthropic provider in the first place.
 */
import { type Duration, Effect } from "effect"
import type { AnthropicProvider } from "../../config/GatewayConfig.js"
import { secretRedactor } from "../../telemetry/LogText.js"
import { openChat } from "../http/ChatCall.js"
import type { ChatCodec, ChatDecoder } from "../http/Codec.js"
import { HttpTransport } from "../http/Transport.js"
import { type UpstreamAdapter, UpstreamError } from "../Upstream.js"
import { decodeResponse, StreamDecoder } from "./Decode.js"
import { encodeRequest, type EncodeOptions, MESSAGES_PATH } from "./Encode.js"
import { mapError, type Secrets } from "./Errors.js"

export type AnthropicProviderConfig = typeof AnthropicProvider.Type

/** The streamed decoder, plus the whole-answer decoding for a non-streamed request (the `ChatDecoder` shape). */
export class AnthropicDecoder extends StreamDecoder implements ChatDecoder {
  constructor(private readonly keys: Secrets) {
    super(keys)
  }

  onJson(body: unknown): UpstreamError | undefined {
    const events = decodeResponse(body, this.keys)
    if (events instanceof UpstreamError) return events
    for (const event of events) this.events.push(event)
    return undefined
  }
}

/**
 * The Anthropic chat codec. `basePath`: the provider URL's path without a trailing slash (`""` for
 * `https://api.anthropic.com`, `/anthropic` for a proxy mounted there); requests go to `<basePath>/v1/messages`.
 * `apiKey`: sent as `x-api-key` (or a bearer token with `scheme: "bearer"`), and redacted from error details.
 */
export const anthropicChatCodec = (
  basePath: string,
  apiKey: string | undefined,
  scheme?: EncodeOptions["scheme"],
  /** The whole request path, when it is not `<basePath>/v1/messages` (a BYOK base URL that ends in `/v1`). */
  messagesPath?: string,
  /** Headers added to every request (BYOK: the provider's static headers). */
  extraHeaders?: Readonly<Record<string, string>>
): ChatCodec => {
  const options: EncodeOptions = scheme === undefined ? { apiKey } : { apiKey, scheme }
  // Built once: every error of every call through this codec is redacted with it.
  const secrets = secretRedactor(apiKey ? [apiKey] : [])
  const path = messagesPath ?? `${basePath}${MESSAGES_PATH}`
  return {
    encode: (request) => {
      const encoded = encodeRequest(request, options)
      if (encoded instanceof UpstreamError) return encoded
      const headers = extraHeaders === undefined ? encoded.headers : { ...extraHeaders, ...encoded.headers }
      return { method: "POST", path, headers, body: encoded.body }
    },
    decoder: () => new AnthropicDecoder(secrets),
    statusError: (status, body) => mapError(status, body, secrets),
    redact: secrets
  }
}

const NO_EMBEDDINGS = Effect.fail(
  new UpstreamError({ kind: "status", status: 400, detail: "the Anthropic Messages API has no embeddings endpoint" })
)

/** `embed` of an Anthropic provider: refused before anything is sent (400 `upstream_rejected`). */
export const anthropicEmbed: UpstreamAdapter["embed"] = () => NO_EMBEDDINGS

export interface AnthropicAdapter extends UpstreamAdapter {
  /** Closes the pool: lets in-flight requests finish for up to `grace`, then destroys it. */
  readonly close: (grace?: Duration.Input) => Effect.Effect<void>
}

export const makeAnthropicAdapter = (
  provider: AnthropicProviderConfig,
  apiKey?: string,
  scheme?: EncodeOptions["scheme"]
): AnthropicAdapter => {
  const url = new URL(provider.base_url)
  const basePath = url.pathname.replace(/\/+$/, "")
  const transport = new HttpTransport(url.origin, provider.connections, provider.timeouts)
  return {
    open: openChat(transport, anthropicChatCodec(basePath, apiKey, scheme)),
    embed: anthropicEmbed,
    close: (grace) => transport.close(grace)
  }
}

/** The adapter as a scoped resource: its pool closes with the scope. */
export const anthropicAdapter = (provider: AnthropicProviderConfig, apiKey?: string) =>
  Effect.acquireRelease(Effect.sync(() => makeAnthropicAdapter(provider, apiKey)), (a) => a.close())
