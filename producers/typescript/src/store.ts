/**
 * The worker's execution store (docs/wire-protocol.md, "The execution store"): a durable
 * record, by authenticated command id, of what the worker executed. A command id is
 * claimed on disk before its handler runs and the handler's answer recorded before it is
 * reported, so a redelivered command is answered from the store (done) or reported as an
 * unknown outcome (claimed: the worker died while it ran), never executed twice.
 *
 * SQLite through better-sqlite3 in WAL mode with `synchronous=FULL` (every commit
 * fsynced), the table layout of the Python worker's store (`producers/execution_store.py`).
 */
import Database from 'better-sqlite3';
import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import type { EvidencePayload } from './envelope.js';

const SCHEMA = `
CREATE TABLE IF NOT EXISTS executions (
    command_id  TEXT PRIMARY KEY,
    capability  TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('claimed', 'done')),
    claimed_at  TEXT NOT NULL,
    done_at     TEXT,
    answer      TEXT
)`;

/** A handler's answer as recorded (`reported` false: nothing to report). */
export interface StoredAnswer {
  readonly reported: boolean;
  readonly succeeded: boolean;
  readonly evidence: EvidencePayload | null;
  readonly event_type: string | null;
  readonly evidence_ref: string | null;
  /** Microseconds since the epoch; the result's event time when set. */
  readonly completed_at: number | null;
}

export interface Execution {
  readonly commandId: string;
  readonly capability: string;
  readonly state: 'claimed' | 'done';
  readonly answer: StoredAnswer | null;
}

export class ExecutionStore {
  private readonly db: Database.Database;

  constructor(readonly path: string) {
    mkdirSync(dirname(path), { recursive: true });
    this.db = new Database(path);
    this.db.pragma('journal_mode = WAL');
    // FULL: each commit is fsynced, so a claim is on disk before the handler acts.
    this.db.pragma('synchronous = FULL');
    this.db.exec(SCHEMA);
  }

  lookup(commandId: string): Execution | null {
    const row = this.db
      .prepare('SELECT capability, state, answer FROM executions WHERE command_id = ?')
      .get(commandId) as { capability: string; state: 'claimed' | 'done'; answer: string | null } | undefined;
    if (row === undefined) return null;
    return {
      commandId,
      capability: row.capability,
      state: row.state,
      answer: row.answer === null ? null : (JSON.parse(row.answer) as StoredAnswer),
    };
  }

  /** Claims `commandId` durably; true when this call claimed it. */
  claim(commandId: string, capability: string, at: Date = new Date()): boolean {
    const result = this.db
      .prepare(
        "INSERT INTO executions (command_id, capability, state, claimed_at) VALUES (?, ?, 'claimed', ?) ON CONFLICT (command_id) DO NOTHING",
      )
      .run(commandId, capability, at.toISOString());
    return result.changes === 1;
  }

  /** Records the answer of a claimed command, durably, before it is reported. */
  record(commandId: string, answer: StoredAnswer, at: Date = new Date()): void {
    const result = this.db
      .prepare("UPDATE executions SET state = 'done', done_at = ?, answer = ? WHERE command_id = ? AND state = 'claimed'")
      .run(at.toISOString(), JSON.stringify(answer), commandId);
    if (result.changes !== 1) throw new Error(`command ${commandId}: no claim to record an answer on`);
  }

  counts(): { claimed: number; done: number } {
    const rows = this.db.prepare('SELECT state, count(*) AS n FROM executions GROUP BY state').all() as Array<{ state: string; n: number }>;
    const found = Object.fromEntries(rows.map((r) => [r.state, r.n]));
    return { claimed: found['claimed'] ?? 0, done: found['done'] ?? 0 };
  }

  close(): void {
    this.db.close();
  }
}
