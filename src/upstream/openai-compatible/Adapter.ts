/**
 * The adapter for OpenAI-compatible upstreams: the shared HTTP transport (`../http/Transport.ts`, one
 * undici `Pool` per provider origin) with the chat codec (`Chat.ts`: `Encode.ts`, `Normalize.ts`,
 * `Errors.ts`) for `open`, and embeddings (`Embeddings.ts`). `complete` is derived from `open` for every
 * adapter (`../Complete.ts`).
 */
import { type Duration, Effect } from "effect"
import type { OpenAiCompatibleProvider } from "../../config/GatewayConfig.js"
import { openChat } from "../http/ChatCall.js"
import { HttpTransport } from "../http/Transport.js"
import type { UpstreamAdapter } from "../Upstream.js"
import { openAiChatCodec } from "./Chat.js"
import { openAiEmbed } from "./Embeddings.js"

export type OpenAiCompatibleProviderConfig = typeof OpenAiCompatibleProvider.Type

export interface OpenAiCompatibleAdapter extends UpstreamAdapter {
  /** Closes the pool: lets in-flight requests finish for up to `grace`, then destroys it. */
  readonly close: (grace?: Duration.Input) => Effect.Effect<void>
}

export const makeOpenAiCompatibleAdapter = (
  provider: OpenAiCompatibleProviderConfig,
  apiKey?: string
): OpenAiCompatibleAdapter => {
  const url = new URL(provider.base_url)
  const basePath = url.pathname.replace(/\/+$/, "")
  const transport = new HttpTransport(url.origin, provider.connections, provider.timeouts)
  return {
    open: openChat(transport, openAiChatCodec(basePath, apiKey)),
    embed: openAiEmbed(transport, basePath, apiKey),
    close: (grace) => transport.close(grace)
  }
}

/** The adapter as a scoped resource: its pool closes with the scope. */
export const openAiCompatibleAdapter = (
  provider: OpenAiCompatibleProviderConfig,
  apiKey?: string
) => Effect.acquireRelease(Effect.sync(() => makeOpenAiCompatibleAdapter(provider, apiKey)), (a) => a.close())
