/**
 * The JSON form of an event envelope is validated with the repository's
 * `schemas/event.schema.json` (JSON Schema 2020-12, copied into `dist/json/` at build), as
 * strict as the Avro schema: no unknown field at any depth, the same required fields and
 * types, UTC times (docs/wire-protocol.md, "Encodings of the value"). Ajv compiles it once.
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv2020 } from 'ajv/dist/2020.js';
import type { ValidateFunction } from 'ajv';
import { WireError } from './avro.js';

let compiled: ValidateFunction | undefined;

function validator(): ValidateFunction {
  if (compiled === undefined) {
    // dist/src/jsonschema.js -> dist/json/event.schema.json
    const path = join(dirname(fileURLToPath(import.meta.url)), '..', 'json', 'event.schema.json');
    const schema = JSON.parse(readFileSync(path, 'utf8')) as object;
    compiled = new Ajv2020({ strict: true, allErrors: false }).compile(schema);
  }
  return compiled;
}

/** Throws `WireError` (`json-schema-violation`) naming the first field `value` (plain
 * parsed JSON) gets wrong against `event.schema.json`. */
export function validateEventJson(value: unknown): void {
  const validate = validator();
  if (!validate(value)) {
    const error = validate.errors?.[0];
    const where = error?.instancePath ? error.instancePath.slice(1).replaceAll('/', '.') : 'the envelope';
    const extra = error?.params && 'additionalProperty' in error.params ? ` (${String(error.params['additionalProperty'])})` : '';
    throw new WireError('json-schema-violation', `${where}: ${error?.message ?? 'invalid'}${extra}`);
  }
}
