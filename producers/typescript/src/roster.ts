/**
 * The producer roster (docs/wire-protocol.md, "Roster and verification"): producers,
 * their Ed25519 keys with validity windows and revocation, and role grants. `authenticate`
 * proves a record's signature or refuses it with the first check that fails, in the
 * protocol's order.
 */
import { readFileSync } from 'node:fs';
import type { KeyObject } from 'node:crypto';
import { isNode, LineCounter, parseDocument } from 'yaml';
import { isJsonObject } from './canonical.js';
import { decodeBase64, ed25519Verify, keyId, publicKeyFromRaw } from './keys.js';
import { HEADER_KEY_ID, HEADER_PRODUCER, HEADER_SIGNATURE, headerValue, type Header } from './headers.js';
import { recordSigningMessage, unsignedHeaders } from './signing.js';
import { parseInstant, parseUtc, type Micros } from './time.js';

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

export class RosterError extends Error {
  override name = 'RosterError';
}

export const ROLES: readonly Role[] = ['tool', 'verifier', 'worker', 'validator', 'orchestrator', 'classifier', 'approver', 'controller'];
const PRODUCER_ID = /^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,199}$/;
const SCOPE_LISTS = ['capabilities', 'tools', 'environments', 'agents'] as const;

/** Where in a roster document a value is (`producers[1].keys[0].public_key`), and the
 * line of a YAML file it is on, when known. */
type Where = (path: ReadonlyArray<string | number>) => string;

function dotted(path: ReadonlyArray<string | number>): string {
  return path.map((p, i) => (typeof p === 'number' ? `[${p}]` : i === 0 ? p : `.${p}`)).join('') || 'the document';
}

/** Checks a roster document's shape as the controller's roster model does (every key
 * known, ids, keys, times, roles, lists) and builds the producers; throws `RosterError`
 * naming each problem and where it is. */
function parseProducers(raw: unknown, where: Where): ProducerEntry[] {
  const problems: string[] = [];
  const fail = (path: ReadonlyArray<string | number>, what: string): void => void problems.push(`${where(path)}: ${what}`);
  const unknownKeys = (v: Record<string, unknown>, allowed: readonly string[], path: Array<string | number>): void => {
    for (const key of Object.keys(v)) if (!allowed.includes(key)) fail([...path, key], `unknown key (allowed: ${allowed.join(', ')})`);
  };
  if (!Array.isArray(raw)) {
    fail(['producers'], 'must be a list of producers');
    throw new RosterError(problems.join('; '));
  }
  const entries: ProducerEntry[] = [];
  raw.forEach((producer: unknown, i) => {
    const at: Array<string | number> = ['producers', i];
    if (!isJsonObject(producer)) return fail(at, 'must be a mapping with id, keys and grants');
    unknownKeys(producer, ['id', 'keys', 'grants'], at);
    const id = producer['id'];
    if (typeof id !== 'string' || !PRODUCER_ID.test(id)) fail([...at, 'id'], `must match ${PRODUCER_ID.source}`);
    const keys: ProducerKey[] = [];
    const rawKeys = producer['keys'];
    if (!Array.isArray(rawKeys) || rawKeys.length === 0) fail([...at, 'keys'], 'must list at least one key');
    else {
      rawKeys.forEach((key: unknown, k) => {
        const kat = [...at, 'keys', k];
        if (!isJsonObject(key)) return fail(kat, 'must be a mapping with public_key');
        unknownKeys(key, ['public_key', 'not_before', 'not_after', 'revoked'], kat);
        const text = key['public_key'];
        const bytes = typeof text === 'string' ? decodeBase64(text) : null;
        if (bytes === null || bytes.length !== 32) return fail([...kat, 'public_key'], 'must be the base64 of a raw 32-byte Ed25519 public key');
        const times: Array<Micros | null> = (['not_before', 'not_after'] as const).map((name) => {
          const value = key[name];
          if (value === undefined || value === null) return null;
          const at = typeof value === 'string' ? parseInstant(value) : null;
          if (at === null) fail([...kat, name], 'must be an RFC 3339 time with its offset (use Z for UTC)');
          return at;
        });
        const revoked = key['revoked'] ?? false;
        if (typeof revoked !== 'boolean') fail([...kat, 'revoked'], 'must be true or false');
        const publicKey = publicKeyFromRaw(bytes);
        keys.push({ keyId: keyId(publicKey), publicKey, notBefore: times[0] ?? null, notAfter: times[1] ?? null, revoked: revoked === true });
      });
    }
    const grants: Grant[] = [];
    const rawGrants = producer['grants'] ?? [];
    if (!Array.isArray(rawGrants)) fail([...at, 'grants'], 'must be a list');
    else {
      rawGrants.forEach((grant: unknown, g) => {
        const gat = [...at, 'grants', g];
        if (!isJsonObject(grant)) return fail(gat, 'must be a mapping with a role');
        unknownKeys(grant, ['role', ...SCOPE_LISTS], gat);
        const role = grant['role'];
        if (!ROLES.includes(role as Role)) return fail([...gat, 'role'], `must be one of ${ROLES.join(', ')}`);
        const lists = SCOPE_LISTS.map((name) => {
          const list = grant[name] ?? [];
          if (!Array.isArray(list) || !list.every((item) => typeof item === 'string')) {
            fail([...gat, name], 'must be a list of strings');
            return [];
          }
          return list as string[];
        });
        grants.push({ role: role as Role, capabilities: lists[0]!, tools: lists[1]!, environments: lists[2]!, agents: lists[3]! });
      });
    }
    if (typeof id === 'string') entries.push({ id, keys, grants });
  });
  const ids = entries.map((e) => e.id);
  const twice = [...new Set(ids.filter((id, i) => ids.indexOf(id) !== i))];
  if (twice.length > 0) fail(['producers'], `producer ids listed twice: ${twice.join(', ')}`);
  if (problems.length > 0) throw new RosterError(problems.join('; '));
  return entries;
}

/** The producers of a roster document: `{"producers": [...]}` alone, or a policy (a
 * document with an `id`), whose `producers` the roster is; the policy's other keys are
 * the controller's and are not read here. */
function producersOf(document: unknown, where: Where): ProducerEntry[] {
  if (document === null || typeof document !== 'object' || Array.isArray(document)) {
    throw new RosterError(`${where([])}: a roster is a mapping with a producers list (or a policy with one)`);
  }
  const fields = document as Record<string, unknown>;
  if (!('id' in fields)) {
    const extra = Object.keys(fields).filter((k) => k !== 'producers');
    if (extra.length > 0) {
      throw new RosterError(`${where([extra[0]!])}: unknown key (a roster holds only producers; a policy has an id)`);
    }
  }
  return parseProducers(fields['producers'] ?? [], where);
}

export class Roster {
  private readonly byId: Map<string, ProducerEntry>;

  constructor(readonly producers: readonly ProducerEntry[]) {
    this.byId = new Map(producers.map((p) => [p.id, p]));
    if (this.byId.size !== producers.length) throw new RosterError('a producer id is listed twice');
  }

  /** A roster from a parsed document: `{"producers": [...]}` (a roster file's form) or a
   * policy holding `producers`. Throws `RosterError` naming every problem. */
  static fromDocument(document: unknown, source = 'roster'): Roster {
    return new Roster(producersOf(document, (path) => `${source}: ${dotted(path)}`));
  }

  /**
   * The roster in `path` (`RECOVERY_ROSTER_FILE`): JSON when the name ends in `.json`,
   * else YAML; a roster file (`producers:` only, as `ops/dev up` writes
   * `.stack/keys/roster.json`) or a policy file (`ops/policy.production.yaml`), whose
   * `producers` it takes, as the Python `machines.load_roster` reads them. Throws
   * `RosterError` naming the file and, in YAML, the line of each problem.
   */
  static load(path: string): Roster {
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (error) {
      throw new RosterError(`roster ${path} cannot be read (${(error as Error).message})`);
    }
    if (path.endsWith('.json')) {
      let document: unknown;
      try {
        document = JSON.parse(text);
      } catch (error) {
        throw new RosterError(`roster ${path}: not JSON: ${(error as Error).message}`);
      }
      return new Roster(producersOf(document, (p) => `roster ${path}: ${dotted(p)}`));
    }
    const lines = new LineCounter();
    const parsed = parseDocument(text, { lineCounter: lines, uniqueKeys: true, prettyErrors: false });
    const problem = parsed.errors[0];
    if (problem !== undefined) {
      throw new RosterError(`roster ${path} line ${lines.linePos(problem.pos[0]).line}: ${problem.message.split('\n')[0]}`);
    }
    const where: Where = (p) => {
      let node: unknown = null;
      for (let n = p.length; n >= 0 && !isNode(node); n--) node = parsed.getIn(p.slice(0, n), true);
      const range = isNode(node) ? node.range : undefined;
      const line = range ? ` line ${lines.linePos(range[0]).line}` : '';
      return `roster ${path}${line}: ${dotted(p)}`;
    };
    return new Roster(producersOf(parsed.toJS({ maxAliasCount: 100 }), where));
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
