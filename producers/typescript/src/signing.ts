/**
 * Record signatures (docs/wire-protocol.md, "Record signatures"): the producer signs,
 * with Ed25519, the canonical JSON of the topic, the key, the SHA-256 of the value, the
 * headers a consumer acts on, its id and its key id, under the domain
 * `agent-recovery/record/v1`; the id, key id and signature travel as headers.
 */
import type { KeyObject } from 'node:crypto';
import { canonicalJson } from './canonical.js';
import {
  CONTENT_TYPE,
  HEADER_COMMAND_ID,
  HEADER_KEY_ID,
  HEADER_PRODUCER,
  HEADER_RECORD_ID,
  HEADER_SCHEMA,
  HEADER_SIGNATURE,
  headerValue,
  type Header,
} from './headers.js';
import { ed25519Sign, keyId, sha256Hex } from './keys.js';

export const RECORD_SIGNATURE_DOMAIN = 'agent-recovery/record/v1';
export const SIGNED_HEADERS = [CONTENT_TYPE, HEADER_SCHEMA, HEADER_RECORD_ID, HEADER_COMMAND_ID] as const;
const SIGNATURE_HEADERS = new Set([HEADER_PRODUCER, HEADER_KEY_ID, HEADER_SIGNATURE]);

/** The exact bytes a producer signs for one record. */
export function recordSigningMessage(
  topic: string,
  key: Buffer | null,
  value: Buffer | null,
  headers: readonly Header[],
  producer: string,
  keyIdText: string,
): Buffer {
  const signed: Record<string, string | null> = {};
  for (const name of SIGNED_HEADERS) signed[name] = headerValue(headers, name);
  return canonicalJson({
    domain: RECORD_SIGNATURE_DOMAIN,
    topic,
    key: key === null ? null : key.toString('base64'),
    value_sha256: value === null ? null : sha256Hex(value),
    headers: signed,
    producer,
    key_id: keyIdText,
  });
}

/** The headers other than the three signature headers. */
export function unsignedHeaders(headers: readonly Header[]): Header[] {
  return headers.filter(([name]) => !SIGNATURE_HEADERS.has(name));
}

/** A producer's identity and private key: signs the records it publishes. */
export class RecordSigner {
  readonly keyId: string;

  constructor(
    readonly producer: string,
    private readonly privateKey: KeyObject,
  ) {
    this.keyId = keyId(privateKey);
  }

  /** `headers` without earlier signature headers, plus this producer's three. */
  sign(topic: string, key: Buffer | null, value: Buffer | null, headers: readonly Header[]): Header[] {
    const kept = unsignedHeaders(headers);
    const message = recordSigningMessage(topic, key, value, kept, this.producer, this.keyId);
    const signature = ed25519Sign(this.privateKey, message).toString('base64');
    return [
      ...kept,
      [HEADER_PRODUCER, Buffer.from(this.producer, 'utf8')],
      [HEADER_KEY_ID, Buffer.from(this.keyId, 'utf8')],
      [HEADER_SIGNATURE, Buffer.from(signature, 'utf8')],
    ];
  }
}
