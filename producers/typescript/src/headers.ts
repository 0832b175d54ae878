/** Kafka header names, header values as the protocol reads them, and record ids. */
import { createHash } from 'node:crypto';

export const CONTENT_TYPE = 'content-type';
export const HEADER_SCHEMA = 'recovery-schema';
export const HEADER_RECORD_ID = 'recovery-record-id';
export const HEADER_COMMAND_ID = 'recovery-command-id';
export const HEADER_PRODUCER = 'recovery-producer';
export const HEADER_KEY_ID = 'recovery-key-id';
export const HEADER_SIGNATURE = 'recovery-signature';
export const CONTENT_TYPE_AVRO = 'application/vnd.apache.avro.single-object';
export const CONTENT_TYPE_JSON = 'application/json';

/** A Kafka header as the protocol sees it: a name and raw bytes (or null). */
export type Header = readonly [name: string, value: Buffer | null];

const utf8 = new TextDecoder('utf-8', { fatal: true });

/**
 * The value of header `name`: of the headers with that name and a non-null value, the
 * last one, decoded as UTF-8; null when there is none or the last is not UTF-8. An empty
 * value is the empty string.
 */
export function headerValue(headers: readonly Header[], name: string): string | null {
  let found: string | null = null;
  for (const [key, value] of headers) {
    if (key !== name || value === null) continue;
    try {
      found = utf8.decode(value);
    } catch {
      found = null;
    }
  }
  return found;
}

/** `<kind>:` and the first 32 hex digits of SHA-256 over kind and parts joined by NUL. */
export function recordId(kind: string, ...parts: string[]): string {
  const digest = createHash('sha256').update([kind, ...parts].join('\u0000'), 'utf8').digest('hex');
  return `${kind}:${digest.slice(0, 32)}`;
}
