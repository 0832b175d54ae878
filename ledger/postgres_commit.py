"""One batch commit in PostgreSQL: the statements `PostgresLedger.commit` runs.

In one transaction, in this order (the lock order every writer follows, so two writers
never deadlock):

1. One pipelined round trip of BEGIN, reads and locks (`_read`): the partition epochs
   (share-locked, so a concurrent claim waits for us and a zombie gets `FencedError`),
   the operations the batch continues (`FOR UPDATE`, in id order) with their versions
   and chain heads, event ids and nonces stored for something else, the lineage step's
   advisory locks and first walk (`ledger.postgres_lineage`), and the intake chains of
   the batch's dead letters (`ledger.deadletters`). Nothing is checked before all of
   them are back; a refusal then rolls the transaction back, as before any write.
2. In Python: the checks, the lineage plan, the audit chains onto the locked heads.
3. One pipelined round trip of set-based writes: the operations the batch opens (with
   their lineage columns), the folded views of those it continues, the lineage columns
   of other rows the step changed, the intake chain heads, the offsets.
4. In the same pipeline, the timers the decisions armed, disarmed and spent
   (`ledger.records.TimerRows`, migration 0014), and the append-only rows (events,
   decisions, evidence, approvals, audit records, outbox rows): one INSERT over
   `unnest`ed column arrays per table, at every batch size. Then the cascade events
   the step planned (kept when stored), and the dead letters that follow them. A batch
   that opens no operation and cascades nothing sends COMMIT in step 3's round trip
   too: two round trips in all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from ledger.audit import AuditRecord, ChainHead, chain_records, genesis_hash, genesis_head
from ledger.cascade import LineagePlan, lineage_message
from ledger.claims import check_claims, claim_message
from ledger.codec import facts_to_json, view_json
from ledger.deadletters import (
    DeadLetterRow,
    intake_reads,
    intake_writes,
    plan_dead_letters,
)
from ledger.errors import (
    EventIdReused,
    FencedError,
    NonceReused,
    VersionConflict,
    fenced_message,
    opened_message,
    reuse_message,
    version_message,
)
from ledger.interface import CommitResult
from ledger.jsonutil import column_json, dumps
from ledger.lineage_step import lineage_moved
from ledger.postgres_arrays import Int8Array, TextArray, column_arrays
from ledger.postgres_lineage import (
    insert_cascade,
    lineage_columns,
    lineage_reads,
    lineage_step,
    write_lineage,
)
from ledger.queries import QUERIES
from ledger.records import (
    Batch,
    BatchRows,
    EventRow,
    OperationRow,
    OutboxRow,
    TimerRows,
    audit_bodies,
    command_lineage,
    finish_outbox,
    heads_row,
)
from machines import ClaimKey, KeyClaim, LineageRow

__all__ = ["read_claims", "write_batch"]

Conn = psycopg.Connection[TupleRow]
Rows = list[TupleRow]


@dataclass(frozen=True, slots=True)
class _Reads:
    """What the first round trip of a commit read (empty where nothing was asked)."""

    epochs: Rows
    locked: Rows
    reused_events: Rows
    reused_nonces: Rows
    walk: Rows | None  # None: the batch needs no lineage step
    intake_heads: dict[str, ChainHead]


def write_batch(conn: Conn, batch: Batch, plan: BatchRows) -> CommitResult:
    """Write `plan` (planned from `batch`) in one transaction on `conn` and store the
    batch's offsets: the body of `PostgresLedger.commit`, whose caller translates driver
    errors and retries a lost connection. Raises `FencedError`, `VersionConflict`,
    `EventIdReused` or `NonceReused` before anything is written."""
    with ExitStack() as transaction:
        reads = _read(conn, batch, plan, transaction)
        _check_fences(batch, reads.epochs)
        heads = _check_versions(plan, reads.locked)
        _check_ids(plan, reads.reused_events, reads.reused_nonces)
        plan, lineage = lineage_step(conn, plan, batch, reads.walk)
        chained = {
            op: chain_records(op, heads[op], bodies) for op, bodies in audit_bodies(plan).items()
        }
        intake, letters = plan_dead_letters(
            batch.dead_letters,
            reads.intake_heads,
            batch.topics.audit,
            batch.topics.dlq,
            batch.sign,
        )
        # The outbox keeps its insertion order: the batch's rows, the cascade events,
        # then the dead letters. Without cascade events (nearly always) the dead letters
        # ride with the batch's rows.
        late = bool(plan.cascade) and bool(letters)
        records = [r for rs in (*chained.values(), *intake.values()) for r in rs]
        # With nothing left to check or write after them (no operation opened, whose
        # insert another writer may have won; no cascade), COMMIT rides in their round trip.
        commit_now = not plan.cascade and not any(r.opens for r in plan.operations)
        opened = claimed = None
        outbox: list[OutboxRow] = []
        closing = False  # the transaction's own exit spent: a failure is ours to roll back
        try:
            with conn.pipeline():
                opened = _insert_opened(conn, plan, chained, lineage)
                claimed = _insert_claims(conn, plan)
                _update_operations(conn, plan, heads, chained)
                _write_timers(conn, plan.timers)
                write_lineage(conn, plan, lineage)
                intake_writes(conn, intake)
                _store_offsets(conn, batch)
                _insert_tables(conn, _append_rows(plan, records))
                # Each statement above left for the server as it was queued: it writes
                # them while this process signs the outbox rows, the batch's costliest
                # Python, instead of one waiting for the other (docs/PERFORMANCE.md,
                # seventh round).
                outbox = finish_outbox(
                    plan,
                    chained,
                    batch.topics,
                    audit_payloads=False,
                    sign=batch.sign,
                    lineages=_lineages(plan, reads.locked),
                )
                anchor = heads_row({**chained, **intake}, batch.topics, batch.sign)
                if anchor is not None:
                    outbox.append(anchor)
                _insert_tables(conn, _outbox_rows(outbox, () if late else letters))
                if commit_now:
                    closing = True
                    transaction.close()
        except psycopg.Error:
            # A refusal that came back before COMMIT was queued (while the outbox was
            # signed) leaves the transaction to `transaction`, which rolls it back.
            if closing and conn.info.transaction_status == TransactionStatus.INERROR:
                conn.rollback()  # the failed block the skipped COMMIT left open
            # A row refused in the same pipeline (an event id stored by the writer that
            # opened our operation first) must not hide the conflict that explains it:
            # the insert of the opened operations came back before the refusal.
            _opened_first(plan, opened)
            raise
        _check_opened(plan, opened)
        _check_claimed(conn, plan, claimed)
        cascaded = insert_cascade(conn, plan)
        if late:
            _insert_tables(conn, _outbox_rows((), letters))
    return CommitResult(
        events=len(plan.events),
        decisions=len(plan.decisions),
        evidence=len(plan.evidence),
        approvals=len(plan.approvals),
        audit_records=len(records),
        outbox_rows=len(outbox) + cascaded + len(letters),
        dead_letters=len(batch.dead_letters),
    )


def _read(conn: Conn, batch: Batch, plan: BatchRows, transaction: ExitStack) -> _Reads:
    """Open the batch's transaction on `transaction` (closing it commits) and send every
    read and lock of the commit in the same pipeline, in lock order: partition epochs,
    continued operations, reused ids, lineage, intake chains."""
    positions = batch.positions
    continued = sorted(r.operation_id for r in plan.operations if not r.opens)
    nonces = [a.nonce for a in plan.approvals]

    with conn.pipeline():
        # Its BEGIN rides in the reads' round trip. A `Transaction` rather than
        # `conn.transaction()`, which in a pipeline holds the pipeline open until the
        # transaction ends: the commit's round trips stay the ones it asks for. The
        # connection is in autocommit (`PostgresLedger`): otherwise psycopg, which sees
        # no transaction until the pipeline syncs, sends a BEGIN of its own after this
        # one, and the server logs a warning for every batch.
        transaction.enter_context(psycopg.Transaction(conn))
        epochs = _queue(
            conn,
            "check_epochs",
            {
                "group": batch.group,
                "topics": TextArray(p.topic for p in positions),
                "partitions": Int8Array(p.partition for p in positions),
            },
            bool(positions),
        )
        locked = _queue(conn, "lock_operations", {"ids": TextArray(continued)}, bool(continued))
        events = _queue(
            conn,
            "existing_events",
            {"ids": TextArray(e.event_id for e in plan.events)},
            bool(plan.events),
        )
        reused = _queue(conn, "existing_nonces", {"nonces": TextArray(nonces)}, bool(nonces))
        walk = lineage_reads(conn, plan)
        chains = intake_reads(conn, batch.dead_letters)
    return _Reads(
        epochs=_fetch(epochs),
        locked=_fetch(locked),
        reused_events=_fetch(events),
        reused_nonces=_fetch(reused),
        walk=None if walk is None else walk.fetchall(),
        intake_heads={str(c): ChainHead(int(s), str(h)) for c, s, h in _fetch(chains)},
    )


def _queue(
    conn: Conn, name: str, params: Mapping[str, Any], needed: bool
) -> psycopg.Cursor[TupleRow] | None:
    """Send a named query in the open pipeline when `needed` (its rows come back when
    the pipeline syncs); None when not."""
    return conn.execute(QUERIES[name], params) if needed else None


def _fetch(cur: psycopg.Cursor[TupleRow] | None) -> Rows:
    return [] if cur is None else cur.fetchall()


def _check_fences(batch: Batch, rows: Rows) -> None:
    stored = {(str(t), int(p)): int(e) for t, p, e in rows}
    for pos in batch.positions:
        found = stored.get((pos.topic, pos.partition))
        if found != pos.epoch:
            raise FencedError(
                fenced_message(batch.group, pos.topic, pos.partition, pos.epoch, found)
            )


def _check_versions(plan: BatchRows, rows: Rows) -> dict[str, ChainHead]:
    """Check the versions and lineage of the operations the batch continues (locked by
    `_read`) and return every touched operation's audit chain head (the genesis head
    for those the batch opens; `_insert_opened` writes them)."""
    heads = {r.operation_id: genesis_head(r.operation_id) for r in plan.operations if r.opens}
    stored = {str(op): (int(v), ChainHead(int(s), str(h)), c, a) for op, v, s, h, c, a, *_ in rows}
    for row in plan.operations:
        if row.opens:
            continue
        version = stored[row.operation_id][0] if row.operation_id in stored else 0
        if version != row.expected_version:
            raise VersionConflict(version_message(row.operation_id, row.expected_version, version))
        _, head, contained, agents = stored[row.operation_id]
        if lineage_moved(row, contained, agents):
            raise VersionConflict(lineage_message(row.operation_id))
        heads[row.operation_id] = head
    return heads


def _lineages(plan: BatchRows, locked: Rows) -> dict[str, dict[str, Any]]:
    """The lineage each operation with a command in `plan` carries in its commands: the
    opened operations' from their rows, the continued ones' from their locked rows."""
    wanted = {c.key for c in plan.commands}
    if not wanted:
        return {}
    out = {
        r.operation_id: command_lineage(
            r.agent,
            r.task,
            r.initiating_principal,
            r.origin_operation,
            r.parent_operation,
            r.delegated_credentials,
        )
        for r in plan.operations
        if r.opens and r.operation_id in wanted
    }
    for op, *_, agent, task, principal, origin, parent, credentials in locked:
        if op in wanted:
            out[str(op)] = command_lineage(
                agent, task, principal, origin, parent, tuple(credentials or ())
            )
    return out


def _check_ids(plan: BatchRows, events: Rows, nonce_rows: Rows) -> None:
    # An event stored for an operation this batch opens means the operation is stored
    # too: the view is stale (a commit whose acknowledgement was lost, sent again), not
    # an id reused; reloading finds the event a duplicate. The memory ledger's version
    # check catches the same before its ids.
    opened = {r.operation_id for r in plan.operations if r.opens}
    stale = next((str(op) for _, op in events if op in opened), None)
    if stale is not None:
        raise VersionConflict(opened_message(stale))
    if events:
        event_id, stored_op = str(events[0][0]), str(events[0][1])
        mine = next(e.operation_id for e in plan.events if e.event_id == event_id)
        raise EventIdReused(reuse_message(event_id, mine, stored_op), event_id=event_id)
    nonces = [a.nonce for a in plan.approvals]
    if nonce_rows or len(set(nonces)) != len(nonces):
        nonce = (
            str(nonce_rows[0][0]) if nonce_rows else next(n for n in nonces if nonces.count(n) > 1)
        )
        raise NonceReused(
            f"approval nonce {nonce} is already stored: the human decision is a replay; "
            "dead-letter it and commit the batch without it",
            nonce=nonce,
        )


# The columns of `insert_operations` and `update_operations`, in the order their
# `unnest` takes them, with their types: each statement gets one array per column
# (`column_arrays`).
_INSERT_COLUMNS: Final = (
    *("operation_id", "correlation_id", "machine_name", "machine_version", "machine_digest"),
    *("policy_digest", "state", "version", "facts", "retry_attempts", "recovery_attempts"),
    *("budget_limit", "budget_spent", "deadline", "initiating_principal", "agent", "runtime"),
    *("task", "origin_operation", "parent_operation", "view", "audit_sequence", "audit_head"),
    *("delegated_credentials", "ancestors", "lineage_agents", "contained_ancestors"),
    *("containing", "containment_cause", "descendant_agents"),
)
_INSERT_TYPES: Final = (
    *("text",) * 7,
    *("int8", "text", "int8", "int8", "int8", "int8", "timestamptz"),
    *("text",) * 7,
    *("int8", "text", "text", "text", "text", "text", "bool", "text", "text"),
)
_UPDATE_COLUMNS: Final = (
    *("operation_id", "state", "version", "view", "retry_attempts", "recovery_attempts"),
    *("budget_spent", "audit_sequence", "audit_head"),
)
_UPDATE_TYPES: Final = ("text", "text", "int8", "text", "int8", "int8", "int8", "int8", "text")


def _insert_row(
    row: OperationRow, records: Sequence[AuditRecord], lineage: LineageRow | None
) -> tuple[Any, ...]:
    """One row of `insert_operations`, in `_INSERT_COLUMNS` order. A json column's value
    is its text: the view and facts as the other paths encode them (`view_json`,
    `column_json`), the text-array columns as JSON arrays (None: empty)."""
    view = row.view
    head = records[-1] if records else None
    return (
        row.operation_id,
        row.correlation_id,
        view.machine_name,
        row.machine_version,
        view.machine_digest,
        view.policy_digest,
        view.state,
        view.version,
        column_json(facts_to_json(view.facts)),
        view.retry_attempts,
        view.recovery_attempts,
        view.budget_limit,
        view.budget_spent,
        None if view.deadline is None else _aware(view.deadline),
        row.initiating_principal,
        row.agent,
        row.runtime,
        row.task,
        row.origin_operation,
        row.parent_operation,
        view_json(view),
        0 if head is None else head.sequence,
        genesis_hash(row.operation_id) if head is None else head.hash,
        column_json(list(row.delegated_credentials)),
        *lineage_columns(lineage),
    )


def _insert_opened(
    conn: Conn,
    plan: BatchRows,
    chained: Mapping[str, list[AuditRecord]],
    lineage: LineagePlan | None,
) -> psycopg.Cursor[TupleRow] | None:
    """Queue the insert of the operations the batch opens, already in their state after
    the batch and with the lineage the step linked them into (one write per row). A row
    another writer inserted first wins and is missing from the result: see
    `_check_opened`."""
    opening = sorted((r for r in plan.operations if r.opens), key=lambda r: r.operation_id)
    if not opening:
        return None
    linked = {} if lineage is None else lineage.rows
    rows = [
        _insert_row(r, chained.get(r.operation_id, []), linked.get(r.operation_id)) for r in opening
    ]
    return conn.execute(
        QUERIES["insert_operations"], column_arrays(_INSERT_COLUMNS, _INSERT_TYPES, rows)
    )


def _opened_first(plan: BatchRows, inserted: psycopg.Cursor[TupleRow] | None) -> None:
    """`_check_opened` after the write pipeline failed: raise its `VersionConflict` if the
    insert of the opened operations has its rows back and one is missing; else return
    (the caller raises the pipeline's own error)."""
    try:
        _check_opened(plan, inserted)
    except psycopg.Error:
        return  # the insert itself failed or never ran: nothing to tell


def _check_opened(plan: BatchRows, inserted: psycopg.Cursor[TupleRow] | None) -> None:
    if inserted is None:
        return
    found = {str(row[0]) for row in inserted.fetchall()}
    for row in plan.operations:
        if row.opens and row.operation_id not in found:
            raise VersionConflict(opened_message(row.operation_id))


def _insert_claims(conn: Conn, plan: BatchRows) -> psycopg.Cursor[TupleRow] | None:
    """Queue the insert of the idempotency keys the batch's new operations claim
    (`ledger.claims`); a key held already is missing from the result: `_check_claimed`."""
    if not plan.claims:
        return None
    rows = [
        (
            c.key.principal,
            c.key.capability,
            c.key.idempotency_key,
            c.claim.operation_id,
            c.claim.arguments_digest,
            c.claimed_at,
        )
        for c in plan.claims
    ]
    return conn.execute(QUERIES["insert_claims"], column_arrays(_CLAIM_COLUMNS, _CLAIM_TYPES, rows))


def read_claims(conn: Conn, keys: Sequence[ClaimKey]) -> dict[ClaimKey, KeyClaim]:
    """The stored owners of `keys` (`key_claims`: one primary-key lookup per key)."""
    params = {
        "principals": TextArray(k.principal for k in keys),
        "capabilities": TextArray(k.capability for k in keys),
        "keys": TextArray(k.idempotency_key for k in keys),
    }
    return {
        ClaimKey(p, c, k): KeyClaim(op, digest)
        for p, c, k, op, digest in conn.execute(QUERIES["key_claims"], params)
    }


_CLAIM_COLUMNS: Final = ("c0", "c1", "c2", "c3", "c4", "c5")
_CLAIM_TYPES: Final = ("text", "text", "text", "text", "text", "timestamptz")


def _check_claimed(conn: Conn, plan: BatchRows, inserted: psycopg.Cursor[TupleRow] | None) -> None:
    """Refuse the batch when a claim it wrote was not written: another operation holds
    the key (its batch committed after ours was decided). Still inside the transaction,
    which the refusal rolls back whole."""
    if inserted is None:
        return
    written = {(ClaimKey(str(p), str(c), str(k)), str(op)) for p, c, k, op in inserted.fetchall()}
    missing = [c.key for c in plan.claims if (c.key, c.claim.operation_id) not in written]
    if not missing:
        return
    # Owned by another operation: one a concurrent batch committed, or one this batch
    # claims twice (the first row of the statement won; it is visible here).
    check_claims(plan, read_claims(conn, missing))
    # Written by nobody and owned by nobody cannot happen; refuse rather than guess.
    raise VersionConflict(claim_message(missing[0], "?", "an unknown writer"))


def _update_operations(
    conn: Conn,
    plan: BatchRows,
    heads: Mapping[str, ChainHead],
    chained: Mapping[str, list[AuditRecord]],
) -> None:
    """Queue the update of every continued operation's folded view and chain head."""
    rows = sorted((r for r in plan.operations if not r.opens), key=lambda r: r.operation_id)
    if not rows:
        return
    updates = []
    for row in rows:
        records = chained.get(row.operation_id)
        head = (
            ChainHead(records[-1].sequence, records[-1].hash)
            if records
            else heads[row.operation_id]
        )
        view = row.view
        updates.append(
            (
                row.operation_id,
                view.state,
                view.version,
                view_json(view),
                view.retry_attempts,
                view.recovery_attempts,
                view.budget_spent,
                head.sequence,
                head.hash,
            )
        )
    conn.execute(
        QUERIES["update_operations"], column_arrays(_UPDATE_COLUMNS, _UPDATE_TYPES, updates)
    )
    migrated = [r for r in rows if r.migrated]
    if migrated:
        conn.execute(
            QUERIES["migrate_operations"],
            {
                "operation_id": [r.operation_id for r in migrated],
                "machine_version": [r.view.machine_version for r in migrated],
                "machine_digest": [r.view.machine_digest for r in migrated],
            },
        )


def _write_timers(conn: Conn, timers: TimerRows) -> None:
    """Queue the batch's changes to the timers table: disarmed rows deleted, decided
    ones spent, armed ones inserted (`ledger.records.TimerRows`)."""
    if not timers:
        return
    if timers.disarmed:
        conn.execute(QUERIES["delete_timers"], {"ids": TextArray(timers.disarmed)})
    if timers.spent:
        conn.execute(QUERIES["spend_timers"], {"ids": TextArray(timers.spent)})
    if timers.armed:
        rows = [
            (
                *(t.timer.timer_id, t.operation_id, t.timer.kind, t.machine_name, t.timer.state),
                *(t.timer.armed_version, _aware(t.timer.armed_at), _aware(t.timer.due_at)),
                *(t.timer.event_type, t.topic, t.partition, t.timer.spent),
            )
            for t in timers.armed
        ]
        _insert_tables(conn, [("timers", rows)])


def _store_offsets(conn: Conn, batch: Batch) -> None:
    if batch.positions:
        conn.execute(
            QUERIES["store_offsets"],
            {
                "group": batch.group,
                "topics": TextArray(p.topic for p in batch.positions),
                "partitions": Int8Array(p.partition for p in batch.positions),
                "offsets": Int8Array(p.next_offset for p in batch.positions),
            },
        )


# The element types of each `insert_<table>` statement's column arrays (queries.sql), in
# column order (`column_arrays`). A json column is sent as its text, which the statement
# casts (the server checks it); a wrong type here is refused by the server, and the
# ledger tests write every table.
_TABLE_TYPES: Final[Mapping[str, Sequence[str]]] = {
    "events": ("text", "text", "text", "text", "text", "text", "int4", "int8"),
    "decisions": ("text", "int8", "text", "text", "text", "text", "timestamptz", "text"),
    "evidence": ("text", "text", "text", "text", "bool", "text", "text"),
    "approvals": (
        *("text", "text", "text", "text", "text", "text", "text"),
        *("timestamptz", "text", "text"),
    ),
    "audit_records": ("text", "int8", "text", "text", "text", "text"),
    "outbox": ("text", "text", "text", "text", "bytea", "int8", "bytea"),
    "timers": (
        *("text", "text", "text", "text", "text", "int8", "timestamptz", "timestamptz"),
        *("text", "text", "int4", "bool"),
    ),
    "timer_events": ("text", "text", "text", "text", "bytea", "bytea"),
}


def _aware(moment: datetime) -> datetime:
    """`moment` with a time zone: a timestamptz array element is sent in binary, which
    cannot carry a naive time (the text format left it to the session's zone, UTC on the
    ledger's servers). Times the core produces carry one; this stores a naive one as UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _append_rows(
    plan: BatchRows, records: Sequence[AuditRecord]
) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The batch's append-only rows but the outbox's, per table in write order (events
    before the rows that reference them) and in the columns of `_TABLE_TYPES`; empty
    tables left out."""
    tables: list[tuple[str, list[tuple[Any, ...]]]] = [
        ("events", [_event_tuple(e) for e in plan.events]),
        (
            "decisions",
            [
                (
                    d.operation_id,
                    d.sequence,
                    d.event_id,
                    d.outcome,
                    d.state_before,
                    d.state_after,
                    _aware(d.decided_at),
                    d.decision_json,
                )
                for d in plan.decisions
            ],
        ),
        (
            "evidence",
            [
                (
                    *(v.operation_id, v.event_id, v.kind, v.source, v.trusted, v.reference),
                    dumps(v.record),
                )
                for v in plan.evidence
            ],
        ),
        (
            "approvals",
            [
                (
                    *(a.event_id, a.operation_id, a.approver, a.verdict, a.state),
                    *(a.transition, a.machine_digest, _aware(a.expires_at), a.nonce),
                    dumps(a.record),
                )
                for a in plan.approvals
            ],
        ),
        (
            "audit_records",
            [
                (r.operation_id, r.sequence, r.kind, r.prev_hash, r.hash, r.body_json())
                for r in records
            ],
        ),
    ]
    return [(table, rows) for table, rows in tables if rows]


def _outbox_rows(
    outbox: Sequence[OutboxRow], letters: Sequence[DeadLetterRow]
) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The outbox's rows in insertion order, as `_append_rows` gives a table; nothing
    when there are none."""
    rows = [_outbox_tuple(o) for o in outbox] + [_letter_tuple(o) for o in letters]
    return [("outbox", rows)] if rows else []


def _insert_tables(conn: Conn, tables: Sequence[tuple[str, Sequence[tuple[Any, ...]]]]) -> None:
    """Write append-only rows as one INSERT per table (`insert_<table>`, one array per
    column named c0, c1, ...); queued when a pipeline is open."""
    for table, rows in tables:
        types = _TABLE_TYPES[table]
        names = [f"c{i}" for i in range(len(types))]
        conn.execute(QUERIES[f"insert_{table}"], column_arrays(names, types, rows))


def _event_tuple(e: EventRow) -> tuple[Any, ...]:
    src = e.source
    return (
        e.event_id,
        e.payload_digest,
        e.operation_id,
        e.event_type,
        e.envelope_json,
        None if src is None else src.topic,
        None if src is None else src.partition,
        None if src is None else src.offset,
    )


def _outbox_tuple(row: OutboxRow) -> tuple[Any, ...]:
    """An outbox row's columns; an audit record's row stores only its reference
    (payload NULL, `audit_sequence` set), any other its payload; a signed row the value
    the controller signed, which the relay publishes (migration 0012)."""
    headers = column_json(dict(row.headers))
    if row.audit_sequence is not None:
        return (row.record_id, row.topic, row.key, headers, None, row.audit_sequence, row.value)
    payload = row.payload_json.encode("utf-8")
    return (row.record_id, row.topic, row.key, headers, payload, None, row.value)


def _letter_tuple(row: DeadLetterRow) -> tuple[Any, ...]:
    """A dead letter's outbox columns: its audit record's row, like any audit row, only
    the reference (`_outbox_tuple`); the dead letter its payload, the bytes to publish."""
    headers = column_json(dict(row.headers))
    if row.audit_sequence is not None:
        return (row.record_id, row.topic, row.key, headers, None, row.audit_sequence, row.value)
    payload = dumps(row.payload).encode("utf-8")
    return (row.record_id, row.topic, row.key, headers, payload, None, row.value)
