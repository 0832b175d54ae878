// The roster a worker verifies commands against, read as the Python `machines.load_roster`
// reads it: a roster file (JSON or YAML) or a policy's `producers`, every problem named
// with where it is; and the start positions and times the worker is given.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseInstant, parseStartPosition, parseUtc, privateKeyFromSeed, publicKeyText, Roster, RosterError, startFromEnv } from '../src/index.js';

const controllerKey = publicKeyText(privateKeyFromSeed(Buffer.alloc(32, 7)));
const dir = mkdtempSync(join(tmpdir(), 'roster-'));
const file = (name: string, text: string): string => {
  const path = join(dir, name);
  writeFileSync(path, text);
  return path;
};

test('a YAML policy gives its producers, with validity times in any zone', () => {
  const roster = Roster.load(
    file(
      'policy.yaml',
      `# an operator policy: the worker reads only its producers
id: production
trusted_verifiers: [coupa-worker]
producers:
  - id: recovery-controller
    keys:
      - public_key: ${controllerKey}
        not_before: 2026-01-01T01:00:00+01:00
        not_after: 2027-06-01T00:00:00Z
    grants:
      - role: controller
        capabilities: ["*"]
`,
    ),
  );
  const [controller] = roster.producers;
  assert.equal(controller?.id, 'recovery-controller');
  assert.equal(controller?.keys[0]?.notBefore, parseUtc('2026-01-01T00:00:00Z'));
  assert.equal(controller?.keys[0]?.notAfter, parseUtc('2027-06-01T00:00:00Z'));
  assert.deepEqual(controller?.grants[0]?.capabilities, ['*']);
});

test('a JSON roster file and the same roster in YAML are one roster', () => {
  const document = { producers: [{ id: 'recovery-controller', keys: [{ public_key: controllerKey }], grants: [{ role: 'controller' }] }] };
  const json = Roster.load(file('roster.json', JSON.stringify(document)));
  const yaml = Roster.load(file('roster.yaml', `producers:\n  - id: recovery-controller\n    keys: [{public_key: "${controllerKey}"}]\n    grants: [{role: controller}]\n`));
  assert.equal(json.producers[0]?.keys[0]?.keyId, yaml.producers[0]?.keys[0]?.keyId);
});

test('each problem of a YAML roster is named with its line', () => {
  const path = file(
    'bad.yaml',
    `producers:
  - id: recovery-controller
    keys:
      - public_key: not-a-key
    grants:
      - role: overlord
        colour: blue
`,
  );
  assert.throws(
    () => Roster.load(path),
    (error: Error) =>
      error instanceof RosterError &&
      error.message.includes(`roster ${path} line 4: producers[0].keys[0].public_key: must be the base64`) &&
      error.message.includes('line 6: producers[0].grants[0].role: must be one of') &&
      error.message.includes('line 7: producers[0].grants[0].colour: unknown key'),
  );
});

test('times without an offset, unknown keys and duplicate ids are refused', () => {
  const base = { id: 'c', keys: [{ public_key: controllerKey }], grants: [{ role: 'controller' }] };
  const cases: Array<[unknown, string]> = [
    [{ producers: [{ ...base, keys: [{ public_key: controllerKey, not_after: '2027-06-01T00:00:00' }] }] }, 'keys[0].not_after: must be an RFC 3339 time with its offset'],
    [{ producers: [base], approvers: [] }, 'approvers: unknown key'],
    [{ producers: [base, base] }, 'producer ids listed twice: c'],
    [{ producers: [{ ...base, keys: [] }] }, 'producers[0].keys: must list at least one key'],
    [{ producers: 'all' }, 'producers: must be a list'],
    [[], 'a roster is a mapping'],
  ];
  for (const [document, message] of cases) {
    assert.throws(() => Roster.fromDocument(document), (error: Error) => error instanceof RosterError && error.message.includes(message), message);
  }
  assert.throws(() => Roster.load(join(dir, 'missing.json')), /roster .*missing.json cannot be read/);
  assert.throws(() => Roster.load(file('broken.yaml', 'producers: [\n')), /roster .*broken.yaml line \d+:/);
});

test('start positions and times are read as the Python worker reads them', () => {
  assert.deepEqual(parseStartPosition('latest'), { mode: 'latest' });
  assert.deepEqual(parseStartPosition(' earliest '), { mode: 'earliest' });
  assert.deepEqual(parseStartPosition('2026-12-01T08:00:00+01:00'), { mode: 'time', at: parseUtc('2026-12-01T07:00:00Z') });
  assert.deepEqual(parseStartPosition('2026-12-01T08:00Z'), { mode: 'time', at: parseUtc('2026-12-01T08:00:00Z') });
  assert.throws(() => parseStartPosition('2026-12-01T08:00:00'), /expected latest, earliest or an ISO 8601 time with a UTC offset/);
  assert.throws(() => parseStartPosition('yesterday'), /WorkerError|expected latest/);
  assert.deepEqual(startFromEnv({}), { mode: 'latest' });
  assert.deepEqual(startFromEnv({ RECOVERY_WORKER_START: 'earliest' }), { mode: 'earliest' });
  assert.equal(parseInstant('2026-02-30T00:00:00Z'), null);
  assert.equal(parseInstant('2026-06-01 12:00:00.5-02:30'), parseUtc('2026-06-01T14:30:00.5Z'));
});
