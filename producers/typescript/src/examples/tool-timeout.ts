// The tool side of docs/tool-integration-typescript.md: a procurement call times out;
// the integration declares its idempotency key with the digest of the call's arguments,
// the effect facts and the scope, and reports TOOL_TIMEOUT, signed with its roster key.
// With --runtime, it plays the agent's runtime too: the runtime signs a call context for
// the call (its roster key), and the tool forwards it on the event, which then takes its
// operation id and lineage from the context. Usage:
//   node dist/src/examples/tool-timeout.js --keys DIR --operation OP
//       [--producer ID] [--runtime ID] [--bootstrap HOST:PORT]
// (each producer's key is DIR/<id>.pem, as docs/examples/example_keys.py writes them).
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  argumentsDigest,
  EventPublisher,
  issueCallContext,
  loadPrivateKey,
  nowMicros,
  RecordSigner,
  RecoveryClient,
  type Lineage,
} from '../index.js';

const { values } = parseArgs({
  options: {
    keys: { type: 'string' },
    operation: { type: 'string' },
    producer: { type: 'string', default: 'coupa-integration' },
    runtime: { type: 'string' },
    bootstrap: { type: 'string' },
  },
});
if (!values.keys || !values.operation) {
  process.stderr.write('usage: tool-timeout.js --keys DIR --operation OP [--producer ID] [--runtime ID] [--bootstrap HOST:PORT]\n');
  process.exit(2);
}
const keys = values.keys;
const operation = values.operation;
const producer = values.producer!;
const signer = new RecordSigner(producer, loadPrivateKey(join(keys, `${producer}.pem`)));
const publisher = new EventPublisher(signer, values.bootstrap === undefined ? {} : { bootstrap: values.bootstrap });
const tool = new RecoveryClient(publisher);
const lineage: Lineage = {
  agent: 'procurement-agent',
  task: `task-${operation}`,
  initiating_principal: 'alice@example.com',
  runtime: 'procurement-runtime-3', // the agent runtime that ran the call
};
const args = { item: 'laptop-14', quantity: 12 };
const key = `req-${operation}`; // declared before the call, sent with it
// The agent's runtime vouches for the call: it signs the operation id and the lineage.
const callContext =
  values.runtime === undefined
    ? null
    : issueCallContext(values.runtime, loadPrivateKey(join(keys, `${values.runtime}.pem`)), operation, lineage, { now: nowMicros() });
console.log(`tool: calling procurement.create-request with idempotency key ${key}`);
console.log(`tool: procurement API: no response for ${key}; the effect is unknown`);
try {
  const event = await tool.publishEvent('TOOL_TIMEOUT', {
    ...(callContext === null ? { operation_id: operation, lineage } : { call_context: callContext }),
    correlation_id: `corr-${operation}`,
    machine_name: 'procurement-request',
    machine_version: '1.0.0',
    evidence_ref: `coupa:call:${key}`,
    facts: {
      idempotency_key: key,
      arguments_digest: argumentsDigest(args), // tells a duplicate from a reuse of the key
      side_effect_possible: true,
      side_effect_confirmed: false,
      compensation_supported: true,
      status_api: true,
    },
    scope: { capability: 'procurement.create-request', tool: 'coupa', environment: 'production' },
    payload: args,
  });
  const via = callContext === null ? '' : ` with the call context of ${values.runtime}`;
  console.log(`tool: reported TOOL_TIMEOUT ${event.fields.event_id} for ${operation}${via} (acknowledged)`);
} finally {
  await publisher.close();
}
