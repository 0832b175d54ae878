"""What one consumed batch writes: its rows, derived without I/O, shared by both ledgers.

`batch_rows(batch)` turns the batch's (event, decision) pairs into every row the batch
writes: operations (the folded view, via `machines.decision.apply`), events, decisions,
evidence, approvals, the audit records SPEC §10 asks for, and the outbox rows (one per
command, deterministic id = command id, key = operation id). Audit records are chained
at commit time, under the operation lock, by `finish_outbox`/`ledger.audit`, because only
then is the chain head known. Both ledger implementations write the same rows, so the
in-memory fake cannot write anything the real ledger would not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import orjson

from ledger.audit import AUDIT_FORMAT, AuditRecord, operation_commitment, text_digest
from ledger.codec import (
    command_json,
    decision_json,
    envelope_json,
    facts_to_json,
    opened_json,
    view_to_json,
)
from ledger.deadletters import DeadLetter
from ledger.jsonutil import dumps
from ledger.rowsign import RowSigner
from machines import (
    ClaimKey,
    Containment,
    Decision,
    Event,
    KeyClaim,
    OperationView,
    Outcome,
    Timer,
    ToolFacts,
    apply,
    claimed_by,
    containment_of,
    identity_of,
)
from schemas import DEFAULT_TOPICS, TopicNames, record_id

__all__ = [
    "HEADS_FORMAT",
    "HEADS_KIND",
    "ApprovalRow",
    "AuditItem",
    "Batch",
    "BatchRows",
    "ClaimRow",
    "DecisionRow",
    "Entry",
    "EventRow",
    "EvidenceRow",
    "OperationRow",
    "OutboxRow",
    "Position",
    "RowSigner",
    "Source",
    "TimerRow",
    "TimerRows",
    "audit_bodies",
    "batch_rows",
    "command_lineage",
    "finish_outbox",
    "heads_row",
    "signed_row",
]


@dataclass(frozen=True, slots=True)
class Source:
    """Where a consumed event came from."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Position:
    """One partition the batch consumed: the epoch it was claimed at (checked at commit,
    so a fenced consumer cannot write) and the next offset to store."""

    topic: str
    partition: int
    epoch: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class Entry:
    """One decided event of the batch. `trace` holds the W3C trace context headers
    (`traceparent`, `tracestate`) of the decision's span; the commands it causes carry
    them, so a trace runs from the producing tool through the controller to the worker."""

    event: Event
    decision: Decision
    source: Source | None = None
    trace: Mapping[str, str] = field(default_factory=dict)
    # For a CONFLICT decision: the `recovery.DeadLetter` record of the consumed record
    # (its original key, value and headers, base64), which the conflict's dead letter
    # carries; without it the dead letter holds the envelope re-rendered as JSON.
    dead_letter: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """Everything one consumed batch caused. `views` are the views the decisions were
    made on (keyed by operation id; their `version` is the optimistic check); `entries`
    are in consumption order; `dead_letters` are the records the consumer refused
    (`ledger.deadletters`), written in the same transaction, so a stored offset never
    skips a refusal left unrecorded.

    `folded`, when the caller has it, holds each operation's view after the batch: the
    views `entries` folded onto `views` with `machines.decision.apply`, in order, which
    is what the caller that decided the batch did anyway (`machines.BatchFold`, run by
    `consumer.batch.decide_batch`). `batch_rows` then uses it rather than fold every
    decision a second time; without it, `batch_rows` folds. It must be exactly that fold
    (tests/unit/consumer/test_folded_views.py holds both ways equal)."""

    group: str
    positions: tuple[Position, ...]
    views: Mapping[str, OperationView]
    entries: tuple[Entry, ...] = ()
    dead_letters: tuple[DeadLetter, ...] = ()
    topics: TopicNames = DEFAULT_TOPICS
    folded: Mapping[str, OperationView] | None = None
    # Signs every outbox row the commit writes (the controller's key); None writes them
    # unsigned (simulations and tests that do not publish).
    sign: RowSigner | None = None
    # SPEC §10: the provenance of the machines operations are opened under, by machine
    # digest (`machines.MachineProvenance.to_dict`: publisher, key id, signature digest),
    # which each `operation-opened` record carries; and the controller that decided
    # (`{"id", "version"}`), which every decision and opened record names.
    provenance: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    controller: Mapping[str, str] | None = None
    # Per operation the batch opens, the children reported before it that the lineage
    # step must not link below it (`machines.may_link`, `BatchFold.unlinked`).
    unlinked: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OperationRow:
    """An operation the batch touches: its expected version, the view after the batch,
    and (used only when the batch opens it) who and what it is about."""

    operation_id: str
    expected_version: int
    view: OperationView
    correlation_id: str
    machine_version: str
    initiating_principal: str
    agent: str
    task: str
    runtime: str | None
    origin_operation: str | None
    parent_operation: str | None
    delegated_credentials: tuple[str, ...] = ()
    # The lineage status the batch was decided with (from the base view), which the
    # commit compares with the stored one under the operation's lock.
    decided_contained: tuple[str, ...] = ()
    decided_agents: frozenset[str] = frozenset()
    # The batch moved the operation to another version of its machine (a signed
    # migration, `machines.migration`): its row's machine columns follow the view.
    migrated: bool = False

    @property
    def opens(self) -> bool:
        """Whether this batch starts governing the operation (no decision before it)."""
        return self.expected_version == 0


@dataclass(frozen=True, slots=True)
class EventRow:
    """One accepted event with its full envelope."""

    event_id: str
    payload_digest: str
    operation_id: str
    event_type: str
    envelope_json: str
    source: Source | None


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One decision record of the core."""

    operation_id: str
    sequence: int
    event_id: str
    outcome: str
    state_before: str
    state_after: str
    decided_at: datetime
    decision: Mapping[str, Any]
    decision_json: str


@dataclass(frozen=True, slots=True)
class EvidenceRow:
    """One piece of evidence an event offered, with its source and whether it is trusted."""

    operation_id: str
    event_id: str
    kind: str
    source: str | None
    trusted: bool
    reference: str | None
    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    """One verified human decision; its nonce is unique across the ledger."""

    event_id: str
    operation_id: str
    approver: str
    verdict: str
    state: str
    transition: str
    machine_digest: str
    expires_at: datetime
    nonce: str
    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class AuditItem:
    """An audit record still to be chained; `dead_letter` is the record to send to the
    dead-letter topic with it (a conflicting event), keyed by its audit sequence."""

    operation_id: str
    kind: str
    body: Mapping[str, Any]
    body_json: str
    dead_letter: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One record for the relay to publish; `record_id` is deterministic."""

    record_id: str
    topic: str
    key: str
    headers: Mapping[str, str]
    payload_json: str
    # Set for an audit record's row: PostgreSQL stores a reference to the record (same
    # key = operation, this sequence) instead of a second copy of it.
    audit_sequence: int | None = None
    # The Kafka value the controller signed (`schemas.SignedRow`), which the relay
    # publishes as it is; None for an unsigned row, which the relay encodes.
    value: bytes | None = None


@dataclass(frozen=True, slots=True)
class TimerRow:
    """A timer a batch arms (`machines.timers`), with the partition its operation's
    events arrive on: only that partition's owner fires it."""

    operation_id: str
    machine_name: str
    timer: Timer
    topic: str | None
    partition: int | None


@dataclass(frozen=True, slots=True)
class TimerRows:
    """What a batch does to the timers table: the timers its decisions armed, the ids
    they disarmed (their state was left, or the operation ended) and the ids whose
    events they decided (spent)."""

    armed: tuple[TimerRow, ...] = ()
    disarmed: tuple[str, ...] = ()
    spent: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.armed or self.disarmed or self.spent)


@dataclass(frozen=True, slots=True)
class ClaimRow:
    """An idempotency key an operation the batch opens claims (`machines.claims`)."""

    key: ClaimKey
    claim: KeyClaim
    claimed_at: datetime


@dataclass(frozen=True, slots=True)
class BatchRows:
    """Every row of one batch except the chained audit records and their outbox rows."""

    operations: tuple[OperationRow, ...]
    events: tuple[EventRow, ...] = ()
    decisions: tuple[DecisionRow, ...] = ()
    evidence: tuple[EvidenceRow, ...] = ()
    approvals: tuple[ApprovalRow, ...] = ()
    audit: tuple[AuditItem, ...] = ()
    commands: tuple[OutboxRow, ...] = ()
    new_event_ids: frozenset[str] = field(default_factory=frozenset)
    # Decisions that start or end containment, in order (`machines.containment_of`).
    containments: tuple[Containment, ...] = ()
    # Cascade events planned by `with_lineage_plan`; inserted unless already stored.
    cascade: tuple[OutboxRow, ...] = ()
    # `recovery.EvidenceEvent` rows: the trusted evidence each decision accepted.
    published_evidence: tuple[OutboxRow, ...] = ()
    timers: TimerRows = TimerRows()
    # The idempotency keys the operations the batch opens claim; the commit writes them
    # under a unique key and refuses the batch when another operation got one first.
    claims: tuple[ClaimRow, ...] = ()

    @property
    def needs_lineage(self) -> bool:
        """Whether the commit must run the lineage step: the batch opens an operation
        (to link it) or changes containment (the lineage walk). Other batches touch
        only their own operations."""
        return bool(self.containments) or any(op.opens for op in self.operations)

    @property
    def operation_ids(self) -> tuple[str, ...]:
        """The touched operations in lock order (sorted: two writers never deadlock)."""
        return tuple(sorted(op.operation_id for op in self.operations))


def batch_rows(batch: Batch, topics: TopicNames | None = None) -> BatchRows:
    """The rows `batch` writes. Raises `ValueError` for a batch that contradicts itself
    (an entry whose operation has no base view, or whose decision is not for its event):
    that is a bug in the caller, not a ledger outcome.

    With `batch.folded`, the views after the batch come from it instead of `apply`. What
    the rows need from the view *between* decisions is then read where the fold would
    have put it, by `apply`'s rules: the idempotency key from the last declared facts
    (only an accepted `facts` delta changes them), the deadline from the base view
    (`apply` never changes it), and a conflict's stored digest from the final view (an
    event id once seen is never applied again, so its digest never changes)."""
    topics = topics or batch.topics
    folded = batch.folded
    views: dict[str, OperationView] = {}
    facts: dict[str, ToolFacts] = {}
    firsts: dict[str, Event] = {}
    opened_at: dict[str, datetime] = {}
    # Each operation's deadline as text, formatted once (`apply` never changes it).
    deadlines: dict[str, str | None] = {}
    events: list[EventRow] = []
    decisions: list[DecisionRow] = []
    evidence: list[EvidenceRow] = []
    approvals: list[ApprovalRow] = []
    audit: list[AuditItem] = []
    commands: list[OutboxRow] = []
    published: list[OutboxRow] = []
    containments: list[Containment] = []
    sources: dict[str, Source | None] = {}
    for entry in batch.entries:
        event, decision = entry.event, entry.decision
        op = _check_entry(batch, entry)
        sources[op] = entry.source or sources.get(op)
        if op not in firsts:
            firsts[op] = event
            opened_at[op] = decision.decided_at
            views[op] = batch.views[op]
            facts[op] = views[op].facts
            deadline = views[op].deadline
            deadlines[op] = None if deadline is None else deadline.isoformat()
            if views[op].version == 0:
                audit.append(_opened(views[op], event, batch, deadlines[op]))
        if decision.outcome is Outcome.DUPLICATE:
            continue  # already recorded: redelivery is idempotent
        if decision.outcome is Outcome.CONFLICT:
            audit.append(
                _conflict(
                    views[op] if folded is None else folded[op], entry, _identity(views[op], event)
                )
            )
            continue
        if folded is None:
            views[op] = apply(views[op], decision)
            facts[op] = views[op].facts
        elif decision.evidence.facts is not None:
            facts[op] = decision.evidence.facts
        events.append(_event_row(entry))
        row = _decision_row(decision)
        decisions.append(row)
        offered, approval = _offered(event, decision, row.decision["evidence"])
        evidence.extend(offered)
        published.extend(_evidence_events(event, decision, topics))
        if approval is not None:
            approvals.append(approval)
        audit.append(_decision_audit(row, event, batch, views[op]))
        commands.extend(
            _command_rows(decision, facts[op], deadlines[op], row.decision, topics, entry.trace)
        )
        change = containment_of(event, decision)
        if change is not None:
            containments.append(change)
    final = views if folded is None else folded
    # An operation whose events were all redelivered records nothing, so its row is not
    # rewritten either: the view it was loaded with carries the lineage columns laid
    # over it, and storing that without an audit record would leave the row differing
    # from what its newest audit record commits to (audit/2).
    recorded = {item.operation_id for item in audit}
    operations = tuple(
        _operation_row(batch.views[op], final[op], firsts[op]) for op in firsts if op in recorded
    )
    claims = tuple(
        ClaimRow(*claimed, opened_at[op])
        for op in firsts
        if batch.views[op].version == 0 and op in recorded
        if (claimed := claimed_by(final[op])) is not None
    )
    return BatchRows(
        operations=operations,
        claims=claims,
        events=tuple(events),
        decisions=tuple(decisions),
        evidence=tuple(evidence),
        approvals=tuple(approvals),
        audit=_committed(audit, final),
        commands=tuple(commands),
        new_event_ids=frozenset(e.event_id for e in events),
        containments=tuple(containments),
        published_evidence=tuple(published),
        timers=_timer_rows(operations, batch.views, sources),
    )


def _timer_rows(
    operations: Sequence[OperationRow],
    base: Mapping[str, OperationView],
    sources: Mapping[str, Source | None],
) -> TimerRows:
    """The timers table's changes: each written operation's timers after the batch
    against those it was loaded with (the table holds exactly a view's timers)."""
    armed: list[TimerRow] = []
    disarmed: list[str] = []
    spent: list[str] = []
    for row in operations:
        before = {t.timer_id: t for t in base[row.operation_id].timers}
        after = row.view.timers
        if not before and not after:
            continue
        source = sources.get(row.operation_id)
        kept = set()
        for timer in after:
            kept.add(timer.timer_id)
            earlier = before.get(timer.timer_id)
            if earlier is None:
                topic = None if source is None else source.topic
                partition = None if source is None else source.partition
                armed.append(
                    TimerRow(row.operation_id, row.view.machine_name, timer, topic, partition)
                )
            elif timer.spent and not earlier.spent:
                spent.append(timer.timer_id)
        disarmed.extend(t for t in before if t not in kept)
    return TimerRows(tuple(armed), tuple(disarmed), tuple(spent))


def _identity(view: OperationView, event: Event) -> dict[str, str | None]:
    """The operation's identities every audit record names (SPEC §10: initiating
    principal, agent, runtime, task), as it was opened; a view stored before they were
    kept gives the event's own lineage instead."""
    identity = identity_of(view)
    if view.principal is None:
        lineage = event.lineage
        identity.update(
            initiating_principal=lineage.initiating_principal,
            runtime=lineage.runtime,
            task=lineage.task,
        )
    return identity


def _decision_audit(row: DecisionRow, event: Event, batch: Batch, view: OperationView) -> AuditItem:
    """A decision's audit record: the decision record, its digest, the identities of the
    operation (`_identity`), the controller that decided and, when the event has one, its
    payload as intake minimized it (`machines.minimize_event`: the redacted copy the
    machine's `audit.record` keeps, or a reference to it), so the audit trail holds no
    redacted value (SPEC §10)."""
    body = {
        **row.decision,
        "format": AUDIT_FORMAT,
        "decision_digest": text_digest(row.decision_json),
        "identity": _identity(view, event),
    }
    if batch.controller is not None:
        body["controller"] = batch.controller
    if event.payload is not None:
        body["payload"] = event.payload
    return AuditItem(row.operation_id, "decision", body, "")


def _committed(audit: list[AuditItem], final: Mapping[str, OperationView]) -> tuple[AuditItem, ...]:
    """The audit items in audit/2 form: each body says its format, and the last item of
    each operation in the batch commits to the operation row after the batch (state,
    counters, view digest), so `audit verify` can check the row against the chain."""
    last = {item.operation_id: i for i, item in enumerate(audit)}
    out: list[AuditItem] = []
    for i, item in enumerate(audit):
        body = dict(item.body)
        body["format"] = AUDIT_FORMAT
        if last[item.operation_id] == i:
            view = final[item.operation_id]
            body["operation"] = operation_commitment(
                view.state, _counters(view), view_to_json(view)
            )
        out.append(replace(item, body=body, body_json=dumps(body)))
    return tuple(out)


def _counters(view: OperationView) -> dict[str, int]:
    return {
        "version": view.version,
        "epoch": view.epoch,
        "retry_attempts": view.retry_attempts,
        "recovery_attempts": view.recovery_attempts,
        "budget_spent": view.budget_spent,
    }


def _evidence_events(event: Event, decision: Decision, topics: TopicNames) -> list[OutboxRow]:
    """One `recovery.EvidenceEvent` outbox row per piece of trusted evidence `decision`
    accepted (a verification, a validated checkpoint, a contained ancestor), keyed by
    the operation, for other controllers and agents. Approvals and classifier output are
    not republished: an approval is a signed human decision, not evidence of an effect,
    and classifier output is never trusted (SPEC §11)."""
    ev = decision.evidence
    if ev.verification is None and ev.checkpoint is None and ev.contained_ancestor is None:
        return []  # most decisions
    op, seq = decision.operation_id, decision.sequence
    parts: list[tuple[str, dict[str, Any]]] = []
    if ev.verification is not None:
        v = ev.verification
        parts.append(
            (
                "verification",
                {"outcome": v.outcome, "verifier": v.verifier, "reference": v.reference},
            )
        )
    if ev.checkpoint is not None and ev.checkpoint.validated:
        c = ev.checkpoint
        parts.append(
            (
                "checkpoint",
                {
                    "verifier": c.validator,
                    "reference": c.reference,
                    "checkpoint_id": c.checkpoint_id,
                },
            )
        )
    if ev.contained_ancestor is not None:
        parts.append(("contained-ancestor", {"ancestor_operation": ev.contained_ancestor}))
    rows: list[OutboxRow] = []
    for kind, fields in parts:
        record_id = f"evidence:{op}:{seq}:{kind}"
        payload = {
            "evidence_id": record_id,
            "operation_id": op,
            "correlation_id": event.correlation_id,
            "sequence": seq,
            "source_event_id": event.event_id,
            "machine_name": decision.machine_name,
            "machine_version": decision.machine_version,
            "outcome": None,
            "verifier": None,
            "reference": event.evidence_ref,
            "checkpoint_id": None,
            "ancestor_operation": None,
            "recorded_at": decision.decided_at.isoformat(),
            "producer": event.producer,
            **fields,
        }
        headers = {"record_id": record_id, "operation_id": op, "kind": kind}
        rows.append(OutboxRow(record_id, topics.evidence, op, headers, dumps(payload)))
    return rows


def _check_entry(batch: Batch, entry: Entry) -> str:
    op = entry.decision.operation_id
    if op not in batch.views:
        raise ValueError(f"batch entry for operation {op} has no base view; load it first")
    if batch.folded is not None and op not in batch.folded:
        raise ValueError(
            f"batch entry for operation {op} has no folded view; pass the view after the "
            "batch for every operation it touches, or no folded views at all"
        )
    if entry.decision.event_id != entry.event.event_id or entry.event.operation_id != op:
        raise ValueError(
            f"decision for event {entry.decision.event_id} (operation {op}) is paired with "
            f"event {entry.event.event_id} (operation {entry.event.operation_id})"
        )
    return op


def _operation_row(base: OperationView, final: OperationView, first: Event) -> OperationRow:
    lineage = first.lineage
    return OperationRow(
        operation_id=base.operation_id,
        expected_version=base.version,
        view=final,
        correlation_id=first.correlation_id,
        machine_version=final.machine_version or first.machine_version,
        initiating_principal=lineage.initiating_principal,
        agent=lineage.agent,
        task=lineage.task,
        runtime=final.runtime if final.principal is not None else lineage.runtime,
        origin_operation=lineage.origin_operation,
        parent_operation=lineage.parent_operation,
        delegated_credentials=tuple(lineage.delegated_credentials),
        decided_contained=base.lineage.contained_ancestors,
        decided_agents=base.lineage.lineage_agents,
        migrated=base.machine_digest != final.machine_digest,
    )


def _opened(view: OperationView, event: Event, batch: Batch, deadline: str | None) -> AuditItem:
    """The `operation-opened` record: who and what the operation is about, the machine it
    is pinned to with the provenance that was verified (SPEC §8 step 1, §10) and the
    controller that opened it."""
    lineage = event.lineage
    body = {
        "operation_id": view.operation_id,
        "correlation_id": event.correlation_id,
        "machine": {
            "name": view.machine_name,
            "version": view.machine_version or event.machine_version,
            "digest": view.machine_digest,
            "provenance": batch.provenance.get(view.machine_digest),
        },
        "controller": batch.controller,
        "policy_digest": view.policy_digest,
        "initial_state": view.state,
        "initiating_principal": lineage.initiating_principal,
        "agent": lineage.agent,
        "runtime": lineage.runtime,
        "task": lineage.task,
        "origin_operation": lineage.origin_operation,
        "parent_operation": lineage.parent_operation,
        "delegated_credentials": list(lineage.delegated_credentials),
        "facts": facts_to_json(view.facts),
        "budget_limit": view.budget_limit,
        "deadline": deadline,
        "opened_by_event": event.event_id,
    }
    return AuditItem(view.operation_id, "operation-opened", body, opened_json(body))


def _conflict(view: OperationView, entry: Entry, identity: Mapping[str, Any]) -> AuditItem:
    event = entry.event
    stored = view.seen_events.get(event.event_id)
    reason = (
        f"operation {view.operation_id}: event id {event.event_id} reused with payload "
        f"{event.payload_digest}; the stored event has {stored}"
    )
    body = {
        "event_id": event.event_id,
        "event_type": event.event_type,
        "producer": event.producer,
        "stored_digest": stored,
        "offered_digest": event.payload_digest,
        "reason": reason,
        "identity": identity,
    }
    dead_letter: dict[str, Any]
    if entry.dead_letter is not None:
        dead_letter = {**entry.dead_letter, "reason_code": "event-id-conflict", "reason": reason}
    else:
        dead_letter = {
            "reason": reason,
            "code": "event-id-conflict",
            "envelope": event.to_dict(),
            "source": None if entry.source is None else _source_json(entry.source),
        }
    return AuditItem(view.operation_id, "event-conflict", body, dumps(body), dead_letter)


def _source_json(source: Source) -> dict[str, Any]:
    return {"topic": source.topic, "partition": source.partition, "offset": source.offset}


def _event_row(entry: Entry) -> EventRow:
    event = entry.event
    return EventRow(
        event_id=event.event_id,
        payload_digest=event.payload_digest,
        operation_id=event.operation_id,
        event_type=event.event_type,
        envelope_json=envelope_json(event),
        source=entry.source,
    )


def _decision_row(decision: Decision) -> DecisionRow:
    record = decision.to_dict()
    return DecisionRow(
        operation_id=decision.operation_id,
        sequence=decision.sequence,
        event_id=decision.event_id,
        outcome=str(decision.outcome),
        state_before=decision.state_before,
        state_after=decision.state_after,
        decided_at=decision.decided_at,
        decision=record,
        decision_json=decision_json(record),
    )


def _offered(
    event: Event, decision: Decision, delta: Mapping[str, Any]
) -> tuple[list[EvidenceRow], ApprovalRow | None]:
    """The evidence rows and the approval row of one decision; `delta` is its record's
    `evidence` (`decision.evidence.to_dict()`, already built for the record)."""
    if not delta and decision.classifier is None:
        return [], None  # most decisions accept no evidence and carry no classifier output
    return _evidence_rows(event, decision, delta), _approval_row(event, decision, delta)


def _evidence_rows(event: Event, decision: Decision, delta: Mapping[str, Any]) -> list[EvidenceRow]:
    """Every piece of evidence the event offered that the core looked at: trusted facts it
    accepted, and classifier output, which is recorded but never trusted (SPEC §11).
    `delta` is the decision record's `evidence` (`decision.evidence.to_dict()`)."""
    op, eid = decision.operation_id, decision.event_id
    rows: list[EvidenceRow] = []
    ev = decision.evidence
    if ev.verification is not None:
        v = ev.verification
        rows.append(
            EvidenceRow(
                op, eid, "verification", v.verifier, True, v.reference, delta["verification"]
            )
        )
    if ev.approval is not None:
        a = ev.approval
        rows.append(EvidenceRow(op, eid, "approval", a.approver, True, None, delta["approval"]))
    if ev.checkpoint is not None:
        c = ev.checkpoint
        rows.append(
            EvidenceRow(
                op, eid, "checkpoint", c.validator, c.validated, c.reference, delta["checkpoint"]
            )
        )
    if ev.contained_ancestor is not None:
        rows.append(
            EvidenceRow(
                op,
                eid,
                "contained-ancestor",
                event.producer,
                True,
                event.evidence_ref,
                {"contained_ancestor": ev.contained_ancestor},
            )
        )
    if ev.denial is not None:
        rows.append(
            EvidenceRow(
                op,
                eid,
                "denial",
                event.producer,
                True,
                event.evidence_ref,
                {"denial": ev.denial, "event_type": event.event_type},
            )
        )
    if ev.key_reuse is not None:
        rows.append(
            EvidenceRow(
                op, eid, "key-reuse", event.producer, True, event.evidence_ref, delta["key_reuse"]
            )
        )
    if decision.classifier is not None:
        c_rec = decision.classifier
        rows.append(
            EvidenceRow(
                op, eid, "classifier", c_rec.identity, False, event.evidence_ref, c_rec.to_dict()
            )
        )
    return rows


def _approval_row(event: Event, decision: Decision, delta: Mapping[str, Any]) -> ApprovalRow | None:
    approval = decision.evidence.approval
    if approval is None:
        return None
    human = event.human_decision
    record: dict[str, Any] = dict(delta["approval"])
    record["signature"] = None if human is None else human.signature
    return ApprovalRow(
        event_id=event.event_id,
        operation_id=decision.operation_id,
        approver=approval.approver,
        verdict=approval.decision,
        state=approval.state,
        transition=approval.transition,
        machine_digest=approval.machine_digest,
        expires_at=approval.expires_at,
        nonce=approval.nonce,
        record=record,
    )


def _command_rows(
    decision: Decision,
    facts: ToolFacts,
    deadline: str | None,
    record: Mapping[str, Any],
    topics: TopicNames,
    trace: Mapping[str, str],
) -> list[OutboxRow]:
    """One outbox row per invocation. Every command carries the operation's declared
    idempotency key and deadline (`facts` of the view after `decision`, and the
    operation's `deadline` as ISO-8601 text): a retry must reuse the key the tool was
    first called with (SKILL §4: never mint a new key after a timeout), and a verifier
    needs it to ask the tool's status API about that request. `record` is the
    decision's `to_dict()`: the payload is written from its strings
    (`ledger.codec.command_json`), so the decision time is formatted once."""
    if not decision.invocations:
        return []  # most decisions
    rows: list[OutboxRow] = []
    for invocation, spec in zip(decision.invocations, record["invocations"], strict=True):
        headers = {
            **trace,
            "record_id": invocation.command_id,
            "operation_id": decision.operation_id,
            "capability": invocation.capability,
        }
        rows.append(
            OutboxRow(
                invocation.command_id,
                topics.commands,
                decision.operation_id,
                headers,
                command_json(record, spec, facts.idempotency_key, deadline),
            )
        )
    return rows


def command_lineage(
    agent: str,
    task: str,
    initiating_principal: str,
    origin_operation: str | None,
    parent_operation: str | None,
    delegated_credentials: Sequence[str],
) -> dict[str, Any]:
    """The lineage a command's payload carries (the operation row's, as opened), so that
    the relay encodes exactly the command the controller signed, without a lookup."""
    return {
        "agent": agent,
        "task": task,
        "initiating_principal": initiating_principal,
        "origin_operation": origin_operation,
        "parent_operation": parent_operation,
        "delegated_credentials": list(delegated_credentials),
    }


def signed_row(row: OutboxRow, sign: RowSigner | None, payload_json: str = "") -> OutboxRow:
    """`row` with the controller's signature in its headers and the value it signed
    (`sign` over `payload_json`, else the row's own payload); `row` itself without a
    signer."""
    if sign is None:
        return row
    signed = sign(row.topic, row.key, row.record_id, row.headers, payload_json or row.payload_json)
    return replace(row, headers=signed.headers, value=signed.value)


def _with_lineage(row: OutboxRow, lineage: Mapping[str, Any] | None) -> OutboxRow:
    if lineage is None:
        return row
    payload = orjson.loads(row.payload_json)
    payload["lineage"] = lineage
    return replace(row, payload_json=dumps(payload))


def finish_outbox(
    plan: BatchRows,
    chained: Mapping[str, list[AuditRecord]],
    topics: TopicNames = DEFAULT_TOPICS,
    *,
    audit_payloads: bool = True,
    sign: RowSigner | None = None,
    lineages: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[OutboxRow]:
    """All outbox rows of the batch, in insertion order: the commands, then each audit
    record (and the dead letter that goes with a conflict). `chained` holds, per
    operation, the records `chain_records` built from `plan.audit` in the same order.
    Without `audit_payloads` an audit record's row has an empty `payload_json`: a ledger
    that stores the row as a reference to the record (PostgreSQL, migration 0004) does
    not need the record encoded a second time. `lineages` (operation id ->
    `command_lineage`) goes into the commands' payloads; `sign` signs every row."""
    known = lineages or {}
    rows = [signed_row(_with_lineage(c, known.get(c.key)), sign) for c in plan.commands]
    rows.extend(signed_row(e, sign) for e in plan.published_evidence)
    cursor = {op: 0 for op in chained}
    for item in plan.audit:
        record = chained[item.operation_id][cursor[item.operation_id]]
        cursor[item.operation_id] += 1
        op, seq = record.operation_id, record.sequence
        published = record.published_json() if audit_payloads or sign is not None else ""
        audit_row = OutboxRow(
            f"audit:{op}:{seq}",
            topics.audit,
            op,
            {"record_id": f"audit:{op}:{seq}", "operation_id": op, "kind": record.kind},
            published if audit_payloads else "",
            audit_sequence=seq,
        )
        rows.append(signed_row(audit_row, sign, published))
        if item.dead_letter is not None:
            rows.append(
                signed_row(
                    OutboxRow(
                        f"dlq:{op}:{seq}",
                        topics.dlq,
                        op,
                        {
                            "record_id": f"dlq:{op}:{seq}",
                            "operation_id": op,
                            "reason": "event-id-conflict",
                        },
                        dumps(item.dead_letter),
                    ),
                    sign,
                )
            )
    return rows


HEADS_KIND = "chain-heads"
HEADS_FORMAT = "chain-heads/1"


def heads_row(
    chained: Mapping[str, Sequence[AuditRecord]],
    topics: TopicNames = DEFAULT_TOPICS,
    sign: RowSigner | None = None,
) -> OutboxRow | None:
    """The batch's `chain-heads` record for the audit topic: for every chain the batch
    extended (operations and intake chains), its newest sequence and hash, sorted by
    chain id; signed by `sign` like every row, so it anchors the database's chains
    outside it (`recoveryctl audit verify --against-topic`). None when the batch wrote
    no audit record. Its id is derived from the heads, so a replayed batch adds none."""
    heads = [
        {"operation_id": op, "sequence": records[-1].sequence, "hash": records[-1].hash}
        for op, records in sorted(chained.items())
        if records
    ]
    if not heads:
        return None
    rid = record_id(
        HEADS_KIND, *(f"{h['operation_id']}:{h['sequence']}:{h['hash']}" for h in heads)
    )
    payload = {"kind": HEADS_KIND, "format": HEADS_FORMAT, "heads": heads}
    row = OutboxRow(
        rid,
        topics.audit,
        str(heads[0]["operation_id"]),
        {"record_id": rid, "kind": HEADS_KIND},
        dumps(payload),
    )
    return signed_row(row, sign)


def audit_bodies(plan: BatchRows) -> dict[str, list[tuple[str, Mapping[str, Any], str]]]:
    """The plan's audit items grouped per operation, in order, ready for chaining."""
    out: dict[str, list[tuple[str, Mapping[str, Any], str]]] = {}
    for item in plan.audit:
        out.setdefault(item.operation_id, []).append((item.kind, item.body, item.body_json))
    return out
