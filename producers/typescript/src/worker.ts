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
 *
 * Where it reads is the Python worker's too (docs/capability-worker.md, "Where a new group
 * starts"): a group with committed offsets goes on from them; a partition without one
 * starts at the start position (`latest`, the default, `earliest`, or a time), resolved
 * when the partition is assigned, and a `latest` start is committed at once, so a member
 * that dies before its first command does not let the next one start later still and
 * miss what was published in between. A committed offset that fell out of the log
 * (retention) restarts at the oldest record (`auto.offset.reset=earliest`), and the
 * execution store keeps it from running anything twice.
 */
import { createHash } from 'node:crypto';
import kafkaPackage from '@confluentinc/kafka-javascript';
import { admitCommand, deadlinePassed, isDrill, type CapabilityCommand } from './command.js';
import type { EvidencePayload } from './envelope.js';
import { HEADER_COMMAND_ID, headerValue, type Header } from './headers.js';
import { kafkaSettings, type KafkaSettings } from './kafka.js';
import { holdsRole, type Roster } from './roster.js';
import { RESULT_EVENTS, type RecoveryClient } from './client.js';
import type { ExecutionStore, StoredAnswer } from './store.js';
import { fromDate, parseInstant, toDate, type Micros } from './time.js';

const { Kafka, ErrorCodes, IsolationLevel } = kafkaPackage.KafkaJS;
type Consumer = ReturnType<InstanceType<typeof Kafka>['consumer']>;
type Admin = ReturnType<Consumer['dependentAdmin']>;
type Assigned = { topic: string; partition: number; offset?: number | string };

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

/** Where a worker group without committed offsets starts on a partition: its end when
 * assigned (`latest`), its beginning (`earliest`), or the first record at or after a
 * time (microseconds since the epoch). A group with committed offsets goes on from them. */
export type StartPosition =
  | { readonly mode: 'latest' }
  | { readonly mode: 'earliest' }
  | { readonly mode: 'time'; readonly at: Micros };

export const ENV_WORKER_START = 'RECOVERY_WORKER_START';

export class WorkerError extends Error {
  override name = 'WorkerError';
}

/** `latest`, `earliest` or an ISO 8601 time with its UTC offset (`2026-12-01T08:00:00+00:00`,
 * `2026-12-01T08:00Z`), as the Python worker's `StartPosition.parse`; throws `WorkerError`. */
export function parseStartPosition(text: string): StartPosition {
  const value = text.trim();
  if (value === 'latest' || value === 'earliest') return { mode: value };
  const at = parseInstant(value);
  if (at === null) {
    throw new WorkerError(
      `worker start position ${JSON.stringify(text)}: expected latest, earliest or an ISO 8601 time with a UTC offset (2026-12-01T00:00:00+00:00)`,
    );
  }
  return { mode: 'time', at };
}

/** `RECOVERY_WORKER_START`, else `latest`. */
export function startFromEnv(env: NodeJS.ProcessEnv = process.env): StartPosition {
  const text = env[ENV_WORKER_START];
  return text ? parseStartPosition(text) : { mode: 'latest' };
}

function describeStart(start: StartPosition): string {
  return start.mode === 'time' ? toDate(start.at).toISOString() : start.mode;
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
  /** Where a group without committed offsets starts: a `StartPosition` or its text
   * (`parseStartPosition`); else `RECOVERY_WORKER_START`, else `latest`. */
  start?: StartPosition | string;
  /** How long one positioning step (committed offsets, offsets of the log) may take. */
  timeoutMs?: number;
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
  readonly start: StartPosition;
  private readonly consumer: Consumer;
  private readonly clock: () => Micros;
  private readonly log: (line: string) => void;
  private readonly timeoutMs: number;
  private admin: Admin | undefined;
  private settled: { resolve: () => void; reject: (error: Error) => void } | undefined;
  /** Resolves once the group has assigned this member its partitions and each has its
   * position (the start position resolved, and a `latest` start committed); rejects
   * when they cannot be positioned, and the worker stops. */
  readonly assigned: Promise<void>;

  constructor(private readonly options: WorkerOptions) {
    this.topic = options.commandsTopic ?? process.env['RECOVERY_TOPIC_COMMANDS'] ?? 'recovery.commands';
    this.clock = options.clock ?? (() => fromDate(new Date()));
    this.log = options.log ?? ((line) => process.stderr.write(line + '\n'));
    this.timeoutMs = options.timeoutMs ?? 30_000;
    const start = options.start ?? startFromEnv();
    this.start = typeof start === 'string' ? parseStartPosition(start) : start;
    // Fail closed: without a controller in the roster every command would be refused.
    if (!options.roster.producers.some((p) => holdsRole(p, 'controller'))) {
      throw new WorkerError(
        "the worker's roster lists no producer with role `controller`: every command would be refused; add the controller's public key to it",
      );
    }
    this.assigned = new Promise((resolve, reject) => (this.settled = { resolve, reject }));
    this.assigned.catch(() => undefined); // a caller that never waits for it is told by the log
    const config = {
      ...kafkaSettings(options.bootstrap),
      log_level: 4, // the client's own notices from warnings up (consumerConfig may lower it)
      ...(options.consumerConfig ?? {}),
      'group.id': options.groupId,
      // Only for a committed offset that fell out of the log (retention): go on from the
      // oldest record; the execution store keeps it from running twice. A partition
      // without a committed offset is positioned when it is assigned (`position`).
      'auto.offset.reset': 'earliest',
      // Offsets are committed by hand, after the results are acknowledged.
      'enable.auto.commit': false,
      rebalance_cb: (error: { code: number }, assignment: Assigned[]) => this.onRebalance(error, assignment),
    };
    this.consumer = new Kafka({}).consumer(config as never);
  }

  /** Consumes until `stop()`; each record is settled (executed, reported, committed) in turn. */
  async run(): Promise<void> {
    await this.consumer.connect();
    this.admin = this.consumer.dependentAdmin();
    await this.admin.connect();
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
  }

  async stop(): Promise<void> {
    await this.admin?.disconnect();
    this.admin = undefined;
    await this.consumer.disconnect();
  }

  /** The group's rebalance: an assignment is positioned (`position`) before any record
   * of it is read; a revocation takes the default path. */
  private async onRebalance(error: { code: number }, assignment: Assigned[]): Promise<Assigned[] | null> {
    if (error.code !== ErrorCodes.ERR__ASSIGN_PARTITIONS || assignment.length === 0) return null;
    try {
      return await this.position(assignment);
    } catch (failure) {
      // Positioned by nothing, a partition would start at the oldest record and run the
      // topic's history: take none, say why, and stop.
      this.fail(failure as Error);
      return [];
    }
  }

  private fail(failure: Error): void {
    this.log(`worker: could not position ${this.topic}: ${failure.message}; stopping`);
    this.settled?.reject(new WorkerError(`could not position ${this.topic}: ${failure.message}`));
    setImmediate(() => void this.stop().catch(() => undefined));
  }

  /**
   * Each assigned partition at the group's committed offset, else at the start position;
   * a `latest` start is committed once the assignment is applied, so that a member that
   * dies before its first command does not let the next one start later still.
   */
  private async position(assignment: Assigned[]): Promise<Assigned[]> {
    const partitions = assignment.map(({ topic, partition }) => ({ topic, partition }));
    const stored = await this.committedOffsets();
    const fresh = partitions.filter((p) => !((stored.get(p.partition) ?? -1) >= 0));
    const starts = fresh.length > 0 ? await this.startOffsets() : new Map<number, number>();
    const positioned = partitions.map((p) => {
      const at = (stored.get(p.partition) ?? -1) >= 0 ? stored.get(p.partition) : starts.get(p.partition);
      if (at === undefined) throw new WorkerError(`no start offset for partition ${p.partition} of ${p.topic}`);
      return { ...p, offset: at };
    });
    const started = positioned.filter((p) => fresh.some((f) => f.partition === p.partition));
    if (started.length > 0) {
      this.log(`worker: group starts ${started.length} partition(s) of ${this.topic} at ${describeStart(this.start)}`);
    }
    // The client applies the assignment when this returns; commit after it.
    setImmediate(() => void this.settleAssignment(this.start.mode === 'latest' ? started : []));
    return positioned;
  }

  /** The group's committed offset on each partition of the topic (negative: none). Read
   * with the admin API: the consumer's `committed()` of this client reads a committed
   * offset 0 as none (1.10.1), which would move a new group's start past a command. */
  private async committedOffsets(): Promise<Map<number, number>> {
    const admin = this.admin;
    if (admin === undefined) throw new WorkerError('the worker is not running');
    const groups = await admin.fetchOffsets({ groupId: this.options.groupId, topics: [this.topic], timeout: this.timeoutMs });
    const found = new Map<number, number>();
    for (const { topic, partitions } of groups) {
      if (topic === this.topic) for (const p of partitions) found.set(p.partition, Number(p.offset));
    }
    return found;
  }

  /** The start position's offset on each partition of the topic (`earliest`: -2, the
   * beginning of the log as the client resolves it). */
  private async startOffsets(): Promise<Map<number, number>> {
    const admin = this.admin;
    if (admin === undefined) throw new WorkerError('the worker is not running');
    if (this.start.mode === 'earliest') {
      const offsets = await admin.fetchTopicOffsets(this.topic, { timeout: this.timeoutMs, isolationLevel: IsolationLevel.READ_UNCOMMITTED });
      return new Map(offsets.map((o) => [o.partition, -2]));
    }
    // `latest`: the end of each partition now; a time: the first record at or after it,
    // the end where there is none.
    const at = this.start.mode === 'time' ? Math.floor(this.start.at / 1000) : undefined;
    const offsets = await admin.fetchTopicOffsetsByTimestamp(this.topic, at, { timeout: this.timeoutMs, isolationLevel: IsolationLevel.READ_UNCOMMITTED });
    return new Map(offsets.map((o) => [o.partition, Number(o.offset)]));
  }

  /** Commits a `latest` start and waits, bounded, until the group's coordinator has it
   * (the client's commit only queues it); then the member counts as assigned. */
  private async settleAssignment(started: Assigned[]): Promise<void> {
    try {
      if (started.length > 0) {
        const wanted = started.map(({ topic, partition, offset }) => ({ topic, partition, offset: String(offset) }));
        await this.consumer.commitOffsets(wanted);
        const deadline = Date.now() + this.timeoutMs;
        for (;;) {
          const stored = await this.committedOffsets();
          if (wanted.every((w) => stored.get(w.partition) === Number(w.offset))) break;
          if (Date.now() > deadline) throw new WorkerError(`the group's coordinator did not confirm its start within ${this.timeoutMs} ms`);
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      }
    } catch (error) {
      this.fail(error as Error);
      return;
    }
    this.settled?.resolve();
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
