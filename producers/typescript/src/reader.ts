/**
 * Reading an event record as the controller's intake does, up to what a client can check
 * without the controller's machines and ledger (docs/wire-protocol.md, "Encodings of the
 * value" and "Refusal codes"): the content type, the Avro single object or strict JSON,
 * the envelope's shape, fields and bounds. The record's signature is `verifyRecord`'s.
 * A tool needs none of this to publish; it serves tests, tools that inspect the events
 * topic, and anyone checking an implementation against `refusals.json`.
 *
 * JSON events are parsed strictly (duplicate keys, NaN and non-UTF-8 are refused) and
 * validated against `schemas/event.schema.json`, as the controller reads them.
 */
import { defaultCatalog, EVENT_ENVELOPE, WireError, type SchemaCatalog } from './avro.js';
import { isJsonObject, parseJson, type JsonValue } from './canonical.js';
import {
  buildEnvelope,
  EnvelopeError,
  fieldsFromJson,
  type EffectOutcome,
  type Envelope,
  type EnvelopeFields,
  type Payload,
} from './envelope.js';
import { CONTENT_TYPE_AVRO, CONTENT_TYPE_JSON } from './headers.js';
import { validateEventJson } from './jsonschema.js';

type Fields = Record<string, unknown>;

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** The media type of a `content-type` header value: before any `;`, trimmed, lower case. */
export function mediaType(contentType: string | null): string {
  return contentType === null ? CONTENT_TYPE_AVRO : contentType.split(';')[0]!.trim().toLowerCase();
}

/** The validated envelope of one events-topic record; throws `WireError` or
 * `EnvelopeError` with the controller's refusal code. */
export function readEvent(value: Buffer | null, contentType: string | null, catalog: SchemaCatalog = defaultCatalog()): Envelope {
  if (value === null || value.length === 0) throw new WireError('wire-empty', 'the record has no value');
  const media = mediaType(contentType);
  if (media === CONTENT_TYPE_JSON) {
    let document: JsonValue;
    let plain: unknown;
    try {
      const text = utf8.decode(value);
      document = parseJson(text);
      plain = JSON.parse(text);
    } catch (error) {
      throw new WireError('json-malformed', `the value is not strict JSON: ${(error as Error).message}`);
    }
    validateEventJson(plain);
    return envelopeOf(() => fieldsFromJson(document as { [key: string]: JsonValue | undefined }));
  }
  if (media !== CONTENT_TYPE_AVRO) {
    throw new WireError('wire-unsupported-content-type', `content type ${JSON.stringify(contentType)} is neither Avro single object nor JSON`);
  }
  const [name, record] = catalog.decode(value);
  if (name !== EVENT_ENVELOPE) throw new WireError('schema-unexpected', `a ${name} record is not an event envelope`);
  return envelopeOf(() => fieldsFromRecord(record));
}

function envelopeOf(fields: () => EnvelopeFields): Envelope {
  let read: EnvelopeFields;
  try {
    read = fields();
  } catch (error) {
    if (error instanceof EnvelopeError) throw error;
    throw new EnvelopeError('envelope-invalid', `not an event envelope: ${(error as Error).message}`);
  }
  return buildEnvelope(read);
}

/** Envelope fields from a decoded `recovery.EventEnvelope` record (the newest version;
 * times in microseconds, `payload` as canonical JSON text). */
export function fieldsFromRecord(record: Fields): EnvelopeFields {
  const lineage = record['lineage'] as Fields;
  const evidence = record['evidence'] as Fields | null;
  const checkpoint = evidence ? (evidence['checkpoint'] as Fields | null) : null;
  const decision = record['human_decision'] as Fields | null;
  const classifier = record['classifier'] as Fields | null;
  const facts = record['facts'] as Fields | null;
  const scope = record['scope'] as Fields | null;
  const fields: EnvelopeFields = {
    event_type: record['event_type'] as string,
    event_id: record['event_id'] as string,
    operation_id: record['operation_id'] as string,
    correlation_id: record['correlation_id'] as string,
    machine_name: record['machine_name'] as string,
    machine_version: record['machine_version'] as string,
    event_time: record['event_time'] as number,
    evidence_ref: record['evidence_ref'] as string,
    producer: record['producer'] as string,
    lineage: {
      agent: lineage['agent'] as string,
      task: lineage['task'] as string,
      initiating_principal: lineage['initiating_principal'] as string,
      origin_operation: lineage['origin_operation'] as string | null,
      parent_operation: lineage['parent_operation'] as string | null,
      delegated_credentials: lineage['delegated_credentials'] as string[],
      runtime: lineage['runtime'] as string | null,
    },
    causation: record['causation'] as string | null,
  };
  if (evidence) {
    fields.evidence = {
      outcome: evidence['outcome'] as EffectOutcome | null,
      verifier: evidence['verifier'] as string | null,
      reference: evidence['reference'] as string | null,
      ancestor_operation: evidence['ancestor_operation'] as string | null,
      checkpoint: checkpoint
        ? {
            checkpoint_id: checkpoint['checkpoint_id'] as string,
            saved_at: checkpoint['saved_at'] as number,
            reference: checkpoint['reference'] as string,
            validated: checkpoint['validated'] as boolean,
            validator: checkpoint['validator'] as string | null,
            validated_machine_digest: checkpoint['validated_machine_digest'] as string | null,
            validated_policy_digest: checkpoint['validated_policy_digest'] as string | null,
            valid_until: checkpoint['valid_until'] as number | null,
          }
        : null,
    };
  }
  if (decision) {
    fields.human_decision = {
      approver: decision['approver'] as string,
      operation_id: decision['operation_id'] as string,
      state: decision['state'] as string,
      transition: decision['transition'] as string,
      machine_digest: decision['machine_digest'] as string,
      expires_at: decision['expires_at'] as number,
      nonce: decision['nonce'] as string,
      decision: decision['decision'] as 'approved' | 'rejected',
      signature: decision['signature'] as string,
      reviewed_digest: decision['reviewed_digest'] as string,
      for_resume: decision['for_resume'] as boolean,
    };
  }
  if (classifier) {
    fields.classifier = {
      identity: classifier['identity'] as string,
      version: classifier['version'] as string,
      question: classifier['question'] as string,
      probabilities: classifier['probabilities'] as Record<string, number>,
      candidate_event: classifier['candidate_event'] as string | null,
    };
  }
  if (facts) {
    fields.facts = {
      idempotency_key: facts['idempotency_key'] as string | null,
      side_effect_possible: facts['side_effect_possible'] as boolean,
      side_effect_confirmed: facts['side_effect_confirmed'] as boolean,
      compensation_supported: facts['compensation_supported'] as boolean,
      status_api: facts['status_api'] as boolean,
      arguments_digest: facts['arguments_digest'] as string | null,
    };
  }
  if (scope) {
    fields.scope = {
      capability: scope['capability'] as string,
      tool: scope['tool'] as string | null,
      environment: scope['environment'] as string | null,
    };
  }
  const payload = record['payload'];
  if (typeof payload === 'string') {
    let parsed: JsonValue;
    try {
      parsed = parseJson(payload);
    } catch (error) {
      throw new EnvelopeError('envelope-invalid', `event ${fields.event_id}: payload is not JSON: ${(error as Error).message}`);
    }
    if (!isJsonObject(parsed)) {
      throw new EnvelopeError('envelope-invalid', `event ${fields.event_id}: payload must be a JSON object`);
    }
    fields.payload = parsed as Payload;
  }
  return fields;
}
