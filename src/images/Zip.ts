/**
 * The answer of the image endpoint: a ZIP archive holding one PNG, named as NovelAI names it (`image_0.png`).
 * Stored, not deflated: a PNG is compressed already.
 */
import { zipSync } from "fflate"

export const IMAGE_FILE_NAME = "image_0.png"

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]

/** The bytes start with the PNG signature and an IHDR chunk. */
export const isPng = (bytes: Uint8Array): boolean =>
  bytes.length >= 24 && PNG_SIGNATURE.every((b, i) => bytes[i] === b) &&
  bytes[12] === 0x49 && bytes[13] === 0x48 && bytes[14] === 0x44 && bytes[15] === 0x52

export const zipImage = (png: Uint8Array, mtime: Date = new Date()): Uint8Array =>
  zipSync({ [IMAGE_FILE_NAME]: [png, { level: 0, mtime }] })
