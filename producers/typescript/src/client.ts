/**
 * The client library a TypeScript tool, worker or approver uses to publish recovery
 * events: the same guarantees as the Python `producers.RecoveryClient`
 * (docs/tool-integration-typescript.md). `EventPublisher` owns one idempotent producer
 * (`enable.idempotence`, `acks=all`, which callers cannot weaken) and signs every record;
 * `publish` resolves once the broker has acknowledged the record (publish and confirm),
 * and `flush` waits for everything still in flight. `RecoveryClient` builds envelopes
 * that pass the controller's intake checks, with the signer's id as their producer.
 */
import { createHash, randomBytes, type KeyObject } from 'node:crypto';
import kafkaPackage from '@confluentinc/kafka-javascript';
import { defaultCatalog, EVENT_ENVELOPE, type SchemaCatalog } from './avro.js';
import { callContextClaims, HEADER_CALL_CONTEXT, MAX_CALL_CONTEXT_BYTES } from './callcontext.js';
import { canonicalJson, type JsonValue } from './canonical.js';
import type { CapabilityCommand } from './command.js';
import {
  buildEnvelope,
  decisionSignedFields,
  envelopeJson,
  envelopeRecord,
  type ClassifierOutput,
  type DeclaredFacts,
  type Envelope,
  type EnvelopeFields,
  type EvidencePayload,
  type HumanDecision,
  type Lineage,
  type Payload,
  type Scope,
} from './envelope.js';
import { CONTENT_TYPE, CONTENT_TYPE_AVRO, CONTENT_TYPE_JSON, HEADER_RECORD_ID, HEADER_SCHEMA, recordId, type Header } from './headers.js';
import { validateEventJson } from './jsonschema.js';
import { ed25519Sign } from './keys.js';
import { kafkaSettings, type KafkaSettings } from './kafka.js';
import type { RecordSigner } from './signing.js';
import { isoformat, nowMicros, type Micros } from './time.js';

const { Kafka } = kafkaPackage.KafkaJS;
type Producer = ReturnType<InstanceType<typeof Kafka>['producer']>;

export const HUMAN_DECISION_DOMAIN = 'agent-recovery/human-decision/v2';

/** Result events by command kind: [on success, on failure]. Verification is special. */
export const RESULT_EVENTS: Readonly<Record<string, readonly [string, string]>> = {
  retry: ['RETRY_SUCCEEDED', 'RETRY_FAILED'],
  compensate: ['COMPENSATION_SUCCEEDED', 'COMPENSATION_FAILED'],
  stop: ['CONTAINMENT_SUCCEEDED', 'CONTAINMENT_FAILED'],
  // A containment is complete when all of its actions are (SPEC §7.3): the revocation
  // and the isolation report their own results, each naming its command.
  revoke: ['CONTAINMENT_SUCCEEDED', 'CONTAINMENT_FAILED'],
  isolate: ['CONTAINMENT_SUCCEEDED', 'CONTAINMENT_FAILED'],
};

/** A record on `recovery.events` is at most this many bytes (key, value and headers):
 * the controller's default `max_record_bytes`; a larger one is refused before it is sent. */
export const MAX_EVENT_RECORD_BYTES = 256 * 1024;

/** The broker did not acknowledge a record in time, or refused it. */
export class DeliveryFailed extends Error {
  override name = 'DeliveryFailed';
}

/** A record refused before it is sent: the controller would only dead-letter it. */
export class RecordRefused extends Error {
  override name = 'RecordRefused';
}

// Settings that make publishing safe to retry; applied after the caller's, so never
// weakened. `consistent_random` is librdkafka's default partitioner, the one every
// component of the system uses (CRC-32 of the key): the KafkaJS-style API would
// otherwise default to murmur2 and put an operation's events on another partition than
// the controller's and the Python clients' (docs/wire-protocol.md, "Topics and keys").
const SAFE: KafkaSettings = { 'enable.idempotence': true, acks: -1, partitioner: 'consistent_random' };
// A record is sent at once: a 5 ms linger held every failure report that long before it
// left the tool (the Python client's default too; docs/PERFORMANCE.md).
const DEFAULTS: KafkaSettings = { 'linger.ms': 0, 'delivery.timeout.ms': 30000, log_level: 4 };

export interface PublisherOptions {
  /** Bootstrap servers; else `RECOVERY_KAFKA_BOOTSTRAP`. */
  bootstrap?: string;
  /** Topic names; else `RECOVERY_TOPIC_EVENTS` or `recovery.events`. */
  eventsTopic?: string;
  /** Send `application/json` instead of Avro single objects. */
  useJson?: boolean;
  /** Extra librdkafka producer settings (idempotence, acks and partitioner stay). */
  producerConfig?: KafkaSettings;
  catalog?: SchemaCatalog;
  /** Larger records are refused before they are sent (default `MAX_EVENT_RECORD_BYTES`,
   * the controller's default; a deployment that raised its limit raises this too). */
  maxRecordBytes?: number;
}

/** One idempotent, signing producer; call `close` when done. */
export class EventPublisher {
  readonly eventsTopic: string;
  private readonly producer: Producer;
  private readonly catalog: SchemaCatalog;
  private readonly useJson: boolean;
  private readonly maxRecordBytes: number;
  private connected: Promise<void> | undefined;
  private readonly inFlight = new Set<Promise<unknown>>();

  constructor(
    readonly signer: RecordSigner,
    options: PublisherOptions = {},
  ) {
    this.eventsTopic = options.eventsTopic ?? process.env['RECOVERY_TOPIC_EVENTS'] ?? 'recovery.events';
    this.catalog = options.catalog ?? defaultCatalog();
    this.useJson = options.useJson ?? false;
    this.maxRecordBytes = options.maxRecordBytes ?? MAX_EVENT_RECORD_BYTES;
    const config = { ...kafkaSettings(options.bootstrap), ...DEFAULTS, ...(options.producerConfig ?? {}), ...SAFE };
    this.producer = new Kafka({}).producer(config as never);
  }

  /** The record of `envelope` as it goes on the wire: key, value and signed headers (the
   * call context, when one is forwarded, after the standard ones and unsigned: it carries
   * its runtime's signature). Throws `RecordRefused` for a record over the size bound. */
  encode(
    envelope: Envelope,
    topic: string = this.eventsTopic,
    callContext: string | null = null,
  ): { key: Buffer; value: Buffer; headers: Header[] } {
    const fields = envelope.fields;
    if (fields.producer !== this.signer.producer) {
      throw new Error(`event ${fields.event_id} names producer ${fields.producer}, but this publisher signs as ${this.signer.producer}`);
    }
    const key = Buffer.from(fields.operation_id, 'utf8');
    const rid = recordId('event', fields.operation_id, fields.event_id);
    let value: Buffer;
    let headers: Header[];
    if (this.useJson) {
      value = canonicalJson(envelopeJson(envelope));
      validateEventJson(JSON.parse(value.toString('utf8'))); // as the controller will
      headers = [
        [CONTENT_TYPE, Buffer.from(CONTENT_TYPE_JSON)],
        [HEADER_RECORD_ID, Buffer.from(rid)],
      ];
    } else {
      value = this.catalog.encode(envelopeRecord(envelope), EVENT_ENVELOPE);
      headers = [
        [CONTENT_TYPE, Buffer.from(CONTENT_TYPE_AVRO)],
        [HEADER_RECORD_ID, Buffer.from(rid)],
        [HEADER_SCHEMA, Buffer.from(this.catalog.current(EVENT_ENVELOPE).fingerprint.toString('hex'))],
      ];
    }
    if (callContext !== null) {
      if (Buffer.byteLength(callContext, 'utf8') > MAX_CALL_CONTEXT_BYTES) {
        throw new RecordRefused(`event ${fields.event_id}: the call context is larger than ${MAX_CALL_CONTEXT_BYTES} bytes`);
      }
      headers.push([HEADER_CALL_CONTEXT, Buffer.from(callContext, 'utf8')]);
    }
    const signed = this.signer.sign(topic, key, value, headers);
    const size = key.length + value.length + signed.reduce((n, [name, v]) => n + Buffer.byteLength(name) + (v?.length ?? 0), 0);
    if (size > this.maxRecordBytes) {
      throw new RecordRefused(`event ${fields.event_id}: ${size} bytes with key and headers, more than the ${this.maxRecordBytes}-byte limit of ${topic}`);
    }
    return { key, value, headers: signed };
  }

  /** Publishes `envelope`, keyed by its operation id, with `callContext` (the one the
   * agent's runtime signed for the call) when given; resolves with its record id once the
   * broker has acknowledged it (all in-sync replicas), rejects with `DeliveryFailed`. */
  async publish(envelope: Envelope, topic: string = this.eventsTopic, callContext: string | null = null): Promise<string> {
    const record = this.encode(envelope, topic, callContext);
    await this.connect();
    const headers: Record<string, Buffer> = {};
    for (const [name, value] of record.headers) if (value !== null) headers[name] = value;
    const sent = this.producer.send({ topic, messages: [{ key: record.key, value: record.value, headers }] });
    this.inFlight.add(sent);
    try {
      await sent;
    } catch (error) {
      throw new DeliveryFailed(`event ${envelope.fields.event_id}: not acknowledged: ${(error as Error).message}`);
    } finally {
      this.inFlight.delete(sent);
    }
    return recordId('event', envelope.fields.operation_id, envelope.fields.event_id);
  }

  /** Waits for every publish still in flight; rejects if any was not acknowledged. */
  async flush(): Promise<void> {
    const results = await Promise.allSettled([...this.inFlight]);
    const failed = results.filter((r) => r.status === 'rejected');
    if (failed.length > 0) throw new DeliveryFailed(`${failed.length} record(s) not acknowledged`);
  }

  async close(): Promise<void> {
    try {
      await this.flush();
    } finally {
      if (this.connected !== undefined) await this.producer.disconnect();
    }
  }

  private connect(): Promise<void> {
    this.connected ??= this.producer.connect();
    return this.connected;
  }
}

export interface EventOptions {
  /** Required unless `call_context` names it. */
  operation_id?: string;
  correlation_id: string;
  machine_name: string;
  machine_version: string;
  /** Required unless `call_context` names it. */
  lineage?: Lineage;
  evidence_ref: string;
  event_id?: string;
  event_time?: Micros;
  evidence?: EvidencePayload | null;
  human_decision?: HumanDecision | null;
  classifier?: ClassifierOutput | null;
  causation?: string | null;
  facts?: DeclaredFacts | null;
  scope?: Scope | null;
  payload?: Payload | null;
  /** The call context the agent's runtime signed for this call (`issueCallContext`), to
   * forward unchanged on the event that opens the operation; the operation id and
   * lineage default to the ones it names. */
  call_context?: string | null;
}

/** How `actionResult` builds a result beyond the command and its outcome. */
export interface ResultOptions {
  event_type?: string | null;
  evidence_ref?: string | null;
  event_time?: Micros | null;
  /** A failure's: what a rate-limited API asked for (wire protocol, section 5). */
  retry_after_seconds?: number | null;
}

/** What an approver decides and signs (`RecoveryClient.publishHumanDecision`). */
export interface HumanDecisionOptions {
  /** The approver's Ed25519 private key; it signs the decision and is never stored. */
  private_key: KeyObject;
  verdict: 'approved' | 'rejected';
  operation_id: string;
  correlation_id: string;
  machine_name: string;
  machine_version: string;
  machine_digest: string;
  /** The state the approver looked at, and the state the decision authorises. */
  state: string;
  transition: string;
  lineage: Lineage;
  expires_at: Micros;
  /** Default: 16 random bytes in hex. */
  nonce?: string;
  event_time?: Micros;
  /** The review digest of what was reviewed (`recoveryctl review` shows it). */
  reviewed_digest?: string;
  for_resume?: boolean;
}

/** Where a decision signed elsewhere goes: the operation's machine and lineage. */
export interface SignedDecisionOptions {
  correlation_id: string;
  machine_name: string;
  machine_version: string;
  lineage: Lineage;
  event_time?: Micros;
}

/** Builds and publishes valid recovery events for one producer identity. */
export class RecoveryClient {
  readonly producer: string;

  constructor(readonly publisher: EventPublisher) {
    this.producer = publisher.signer.producer;
  }

  /** A validated envelope: a random event id unless given, the time now unless given.
   * Throws `EnvelopeError` with the code the controller would dead-letter it with. */
  buildEvent(eventType: string, options: EventOptions): Envelope {
    const { call_context: context, ...given } = options;
    const claims = context === null || context === undefined ? null : callContextClaims(context);
    const operationId = given.operation_id ?? claims?.operationId;
    const lineage = given.lineage ?? claims?.lineage;
    if (operationId === undefined || lineage === undefined) {
      throw new Error(`${eventType}: an event needs operation_id and lineage, or a call_context naming them`);
    }
    const fields: EnvelopeFields = {
      ...given,
      operation_id: operationId,
      lineage,
      event_type: eventType,
      event_id: given.event_id ?? `evt-${randomBytes(12).toString('hex')}`,
      event_time: given.event_time ?? nowMicros(),
      producer: this.producer,
    };
    return buildEnvelope(fields);
  }

  /** `buildEvent` and publish it, forwarding `call_context` when given; resolves with the
   * envelope once the broker acknowledged it. */
  async publishEvent(eventType: string, options: EventOptions): Promise<Envelope> {
    const envelope = this.buildEvent(eventType, options);
    await this.publisher.publish(envelope, this.publisher.eventsTopic, options.call_context ?? null);
    return envelope;
  }

  /**
   * The signed decision event of an approver (SPEC §9), built but not published: the
   * decision signed with `private_key` exactly as the Python `machines.sign_decision`
   * signs it (`humanDecisionMessage`), bound to the operation, the state the approver
   * looked at, the target state, the machine digest, an expiry, a fresh nonce, the
   * review digest and `for_resume`; the approver is this client's producer; event
   * `HUMAN_APPROVED` or `HUMAN_REJECTED` with id `decision:<nonce>`.
   */
  humanDecision(options: HumanDecisionOptions): Envelope {
    isoformat(options.expires_at); // a whole number of microseconds, or TimeError
    const decision = signHumanDecision(
      {
        approver: this.producer,
        operation_id: options.operation_id,
        state: options.state,
        transition: options.transition,
        machine_digest: options.machine_digest,
        expires_at: options.expires_at,
        nonce: options.nonce ?? randomBytes(16).toString('hex'),
        decision: options.verdict,
        reviewed_digest: options.reviewed_digest ?? '',
        for_resume: options.for_resume ?? false,
      },
      options.private_key,
    );
    return this.signedDecision(decision, options);
  }

  /** `humanDecision`, published; resolves with the envelope once acknowledged. */
  async publishHumanDecision(options: HumanDecisionOptions): Promise<Envelope> {
    const envelope = this.humanDecision(options);
    await this.publisher.publish(envelope);
    return envelope;
  }

  /** The event of a decision an approver signed elsewhere (a console, another service),
   * published as it is: this client must hold the `approver` role; the decision's own
   * signature proves the human to the controller. */
  signedDecision(decision: HumanDecision, options: SignedDecisionOptions): Envelope {
    if (!decision.signature) {
      throw new Error(`decision for operation ${decision.operation_id} by ${decision.approver} has no signature; sign it first (signHumanDecision)`);
    }
    return this.buildEvent(decision.decision === 'approved' ? 'HUMAN_APPROVED' : 'HUMAN_REJECTED', {
      event_id: `decision:${decision.nonce}`,
      operation_id: decision.operation_id,
      correlation_id: options.correlation_id,
      machine_name: options.machine_name,
      machine_version: options.machine_version,
      lineage: options.lineage,
      evidence_ref: `approval:${this.producer}:${decision.nonce}`,
      ...(options.event_time === undefined ? {} : { event_time: options.event_time }),
      human_decision: decision,
    });
  }

  /**
   * The event of an approver's signed migration of one operation to another pinned
   * version of its machine (wire protocol section 9): `MIGRATION_APPROVED` with id
   * `migration:<nonce>`, naming the new version as `options.machine_version`. The
   * decision's `reviewed_digest` is `migrationPlanDigest` of the plan it approves.
   */
  signedMigration(decision: HumanDecision, options: SignedDecisionOptions): Envelope {
    if (!decision.signature) {
      throw new Error(`migration of operation ${decision.operation_id} by ${decision.approver} has no signature; sign it first (signHumanDecision)`);
    }
    return this.buildEvent('MIGRATION_APPROVED', {
      event_id: `migration:${decision.nonce}`,
      operation_id: decision.operation_id,
      correlation_id: options.correlation_id,
      machine_name: options.machine_name,
      machine_version: options.machine_version,
      lineage: options.lineage,
      evidence_ref: `migration:${this.producer}:${decision.nonce}`,
      ...(options.event_time === undefined ? {} : { event_time: options.event_time }),
      human_decision: decision,
    });
  }

  async publishSignedDecision(decision: HumanDecision, options: SignedDecisionOptions): Promise<Envelope> {
    const envelope = this.signedDecision(decision, options);
    await this.publisher.publish(envelope);
    return envelope;
  }

  /**
   * The result event of `command`: causation the command id, event id
   * `result:<command id>`, event time the command's `issued_at` unless given, so the
   * same outcome of the same command is the same event, which the controller dedupes.
   * `retry_after_seconds` (whole seconds, 0 or more) goes into the payload: the
   * controller commands the operation's next retry no sooner (wire protocol, section 5).
   */
  actionResult(
    command: CapabilityCommand,
    succeeded: boolean,
    evidence: EvidencePayload | null = null,
    options: ResultOptions = {},
  ): Envelope {
    const chosen = options.event_type ?? resultEvent(command, succeeded, evidence);
    const wait = options.retry_after_seconds ?? null;
    if (wait !== null && !(Number.isSafeInteger(wait) && wait >= 0)) {
      throw new Error(`command ${command.command_id}: retry_after_seconds ${String(wait)} is not a whole number of seconds, 0 or more`);
    }
    let reported = evidence;
    if (evidence !== null && evidence.outcome) {
      if (evidence.verifier && evidence.verifier !== this.producer) {
        throw new Error(`command ${command.command_id}: evidence names verifier ${evidence.verifier} but this client reports as ${this.producer}`);
      }
      reported = { ...evidence, verifier: this.producer };
    }
    return this.buildEvent(chosen, {
      event_id: `result:${command.command_id}`,
      operation_id: command.operation_id,
      correlation_id: command.correlation_id,
      machine_name: command.machine_name,
      machine_version: command.machine_version,
      lineage: command.lineage,
      evidence_ref: options.evidence_ref ?? `command:${command.command_id}`,
      event_time: options.event_time ?? command.issued_at,
      evidence: reported,
      causation: command.command_id,
      payload: wait === null ? null : { retry_after_seconds: wait },
    });
  }

  async reportActionResult(
    command: CapabilityCommand,
    succeeded: boolean,
    evidence: EvidencePayload | null = null,
    options: ResultOptions = {},
  ): Promise<Envelope> {
    const envelope = this.actionResult(command, succeeded, evidence, options);
    await this.publisher.publish(envelope);
    return envelope;
  }
}

/** The conventional result event of a command's outcome; throws when there is none. */
export function resultEvent(command: CapabilityCommand, succeeded: boolean, evidence: EvidencePayload | null): string {
  if (command.kind === 'verify') {
    if (!succeeded) return 'VERIFICATION_UNAVAILABLE';
    if (evidence?.outcome === 'applied') return 'VERIFICATION_FOUND';
    if (evidence?.outcome === 'not_applied') return 'VERIFICATION_NOT_FOUND';
  } else {
    const pair = RESULT_EVENTS[command.kind];
    if (pair !== undefined) return succeeded ? pair[0] : pair[1];
  }
  throw new Error(`command ${command.command_id} (${command.capability}, kind ${command.kind}): no conventional result event; name event_type`);
}

/** The `reviewed_digest` of a migration: `sha256:` and the hex SHA-256 of the canonical
 * JSON of its plan (wire protocol section 9). */
export function migrationPlanDigest(plan: JsonValue): string {
  return `sha256:${createHash('sha256').update(canonicalJson(plan)).digest('hex')}`;
}

/** The bytes an approver signs for a human decision: the canonical JSON of the signed
 * fields and the domain (the Python `machines.signing_payload`). */
export function humanDecisionMessage(decision: HumanDecision): Buffer {
  return canonicalJson({ domain: HUMAN_DECISION_DOMAIN, ...decisionSignedFields(decision) });
}

/** `decision` with its signature (base64 Ed25519 over `humanDecisionMessage`). */
export function signHumanDecision(decision: HumanDecision, approverKey: KeyObject): HumanDecision {
  return { ...decision, signature: ed25519Sign(approverKey, humanDecisionMessage(decision)).toString('base64') };
}
