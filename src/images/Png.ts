/**
 * A small truecolor PNG encoder (8-bit RGB, no alpha) and the simulated worker's drawing: a deterministic pattern
 * from a hash of the prompt and the seed.
 *
 * Speed: the drawing is made of 16×16 cells, so 15 of every 16 rows repeat the row above; such a row is written with
 * filter 2 (Up) as zeros, which zlib at level 1 compresses almost for free. A 1216×832 image encodes in a few ms.
 */
import * as Crypto from "node:crypto"
import * as Zlib from "node:zlib"

const SIGNATURE = Buffer.from([137, 80, 78, 71, 13, 10, 26, 10])

const CRC_TABLE = (() => {
  const table = new Int32Array(256)
  for (let n = 0; n < 256; n++) {
    let c = n
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
    table[n] = c
  }
  return table
})()

/** CRC-32 of PNG chunks: zlib's native one where Node has it (22.2+), else a table. */
export const crc32: (data: Uint8Array) => number = typeof (Zlib as { crc32?: unknown }).crc32 === "function"
  ? (data) => (Zlib as unknown as { crc32: (d: Uint8Array) => number }).crc32(data)
  : (data) => {
    let c = -1
    for (let i = 0; i < data.length; i++) c = CRC_TABLE[(c ^ data[i]!) & 0xff]! ^ (c >>> 8)
    return (c ^ -1) >>> 0
  }

const chunk = (type: string, data: Uint8Array): Buffer => {
  const out = Buffer.allocUnsafe(12 + data.length)
  out.writeUInt32BE(data.length, 0)
  out.write(type, 4, "latin1")
  out.set(data, 8)
  out.writeUInt32BE(crc32(out.subarray(4, 8 + data.length)), 8 + data.length)
  return out
}

/** A PNG from scanlines that are already filtered (one filter byte, then `width * 3` bytes, per row). */
const fromScanlines = (width: number, height: number, scanlines: Uint8Array): Buffer => {
  const ihdr = Buffer.alloc(13)
  ihdr.writeUInt32BE(width, 0)
  ihdr.writeUInt32BE(height, 4)
  ihdr[8] = 8 // bit depth
  ihdr[9] = 2 // truecolor
  // compression 0, filter method 0, no interlace
  return Buffer.concat([
    SIGNATURE,
    chunk("IHDR", ihdr),
    chunk("IDAT", Zlib.deflateSync(scanlines, { level: 1 })),
    chunk("IEND", new Uint8Array(0))
  ])
}

const checkSize = (width: number, height: number) => {
  if (!Number.isInteger(width) || !Number.isInteger(height) || width < 1 || height < 1 || width * height > 1 << 26) {
    throw new RangeError(`bad image size ${width}x${height}`)
  }
}

/**
 * Encodes `rgb` (`width * height * 3` bytes, rows top to bottom). A row equal to the one above is written with the
 * Up filter (zeros); every other row unfiltered.
 */
export const encodeRgb = (width: number, height: number, rgb: Uint8Array): Buffer => {
  checkSize(width, height)
  const stride = width * 3
  if (rgb.length !== stride * height) throw new RangeError(`expected ${stride * height} bytes, got ${rgb.length}`)
  const src = Buffer.from(rgb.buffer, rgb.byteOffset, rgb.length)
  const out = Buffer.alloc((stride + 1) * height)
  for (let y = 0; y < height; y++) {
    const row = src.subarray(y * stride, (y + 1) * stride)
    const at = y * (stride + 1)
    if (y > 0 && row.equals(src.subarray((y - 1) * stride, y * stride))) {
      out[at] = 2
    } else {
      row.copy(out, at + 1)
    }
  }
  return fromScanlines(width, height, out)
}

/** Side of the drawing's cells in pixels. */
const CELL = 16

/**
 * The simulated worker's image: the same `prompt` and `seed` always give the same bytes. Four corner colours and a
 * stripe pattern come from SHA-256 of both; the cells blend the corners.
 */
export const draw = (input: { readonly prompt: string; readonly seed: number; readonly width: number; readonly height: number }): Buffer => {
  const { width, height } = input
  checkSize(width, height)
  const h = Crypto.createHash("sha256").update(input.prompt).update("\0").update(String(input.seed)).digest()
  const corners = [0, 3, 6, 9].map((i) => [h[i]!, h[i + 1]!, h[i + 2]!] as const)
  const period = 2 + (h[14]! % 4)
  const stripeX = h[12]! % period
  // never a multiple of the period: diagonal stripes or a checkerboard, never a plain row of them
  const stripeY = 1 + (h[13]! % (period - 1))
  const lift = 24 + (h[15]! % 48)
  const stride = width * 3
  const cols = Math.ceil(width / CELL)
  const rows = Math.ceil(height / CELL)
  const out = Buffer.alloc((stride + 1) * height)
  const row = Buffer.allocUnsafe(stride)
  for (let cy = 0; cy < rows; cy++) {
    const v = rows === 1 ? 0 : cy / (rows - 1)
    for (let cx = 0; cx < cols; cx++) {
      const u = cols === 1 ? 0 : cx / (cols - 1)
      const stripe = (cx * stripeX + cy * stripeY) % period === 0 ? lift : 0
      const x0 = cx * CELL
      const x1 = Math.min(width, x0 + CELL)
      for (let c = 0; c < 3; c++) {
        const top = corners[0]![c]! * (1 - u) + corners[1]![c]! * u
        const bottom = corners[2]![c]! * (1 - u) + corners[3]![c]! * u
        const value = Math.min(255, Math.round(top * (1 - v) + bottom * v) + stripe)
        for (let x = x0; x < x1; x++) row[x * 3 + c] = value
      }
    }
    const y0 = cy * CELL
    // the first row of the cell row unfiltered; the rest Up-filtered (zero bytes, as allocated)
    row.copy(out, y0 * (stride + 1) + 1)
    for (let y = y0 + 1; y < Math.min(height, y0 + CELL); y++) out[y * (stride + 1)] = 2
  }
  return fromScanlines(width, height, out)
}

/** Width and height from a PNG's IHDR; null when `bytes` does not start like a PNG. */
export const dimensions = (bytes: Uint8Array): { readonly width: number; readonly height: number } | null => {
  if (bytes.length < 24) return null
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length)
  if (!b.subarray(0, 8).equals(SIGNATURE) || b.toString("latin1", 12, 16) !== "IHDR") return null
  return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) }
}
