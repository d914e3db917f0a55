/**
 * The address a request comes from. The TCP peer, unless that peer is one of `trusted_proxies` (CIDR list in
 * config): then the rightmost `X-Forwarded-For` entry that is not itself a trusted proxy. A client cannot choose
 * its counted address by sending the header: an untrusted peer's header is ignored, and entries a trusted proxy
 * appended after the client's own are the ones read. Every per-address limit (connections, failed
 * authentication, public endpoints) uses this one rule.
 */
import ipaddr from "ipaddr.js"

type Ip = ipaddr.IPv4 | ipaddr.IPv6
type Range = readonly [Ip, number]

/** Parses an address as it appears on a socket or in `X-Forwarded-For` (IPv4-mapped IPv6 becomes IPv4). */
const parseIp = (text: string): Ip | null => {
  const trimmed = text.trim()
  if (trimmed.length === 0 || trimmed.length > 64) return null
  try {
    const ip = ipaddr.parse(trimmed.startsWith("[") && trimmed.endsWith("]") ? trimmed.slice(1, -1) : trimmed)
    return ip.kind() === "ipv6" && (ip as ipaddr.IPv6).isIPv4MappedAddress() ? (ip as ipaddr.IPv6).toIPv4Address() : ip
  } catch {
    return null
  }
}

/** Whether `text` is a CIDR range (or a single address) `trusted_proxies` accepts. */
export const isRange = (text: string): boolean => parseRange(text) !== null

const parseRange = (text: string): Range | null => {
  try {
    if (text.includes("/")) {
      const [ip, bits] = ipaddr.parseCIDR(text)
      return [ip, bits]
    }
  } catch {
    return null
  }
  const ip = parseIp(text)
  return ip === null ? null : [ip, ip.kind() === "ipv4" ? 32 : 128]
}

const inRange = (ip: Ip, [base, bits]: Range): boolean => ip.kind() === base.kind() && ip.match(base, bits)

export interface ClientAddresses {
  /** The counted address of a request from `peer` carrying this `X-Forwarded-For` header. */
  readonly of: (peer: string | undefined, forwardedFor: string | ReadonlyArray<string> | undefined) => string
  /** Whether the TCP peer is a trusted proxy (exempt from per-address connection caps). */
  readonly isTrustedProxy: (peer: string | undefined) => boolean
}

/** Entries of `X-Forwarded-For` looked at, from the right; a longer chain is cut. */
const MAX_HOPS = 16

export const make = (trustedProxies: ReadonlyArray<string>): ClientAddresses => {
  const ranges = trustedProxies.map(parseRange).filter((r): r is Range => r !== null)
  const trusted = (ip: Ip) => ranges.some((range) => inRange(ip, range))
  const normal = (peer: string | undefined): string => {
    const ip = peer === undefined ? null : parseIp(peer)
    return ip === null ? "unknown" : ip.toString()
  }
  const isTrustedProxy = (peer: string | undefined) => {
    if (ranges.length === 0 || peer === undefined) return false
    const ip = parseIp(peer)
    return ip !== null && trusted(ip)
  }
  return {
    isTrustedProxy,
    of: (peer, forwardedFor) => {
      if (!isTrustedProxy(peer) || forwardedFor === undefined) return normal(peer)
      const header = typeof forwardedFor === "string" ? forwardedFor : forwardedFor.join(",")
      const hops = header.slice(-MAX_HOPS * 48).split(",").slice(-MAX_HOPS)
      for (let i = hops.length - 1; i >= 0; i--) {
        const ip = parseIp(hops[i]!)
        // A malformed entry ends the chain: everything left of it was written by someone we cannot trust.
        if (ip === null) break
        if (!trusted(ip)) return ip.toString()
      }
      return normal(peer)
    }
  }
}
