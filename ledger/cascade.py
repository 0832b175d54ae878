"""Lineage linking and containment cascades, planned without I/O (CONFORMANCE Level 5).

What *containing* and *contained ancestors* mean, which decision starts or ends
containment (`containment_of`) and the lineage an arriving operation gets
(`arrival_of`) are the core's semantics, in `machines.containment`. This module is what
the ledger does with them (docs/lineage.md):

- **Cascade**: when an operation starts containing, every known descendant that had no
  contained ancestor yet gets an `ANCESTOR_CONTAINED` event through the outbox, keyed
  by the descendant's operation id, so it is decided on its own partition, in order; its
  own machine then stops its task and queued work and revokes the credentials delegated
  to it, as two separate capabilities. A descendant already contained by a higher
  ancestor was signalled by that ancestor and is not signalled again.
- **Linking**: an operation names its parent; whichever of the two reaches the ledger
  first, the lineage columns (ancestors, their agents, contained ancestors, and the
  ancestors' record of their descendants' agents) are filled in as soon as both are
  known. An operation linked below a containing ancestor is contained on arrival: it
  gets the same `ANCESTOR_CONTAINED` event.

Everything here is pure: both ledgers fetch the rows, call `plan_lineage` inside their
batch transaction, and write what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from ledger.jsonutil import dumps
from machines import (
    MAX_LINEAGE_DEPTH,
    Change,
    Containment,
    Event,
    EvidencePayload,
    LineageRow,
    lineage_below,
)
from schemas import record_id

__all__ = [
    "CASCADE_EVENT",
    "CascadeEvent",
    "LineagePlan",
    "lineage_message",
    "plan_lineage",
]

CASCADE_EVENT: Final = "ANCESTOR_CONTAINED"
# The producer identity of events the controller itself emits. It is never an agent, so
# the core's authority check (SPEC §7.7) lets it speak for a contained ancestor.


@dataclass(frozen=True, slots=True)
class CascadeEvent:
    """One `ANCESTOR_CONTAINED` event for the outbox (topic: the events stream)."""

    record_id: str
    key: str
    headers: Mapping[str, str]
    payload_json: str
    event: Event


@dataclass(frozen=True, slots=True)
class LineagePlan:
    """What linking and the batch's containment changes write: the new lineage columns
    of every row they change, the cascade events, and audit bodies per operation (only
    for operations the batch holds locked: the containing ones and those it opens)."""

    rows: Mapping[str, LineageRow]
    events: tuple[CascadeEvent, ...] = ()
    audit: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)

    def audit_of(self, operation_id: str) -> tuple[Mapping[str, Any], ...]:
        """Audit bodies (kind `lineage`) for `operation_id`, in order."""
        return self.audit.get(operation_id, ())


def plan_lineage(
    stored: Mapping[str, LineageRow],
    opened: Sequence[LineageRow],
    changes: Sequence[Containment],
    now: datetime,
    producer: str,
    unlinked: Mapping[str, frozenset[str]] | None = None,
) -> LineagePlan:
    """Link the operations a batch opens and apply its containment changes.

    `stored` must hold, as stored before the batch: the parents of `opened` and their
    known ancestors, every existing operation below an opened one (children reported
    first), every descendant of an operation in `changes`, and the operations in
    `changes` themselves. `opened` are the rows the batch inserts (their lineage columns
    empty); `now` is the time of the batch's decisions, which an arrival event carries;
    `producer` the controller's roster id, which signs the events and which they name.
    `unlinked` names, per opened operation, the children reported before it that are not
    linked below it (`machines.may_link`: their openers may not speak for its agents);
    a stored child of a parent stored before the batch that is not linked below it was
    refused then, and is never linked later either.
    Returns every row whose lineage columns change (opened ones always), the events to
    emit and the audit bodies."""
    refused = unlinked or {}
    rows: dict[str, LineageRow] = dict(stored)
    for row in opened:
        rows[row.operation_id] = row
    relink = _subtrees(rows, {r.operation_id for r in opened}, stored, refused)
    order = [
        op
        for op in _top_down(rows, relink)
        if op not in refused.get(rows[op].parent_operation or "", frozenset())
    ]
    for op in order:
        rows[op] = _linked(rows, rows[op])
    for op in order:
        rows = _tell_ancestors(rows, rows[op])
    audit: dict[str, list[Mapping[str, Any]]] = {}
    for op in sorted(refused):
        if refused[op]:
            audit.setdefault(op, []).append(
                {"kind": "link-refused", "operation_id": op, "children": sorted(refused[op])}
            )
    causes: dict[str, Containment] = {}
    for change in changes:
        rows, signalled = _apply_change(rows, change)
        if change.change is Change.CONTAIN:
            for op in signalled:
                causes.setdefault(op, change)
        body = _change_audit(rows, change, signalled)
        if body is not None:
            audit.setdefault(change.operation_id, []).append(body)
    opened_ids = {r.operation_id for r in opened}
    # Arrivals whose own machine took an ANCESTOR_CONTAINED in this batch (the tool
    # reported it) have had their containment signal: another one would be rejected.
    told = {
        c.operation_id
        for c in changes
        if c.change is Change.CONTAIN and c.event_type == "ANCESTOR_CONTAINED"
    }
    events = _owed_events(rows, stored, causes, opened_ids & told, opened_ids, audit, now, producer)
    changed = {op: r for op, r in rows.items() if op in opened_ids or stored.get(op) != r}
    return LineagePlan(
        rows=changed,
        events=tuple(events),
        audit={op: tuple(items) for op, items in audit.items()},
    )


def _change_audit(
    rows: Mapping[str, LineageRow], change: Containment, signalled: Sequence[str]
) -> Mapping[str, Any] | None:
    """The audit body of a containment change that reaches other operations; None for
    one that does not (the decision record already shows the operation's own move)."""
    descendants = sorted(_descendants_of(rows, change.operation_id))
    if not descendants:
        return None
    return {
        "kind": "containment",
        "change": str(change.change),
        "operation_id": change.operation_id,
        "cause": _cause_json(change),
        "descendants": descendants,
        "signalled": sorted(signalled),
    }


def _owed_events(
    rows: Mapping[str, LineageRow],
    stored: Mapping[str, LineageRow],
    causes: Mapping[str, Containment],
    told: set[str],
    opened_ids: set[str],
    audit: dict[str, list[Mapping[str, Any]]],
    now: datetime,
    producer: str,
) -> list[CascadeEvent]:
    """One event per operation contained at the end of the batch that was not before
    it: signalled by a containment of this batch, or contained on arrival (linked below
    a containing ancestor), which is also audited on an opened operation's chain. An
    arrival in `told` (its own machine took an ANCESTOR_CONTAINED in this batch) is
    audited but not signalled again: a second signal would only be rejected and
    escalated. An arrival that contained itself for another reason is still signalled,
    since the ancestor's signal may stop and revoke more widely than its own transition."""
    events: list[CascadeEvent] = []
    for op in sorted(rows, key=lambda o: (len(rows[o].ancestors), o)):
        row = rows[op]
        earlier = stored.get(op)
        if not row.contained_ancestors or (earlier is not None and earlier.contained_ancestors):
            continue  # not contained, or already contained before this batch
        trigger = causes.get(op)
        ancestor = trigger.operation_id if trigger else _nearest(row)
        held_by = rows.get(ancestor)
        cause = held_by.containment_cause if held_by is not None else None
        chain = trigger.chain if trigger else (cause or ancestor)
        if trigger is None and op in opened_ids:
            audit.setdefault(op, []).append(
                {
                    "kind": "contained-on-arrival",
                    "operation_id": op,
                    "contained_ancestors": list(row.contained_ancestors),
                    "cause": chain,
                }
            )
            if op in told:
                continue
        events.append(_cascade_event(row, ancestor, chain, trigger, now, producer))
    return events


def _subtrees(
    rows: Mapping[str, LineageRow],
    roots: set[str],
    stored: Mapping[str, LineageRow],
    refused: Mapping[str, frozenset[str]],
) -> set[str]:
    """`roots` and every row below one of them by parent pointers, except children
    refused a link (`refused`, or refused before: `_refused_before`) and theirs."""
    children: dict[str, list[str]] = {}
    for op, row in rows.items():
        if row.parent_operation is not None:
            children.setdefault(row.parent_operation, []).append(op)
    found: set[str] = set()
    stack = list(roots)
    while stack:
        op = stack.pop()
        if op in found:
            continue
        found.add(op)
        stack.extend(
            c
            for c in children.get(op, ())
            if c not in refused.get(op, ()) and not _refused_before(stored, op, c)
        )
    return found


def _refused_before(stored: Mapping[str, LineageRow], parent: str, child: str) -> bool:
    """Whether `child`, stored below `parent` (stored before this batch too) by its
    parent pointer, is not linked below it: its link was refused when the parent
    arrived (or it closes a reported cycle), so no later batch links it."""
    above, below = stored.get(parent), stored.get(child)
    return above is not None and below is not None and below.ancestors[:1] != (parent,)


def _top_down(rows: Mapping[str, LineageRow], ops: Iterable[str]) -> list[str]:
    """`ops` ordered so that a parent comes before its children (depth by pointers)."""

    def depth(op: str) -> int:
        seen: set[str] = set()
        n, cur = 0, rows[op].parent_operation
        while cur is not None and cur in rows and cur not in seen and n < MAX_LINEAGE_DEPTH:
            seen.add(cur)
            n, cur = n + 1, rows[cur].parent_operation
        return n

    return sorted(ops, key=lambda op: (depth(op), op))


def _linked(rows: Mapping[str, LineageRow], row: LineageRow) -> LineageRow:
    parent = rows.get(row.parent_operation) if row.parent_operation else None
    if parent is None or row.operation_id in parent.ancestors:
        # Parent not reported yet (linked when it arrives), or a reported cycle.
        return row
    ancestors, agents, contained = lineage_below(parent)
    return replace(row, ancestors=ancestors, lineage_agents=agents, contained_ancestors=contained)


def _tell_ancestors(rows: dict[str, LineageRow], row: LineageRow) -> dict[str, LineageRow]:
    """Record `row`'s agent as a descendant agent of each of its known ancestors."""
    for ancestor in row.ancestors:
        found = rows.get(ancestor)
        if found is not None and row.agent not in found.descendant_agents:
            rows[ancestor] = replace(found, descendant_agents=(*found.descendant_agents, row.agent))
    return rows


def _descendants_of(rows: Mapping[str, LineageRow], op: str) -> list[str]:
    return [o for o, r in rows.items() if op in r.ancestors]


def _apply_change(
    rows: dict[str, LineageRow], change: Containment
) -> tuple[dict[str, LineageRow], list[str]]:
    op = change.operation_id
    signalled: list[str] = []
    if op in rows:
        containing = change.change is Change.CONTAIN
        rows[op] = replace(
            rows[op],
            containing=containing,
            containment_cause=change.chain if containing else None,
        )
    for desc in _descendants_of(rows, op):
        row = rows[desc]
        if change.change is Change.CONTAIN and op not in row.contained_ancestors:
            if not row.contained_ancestors:
                signalled.append(desc)
            rows[desc] = replace(row, contained_ancestors=(*row.contained_ancestors, op))
        elif change.change is Change.RELEASE and op in row.contained_ancestors:
            rows[desc] = replace(
                row, contained_ancestors=tuple(a for a in row.contained_ancestors if a != op)
            )
    return rows, signalled


def _nearest(row: LineageRow) -> str:
    contained = set(row.contained_ancestors)
    return next(a for a in row.ancestors if a in contained)


def _cause_json(change: Containment) -> dict[str, Any]:
    return {
        "operation_id": change.operation_id,
        "sequence": change.sequence,
        "event_id": change.event_id,
        "event_type": change.event_type,
        "chain": change.chain,
    }


def _cascade_event(
    row: LineageRow,
    ancestor: str,
    chain: str,
    trigger: Containment | None,
    now: datetime,
    producer: str,
) -> CascadeEvent:
    """The `ANCESTOR_CONTAINED` event for `row`. Its id is a function of the descendant
    and the containing decision, so a replanned or replayed batch emits the same one.
    The causation chain travels in `evidence_ref` (`cascade:<chain>`) and the evidence
    reference; `causation` stays empty because it names commands of the same operation."""
    cause = chain.split(" <- ", 1)[0]
    event_id = f"cascade:{row.operation_id}:{cause}"
    event = Event(
        event_type=CASCADE_EVENT,
        event_id=event_id,
        operation_id=row.operation_id,
        correlation_id=row.correlation_id,
        machine_name=row.machine_name,
        machine_version=row.machine_version,
        event_time=trigger.decided_at if trigger else now,
        evidence_ref=f"cascade:{chain}",
        producer=producer,
        lineage=row.lineage(),
        evidence=EvidencePayload(ancestor_operation=ancestor, reference=chain),
    )
    rid = record_id("event", row.operation_id, event_id)
    headers = {
        "record_id": rid,
        "operation_id": row.operation_id,
        "kind": "cascade" if trigger else "contained-on-arrival",
        "ancestor_operation": ancestor,
        "causation_chain": chain,
    }
    return CascadeEvent(rid, row.operation_id, headers, dumps(event.content()), event)


def lineage_message(operation_id: str) -> str:
    """The `VersionConflict` message when an operation's lineage moved under a batch."""
    return (
        f"operation {operation_id}: its lineage changed after the batch was decided (an "
        "ancestor was contained or linked); reload the view and decide again from the "
        "stored offsets"
    )
