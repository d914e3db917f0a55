/** Gallery entries for the image account tests. */
import * as Crypto from "node:crypto"
import type { GalleryEntry } from "../../src/images/Contracts.js"
import { DEFAULT_PRESET } from "../../src/images/Presets.js"

export const DAY_MS = 86_400_000

let seq = 0
export const imageId = () => `img_${Crypto.randomBytes(12).toString("hex")}`
/** A PNG signature and random bytes (the gallery stores whatever the worker produced). */
export const fakePng = (size = 4096) =>
  new Uint8Array(Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Crypto.randomBytes(size)]))

export const entry = (accountId: string, over: Partial<GalleryEntry> = {}): GalleryEntry => ({
  id: imageId(),
  accountId,
  prompt: `고양이 ${++seq}`,
  spec: {
    prompt: "converted",
    negative_prompt: "lowres",
    width: 832,
    height: 1216,
    steps: 28,
    scale: 5.5,
    seed: 4_294_967_295,
    preset: { ...DEFAULT_PRESET }
  },
  png: fakePng(),
  ...over
})
