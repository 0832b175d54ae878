/**
 * The capability command (docs/wire-protocol.md, "Commands"), and how a worker decides
 * what to do with a record of `recovery.commands` before any handler runs: verify it
 * against the roster's controller keys, match the decoded id to the signed one, then
 * execute, answer a drill, or refuse a command past its deadline.
 */
import { CAPABILITY_COMMAND, defaultCatalog, WireError, type SchemaCatalog } from './avro.js';
import { parseJson, type JsonValue } from './canonical.js';
import { CONTENT_TYPE, CONTENT_TYPE_AVRO, HEADER_COMMAND_ID, headerValue, type Header } from './headers.js';
import { AuthenticationError, holdsRole, verifyRecord, type AuthRefusal, type Roster } from './roster.js';
import type { Lineage } from './envelope.js';
import type { Micros } from './time.js';

export const DRILL_OPERATION_PREFIX = 'drill-';

export interface CapabilityCommand {
  readonly command_id: string;
  readonly capability: string;
  readonly kind: string;
  readonly material: boolean;
  readonly params: { readonly [key: string]: JsonValue | undefined };
  readonly origin: string;
  readonly operation_id: string;
  readonly correlation_id: string;
  readonly causation_event_id: string;
  readonly machine_name: string;
  readonly machine_version: string;
  readonly machine_digest: string;
  readonly sequence: number;
  /** The operation's lineage as the command carries it (a command names no runtime). */
  readonly lineage: Required<Omit<Lineage, 'runtime'>>;
  readonly issued_at: Micros;
  readonly deadline: Micros | null;
  readonly idempotency_key: string | null;
}

/** The command in a decoded `recovery.CapabilityCommand` record. */
export function commandFromRecord(record: Record<string, unknown>): CapabilityCommand {
  const params = parseJson(String(record['params_json']));
  if (params === null || typeof params !== 'object' || Array.isArray(params)) {
    throw new WireError('record-invalid', `command ${String(record['command_id'])}: params_json is not a JSON object`);
  }
  const lineage = record['lineage'] as Required<Omit<Lineage, 'runtime'>>;
  return {
    command_id: String(record['command_id']),
    capability: String(record['capability']),
    kind: String(record['kind']),
    material: Boolean(record['material']),
    params: params as { [key: string]: JsonValue },
    origin: String(record['origin']),
    operation_id: String(record['operation_id']),
    correlation_id: String(record['correlation_id']),
    causation_event_id: String(record['causation_event_id']),
    machine_name: String(record['machine_name']),
    machine_version: String(record['machine_version']),
    machine_digest: String(record['machine_digest']),
    sequence: Number(record['sequence']),
    lineage: {
      agent: lineage.agent,
      task: lineage.task,
      initiating_principal: lineage.initiating_principal,
      origin_operation: lineage.origin_operation ?? null,
      parent_operation: lineage.parent_operation ?? null,
      delegated_credentials: [...(lineage.delegated_credentials ?? [])],
    },
    issued_at: Number(record['issued_at']),
    deadline: record['deadline'] === null || record['deadline'] === undefined ? null : Number(record['deadline']),
    idempotency_key: (record['idempotency_key'] as string | null | undefined) ?? null,
  };
}

export function isDrill(command: CapabilityCommand): boolean {
  return command.operation_id.startsWith(DRILL_OPERATION_PREFIX);
}

/** What a worker may do with one record, before its execution store is asked. */
export type Admission =
  | { readonly verdict: 'admitted'; readonly command: CapabilityCommand }
  | { readonly verdict: 'refused'; readonly code: AuthRefusal; readonly reason: string }
  | { readonly verdict: 'undecodable'; readonly reason: string };

/**
 * Verifies a command record: signed by a roster producer with role `controller` under a
 * key valid at `at`, carrying a `recovery-command-id` that the decoded command repeats.
 * Nothing of an unverified record is believed, its command id included.
 */
export function admitCommand(
  roster: Roster,
  topic: string,
  key: Buffer | null,
  value: Buffer | null,
  headers: readonly Header[],
  at: Micros,
  catalog: SchemaCatalog = defaultCatalog(),
): Admission {
  try {
    const entry = verifyRecord(roster, topic, key, value, headers, at);
    if (!holdsRole(entry, 'controller')) {
      return { verdict: 'refused', code: 'role-not-permitted', reason: `producer ${entry.id} is not a controller` };
    }
  } catch (error) {
    if (error instanceof AuthenticationError) return { verdict: 'refused', code: error.code, reason: error.message };
    throw error;
  }
  const signedId = headerValue(headers, HEADER_COMMAND_ID);
  if (signedId === null) return { verdict: 'refused', code: 'identity-mismatch', reason: 'no command id header' };
  let command: CapabilityCommand;
  try {
    const contentType = headerValue(headers, CONTENT_TYPE);
    if (contentType !== null && contentType.split(';')[0]!.trim().toLowerCase() !== CONTENT_TYPE_AVRO) {
      throw new WireError('wire-unsupported-content-type', `commands are Avro, not ${contentType}`);
    }
    if (value === null || value.length === 0) throw new WireError('wire-empty', 'the command has no value');
    const [name, record] = catalog.decode(value);
    if (name !== CAPABILITY_COMMAND) throw new WireError('schema-unknown', `a ${name} record is not a command`);
    command = commandFromRecord(record);
  } catch (error) {
    return { verdict: 'undecodable', reason: (error as Error).message };
  }
  if (command.command_id !== signedId) {
    return {
      verdict: 'refused',
      code: 'identity-mismatch',
      reason: `command id ${command.command_id} is not the signed ${signedId}`,
    };
  }
  return { verdict: 'admitted', command };
}

/** Whether a command is past its deadline at `now` (a deadline equal to now has passed). */
export function deadlinePassed(command: CapabilityCommand, now: Micros): boolean {
  return command.deadline !== null && now >= command.deadline;
}
