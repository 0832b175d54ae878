"""What the lineage step of a commit needs from a batch's rows, shared by both ledgers.

`ledger.records.batch_rows` derives a batch's rows without reading any other operation.
Before the commit writes them, the lineage step (`ledger.cascade.plan_lineage`, run by
`MemoryLedger` and `ledger.postgres_lineage`) reads the lineage the batch touches under
its locks: `lineage_inputs` says which rows to read, `check_arrivals` and
`lineage_moved` refuse a batch decided on a lineage that moved since, `opened_lineage`
and `batch_time` feed the cascade, and `with_lineage_plan` folds its audit records and
cascade events back into the rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from ledger.cascade import LineagePlan, lineage_message
from ledger.errors import VersionConflict
from ledger.jsonutil import dumps
from ledger.records import AuditItem, BatchRows, OperationRow, OutboxRow, RowSigner, signed_row
from machines import LineageRow, arrival_of
from schemas import DEFAULT_CONTROLLER_ID, TopicNames

__all__ = [
    "batch_time",
    "cascade_producer",
    "check_arrivals",
    "lineage_inputs",
    "lineage_moved",
    "opened_lineage",
    "with_lineage_plan",
]


def lineage_moved(row: OperationRow, contained: Sequence[str], agents: Sequence[str]) -> bool:
    """Whether the stored lineage of `row`'s operation gained a contained ancestor or an
    ancestor's agent after the batch was decided: a containment cascade or a link
    committed in between. The batch must then be decided again (`VersionConflict`), or
    a descendant could resume, or an ancestor's agent approve, on a stale lineage."""
    return not set(contained) <= set(row.decided_contained) or not set(agents) <= set(
        row.decided_agents
    )


def check_arrivals(
    plan: BatchRows,
    stored: Mapping[str, LineageRow],
    unlinked: Mapping[str, frozenset[str]] | None = None,
) -> None:
    """Refuse the batch (`VersionConflict`) when an operation it opens would be linked
    below a contained ancestor, or next to an ancestor's or descendant's agent, that the
    view it was decided with did not have: its lineage, from `stored` (the rows the
    lineage step read under its locks), moved after `Ledger.arrival_lineage` was read.
    `lineage_moved` is the same rule continued operations are held to, and
    `machines.arrival_of` the same derivation the consumer's read used, so the
    replan, which reads the moved lineage, commits."""
    refused = unlinked or {}
    for row in plan.operations:
        if not row.opens:
            continue
        parent = stored.get(row.parent_operation) if row.parent_operation else None
        left_out = refused.get(row.operation_id, frozenset())
        children = (
            r
            for r in stored.values()
            if r.parent_operation == row.operation_id and r.operation_id not in left_out
        )
        arrival = arrival_of(row.operation_id, parent, children)
        agents = arrival.lineage_agents + arrival.descendant_agents
        if lineage_moved(row, arrival.contained_ancestors, agents):
            raise VersionConflict(lineage_message(row.operation_id))


def opened_lineage(plan: BatchRows) -> tuple[LineageRow, ...]:
    """The lineage rows of the operations `plan` opens, lineage columns still empty."""
    return tuple(
        LineageRow(
            operation_id=r.operation_id,
            correlation_id=r.correlation_id,
            machine_name=r.view.machine_name,
            machine_version=r.machine_version,
            state=r.view.state,
            agent=r.agent,
            task=r.task,
            initiating_principal=r.initiating_principal,
            origin_operation=r.origin_operation,
            parent_operation=r.parent_operation,
            delegated_credentials=r.delegated_credentials,
            opened_by=r.view.opened_by,
        )
        for r in plan.operations
        if r.opens
    )


def cascade_producer(sign: RowSigner | None) -> str:
    """Who cascade events name as their producer: the controller that signs them (an
    unsigned batch, as in simulations, names the default controller id)."""
    return sign.producer if sign is not None else DEFAULT_CONTROLLER_ID


def batch_time(plan: BatchRows) -> datetime:
    """The latest decision time of the batch: the time arrival events carry."""
    return max((d.decided_at for d in plan.decisions), default=_EPOCH)


_EPOCH = datetime.fromtimestamp(0, UTC)


def lineage_inputs(plan: BatchRows) -> tuple[set[str], set[str]]:
    """What the lineage step must read for `plan`: the ids whose own rows it needs (the
    opened operations' parents and the operations changing containment) and the roots
    whose subtrees it needs (the opened operations, whose children may have been
    reported first, and the operations changing containment)."""
    opened = {r.operation_id for r in plan.operations if r.opens}
    parents = {r.parent_operation for r in plan.operations if r.opens and r.parent_operation}
    changing = {c.operation_id for c in plan.containments}
    return (parents | changing) - opened, opened | changing


def _identity(row: OperationRow) -> dict[str, str | None]:
    """The identities every audit record of the operation names (SPEC §10)."""
    return {
        "initiating_principal": row.initiating_principal,
        "agent": row.agent,
        "runtime": row.runtime,
        "task": row.task,
    }


def with_lineage_plan(
    plan: BatchRows, lineage: LineagePlan, topics: TopicNames, sign: RowSigner | None = None
) -> BatchRows:
    """`plan` with the lineage step's audit records (chained with the batch's own, on
    the containing or opened operation's chain) and its cascade events as outbox rows
    for the events topic. Audit bodies are only planned for operations `plan` touches,
    whose chains the commit holds locked. `sign` signs the cascade events."""
    touched = {r.operation_id: r for r in plan.operations}
    audit = list(plan.audit)
    for op in sorted(lineage.audit):
        row = touched.get(op)
        if row is None:
            continue
        for body in lineage.audit_of(op):
            named = {**body, "identity": _identity(row)}
            audit.append(AuditItem(op, "lineage", named, dumps(named)))
    cascade = tuple(
        signed_row(OutboxRow(e.record_id, topics.events, e.key, e.headers, e.payload_json), sign)
        for e in lineage.events
    )
    return replace(plan, audit=tuple(audit), cascade=cascade)
