/** The answer's archive (src/images/Zip.ts): one stored PNG named `image_0.png`, read back with fflate. */
import { unzipSync } from "fflate"
import { describe, expect, it } from "vitest"
import { IMAGE_FILE_NAME, isPng, zipImage } from "../../src/images/Zip.js"
import { ihdrSize, makePng } from "./png.js"

describe("zipImage", () => {
  it("holds exactly one PNG, byte for byte", () => {
    const png = makePng(832, 1216)
    const files = unzipSync(zipImage(png))
    expect(Object.keys(files)).toEqual([IMAGE_FILE_NAME])
    expect(IMAGE_FILE_NAME).toBe("image_0.png")
    expect(Buffer.from(files[IMAGE_FILE_NAME]!).equals(Buffer.from(png))).toBe(true)
    expect(ihdrSize(files[IMAGE_FILE_NAME]!)).toEqual({ width: 832, height: 1216 })
  })

  it("stores the PNG without recompressing it", () => {
    const png = makePng(64, 64)
    const zip = zipImage(png)
    // Local file header: compression method (offset 8) 0 = stored.
    expect(zip[8]! | (zip[9]! << 8)).toBe(0)
    expect(zip.length).toBeLessThan(png.length + 200)
  })
})

describe("isPng", () => {
  it("checks the signature and the IHDR chunk", () => {
    expect(isPng(makePng(64, 64))).toBe(true)
    expect(isPng(new Uint8Array(0))).toBe(false)
    expect(isPng(new TextEncoder().encode("<html>not a png</html>"))).toBe(false)
    const broken = makePng(64, 64)
    broken[12] = 0
    expect(isPng(broken)).toBe(false)
  })
})
