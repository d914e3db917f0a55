/** Characters as the spec and PostgreSQL's `char_length` count them: code points, not UTF-16 units. */
export const codePoints = (s: string): number => {
  let n = 0
  for (const _ of s) n++
  return n
}

/**
 * Whether `s` has more than `max` code points. The UTF-16 length bounds them from both sides, so only strings
 * between `max` and `2 × max` units are walked.
 */
export const overCodePoints = (s: string, max: number): boolean =>
  s.length > max && (s.length > 2 * max || codePoints(s) > max)
