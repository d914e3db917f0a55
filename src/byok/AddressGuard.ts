/**
 * The SSRF guard for every user-supplied URL of BYOK (a custom base URL, an Azure resource name assembled into a
 * host): what may be called, checked twice.
 *
 * 1. `check(url)`, before anything is sent: WHATWG parsing (which normalizes numeric hosts such as `2130706433`,
 *    `0x7f.1` and `017700000001` to `127.0.0.1`), https only (plain http only for operator-listed origins), no
 *    userinfo, no fragment, no backslash or control characters, no internal names (`localhost`, `*.internal`,
 *    `*.local`, single-label names...), and an IP literal must be a public unicast address. Addresses are
 *    classified with ipaddr.js, never parsed by hand; IPv6 forms that embed an IPv4 address (IPv4-mapped,
 *    IPv4-translated, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are judged by the address they embed.
 * 2. At connect time (`connector`), because DNS may answer differently later (rebinding): the socket's own DNS
 *    lookup is replaced by one that resolves, checks EVERY answer, and hands only checked addresses to the
 *    socket. An IP literal (which the socket never looks up) is checked in the connector itself. A refusal there
 *    fails the connection with an `AddressRefusedError`.
 *
 * Redirects are never followed (undici's Agent does not follow them; `request` turns any 3xx into a `redirect`
 * refusal). Origins on the operator's allow-list skip the scheme and address checks (test fakes, a trusted
 * internal model server); `allowedCidrs` admits chosen private ranges and nothing else.
 *
 * Refusals carry a detailed `kind` with a `detail` (for the operator's log) and what the user is told: a `code`
 * and its Korean message, neither ever repeating the URL. Everything that depends on where the URL leads (a
 * blocked name, a private or metadata address, a name resolving to one, a name that does not resolve) is one
 * code, `address_not_allowed`, so that answers never tell whether a name resolved or to what (issue 16). Only the
 * URL's own text (its form, scheme, userinfo) and a provider's redirect have codes of their own.
 */
import * as Dns from "node:dns"
import * as Net from "node:net"
import ipaddr from "ipaddr.js"
import { Agent, buildConnector, type Dispatcher } from "undici"
import { Catalog } from "../errors/Catalog.js"
import { ADDRESS_REFUSED } from "../upstream/http/Transport.js"

export type RefusalKind =
  | "invalid_url"
  | "insecure_scheme"
  | "userinfo"
  | "blocked_name"
  | "private_address"
  | "metadata_address"
  | "resolves_to_private"
  | "unresolvable"
  | "redirect"

/** What a user is told about a refusal. */
export type RefusalCode = "invalid_url" | "insecure_scheme" | "userinfo" | "redirect" | "address_not_allowed"

const CODES: Readonly<Record<RefusalKind, RefusalCode>> = {
  invalid_url: "invalid_url",
  insecure_scheme: "insecure_scheme",
  userinfo: "userinfo",
  redirect: "redirect",
  blocked_name: "address_not_allowed",
  private_address: "address_not_allowed",
  metadata_address: "address_not_allowed",
  resolves_to_private: "address_not_allowed",
  unresolvable: "address_not_allowed"
}

export const REFUSAL_MESSAGES: Readonly<Record<RefusalCode, string>> = {
  invalid_url: "주소 형식이 올바르지 않습니다. https://호스트/경로 형식의 주소를 입력하세요.",
  insecure_scheme: "https 주소만 사용할 수 있습니다.",
  userinfo: "주소에 사용자 정보(@ 앞부분)를 넣을 수 없습니다.",
  redirect: "공급자가 다른 주소로 리디렉션했습니다. 리디렉션은 따라가지 않습니다.",
  // The chat answer through a credential says the same (one message wherever it is shown).
  address_not_allowed: Catalog.address_not_allowed.message
}

export interface Refusal {
  /** Why, for the operator's log (and tests); never shown to the user. */
  readonly kind: RefusalKind
  /** What the user is told (`address_not_allowed` for every refusal about where the URL leads). */
  readonly code: RefusalCode
  readonly message: string
  /** For logs and tests only (e.g. the address range `loopback`); never contains the URL. */
  readonly detail: string
}

export const refusal = (kind: RefusalKind, detail: string): Refusal => ({
  kind,
  code: CODES[kind],
  message: REFUSAL_MESSAGES[CODES[kind]],
  detail
})

/** A refusal raised inside the transport (connect-time checks), so undici fails the request with it. */
export class AddressRefusedError extends Error {
  override readonly name = "AddressRefusedError"
  readonly code = ADDRESS_REFUSED
  constructor(readonly refusal: Refusal) {
    super(`address refused: ${refusal.kind} (${refusal.detail})`)
  }
}

/** The refusal an error carries, if it (or its cause) is one of ours. */
export const refusalOf = (error: unknown): Refusal | null => {
  let current = error
  for (let depth = 0; depth < 4 && current !== null && typeof current === "object"; depth++) {
    if (current instanceof AddressRefusedError) return current.refusal
    current = (current as { cause?: unknown }).cause
  }
  return null
}

// ---------------------------------------------------------------------------------------------
// Addresses

type Ip = ipaddr.IPv4 | ipaddr.IPv6

/** Cloud metadata endpoints: already refused by range, named separately so the refusal says what it is. */
const METADATA = [
  "169.254.169.254", // AWS, GCP, Azure, OpenStack, DigitalOcean...
  "169.254.170.2", // AWS ECS task metadata
  "100.100.100.200", // Alibaba Cloud
  "fd00:ec2::254" // AWS IMDS over IPv6
].map((a) => ipaddr.parse(a))

const isMetadata = (ip: Ip): boolean =>
  METADATA.some((m) => m.kind() === ip.kind() && m.toNormalizedString() === ip.toNormalizedString())

export type AddressVerdict =
  | { readonly ok: true }
  | { readonly ok: false; readonly kind: "private_address" | "metadata_address"; readonly range: string }

const OK: AddressVerdict = { ok: true }

const refuse = (ip: Ip, range: string): AddressVerdict =>
  isMetadata(ip) ? { ok: false, kind: "metadata_address", range } : { ok: false, kind: "private_address", range }

const v4FromParts = (hi: number, lo: number): ipaddr.IPv4 =>
  new ipaddr.IPv4([hi >> 8, hi & 0xff, lo >> 8, lo & 0xff])

const judgeV4 = (ip: ipaddr.IPv4, via: string): AddressVerdict => {
  const range = ip.range()
  return range === "unicast" ? OK : refuse(ip, via + range)
}

/** Public unicast only; IPv6 forms embedding an IPv4 address are judged by that address. */
export const judgeAddress = (ip: Ip): AddressVerdict => {
  if (ip.kind() === "ipv4") return judgeV4(ip as ipaddr.IPv4, "")
  const v6 = ip as ipaddr.IPv6
  if (isMetadata(v6)) return refuse(v6, "metadata")
  const range = v6.range()
  const p = v6.parts
  switch (range) {
    case "unicast": {
      // IPv4-compatible ::a.b.c.d (deprecated; never a real destination), judged by the embedded address.
      if (p[0] === 0 && p[1] === 0 && p[2] === 0 && p[3] === 0 && p[4] === 0 && p[5] === 0) {
        const embedded = judgeV4(v4FromParts(p[6]!, p[7]!), "ipv4Compatible:")
        return embedded.ok ? { ok: false, kind: "private_address", range: "ipv4Compatible" } : embedded
      }
      return OK
    }
    case "ipv4Mapped":
    case "rfc6145":
      return judgeV4(v4FromParts(p[6]!, p[7]!), `${range}:`)
    case "rfc6052":
      // 64:ff9b::/96 embeds the IPv4 address in its last 32 bits; 64:ff9b:1::/48 is for local use only.
      return p[2] === 0 && p[3] === 0 && p[4] === 0 && p[5] === 0
        ? judgeV4(v4FromParts(p[6]!, p[7]!), "nat64:")
        : { ok: false, kind: "private_address", range: "nat64LocalUse" }
    case "6to4":
      return judgeV4(v4FromParts(p[1]!, p[2]!), "6to4:")
    default:
      return refuse(v6, range)
  }
}

/** Parses an address literal (no brackets); null when it is not one. */
export const parseAddress = (text: string): Ip | null => {
  if (Net.isIP(text) === 0) return null
  try {
    return ipaddr.parse(text)
  } catch {
    return null
  }
}

// ---------------------------------------------------------------------------------------------
// Names

/** Names refused before any DNS: loopback and metadata names, and suffixes reserved for local networks. */
const BLOCKED_NAMES = new Set(["localhost", "metadata.google.internal", "metadata", "instance-data"])
const BLOCKED_SUFFIXES = [".localhost", ".internal", ".local", ".localdomain", ".home.arpa", ".arpa", ".lan", ".intranet"]

/** Null when the (lower-case, WHATWG-normalized) host name may be resolved; else why not. */
export const judgeName = (hostname: string): string | null => {
  const name = hostname.endsWith(".") ? hostname.slice(0, -1) : hostname
  if (name.length === 0) return "empty"
  if (BLOCKED_NAMES.has(name)) return name
  for (const suffix of BLOCKED_SUFFIXES) if (name.endsWith(suffix)) return `*${suffix}`
  // A single-label name is completed by the resolver's search domains: an internal host.
  if (!name.includes(".")) return "single-label"
  return null
}

// ---------------------------------------------------------------------------------------------
// Policy

export interface GuardPolicy {
  /** Origins (`scheme://host[:port]`) exempt from the scheme and address checks. */
  readonly allowlist: ReadonlySet<string>
  /** Address ranges admitted although not public (operator choice). */
  readonly allowedCidrs: ReadonlyArray<[Ip, number]>
}

/** `scheme://host[:port]` in the WHATWG form (`http://127.0.0.1:8080`), or null when not an http(s) origin. */
export const normalizeOrigin = (text: string): string | null => {
  try {
    const url = new URL(text)
    if (url.protocol !== "http:" && url.protocol !== "https:") return null
    if (url.username || url.password) return null
    return url.origin
  } catch {
    return null
  }
}

export const makePolicy = (options: {
  readonly allowlist?: ReadonlyArray<string>
  readonly allowedCidrs?: ReadonlyArray<string>
}): GuardPolicy => {
  const allowlist = new Set<string>()
  for (const entry of options.allowlist ?? []) {
    const origin = normalizeOrigin(entry)
    if (origin === null) throw new Error(`not an http(s) origin: ${entry}`)
    allowlist.add(origin)
  }
  const allowedCidrs = (options.allowedCidrs ?? []).map((c) => ipaddr.parseCIDR(c))
  return { allowlist, allowedCidrs }
}

const admittedByCidr = (policy: GuardPolicy, ip: Ip): boolean =>
  policy.allowedCidrs.some(([net, bits]) => net.kind() === ip.kind() && ip.match(net, bits))

/** The verdict on one address under a policy (public unicast, or inside an allowed range). */
export const judgeUnderPolicy = (policy: GuardPolicy, ip: Ip): AddressVerdict => {
  const verdict = judgeAddress(ip)
  return verdict.ok || admittedByCidr(policy, ip) ? OK : verdict
}

// ---------------------------------------------------------------------------------------------
// URL check

/** Longest user-supplied URL accepted. */
export const MAX_URL_LENGTH = 2048

export type UrlCheck =
  | {
    readonly ok: true
    readonly url: URL
    readonly origin: string
    /** On the operator's allow-list: no address checks at connect time. */
    readonly allowlisted: boolean
    /** The host as a name to resolve, or null for an IP literal (already judged). */
    readonly name: string | null
  }
  | { readonly ok: false; readonly refusal: Refusal }

const refused = (kind: RefusalKind, detail: string): UrlCheck => ({ ok: false, refusal: refusal(kind, detail) })

/**
 * The static check of a user-supplied URL. `allowQuery` admits a query string (base URLs have none).
 * Everything WHATWG would silently repair (backslashes, tabs, newlines) is refused instead.
 */
export const checkUrl = (policy: GuardPolicy, input: unknown, options: { readonly allowQuery?: boolean } = {}): UrlCheck => {
  if (typeof input !== "string" || input.length === 0) return refused("invalid_url", "empty")
  if (input.length > MAX_URL_LENGTH) return refused("invalid_url", "too long")
  // Control characters, spaces and backslashes: WHATWG strips or rewrites them, so the host could differ from
  // what a person reads.
  if (/[\u0000-\u0020\u007f-\u009f\\]/.test(input)) return refused("invalid_url", "control, space or backslash")
  if (input.includes("#")) return refused("invalid_url", "fragment")
  // Only the plain form `scheme://host...`: WHATWG also accepts `https:host`, `https:///host` and the like.
  if (!/^https?:\/\/[^/]/i.test(input)) {
    return /^[a-z][a-z0-9+.-]*:/i.test(input) && !/^https?:/i.test(input)
      ? refused("insecure_scheme", "scheme")
      : refused("invalid_url", "form")
  }
  let url: URL
  try {
    url = new URL(input)
  } catch {
    return refused("invalid_url", "unparseable")
  }
  if (url.protocol !== "https:" && url.protocol !== "http:") return refused("insecure_scheme", url.protocol)
  // `https://@host` parses to an empty username: look at the authority as written.
  const authority = input.slice(input.indexOf("//") + 2).split(/[/?]/, 1)[0]!
  if (url.username !== "" || url.password !== "" || authority.includes("@")) return refused("userinfo", "userinfo")
  if (!options.allowQuery && url.search !== "") return refused("invalid_url", "query")
  const allowlisted = policy.allowlist.has(url.origin)
  if (url.protocol === "http:" && !allowlisted) return refused("insecure_scheme", "http")
  if (allowlisted) return { ok: true, url, origin: url.origin, allowlisted, name: null }
  const host = url.hostname
  const literal = host.startsWith("[") ? host.slice(1, -1) : host
  const ip = parseAddress(literal)
  if (ip !== null) {
    const verdict = judgeUnderPolicy(policy, ip)
    if (!verdict.ok) return refused(verdict.kind, verdict.range)
    return { ok: true, url, origin: url.origin, allowlisted, name: null }
  }
  // WHATWG turns every numeric IPv4 form into dotted decimal; anything numeric left over is not a name.
  if (/^[0-9.]+$/.test(host) || /^0x/i.test(host)) return refused("invalid_url", "numeric host")
  const blocked = judgeName(host)
  if (blocked !== null) return refused("blocked_name", blocked)
  return { ok: true, url, origin: url.origin, allowlisted, name: host.endsWith(".") ? host.slice(0, -1) : host }
}

// ---------------------------------------------------------------------------------------------
// Resolution

export interface ResolvedAddress {
  readonly address: string
  readonly family: 4 | 6
}

/** Resolves a host name to every address; tests inject their own. */
export type Resolver = (hostname: string) => Promise<ReadonlyArray<ResolvedAddress>>

export const systemResolver: Resolver = (hostname) =>
  Dns.promises.lookup(hostname, { all: true, verbatim: true }).then((all) =>
    all.map((a) => ({ address: a.address, family: a.family === 6 ? 6 : 4 }))
  )

const codeOf = (error: unknown): string => {
  const code = (error as { code?: unknown } | null)?.code
  return typeof code === "string" ? code : "error"
}

/**
 * Resolves and checks every answer; fails with `AddressRefusedError` when any answer is refused, and when the
 * name does not resolve (`unresolvable`: answered like a private address, see the module comment).
 */
export const resolveChecked = async (
  policy: GuardPolicy,
  resolver: Resolver,
  hostname: string
): Promise<ReadonlyArray<ResolvedAddress>> => {
  let answers: ReadonlyArray<ResolvedAddress>
  try {
    answers = await resolver(hostname)
  } catch (error) {
    throw new AddressRefusedError(refusal("unresolvable", codeOf(error)))
  }
  if (answers.length === 0) throw new AddressRefusedError(refusal("unresolvable", "no address"))
  for (const answer of answers) {
    const ip = parseAddress(answer.address)
    const verdict: AddressVerdict = ip === null
      ? { ok: false, kind: "private_address", range: "unparseable answer" }
      : judgeUnderPolicy(policy, ip)
    if (!verdict.ok) {
      throw new AddressRefusedError(refusal("resolves_to_private", `${verdict.kind}:${verdict.range}`))
    }
  }
  return answers
}

// ---------------------------------------------------------------------------------------------
// The guard: static check, preflight, transport

export interface GuardOptions {
  readonly allowlist?: ReadonlyArray<string>
  readonly allowedCidrs?: ReadonlyArray<string>
  readonly resolver?: Resolver
  /** Socket connect timeout including the lookup (ms). */
  readonly connectTimeoutMs?: number
  /** Extra TLS options for the connector (e.g. `ca` in tests). */
  readonly tls?: { readonly ca?: string | Buffer | ReadonlyArray<string | Buffer> }
  /** Connections kept per origin. */
  readonly connections?: number
}

export interface GuardedResponse {
  readonly statusCode: number
  readonly headers: Record<string, string | Array<string> | undefined>
  readonly body: Dispatcher.ResponseData["body"]
}

export interface GuardRequest {
  readonly url: string
  readonly method?: "GET" | "POST"
  readonly headers?: Record<string, string>
  readonly body?: string
  readonly signal?: AbortSignal
  /** Admit a query string (request URLs carry one, e.g. Azure's `api-version`; base URLs do not). */
  readonly allowQuery?: boolean
  /**
   * Operator data (a provider's configured origin, never a user URL): no scheme or address checks, sent through
   * `trustedDispatcher`. Redirects are still refused.
   */
  readonly trusted?: boolean
}

export type GuardedResult =
  | { readonly ok: true; readonly response: GuardedResponse }
  | { readonly ok: false; readonly refusal: Refusal }

export interface AddressGuard {
  readonly policy: GuardPolicy
  /** Static check only (no DNS). */
  readonly check: (url: unknown, options?: { readonly allowQuery?: boolean }) => UrlCheck
  /**
   * Static check plus one resolution, for early feedback (verify). Not a guarantee: the connection is checked
   * again at connect time.
   */
  readonly preflight: (url: unknown, options?: { readonly allowQuery?: boolean }) => Promise<UrlCheck>
  /** The connector for an undici `Pool`/`Client`/`Agent` (`connect` option). */
  readonly connector: buildConnector.connector
  /** An undici Agent whose every connection goes through `connector`. Never follows redirects. */
  readonly dispatcher: Dispatcher
  /** An Agent without address checks, for operator-configured origins only. Never follows redirects. */
  readonly trustedDispatcher: Dispatcher
  /**
   * One request: static check, then the guarded transport, on a connection of its own (closed after it, so every
   * request resolves and checks the name again). A 3xx answer is a `redirect` refusal (its body is discarded). A
   * name that does not resolve is an `unresolvable` refusal; other transport errors (timeouts, resets) reject the
   * promise as they are.
   */
  readonly request: (request: GuardRequest) => Promise<GuardedResult>
  readonly close: () => Promise<void>
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | Array<Dns.LookupAddress>, family?: number) => void

export const makeAddressGuard = (options: GuardOptions = {}): AddressGuard => {
  const policy = makePolicy(options)
  const resolver = options.resolver ?? systemResolver
  const timeout = options.connectTimeoutMs ?? 10_000
  const tls = options.tls?.ca === undefined ? {} : { ca: options.tls.ca as string | Buffer | Array<string | Buffer> }

  /** The socket's DNS lookup: every answer checked; only checked addresses reach the socket. */
  const lookup = (hostname: string, lookupOptions: Dns.LookupOptions, callback: LookupCallback): void => {
    resolveChecked(policy, resolver, hostname).then(
      (answers) => {
        const wanted = lookupOptions.family === 4 || lookupOptions.family === 6 ? lookupOptions.family : 0
        const usable = wanted === 0 ? answers : answers.filter((a) => a.family === wanted)
        if (usable.length === 0) {
          callback(new AddressRefusedError(refusal("unresolvable", `no IPv${wanted} address`)), "", 0)
        } else if (lookupOptions.all) {
          callback(null, usable.map((a) => ({ address: a.address, family: a.family })))
        } else {
          callback(null, usable[0]!.address, usable[0]!.family)
        }
      },
      (error: NodeJS.ErrnoException) => callback(error, "", 0)
    )
  }

  const checked = buildConnector({ timeout, ...tls, lookup } as buildConnector.BuildOptions)
  const plain = buildConnector({ timeout, ...tls } as buildConnector.BuildOptions)

  const connector: buildConnector.connector = (opts, callback) => {
    const origin = `${opts.protocol}//${opts.host ?? (opts.port ? `${opts.hostname}:${opts.port}` : opts.hostname)}`
    if (policy.allowlist.has(origin)) return plain(opts, callback)
    if (opts.protocol !== "https:") {
      callback(new AddressRefusedError(refusal("insecure_scheme", "http")), null)
      return
    }
    const ip = parseAddress(opts.hostname)
    if (ip !== null) {
      // A literal is never looked up by the socket: judge it here.
      const verdict = judgeUnderPolicy(policy, ip)
      if (!verdict.ok) {
        callback(new AddressRefusedError(refusal(verdict.kind, verdict.range)), null)
        return
      }
      return plain(opts, callback)
    }
    const blocked = judgeName(opts.hostname.toLowerCase())
    if (blocked !== null) {
      callback(new AddressRefusedError(refusal("blocked_name", blocked)), null)
      return
    }
    return checked(opts, callback)
  }

  const dispatcher = new Agent({
    connect: connector,
    connections: options.connections ?? 16,
    keepAliveTimeout: 10_000
  })
  const trustedDispatcher = new Agent({
    connect: plain,
    connections: options.connections ?? 16,
    keepAliveTimeout: 10_000
  })

  const check = (url: unknown, checkOptions: { readonly allowQuery?: boolean } = {}) => checkUrl(policy, url, checkOptions)

  const preflight = async (url: unknown, checkOptions: { readonly allowQuery?: boolean } = {}): Promise<UrlCheck> => {
    const result = check(url, checkOptions)
    if (!result.ok || result.name === null) return result
    try {
      await resolveChecked(policy, resolver, result.name)
      return result
    } catch (error) {
      const refused = refusalOf(error)
      if (refused !== null) return { ok: false, refusal: refused }
      throw error
    }
  }

  const request = async (req: GuardRequest): Promise<GuardedResult> => {
    let url: URL
    if (req.trusted === true) {
      try {
        url = new URL(req.url)
      } catch {
        return { ok: false, refusal: refusal("invalid_url", "unparseable") }
      }
    } else {
      const result = check(req.url, { allowQuery: req.allowQuery ?? true })
      if (!result.ok) return result
      url = result.url
    }
    try {
      const response = await (req.trusted === true ? trustedDispatcher : dispatcher).request({
        origin: url.origin,
        path: url.pathname + url.search,
        method: req.method ?? "GET",
        headers: req.headers ?? {},
        body: req.body ?? null,
        signal: req.signal ?? null,
        reset: true
      })
      if (response.statusCode >= 300 && response.statusCode < 400) {
        response.body.dump().catch(() => undefined)
        return { ok: false, refusal: refusal("redirect", String(response.statusCode)) }
      }
      return { ok: true, response }
    } catch (error) {
      const refused = refusalOf(error)
      if (refused !== null) return { ok: false, refusal: refused }
      throw error
    }
  }

  return {
    policy,
    check,
    preflight,
    connector,
    dispatcher,
    trustedDispatcher,
    request,
    close: () => Promise.all([dispatcher.close(), trustedDispatcher.close()]).then(() => undefined)
  }
}
