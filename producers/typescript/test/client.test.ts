// The client's own refusals, before anything is sent: records over the controller's
// size limit, call contexts that cannot be one, events without an operation or lineage,
// payloads over the bound, decisions without a signature, and a worker whose roster
// names no controller.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  buildEnvelope,
  CallContextError,
  callContextClaims,
  CapabilityWorker,
  EnvelopeError,
  EventPublisher,
  ExecutionStore,
  issueCallContext,
  MAX_PAYLOAD_BYTES,
  parseUtc,
  privateKeyFromSeed,
  RecordRefused,
  RecordSigner,
  RecoveryClient,
  Roster,
  WorkerError,
  type EnvelopeFields,
  type Lineage,
} from '../src/index.js';

const key = privateKeyFromSeed(Buffer.alloc(32, 1));
const signer = new RecordSigner('tool-1', key);
const lineage: Lineage = { agent: 'agent-1', task: 'task-1', initiating_principal: 'alice', runtime: 'rt-1' };
const now = parseUtc('2026-06-01T12:00:00Z');
const fields = (extra: Partial<EnvelopeFields> = {}): EnvelopeFields => ({
  event_type: 'TOOL_TIMEOUT',
  event_id: 'evt-1',
  operation_id: 'op-1',
  correlation_id: 'corr-1',
  machine_name: 'procurement-request',
  machine_version: '1.0.0',
  event_time: now,
  evidence_ref: 'ref-1',
  producer: 'tool-1',
  lineage,
  ...extra,
});
const publisher = (maxRecordBytes?: number): EventPublisher =>
  new EventPublisher(signer, { bootstrap: '127.0.0.1:1', ...(maxRecordBytes === undefined ? {} : { maxRecordBytes }) });

test('a record over the size limit is refused before it is sent', () => {
  const envelope = buildEnvelope(fields({ payload: { note: 'x'.repeat(2000) } }));
  assert.ok(publisher().encode(envelope).value.length > 2000);
  assert.throws(() => publisher(2048).encode(envelope), (e: Error) => e instanceof RecordRefused && /more than the 2048-byte limit/.test(e.message));
  assert.throws(() => publisher().encode(buildEnvelope(fields()), 'recovery.events', 'x'.repeat(8193)), RecordRefused);
});

test('a payload over 64 KiB of canonical JSON is refused as the controller refuses it', () => {
  const big = { note: 'x'.repeat(MAX_PAYLOAD_BYTES) };
  assert.throws(() => buildEnvelope(fields({ payload: big })), (e: Error) => e instanceof EnvelopeError && e.code === 'envelope-field-invalid');
  assert.throws(() => buildEnvelope(fields({ payload: [1] as never })), (e: Error) => e instanceof EnvelopeError && e.code === 'envelope-invalid');
});

test('a call context names what the tool reports, and only a call context is one', () => {
  const context = issueCallContext('rt-1', key, 'op-1', lineage, { now });
  assert.deepEqual(callContextClaims(context), {
    operationId: 'op-1',
    lineage: { ...lineage, origin_operation: null, parent_operation: null, delegated_credentials: [] },
  });
  assert.equal(JSON.parse(context).context.expires_at, '2026-06-01T12:15:00Z');
  assert.throws(() => issueCallContext('rt-1', key, 'op-1', lineage, { now, lifetime: 0 }), CallContextError);
  assert.throws(() => issueCallContext('rt-1', key, 'op-1', lineage, { now, lifetime: 24 * 3600e6 + 1 }), CallContextError);
  for (const bad of ['not json', '[]', '{"context":{"operation_id":"op-1"}}', '{"context":{"operation_id":"op-1","lineage":{"agent":"a","task":1}}}']) {
    assert.throws(() => callContextClaims(bad), CallContextError, bad);
  }
  const client = new RecoveryClient(publisher());
  const base = { correlation_id: 'corr-1', machine_name: 'm', machine_version: '1', evidence_ref: 'ref-1' };
  assert.throws(() => client.buildEvent('TOOL_TIMEOUT', base), /needs operation_id and lineage, or a call_context/);
  assert.equal(client.buildEvent('TOOL_TIMEOUT', { ...base, call_context: context }).fields.lineage.runtime, 'rt-1');
});

test('a decision without a signature is not published', () => {
  const client = new RecoveryClient(publisher());
  const decision = {
    approver: 'tool-1', operation_id: 'op-1', state: 's', transition: 't', machine_digest: 'sha256:m',
    expires_at: now, nonce: 'n-1', decision: 'approved' as const,
  };
  assert.throws(() => client.signedDecision(decision, { correlation_id: 'c', machine_name: 'm', machine_version: '1', lineage }), /has no signature/);
  const { nonce: _given, ...unsigned } = decision;
  const signed = client.humanDecision({ ...unsigned, private_key: key, verdict: 'rejected', correlation_id: 'c', machine_name: 'm', machine_version: '1', lineage });
  assert.equal(signed.fields.event_type, 'HUMAN_REJECTED');
  assert.match(signed.fields.event_id, /^decision:[0-9a-f]{32}$/); // a fresh nonce
});

test('a worker whose roster names no controller refuses to start', () => {
  const store = new ExecutionStore(join(mkdtempSync(join(tmpdir(), 'worker-')), 'store.sqlite'));
  assert.throws(
    () => new CapabilityWorker({ groupId: 'g', bootstrap: '127.0.0.1:1', roster: new Roster([]), store, client: new RecoveryClient(publisher()), handlers: {} }),
    (e: Error) => e instanceof WorkerError && /lists no producer with role `controller`/.test(e.message),
  );
  assert.throws(() => new CapabilityWorker({ groupId: 'g', bootstrap: '127.0.0.1:1', roster: new Roster([]), store, client: new RecoveryClient(publisher()), handlers: {}, start: 'soon' }));
  store.close();
});
