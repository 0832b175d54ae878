/**
 * canonical-json/1 (docs/wire-protocol.md, "Canonical JSON"): the one byte form of a
 * JSON value that is hashed or signed. Keys sorted by Unicode code point at every level,
 * no whitespace, UTF-8 without escaping non-ASCII, integers in decimal, floats as the
 * shortest round-trip digits in Python's `repr` layout (`1e-05`, `1e+16`, `100.0`).
 *
 * JavaScript has one number type; the protocol has two (an integer and a binary64
 * float). So: a `number` that is an integer is written as an integer, any other
 * `number` as a float; `bigint` is an integer of any size; `JsonFloat` is a float whose
 * value happens to be an integer (written `100.0`). `parseJson` keeps the distinction
 * the way the protocol reads JSON text.
 */

/** A float that must be written as one even when its value is an integer. */
export class JsonFloat {
  constructor(readonly value: number) {}
}

export type JsonValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | JsonFloat
  | JsonValue[]
  | { [key: string]: JsonValue | undefined };

/** Whether `value` is a JSON object: not null, an array or a `JsonFloat`. */
export function isJsonObject(value: unknown): value is { [key: string]: JsonValue | undefined } {
  return value !== null && typeof value === 'object' && !Array.isArray(value) && !(value instanceof JsonFloat);
}

export class CanonicalJsonError extends Error {
  override name = 'CanonicalJsonError';
}

/** The canonical bytes of `value` (UTF-8). */
export function canonicalJson(value: JsonValue): Buffer {
  return Buffer.from(canonicalText(value), 'utf8');
}

/** The canonical text of `value`. Refuses non-finite floats and lone surrogates. */
export function canonicalText(value: JsonValue): string {
  const out: string[] = [];
  write(value, out);
  return out.join('');
}

function write(value: JsonValue | undefined, out: string[]): void {
  if (value === null || value === undefined) {
    out.push('null');
  } else if (typeof value === 'boolean') {
    out.push(value ? 'true' : 'false');
  } else if (typeof value === 'number') {
    out.push(Number.isInteger(value) ? BigInt(value).toString() : floatRepr(value));
  } else if (typeof value === 'bigint') {
    out.push(value.toString());
  } else if (typeof value === 'string') {
    out.push(quote(value));
  } else if (value instanceof JsonFloat) {
    out.push(floatRepr(value.value));
  } else if (Array.isArray(value)) {
    out.push('[');
    value.forEach((item, index) => {
      if (index > 0) out.push(',');
      write(item, out);
    });
    out.push(']');
  } else {
    const keys = Object.keys(value).sort(compareCodePoints);
    out.push('{');
    keys.forEach((key, index) => {
      if (index > 0) out.push(',');
      out.push(quote(key), ':');
      write(value[key], out);
    });
    out.push('}');
  }
}

/** Orders strings by Unicode code point (UTF-16 unit order differs above U+FFFF). */
export function compareCodePoints(a: string, b: string): number {
  const left = Array.from(a);
  const right = Array.from(b);
  const n = Math.min(left.length, right.length);
  for (let i = 0; i < n; i++) {
    const x = left[i]!.codePointAt(0)!;
    const y = right[i]!.codePointAt(0)!;
    if (x !== y) return x - y;
  }
  return left.length - right.length;
}

const ESCAPES: Record<string, string> = {
  '"': '\\"',
  '\\': '\\\\',
  '\b': '\\b',
  '\f': '\\f',
  '\n': '\\n',
  '\r': '\\r',
  '\t': '\\t',
};

function quote(text: string): string {
  if (!text.isWellFormed()) {
    throw new CanonicalJsonError('a string holds a lone surrogate, which UTF-8 cannot encode');
  }
  let out = '"';
  for (const ch of text) {
    const escaped = ESCAPES[ch];
    if (escaped !== undefined) {
      out += escaped;
    } else if (ch.charCodeAt(0) < 0x20) {
      out += '\\u' + ch.charCodeAt(0).toString(16).padStart(4, '0');
    } else {
      out += ch;
    }
  }
  return out + '"';
}

/** A finite binary64 as Python's `repr` writes it: the shortest digits that round-trip,
 * positional for decimal exponents -4..15, otherwise `d[.ddd]e±XX`. */
export function floatRepr(value: number): string {
  if (!Number.isFinite(value)) {
    throw new CanonicalJsonError(`${value} is not a finite number`);
  }
  if (value === 0) return Object.is(value, -0) ? '-0.0' : '0.0';
  const sign = value < 0 ? '-' : '';
  const [mantissa, exponentText] = Math.abs(value).toExponential().split('e') as [string, string];
  const digits = mantissa.replace('.', '');
  const exponent = Number(exponentText);
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) return `${sign}0.${'0'.repeat(-exponent - 1)}${digits}`;
    const whole = digits.slice(0, exponent + 1).padEnd(exponent + 1, '0');
    const fraction = digits.slice(exponent + 1) || '0';
    return `${sign}${whole}.${fraction}`;
  }
  const body = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
  const magnitude = String(Math.abs(exponent)).padStart(2, '0');
  return `${sign}${body}e${exponent < 0 ? '-' : '+'}${magnitude}`;
}

/**
 * Parses strict JSON text into `JsonValue`s as the protocol reads them: a number token
 * with a fraction or an exponent is a float (`JsonFloat` when its value is an integer),
 * one without is an integer (`bigint` beyond 2^53). Refuses duplicate keys, NaN and
 * anything JSON.parse refuses.
 */
export function parseJson(text: string): JsonValue {
  const tokens = numberTokens(text);
  let index = 0;
  const parsed: unknown = JSON.parse(text, function reviver(this: unknown, _key, raw: unknown) {
    return raw;
  });
  // JSON.parse loses the lexical form of numbers; walk the text's number tokens in
  // document order alongside the parsed value (JSON.parse visits values in that order).
  const rebuild = (value: unknown): JsonValue => {
    if (typeof value === 'number') {
      const token = tokens[index++]!;
      if (/[.eE]/.test(token)) return Number.isInteger(value) ? new JsonFloat(value) : value;
      const big = BigInt(token);
      return big >= BigInt(Number.MIN_SAFE_INTEGER) && big <= BigInt(Number.MAX_SAFE_INTEGER)
        ? Number(big)
        : big;
    }
    if (value === null || typeof value !== 'object') return value as JsonValue;
    if (Array.isArray(value)) return value.map(rebuild);
    const out: { [key: string]: JsonValue } = {};
    for (const [key, item] of Object.entries(value)) out[key] = rebuild(item);
    return out;
  };
  refuseDuplicateKeys(text);
  return rebuild(parsed);
}

function numberTokens(text: string): string[] {
  const found: string[] = [];
  const pattern = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;
  for (const match of text.matchAll(pattern)) {
    if (!match[0].startsWith('"')) found.push(match[0]);
  }
  return found;
}

function refuseDuplicateKeys(text: string): void {
  // A small scanner: objects' keys per nesting level.
  const stack: Array<Set<string> | null> = [];
  const pattern = /"(?:[^"\\]|\\.)*"\s*:?|[{}[\]]/g;
  for (const match of text.matchAll(pattern)) {
    const token = match[0];
    if (token === '{') stack.push(new Set());
    else if (token === '[') stack.push(null);
    else if (token === '}' || token === ']') stack.pop();
    else if (token.endsWith(':')) {
      const keys = stack[stack.length - 1];
      const key = JSON.parse(token.slice(0, -1).trim()) as string;
      if (keys) {
        if (keys.has(key)) throw new CanonicalJsonError(`duplicate key ${JSON.stringify(key)}`);
        keys.add(key);
      }
    }
  }
}
