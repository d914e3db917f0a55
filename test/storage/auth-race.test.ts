/**
 * A cache-miss key lookup racing a revoke (issue #8, finding 12): the lookup read the key while it was active,
 * the revoke and its invalidation happened before the lookup finished. That request may still pass, but the
 * stale answer must not be cached: the next request is rejected at once, not after the 60 s TTL.
 */
import { type Context, Deferred, Effect, Fiber, ManagedRuntime, Result } from "effect"
import { SqlClient } from "effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import * as AuthModule from "../../src/auth/Auth.js"
import { hashKey } from "../../src/auth/KeyMaterial.js"
import * as KeyStore from "../../src/auth/KeyStore.js"
import { serviceGate } from "../support/Services.js"
import { backends, type StoreServices } from "./backends.js"

const postgres = await serviceGate("postgres")

const outcome = (auth: Context.Service.Shape<typeof AuthModule.Auth>, key: string) =>
  auth.authenticateKey(`Bearer ${key}`, "127.0.0.1").pipe(
    Effect.result,
    Effect.map(Result.match({ onFailure: (e) => e.code as string, onSuccess: (c) => `ok:${c.account.id}` }))
  )

for (const backend of backends(postgres)) {
  describe(`auth cache vs revoke (${backend.name})`, () => {
    let runtime: ManagedRuntime.ManagedRuntime<StoreServices, unknown>
    let close: () => Promise<void>
    beforeAll(async () => {
      const opened = await backend.open()
      close = opened.close
      runtime = ManagedRuntime.make(opened.layer)
      await runtime.runPromise(Effect.void)
    })
    afterAll(async () => {
      await runtime?.dispose()
      await close?.()
    })

    it("a lookup that read the key before a revoke does not cache it; an undisturbed lookup still caches", () =>
      runtime.runPromise(Effect.scoped(Effect.gen(function*() {
        const repo = yield* AccountsRepo
        const account = yield* repo.createAccount({ username: `race_${Date.now()}`, displayName: "경합" })
        const raced = yield* repo.createKey(account.id, "raced")
        const calm = yield* repo.createKey(account.id, "calm")

        // The key store as Auth sees it: the raced key's first lookup reads the database, reports that it has
        // read, then waits to be released before answering.
        const store = yield* KeyStore.make
        const read = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        let held = false
        const gated = KeyStore.KeyStore.of({
          ...store,
          findActiveKeyByHash: (hash) =>
            store.findActiveKeyByHash(hash).pipe(Effect.tap(() => {
              if (hash !== raced.row.key_hash || held) return Effect.void
              held = true
              return Deferred.succeed(read, undefined).pipe(Effect.andThen(Deferred.await(release)))
            }))
        })
        const auth = yield* AuthModule.make.pipe(Effect.provideService(KeyStore.KeyStore, gated))

        const inFlight = yield* Effect.forkChild(outcome(auth, raced.key))
        yield* Deferred.await(read)
        // The key is revoked the way the account API does it, while the lookup still holds the active row.
        expect((yield* repo.revokeKeyById(raced.row.id))?.id).toBe(raced.row.id)
        yield* auth.invalidateKeys([hashKey(raced.key)])
        yield* Deferred.succeed(release, undefined)
        // The raced request itself was answered from what it read.
        expect(yield* Fiber.join(inFlight)).toBe(`ok:${account.id}`)
        // The next one looks again and is refused.
        expect(yield* outcome(auth, raced.key)).toBe("invalid_api_key")

        // Control: without an invalidation in between, the answer is cached (a revoke behind the cache's back is
        // not seen until the TTL ends), so the check above is about the race, not about caching being off.
        expect(yield* outcome(auth, calm.key)).toBe(`ok:${account.id}`)
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE api_keys SET revoked_at = now() WHERE id = ${calm.row.id}`.pipe(Effect.orDie)
        expect(yield* outcome(auth, calm.key)).toBe(`ok:${account.id}`)
      }))))
  })
}

