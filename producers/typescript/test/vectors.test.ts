// This package against the wire protocol's test vectors (schemas/vectors/ of the
// repository): the same files the Python implementation is held to.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  admitCommand,
  callContextMessage,
  ed25519Verify,
  EnvelopeError,
  EventPublisher,
  headerValue,
  issueCallContext,
  readEvent,
  RecoveryClient,
  unsignedHeaders,
  WireError,
  buildEnvelope,
  canonicalJson,
  canonicalText,
  CapabilityWorker,
  crc32,
  deadlinePassed,
  defaultCatalog,
  EVENT_ENVELOPE,
  envelopeJson,
  envelopeRecord,
  ExecutionStore,
  fieldsFromJson,
  humanDecisionMessage,
  isDrill,
  keyId,
  parseJson,
  parseUtc,
  partitionFor,
  privateKeyFromSeed,
  publicKeyText,
  rabinFingerprint,
  recordId,
  recordSigningMessage,
  RecordSigner,
  Roster,
  verifyRecord,
  AuthenticationError,
  type Header,
  type JsonValue,
} from '../src/index.js';

const here = dirname(fileURLToPath(import.meta.url));
const VECTORS = join(here, '..', '..', '..', '..', 'schemas', 'vectors');
type Doc = { [key: string]: JsonValue | undefined };
const load = (name: string): Doc => parseJson(readFileSync(join(VECTORS, name), 'utf8')) as Doc;
const list = (doc: Doc, key: string): Doc[] => doc[key] as unknown as Doc[];
const str = (v: JsonValue | undefined): string => v as string;
const headersOf = (raw: JsonValue | undefined): Header[] =>
  (raw as Array<[string, string | null]>).map(([k, v]) => [k, v === null ? null : Buffer.from(v, 'utf8')] as const);

const keys = load('keys.json');
const seeds = new Map(list(keys, 'keys').map((k) => [str(k['name']), Buffer.from(str(k['seed_hex']), 'hex')]));
const signerOf = (producer: string, keyName = producer): RecordSigner => new RecordSigner(producer, privateKeyFromSeed(seeds.get(keyName)!));

test('fixed keys derive the listed public keys and key ids', () => {
  for (const k of list(keys, 'keys')) {
    const key = privateKeyFromSeed(Buffer.from(str(k['seed_hex']), 'hex'));
    assert.equal(publicKeyText(key), k['public_key']);
    assert.equal(keyId(key), k['key_id']);
  }
});

for (const c of list(load('canonical-json.json'), 'cases')) {
  test(`canonical-json/1: ${str(c['name'])}`, () => {
    const written = canonicalText(parseJson(str(c['input'])));
    assert.equal(written, c['canonical']);
    assert.equal(Buffer.from(written, 'utf8').toString('hex'), c['canonical_hex']);
  });
}

test('record ids, partitions, schema canonical forms and fingerprints', () => {
  const ids = load('ids.json');
  for (const c of list(ids, 'record_ids')) {
    assert.equal(recordId(str(c['kind']), ...(c['parts'] as string[])), c['record_id']);
  }
  for (const c of list(ids, 'partitions')) {
    const key = Buffer.from(str(c['key']), 'utf8');
    assert.equal(crc32(key), Number(c['crc32']));
    for (const [n, partition] of Object.entries(c['partition'] as Doc)) assert.equal(partitionFor(key, Number(n)), Number(partition));
  }
  const shipped = new Map(defaultCatalog().versions().map((v) => [v.file, v]));
  for (const s of list(ids, 'schemas')) {
    const version = shipped.get(str(s['file']));
    assert.ok(version, `schema ${str(s['file'])} is not shipped`);
    assert.equal(version.canonicalForm, s['parsing_canonical_form']);
    assert.equal(version.fingerprint.toString('hex'), s['fingerprint_hex']);
  }
  assert.equal(shipped.size, list(ids, 'schemas').length);
  for (const r of list(ids, 'rabin')) assert.equal(rabinFingerprint(str(r['input'])).toString('hex'), r['fingerprint_le_hex']);
});

const events = load('events.json');
const vectorRoster = Roster.fromDocument(load('refusals.json')['roster']);
const vectorsAt = parseUtc(str(load('refusals.json')['at']));
const publisherOf = (signer: RecordSigner, useJson: boolean): EventPublisher =>
  new EventPublisher(signer, { bootstrap: '127.0.0.1:1', useJson });

for (const c of list(events, 'cases')) {
  test(`event: ${str(c['name'])}`, () => {
    const envelope = buildEnvelope(fieldsFromJson(c['envelope'] as Doc));
    assert.equal(canonicalText(envelope.content), c['content_canonical']);
    assert.equal(envelope.payloadDigest, c['payload_digest']);
    const topic = str(c['topic']);
    const key = Buffer.from(str(c['key']), 'utf8');
    assert.equal(recordId('event', envelope.fields.operation_id, envelope.fields.event_id), c['record_id']);
    const signer = signerOf(str(c['producer']));
    assert.equal(signer.keyId, c['key_id']);
    const forwarded = (c['call_context'] as Doc | undefined) ?? null;
    const header = forwarded === null ? null : str(forwarded['header']);
    for (const encoding of ['avro', 'json'] as const) {
      const wire = c[encoding] as Doc;
      // The publisher's own encoding: value bytes, headers in order, signature.
      const record = publisherOf(signer, encoding === 'json').encode(envelope, topic, header);
      assert.equal(record.value.toString('hex'), wire['value_hex'], `${encoding} value`);
      assert.deepEqual(record.headers.map(([k, v]) => [k, v?.toString('utf8') ?? null]), wire['headers'], `${encoding} headers`);
      const message = recordSigningMessage(topic, key, record.value, unsignedHeaders(record.headers), signer.producer, signer.keyId);
      assert.equal(message.toString('utf8'), wire['signing_message'], `${encoding} signing message`);
      assert.equal(verifyRecord(vectorRoster, topic, key, record.value, record.headers, vectorsAt).id, signer.producer);
      // And the reader's: the vector's bytes decode to the same content.
      const contentType = headerValue(record.headers, 'content-type');
      assert.equal(canonicalText(readEvent(record.value, contentType).content), c['content_canonical'], `${encoding} read back`);
    }
    const decision = envelope.fields.human_decision;
    if (decision) {
      assert.equal(humanDecisionMessage(decision).toString('utf8'), c['human_decision_signing_message']);
      // publishHumanDecision's envelope, signed with the approver's key, is the vector's.
      const client = new RecoveryClient(publisherOf(signer, false));
      const made = client.humanDecision({
        private_key: privateKeyFromSeed(seeds.get(decision.approver)!),
        verdict: decision.decision,
        operation_id: decision.operation_id,
        correlation_id: envelope.fields.correlation_id,
        machine_name: envelope.fields.machine_name,
        machine_version: envelope.fields.machine_version,
        machine_digest: decision.machine_digest,
        state: decision.state,
        transition: decision.transition,
        lineage: envelope.fields.lineage,
        expires_at: decision.expires_at,
        nonce: decision.nonce,
        event_time: envelope.fields.event_time,
        reviewed_digest: decision.reviewed_digest ?? '',
        for_resume: decision.for_resume ?? false,
      });
      assert.equal(made.fields.human_decision?.signature, decision.signature);
      assert.equal(canonicalText(made.content), c['content_canonical']);
    }
    if (forwarded !== null) {
      const context = forwarded['context'] as Doc;
      // The runtime's side: the same context, message and signature from its key.
      const issuer = str(context['issuer']);
      const issued = parseUtc(str(context['issued_at']));
      const reissued = issueCallContext(issuer, privateKeyFromSeed(seeds.get(issuer)!), envelope.fields.operation_id, envelope.fields.lineage, {
        now: issued,
        lifetime: parseUtc(str(context['expires_at'])) - issued,
      });
      assert.equal(reissued, header);
      assert.equal(callContextMessage(context as { [key: string]: JsonValue }).toString('utf8'), forwarded['signing_message']);
      const runtime = vectorRoster.producer(issuer)!.keys[0]!.publicKey;
      assert.ok(ed25519Verify(runtime, Buffer.from(str(forwarded['signature']), 'base64'), callContextMessage(context as { [key: string]: JsonValue })));
      // The tool's side: operation id and lineage come from the context it forwards.
      const { operation_id: _op, lineage: _lineage, ...rest } = envelope.fields;
      const client = new RecoveryClient(publisherOf(signer, false));
      const built = client.buildEvent(envelope.fields.event_type, { ...rest, call_context: header });
      assert.equal(canonicalText(built.content), c['content_canonical']);
    }
  });
}

const commands = load('commands.json');
const commandRoster = Roster.fromDocument(commands['roster']);
const commandsAt = parseUtc(str(commands['at']));
const stubClient = (): RecoveryClient =>
  ({
    actionResult: () => ({}),
    publisher: { publish: async () => 'published' },
  }) as unknown as RecoveryClient;

for (const c of list(commands, 'cases')) {
  test(`command: ${str(c['name'])}`, async () => {
    const record = c['record'] as Doc;
    const key = Buffer.from(str(record['key']), 'utf8');
    const value = Buffer.from(str(record['value_hex']), 'hex');
    const headers = headersOf(record['headers']);
    const admission = admitCommand(commandRoster, str(commands['topic']), key, value, headers, commandsAt);
    let verdict: string;
    if (admission.verdict === 'refused') verdict = admission.code;
    else if (admission.verdict === 'undecodable') verdict = 'undecodable';
    else verdict = deadlinePassed(admission.command, commandsAt) ? 'deadline-expired' : isDrill(admission.command) ? 'drill' : 'execute';
    assert.equal(verdict, c['verdict']);
    if (admission.verdict === 'admitted') {
      const expected = c['command'] as Doc;
      assert.equal(admission.command.command_id, expected['command_id']);
      assert.equal(admission.command.issued_at, parseUtc(str(expected['issued_at'])));
      assert.equal(admission.command.deadline, expected['deadline'] === null ? null : parseUtc(str(expected['deadline'])));
      assert.equal(canonicalText(admission.command.params as JsonValue), canonicalText(parseJson(str(expected['params_json']))));
      assert.equal(admission.command.idempotency_key, expected['idempotency_key']);
    }
    // The worker itself, on a store of its own, reaches the same verdict.
    const executed: string[] = [];
    const store = new ExecutionStore(join(mkdtempSync(join(tmpdir(), 'vectors-')), 'store.sqlite'));
    const worker = new CapabilityWorker({
      groupId: 'vectors',
      bootstrap: '127.0.0.1:1',
      roster: commandRoster,
      store,
      client: stubClient(),
      handlers: Object.fromEntries(['procurement.create-request', 'procurement.verify-request'].map((cap) => [cap, (cmd) => (executed.push(cmd.command_id), null)])),
      clock: () => commandsAt,
      log: () => undefined,
    });
    await worker.handle(str(commands['topic']), key, value, headers);
    const s = worker.stats;
    const seen = Object.keys(s.refused)[0] ?? (s.expired ? 'deadline-expired' : s.drills ? 'drill' : executed.length ? 'execute' : 'nothing');
    assert.equal(seen, c['verdict']);
    store.close();
  });
}

const refusals = load('refusals.json');
// What a client can check of a record on its own, in the controller's order: size,
// decoding, the envelope, the signature and the signer, the key. The rest (machines,
// the operation's state and the roster's grants) is the controller's.
const CLIENT_CHECKS = new Set([
  'wire-oversized', 'wire-empty', 'wire-unsupported-content-type', 'avro-not-single-object', 'avro-unknown-fingerprint',
  'avro-corrupt', 'avro-trailing-bytes', 'json-malformed', 'json-schema-violation', 'schema-unexpected', 'envelope-invalid',
  'envelope-field-invalid', 'event-time-out-of-range', 'signature-missing', 'signature-malformed', 'producer-unknown',
  'key-unknown', 'key-revoked', 'key-not-yet-valid', 'key-expired', 'signature-invalid', 'identity-mismatch', 'key-mismatch',
]);

function clientVerdict(record: Doc, roster: Roster, at: number, maxBytes: number): string {
  const key = Buffer.from(str(record['key']), 'utf8');
  const value = record['value_hex'] === null ? null : Buffer.from(str(record['value_hex']), 'hex');
  const headers = headersOf(record['headers']);
  const size = key.length + (value?.length ?? 0) + headers.reduce((n, [k, v]) => n + Buffer.byteLength(k) + (v?.length ?? 0), 0);
  if (size > maxBytes) return 'wire-oversized';
  let envelope;
  try {
    envelope = readEvent(value, headerValue(headers, 'content-type'));
  } catch (error) {
    if (error instanceof WireError || error instanceof EnvelopeError) return error.code;
    throw error;
  }
  try {
    const signer = verifyRecord(roster, str(refusals['topic']), key, value, headers, at);
    if (signer.id !== envelope.fields.producer) return 'identity-mismatch';
  } catch (error) {
    if (error instanceof AuthenticationError) return error.code;
    throw error;
  }
  return key.toString('utf8') === envelope.fields.operation_id ? 'accepted' : 'key-mismatch';
}

for (const c of list(refusals, 'cases')) {
  test(`refusal: ${str(c['name'])}`, () => {
    const roster = Roster.fromDocument(refusals['roster']);
    const at = parseUtc(str(refusals['at']));
    const maxBytes = Number(refusals['max_record_bytes']);
    const verdict = str(c['verdict']);
    // A client reaches every verdict of the record alone; what only the controller can
    // refuse (its machines, the operation's state, grants, call contexts) passes it.
    const expected = c['stage'] === 'intake' && CLIENT_CHECKS.has(verdict) ? verdict : 'accepted';
    for (const before of (c['preceded_by'] as Doc[] | undefined) ?? []) {
      assert.equal(clientVerdict(before, roster, at, maxBytes), 'accepted');
    }
    assert.equal(clientVerdict(c['record'] as Doc, roster, at, maxBytes), expected);
  });
}
