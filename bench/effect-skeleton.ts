/**
 * Reference point: the thinnest Effect HTTP proxy (router, body read, undici call, streamed answer), served
 * the way the gateway serves (`NodeHttpServer.makeHandler` on our own `http.Server`), without auth, admission
 * or request rows. Shows what the platform itself costs on this machine.
 * Usage: tsx bench/effect-skeleton.ts --port N --upstream http://127.0.0.1:M
 */
import { NodeHttpServer } from "@effect/platform-node"
import { Effect, Scope } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Pool } from "undici"

const arg = (name: string) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : undefined
}
const pool = new Pool(arg("upstream") ?? "http://127.0.0.1:9100", { connections: 128 })

const route = HttpRouter.add(
  "POST",
  "/v1/chat/completions",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const body = yield* request.text
    const upstream = yield* Effect.promise((signal) =>
      pool.request({ method: "POST", path: "/v1/chat/completions", headers: { "content-type": "application/json" }, body, signal })
    )
    return HttpServerResponse.raw(upstream.body, {
      status: upstream.statusCode,
      contentType: String(upstream.headers["content-type"] ?? "application/json")
    })
  }).pipe(Effect.orDie)
)

Effect.runFork(Effect.scoped(Effect.gen(function*() {
  // Request fibers live in a child scope, as in the gateway's Server.ts.
  const scope = yield* Scope.fork(yield* Effect.scope, "parallel")
  const handler = yield* NodeHttpServer.makeHandler(yield* HttpRouter.toHttpEffect(route), { scope })
  const server = Http.createServer({ keepAliveTimeout: 65_000 }, handler)
  server.listen(Number(arg("port") ?? 0), "127.0.0.1", () => {
    process.stdout.write(`listening on http://127.0.0.1:${(server.address() as AddressInfo).port}\n`)
  })
  yield* Effect.never
})))
process.once("SIGTERM", () => process.exit(0))
