/**
 * The worker PNG check walks every chunk: a truncated upload with a valid IEND spliced on, or one flipped byte,
 * is refused (found by a hostile review: only the signature, IHDR and the last 12 bytes were checked).
 */
import { describe, expect, it } from "vitest"
import { draw } from "../../src/images/Png.js"
import { checkPng } from "../../src/images/worker/PngCheck.js"
import { makePng } from "./png.js"

describe("checkPng", () => {
  const png = Buffer.from(makePng(64, 48))

  it("takes a well-formed PNG, and the simulated worker's", () => {
    expect(checkPng(png)).toEqual({ ok: true, width: 64, height: 48 })
    expect(checkPng(draw({ width: 320, height: 200, prompt: "cat", seed: 3 }))).toEqual({ ok: true, width: 320, height: 200 })
  })

  it("refuses a truncated PNG with IEND spliced on", () => {
    const spliced = Buffer.concat([png.subarray(0, Math.floor(png.length / 2)), png.subarray(png.length - 12)])
    expect(checkPng(spliced).ok).toBe(false)
  })

  it("refuses one flipped byte in the image data", () => {
    const flipped = Buffer.from(png)
    flipped[45] = flipped[45]! ^ 0xff
    expect(checkPng(flipped)).toMatchObject({ ok: false })
  })

  it("refuses a PNG without IDAT", () => {
    const noData = Buffer.concat([png.subarray(0, 33), png.subarray(png.length - 12)])
    expect(checkPng(noData)).toEqual({ ok: false, reason: "no IDAT chunk" })
  })
})
