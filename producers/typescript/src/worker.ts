/**
 * A capability worker (docs/wire-protocol.md, "What a worker guarantees"): reads
 * `recovery.commands` in a consumer group with auto-commit off, verifies every record
 * against the roster's controller keys before it believes anything in it, executes each
 * authenticated command id at most once through its execution store (claim on disk before
 * the handler, answer on disk before the report), refuses commands past their deadline,
 * answers drills without the handler, reports results as events, and commits a record's
 * offset only after its result is acknowledged. The crash semantics are the Python
 * worker's (`producers/worker.py`): a command in flight when the worker died is reported
 * as an unknown outcome, never executed again.
 */
import { createHash } from 'node:crypto';
import kafkaPackage from '@confluentinc/kafka-javascript';
import { admitCommand, deadlinePassed, isDrill, type CapabilityCommand } from './command.js';
import type { EvidencePayload } from './envelope.js';
import { HEADER_COMMAND_ID, headerValue, type Header } from './headers.js';
import { kafkaSettings, type KafkaSettings } from './kafka.js';
import type { Roster } from './roster.js';
import { RESULT_EVENTS, type RecoveryClient } from './client.js';
import type { ExecutionStore, StoredAnswer } from './store.js';
import { fromDate, type Micros } from './time.js';

const { Kafka } = kafkaPackage.KafkaJS;
type Consumer = ReturnType<InstanceType<typeof Kafka>['consumer']>;

export const DEADLINE_EXPIRED = 'deadline-expired';
export const OUTCOME_UNKNOWN = 'outcome-unknown';

/** What a handler did. `completed_at` is the result's event time (else `issued_at`). */
export interface ActionResult {
  succeeded: boolean;
  evidence?: EvidencePayload | null;
  event_type?: string | null;
  evidence_ref?: string | null;
  completed_at?: Micros | null;
}

/** A handler: null means nothing to report (the machine does not wait for it). */
export type Handler = (command: CapabilityCommand) => Promise<ActionResult | null> | ActionResult | null;

export interface WorkerStats {
  consumed: number;
  executed: number;
  reported: number;
  skipped: number;
  undecodable: number;
  replayed: number;
  outcomeUnknown: number;
  expired: number;
  drills: number;
  refused: Record<string, number>;
}

export interface WorkerOptions {
  groupId: string;
  roster: Roster;
  store: ExecutionStore;
  client: RecoveryClient;
  handlers: Readonly<Record<string, Handler>>;
  bootstrap?: string;
  /** Else `RECOVERY_TOPIC_COMMANDS` or `recovery.commands`. */
  commandsTopic?: string;
  /** Where a group without committed offsets starts: `latest` (default) or `earliest`. */
  start?: 'latest' | 'earliest';
  consumerConfig?: KafkaSettings;
  clock?: () => Micros;
  log?: (line: string) => void;
}

/** The drill verifier's answer: `params.demo_outcome` when given, else even or odd first
 * byte of SHA-256(operation id), as the Python worker's `verify_outcome`. */
export function verifyOutcome(command: CapabilityCommand): 'found' | 'not_found' {
  const forced = command.params['demo_outcome'];
  if (forced === 'found' || forced === 'not_found') return forced;
  return createHash('sha256').update(command.operation_id, 'utf8').digest()[0]! % 2 === 0 ? 'found' : 'not_found';
}

/** A drill's answer: verification by `verifyOutcome`, other result kinds succeed. */
export function drillAnswer(command: CapabilityCommand): ActionResult | null {
  const reference = `drill:${command.command_id}`;
  if (command.kind === 'verify') {
    const outcome = verifyOutcome(command) === 'found' ? 'applied' : 'not_applied';
    return { succeeded: true, evidence: { outcome, reference }, evidence_ref: reference };
  }
  return command.kind in RESULT_EVENTS ? { succeeded: true, evidence_ref: reference } : null;
}

export class CapabilityWorker {
  readonly stats: WorkerStats = {
    consumed: 0,
    executed: 0,
    reported: 0,
    skipped: 0,
    undecodable: 0,
    replayed: 0,
    outcomeUnknown: 0,
    expired: 0,
    drills: 0,
    refused: {},
  };
  readonly topic: string;
  private readonly consumer: Consumer;
  private readonly clock: () => Micros;
  private readonly log: (line: string) => void;
  private assignedResolve: (() => void) | undefined;
  /** Resolves once the group has assigned this member its partitions. */
  readonly assigned: Promise<void>;

  constructor(private readonly options: WorkerOptions) {
    this.topic = options.commandsTopic ?? process.env['RECOVERY_TOPIC_COMMANDS'] ?? 'recovery.commands';
    this.clock = options.clock ?? (() => fromDate(new Date()));
    this.log = options.log ?? ((line) => process.stderr.write(line + '\n'));
    this.assigned = new Promise((resolve) => (this.assignedResolve = resolve));
    const config = {
      ...kafkaSettings(options.bootstrap),
      'group.id': options.groupId,
      'auto.offset.reset': options.start ?? 'latest',
      ...(options.consumerConfig ?? {}),
      // Offsets are committed by hand, after the results are acknowledged.
      'enable.auto.commit': false,
    };
    this.consumer = new Kafka({}).consumer(config as never);
  }

  /** Consumes until `stop()`; each record is settled (executed, reported, committed) in turn. */
  async run(): Promise<void> {
    await this.consumer.connect();
    await this.consumer.subscribe({ topics: [this.topic] });
    await this.consumer.run({
      eachMessage: async ({ topic, partition, message }) => {
        const headers = headerPairs(message.headers);
        await this.handle(topic, message.key, message.value, headers);
        // Results first, offsets second: a crash in between re-delivers the command,
        // which the store answers without executing it again.
        await this.consumer.commitOffsets([{ topic, partition, offset: String(BigInt(message.offset) + 1n) }]);
      },
    });
    void this.watchAssignment();
  }

  private async watchAssignment(): Promise<void> {
    for (let i = 0; i < 600; i++) {
      if (this.consumer.assignment().length > 0) {
        this.assignedResolve?.();
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }

  async stop(): Promise<void> {
    await this.consumer.disconnect();
  }

  /** One record of the commands topic, from verification to its reported result. */
  async handle(topic: string, key: Buffer | null, value: Buffer | null, headers: readonly Header[]): Promise<void> {
    this.stats.consumed += 1;
    const admission = admitCommand(this.options.roster, topic, key, value, headers, this.clock());
    if (admission.verdict === 'refused') {
      this.stats.refused[admission.code] = (this.stats.refused[admission.code] ?? 0) + 1;
      this.log(`worker: refused command ${headerValue(headers, HEADER_COMMAND_ID) ?? '?'}: ${admission.code}: ${admission.reason}; not executed`);
      return;
    }
    if (admission.verdict === 'undecodable') {
      this.stats.undecodable += 1;
      this.log(`worker: skipping undecodable command: ${admission.reason}`);
      return;
    }
    const command = admission.command;
    const handler = this.options.handlers[command.capability];
    if (handler === undefined) {
      this.stats.skipped += 1; // another worker group serves this capability
      return;
    }
    await this.execute(command, handler);
  }

  private async execute(command: CapabilityCommand, handler: Handler): Promise<void> {
    const store = this.options.store;
    const found = store.lookup(command.command_id);
    if (found !== null) {
      if (found.state === 'done' && found.answer !== null) {
        this.stats.replayed += 1;
        await this.report(command, found.answer);
      } else {
        this.stats.outcomeUnknown += 1;
        this.log(`worker: command ${command.command_id} was in flight when a worker stopped: ${OUTCOME_UNKNOWN}; not executed again`);
        await this.finish(command, this.ownAnswer(command, OUTCOME_UNKNOWN));
      }
      return;
    }
    const now = this.clock();
    if (deadlinePassed(command, now)) {
      this.stats.expired += 1;
      this.log(`worker: command ${command.command_id} refused: ${DEADLINE_EXPIRED}; not executed`);
      store.claim(command.command_id, command.capability);
      await this.finish(command, this.ownAnswer(command, DEADLINE_EXPIRED));
      return;
    }
    if (!store.claim(command.command_id, command.capability)) return; // claimed meanwhile
    if (isDrill(command)) {
      this.stats.drills += 1;
      await this.finish(command, stored(drillAnswer(command)));
      return;
    }
    this.stats.executed += 1;
    let result: ActionResult | null;
    try {
      result = await handler(command);
    } catch (error) {
      this.log(`worker: command ${command.command_id} failed: ${(error as Error).message}`);
      result = { succeeded: false, evidence_ref: `error:${(error as Error).name}` };
    }
    await this.finish(command, stored(result));
  }

  private ownAnswer(command: CapabilityCommand, code: string): StoredAnswer {
    const reportable = command.kind === 'verify' || command.kind in RESULT_EVENTS;
    return {
      reported: reportable,
      succeeded: false,
      evidence: null,
      event_type: null,
      evidence_ref: `${code}:${command.command_id}`,
      completed_at: null,
    };
  }

  private async finish(command: CapabilityCommand, answer: StoredAnswer): Promise<void> {
    // Recorded before it is reported: a crash after this reports the same answer again.
    this.options.store.record(command.command_id, answer);
    await this.report(command, answer);
  }

  private async report(command: CapabilityCommand, answer: StoredAnswer): Promise<void> {
    if (!answer.reported) return;
    const envelope = this.options.client.actionResult(command, answer.succeeded, answer.evidence, {
      event_type: answer.event_type,
      evidence_ref: answer.evidence_ref,
      event_time: answer.completed_at,
    });
    await this.options.client.publisher.publish(envelope);
    this.stats.reported += 1;
  }
}

function stored(result: ActionResult | null): StoredAnswer {
  if (result === null) {
    return { reported: false, succeeded: false, evidence: null, event_type: null, evidence_ref: null, completed_at: null };
  }
  return {
    reported: true,
    succeeded: result.succeeded,
    evidence: result.evidence ?? null,
    event_type: result.event_type ?? null,
    evidence_ref: result.evidence_ref ?? null,
    completed_at: result.completed_at ?? null,
  };
}

/** Consumed headers (a name to one value or several) as ordered pairs. */
export function headerPairs(headers: Record<string, unknown> | undefined): Header[] {
  const pairs: Header[] = [];
  for (const [name, value] of Object.entries(headers ?? {})) {
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item === undefined) continue;
      pairs.push([name, item === null ? null : Buffer.isBuffer(item) ? item : Buffer.from(String(item), 'utf8')]);
    }
  }
  return pairs;
}
