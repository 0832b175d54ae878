"""A tiny controller loop over any `Ledger`, for the ledger tests.

It does what the consumer will do per batch: load the views of the batch's operations
(opening new ones with conservative defaults), decide every event with the real decision
core on a catalogue machine, fold the views with `apply`, and commit one `Batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache

from ledger import Batch, CommitResult, Entry, Ledger, Position, RowSigner, Source
from machines import CATALOGUE, Machine, Registry, load_catalogue, load_registry
from machines.decision import apply, decide
from machines.event import Event, EvidencePayload, Lineage
from machines.evidence import EvidenceDelta
from machines.policy import Policy
from machines.view import Approval, LineageStatus, OperationView, ToolFacts, new_view

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GROUP = "controllers"
TOPIC = "recovery.events"
VERIFIER = "verifier-1"
POLICY = Policy(id="ledger-tests", trusted_verifiers=(VERIFIER,))


@cache
def core() -> tuple[Machine, Registry]:
    """The pinned catalogue machine every ledger test drives, and its registry."""
    registry = load_registry()
    return load_catalogue(registry, CATALOGUE)["delegated-research"], registry


def event(
    op: str,
    index: int,
    kind: str,
    *,
    outcome: str | None = None,
    event_id: str | None = None,
    parent: str | None = None,
    producer: str = "tool-integration",
    runtime: str | None = "runtime-1",
) -> Event:
    """A well-formed event for operation `op`; `outcome` adds a trusted verification."""
    machine, _ = core()
    evidence = (
        EvidencePayload(outcome=outcome, verifier=VERIFIER, reference=f"ref://{op}/{index}")  # type: ignore[arg-type]
        if outcome is not None
        else None
    )
    return Event(
        event_type=kind,
        event_id=event_id or f"{op}-e{index}",
        operation_id=op,
        correlation_id=f"corr-{op}",
        machine_name=machine.name,
        machine_version=machine.version,
        event_time=T0 + timedelta(seconds=index),
        evidence_ref=f"evidence://{op}/{index}",
        producer=VERIFIER if outcome is not None else producer,
        lineage=Lineage(
            agent="agent-1",
            task="task-1",
            initiating_principal="alice",
            parent_operation=parent,
            origin_operation=parent,
            runtime=runtime,
        ),
        evidence=evidence,
    )


def sequence(op: str, *, parent: str | None = None) -> list[Event]:
    """Three events: a timeout (one command), a trusted verification, a rejected event
    (escalation command)."""
    return [
        event(op, 0, "TOOL_TIMEOUT", parent=parent),
        event(op, 1, "VERIFICATION_FOUND", outcome="applied", parent=parent),
        event(op, 2, "RETRY_SUCCEEDED", parent=parent),
    ]


def opened_view(op: str, agent: str) -> OperationView:
    """The view of an operation the controller starts governing."""
    machine, _ = core()
    return new_view(
        operation_id=op,
        machine_name=machine.name,
        machine_digest=machine.digest,
        policy_digest=POLICY.digest,
        initial_state=machine.initial,
        lineage=LineageStatus(agent=agent),
        facts=ToolFacts(idempotency_key=f"key-{op}", status_api=True),
        budget_limit=3,
        deadline=T0 + timedelta(hours=1),
    )


def decide_batch(
    ledger: Ledger,
    events: Sequence[Event],
    *,
    epoch: int,
    partition: int = 0,
    first_offset: int = 0,
    group: str = GROUP,
) -> Batch:
    """Decide `events` (consumed from `partition` from `first_offset`) over the ledger's
    current views and return the batch to commit."""
    machine, registry = core()
    ids = sorted({e.operation_id for e in events})
    stored = ledger.load_views(ids)
    base = {op: stored.get(op) for op in ids}
    # As the consumer does: operations the batch opens get the lineage the ledger
    # links them into, read once for the whole batch.
    openings: dict[str, str | None] = {}
    for ev in events:
        if ev.operation_id not in stored:
            openings.setdefault(ev.operation_id, ev.lineage.parent_operation)
    arrivals = ledger.arrival_lineage(openings)
    views: dict[str, OperationView] = {}
    entries: list[Entry] = []
    for offset, ev in enumerate(events, start=first_offset):
        view = views.get(ev.operation_id) or base[ev.operation_id]
        if view is None:
            opened = opened_view(ev.operation_id, ev.lineage.agent)
            view = base[ev.operation_id] = arrivals[ev.operation_id].applied_to(opened)
        decision = decide(machine, view, ev, POLICY, registry, ev.event_time)
        views[ev.operation_id] = apply(view, decision)
        entries.append(Entry(ev, decision, Source(TOPIC, partition, offset)))
    position = Position(TOPIC, partition, epoch, first_offset + len(events))
    return Batch(
        group=group,
        positions=(position,),
        views={op: v for op, v in base.items() if v is not None},
        entries=tuple(entries),
    )


def feed(
    ledger: Ledger,
    events: Sequence[Event],
    *,
    epoch: int,
    partition: int = 0,
    first_offset: int = 0,
    sign: RowSigner | None = None,
) -> CommitResult:
    """Decide and commit `events` as one batch (its outbox rows signed by `sign`)."""
    batch = decide_batch(
        ledger, events, epoch=epoch, partition=partition, first_offset=first_offset
    )
    return ledger.commit(replace(batch, sign=sign))


def with_approval(batch: Batch, nonce: str) -> Batch:
    """`batch` with its first decision carrying a verified approval using `nonce`, as the
    core records a HUMAN_APPROVED event it accepted (signature checking is the core's
    business and tested there; here only what the ledger stores matters)."""
    entry = batch.entries[0]
    approval = Approval(
        approver="approver-1",
        state=entry.decision.state_before,
        transition=entry.decision.state_after,
        machine_digest=entry.decision.machine_digest,
        expires_at=T0 + timedelta(hours=1),
        nonce=nonce,
        decision="approved",
        event_id=entry.event.event_id,
    )
    decision = replace(entry.decision, evidence=EvidenceDelta(approval=approval))
    return replace(batch, entries=(replace(entry, decision=decision), *batch.entries[1:]))
