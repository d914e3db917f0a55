/**
 * Shared helpers of the input-bounds suites: a gateway with the scripted mock model and chosen limits, and
 * the checks every rejection must pass (status, code, Korean message, small body, no echo of the input).
 */
import { expect } from "vitest"
import { ensureDevAccount } from "../../src/App.js"
import { type ConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import type { MockUpstream } from "../support/MockUpstream.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { addMockModel, expectError, rowById, rowIdOf } from "../inference/helpers.js"

export interface InputGatewayOptions {
  readonly mock: MockUpstream
  readonly limits?: Record<string, number>
  readonly databaseUrl?: string
  readonly configure?: (doc: ConfigDoc) => void
}

/**
 * A gateway with `ws-mock` routed to `mock`, the given limits, and no failed-request throttle in the way. On
 * PostgreSQL, where no dev account is created at boot, the key comes from `ensureDevAccount`.
 */
export const startInputGateway = async (options: InputGatewayOptions): Promise<TestGateway> => {
  const gw = await startGateway({
    admission: makeUnlimitedAdmission().layer,
    ...(options.databaseUrl ? { databaseUrl: options.databaseUrl } : {}),
    configure: (doc) => {
      addMockModel(doc, { baseUrl: options.mock.url })
      doc.limits = { ...doc.limits, failed_requests_per_minute: 1_000_000, ...options.limits }
      options.configure?.(doc)
    }
  })
  if (gw.key !== "") return gw
  const key = await gw.run(ensureDevAccount)
  if (!key) throw new Error("no key for the test gateway")
  return { ...gw, key }
}

/** Largest error body we accept for a rejected input. */
export const SMALL_ERROR_BYTES = 1024

/**
 * Asserts the envelope (status, code, Korean message), that the body is under 1 KB and does not contain
 * `absent` (a marker of the client's value), and that the request left one row with that code; returns the body.
 */
export const expectRejected = async (
  gw: TestGateway,
  res: Response,
  status: number,
  code: string,
  absent: ReadonlyArray<string> = []
) => {
  const clone = res.clone()
  const text = await clone.text()
  expect(Buffer.byteLength(text), text.slice(0, 300)).toBeLessThan(SMALL_ERROR_BYTES)
  for (const marker of absent) expect(text).not.toContain(marker)
  const body = await expectError(res, status, code)
  const row = await rowById(gw, rowIdOf(res))
  expect(row).toMatchObject({ status: "error", error_code: code, http_status: status })
  expect((row.error ?? "").length).toBeLessThanOrEqual(500)
  for (const marker of absent) expect(row.error ?? "").not.toContain(marker)
  return body
}

/** `depth` nested arrays around `inner`, as JSON text. */
export const nestedArrays = (depth: number, inner = "1") => "[".repeat(depth) + inner + "]".repeat(depth)

/** `depth` nested objects `{"a": ...}` around `inner`, as a value. */
export const nestedObjects = (depth: number, inner: unknown = "x"): unknown => {
  let value = inner
  for (let i = 0; i < depth; i++) value = { a: value }
  return value
}
