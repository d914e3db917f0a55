/**
 * The BYOK router on the dashboard origin (spec: "BYOK credential", Account API rules 8–12, Authentication 6, the
 * account error table, Limits). Seven endpoints under `/api/user/me/byok`, all snake_case, wrapped
 * `{success, data}`; errors `{success: false, error: {message, type, code}}`.
 *
 * Every endpoint runs the same preamble, in this order: authentication (cookie or key, with the CSRF check of
 * SameOrigin.ts), gate 1 (the account must be `active`: 403 `account_unlinked`), gate 2 (guests: 403
 * `byok_disabled` with the guest message), gate 3 (BYOK on, with a sealing key: 403 `byok_disabled`), then the
 * shared 15/min limit (429 `rate_limited`). Only then is an id parsed or a body read (at most 64 KiB, depth-checked
 * before JSON.parse).
 *
 * Two answers do not come from the error catalog, because their status is not the code's usual one: a probe
 * failure on save or on a listing (400 with the probe's own `kind` as `code`), and an unknown credential (404
 * `byok_credential_missing`; the catalog's entry is the 400 of an unusable request).
 *
 * Secrets: the plaintext secret lives only in the request body and the probe's headers; it is sealed before the
 * INSERT and never logged, rendered or audited. Probe failures log their `kind` and `detail` (status codes,
 * refusal ranges), never provider text.
 */
import { Clock, type Context, Data, Effect, Layer } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { enforce, type EndpointLimit } from "../accounts/Limits.js"
import { authenticateAccount } from "../accounts/SessionAuth.js"
import { AccountsRepo } from "../accounts/AccountsRepo.js"
import { Auth, type Caller } from "../auth/Auth.js"
import { LiveCatalog } from "../config/Live.js"
import { AccountMessages, fail, type GatewayError } from "../errors/Catalog.js"
import { renderAccount } from "../errors/Render.js"
import { readJson } from "../http/Body.js"
import { handle, json } from "../http/Respond.js"
import { Byok } from "./Byok.js"
import { Credentials } from "./Credentials.js"
import { type CredentialRow, CredentialsRepo } from "./CredentialsRepo.js"
import { listModels, probe, type ProbeFailure } from "./Probe.js"
import { derivedColumns, describeProviders, validateCredentialInput } from "./Providers.js"
import { maskedHint, openMeta, openSecret, sealMeta, sealSecret } from "./Secrets.js"

/** Spec Limits: 15 requests per minute per account, shared by all seven endpoints (every replica: Admission). */
export const BYOK_LIMIT: EndpointLimit = {
  name: "byok",
  max: 15,
  windowSeconds: 60,
  message: AccountMessages.byokRateLimited
}

/** Largest BYOK request body; the biggest legitimate one is a few kilobytes (an 8 KiB secret plus meta). */
export const MAX_BYOK_BODY_BYTES = 64 * 1024

/** The credential as the API shows it: never a secret, a ciphertext or a `meta` value. */
export const credentialView = (row: CredentialRow) => ({
  id: row.id,
  provider: row.provider,
  auth_scheme: row.auth_scheme,
  label: row.label,
  masked_hint: row.masked_hint,
  is_primary: row.is_primary,
  pinned: row.pinned,
  status: row.status,
  last_verified_at: row.last_verified_at === null ? null : row.last_verified_at.toISOString(),
  last_used_at: row.last_used_at === null ? null : row.last_used_at.toISOString(),
  created_at: row.created_at.toISOString(),
  last_error_code: row.last_error_code,
  base_url_origin: row.base_url_origin,
  fallback_model_id: row.fallback_model_id,
  has_org_id: row.has_org_id,
  has_project_id: row.has_project_id,
  region: row.region
})

/** A finished answer that is not a catalog error (see the module comment). */
class Answer extends Data.TaggedError("ByokAnswer")<{ readonly response: HttpServerResponse.HttpServerResponse }> {}

const errorAnswer = (status: number, code: string, message: string) =>
  new Answer({
    response: json({ success: false, error: { message, type: status === 404 ? "not_found_error" : "invalid_request_error", code } }, status)
  })

const notFound = () => errorAnswer(404, "byok_credential_missing", AccountMessages.byokNotFound)

const probeRefused = (failure: Pick<ProbeFailure, "kind" | "message">) => errorAnswer(400, failure.kind, failure.message)

const logProbeFailure = (where: string, failure: { readonly kind: string; readonly detail: string }, provider: string) =>
  Effect.logInfo("BYOK probe failed").pipe(
    Effect.annotateLogs({ where, provider, kind: failure.kind, detail: failure.detail })
  )

const via = (caller: Caller) => (caller.key === null ? "session" : "key")

/** The account's credentials changed: the router of every replica reads them again. */
const announceChange = (accountId: string) => Effect.flatMap(Credentials, (credentials) => credentials.changed(accountId))

/** Authentication, the three gates in the spec's order, then the shared limit. */
const gated = Effect.gen(function*() {
  const caller = yield* authenticateAccount
  const account = caller.account
  if (account.status !== "active") return yield* Effect.fail(fail("account_unlinked"))
  if (account.is_guest) return yield* Effect.fail(fail("byok_disabled", { message: AccountMessages.byokGuest }))
  const byok = yield* Byok
  if (!byok.switch.enabled) {
    return yield* Effect.fail(fail("byok_disabled", { message: AccountMessages.byokOff, detail: byok.switch.reason }))
  }
  yield* enforce(BYOK_LIMIT, account.id)
  return { caller, byok, key: byok.switch.key }
})

/** The body as JSON (absent when empty), at most `MAX_BYOK_BODY_BYTES`. */
const readBody = Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
  readJson(request, { maxBytes: MAX_BYOK_BODY_BYTES, emptyIsAbsent: true }))

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/** `:id`: a positive integer, else 400 `byok_credential_missing` (spec error table). */
const credentialId = Effect.flatMap(HttpRouter.params, (params) => {
  const raw = params.id
  if (raw === undefined || !/^[1-9][0-9]{0,15}$/.test(raw) || !Number.isSafeInteger(Number(raw))) {
    return Effect.fail(fail("byok_credential_missing", { message: AccountMessages.byokBadId }))
  }
  return Effect.succeed(Number(raw))
})

/** Verify and save share the validation and the probe. */
const validated = (byok: Context.Service.Shape<typeof Byok>, body: unknown) => {
  const input = validateCredentialInput(byok.catalog, body)
  return input.ok
    ? Effect.succeed(input.value)
    : Effect.fail(fail(input.error.code, { message: input.error.message }))
}

/** Renders an `Answer` as it is and every GatewayError in the account envelope. */
const route = <R>(
  method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE",
  path: HttpRouter.PathInput,
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse, GatewayError | Answer, R>
) =>
  HttpRouter.add(
    method,
    path,
    handle(renderAccount, handler.pipe(Effect.catchTag("ByokAnswer", (answer) => Effect.succeed(answer.response))))
  )

const list = Effect.gen(function*() {
  const { caller, byok } = yield* gated
  const repo = yield* CredentialsRepo
  const rows = yield* repo.list(caller.account.id)
  const override = caller.account.byok_fallback_override
  return json({
    success: true,
    data: {
      credentials: rows.map(credentialView),
      providers: describeProviders(byok.catalog),
      max_per_provider: byok.catalog.maxPerProvider,
      fallback_default_on: byok.config.fallback_default_on,
      fallback_override: override,
      fallback_enabled: override ?? byok.config.fallback_default_on
    }
  })
})

const putFallback = Effect.gen(function*() {
  const { caller, byok } = yield* gated
  const body = yield* readBody
  const enabled = isRecord(body) ? body.enabled : undefined
  if (enabled !== true && enabled !== false && enabled !== null) {
    return yield* Effect.fail(fail("invalid_request", { message: AccountMessages.byokFallbackEnabled }))
  }
  const repo = yield* CredentialsRepo
  if (!(yield* repo.setFallbackOverride(caller.account.id, enabled))) return yield* Effect.fail(fail("account_not_found"))
  // Cached copies of the account row (the chat path's) must see the new choice.
  yield* Effect.flatMap(Auth, (auth) => auth.invalidateAccount(caller.account.id))
  return json({
    success: true,
    data: { fallback_override: enabled, fallback_enabled: enabled ?? byok.config.fallback_default_on }
  })
})

const verify = Effect.gen(function*() {
  const { byok } = yield* gated
  const input = yield* validated(byok, yield* readBody)
  const result = yield* probe(byok.guard, input, { timeoutMs: byok.config.probe_timeout_ms })
  if (!result.ok) {
    yield* logProbeFailure("verify", result, input.provider.id)
    return json({ success: false, data: { ok: false, kind: result.kind, message: result.message } })
  }
  return json({
    success: true,
    data: {
      ok: true,
      model_count: result.model_count,
      ...(result.resolved_base_url !== null ? { resolved_base_url: result.resolved_base_url } : {})
    }
  })
})

const save = Effect.gen(function*() {
  const { caller, byok, key } = yield* gated
  const input = yield* validated(byok, yield* readBody)
  const repo = yield* CredentialsRepo
  const accountId = caller.account.id
  const max = byok.catalog.maxPerProvider
  // Cheap refusals before the probe costs a round trip; the insert decides again under the account lock.
  const same = (yield* repo.list(accountId)).filter((r) =>
    r.provider === input.provider.id && r.auth_scheme === input.scheme.id
  )
  if (same.length >= max) return yield* Effect.fail(fail("byok_credential_conflict", { message: AccountMessages.byokCap(max) }))
  if (input.label !== null && same.some((r) => r.label === input.label)) {
    return yield* Effect.fail(fail("byok_credential_conflict", { message: AccountMessages.byokLabelTaken }))
  }
  const result = yield* probe(byok.guard, input, { timeoutMs: byok.config.probe_timeout_ms })
  if (!result.ok) {
    yield* logProbeFailure("save", result, input.provider.id)
    return yield* Effect.fail(probeRefused(result))
  }
  const derived = derivedColumns(input.provider, input.meta)
  const now = yield* Clock.currentTimeMillis
  const outcome = yield* repo.insert(accountId, {
    provider: input.provider.id,
    authScheme: input.scheme.id,
    label: input.label,
    maskedHint: maskedHint(input.secret),
    baseUrlOrigin: derived.base_url_origin,
    region: derived.region,
    hasOrgId: derived.has_org_id,
    hasProjectId: derived.has_project_id,
    verifiedAt: new Date(now),
    seal: (rowId) => ({ secret: sealSecret(key, rowId, input.secret), meta: sealMeta(key, rowId, input.meta) })
  }, max)
  if (outcome._tag === "Cap") {
    return yield* Effect.fail(fail("byok_credential_conflict", { message: AccountMessages.byokCap(outcome.max) }))
  }
  if (outcome._tag === "LabelTaken") {
    return yield* Effect.fail(fail("byok_credential_conflict", { message: AccountMessages.byokLabelTaken }))
  }
  const row = outcome.row
  yield* announceChange(accountId)
  yield* Effect.flatMap(AccountsRepo, (accounts) =>
    accounts.audit(accountId, "byok.create", String(row.id), {
      credential_id: row.id,
      provider: row.provider,
      auth_scheme: row.auth_scheme,
      label: row.label,
      via: via(caller)
    }))
  return json({ success: true, data: { credential: credentialView(row) } })
})

const PATCHABLE = new Set(["pinned", "is_primary", "fallback_model_id"])

const patch = Effect.gen(function*() {
  const { caller } = yield* gated
  const id = yield* credentialId
  const body = yield* readBody
  if (!isRecord(body)) return yield* Effect.fail(fail("invalid_request"))
  for (const field of Object.keys(body)) {
    if (!PATCHABLE.has(field)) {
      return yield* Effect.fail(fail("invalid_request", { message: AccountMessages.byokPatchField(field.slice(0, 40)) }))
    }
  }
  const { pinned, is_primary, fallback_model_id } = body
  if (pinned !== undefined && typeof pinned !== "boolean") {
    return yield* Effect.fail(fail("invalid_request", { message: AccountMessages.byokPatchType("pinned", "boolean") }))
  }
  if (is_primary !== undefined && typeof is_primary !== "boolean") {
    return yield* Effect.fail(fail("invalid_request", { message: AccountMessages.byokPatchType("is_primary", "boolean") }))
  }
  let fallback: string | null | undefined
  if (fallback_model_id === null || fallback_model_id === "") fallback = null
  else if (fallback_model_id !== undefined) {
    const live = yield* LiveCatalog
    // A shared-catalog id only: BYOK references (`@...`) and unknown ids are refused.
    if (typeof fallback_model_id !== "string" || !live.current().byId.has(fallback_model_id)) {
      return yield* Effect.fail(fail("byok_credential_missing", { message: AccountMessages.byokFallbackModel }))
    }
    fallback = fallback_model_id
  }
  const repo = yield* CredentialsRepo
  const row = yield* repo.patch(caller.account.id, id, {
    ...(pinned !== undefined ? { pinned } : {}),
    ...(is_primary === true ? { makePrimary: true } : {}),
    ...(fallback !== undefined ? { fallbackModelId: fallback } : {})
  })
  if (row === null) return yield* Effect.fail(notFound())
  yield* announceChange(caller.account.id)
  return json({ success: true, data: { credential: credentialView(row) } })
})

const remove = Effect.gen(function*() {
  const { caller } = yield* gated
  const id = yield* credentialId
  const repo = yield* CredentialsRepo
  const row = yield* repo.revoke(caller.account.id, id)
  if (row === null) return yield* Effect.fail(notFound())
  yield* announceChange(caller.account.id)
  yield* Effect.flatMap(AccountsRepo, (accounts) =>
    accounts.audit(caller.account.id, "byok.delete", String(id), {
      credential_id: id,
      provider: row.provider,
      auth_scheme: row.auth_scheme,
      label: row.label,
      via: via(caller)
    }))
  return json({ success: true })
})

const models = Effect.gen(function*() {
  const { caller, byok, key } = yield* gated
  const id = yield* credentialId
  const repo = yield* CredentialsRepo
  // Ownership first, on every request: a cache hit never skips it.
  const row = yield* repo.findOwn(caller.account.id, id)
  if (row === null) return yield* Effect.fail(notFound())
  const credentials = yield* Credentials
  // A rejected credential is re-verified by the provider listing its models: a cached list proves nothing.
  const cached = row.status === "active" ? yield* credentials.cachedModels(caller.account.id, id) : null
  if (cached !== null) return json({ success: true, data: { models: cached, cached: true } })
  const provider = byok.catalog.byId.get(row.provider)
  const scheme = provider?.schemes.find((s) => s.id === row.auth_scheme)
  const secret = openSecret(key, row.id, row.secret_ciphertext)
  const meta = openMeta(key, row.id, row.meta_ciphertext)
  if (provider === undefined || scheme === undefined || secret === null || meta === null) {
    return yield* Effect.fail(fail("byok_credential_missing", {
      detail: provider === undefined ? "provider not enabled" : "credential cannot be opened"
    }))
  }
  const result = yield* listModels(byok.guard, { provider, scheme, secret, meta }, {
    timeoutMs: byok.config.probe_timeout_ms
  })
  if (!result.ok) {
    yield* logProbeFailure("models", result, provider.id)
    if (result.kind === "no_listing") return yield* Effect.fail(fail("byok_upstream_error"))
    return yield* Effect.fail(probeRefused(result))
  }
  const verified = yield* repo.markVerified(caller.account.id, id)
  if (verified !== null) yield* credentials.verified(caller.account.id, id, result.models)
  // A rejected credential turns active again: every replica's router must see it.
  if (verified !== null && row.status !== "active") yield* announceChange(caller.account.id)
  return json({ success: true, data: { models: result.models, cached: false } })
})

export const byokRoutes = Layer.mergeAll(
  route("GET", "/api/user/me/byok", list),
  route("PUT", "/api/user/me/byok/fallback", putFallback),
  route("POST", "/api/user/me/byok/verify", verify),
  route("POST", "/api/user/me/byok", save),
  route("PATCH", "/api/user/me/byok/:id", patch),
  route("DELETE", "/api/user/me/byok/:id", remove),
  route("GET", "/api/user/me/byok/:id/models", models)
)
