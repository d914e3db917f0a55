/**
 * Key-cache invalidations: what the gateway's key cache holds for how long, and the messages that drop entries
 * from it. Defined once here and used by `Auth` (every replica) and the operator CLI.
 *
 * Wire format on the PostgreSQL channel `wellspring_auth`: `key:<sha256 hex>`, `account:<account id>` or
 * `byok:<account id>` (the account's BYOK credentials changed: status, primary, fallback, deletion),
 * optionally followed by `|<tag>`, the sending replica's tag (so that a replica skips the echo of its own
 * announcements). The CLI sends untagged messages.
 */
import { Effect } from "effect"
import type { SqlClient } from "effect/sql"

/** PostgreSQL channel on which key and account changes are announced to every replica. */
export const CHANNEL = "wellspring_auth"

/** How long a resolved key (key row and account row) is served from the cache without a database read. */
export const POSITIVE_TTL_MS = 60_000
/** How long an unknown or revoked key is remembered as such. */
export const NEGATIVE_TTL_MS = 5_000

export type Invalidation =
  /** One key changed (revoked): its cached entry goes. */
  | { readonly _tag: "Key"; readonly hash: string }
  /** An account changed (status, profile): every cached key of it goes. */
  | { readonly _tag: "Account"; readonly accountId: string }
  /** An account's BYOK credentials changed: the cached credentials of it go (keys stay). */
  | { readonly _tag: "Credentials"; readonly accountId: string }
  /** A message this version does not know (a newer replica's): everything cached goes. */
  | { readonly _tag: "Unknown"; readonly message: string }

export const key = (hash: string): Invalidation => ({ _tag: "Key", hash })
export const account = (accountId: string): Invalidation => ({ _tag: "Account", accountId })
export const credentials = (accountId: string): Invalidation => ({ _tag: "Credentials", accountId })

/** The message of an invalidation, without a tag. */
export const format = (invalidation: Invalidation): string => {
  switch (invalidation._tag) {
    case "Key":
      return `key:${invalidation.hash}`
    case "Account":
      return `account:${invalidation.accountId}`
    case "Credentials":
      return `byok:${invalidation.accountId}`
    case "Unknown":
      return invalidation.message
  }
}

export const parse = (message: string): Invalidation =>
  message.startsWith("key:")
    ? key(message.slice(4))
    : message.startsWith("account:")
    ? account(message.slice(8))
    : message.startsWith("byok:")
    ? credentials(message.slice(5))
    : { _tag: "Unknown", message }

/** The NOTIFY payload: the message, and `|<tag>` when a replica sends it. */
export const encode = (invalidation: Invalidation, tag?: string): string =>
  tag === undefined ? format(invalidation) : `${format(invalidation)}|${tag}`

export interface Announcement {
  readonly invalidation: Invalidation
  /** The sending replica's tag; null for an untagged message (the CLI, an operator's `pg_notify`). */
  readonly tag: string | null
}

/** Neither a key hash (hex) nor an account id contains `|`: the last one, if any, starts the tag. */
export const decode = (payload: string): Announcement => {
  const bar = payload.lastIndexOf("|")
  return bar < 0
    ? { invalidation: parse(payload), tag: null }
    : { invalidation: parse(payload.slice(0, bar)), tag: payload.slice(bar + 1) }
}

/**
 * Announces an invalidation to every replica listening on `CHANNEL`, through any SqlClient: `pg_notify` with the
 * payload bound as a parameter (NOTIFY itself takes none). Works on PostgreSQL and on the embedded store alike.
 */
export const publish = (sql: SqlClient.SqlClient, invalidation: Invalidation, tag?: string) =>
  sql`SELECT pg_notify(${CHANNEL}, ${encode(invalidation, tag)})`.pipe(Effect.asVoid)
