/**
 * Credentials in use (ARCHITECTURE §4, the credential actor): each credential a request goes through is an actor
 * (`runtime/Actors.ts`: a supervised fiber serving its mailbox, passivated when idle) that owns
 * - its status as the router obeys it (`active` / `rejected`, with `last_error_code`),
 * - the adapter built once from its opened secret and meta (rebuilt when the provider catalog is reloaded),
 * - its model-list cache (`GET /api/user/me/byok/:id/models`, `model_list_cache_seconds`),
 * - its last-used stamp, handed to one batch writer (every `TOUCH_FLUSH_MS`, at most once a minute per credential).
 * Commands are synchronous, so an idle actor serves them inline on the caller's fiber (the actor system's fast
 * path); the mailbox serializes them while the actor loads its row.
 *
 * Which credential a reference names is read from the account's non-revoked rows, cached per account for the key
 * cache's TTL: the hot path reads the database only on an account's first request per minute.
 *
 * Status changes reach every replica through the key invalidation path (`auth/Invalidation.ts`, `byok:<account>`):
 * the account's cached rows are dropped and its live actors reload their row before their next command. A
 * rejection is obeyed by the rejecting replica at once and written by a fiber of this service, so the answer to
 * the client never waits on the database.
 */
import { Clock, Context, Duration, Effect, Exit, Layer, type Scope } from "effect"
import { Auth } from "../auth/Auth.js"
import { POSITIVE_TTL_MS } from "../auth/Invalidation.js"
import { AccountMessages, fail, type GatewayError } from "../errors/Catalog.js"
import * as Actors from "../runtime/Actors.js"
import * as Batcher from "../runtime/Batcher.js"
import type { UpstreamAdapter } from "../upstream/Upstream.js"
import { Byok } from "./Byok.js"
import { type CredentialRow, CredentialsRepo } from "./CredentialsRepo.js"
import { credentialAdapter, CredentialTransports, isRefusal } from "./Dispatch.js"
import type { ModelListItem, ProviderCatalog, ProviderDef } from "./Providers.js"
import type { ByokReference } from "./Reference.js"
import { openMeta, openSecret } from "./Secrets.js"

/** Accounts whose credentials are cached at once; the least recently used leaves first. */
export const MAX_CACHED_ACCOUNTS = 10_000
/** How often pending last-used stamps are written. */
export const TOUCH_FLUSH_MS = 2_000
/** A credential's `last_used_at` is stamped at most this often. */
export const TOUCH_EVERY_MS = 60_000
/** A credential actor without commands for this long is passivated. */
export const CREDENTIAL_IDLE_TTL = "10 minutes"

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

/** An account's non-revoked rows, as the router reads them to find a credential. */
interface Entry {
  readonly rows: ReadonlyArray<CredentialRow>
  readonly expiresAt: number
}

/** What a credential actor owns. */
interface CredentialState {
  /** Its row; null when it is not (or no longer) a non-revoked credential of the account. */
  row: CredentialRow | null
  /** Built on first use from the opened secret; `catalog` is the provider catalog it was built from. */
  adapter: UpstreamAdapter | null
  catalog: ProviderCatalog | null
  models: { readonly list: ReadonlyArray<ModelListItem>; readonly expiresAt: number } | null
}

type Command =
  | { readonly _tag: "Use"; readonly reply: Actors.Reply }
  | { readonly _tag: "Reject"; readonly code: string; readonly reply: Actors.Reply }
  | { readonly _tag: "CachedModels"; readonly reply: Actors.Reply }
  | { readonly _tag: "Verified"; readonly models: ReadonlyArray<ModelListItem>; readonly reply: Actors.Reply }

type CredentialActor = Actors.Actor<CredentialState, Command>

const keyOf = (accountId: string, id: number) => `${accountId}/${id}`

export class Credentials extends Context.Service<Credentials, {
  /**
   * The credential a reference names: the label's, else the provider's primary. 400 `byok_credential_missing`
   * when there is none (or it cannot be opened); the status is the caller's to obey.
   */
  readonly resolve: (accountId: string, reference: ByokReference) => Effect.Effect<ResolvedCredential, GatewayError>
  /** A dispatch failure that condemns the credential: `rejected` with `code`, here at once, everywhere soon. */
  readonly reject: (credential: ResolvedCredential, code: string) => Effect.Effect<void>
  /** The account's credentials changed (saved, patched, deleted): every replica reads them again. */
  readonly changed: (accountId: string) => Effect.Effect<void>
  /** The credential's cached model list (active credentials only: a rejected one must ask the provider). */
  readonly cachedModels: (accountId: string, id: number) => Effect.Effect<ReadonlyArray<ModelListItem> | null>
  /**
   * A successful listing (the caller has written the row): the actor caches the list and, when it was `rejected`,
   * turns `active` at once. Telling the other replicas is `changed`.
   */
  readonly verified: (accountId: string, id: number, models: ReadonlyArray<ModelListItem>) => Effect.Effect<void>
  /** Writes pending last-used stamps now (shutdown, tests). */
  readonly flushTouches: Effect.Effect<void>
}>()("wellspring/byok/Credentials") {}

/**
 * Which of the account's rows a reference names. With a label: that label (a label may exist once per auth
 * scheme, e.g. Azure's `api-key` and `bearer`: the primary wins, then the provider's first scheme, then the
 * oldest). Without: the provider's primary, else an active one, pinned first, then the oldest.
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
    Number(b.pinned) - Number(a.pinned) ||
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
    const clock = yield* Clock.Clock
    const transports = new CredentialTransports(byok.guard, byok.config)
    yield* Effect.addFinalizer(() => transports.close())

    const cache = new Map<string, Entry>()
    /** Bumped by every change of an account's credentials: a read that started before it is not trusted. */
    const generations = new Map<string, number>()
    const generationOf = (accountId: string) => generations.get(accountId) ?? 0
    /** Live actors per account, so that an announcement reaches them. */
    const live = new Map<string, Set<CredentialActor>>()
    const accountOf = (actor: CredentialActor) => actor.key.slice(0, actor.key.lastIndexOf("/"))

    const drop = (accountId: string) => {
      cache.delete(accountId)
      generations.set(accountId, generationOf(accountId) + 1)
      if (generations.size > MAX_CACHED_ACCOUNTS * 2) generations.clear()
      // Each live actor of the account reads its row again before its next command.
      for (const actor of live.get(accountId) ?? []) actor.loaded = false
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
          for (const actors of live.values()) for (const actor of actors) actor.loaded = false
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
      if (hit !== undefined && hit.expiresAt > now) return Effect.succeed(hit)
      const seen = generationOf(accountId)
      return Effect.map(repo.list(accountId), (rows) => {
        const entry: Entry = { rows, expiresAt: now + POSITIVE_TTL_MS }
        if (seen === generationOf(accountId)) remember(accountId, entry)
        return entry
      })
    }

    const lastTouch = new Map<number, number>()
    // Last-used stamps: batched, TOUCH_FLUSH_MS after the first; a failed write is retried.
    const touches = yield* Batcher.queue<{ readonly id: number; readonly at: Date }>({
      label: "BYOK last-used stamps",
      interval: Duration.millis(TOUCH_FLUSH_MS),
      batchSize: 1000,
      maxPending: 100_000,
      write: (batch) => repo.touch(batch)
    })
    const touch = (row: CredentialRow, now: number) => {
      const last = lastTouch.get(row.id) ?? (row.last_used_at ? row.last_used_at.getTime() : 0)
      if (now - last < TOUCH_EVERY_MS) return
      if (lastTouch.size >= MAX_CACHED_ACCOUNTS * 4) lastTouch.clear()
      lastTouch.set(row.id, now)
      touches.add({ id: row.id, at: new Date(now) })
    }
    const flushTouches = touches.flush

    const missing = (detail: string) => fail("byok_credential_missing", { message: AccountMessages.byokNoCredential, detail })

    /** The actor's view of its credential; the adapter is (re)built here, from the current provider catalog. */
    const use = (state: CredentialState, accountId: string, now: number): Exit.Exit<ResolvedCredential, GatewayError> => {
      const row = state.row
      if (row === null) return Exit.fail(missing("no such credential"))
      const catalog = byok.catalog
      const provider = catalog.byId.get(row.provider)
      if (provider === undefined) return Exit.fail(missing("provider not enabled"))
      if (state.adapter === null || state.catalog !== catalog) {
        const scheme = provider.schemes.find((s) => s.id === row.auth_scheme)
        if (!byok.switch.enabled || scheme === undefined) return Exit.fail(missing("scheme not offered"))
        const key = byok.switch.key
        const secret = openSecret(key, row.id, row.secret_ciphertext)
        const meta = openMeta(key, row.id, row.meta_ciphertext)
        if (secret === null || meta === null) return Exit.fail(missing("credential cannot be opened"))
        const built = credentialAdapter(transports, byok.guard, { provider, scheme, secret, meta })
        if (isRefusal(built)) {
          // Where the URL leads is one answer (`address_not_allowed`); the kind is for the log only.
          const detail = `base URL refused: ${built.kind} (${built.detail})`
          return Exit.fail(
            built.code === "address_not_allowed" ? fail("address_not_allowed", { detail }) : missing(detail)
          )
        }
        state.adapter = built
        state.catalog = catalog
      }
      touch(row, now)
      return Exit.succeed({
        id: row.id,
        accountId,
        provider,
        label: row.label,
        status: row.status === "active" ? "active" : "rejected",
        lastErrorCode: row.last_error_code,
        fallbackModelId: row.fallback_model_id,
        adapter: state.adapter
      })
    }

    const actors = yield* Actors.make<CredentialState, Command>({
      name: "credential",
      clock,
      idleTimeToLive: CREDENTIAL_IDLE_TTL,
      mailboxOnly: false,
      initial: () => ({ row: null, adapter: null, catalog: null, models: null }),
      load: (actor) =>
        Effect.suspend(() => {
          const accountId = accountOf(actor)
          const id = Number(actor.key.slice(accountId.length + 1))
          const generation = generationOf(accountId)
          let set = live.get(accountId)
          if (set === undefined) live.set(accountId, set = new Set())
          set.add(actor)
          return repo.findOwn(accountId, id).pipe(
            Effect.map((row) => {
              const state = actor.state
              // Secret and meta never change: the adapter survives a reload unless the row went away.
              if (row === null) {
                state.adapter = null
                state.models = null
              }
              if (row !== null && row.status !== "active") state.models = null
              state.row = row
              // A change announced while reading: read again before the next command.
              actor.loaded = generation === generationOf(accountId)
              return true
            })
          )
        }),
      handle: (actor, cmd, now) => {
        const state = actor.state
        switch (cmd._tag) {
          case "Use":
            return use(state, accountOf(actor), now)
          case "Reject": {
            const row = state.row
            if (row === null || row.status !== "active") return Exit.succeed(false)
            state.row = { ...row, status: "rejected", last_error_code: cmd.code }
            state.models = null
            return Exit.succeed(true)
          }
          case "CachedModels": {
            const models = state.models
            const active = state.row?.status === "active"
            return Exit.succeed(active && models !== null && models.expiresAt > now ? models.list : null)
          }
          case "Verified": {
            const row = state.row
            const changed = row !== null && row.status !== "active"
            if (row !== null) {
              state.row = { ...row, status: "active", last_error_code: null, last_verified_at: new Date(now) }
              state.models = { list: cmd.models, expiresAt: now + byok.config.model_list_cache_seconds * 1000 }
            }
            return Exit.succeed(changed)
          }
        }
      },
      refuse: (_actor, cmd, why) =>
        cmd._tag === "Use" ? Exit.fail(missing(why)) : Exit.succeed(cmd._tag === "CachedModels" ? null : false),
      handOver: () => {},
      stopped: (actor) => {
        const accountId = accountOf(actor)
        const set = live.get(accountId)
        set?.delete(actor)
        if (set !== undefined && set.size === 0) live.delete(accountId)
      }
    })

    const ask = <A>(accountId: string, id: number, build: (reply: Actors.Reply) => Command) =>
      actors.with(keyOf(accountId, id), (actor) => actors.ask<A>(actor, build))

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
        return yield* ask<ResolvedCredential>(accountId, row.id, (reply) => ({ _tag: "Use", reply }))
      })

    const reject = (credential: ResolvedCredential, code: string): Effect.Effect<void> =>
      Effect.gen(function*() {
        // The actor obeys at once, on this replica; the row and the other replicas follow.
        const changed = yield* Effect.orDie(
          ask<boolean>(credential.accountId, credential.id, (reply) => ({ _tag: "Reject", code, reply }))
        )
        if (!changed) return
        const write = repo.markRejected(credential.id, code).pipe(
          Effect.flatMap((written) => written ? auth.invalidateCredentials(credential.accountId) : Effect.void),
          Effect.catchCause((cause) => Effect.logWarning("BYOK rejection not written", cause)),
          Effect.annotateLogs({ credential_id: credential.id, code })
        )
        yield* Effect.forkIn(write, scope)
      })

    return Credentials.of({
      resolve,
      reject,
      changed: (accountId) => auth.invalidateCredentials(accountId),
      cachedModels: (accountId, id) =>
        Effect.orDie(ask<ReadonlyArray<ModelListItem> | null>(accountId, id, (reply) => ({ _tag: "CachedModels", reply }))),
      verified: (accountId, id, models) =>
        Effect.asVoid(Effect.orDie(ask<boolean>(accountId, id, (reply) => ({ _tag: "Verified", models, reply })))),
      flushTouches
    })
  })

export const layer = Layer.effect(Credentials, make)
