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
  type RecoveryClient,
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
for (const c of list(events, 'cases')) {
  test(`event: ${str(c['name'])}`, () => {
    const envelope = buildEnvelope(fieldsFromJson(c['envelope'] as Doc));
    assert.equal(canonicalText(envelope.content), c['content_canonical']);
    assert.equal(envelope.payloadDigest, c['payload_digest']);
    const topic = str(c['topic']);
    const key = Buffer.from(str(c['key']), 'utf8');
    const rid = recordId('event', envelope.fields.operation_id, envelope.fields.event_id);
    assert.equal(rid, c['record_id']);
    const signer = signerOf(str(c['producer']));
    assert.equal(signer.keyId, c['key_id']);
    const catalog = defaultCatalog();
    const encodings: Array<[string, Buffer, Header[]]> = [
      ['avro', catalog.encode(envelopeRecord(envelope), EVENT_ENVELOPE), [
        ['content-type', Buffer.from('application/vnd.apache.avro.single-object')],
        ['recovery-record-id', Buffer.from(rid)],
        ['recovery-schema', Buffer.from(catalog.current(EVENT_ENVELOPE).fingerprint.toString('hex'))],
      ]],
      ['json', canonicalJson(envelopeJson(envelope)), [
        ['content-type', Buffer.from('application/json')],
        ['recovery-record-id', Buffer.from(rid)],
      ]],
    ];
    for (const [name, value, headers] of encodings) {
      const wire = c[name] as Doc;
      assert.equal(value.toString('hex'), wire['value_hex'], `${name} value`);
      const message = recordSigningMessage(topic, key, value, headers, signer.producer, signer.keyId);
      assert.equal(message.toString('utf8'), wire['signing_message'], `${name} signing message`);
      const signed = signer.sign(topic, key, value, headers);
      assert.deepEqual(signed.map(([k, v]) => [k, v?.toString('utf8') ?? null]), wire['headers'], `${name} headers`);
      const roster = Roster.fromDocument(load('refusals.json')['roster']);
      assert.equal(verifyRecord(roster, topic, key, value, signed, parseUtc('2026-06-01T12:00:00Z')).id, signer.producer);
    }
    const decision = envelope.fields.human_decision;
    if (decision) assert.equal(humanDecisionMessage(decision).toString('utf8'), c['human_decision_signing_message']);
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
const AUTH = new Set(['signature-missing', 'signature-malformed', 'producer-unknown', 'key-unknown', 'key-revoked', 'key-not-yet-valid', 'key-expired', 'signature-invalid']);
test('record signatures of the refusal vectors verify or fail with their code', () => {
  const roster = Roster.fromDocument(refusals['roster']);
  const at = parseUtc(str(refusals['at']));
  let checked = 0;
  for (const c of list(refusals, 'cases')) {
    const verdict = str(c['verdict']);
    if (!(AUTH.has(verdict) || verdict === 'accepted')) continue;
    const record = c['record'] as Doc;
    const value = record['value_hex'] === null ? null : Buffer.from(str(record['value_hex']), 'hex');
    const key = Buffer.from(str(record['key']), 'utf8');
    try {
      verifyRecord(roster, str(refusals['topic']), key, value, headersOf(record['headers']), at);
      assert.equal(verdict, 'accepted', str(c['name']));
    } catch (error) {
      assert.ok(error instanceof AuthenticationError, String(error));
      assert.equal(error.code, verdict, str(c['name']));
    }
    checked += 1;
  }
  assert.ok(checked >= 12, `only ${checked} cases checked`);
});
