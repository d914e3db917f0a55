import { Effect } from "effect"
import { StatusCache } from "../../src/status/Status.js"
import { BoundListeners } from "../../src/http/Server.js"
import { flushRequestLog } from "../support/Rows.js"
import type { TestGateway } from "../support/Gateway.js"

/** Writes the queued request rows, then recomputes every status resource now (instead of waiting a period). */
export const refreshStatus = async (gw: TestGateway) => {
  await flushRequestLog(gw)
  await gw.run(Effect.flatMap(StatusCache, (cache) =>
    Effect.all([cache.fleet.refresh, cache.quota.refresh, cache.server.refresh, cache.allTime.refresh, cache.incidents.refresh], {
      discard: true
    })))
}

/** Base URL of the first listener serving `origin`. */
export const originUrl = (gw: TestGateway, origin: "inference" | "account" | "status") =>
  gw.run(Effect.map(BoundListeners, ({ listeners }) => {
    const listener = listeners.find((l) => l.origins.includes(origin))
    if (listener === undefined) throw new Error(`no listener serves ${origin}`)
    return `http://127.0.0.1:${listener.port}`
  }))

export interface Answer {
  readonly status: number
  readonly headers: Headers
  readonly body: any
}

export const get = async (url: string, headers: Record<string, string> = {}): Promise<Answer> => {
  const res = await fetch(url, { headers })
  const text = await res.text()
  let body: unknown = text
  try {
    body = JSON.parse(text)
  } catch {
    // not JSON
  }
  return { status: res.status, headers: res.headers, body }
}

/** One chat completion with the gateway's dev key. */
export const chat = async (gw: TestGateway, model: string, extra: Record<string, unknown> = {}) => {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${gw.key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "안녕하세요" }], max_tokens: 16, ...extra })
  })
  const text = await res.text()
  return { status: res.status, text }
}

export const sortedKeys = (o: object) => Object.keys(o).sort()
