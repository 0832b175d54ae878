// Copies the Avro schemas from the repository's schemas/avro/ (the one place they are
// kept) into dist/avro/, which the package ships. Run by `npm run build`.
import { cpSync, existsSync, mkdirSync, readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const source = join(here, '..', '..', '..', 'schemas', 'avro');
const target = join(here, '..', 'dist', 'avro');
if (!existsSync(source)) {
  throw new Error(`no schemas at ${source}: build from the repository checkout`);
}
mkdirSync(target, { recursive: true });
for (const name of readdirSync(source)) {
  if (name.endsWith('.avsc')) cpSync(join(source, name), join(target, name));
}
