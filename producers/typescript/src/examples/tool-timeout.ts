// The tool side of docs/tool-integration-typescript.md: a procurement call times out;
// the integration declares its idempotency key, the effect facts and the scope, and
// reports TOOL_TIMEOUT, signed with its roster key. Usage:
//   node dist/src/examples/tool-timeout.js --keys DIR --operation OP [--bootstrap HOST:PORT]
import { parseArgs } from 'node:util';
import { join } from 'node:path';
import { EventPublisher, loadPrivateKey, RecordSigner, RecoveryClient } from '../index.js';

const { values } = parseArgs({
  options: { keys: { type: 'string' }, operation: { type: 'string' }, bootstrap: { type: 'string' } },
});
if (!values.keys || !values.operation) {
  process.stderr.write('usage: tool-timeout.js --keys DIR --operation OP [--bootstrap HOST:PORT]\n');
  process.exit(2);
}
const operation = values.operation;
const signer = new RecordSigner('coupa-integration', loadPrivateKey(join(values.keys, 'coupa-integration.pem')));
const publisher = new EventPublisher(signer, values.bootstrap === undefined ? {} : { bootstrap: values.bootstrap });
const tool = new RecoveryClient(publisher);
const key = `req-${operation}`; // declared before the call, sent with it
console.log(`tool: calling procurement.create-request with idempotency key ${key}`);
console.log(`tool: procurement API: no response for ${key}; the effect is unknown`);
try {
  const event = await tool.publishEvent('TOOL_TIMEOUT', {
    operation_id: operation,
    correlation_id: `corr-${operation}`,
    machine_name: 'procurement-request',
    machine_version: '1.0.0',
    lineage: { agent: 'procurement-agent', task: `task-${operation}`, initiating_principal: 'alice@example.com' },
    evidence_ref: `coupa:call:${key}`,
    facts: {
      idempotency_key: key,
      side_effect_possible: true,
      side_effect_confirmed: false,
      compensation_supported: true,
      status_api: true,
    },
    scope: { capability: 'procurement.create-request', tool: 'coupa', environment: 'production' },
    payload: { item: 'laptop-14', quantity: 12 },
  });
  console.log(`tool: reported TOOL_TIMEOUT ${event.fields.event_id} for ${operation} (acknowledged)`);
} finally {
  await publisher.close();
}
