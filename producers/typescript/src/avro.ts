/**
 * Avro single-object encoding (docs/wire-protocol.md, "Avro"): `C3 01`, the 8-byte
 * little-endian CRC-64-AVRO (Rabin) fingerprint of the writer schema's parsing canonical
 * form, then the Avro binary body. Schemas are the repository's `schemas/avro/*.avsc`,
 * copied into `dist/avro/` at build; a reader resolves any shipped writer version into
 * the newest version of the same record.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import avro from 'avsc';

export const SINGLE_OBJECT_MARKER = Buffer.from([0xc3, 0x01]);
export const EVENT_ENVELOPE = 'recovery.EventEnvelope';
export const CAPABILITY_COMMAND = 'recovery.CapabilityCommand';

/** Why a value could not be encoded or decoded; `code` is the protocol's wire code. */
export class WireError extends Error {
  override name = 'WireError';
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

const EMPTY = 0xc15d213aa4d7a795n;
const TABLE: bigint[] = Array.from({ length: 256 }, (_, i) => {
  let fp = BigInt(i);
  for (let j = 0; j < 8; j++) fp = (fp >> 1n) ^ (EMPTY & -(fp & 1n));
  return fp;
});

/** CRC-64-AVRO of `text` (UTF-8), as the 8 little-endian bytes single objects carry. */
export function rabinFingerprint(text: string): Buffer {
  let fp = EMPTY;
  for (const byte of Buffer.from(text, 'utf8')) {
    fp = (fp >> 8n) ^ TABLE[Number((fp ^ BigInt(byte)) & 0xffn)]!;
  }
  const out = Buffer.alloc(8);
  out.writeBigUInt64LE(fp);
  return out;
}

export interface SchemaVersion {
  readonly name: string;
  readonly version: number;
  readonly file: string;
  readonly type: avro.Type;
  readonly canonicalForm: string;
  readonly fingerprint: Buffer;
}

const FILE_NAME = /^([a-z0-9_]+)\.v([1-9][0-9]*)\.avsc$/;

export class SchemaCatalog {
  private readonly byFingerprint = new Map<string, SchemaVersion>();
  private readonly newest = new Map<string, SchemaVersion>();
  private readonly resolvers = new Map<string, avro.Resolver>();

  constructor(versions: readonly SchemaVersion[]) {
    for (const v of versions) {
      this.byFingerprint.set(v.fingerprint.toString('hex'), v);
      const current = this.newest.get(v.name);
      if (current === undefined || v.version > current.version) this.newest.set(v.name, v);
    }
  }

  /** Every `<record>.v<N>.avsc` in `directory` (default: the package's `dist/avro`). */
  static load(directory: string = defaultDirectory()): SchemaCatalog {
    const versions: SchemaVersion[] = [];
    for (const file of readdirSync(directory).sort()) {
      const match = FILE_NAME.exec(file);
      if (match === null) continue;
      const schema: unknown = JSON.parse(readFileSync(join(directory, file), 'utf8'));
      // Each file parses in its own namespace of names: versions share type names.
      const type = avro.Type.forSchema(schema as avro.Schema, { registry: {} });
      // avsc's default schema export keeps only what the parsing canonical form keeps
      // (full names, type, fields, symbols, items, values, size), in its order.
      const canonicalForm = JSON.stringify(type.schema());
      versions.push({
        name: (type as avro.types.RecordType).name ?? '',
        version: Number(match[2]),
        file,
        type,
        canonicalForm,
        fingerprint: rabinFingerprint(canonicalForm),
      });
    }
    return new SchemaCatalog(versions);
  }

  current(name: string): SchemaVersion {
    const found = this.newest.get(name);
    if (found === undefined) throw new WireError('schema-unknown', `no schema named ${name}`);
    return found;
  }

  versions(): SchemaVersion[] {
    return [...this.byFingerprint.values()];
  }

  /** `record` of the newest version of `name`, as a single object. */
  encode(record: unknown, name: string): Buffer {
    const schema = this.current(name);
    const problems: string[] = [];
    if (!schema.type.isValid(record, { errorHook: (path) => problems.push(path.join('.')) })) {
      throw new WireError('record-invalid', `record does not match ${name} v${schema.version}: ${problems.join(', ')}`);
    }
    return Buffer.concat([SINGLE_OBJECT_MARKER, schema.fingerprint, schema.type.toBuffer(record)]);
  }

  /** The record's full name and value, read into the newest version of its record. */
  decode(data: Buffer): [string, Record<string, unknown>] {
    if (data.length < 10 || data[0] !== 0xc3 || data[1] !== 0x01) {
      throw new WireError('avro-not-single-object', 'the value does not start with C3 01');
    }
    const writer = this.byFingerprint.get(data.subarray(2, 10).toString('hex'));
    if (writer === undefined) {
      throw new WireError('avro-unknown-fingerprint', `no shipped schema has fingerprint ${data.subarray(2, 10).toString('hex')}`);
    }
    const reader = this.current(writer.name);
    let resolver = this.resolvers.get(writer.file);
    if (resolver === undefined) {
      resolver = reader.type.createResolver(writer.type);
      this.resolvers.set(writer.file, resolver);
    }
    const body = data.subarray(10);
    let decoded: { value: unknown; offset: number };
    try {
      decoded = reader.type.decode(body, 0, resolver);
    } catch (error) {
      throw new WireError('avro-corrupt', `the body is not a valid ${writer.name} v${writer.version}: ${(error as Error).message}`);
    }
    if (decoded.offset < 0) throw new WireError('avro-corrupt', `the body of ${writer.name} v${writer.version} is truncated`);
    if (decoded.offset !== body.length) {
      throw new WireError('avro-trailing-bytes', `${body.length - decoded.offset} bytes follow the record`);
    }
    return [writer.name, decoded.value as Record<string, unknown>];
  }
}

function defaultDirectory(): string {
  // dist/src/avro.js -> dist/avro
  return join(dirname(fileURLToPath(import.meta.url)), '..', 'avro');
}

let shared: SchemaCatalog | undefined;

/** The package's catalogue, loaded once. */
export function defaultCatalog(): SchemaCatalog {
  shared ??= SchemaCatalog.load();
  return shared;
}
