/**
 * The account API from the browser: same-origin fetches with the `ws-session` cookie (sent by the browser, never
 * read by script: it is HttpOnly). Changes go as JSON, which with the same origin is what the gateway's
 * cross-site check wants. Every failure becomes an `ApiError` carrying the API's Korean message; a 401 also tells
 * the app that the session is gone.
 */

export class ApiError extends Error {
  constructor(readonly status: number, readonly code: string | null, message: string) {
    super(message)
  }
}

let unauthorized: () => void = () => {}
/** Called on every 401 (except the sign-in's own): the app returns to the sign-in page. */
export const onUnauthorized = (handler: () => void) => {
  unauthorized = handler
}

const record = (value: unknown): Record<string, unknown> | null =>
  typeof value === "object" && value !== null && !Array.isArray(value) ? (value as Record<string, unknown>) : null

/** The Korean message of any of the gateway's error forms. */
export const messageOf = (body: unknown, status: number): string => {
  const b = record(body)
  const error = b?.error
  if (typeof error === "string" && error !== "") return error
  const inner = record(error)
  if (inner && typeof inner.message === "string") return inner.message
  if (b && typeof b.message === "string") return b.message
  if (status === 0) return "서버에 연결할 수 없습니다. 네트워크 상태를 확인하세요."
  if (status >= 500) return `서버에서 요청을 처리하지 못했습니다. 잠시 후 다시 시도하세요. (HTTP ${status})`
  return `요청을 처리하지 못했습니다. (HTTP ${status})`
}

const codeOf = (body: unknown): string | null => {
  const inner = record(record(body)?.error)
  return inner && typeof inner.code === "string" ? inner.code : null
}

export const api = async <T = any>(method: string, path: string, body?: unknown): Promise<T> => {
  const headers: Record<string, string> = { accept: "application/json" }
  const init: RequestInit = { method, credentials: "same-origin", headers, cache: "no-store" }
  if (method === "POST" || method === "PUT" || method === "PATCH") {
    headers["content-type"] = "application/json"
    init.body = JSON.stringify(body ?? {})
  }
  let response: Response
  try {
    response = await fetch(path, init)
  } catch {
    throw new ApiError(0, null, messageOf(null, 0))
  }
  const text = await response.text()
  let data: unknown = null
  try {
    data = text === "" ? null : JSON.parse(text)
  } catch {
    data = null
  }
  if (response.status === 401 && path !== "/api/user/session") unauthorized()
  const wrapped = record(data)
  if (!response.ok || (wrapped?.success === false && wrapped.error !== undefined)) {
    throw new ApiError(response.status, codeOf(data), messageOf(data, response.status))
  }
  return data as T
}

export const get = <T = any>(path: string) => api<T>("GET", path)
