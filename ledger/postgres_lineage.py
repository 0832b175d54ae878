"""The lineage step of a PostgreSQL batch transaction (`ledger.cascade`, docs/lineage.md).

Runs inside `PostgresLedger.commit`, after the batch's own operations are locked and
before its audit records are chained: takes advisory locks that serialise batches
opening related operations, walks (and row-locks) the rows below the opened and the
containment-changing operations until no new one appears, plans with the pure
`ledger.cascade.plan_lineage`, and later writes the changed lineage columns and the
cascade events. A batch that neither opens an operation nor changes containment skips
it entirely, so the hot path stays one query on the batch's own operations.
"""

from __future__ import annotations

import logging
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from ledger.cascade import LineagePlan, LineageRow, plan_lineage
from ledger.jsonutil import dumps
from ledger.lineage_step import (
    batch_time,
    check_arrivals,
    lineage_inputs,
    opened_lineage,
    with_lineage_plan,
)
from ledger.queries import QUERIES
from ledger.records import Batch, BatchPlan

__all__ = ["lineage_row", "lineage_step", "write_lineage"]

log = logging.getLogger("ledger")


def lineage_row(row: TupleRow) -> LineageRow:
    """A `LineageRow` from the columns of the `lineage_*` queries, in their order."""
    (op, correlation, machine, version, state, agent, task, principal, origin, parent) = row[:10]
    credentials, ancestors, agents, contained, containing, cause, below = row[10:17]
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
    )


# The lineage walk repeats until no new row appears below the roots: a child whose
# batch committed while this one waited for its lock is then seen and linked.
_WALK_ROUNDS: Final = 5


def lineage_step(
    cur: psycopg.Cursor[TupleRow], plan: BatchPlan, batch: Batch
) -> tuple[BatchPlan, LineagePlan | None]:
    """Link the operations the batch opens and walk the lineage of its containment
    changes (`ledger.cascade`), with the rows involved locked. Batches that neither
    open an operation nor change containment skip it: no extra round trip."""
    if not plan.needs_lineage:
        return plan, None
    ids, roots = lineage_inputs(plan)
    opened = opened_lineage(plan)
    keys = sorted({*roots, *(r.parent_operation for r in opened if r.parent_operation)})
    cur.execute(QUERIES["lineage_lock_keys"], {"keys": keys})
    stored: dict[str, LineageRow] = {}
    # A walk runs on the snapshot its statement started with, and row locks it waited
    # for may have let a concurrent batch link or contain in between: walk again until
    # nothing new appears below the roots (containment) and every ancestor of the rows
    # read is among them (a parent linked meanwhile). Usually one walk, two at most.
    for _ in range(_WALK_ROUNDS):
        params = {"ids": sorted(ids), "roots": sorted(roots)}
        rows = cur.execute(QUERIES["lineage_rows"], params).fetchall()
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
    check_arrivals(plan, stored)
    lineage = plan_lineage(stored, opened, plan.containments, batch_time(plan))
    return with_lineage_plan(plan, lineage, batch.topics), lineage


def write_lineage(
    cur: psycopg.Cursor[TupleRow], plan: BatchPlan, lineage: LineagePlan | None
) -> None:
    """The lineage columns the step changed (opened rows exist by now) and the cascade
    events, which a replayed step may plan again: those already stored are kept."""
    if lineage is None:
        return
    updates = [
        {
            "operation_id": op,
            "ancestors": list(r.ancestors),
            "lineage_agents": list(r.lineage_agents),
            "contained_ancestors": list(r.contained_ancestors),
            "containing": r.containing,
            "containment_cause": r.containment_cause,
            "descendant_agents": list(r.descendant_agents),
        }
        for op, r in sorted(lineage.rows.items())
    ]
    if updates:
        cur.execute(QUERIES["update_lineage"], {"rows": dumps(updates)})
    if plan.cascade:
        cascade = [
            {
                "record_id": o.record_id,
                "topic": o.topic,
                "key": o.key,
                "headers": dict(o.headers),
                "payload": o.payload_json,
            }
            for o in plan.cascade
        ]
        cur.execute(QUERIES["insert_cascade"], {"rows": dumps(cascade)})
