/**
 * No generator function is made per request on the request path (docs/decisions.md, "No generator function per
 * request"). A `function*` written inside another function is a new generator function each time that function
 * runs, and V8 gives each one its own prototype and map, kept until the next full collection: everything the
 * generator captured (the request's objects) survives every scavenge and is promoted. In the modules that serve
 * requests, a nested generator function must be the body of `Effect.fnUntraced` (made once, where it is written:
 * at module level, or once per layer); `Effect.gen` stays for module-level values.
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import ts from "typescript"
import { describe, expect, it } from "vitest"

const SRC = Path.resolve("src")

/** The modules a chat, embeddings, image or BYOK request runs through (folders end with `/`). */
const REQUEST_PATH = [
  "inference/",
  "upstream/",
  "protocols/",
  "deployments/Router.ts",
  "quota/AdmissionMemory.ts",
  "quota/AdmissionRedis.ts",
  "http/Body.ts",
  "http/Respond.ts"
]

const listSources = (dir: string): Array<string> =>
  Fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = Path.join(dir, entry.name)
    if (entry.isDirectory()) return listSources(full)
    return entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts") ? [full] : []
  })

const isFunctionLike = (node: ts.Node): boolean =>
  ts.isFunctionDeclaration(node) || ts.isFunctionExpression(node) || ts.isArrowFunction(node) ||
  ts.isMethodDeclaration(node) || ts.isConstructorDeclaration(node) || ts.isGetAccessor(node) ||
  ts.isSetAccessor(node)

const isGenerator = (node: ts.Node): node is ts.FunctionExpression | ts.FunctionDeclaration | ts.MethodDeclaration =>
  (ts.isFunctionExpression(node) || ts.isFunctionDeclaration(node) || ts.isMethodDeclaration(node)) &&
  node.asteriskToken !== undefined

/** `Effect.fnUntraced(<node>, ...)`. */
const isFnUntracedBody = (node: ts.Node): boolean => {
  const call = node.parent
  return call !== undefined && ts.isCallExpression(call) && call.arguments[0] === node &&
    ts.isPropertyAccessExpression(call.expression) && call.expression.name.text === "fnUntraced" &&
    ts.isIdentifier(call.expression.expression) && call.expression.expression.text === "Effect"
}

/** Lines (1-based) of the generator functions written inside another function that are not `fnUntraced` bodies. */
export const nestedGenerators = (text: string): Array<number> => {
  const source = ts.createSourceFile("module.ts", text, ts.ScriptTarget.Latest, true)
  const found: Array<number> = []
  const visit = (node: ts.Node, inFunction: boolean): void => {
    if (isGenerator(node) && inFunction && !isFnUntracedBody(node)) {
      found.push(source.getLineAndCharacterOfPosition(node.getStart()).line + 1)
    }
    // A class field's initializer runs once per instance, like a function body.
    ts.forEachChild(node, (child) => visit(child, inFunction || isFunctionLike(node) || ts.isPropertyDeclaration(node)))
  }
  visit(source, false)
  return found
}

describe("no generator function per request", () => {
  it("the request-path modules write nested generator bodies with Effect.fnUntraced", () => {
    const modules = listSources(SRC)
      .map((full) => Path.relative(SRC, full).split(Path.sep).join("/"))
      .filter((path) => REQUEST_PATH.some((prefix) => prefix.endsWith("/") ? path.startsWith(prefix) : path === prefix))
    expect(modules.length).toBeGreaterThan(20)
    const offenders = modules.flatMap((path) =>
      nestedGenerators(Fs.readFileSync(Path.join(SRC, path), "utf8")).map((line) => `${path}:${line}`)
    )
    expect(offenders).toEqual([])
  })

  it("the checker flags a generator made inside a function and accepts the two forms made once", () => {
    const made = nestedGenerators([
      "export const perCall = (x: number) => Effect.gen(function*() { return x })",
      "export function outer() { function* inner() { yield 1 } return inner }",
      "class C { run() { return Effect.gen(function*() {}) } }",
      "class D { field = Effect.gen(function*() {}) }"
    ].join("\n"))
    expect(made).toEqual([1, 2, 3, 4])
    const once = nestedGenerators([
      "export const value = Effect.gen(function*() { return 1 })",
      "export const body = Effect.fnUntraced(function*(x: number) { return x })",
      "export const make = (o: number) => { const step = Effect.fnUntraced(function*() { return o }); return step }",
      "function* topLevel() { yield 1 }"
    ].join("\n"))
    expect(once).toEqual([])
  })
})
