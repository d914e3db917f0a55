/**
 * The benchmark floor: a minimal reverse proxy with undici, no auth, no admission, no logging.
 * Usage: tsx bench/floor-proxy.ts --port N --upstream http://127.0.0.1:M
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Pool } from "undici"

const arg = (name: string) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1] : undefined
}
const upstream = arg("upstream") ?? "http://127.0.0.1:9100"
const pool = new Pool(upstream, { connections: 128, pipelining: 1 })

const server = Http.createServer((req, res) => {
  const chunks: Array<Buffer> = []
  req.on("data", (c: Buffer) => chunks.push(c))
  req.on("end", () => {
    const body = Buffer.concat(chunks)
    pool.request({
      method: req.method as "POST",
      path: req.url ?? "/",
      headers: { "content-type": "application/json" },
      body
    }).then((up) => {
      res.writeHead(up.statusCode, { "content-type": String(up.headers["content-type"] ?? "application/json") })
      up.body.on("data", (c: Buffer) => res.write(c))
      up.body.on("end", () => res.end())
      up.body.on("error", () => res.destroy())
      res.on("close", () => up.body.destroy())
    }).catch(() => {
      res.writeHead(502)
      res.end()
    })
  })
})
server.keepAliveTimeout = 65_000
server.listen(Number(arg("port") ?? 0), "127.0.0.1", () => {
  process.stdout.write(`listening on http://127.0.0.1:${(server.address() as AddressInfo).port}\n`)
})
process.once("SIGTERM", () => process.exit(0))
