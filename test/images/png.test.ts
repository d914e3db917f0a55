import { describe, expect, it } from "vitest"
import * as Zlib from "node:zlib"
import { crc32, dimensions, draw, encodeRgb } from "../../src/images/Png.js"

interface Chunk {
  readonly type: string
  readonly data: Buffer
}

/** Splits a PNG into chunks, checking the signature and every CRC. */
const chunks = (png: Buffer): Array<Chunk> => {
  expect([...png.subarray(0, 8)]).toEqual([137, 80, 78, 71, 13, 10, 26, 10])
  const out: Array<Chunk> = []
  let at = 8
  while (at < png.length) {
    const length = png.readUInt32BE(at)
    const type = png.toString("latin1", at + 4, at + 8)
    const data = png.subarray(at + 8, at + 8 + length)
    expect(png.readUInt32BE(at + 8 + length)).toBe(crc32(png.subarray(at + 4, at + 8 + length)))
    out.push({ type, data })
    at += 12 + length
  }
  return out
}

/** Decodes an 8-bit RGB PNG (filters 0 and 2 only, which is what the encoder writes) to its pixels. */
const decode = (png: Buffer) => {
  const parts = chunks(png)
  expect(parts.map((c) => c.type)).toEqual(["IHDR", "IDAT", "IEND"])
  const ihdr = parts[0]!.data
  const width = ihdr.readUInt32BE(0)
  const height = ihdr.readUInt32BE(4)
  expect([...ihdr.subarray(8)]).toEqual([8, 2, 0, 0, 0])
  const raw = Zlib.inflateSync(parts[1]!.data)
  const stride = width * 3
  expect(raw.length).toBe((stride + 1) * height)
  const pixels = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]!
    const row = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    for (let i = 0; i < stride; i++) {
      const up = y > 0 ? pixels[(y - 1) * stride + i]! : 0
      if (filter === 0) pixels[y * stride + i] = row[i]!
      else if (filter === 2) pixels[y * stride + i] = (row[i]! + up) & 0xff
      else throw new Error(`unexpected filter ${filter}`)
    }
  }
  return { width, height, pixels }
}

describe("Png", () => {
  it("crc32 matches the standard check value", () => {
    expect(crc32(Buffer.from("123456789"))).toBe(0xcbf43926)
  })

  it("encodeRgb round-trips pixels, repeated rows included", () => {
    const width = 5
    const height = 4
    const rgb = Buffer.alloc(width * height * 3)
    for (let i = 0; i < rgb.length; i++) rgb[i] = (i * 37) & 0xff
    // row 2 repeats row 1
    rgb.copy(rgb, 2 * width * 3, width * 3, 2 * width * 3)
    const png = encodeRgb(width, height, rgb)
    const decoded = decode(png)
    expect(decoded.width).toBe(width)
    expect(decoded.height).toBe(height)
    expect(decoded.pixels.equals(rgb)).toBe(true)
    expect(dimensions(png)).toEqual({ width, height })
  })

  it("rejects sizes it cannot draw", () => {
    expect(() => encodeRgb(2, 2, new Uint8Array(5))).toThrow(RangeError)
    expect(() => draw({ prompt: "x", seed: 1, width: 0, height: 10 })).toThrow(RangeError)
    expect(() => draw({ prompt: "x", seed: 1, width: 1.5, height: 10 })).toThrow(RangeError)
    expect(dimensions(new Uint8Array([1, 2, 3]))).toBeNull()
  })

  it("draw: the job's size, deterministic for a prompt and seed, different otherwise", () => {
    const a = draw({ prompt: "a red fox", seed: 42, width: 832, height: 1216 })
    const decoded = decode(a)
    expect([decoded.width, decoded.height]).toEqual([832, 1216])
    expect(draw({ prompt: "a red fox", seed: 42, width: 832, height: 1216 }).equals(a)).toBe(true)
    expect(draw({ prompt: "a red fox", seed: 43, width: 832, height: 1216 }).equals(a)).toBe(false)
    expect(draw({ prompt: "a red cat", seed: 42, width: 832, height: 1216 }).equals(a)).toBe(false)
    // sizes that are not multiples of the cell size
    expect(decode(draw({ prompt: "odd", seed: 1, width: 67, height: 3 }))).toMatchObject({ width: 67, height: 3 })
  })

  it("draws 1216x832 in a few milliseconds", () => {
    for (let i = 0; i < 3; i++) draw({ prompt: "warm-up", seed: i, width: 1216, height: 832 })
    const started = performance.now()
    for (let i = 0; i < 10; i++) draw({ prompt: `p${i}`, seed: i, width: 1216, height: 832 })
    const each = (performance.now() - started) / 10
    // typically ~4 ms; the bound leaves room for a busy shared machine
    expect(each).toBeLessThan(40)
  })
})
