/**
 * CSRF defence of the account API (issue 8, finding 6): a mutation authenticated by the `ws-session` cookie
 * must come from the dashboard's own pages, and a body-carrying one must be JSON.
 *
 * Same origin means any of:
 * - `Sec-Fetch-Site: same-origin` or `none` (every current browser sends it; `none` is a user-initiated request);
 * - an `Origin` equal to the request's own origin: `http` (the listeners speak plain HTTP) or the first
 *   `X-Forwarded-Proto`, with the `Host` header or the first `X-Forwarded-Host`. Trusting the forwarded headers
 *   is safe here: a browser cannot attach them to a cross-site request without a CORS preflight, which this
 *   gateway never grants, so they only matter behind a proxy that sets them;
 * - an `Origin` listed in `dashboard_origins`.
 * Anything else is refused, including a cookie mutation with neither `Sec-Fetch-Site` nor `Origin` (browsers
 * always send `Origin` on a cross-origin POST, and on every POST since 2020; only old or non-browser clients
 * omit both, and those can use a Bearer key) and `Origin: null` (sandboxed frames, opaque redirects).
 *
 * JSON: POST, PUT and PATCH need `Content-Type: application/json` (parameters such as `charset` allowed), even
 * with an empty body. The three "simple" types a cross-site form or no-cors fetch may send (`text/plain`,
 * form-encoded, multipart), and no type at all, are refused, so any cross-origin attempt needs a preflight.
 *
 * Bearer-authenticated requests are not checked: a browser never attaches a Bearer key by itself.
 */
import type { Code } from "../errors/Catalog.js"

/** Methods that change nothing; every other method is a mutation. */
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"])
/** Mutations that carry a body and therefore need the JSON content type. */
const BODY_METHODS = new Set(["POST", "PUT", "PATCH"])
/** Longest header value we parse; real origins and hosts are far shorter. */
const MAX_HEADER_CHARS = 2048

type Headers = Readonly<Record<string, string | ReadonlyArray<string> | undefined>>

const single = (value: string | ReadonlyArray<string> | undefined): string | undefined =>
  typeof value === "string" && value.length <= MAX_HEADER_CHARS ? value : undefined

/** First entry of a comma-separated proxy header (`X-Forwarded-*` may be appended to by each hop). */
const firstOf = (value: string | undefined): string | undefined => {
  const first = value?.split(",")[0]?.trim()
  return first ? first : undefined
}

/** `scheme://host[:port]` normalized (lower case, default port dropped), or null when not an http(s) origin. */
export const normalizeOrigin = (raw: string): string | null => {
  try {
    const url = new URL(raw)
    if (url.protocol !== "http:" && url.protocol !== "https:") return null
    // An origin has no path, query, fragment or credentials.
    if (url.username || url.password || url.search || url.hash || (url.pathname !== "/" && url.pathname !== "")) return null
    if (raw.endsWith("/")) return null
    return url.origin
  } catch {
    return null
  }
}

/** The origins this very request was addressed to (see the module comment). */
export const ownOrigins = (headers: Headers): ReadonlySet<string> => {
  const schemes = new Set(["http"])
  const proto = firstOf(single(headers["x-forwarded-proto"]))?.toLowerCase()
  if (proto === "http" || proto === "https") schemes.add(proto)
  const hosts = [single(headers.host), firstOf(single(headers["x-forwarded-host"]))]
  const origins = new Set<string>()
  for (const host of hosts) {
    // A host header is `name[:port]`; anything with other URL syntax is not one.
    if (host === undefined || !/^[A-Za-z0-9.\-\[\]:]+$/.test(host)) continue
    for (const scheme of schemes) {
      const origin = normalizeOrigin(`${scheme}://${host}`)
      if (origin !== null) origins.add(origin)
    }
  }
  return origins
}

/** `dashboard_origins` normalized once, for comparison with a request's `Origin`. */
export const allowedOrigins = (configured: ReadonlyArray<string>): ReadonlySet<string> =>
  new Set(configured.map(normalizeOrigin).filter((origin): origin is string => origin !== null))

export const isMutation = (method: string): boolean => !SAFE_METHODS.has(method.toUpperCase())

/** Reads with side effects: `GET /api/user/me/keys/:id/reveal` (rate-limited, audited). */
export const isSensitiveRead = (path: string): boolean => path.split("?")[0]!.endsWith("/reveal")

export const isSameOrigin = (headers: Headers, dashboardOrigins: ReadonlySet<string>): boolean => {
  const site = single(headers["sec-fetch-site"])?.trim().toLowerCase()
  if (site === "same-origin" || site === "none") return true
  const raw = single(headers.origin)
  if (raw === undefined) return false
  const origin = normalizeOrigin(raw.trim())
  if (origin === null) return false
  return dashboardOrigins.has(origin) || ownOrigins(headers).has(origin)
}

/** True for `application/json` with or without parameters. */
export const isJsonContentType = (value: string | undefined): boolean =>
  value !== undefined && value.split(";")[0]!.trim().toLowerCase() === "application/json"

/**
 * The refusal for a cookie-authenticated request, or null when it may proceed: reads always; mutations only
 * from the same origin (403 `cross_site_request`) and, with a body method, as JSON (415
 * `unsupported_content_type`). The origin is judged first.
 */
export const cookieRequestRefusal = (
  method: string,
  headers: Headers,
  dashboardOrigins: ReadonlySet<string>,
  path = ""
): Code | null => {
  if (!isMutation(method)) {
    // A read that spends a budget and writes an audit row (key reveal) is held to the same origin rule, so a
    // cross-site page cannot burn the account's reveal limit or fill its audit log.
    return isSensitiveRead(path) && !isSameOrigin(headers, dashboardOrigins) ? "cross_site_request" : null
  }
  if (!isSameOrigin(headers, dashboardOrigins)) return "cross_site_request"
  if (BODY_METHODS.has(method.toUpperCase()) && !isJsonContentType(single(headers["content-type"]))) {
    return "unsupported_content_type"
  }
  return null
}
