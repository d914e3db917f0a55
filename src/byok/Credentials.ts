/**
 * Credentials in use (ARCHITECTURE §4, the credential actor): what a request through `@provider[:label]/model`
 * needs, without a database read on the hot path.
 *
 * - Per account, the non-revoked credential rows are cached (`POSITIVE_TTL_MS`, as keys are). Per credential, its
 *   state is owned here: the status the router obeys, the adapter built once from the opened secret and meta, and
 *   the pending last-used stamp.
 * - Status changes are immediate on this replica and reach every other one through the key invalidation path
 *   (`auth/Invalidation.ts`, message `byok:<account>`): a rejection, a re-verification, a patch or a deletion drops
 *   the account's cached credentials everywhere, and the next request reads them again.
 * - Last-used stamps are written in batches every `TOUCH_FLUSH_MS` by one fiber, at most once a minute per
 *   credential, and once more when the runtime stops.
 * - A rejection (auth or permission failure on dispatch) is written by a fiber of this service, so the answer to
 *   the client never waits on the database; a failed write is logged and the status stays rejected locally.
 *
 * The state changes are single synchronous updates of one entry, so no per-credential fiber or mailbox is needed:
 * the actor is the entry, its lifetime is bounded by the cache (idle entries leave with their account's TTL and
 * under the size bound) and the service scope supervises the two fibers that do I/O.
 */
import { Clock, Context, Duration, Effect, Layer, Schedule, type Scope } from "effect"
import { Auth } from "../auth/Auth.js"
import { POSITIVE_TTL_MS } from "../auth/Invalidation.js"
import { AccountMessages, fail, type GatewayError } from "../errors/Catalog.js"
import type { UpstreamAdapter } from "../upstream/Upstream.js"
import { Byok } from "./Byok.js"
import { type CredentialRow, CredentialsRepo } from "./CredentialsRepo.js"
import { credentialAdapter, CredentialTransports, isRefusal } from "./Dispatch.js"
import type { ProviderCatalog, ProviderDef } from "./Providers.js"
import type { ByokReference } from "./Reference.js"
import { openMeta, openSecret } from "./Secrets.js"

/** Accounts whose credentials are cached at once; the least recently used leaves first. */
export const MAX_CACHED_ACCOUNTS = 10_000
/** How often pending last-used stamps are written. */
export const TOUCH_FLUSH_MS = 2_000
/** A credential's `last_used_at` is stamped at most this often. */
export const TOUCH_EVERY_MS = 60_000

/** The credential a reference resolved to. */
export interface ResolvedCredential {
  readonly id: number
  readonly accountId: string
  readonly provider: ProviderDef
  readonly label: string
  readonly status: "active" | "rejected"
  readonly lastErrorCode: string | null
  /** The pool model a failed dispatch falls back to (when the account's fallback is on). */
  readonly fallbackModelId: string | null
  readonly adapter: UpstreamAdapter
}

interface Entry {
  readonly rows: ReadonlyArray<CredentialRow>
  readonly expiresAt: number
  /** The provider catalog the adapters were built from: a reloaded catalog (new base URLs) rebuilds them. */
  readonly catalog: ProviderCatalog
  /** Adapters by credential id, built on first use. */
  readonly adapters: Map<number, UpstreamAdapter>
}

export class Credentials extends Context.Service<Credentials, {
  /**
   * The credential a reference names: the label's, else the provider's primary. 400 `byok_credential_missing`
   * when there is none (or it cannot be opened); the status is the caller's to obey.
   */
  readonly resolve: (accountId: string, reference: ByokReference) => Effect.Effect<ResolvedCredential, GatewayError>
  /** A dispatch failure that condemns the credential: `rejected` with `code`, here at once, everywhere soon. */
  readonly reject: (credential: ResolvedCredential, code: string) => Effect.Effect<void>
  /** The account's credentials changed (saved, patched, verified, deleted): every replica reads them again. */
  readonly changed: (accountId: string) => Effect.Effect<void>
  /** Writes pending last-used stamps now (shutdown, tests). */
  readonly flushTouches: Effect.Effect<void>
}>()("wellspring/byok/Credentials") {}

/**
 * Which of the account's rows a reference names. With a label: that label (a label may exist once per auth
 * scheme, e.g. Azure's `api-key` and `bearer`: the primary wins, then the provider's first scheme, then the
 * oldest). Without: the provider's primary, else its oldest active credential.
 */
export const pick = (
  rows: ReadonlyArray<CredentialRow>,
  provider: ProviderDef,
  label: string | null
): CredentialRow | null => {
  const schemeRank = (row: CredentialRow) => {
    const i = provider.schemes.findIndex((s) => s.id === row.auth_scheme)
    return i < 0 ? provider.schemes.length : i
  }
  const candidates = rows.filter((r) =>
    r.provider === provider.id && r.status !== "revoked" && (label === null ? true : r.label === label) &&
    provider.schemes.some((s) => s.id === r.auth_scheme)
  )
  if (candidates.length === 0) return null
  const ranked = [...candidates].sort((a, b) =>
    Number(b.is_primary) - Number(a.is_primary) ||
    (label === null ? Number(b.status === "active") - Number(a.status === "active") : 0) ||
    schemeRank(a) - schemeRank(b) ||
    a.id - b.id
  )
  return ranked[0]!
}

export const make: Effect.Effect<Context.Service.Shape<typeof Credentials>, never, Byok | CredentialsRepo | Auth | Scope.Scope> =
  Effect.gen(function*() {
    const byok = yield* Byok
    const repo = yield* CredentialsRepo
    const auth = yield* Auth
    const scope = yield* Effect.scope
    const transports = new CredentialTransports(byok.guard, byok.config)
    yield* Effect.addFinalizer(() => transports.close())

    const cache = new Map<string, Entry>()
    /** Bumped by every change of an account's credentials: a read that started before it is not cached. */
    const generations = new Map<string, number>()
    const generationOf = (accountId: string) => generations.get(accountId) ?? 0

    const drop = (accountId: string) => {
      cache.delete(accountId)
      generations.set(accountId, generationOf(accountId) + 1)
      if (generations.size > MAX_CACHED_ACCOUNTS * 2) generations.clear()
    }
    auth.subscribe((invalidation) => {
      switch (invalidation._tag) {
        case "Credentials":
        case "Account":
          drop(invalidation.accountId)
          break
        case "Unknown":
          cache.clear()
          generations.clear()
          break
      }
    })

    const remember = (accountId: string, entry: Entry) => {
      cache.delete(accountId)
      if (cache.size >= MAX_CACHED_ACCOUNTS) cache.delete(cache.keys().next().value!)
      cache.set(accountId, entry)
    }

    const rowsOf = (accountId: string, now: number): Effect.Effect<Entry> => {
      const hit = cache.get(accountId)
      if (hit !== undefined && hit.expiresAt > now && hit.catalog === byok.catalog) return Effect.succeed(hit)
      const seen = generationOf(accountId)
      return Effect.map(repo.list(accountId), (rows) => {
        const entry: Entry = { rows, expiresAt: now + POSITIVE_TTL_MS, catalog: byok.catalog, adapters: new Map() }
        if (seen === generationOf(accountId)) remember(accountId, entry)
        return entry
      })
    }

    const lastTouch = new Map<number, number>()
    let pendingTouches: Array<{ id: number; at: Date }> = []
    const touch = (row: CredentialRow, now: number) => {
      const last = lastTouch.get(row.id) ?? (row.last_used_at ? row.last_used_at.getTime() : 0)
      if (now - last < TOUCH_EVERY_MS) return
      if (lastTouch.size >= MAX_CACHED_ACCOUNTS * 4) lastTouch.clear()
      lastTouch.set(row.id, now)
      pendingTouches.push({ id: row.id, at: new Date(now) })
    }
    const flushTouches = Effect.suspend(() => {
      const batch = pendingTouches
      pendingTouches = []
      return repo.touch(batch)
    })
    yield* flushTouches.pipe(
      Effect.catchCause((cause) => Effect.logWarning("BYOK last-used stamps not written", cause)),
      Effect.repeat(Schedule.spaced(Duration.millis(TOUCH_FLUSH_MS))),
      Effect.forkScoped
    )
    yield* Effect.addFinalizer(() => Effect.ignore(flushTouches))

    const missing = (detail: string) => fail("byok_credential_missing", { message: AccountMessages.byokNoCredential, detail })

    const resolve = (accountId: string, reference: ByokReference): Effect.Effect<ResolvedCredential, GatewayError> =>
      Effect.gen(function*() {
        if (!byok.switch.enabled) {
          return yield* Effect.fail(fail("byok_disabled", { message: AccountMessages.byokOff, detail: byok.switch.reason }))
        }
        const provider = byok.catalog.byId.get(reference.provider)
        if (provider === undefined) return yield* Effect.fail(missing("provider not enabled"))
        const now = yield* Clock.currentTimeMillis
        const entry = yield* rowsOf(accountId, now)
        const row = pick(entry.rows, provider, reference.label)
        if (row === null) return yield* Effect.fail(missing("no such credential"))
        let adapter = entry.adapters.get(row.id)
        if (adapter === undefined) {
          const scheme = provider.schemes.find((s) => s.id === row.auth_scheme)!
          const key = byok.switch.key
          const secret = openSecret(key, row.id, row.secret_ciphertext)
          const meta = openMeta(key, row.id, row.meta_ciphertext)
          if (secret === null || meta === null) return yield* Effect.fail(missing("credential cannot be opened"))
          const built = credentialAdapter(transports, byok.guard, { provider, scheme, secret, meta })
          if (isRefusal(built)) return yield* Effect.fail(missing(`base URL refused: ${built.kind}`))
          adapter = built
          entry.adapters.set(row.id, adapter)
        }
        touch(row, now)
        return {
          id: row.id,
          accountId,
          provider,
          label: row.label,
          status: row.status === "active" ? "active" : "rejected",
          lastErrorCode: row.last_error_code,
          fallbackModelId: row.fallback_model_id,
          adapter
        } satisfies ResolvedCredential
      })

    const reject = (credential: ResolvedCredential, code: string): Effect.Effect<void> =>
      Effect.suspend(() => {
        // This replica obeys at once: the cached row becomes rejected until the account is read again.
        const entry = cache.get(credential.accountId)
        if (entry !== undefined) {
          const rows = entry.rows.map((r) =>
            r.id === credential.id && r.status === "active" ? { ...r, status: "rejected" as const, last_error_code: code } : r
          )
          cache.set(credential.accountId, { ...entry, rows })
        }
        const write = repo.markRejected(credential.id, code).pipe(
          Effect.flatMap((changed) => changed ? auth.invalidateCredentials(credential.accountId) : Effect.void),
          Effect.catchCause((cause) => Effect.logWarning("BYOK rejection not written", cause)),
          Effect.annotateLogs({ credential_id: credential.id, code })
        )
        return Effect.asVoid(Effect.forkIn(write, scope))
      })

    return Credentials.of({
      resolve,
      reject,
      changed: (accountId) => auth.invalidateCredentials(accountId),
      flushTouches: Effect.ignore(flushTouches)
    })
  })

export const layer = Layer.effect(Credentials, make)
