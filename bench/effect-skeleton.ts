/**
 * Reference point: the thinnest @effect/platform proxy (router, body read, undici call, streamed answer),
 * without auth, admission or request rows. Shows what the platform itself costs on this machine.
 * Usage: tsx bench/effect-skeleton.ts --port N --upstream http://127.0.0.1:M
 */
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { NodeHttpServer } from "@effect/platform-node"
import { Effect } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Pool } from "undici"

const arg = (name: string) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : undefined
}
const pool = new Pool(arg("upstream") ?? "http://127.0.0.1:9100", { connections: 128 })

const router = HttpRouter.empty.pipe(HttpRouter.post(
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
))

Effect.runFork(Effect.gen(function*() {
  const handler = yield* NodeHttpServer.makeHandler(yield* HttpRouter.toHttpApp(router))
  const server = Http.createServer({ keepAliveTimeout: 65_000 }, handler)
  server.listen(Number(arg("port") ?? 0), "127.0.0.1", () => {
    process.stdout.write(`listening on http://127.0.0.1:${(server.address() as AddressInfo).port}\n`)
  })
  yield* Effect.never
}))
process.once("SIGTERM", () => process.exit(0))
