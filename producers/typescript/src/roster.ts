/**
 * The producer roster (docs/wire-protocol.md, "Roster and verification"): producers,
 * their Ed25519 keys with validity windows and revocation, and role grants. `authenticate`
 * proves a record's signature or refuses it with the first check that fails, in the
 * protocol's order.
 */
import { readFileSync } from 'node:fs';
import type { KeyObject } from 'node:crypto';
import { decodeBase64, ed25519Verify, keyId, publicKeyFromRaw } from './keys.js';
import { HEADER_KEY_ID, HEADER_PRODUCER, HEADER_SIGNATURE, headerValue, type Header } from './headers.js';
import { recordSigningMessage, unsignedHeaders } from './signing.js';
import { parseUtc, type Micros } from './time.js';

export type Role = 'tool' | 'verifier' | 'worker' | 'validator' | 'orchestrator' | 'classifier' | 'approver' | 'controller';

export type AuthRefusal =
  | 'signature-missing'
  | 'signature-malformed'
  | 'producer-unknown'
  | 'key-unknown'
  | 'key-revoked'
  | 'key-not-yet-valid'
  | 'key-expired'
  | 'signature-invalid'
  | 'role-not-permitted'
  | 'identity-mismatch';

export class AuthenticationError extends Error {
  override name = 'AuthenticationError';
  constructor(
    readonly code: AuthRefusal,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

export interface ProducerKey {
  readonly keyId: string;
  readonly publicKey: KeyObject;
  readonly notBefore: Micros | null;
  readonly notAfter: Micros | null;
  readonly revoked: boolean;
}

export interface Grant {
  readonly role: Role;
  readonly capabilities: readonly string[];
  readonly tools: readonly string[];
  readonly environments: readonly string[];
  readonly agents: readonly string[];
}

export interface ProducerEntry {
  readonly id: string;
  readonly keys: readonly ProducerKey[];
  readonly grants: readonly Grant[];
}

interface RawKey {
  public_key: string;
  not_before?: string | null;
  not_after?: string | null;
  revoked?: boolean;
}

interface RawGrant {
  role: Role;
  capabilities?: string[];
  tools?: string[];
  environments?: string[];
  agents?: string[];
}

interface RawProducer {
  id: string;
  keys: RawKey[];
  grants?: RawGrant[];
}

export class RosterError extends Error {
  override name = 'RosterError';
}

function validity(text: string | null | undefined): Micros | null {
  if (text === null || text === undefined) return null;
  return Math.floor(Date.parse(text)) * 1000;
}

export class Roster {
  private readonly byId: Map<string, ProducerEntry>;

  constructor(readonly producers: readonly ProducerEntry[]) {
    this.byId = new Map(producers.map((p) => [p.id, p]));
    if (this.byId.size !== producers.length) throw new RosterError('a producer id is listed twice');
  }

  /** A roster from its JSON document (`{"producers": [...]}`, the roster file's form). */
  static fromDocument(document: unknown): Roster {
    const raw = (document as { producers?: RawProducer[] }).producers;
    if (!Array.isArray(raw)) throw new RosterError('a roster is an object with a "producers" list');
    return new Roster(
      raw.map((p) => ({
        id: p.id,
        keys: p.keys.map((k) => {
          const bytes = decodeBase64(k.public_key);
          if (bytes === null) throw new RosterError(`producer ${p.id}: public key is not base64`);
          const publicKey = publicKeyFromRaw(bytes);
          return {
            keyId: keyId(publicKey),
            publicKey,
            notBefore: validity(k.not_before),
            notAfter: validity(k.not_after),
            revoked: k.revoked ?? false,
          };
        }),
        grants: (p.grants ?? []).map((g) => ({
          role: g.role,
          capabilities: g.capabilities ?? [],
          tools: g.tools ?? [],
          environments: g.environments ?? [],
          agents: g.agents ?? [],
        })),
      })),
    );
  }

  /** The roster in a JSON file (`RECOVERY_ROSTER_FILE`). */
  static load(path: string): Roster {
    return Roster.fromDocument(JSON.parse(readFileSync(path, 'utf8')));
  }

  producer(id: string): ProducerEntry | undefined {
    return this.byId.get(id);
  }

  /**
   * The producer whose key `keyIdText` signed `message` with base64 `signature`, valid at
   * `at`; throws `AuthenticationError` naming the first check that fails.
   */
  authenticate(
    producerId: string | null,
    keyIdText: string | null,
    message: Buffer,
    signature: string | null,
    at: Micros,
  ): ProducerEntry {
    if (!producerId || !keyIdText || !signature) {
      throw new AuthenticationError('signature-missing', 'the record carries no producer, key id or signature');
    }
    const entry = this.byId.get(producerId);
    if (entry === undefined) throw new AuthenticationError('producer-unknown', `producer ${producerId} is not in the roster`);
    const key = entry.keys.find((k) => k.keyId === keyIdText);
    if (key === undefined) throw new AuthenticationError('key-unknown', `producer ${producerId} has no key ${keyIdText}`);
    if (key.revoked) throw new AuthenticationError('key-revoked', `key ${keyIdText} of ${producerId} is revoked`);
    if (key.notBefore !== null && at < key.notBefore) {
      throw new AuthenticationError('key-not-yet-valid', `key ${keyIdText} of ${producerId} is not valid yet`);
    }
    if (key.notAfter !== null && at >= key.notAfter) {
      throw new AuthenticationError('key-expired', `key ${keyIdText} of ${producerId} has expired`);
    }
    const raw = decodeBase64(signature);
    if (raw === null) throw new AuthenticationError('signature-malformed', `signature of ${producerId} is not base64`);
    if (!ed25519Verify(key.publicKey, raw, message)) {
      throw new AuthenticationError('signature-invalid', `signature by key ${keyIdText} of ${producerId} does not verify`);
    }
    return entry;
  }
}

export function holdsRole(entry: ProducerEntry, role: Role): boolean {
  return entry.grants.some((g) => g.role === role);
}

/** The roster entry of the producer that signed this record, or `AuthenticationError`. */
export function verifyRecord(
  roster: Roster,
  topic: string,
  key: Buffer | null,
  value: Buffer | null,
  headers: readonly Header[],
  at: Micros,
): ProducerEntry {
  const producer = headerValue(headers, HEADER_PRODUCER);
  const keyName = headerValue(headers, HEADER_KEY_ID);
  const signature = headerValue(headers, HEADER_SIGNATURE);
  const message =
    producer && keyName
      ? recordSigningMessage(topic, key, value, unsignedHeaders(headers), producer, keyName)
      : Buffer.alloc(0);
  return roster.authenticate(producer, keyName, message, signature, at);
}

export { parseUtc };
