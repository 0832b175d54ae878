/**
 * The event envelope (docs/wire-protocol.md, "The event envelope"): its fields, the
 * checks the controller makes before it believes one, its content and payload digest,
 * and its Avro and JSON forms. `buildEnvelope` refuses what the controller would refuse
 * at intake, so a tool learns of a bad event at once, not from the dead-letter topic.
 */
import { canonicalJson, isJsonObject, JsonFloat, type JsonValue } from './canonical.js';
import { sha256Hex } from './keys.js';
import { isoformat, parseUtc, type Micros } from './time.js';

export type EffectOutcome = 'applied' | 'not_applied' | 'unknown';

export interface Lineage {
  agent: string;
  task: string;
  initiating_principal: string;
  origin_operation?: string | null;
  parent_operation?: string | null;
  delegated_credentials?: readonly string[];
  /** The agent runtime that ran the call (envelope v6); part of the identity the
   * controller records on the operation and names in its audit records. */
  runtime?: string | null;
}

export interface CheckpointReport {
  checkpoint_id: string;
  saved_at: Micros;
  reference: string;
  validated?: boolean;
  validator?: string | null;
  validated_machine_digest?: string | null;
  validated_policy_digest?: string | null;
  valid_until?: Micros | null;
}

export interface EvidencePayload {
  outcome?: EffectOutcome | null;
  verifier?: string | null;
  reference?: string | null;
  checkpoint?: CheckpointReport | null;
  ancestor_operation?: string | null;
}

export interface HumanDecision {
  approver: string;
  operation_id: string;
  state: string;
  transition: string;
  machine_digest: string;
  expires_at: Micros;
  nonce: string;
  decision: 'approved' | 'rejected';
  signature?: string;
  reviewed_digest?: string;
  for_resume?: boolean;
}

export interface ClassifierOutput {
  identity: string;
  version: string;
  question: string;
  probabilities: Readonly<Record<string, number>>;
  candidate_event?: string | null;
}

/** The tool integration's declaration (CONFORMANCE Level 2). */
export interface DeclaredFacts {
  idempotency_key?: string | null;
  side_effect_possible?: boolean;
  side_effect_confirmed?: boolean;
  compensation_supported?: boolean;
  status_api?: boolean;
  /** `sha256:` and the hex SHA-256 of the canonical JSON of the call's arguments
   * (envelope v6; `argumentsDigest`): tells a duplicate business operation from a
   * conflicting reuse of the idempotency key. */
  arguments_digest?: string | null;
}

export interface Scope {
  capability: string;
  tool?: string | null;
  environment?: string | null;
}

export type Payload = { [key: string]: JsonValue | undefined };

/** Everything a producer says in an event; times are microseconds since the epoch (UTC). */
export interface EnvelopeFields {
  event_type: string;
  event_id: string;
  operation_id: string;
  correlation_id: string;
  machine_name: string;
  machine_version: string;
  event_time: Micros;
  evidence_ref: string;
  producer: string;
  lineage: Lineage;
  evidence?: EvidencePayload | null;
  human_decision?: HumanDecision | null;
  classifier?: ClassifierOutput | null;
  causation?: string | null;
  facts?: DeclaredFacts | null;
  scope?: Scope | null;
  payload?: Payload | null;
}

/** A validated envelope with its content (what is digested) and payload digest. */
export interface Envelope {
  readonly fields: EnvelopeFields;
  readonly content: { [key: string]: JsonValue };
  readonly payloadDigest: string;
}

/** Why an envelope is refused; `code` is the controller's dead-letter reason. */
export class EnvelopeError extends Error {
  override name = 'EnvelopeError';
  constructor(
    readonly code: 'envelope-invalid' | 'envelope-field-invalid' | 'event-time-out-of-range',
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

export const MAX_ID_LENGTH = 256;
export const MAX_REFERENCE_LENGTH = 2048;
export const MAX_PAYLOAD_DEPTH = 32;
/** The payload's canonical JSON, at most (bytes). */
export const MAX_PAYLOAD_BYTES = 64 * 1024;
export const MAX_DELEGATED_CREDENTIALS = 64;
const EVENT_TYPE = /^[A-Z][A-Z0-9_]{0,127}$/u;
const DIGEST = /^sha256:[0-9a-f]{64}$/u;
/** Whitespace as the protocol means it: Python's `str.isspace` set (not JavaScript's
 * `\s`, which adds U+FEFF and lacks U+0085). */
const SPACE = '\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const CONTROL = '\\x00-\\x1f\\x7f';
const TOKEN = new RegExp(`^[^${SPACE}${CONTROL}]+$`, 'u');
const REFERENCE = new RegExp(`^[^${SPACE}${CONTROL}](?:[^${CONTROL}\\u2028\\u2029]*[^${SPACE}${CONTROL}])?$`, 'u');
const TIME_LOW = parseUtc('2000-01-01T00:00:00Z');
const TIME_HIGH = parseUtc('2200-01-01T00:00:00Z');

function codePoints(text: string): number {
  let n = 0;
  for (const _ of text) n++;
  return n;
}

function tokenProblem(name: string, value: string, bound: number, reference: boolean): string | null {
  if (!value) return `${name} is empty`;
  const length = codePoints(value);
  if (length > bound) return `${name} is ${length} characters long; at most ${bound}`;
  if (!(reference ? REFERENCE : TOKEN).test(value)) {
    return `${name} ${JSON.stringify(value.slice(0, MAX_ID_LENGTH))} is blank, padded or holds ${reference ? 'control characters' : 'whitespace or control characters'}`;
  }
  return null;
}

function payloadTooDeep(payload: unknown): boolean {
  const stack: Array<[unknown, number]> = [[payload, 0]];
  while (stack.length > 0) {
    const [node, depth] = stack.pop()!;
    if (depth > MAX_PAYLOAD_DEPTH) return true;
    if (Array.isArray(node)) for (const v of node) stack.push([v, depth + 1]);
    else if (node !== null && typeof node === 'object' && !(node instanceof JsonFloat)) {
      for (const v of Object.values(node)) stack.push([v, depth + 1]);
    }
  }
  return false;
}

/** The identifiers' problems, as the controller words them (empty for a valid envelope). */
export function envelopeProblems(fields: EnvelopeFields): string[] {
  const lineage = fields.lineage;
  const checks: Array<[string, string | null | undefined]> = [
    ['event_id', fields.event_id],
    ['operation_id', fields.operation_id],
    ['correlation_id', fields.correlation_id],
    ['machine_name', fields.machine_name],
    ['machine_version', fields.machine_version],
    ['producer', fields.producer],
    ['lineage.agent', lineage.agent],
    ['lineage.task', lineage.task],
    ['lineage.initiating_principal', lineage.initiating_principal],
  ];
  const optional: Array<[string, string | null | undefined]> = [
    ['causation', fields.causation],
    ['lineage.origin_operation', lineage.origin_operation],
    ['lineage.parent_operation', lineage.parent_operation],
    ['lineage.runtime', lineage.runtime],
  ];
  const problems: string[] = [];
  for (const [name, value] of [...checks, ...optional.filter(([, v]) => v !== null && v !== undefined)]) {
    const problem = tokenProblem(name, value ?? '', MAX_ID_LENGTH, false);
    if (problem) problems.push(problem);
  }
  const credentials = lineage.delegated_credentials ?? [];
  if (credentials.length > MAX_DELEGATED_CREDENTIALS) {
    problems.push(`lineage.delegated_credentials lists ${credentials.length}; at most ${MAX_DELEGATED_CREDENTIALS}`);
  }
  let longest = 0;
  for (const credential of credentials) longest = Math.max(longest, codePoints(credential));
  if (longest > MAX_ID_LENGTH) {
    problems.push(`lineage.delegated_credentials holds one of ${longest} characters; at most ${MAX_ID_LENGTH}`);
  }
  const reference = tokenProblem('evidence_ref', fields.evidence_ref, MAX_REFERENCE_LENGTH, true);
  if (reference) problems.push(reference);
  const digest = fields.facts?.arguments_digest;
  if (digest !== null && digest !== undefined && !DIGEST.test(digest)) {
    problems.push(`facts.arguments_digest ${JSON.stringify(digest.slice(0, 80))} is not sha256:<64 hex digits>`);
  }
  return problems;
}

/** The lineage as an event's content and a call context carry it: `runtime` only when
 * set, so an event without one keeps the digest it had before envelope v6. */
export function lineageContent(lineage: Lineage): { [key: string]: JsonValue } {
  const content: { [key: string]: JsonValue } = {
    agent: lineage.agent,
    task: lineage.task,
    initiating_principal: lineage.initiating_principal,
    origin_operation: lineage.origin_operation ?? null,
    parent_operation: lineage.parent_operation ?? null,
    delegated_credentials: [...(lineage.delegated_credentials ?? [])],
  };
  if (lineage.runtime !== null && lineage.runtime !== undefined) content['runtime'] = lineage.runtime;
  return content;
}

function lineageRecord(lineage: Lineage): Record<string, unknown> {
  return { ...lineageContent(lineage), runtime: lineage.runtime ?? null };
}

function checkpointContent(c: CheckpointReport): { [key: string]: JsonValue } {
  return {
    checkpoint_id: c.checkpoint_id,
    saved_at: isoformat(c.saved_at),
    reference: c.reference,
    validated: c.validated ?? false,
    validator: c.validator ?? null,
    validated_machine_digest: c.validated_machine_digest ?? null,
    validated_policy_digest: c.validated_policy_digest ?? null,
    valid_until: c.valid_until === null || c.valid_until === undefined ? null : isoformat(c.valid_until),
  };
}

function evidenceContent(e: EvidencePayload): { [key: string]: JsonValue } {
  return {
    outcome: e.outcome ?? null,
    verifier: e.verifier ?? null,
    reference: e.reference ?? null,
    checkpoint: e.checkpoint ? checkpointContent(e.checkpoint) : null,
    ancestor_operation: e.ancestor_operation ?? null,
  };
}

/** The fields a human decision's signature covers (domain `agent-recovery/human-decision/v2`). */
export function decisionSignedFields(d: HumanDecision): { [key: string]: JsonValue } {
  return {
    approver: d.approver,
    operation_id: d.operation_id,
    state: d.state,
    transition: d.transition,
    machine_digest: d.machine_digest,
    expires_at: isoformat(d.expires_at),
    nonce: d.nonce,
    decision: d.decision,
    reviewed_digest: d.reviewed_digest ?? '',
    for_resume: d.for_resume ?? false,
  };
}

function decisionContent(d: HumanDecision): { [key: string]: JsonValue } {
  return { ...decisionSignedFields(d), signature: d.signature ?? '' };
}

function classifierContent(c: ClassifierOutput): { [key: string]: JsonValue } {
  const probabilities: { [key: string]: JsonValue } = {};
  for (const [k, v] of Object.entries(c.probabilities)) probabilities[k] = new JsonFloat(v);
  return {
    identity: c.identity,
    version: c.version,
    question: c.question,
    probabilities,
    candidate_event: c.candidate_event ?? null,
  };
}

/** The facts as an event's content carries them: `arguments_digest` only when set. */
function factsContent(f: DeclaredFacts): { [key: string]: JsonValue } {
  const content: { [key: string]: JsonValue } = {
    idempotency_key: f.idempotency_key ?? null,
    side_effect_possible: f.side_effect_possible ?? true,
    side_effect_confirmed: f.side_effect_confirmed ?? false,
    compensation_supported: f.compensation_supported ?? false,
    status_api: f.status_api ?? false,
  };
  if (f.arguments_digest !== null && f.arguments_digest !== undefined) content['arguments_digest'] = f.arguments_digest;
  return content;
}

/** `sha256:` and the hex SHA-256 of the canonical JSON of a call's arguments: the
 * `arguments_digest` a tool declares with its idempotency key. */
export function argumentsDigest(args: JsonValue): string {
  return 'sha256:' + sha256Hex(canonicalJson(args));
}

function scopeContent(s: Scope): { [key: string]: JsonValue } {
  return { capability: s.capability, tool: s.tool ?? null, environment: s.environment ?? null };
}

/** The envelope's content: every field but the digest; `facts`, `scope` and `payload`
 * only when present. Its canonical JSON's SHA-256 is the payload digest. */
export function envelopeContent(f: EnvelopeFields): { [key: string]: JsonValue } {
  const content: { [key: string]: JsonValue } = {
    event_type: f.event_type,
    event_id: f.event_id,
    operation_id: f.operation_id,
    correlation_id: f.correlation_id,
    machine_name: f.machine_name,
    machine_version: f.machine_version,
    event_time: isoformat(f.event_time),
    evidence_ref: f.evidence_ref,
    producer: f.producer,
    lineage: lineageContent(f.lineage),
    evidence: f.evidence ? evidenceContent(f.evidence) : null,
    human_decision: f.human_decision ? decisionContent(f.human_decision) : null,
    classifier: f.classifier ? classifierContent(f.classifier) : null,
    causation: f.causation ?? null,
  };
  if (f.facts) content['facts'] = factsContent(f.facts);
  if (f.scope) content['scope'] = scopeContent(f.scope);
  if (f.payload) content['payload'] = f.payload as JsonValue;
  return content;
}

/** Validates `fields` as the controller's intake does and computes the digest. */
export function buildEnvelope(fields: EnvelopeFields): Envelope {
  const payload = fields.payload;
  if (payload !== null && payload !== undefined) {
    if (payloadTooDeep(payload)) {
      throw new EnvelopeError('envelope-field-invalid', `event ${fields.event_id}: payload is nested deeper than ${MAX_PAYLOAD_DEPTH} levels`);
    }
    if (!isJsonObject(payload)) {
      throw new EnvelopeError('envelope-invalid', `event ${fields.event_id}: payload must be a JSON object`);
    }
    const size = canonicalJson(payload as JsonValue).length;
    if (size > MAX_PAYLOAD_BYTES) {
      throw new EnvelopeError('envelope-field-invalid', `event ${fields.event_id}: payload is ${size} bytes of canonical JSON; at most ${MAX_PAYLOAD_BYTES}`);
    }
  }
  if (!EVENT_TYPE.test(fields.event_type)) {
    throw new EnvelopeError('envelope-invalid', `event ${fields.event_id}: event type ${JSON.stringify(fields.event_type)} must be an uppercase id (A-Z, 0-9, _; at most 128 characters)`);
  }
  const problems = envelopeProblems(fields);
  if (problems.length > 0) {
    throw new EnvelopeError('envelope-field-invalid', `event ${fields.event_id}: ${problems.join('; ')}`);
  }
  if (!(fields.event_time >= TIME_LOW && fields.event_time < TIME_HIGH)) {
    throw new EnvelopeError('event-time-out-of-range', `event ${fields.event_id}: event_time ${isoformat(fields.event_time)} is outside 2000-01-01 .. 2200-01-01`);
  }
  const content = envelopeContent(fields);
  return { fields, content, payloadDigest: 'sha256:' + sha256Hex(canonicalJson(content)) };
}

/** The envelope's JSON form (`application/json`): its content plus `payload_digest`. */
export function envelopeJson(envelope: Envelope): { [key: string]: JsonValue } {
  return { ...envelope.content, payload_digest: envelope.payloadDigest };
}

function checkpointRecord(c: CheckpointReport): Record<string, unknown> {
  return {
    checkpoint_id: c.checkpoint_id,
    saved_at: c.saved_at,
    reference: c.reference,
    validated: c.validated ?? false,
    validator: c.validator ?? null,
    validated_machine_digest: c.validated_machine_digest ?? null,
    validated_policy_digest: c.validated_policy_digest ?? null,
    valid_until: c.valid_until ?? null,
  };
}

/** The envelope as a record of the current `recovery.EventEnvelope` Avro schema. */
export function envelopeRecord(envelope: Envelope): Record<string, unknown> {
  const f = envelope.fields;
  const e = f.evidence;
  const d = f.human_decision;
  const c = f.classifier;
  return {
    event_type: f.event_type,
    event_id: f.event_id,
    operation_id: f.operation_id,
    correlation_id: f.correlation_id,
    machine_name: f.machine_name,
    machine_version: f.machine_version,
    event_time: f.event_time,
    evidence_ref: f.evidence_ref,
    producer: f.producer,
    lineage: lineageRecord(f.lineage),
    evidence: e
      ? {
          outcome: e.outcome ?? null,
          verifier: e.verifier ?? null,
          reference: e.reference ?? null,
          checkpoint: e.checkpoint ? checkpointRecord(e.checkpoint) : null,
          ancestor_operation: e.ancestor_operation ?? null,
        }
      : null,
    human_decision: d
      ? {
          approver: d.approver,
          operation_id: d.operation_id,
          state: d.state,
          transition: d.transition,
          machine_digest: d.machine_digest,
          expires_at: d.expires_at,
          nonce: d.nonce,
          decision: d.decision,
          signature: d.signature ?? '',
          reviewed_digest: d.reviewed_digest ?? '',
          for_resume: d.for_resume ?? false,
        }
      : null,
    classifier: c
      ? {
          identity: c.identity,
          version: c.version,
          question: c.question,
          probabilities: { ...c.probabilities },
          candidate_event: c.candidate_event ?? null,
        }
      : null,
    causation: f.causation ?? null,
    payload_digest: envelope.payloadDigest,
    facts: f.facts ? { ...factsContent(f.facts), arguments_digest: f.facts.arguments_digest ?? null } : null,
    scope: f.scope ? scopeContent(f.scope) : null,
    payload: f.payload ? canonicalJson(f.payload as JsonValue).toString('utf8') : null,
  };
}

/** Envelope fields from the JSON form (as `envelopeJson` writes it; times as text). */
export function fieldsFromJson(json: { [key: string]: JsonValue | undefined }): EnvelopeFields {
  const text = (v: JsonValue | undefined): string | null => (typeof v === 'string' ? v : null);
  const obj = (v: JsonValue | undefined): { [key: string]: JsonValue | undefined } | null => (isJsonObject(v) ? v : null);
  const num = (v: JsonValue | undefined): number => (v instanceof JsonFloat ? v.value : Number(v));
  const lineage = obj(json['lineage'])!;
  const evidence = obj(json['evidence']);
  const checkpoint = evidence ? obj(evidence['checkpoint']) : null;
  const decision = obj(json['human_decision']);
  const classifier = obj(json['classifier']);
  const facts = obj(json['facts']);
  const scope = obj(json['scope']);
  const payload = obj(json['payload']);
  const fields: EnvelopeFields = {
    event_type: text(json['event_type'])!,
    event_id: text(json['event_id'])!,
    operation_id: text(json['operation_id'])!,
    correlation_id: text(json['correlation_id'])!,
    machine_name: text(json['machine_name'])!,
    machine_version: text(json['machine_version'])!,
    event_time: parseUtc(text(json['event_time'])!),
    evidence_ref: text(json['evidence_ref'])!,
    producer: text(json['producer'])!,
    lineage: {
      agent: text(lineage['agent'])!,
      task: text(lineage['task'])!,
      initiating_principal: text(lineage['initiating_principal'])!,
      origin_operation: text(lineage['origin_operation']),
      parent_operation: text(lineage['parent_operation']),
      delegated_credentials: ((lineage['delegated_credentials'] as string[] | undefined) ?? []).slice(),
      runtime: text(lineage['runtime']),
    },
    causation: text(json['causation']),
  };
  if (evidence) {
    fields.evidence = {
      outcome: text(evidence['outcome']) as EffectOutcome | null,
      verifier: text(evidence['verifier']),
      reference: text(evidence['reference']),
      ancestor_operation: text(evidence['ancestor_operation']),
      checkpoint: checkpoint
        ? {
            checkpoint_id: text(checkpoint['checkpoint_id'])!,
            saved_at: parseUtc(text(checkpoint['saved_at'])!),
            reference: text(checkpoint['reference'])!,
            validated: checkpoint['validated'] === true,
            validator: text(checkpoint['validator']),
            validated_machine_digest: text(checkpoint['validated_machine_digest']),
            validated_policy_digest: text(checkpoint['validated_policy_digest']),
            valid_until: text(checkpoint['valid_until']) === null ? null : parseUtc(text(checkpoint['valid_until'])!),
          }
        : null,
    };
  }
  if (decision) {
    fields.human_decision = {
      approver: text(decision['approver'])!,
      operation_id: text(decision['operation_id'])!,
      state: text(decision['state'])!,
      transition: text(decision['transition'])!,
      machine_digest: text(decision['machine_digest'])!,
      expires_at: parseUtc(text(decision['expires_at'])!),
      nonce: text(decision['nonce'])!,
      decision: text(decision['decision']) as 'approved' | 'rejected',
      signature: text(decision['signature']) ?? '',
      reviewed_digest: text(decision['reviewed_digest']) ?? '',
      for_resume: decision['for_resume'] === true,
    };
  }
  if (classifier) {
    const probabilities: Record<string, number> = {};
    for (const [k, v] of Object.entries(obj(classifier['probabilities']) ?? {})) probabilities[k] = num(v);
    fields.classifier = {
      identity: text(classifier['identity'])!,
      version: text(classifier['version'])!,
      question: text(classifier['question'])!,
      probabilities,
      candidate_event: text(classifier['candidate_event']),
    };
  }
  if (facts) {
    fields.facts = {
      idempotency_key: text(facts['idempotency_key']),
      side_effect_possible: facts['side_effect_possible'] !== false,
      side_effect_confirmed: facts['side_effect_confirmed'] === true,
      compensation_supported: facts['compensation_supported'] === true,
      status_api: facts['status_api'] === true,
      arguments_digest: text(facts['arguments_digest']),
    };
  }
  if (scope) {
    fields.scope = { capability: text(scope['capability'])!, tool: text(scope['tool']), environment: text(scope['environment']) };
  }
  if (payload) fields.payload = payload;
  return fields;
}
