/** A small valid PNG of any size (one grey row repeated), and its IHDR size read back: for the image tests. */
import * as Zlib from "node:zlib"

const chunk = (type: string, data: Buffer): Buffer => {
  const length = Buffer.alloc(4)
  length.writeUInt32BE(data.length)
  const body = Buffer.concat([Buffer.from(type, "latin1"), data])
  const crc = Buffer.alloc(4)
  crc.writeUInt32BE(Zlib.crc32(body))
  return Buffer.concat([length, body, crc])
}

export const makePng = (width: number, height: number): Uint8Array => {
  const ihdr = Buffer.alloc(13)
  ihdr.writeUInt32BE(width, 0)
  ihdr.writeUInt32BE(height, 4)
  ihdr[8] = 8 // bit depth
  ihdr[9] = 0 // greyscale
  const row = Buffer.alloc(width + 1, 0x80)
  row[0] = 0 // filter: none
  const raw = Buffer.concat(Array.from({ length: height }, () => row))
  return new Uint8Array(Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr),
    chunk("IDAT", Zlib.deflateSync(raw)),
    chunk("IEND", Buffer.alloc(0))
  ]))
}

export const ihdrSize = (png: Uint8Array): { width: number; height: number } => {
  const view = Buffer.from(png.buffer, png.byteOffset, png.byteLength)
  return { width: view.readUInt32BE(16), height: view.readUInt32BE(20) }
}
