// Starts the build from an empty dist/ (so no file of a removed source is shipped or
// tested), then copies the wire schemas from the repository's schemas/ (the one place
// they are kept) into it: the Avro schemas (schemas/avro/*.avsc) into dist/avro/, the
// JSON Schema of JSON events (schemas/event.schema.json) into dist/json/. Run by
// `npm run build`.
import { cpSync, existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const schemas = join(here, '..', '..', '..', 'schemas');
const dist = join(here, '..', 'dist');
if (!existsSync(join(schemas, 'avro'))) {
  throw new Error(`no schemas at ${schemas}: build from the repository checkout`);
}
rmSync(dist, { recursive: true, force: true });
mkdirSync(join(dist, 'avro'), { recursive: true });
for (const name of readdirSync(join(schemas, 'avro'))) {
  if (name.endsWith('.avsc')) cpSync(join(schemas, 'avro', name), join(dist, 'avro', name));
}
mkdirSync(join(dist, 'json'), { recursive: true });
cpSync(join(schemas, 'event.schema.json'), join(dist, 'json', 'event.schema.json'));
