"""The lineage step of a PostgreSQL batch transaction (`ledger.cascade`, docs/lineage.md).

Runs inside `PostgresLedger.commit`, after the batch's own operations are locked and
before its audit records are chained: takes advisory locks that serialise batches
opening related operations, walks (and row-locks) the rows below the opened and the
containment-changing operations until no new one appears, plans with the pure
`ledger.cascade.plan_lineage`, and later writes the changed lineage columns and the
cascade events. The locks and the first walk ride in the commit's first pipelined round
trip (`lineage_reads`); the opened operations are inserted with their lineage columns,
so only rows stored before the batch are updated. A batch that neither opens an
operation nor changes containment skips the step entirely.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg.rows import TupleRow

from ledger.cascade import LineagePlan, plan_lineage
from ledger.jsonutil import column_json
from ledger.lineage_step import (
    batch_time,
    cascade_producer,
    check_arrivals,
    lineage_inputs,
    opened_lineage,
    with_lineage_plan,
)
from ledger.postgres_arrays import column_arrays
from ledger.queries import QUERIES
from ledger.records import Batch, BatchRows
from machines import LineageRow

__all__ = [
    "insert_cascade",
    "lineage_columns",
    "lineage_reads",
    "lineage_row",
    "lineage_step",
    "write_lineage",
]

log = logging.getLogger("ledger")


def lineage_row(row: TupleRow) -> LineageRow:
    """A `LineageRow` from the columns of the `lineage_*` queries, in their order."""
    (op, correlation, machine, version, state, agent, task, principal, origin, parent) = row[:10]
    credentials, ancestors, agents, contained, containing, cause, below = row[10:17]
    opened_by = row[17] if len(row) > 17 else None  # `arrival_rows` reads it too
    return LineageRow(
        operation_id=op,
        correlation_id=correlation,
        machine_name=machine,
        machine_version=version,
        state=state,
        agent=agent,
        task=task,
        initiating_principal=principal,
        origin_operation=origin,
        parent_operation=parent,
        delegated_credentials=tuple(credentials),
        ancestors=tuple(ancestors),
        lineage_agents=tuple(agents),
        contained_ancestors=tuple(contained),
        containing=bool(containing),
        containment_cause=cause,
        descendant_agents=tuple(below),
        opened_by=opened_by,
    )


# The lineage walk repeats until no new row appears below the roots: a child whose
# batch committed while this one waited for its lock is then seen and linked.
_WALK_ROUNDS: Final = 5

Conn = psycopg.Connection[TupleRow]


def _walk_params(ids: set[str], roots: set[str]) -> dict[str, list[str]]:
    return {"ids": sorted(ids), "roots": sorted(roots)}


def lineage_reads(conn: Conn, plan: BatchRows) -> psycopg.Cursor[TupleRow] | None:
    """Queue the lineage step's advisory locks and its first walk (in the caller's
    pipeline, after the batch's own operations are locked); the cursor holds the walk's
    rows for `lineage_step`. None when the batch needs no lineage step."""
    if not plan.needs_lineage:
        return None
    ids, roots = lineage_inputs(plan)
    opened = opened_lineage(plan)
    keys = sorted({*roots, *(r.parent_operation for r in opened if r.parent_operation)})
    conn.execute(QUERIES["lineage_lock_keys"], {"keys": keys})
    return conn.execute(QUERIES["lineage_rows"], _walk_params(ids, roots))


def lineage_step(
    conn: Conn, plan: BatchRows, batch: Batch, first: Sequence[TupleRow] | None
) -> tuple[BatchRows, LineagePlan | None]:
    """Link the operations the batch opens and walk the lineage of its containment
    changes (`ledger.cascade`), with the rows involved locked: `first` is the walk
    `lineage_reads` queued (None: no step, the plan is returned as it is)."""
    if first is None:
        return plan, None
    ids, roots = lineage_inputs(plan)
    stored: dict[str, LineageRow] = {}
    rows = first
    # A walk runs on the snapshot its statement started with, and row locks it waited
    # for may have let a concurrent batch link or contain in between: walk again until
    # nothing new appears below the roots (containment) and every ancestor of the rows
    # read is among them (a parent linked meanwhile). Usually one walk, two at most.
    for walk in range(_WALK_ROUNDS):
        if walk:
            rows = conn.execute(QUERIES["lineage_rows"], _walk_params(ids, roots)).fetchall()
        found = {str(r[0]): lineage_row(r) for r in rows}
        missing = {a for r in found.values() for a in r.ancestors} - found.keys()
        grown = bool(plan.containments) and found.keys() != stored.keys()
        stored = found
        if not missing and not grown:
            break
        ids |= missing
    else:
        if plan.containments:
            log.warning(
                "lineage walk below %s still growing after %d rounds; the rest is "
                "contained on arrival",
                sorted(c.operation_id for c in plan.containments),
                _WALK_ROUNDS,
            )
    check_arrivals(plan, stored, batch.unlinked)
    lineage = plan_lineage(
        stored,
        opened_lineage(plan),
        plan.containments,
        batch_time(plan),
        cascade_producer(batch.sign),
        batch.unlinked,
    )
    return with_lineage_plan(plan, lineage, batch.topics, batch.sign), lineage


def write_lineage(conn: Conn, plan: BatchRows, lineage: LineagePlan | None) -> None:
    """Queue the update of the lineage columns the step changed on rows stored before
    the batch (the opened ones are inserted with theirs, `ledger.postgres_commit`)."""
    if lineage is None:
        return
    opened = {r.operation_id for r in plan.operations if r.opens}
    updates = [
        (op, *lineage_columns(r)) for op, r in sorted(lineage.rows.items()) if op not in opened
    ]
    if updates:
        conn.execute(
            QUERIES["update_lineage"], column_arrays(_LINEAGE_COLUMNS, _LINEAGE_TYPES, updates)
        )


def lineage_columns(row: LineageRow | None) -> tuple[Any, ...]:
    """A row's lineage columns as `insert_operations` and `update_lineage` take them
    (text arrays as JSON arrays); all NULL for an opened operation not linked, which
    `insert_operations` stores as empty arrays and `containing` false."""
    if row is None:
        return (None, None, None, None, None, None)
    return (
        column_json(list(row.ancestors)),
        column_json(list(row.lineage_agents)),
        column_json(list(row.contained_ancestors)),
        row.containing,
        row.containment_cause,
        column_json(list(row.descendant_agents)),
    )


# The columns of `update_lineage`, in order, and their array types (`column_arrays`;
# a json column goes as text).
_LINEAGE_COLUMNS: Final = (
    *("operation_id", "ancestors", "lineage_agents", "contained_ancestors"),
    *("containing", "containment_cause", "descendant_agents"),
)
_LINEAGE_TYPES: Final = ("text", "text", "text", "text", "bool", "text", "text")


def insert_cascade(conn: Conn, plan: BatchRows) -> int:
    """Insert the cascade events the step planned; a replayed step may plan some that
    are already stored, which are kept. Returns how many rows were inserted."""
    if not plan.cascade:
        return 0
    cascade = [
        {
            "record_id": o.record_id,
            "topic": o.topic,
            "key": o.key,
            "headers": dict(o.headers),
            "payload": o.payload_json,
            "value": None if o.value is None else base64.b64encode(o.value).decode("ascii"),
        }
        for o in plan.cascade
    ]
    with conn.execute(QUERIES["insert_cascade"], {"rows": column_json(cascade)}) as cur:
        return max(cur.rowcount, 0)
