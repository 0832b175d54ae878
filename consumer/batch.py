"""One consumed batch, planned: intake outcomes and stored views in, a ledger `Batch` out.

Pure: no clock (the caller passes `now`), no broker, no database. The controller loads
the views once, calls `plan_batch_of` and commits the result in one transaction; after a
`VersionConflict` it reloads the views and plans again, and after a conflicting id the
ledger names (`EventIdReused`, `NonceReused`) it plans again with that record in
`excluded`, so the batch is always decided from scratch, never patched.

Per record, in consumption order:

- refused at intake, or in `excluded`: a dead letter;
- an event id already used by another operation earlier in the batch: a dead letter
  (`event-id-conflict`); the ledger catches reuse across batches;
- an operation already governed by another machine: a dead letter
  (`machine-not-applicable`);
- otherwise the core decides it on the operation's view folded so far (a new operation
  gets a view from `machines.Simulation.open`, the same defaults `recoveryctl simulate`
  and the replay checks use, with the lineage the ledger gives it on arrival:
  `Ledger.arrival_lineage`, read once per batch for every operation it opens, see
  `openings`; a new operation whose parent the batch opened earlier is opened below
  that parent as folded so far, `_Fold.arrival_in_batch`), and the decision becomes an
  `Entry`. Duplicates and conflicts are entries too: the ledger records a conflict's
  audit record and dead letter with the operation. A forged or replayed human decision
  is recorded as the refused decision it is *and* dead-lettered (`forged-signature`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final

from consumer.deadletter import dead_letter
from consumer.intake import Accepted, Outcome, RawRecord, Refusal, RefusalCode, Rejected
from ledger import Batch, DeadLetter, Entry, Position, Source, Topics
from machines import (
    STANDARD_GUARDS,
    Arrival,
    Change,
    Decision,
    LineageRow,
    Machine,
    OperationSetup,
    OperationView,
    Policy,
    Registry,
    Simulation,
    apply,
    arrival_of,
    containment_of,
    decide,
)
from machines import Outcome as DecisionOutcome
from machines.guards import GuardFn

log = logging.getLogger("consumer")

__all__ = [
    "FORGED_REFUSALS",
    "Observer",
    "Planned",
    "Rules",
    "open_view",
    "openings",
    "operation_ids",
    "plan_batch_of",
    "positions_for",
    "run_unobserved",
]

# Refusal codes of `machines.approvals` that mean a hostile human decision rather than a
# late or mistaken one: dead-lettered as well as recorded.
FORGED_REFUSALS: Final = frozenset(
    {"approval-bad-signature", "approval-unknown-approver", "approval-replayed-nonce"}
)

# How the controller wraps one decision (a span, a latency sample): it runs `decide`
# and returns the decision with the trace headers its commands should carry.
Observer = Callable[[Accepted, Callable[[], Decision]], tuple[Decision, Mapping[str, str]]]


def run_unobserved(
    _item: Accepted, run: Callable[[], Decision]
) -> tuple[Decision, Mapping[str, str]]:
    """The `Observer` that only decides (tests, replays)."""
    return run(), {}


@dataclass(frozen=True, slots=True)
class Rules:
    """What every decision of this controller is made under."""

    policy: Policy
    registry: Registry
    guard_table: Mapping[str, GuardFn] = field(default_factory=lambda: dict(STANDARD_GUARDS))


@dataclass(frozen=True, slots=True)
class Planned:
    """A planned batch: the ledger `Batch` and what it holds, for metrics and logs."""

    batch: Batch
    decisions: tuple[Decision, ...]
    refused: tuple[tuple[RawRecord, Refusal], ...]

    @property
    def duplicates(self) -> int:
        """Events already decided (redelivered with the same payload)."""
        return sum(d.outcome is DecisionOutcome.DUPLICATE for d in self.decisions)

    @property
    def conflicts(self) -> int:
        """Events whose id was reused with another payload (dead-lettered by the ledger)."""
        return sum(d.outcome is DecisionOutcome.CONFLICT for d in self.decisions)


def open_view(machine: Machine, rules: Rules, accepted: Accepted) -> OperationView:
    """The view of an operation its first event opens: the event's lineage agent is the
    affected agent, the policy's budget and deadline from the event time. Tool facts the
    first event declares are admitted by the core when it decides that event
    (`machines.facts.admit_facts`, folded by `apply`), exactly as in
    `machines.Simulation.feed`, so live and replayed runs agree."""
    event = accepted.event
    setup = OperationSetup(operation_id=event.operation_id, agent=event.lineage.agent)
    return Simulation(machine, rules.registry, rules.policy).open(setup, event.event_time)


def operation_ids(outcomes: Iterable[Outcome]) -> list[str]:
    """The operations a batch's accepted events touch, sorted (the views to load)."""
    return sorted({o.event.operation_id for o in outcomes if isinstance(o, Accepted)})


def openings(
    outcomes: Iterable[Outcome], stored: Mapping[str, OperationView]
) -> dict[str, str | None]:
    """The operations the batch's accepted events would open (not in `stored`), each with
    the parent operation its first event names: what `Ledger.arrival_lineage` answers
    in one read, so a new operation is decided below its stored parent's lineage."""
    found: dict[str, str | None] = {}
    for o in outcomes:
        if isinstance(o, Accepted) and o.event.operation_id not in stored:
            found.setdefault(o.event.operation_id, o.event.lineage.parent_operation)
    return found


def positions_for(
    records: Iterable[RawRecord], epochs: Mapping[tuple[str, int], int]
) -> tuple[Position, ...]:
    """One `Position` per consumed partition: its claimed epoch and the offset after the
    last record of the batch. Raises `KeyError` for a partition without an epoch (the
    caller must not plan records of partitions it does not own)."""
    last: dict[tuple[str, int], int] = {}
    for r in records:
        tp = (r.topic, r.partition)
        last[tp] = max(last.get(tp, -1), r.offset)
    return tuple(
        Position(topic, partition, epochs[(topic, partition)], offset + 1)
        for (topic, partition), offset in sorted(last.items())
    )


class _Fold:
    """The mutable state of planning one batch (kept inside `plan_batch_of`)."""

    def __init__(
        self,
        stored: Mapping[str, OperationView],
        rules: Rules,
        arrivals: Mapping[str, Arrival],
    ) -> None:
        self.rules = rules
        self.stored = stored
        self.arrivals = arrivals
        # The operations this batch opens, with the lineage each was opened with and
        # whether it is containing as folded so far: a child opened below one of them
        # later in the batch is decided below it (the ledger cannot know it yet).
        self.opened: dict[str, tuple[Accepted, Arrival]] = {}
        self.containing: dict[str, bool] = {}
        self.base: dict[str, OperationView] = {}
        self.current: dict[str, OperationView] = {}
        self.event_owner: dict[str, str] = {}
        self.entries: list[Entry] = []
        self.decisions: list[Decision] = []
        self.refused: list[tuple[RawRecord, Refusal]] = []

    def view_of(self, item: Accepted) -> OperationView:
        op = item.event.operation_id
        if op not in self.current:
            view = self.stored.get(op)
            if view is None:
                # The lineage it is linked into on commit: a new child of a contained
                # parent is decided as contained from its first event (L5.5).
                arrival = self.arrival_in_batch(item)
                self.opened[op] = (item, arrival)
                view = arrival.applied_to(open_view(item.machine, self.rules, item))
            self.base[op] = view
            self.current[op] = view
        return self.current[op]

    def arrival_in_batch(self, item: Accepted) -> Arrival:
        """The lineage a new operation is opened with: the ledger's (`arrivals`), extended
        by what the ledger cannot know yet because this batch opens it too, with the same
        `arrival_of` derivation the commit's linking makes: when its parent was opened
        earlier in the batch, the parent's own arrival, its agent, and the parent itself
        as a contained ancestor if it is containing as folded so far; and the agents of
        children opened earlier in the batch that name it as parent, with theirs."""
        op = item.event.operation_id
        stored = self.arrivals.get(op) or Arrival(op)
        parent_id = item.event.lineage.parent_operation
        parent = (
            self.row_of(parent_id) if parent_id is not None and parent_id in self.opened else None
        )
        children = [
            self.row_of(c)
            for c, (first, _) in self.opened.items()
            if first.event.lineage.parent_operation == op
        ]
        if parent is None and not children:
            return stored
        below = arrival_of(op, parent, children)
        descendants = stored.descendant_agents + tuple(
            a for a in below.descendant_agents if a not in stored.descendant_agents
        )
        if parent is None:
            return replace(stored, descendant_agents=descendants)
        return Arrival(
            op, below.ancestors, below.lineage_agents, below.contained_ancestors, descendants
        )

    def row_of(self, op: str) -> LineageRow:
        """The lineage row an operation opened earlier in this batch will be linked with
        (its first event's lineage, the arrival it was opened with, containing as folded
        so far): what `arrival_of` needs, since the ledger does not store it yet."""
        first, arrival = self.opened[op]
        ev, lineage = first.event, first.event.lineage
        return LineageRow(
            operation_id=op,
            correlation_id=ev.correlation_id,
            machine_name=ev.machine_name,
            machine_version=ev.machine_version,
            state=self.current[op].state,
            agent=lineage.agent,
            task=lineage.task,
            initiating_principal=lineage.initiating_principal,
            origin_operation=lineage.origin_operation,
            parent_operation=lineage.parent_operation,
            delegated_credentials=lineage.delegated_credentials,
            ancestors=arrival.ancestors,
            lineage_agents=arrival.lineage_agents,
            contained_ancestors=arrival.contained_ancestors,
            containing=self.containing.get(op, False),
            descendant_agents=arrival.descendant_agents,
        )

    def note_containment(self, item: Accepted, decision: Decision) -> None:
        """Fold whether an operation this batch opens is containing after `decision`."""
        op = item.event.operation_id
        if op in self.opened:
            change = containment_of(item.event, decision)
            if change is not None:
                self.containing[op] = change.change is Change.CONTAIN

    def precheck(self, item: Accepted) -> Refusal | None:
        event, machine = item.event, item.machine
        owner = self.event_owner.setdefault(event.event_id, event.operation_id)
        if owner != event.operation_id:
            return Refusal(
                RefusalCode.EVENT_ID_CONFLICT,
                f"record {item.record.coordinates}: event id {event.event_id} is already "
                f"used by operation {owner} in this batch; event ids are unique per event",
                event.event_id,
                event.operation_id,
            )
        stored = self.current.get(event.operation_id) or self.stored.get(event.operation_id)
        if stored is not None and (stored.machine_name, stored.machine_digest) != (
            machine.name,
            machine.digest,
        ):
            return Refusal(
                RefusalCode.MACHINE_NOT_APPLICABLE,
                f"record {item.record.coordinates}: event {event.event_id} names machine "
                f"{machine.name}@{machine.version}, but operation {event.operation_id} is "
                f"governed by {stored.machine_name} ({stored.machine_digest})",
                event.event_id,
                event.operation_id,
            )
        return None


def plan_batch_of(
    outcomes: Sequence[Outcome],
    stored: Mapping[str, OperationView],
    rules: Rules,
    *,
    group: str,
    controller: str,
    positions: tuple[Position, ...],
    now: datetime,
    excluded: Mapping[str, Refusal] | None = None,
    observe: Observer = run_unobserved,
    runtime: str | None = None,
    topics: Topics | None = None,
    arrivals: Mapping[str, Arrival] | None = None,
) -> Planned:
    """Decide a batch (see the module docstring). `stored` are the views the ledger
    holds for the batch's operations; `arrivals` the lineage it gives the operations
    the batch opens (`Ledger.arrival_lineage` of `openings`; without it a new view has
    no lineage, which is right only when the ledger knows none); `excluded` maps record
    coordinates to a refusal the ledger reported for them on an earlier attempt;
    `topics` names the output topics the outbox rows go to (default: the standard
    names)."""
    fold = _Fold(stored, rules, arrivals or {})
    letters: list[DeadLetter] = []
    excluded = excluded or {}
    for outcome in outcomes:
        record = outcome.record
        # Formatting the coordinates costs more than the lookup; `excluded` is empty on
        # every first attempt.
        refusal = excluded.get(record.coordinates) if excluded else None
        if refusal is None and isinstance(outcome, Rejected):
            refusal = outcome.refusal
        if refusal is None and isinstance(outcome, Accepted):
            refusal = fold.precheck(outcome) or _decide(fold, outcome, now, observe)
        if refusal is not None:
            fold.refused.append((record, refusal))
            letters.append(dead_letter(group, controller, record, refusal, now))
    batch = Batch(
        group=group,
        positions=positions,
        views=dict(fold.base),
        entries=tuple(fold.entries),
        runtime=runtime,
        dead_letters=tuple(letters),
        topics=topics or Topics(),
        folded=dict(fold.current),
    )
    return Planned(batch, tuple(fold.decisions), tuple(fold.refused))


def _decide(fold: _Fold, item: Accepted, now: datetime, observe: Observer) -> Refusal | None:
    """Decide one accepted event; returns a refusal when it must also be dead-lettered."""
    view = fold.view_of(item)
    rules = fold.rules
    event = item.event

    def run() -> Decision:
        return decide(
            item.machine,
            view,
            event,
            rules.policy,
            rules.registry,
            now,
            guard_table=rules.guard_table,
        )

    record = item.record
    try:
        decision, trace = observe(item, run)
    except Exception as exc:
        # `decide` never raises for bad input; if it does, that is a bug in the core
        # met by this one record. Dead-letter it loudly rather than let it stop the
        # partition forever (every replay would hit it again).
        log.exception("decision core failed on %s", record.coordinates)
        return Refusal(
            RefusalCode.DECISION_FAILED,
            f"record {record.coordinates}: the decision core failed on event "
            f"{event.event_id}: {type(exc).__name__}: {exc}; report it with this record",
            event.event_id,
            event.operation_id,
        )
    source = Source(record.topic, record.partition, record.offset)
    fold.entries.append(Entry(event, decision, source, dict(trace)))
    fold.decisions.append(decision)
    if decision.outcome not in (DecisionOutcome.DUPLICATE, DecisionOutcome.CONFLICT):
        fold.current[event.operation_id] = apply(view, decision)
        fold.note_containment(item, decision)
    forged = [n for n in decision.refusals if n.code in FORGED_REFUSALS]
    if not forged:
        return None
    return Refusal(
        RefusalCode.FORGED_SIGNATURE,
        f"record {record.coordinates}: {forged[0].code}: {forged[0].message}",
        event.event_id,
        event.operation_id,
    )
