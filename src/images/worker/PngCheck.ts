/**
 * The structural check of a worker's PNG, on both ends of the worker API: the signature, a well-formed IHDR
 * (first chunk, dimensions, a valid bit depth and colour type), every chunk's length and CRC in a chain that ends
 * exactly with IEND (a truncated or spliced upload fails here), and at least one IDAT. Pixel data is not decoded.
 */
import * as Zlib from "node:zlib"

export const PNG_SIGNATURE = Uint8Array.of(0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a)
const IEND = Uint8Array.of(0, 0, 0, 0, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82)
/** Larger than any configurable resolution (4096) after a 4× upscale. */
export const MAX_DIMENSION = 16_384

/** Bit depths allowed per colour type (PNG spec, table 11.1). */
const DEPTHS: Readonly<Record<number, ReadonlyArray<number>>> = {
  0: [1, 2, 4, 8, 16],
  2: [8, 16],
  3: [1, 2, 4, 8],
  4: [8, 16],
  6: [8, 16]
}

export type PngCheck =
  | { readonly ok: true; readonly width: number; readonly height: number }
  | { readonly ok: false; readonly reason: string }

const bad = (reason: string): PngCheck => ({ ok: false, reason })

export const checkPng = (bytes: Uint8Array): PngCheck => {
  if (bytes.length < PNG_SIGNATURE.length + 25 + IEND.length) return bad("too short to be a PNG")
  for (let i = 0; i < PNG_SIGNATURE.length; i++) if (bytes[i] !== PNG_SIGNATURE[i]) return bad("no PNG signature")
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  if (view.getUint32(8) !== 13 || String.fromCharCode(...bytes.subarray(12, 16)) !== "IHDR") {
    return bad("the first chunk is not a 13-byte IHDR")
  }
  if ((Zlib.crc32(bytes.subarray(12, 29)) >>> 0) !== view.getUint32(29)) return bad("IHDR CRC mismatch")
  const width = view.getUint32(16)
  const height = view.getUint32(20)
  if (width < 1 || height < 1 || width > MAX_DIMENSION || height > MAX_DIMENSION) return bad(`dimensions ${width}x${height} out of range`)
  const depth = bytes[24]!
  const colour = bytes[25]!
  if (!(DEPTHS[colour] ?? []).includes(depth)) return bad(`bit depth ${depth} with colour type ${colour}`)
  if (bytes[26] !== 0 || bytes[27] !== 0 || (bytes[28] !== 0 && bytes[28] !== 1)) return bad("unknown compression, filter or interlace method")
  const tail = bytes.subarray(bytes.length - IEND.length)
  for (let i = 0; i < IEND.length; i++) if (tail[i] !== IEND[i]) return bad("does not end with IEND")
  // Every chunk after IHDR: its declared length inside the file and its CRC right, up to IEND at the very end.
  let at = 33
  let idat = false
  while (at < bytes.length - IEND.length) {
    if (at + 12 > bytes.length - IEND.length) return bad("a chunk is cut off")
    const length = view.getUint32(at)
    const end = at + 12 + length
    if (end > bytes.length - IEND.length) return bad("a chunk runs past the end")
    if ((Zlib.crc32(bytes.subarray(at + 4, at + 8 + length)) >>> 0) !== view.getUint32(at + 8 + length)) {
      return bad("chunk CRC mismatch")
    }
    if (bytes[at + 4] === 0x49 && bytes[at + 5] === 0x44 && bytes[at + 6] === 0x41 && bytes[at + 7] === 0x54) idat = true
    at = end
  }
  if (at !== bytes.length - IEND.length) return bad("chunks do not line up with IEND")
  if (!idat) return bad("no IDAT chunk")
  return { ok: true, width, height }
}
