// Plain producers (queue/redisqueue/README.md): the job of a Redis stream entry written
// by a producer that knows nothing of backstop carries, when the entry has no
// payload field, its "fields JSON", byte for byte what the queue scripts
// (lib.lua's fields_json) write for it.

/**
 * The fields JSON of [name, value] pairs (Buffers, each name once: the last
 * value of each): a JSON object, names in byte order (not UTF-16 code units,
 * not locale), no spaces; only a backslash, a double quote and bytes below
 * 0x20 escaped (\u00xx, lowercase hex), every other byte kept as it is (0x7f,
 * UTF-8 or not). Returns a Buffer.
 */
export function fieldsJSON(pairs) {
  const sorted = [...pairs].sort((a, b) => Buffer.compare(a[0], b[0]));
  const parts = [Buffer.from('{')];
  for (const [i, [name, value]] of sorted.entries()) {
    if (i > 0) parts.push(Buffer.from(','));
    parts.push(quote(name), Buffer.from(':'), quote(value));
  }
  parts.push(Buffer.from('}'));
  return Buffer.concat(parts);
}

const HEX = '0123456789abcdef';

function quote(b) {
  const out = [0x22];
  for (const c of b) {
    if (c === 0x5c || c === 0x22) out.push(0x5c, c);
    else if (c < 0x20) out.push(0x5c, 0x75, 0x30, 0x30, HEX.charCodeAt(c >> 4), HEX.charCodeAt(c & 15));
    else out.push(c);
  }
  out.push(0x22);
  return Buffer.from(out);
}

/** The bytes of a reply value: a Buffer's (or Uint8Array's) own, a string's UTF-8. */
export function raw8(v) {
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  return Buffer.from(typeof v === 'string' ? v : v === null || v === undefined ? '' : String(v), 'utf8');
}
