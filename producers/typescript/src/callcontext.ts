/**
 * Call contexts (docs/wire-protocol.md, "Call contexts"): the affected agent proven by
 * its runtime, not named by a tool. Before a tool call, the agent's runtime (a roster
 * producer holding `orchestrator` for the agent) signs a context binding the operation
 * id to the exact lineage the tool will report, valid for minutes; the tool forwards it,
 * unchanged, in the `recovery-call-context` header of the event that opens the operation,
 * and the controller believes the lineage because the runtime signed it.
 *
 * `issueCallContext` is the runtime's side (the bytes are those of the Python
 * `machines.issue_call_context`); `callContextClaims` is the tool's: the operation id and
 * lineage a context names, unverified, which `RecoveryClient.publishEvent` puts on the
 * event it forwards the context with.
 */
import type { KeyObject } from 'node:crypto';
import { canonicalJson, isJsonObject, parseJson, type JsonValue } from './canonical.js';
import { lineageContent, type Lineage } from './envelope.js';
import { ed25519Sign, keyId } from './keys.js';
import { isoformat, type Micros } from './time.js';

export const CALL_CONTEXT_FORMAT = 'call-context/1';
/** Prefixed to the canonical JSON of the context: the bytes the runtime signs. */
export const CALL_CONTEXT_DOMAIN = 'agent-recovery call-context/1\n';
export const HEADER_CALL_CONTEXT = 'recovery-call-context';
/** The header's value, at most (bytes of UTF-8). */
export const MAX_CALL_CONTEXT_BYTES = 8 * 1024;
/** How long a context may be valid, at most: 24 hours. */
export const MAX_CALL_CONTEXT_LIFETIME: Micros = 24 * 3600 * 1_000_000;
/** How far ahead of the controller's clock `issued_at` may be: 5 minutes. */
export const CALL_CONTEXT_CLOCK_SKEW: Micros = 5 * 60 * 1_000_000;

export class CallContextError extends Error {
  override name = 'CallContextError';
}

/** The context's time form: RFC 3339 in UTC with `Z` (`2026-06-01T11:59:00Z`). */
function contextTime(micros: Micros): string {
  return isoformat(micros).replace('+00:00', 'Z');
}

/** The exact bytes a runtime signs for `context` (the object under `"context"`). */
export function callContextMessage(context: { [key: string]: JsonValue }): Buffer {
  return Buffer.concat([Buffer.from(CALL_CONTEXT_DOMAIN, 'utf8'), canonicalJson(context)]);
}

/**
 * The call context `issuer` (a runtime or orchestrator in the roster, with its private
 * key) signs for the call that becomes `operationId`, valid from `now` for `lifetime`
 * (microseconds, more than 0 and at most 24 h; default 15 minutes): the header value,
 * canonical JSON of `{"context": ..., "signature": ...}`. The lineage must be exactly the
 * one the tool's event will carry.
 */
export function issueCallContext(
  issuer: string,
  privateKey: KeyObject,
  operationId: string,
  lineage: Lineage,
  options: { now: Micros; lifetime?: Micros },
): string {
  const lifetime = options.lifetime ?? 15 * 60 * 1_000_000;
  if (!(lifetime > 0 && lifetime <= MAX_CALL_CONTEXT_LIFETIME)) {
    throw new CallContextError(`a call context lives more than 0 and at most 24 hours, not ${lifetime} µs`);
  }
  const context: { [key: string]: JsonValue } = {
    format: CALL_CONTEXT_FORMAT,
    operation_id: operationId,
    lineage: lineageContent(lineage),
    issuer,
    key_id: keyId(privateKey),
    issued_at: contextTime(options.now),
    expires_at: contextTime(options.now + lifetime),
  };
  const signature = ed25519Sign(privateKey, callContextMessage(context)).toString('base64');
  const text = canonicalJson({ context, signature }).toString('utf8');
  if (Buffer.byteLength(text, 'utf8') > MAX_CALL_CONTEXT_BYTES) {
    throw new CallContextError(`call context for operation ${operationId} is larger than ${MAX_CALL_CONTEXT_BYTES} bytes; the controller would refuse it`);
  }
  return text;
}

/**
 * The operation id and lineage call context `text` names, unverified (the controller
 * verifies it): what a tool that forwards the context reports. Throws
 * `CallContextError` for text that is no call context.
 */
export function callContextClaims(text: string): { operationId: string; lineage: Lineage } {
  if (Buffer.byteLength(text, 'utf8') > MAX_CALL_CONTEXT_BYTES) {
    throw new CallContextError(`a call context is at most ${MAX_CALL_CONTEXT_BYTES} bytes`);
  }
  let document: JsonValue;
  try {
    document = parseJson(text);
  } catch (error) {
    throw new CallContextError(`not a call context: not JSON (${(error as Error).message})`);
  }
  const object = (v: JsonValue | undefined): { [key: string]: JsonValue | undefined } | null => (isJsonObject(v) ? v : null);
  const context = object(object(document)?.['context']);
  const lineage = object(context?.['lineage']);
  const str = (v: JsonValue | undefined): string | null => (typeof v === 'string' ? v : null);
  const operationId = str(context?.['operation_id']);
  if (context === null || lineage === null || operationId === null) {
    throw new CallContextError('not a call context: expected {"context": {"operation_id", "lineage", ...}, "signature"}');
  }
  const required = ['agent', 'task', 'initiating_principal'].map((name) => str(lineage[name]));
  if (required.some((v) => v === null)) {
    throw new CallContextError('not a call context: its lineage lacks agent, task or initiating_principal');
  }
  const credentials = lineage['delegated_credentials'];
  if (credentials !== undefined && credentials !== null && !(Array.isArray(credentials) && credentials.every((c) => typeof c === 'string'))) {
    throw new CallContextError('not a call context: lineage.delegated_credentials is not a list of strings');
  }
  return {
    operationId,
    lineage: {
      agent: required[0]!,
      task: required[1]!,
      initiating_principal: required[2]!,
      origin_operation: str(lineage['origin_operation']),
      parent_operation: str(lineage['parent_operation']),
      delegated_credentials: ((credentials as string[] | null | undefined) ?? []).slice(),
      runtime: str(lineage['runtime']),
    },
  };
}
