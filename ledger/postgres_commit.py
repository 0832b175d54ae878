"""One batch commit in PostgreSQL: the statements `PostgresLedger.commit` runs.

In one transaction: check the partition epochs (share-locked, so a concurrent claim waits
for us and a zombie gets `FencedError`), lock every continued operation in id order with
`SELECT ... FOR UPDATE` (two writers never deadlock) and check its optimistic version,
refuse event ids or nonces stored for something else, run the lineage step, chain the
audit records onto the locked heads, insert the operations the batch opens, write events,
decisions, evidence, approvals, audit and outbox rows with COPY, the folded views with one
`UPDATE ... FROM unnest(...)`, the dead letters, and the offsets with one upsert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from ledger.audit import AuditRecord, ChainHead, chain_records, genesis_hash, genesis_head
from ledger.cascade import lineage_message
from ledger.codec import facts_to_json, view_to_json
from ledger.deadletters import write_dead_letters
from ledger.errors import (
    EventIdReused,
    FencedError,
    NonceReused,
    VersionConflict,
    fenced_message,
    reuse_message,
    version_message,
)
from ledger.interface import CommitResult
from ledger.jsonutil import dumps
from ledger.lineage_step import lineage_moved
from ledger.postgres_lineage import lineage_step, write_lineage
from ledger.queries import QUERIES
from ledger.records import (
    Batch,
    BatchPlan,
    EventRow,
    OperationRow,
    OutboxRow,
    audit_bodies,
    finish_outbox,
)

__all__ = ["write_batch"]

Conn = psycopg.Connection[TupleRow]


def write_batch(conn: Conn, batch: Batch, plan: BatchPlan) -> CommitResult:
    """Write `plan` (planned from `batch`) in one transaction on `conn` and store the
    batch's offsets: the body of `PostgresLedger.commit`, whose caller translates driver
    errors and retries a lost connection. Raises `FencedError`, `VersionConflict`,
    `EventIdReused` or `NonceReused` before anything is written."""
    with conn.transaction(), conn.cursor() as cur:
        _check_fences(cur, batch)
        heads = _lock_operations(cur, plan)
        _check_ids(cur, plan)
        plan, lineage = lineage_step(cur, plan, batch)
        chained = {
            op: chain_records(op, heads[op], bodies) for op, bodies in audit_bodies(plan).items()
        }
        outbox = finish_outbox(plan, chained, batch.topics)
        _insert_opened(cur, plan, chained)
        _copy_rows(cur, plan, chained, outbox)
        _update_operations(cur, plan, heads, chained)
        write_lineage(cur, plan, lineage)
        # Dead letters after the batch's own rows: their intake chains are locked
        # after the operations, always in this order, so writers never deadlock.
        letters = write_dead_letters(
            cur, batch.dead_letters, batch.topics.audit, batch.topics.dead_letters
        )
        if batch.positions:
            cur.execute(
                QUERIES["store_offsets"],
                {
                    "group": batch.group,
                    "topics": [p.topic for p in batch.positions],
                    "partitions": [p.partition for p in batch.positions],
                    "offsets": [p.next_offset for p in batch.positions],
                },
            )
    return CommitResult(
        events=len(plan.events),
        decisions=len(plan.decisions),
        evidence=len(plan.evidence),
        approvals=len(plan.approvals),
        audit_records=sum(len(r) for r in chained.values()) + letters[0],
        outbox_rows=len(outbox) + len(plan.cascade) + letters[1],
        dead_letters=len(batch.dead_letters),
    )


def _outbox_body(row: OutboxRow) -> tuple[bytes | None, int | None]:
    """(payload, audit_sequence) columns: an audit row stores only its reference."""
    if row.audit_sequence is not None:
        return None, row.audit_sequence
    return row.payload_json.encode("utf-8"), None


def _check_fences(cur: psycopg.Cursor[TupleRow], batch: Batch) -> None:
    if not batch.positions:
        return
    rows = cur.execute(
        QUERIES["check_epochs"],
        {
            "group": batch.group,
            "topics": [p.topic for p in batch.positions],
            "partitions": [p.partition for p in batch.positions],
        },
    ).fetchall()
    stored = {(str(t), int(p)): int(e) for t, p, e in rows}
    for pos in batch.positions:
        found = stored.get((pos.topic, pos.partition))
        if found != pos.epoch:
            raise FencedError(
                fenced_message(batch.group, pos.topic, pos.partition, pos.epoch, found)
            )


def _insert_record(row: OperationRow, records: Sequence[AuditRecord]) -> dict[str, Any]:
    view = row.view
    head = records[-1] if records else None
    return {
        "operation_id": row.operation_id,
        "correlation_id": row.correlation_id,
        "machine_name": view.machine_name,
        "machine_version": row.machine_version,
        "machine_digest": view.machine_digest,
        "policy_digest": view.policy_digest,
        "state": view.state,
        "version": view.version,
        "facts": facts_to_json(view.facts),
        "retry_attempts": view.retry_attempts,
        "recovery_attempts": view.recovery_attempts,
        "budget_limit": view.budget_limit,
        "budget_spent": view.budget_spent,
        "deadline": view.deadline,
        "initiating_principal": row.initiating_principal,
        "agent": row.agent,
        "runtime": row.runtime,
        "task": row.task,
        "origin_operation": row.origin_operation,
        "parent_operation": row.parent_operation,
        "view": view_to_json(view),
        "audit_sequence": 0 if head is None else head.sequence,
        "audit_head": genesis_hash(row.operation_id) if head is None else head.hash,
        "delegated_credentials": list(row.delegated_credentials),
    }


def _lock_operations(cur: psycopg.Cursor[TupleRow], plan: BatchPlan) -> dict[str, ChainHead]:
    """Lock the operations the batch continues, in id order (two writers never deadlock),
    check their versions, and return every touched operation's audit chain head (the
    genesis head for those the batch opens; `_insert_opened` writes them later)."""
    heads = {r.operation_id: genesis_head(r.operation_id) for r in plan.operations if r.opens}
    continued = sorted(r.operation_id for r in plan.operations if not r.opens)
    if not continued:
        return heads
    rows = cur.execute(QUERIES["lock_operations"], {"ids": continued}).fetchall()
    stored = {str(op): (int(v), ChainHead(int(s), str(h)), c, a) for op, v, s, h, c, a in rows}
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


def _insert_opened(
    cur: psycopg.Cursor[TupleRow], plan: BatchPlan, chained: Mapping[str, list[AuditRecord]]
) -> None:
    """Insert the operations the batch opens, already in their state after the batch
    (one write per row, not an insert and then an update). A row another writer inserted
    first wins; this batch then gets `VersionConflict`."""
    opening = sorted((r for r in plan.operations if r.opens), key=lambda r: r.operation_id)
    if not opening:
        return
    records = [_insert_record(r, chained.get(r.operation_id, [])) for r in opening]
    inserted = {
        str(row[0])
        for row in cur.execute(QUERIES["insert_operations"], {"rows": dumps(records)}).fetchall()
    }
    for row in opening:
        if row.operation_id not in inserted:
            raise VersionConflict(
                f"operation {row.operation_id}: this batch opens it, but another writer "
                "opened it first: reload the view and decide again from the stored offsets"
            )


def _check_ids(cur: psycopg.Cursor[TupleRow], plan: BatchPlan) -> None:
    if plan.events:
        rows = cur.execute(
            QUERIES["existing_events"], {"ids": [e.event_id for e in plan.events]}
        ).fetchall()
        if rows:
            event_id, stored_op = str(rows[0][0]), str(rows[0][1])
            mine = next(e.operation_id for e in plan.events if e.event_id == event_id)
            raise EventIdReused(reuse_message(event_id, mine, stored_op), event_id=event_id)
    if plan.approvals:
        nonces = [a.nonce for a in plan.approvals]
        rows = cur.execute(QUERIES["existing_nonces"], {"nonces": nonces}).fetchall()
        if rows or len(set(nonces)) != len(nonces):
            nonce = str(rows[0][0]) if rows else next(n for n in nonces if nonces.count(n) > 1)
            raise NonceReused(
                f"approval nonce {nonce} is already stored: the human decision is a replay; "
                "dead-letter it and commit the batch without it",
                nonce=nonce,
            )


def _copy_rows(
    cur: psycopg.Cursor[TupleRow],
    plan: BatchPlan,
    chained: Mapping[str, list[AuditRecord]],
    outbox: Sequence[OutboxRow],
) -> None:
    """Write every append-only row with COPY: one round trip per table."""
    records = [r for rs in chained.values() for r in rs]
    tables: list[tuple[str, list[tuple[Any, ...]]]] = [
        ("copy_events", [_event_tuple(e) for e in plan.events]),
        (
            "copy_decisions",
            [
                (
                    d.operation_id,
                    d.sequence,
                    d.event_id,
                    d.outcome,
                    d.state_before,
                    d.state_after,
                    d.decided_at,
                    d.decision_json,
                )
                for d in plan.decisions
            ],
        ),
        (
            "copy_evidence",
            [
                (
                    v.operation_id,
                    v.event_id,
                    v.kind,
                    v.source,
                    v.trusted,
                    v.reference,
                    dumps(v.record),
                )
                for v in plan.evidence
            ],
        ),
        (
            "copy_approvals",
            [
                (
                    a.event_id,
                    a.operation_id,
                    a.approver,
                    a.verdict,
                    a.state,
                    a.transition,
                    a.machine_digest,
                    a.expires_at,
                    a.nonce,
                    dumps(a.record),
                )
                for a in plan.approvals
            ],
        ),
        (
            "copy_audit_records",
            [
                (r.operation_id, r.sequence, r.kind, r.prev_hash, r.hash, r.body_json())
                for r in records
            ],
        ),
        (
            "copy_outbox",
            [(o.record_id, o.topic, o.key, dumps(o.headers), *_outbox_body(o)) for o in outbox],
        ),
    ]
    for query, rows in tables:
        if rows:
            with cur.copy(QUERIES[query]) as copy:
                for row in rows:
                    copy.write_row(row)


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


def _update_operations(
    cur: psycopg.Cursor[TupleRow],
    plan: BatchPlan,
    heads: Mapping[str, ChainHead],
    chained: Mapping[str, list[AuditRecord]],
) -> None:
    rows = sorted((r for r in plan.operations if not r.opens), key=lambda r: r.operation_id)
    if not rows:
        return
    new_heads = []
    for row in rows:
        records = chained.get(row.operation_id)
        head = heads[row.operation_id]
        new_heads.append(ChainHead(records[-1].sequence, records[-1].hash) if records else head)
    updates = [
        {
            "operation_id": r.operation_id,
            "state": r.view.state,
            "version": r.view.version,
            "view": view_to_json(r.view),
            "retry_attempts": r.view.retry_attempts,
            "recovery_attempts": r.view.recovery_attempts,
            "budget_spent": r.view.budget_spent,
            "audit_sequence": h.sequence,
            "audit_head": h.hash,
        }
        for r, h in zip(rows, new_heads, strict=True)
    ]
    cur.execute(QUERIES["update_operations"], {"rows": dumps(updates)})
