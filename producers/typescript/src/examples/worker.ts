// The worker side of docs/tool-integration-typescript.md: serves the procurement
// capabilities. Verification asks the "procurement system" (a file of created requests,
// one idempotency key a line) whether the key is there; the retry creates the request by
// appending its key, fsynced. With --hang-after-effect the worker stops dead after
// creating a request, before recording or reporting it, so it can be killed there.
// A new group starts at the end of the topic (--start latest, the default) unless told
// otherwise (--start earliest, or a time); RECOVERY_ROSTER_FILE names the roster (JSON,
// or a YAML or JSON policy) that the controller's commands are verified against.
// Usage: node dist/src/examples/worker.js --keys DIR --store FILE --system FILE
//            [--group G] [--start latest|earliest|TIME] [--bootstrap HOST:PORT]
import { appendFileSync, existsSync, openSync, fsyncSync, closeSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  CapabilityWorker,
  EventPublisher,
  ExecutionStore,
  loadPrivateKey,
  RecordSigner,
  RecoveryClient,
  Roster,
  type CapabilityCommand,
} from '../index.js';

const { values } = parseArgs({
  options: {
    keys: { type: 'string' },
    store: { type: 'string' },
    system: { type: 'string' },
    // Worker principals read in groups recovery-worker* (docs/operations.md, ACLs).
    group: { type: 'string', default: 'recovery-worker-ts-example' },
    bootstrap: { type: 'string' },
    start: { type: 'string', default: 'latest' },
    'hang-after-effect': { type: 'boolean', default: false },
  },
});
const rosterFile = process.env['RECOVERY_ROSTER_FILE'];
if (!values.keys || !values.store || !values.system || !rosterFile) {
  process.stderr.write('usage: worker.js --keys DIR --store FILE --system FILE [--group G]; RECOVERY_ROSTER_FILE names the roster\n');
  process.exit(2);
}
const system = values.system;
const created = (): string[] => (existsSync(system) ? readFileSync(system, 'utf8').split('\n').filter(Boolean) : []);
const bootstrap = values.bootstrap === undefined ? {} : { bootstrap: values.bootstrap };

// A bad key file or roster is said in one line, not a stack trace.
function fatal(error: unknown): never {
  process.stderr.write(`worker: ${(error as Error).message}\n`);
  process.exit(2);
}
let signer: RecordSigner;
let roster: Roster;
try {
  signer = new RecordSigner('coupa-worker', loadPrivateKey(join(values.keys, 'coupa-worker.pem')));
  roster = Roster.load(rosterFile);
} catch (error) {
  fatal(error);
}
const publisher = new EventPublisher(signer, bootstrap);
const store = new ExecutionStore(values.store);
const worker = new CapabilityWorker({
  ...bootstrap,
  groupId: values.group!,
  roster,
  store,
  client: new RecoveryClient(publisher),
  start: values.start!,
  consumerConfig: { 'session.timeout.ms': 6000, 'heartbeat.interval.ms': 500 },
  log: (line) => console.log(line),
  handlers: {
    'procurement.verify-request': (command: CapabilityCommand) => {
      const found = created().includes(command.idempotency_key ?? '');
      const outcome = found ? 'applied' : 'not_applied';
      console.log(`worker: verify ${command.command_id}: ${outcome}`);
      return { succeeded: true, evidence: { outcome, reference: `procurement-system:${command.idempotency_key}` } };
    },
    'procurement.create-request': async (command: CapabilityCommand) => {
      const key = command.idempotency_key ?? '';
      if (!created().includes(key)) {
        appendFileSync(system, key + '\n');
        const fd = openSync(system, 'r');
        fsyncSync(fd);
        closeSync(fd);
      }
      console.log(`worker: executed ${command.command_id} with idempotency key ${key}`);
      if (values['hang-after-effect']) {
        console.log('worker: hanging before recording the answer');
        await new Promise(() => undefined);
      }
      return { succeeded: true, evidence_ref: `procurement-system:${key}` };
    },
  },
});
const stop = async (): Promise<void> => {
  await worker.stop();
  await publisher.close();
  store.close();
  process.exit(0);
};
process.on('SIGTERM', () => void stop());
process.on('SIGINT', () => void stop());
worker.assigned.then(
  () => console.log('worker: assigned'),
  () => process.exit(1), // it said why
);
await worker.run();
