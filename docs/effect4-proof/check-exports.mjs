import * as E from "effect"
import * as H from "effect/http"
import * as HA from "effect/http-api"
import * as S from "effect/sql"
import * as T from "effect/testing"
import * as PN from "@effect/platform-node"
import * as PG from "@effect/sql-pg"
import * as V from "@effect/vitest"
const ns = { ...E, ...H, ...HA, ...S, ...T, ...PN, ...PG }
const names = process.argv.slice(2)
for (const api of names) {
  const [m, n] = api.split(".")
  const mod = ns[m]
  if (!mod) { console.log(`${api}\tMODULE-MISSING`); continue }
  console.log(`${api}\t${n in mod ? "ok" : "MISSING"}`)
}
console.log("vitest exports:", Object.keys(V).join(","))
console.log("modules:", Object.keys(E).join(","))
console.log("http:", Object.keys(H).join(","))
console.log("sql:", Object.keys(S).join(","), " pg:", Object.keys(PG).join(","), " node:", Object.keys(PN).join(","))
