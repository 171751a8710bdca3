// JSON.parse that keeps integers of more than 15 digits exact, as BigInt
// (the vectors have attempt 9223372036854775807). Node 20 has no reviver
// access to the source text, so such numbers are first marked as strings.
const TOKENS = /"(?:[^"\\]|\\[^])*"|-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/g;
const MARK = '\u0000bigint:';

export function parseJSON(text) {
  let marked = false;
  const src = text.replace(TOKENS, (t) => {
    if (t[0] === '"' || /[.eE]/.test(t) || t.length - (t[0] === '-') <= 15) return t;
    marked = true;
    return `"\\u0000bigint:${t}"`;
  });
  if (!marked) return JSON.parse(src);
  // Marking must not make invalid JSON valid (a number as an object key):
  // the text itself must parse.
  JSON.parse(text);
  return JSON.parse(src, (_, v) => (typeof v === 'string' && v.startsWith(MARK) ? BigInt(v.slice(MARK.length)) : v));
}
