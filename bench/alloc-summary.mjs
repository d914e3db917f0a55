// Summarizes a sampling heap profile written by bench/alloc-sampler.mjs: bytes allocated per request on the main
// thread, and the allocation sites that allocate the most per request, named by their TypeScript source through
// the bundle's source maps.  node bench/alloc-summary.mjs PROFILE REQUESTS [TOP]
import { readFileSync } from "node:fs"
import { SourceMap } from "node:module"

const [file, requestsArg, topArg = "20"] = process.argv.slice(2)
const requests = Number(requestsArg)
const head = JSON.parse(readFileSync(file, "utf8")).head
const maps = new Map()
const mapOf = (url) => {
  if (!url.startsWith("file://")) return null
  const path = url.slice("file://".length)
  if (!maps.has(path)) {
    try {
      maps.set(path, new SourceMap(JSON.parse(readFileSync(`${path}.map`, "utf8"))))
    } catch {
      maps.set(path, null)
    }
  }
  return maps.get(path)
}
const siteOf = ({ functionName, url, lineNumber, columnNumber }) => {
  const name = functionName || "(anonymous)"
  const map = mapOf(url)
  const entry = map?.findEntry(lineNumber, columnNumber)
  if (entry?.originalSource) {
    return `${name} ${entry.originalSource.replace(/.*\/(src|node_modules)\//, "")}:${entry.originalLine + 1}`
  }
  return url ? `${name} ${url.replace(/.*node_modules\//, "")}:${lineNumber + 1}` : name
}
const bySite = new Map()
let total = 0
const walk = (node) => {
  total += node.selfSize
  if (node.selfSize > 0) {
    const site = siteOf(node.callFrame)
    bySite.set(site, (bySite.get(site) ?? 0) + node.selfSize)
  }
  for (const child of node.children) walk(child)
}
walk(head)
console.log(`allocated: ${(total / requests / 1024).toFixed(1)} KB per request (${requests} requests)`)
for (const [site, bytes] of [...bySite].sort((a, b) => b[1] - a[1]).slice(0, Number(topArg))) {
  console.log(`${(bytes / requests).toFixed(0).padStart(7)} B/req  ${site}`)
}
