/**
 * Issue 21, point 5: the README and docs/ as a newcomer meets them. Every TypeScript example (outside the
 * developers' internal notes) compiles under
 * `strict` against the installed `openai` SDK (the `reasoning` and `wellspring` extensions typed); every relative
 * link points to a file of the repository (never outside it) and, with a `#fragment`, to a heading there.
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import ts from "typescript"
import { describe, expect, it } from "vitest"

const ROOT = Path.resolve(".")
const DOCS = ["README.md", ...Fs.readdirSync("docs").filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`)]
/** Notes for the project's developers, whose fragments are excerpts of the source, not examples to run. */
const INTERNAL = new Set(["docs/effect4-migration.md", "docs/decisions.md"])
const read = (file: string) => Fs.readFileSync(Path.join(ROOT, file), "utf8")

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
const anchorsOf = (markdown: string): Set<string> => {
  const seen = new Map<string, number>()
  const anchors = new Set<string>()
  let fenced = false
  for (const line of markdown.split("\n")) {
    if (line.startsWith("```")) fenced = !fenced
    const heading = fenced ? null : /^#{1,6} (.+)$/.exec(line)
    if (heading === null) continue
    const base = heading[1]!.trim().toLowerCase().replace(/[^\p{L}\p{N}_\- ]/gu, "").replace(/ /g, "-")
    const n = seen.get(base) ?? 0
    seen.set(base, n + 1)
    anchors.add(n === 0 ? base : `${base}-${n}`)
  }
  return anchors
}

describe("README and docs", () => {
  it("every relative link resolves inside the repository, to a heading when it names one", () => {
    const broken: Array<string> = []
    for (const file of DOCS) {
      const text = read(file).replace(/```[\s\S]*?```/g, "")
      for (const match of text.matchAll(/\]\(([^)\s]+)\)/g)) {
        const target = match[1]!
        if (/^(https?:|mailto:)/.test(target)) continue
        const [path, fragment] = target.split("#") as [string, string | undefined]
        const resolved = path === "" ? Path.join(ROOT, file) : Path.resolve(Path.dirname(Path.join(ROOT, file)), path)
        if (!resolved.startsWith(ROOT + Path.sep)) {
          broken.push(`${file}: ${target} leaves the repository`)
          continue
        }
        if (!Fs.existsSync(resolved)) {
          broken.push(`${file}: ${target} does not exist`)
          continue
        }
        if (fragment !== undefined && resolved.endsWith(".md") && !anchorsOf(Fs.readFileSync(resolved, "utf8")).has(fragment)) {
          broken.push(`${file}: ${target} names no heading`)
        }
      }
    }
    expect(broken).toEqual([])
  })

  it("no text points at files outside the repository", () => {
    for (const file of DOCS.filter((f) => !INTERNAL.has(f))) expect(read(file), file).not.toMatch(/\.\.\/shared\//)
  })

  it("every TypeScript example compiles under strict", () => {
    const dir = Path.join(ROOT, "test-artifacts", "doc-examples")
    Fs.rmSync(dir, { recursive: true, force: true })
    Fs.mkdirSync(dir, { recursive: true })
    const files: Array<string> = []
    for (const file of DOCS.filter((f) => !INTERNAL.has(f))) {
      let n = 0
      for (const match of read(file).matchAll(/```ts\n([\s\S]*?)```/g)) {
        const out = Path.join(dir, `${file.replace(/[/.]/g, "_")}_${++n}.ts`)
        // Each example is a module of its own (top-level await needs one).
        Fs.writeFileSync(out, `${match[1]}\nexport {}\n`)
        files.push(out)
      }
    }
    expect(files.length).toBeGreaterThan(0)
    const program = ts.createProgram(files, {
      strict: true,
      noEmit: true,
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      types: ["node"],
      skipLibCheck: true
    })
    const problems = ts.getPreEmitDiagnostics(program).map((d) => {
      const where = d.file ? `${Path.basename(d.file.fileName)}:${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}` : ""
      return `${where} ${ts.flattenDiagnosticMessageText(d.messageText, "\n")}`
    })
    expect(problems).toEqual([])
  }, 60_000)
})
