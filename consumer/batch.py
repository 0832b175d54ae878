"""One consumed batch, decided: intake results and stored views in, a ledger `Batch` out.

Pure: no clock (the caller passes `now`), no broker, no database. The controller loads
the views once, calls `decide_batch` and commits the result in one transaction; after a
`VersionConflict` it reloads the views and decides again, and after a conflicting id the
ledger names (`EventIdReused`, `NonceReused`) it decides again with that record in
`excluded`, so the batch is always decided from scratch, never patched.

Per record, in consumption order:

- refused at intake, or in `excluded`: a dead letter;
- an event id already used by another operation earlier in the batch: a dead letter
  (`event-id-conflict`); the ledger catches reuse across batches;
- an operation already governed by another machine: a dead letter
  (`machine-not-applicable`); another *version* of its machine is decided by the
  version the operation is pinned to (`_Decided.governing`; the decision records the
  version named), and a new operation opens on the version the lock marks current
  (`machine-unpinned` when the event names a version the lock does not pin, or the
  operation's own version is no longer pinned); an event that opens an operation
  without a `scope` block, or with one the machine's `applies_to` does not admit
  (`scope-missing`, `machine-not-applicable`: `machines.scope_refusal`, SPEC §8 step
  2): dead letters too;
- a producer that may not open the operation, or send this event on its scope
  (`machines.producer_roles`, on the view as folded so far): a dead letter
  (`role-not-permitted`, `identity-mismatch`), never decided;
- otherwise the core decides it in the batch's `machines.BatchFold`, the fold
  `machines.Simulation` runs too: on the operation's view folded so far, a new
  operation opened with the lineage the ledger gives it on arrival
  (`Ledger.arrival_lineage`, read once per batch for every operation it opens, see
  `openings`) or below a parent the batch opened earlier; the decision becomes an
  `Entry`. Duplicates and conflicts are entries too: the ledger records a conflict's
  audit record and dead letter with the operation. A forged or replayed human decision
  is recorded as the refused decision it is *and* dead-lettered (`forged-signature`),
  and so is an event carrying another correlation id than the one its operation was
  opened with (`correlation-mismatch`, SPEC §6.2).

What turns intake results and decisions into ledger rows, dead letters and positions
is here; the fold itself is in `machines.batch`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from importlib import metadata
from typing import Final

from consumer.deadletter import dead_letter, dead_letter_record
from consumer.intake import (
    Accepted,
    IntakeResult,
    RawRecord,
    Refusal,
    RefusalCode,
    Rejected,
    failed,
    unpinned_refusal,
)
from ledger import Batch, DeadLetter, Entry, Position, RowSigner, Source, batch_rows
from machines import (
    CORRELATION_MISMATCH,
    DEADLINE_EVENT,
    MIGRATION_APPROVED,
    RETRY_EVENT,
    STALLED_EVENT,
    Arrival,
    AuthenticationError,
    AuthRefusal,
    BatchFold,
    ClaimKey,
    Decision,
    Event,
    KeyClaim,
    Machine,
    OperationView,
    Outcome,
    Pins,
    Rules,
    Timer,
    TimerKind,
    check_event_role,
    check_opening,
    claim_key_of,
    correlation_conflict,
    opening_conflict,
    prove_lineage,
    scope_refusal,
)
from schemas import (
    DEFAULT_TOPICS,
    HEADER_CALL_CONTEXT,
    TopicNames,
    header_value,
    is_drill_operation,
)

log = logging.getLogger("consumer")


def _version() -> str:
    try:
        return metadata.version("agent-recovery-controller")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        return "unknown"


# The version of the controller that decides, recorded with each decision (SPEC §10).
CONTROLLER_VERSION: Final = _version()

__all__ = [
    "CONTROLLER_VERSION",
    "FORGED_REFUSALS",
    "DecidedBatch",
    "Observer",
    "claim_keys",
    "decide_batch",
    "openings",
    "operation_ids",
    "positions_for",
    "run_unobserved",
    "unbuildable",
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
class DecidedBatch:
    """A decided batch: the ledger `Batch` and what it holds, for metrics and logs."""

    batch: Batch
    decisions: tuple[Decision, ...]
    refused: tuple[tuple[RawRecord, Refusal], ...]
    # Each operation the batch opened, with the event that opened it.
    openers: Mapping[str, Event] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        """Events already decided (redelivered with the same payload)."""
        return sum(d.outcome is Outcome.DUPLICATE for d in self.decisions)

    @property
    def conflicts(self) -> int:
        """Events whose id was reused with another payload (dead-lettered by the ledger)."""
        return sum(d.outcome is Outcome.CONFLICT for d in self.decisions)

    def timer_counts(self) -> dict[tuple[str, str], int]:
        """What the batch's decisions did to timers, by (`armed`, `cancelled` or `stale`,
        timer kind): a timer disarmed before its event was decided was cancelled."""
        counts: dict[tuple[str, str], int] = {}
        known: dict[str, Timer] = {
            t.timer_id: t for view in self.batch.views.values() for t in view.timers
        }

        def count(what: str, kind: str) -> None:
            counts[(what, kind)] = counts.get((what, kind), 0) + 1

        for decision in self.decisions:
            change = decision.timers
            if decision.outcome is Outcome.STALE:
                count("stale", _TIMER_KINDS.get(decision.event_type, TimerKind.STATE))
            for timer in change.armed:
                count("armed", timer.kind)
                known[timer.timer_id] = timer
            for timer_id in change.disarmed:
                gone = known.get(timer_id)
                if gone is not None and not gone.spent and timer_id != change.spent:
                    count("cancelled", gone.kind)
            if change.spent is not None and change.spent in known:
                known[change.spent] = replace(known[change.spent], spent=True)
        return counts


# The kind of timer each of the controller's own timer events fires (else a state's).
_TIMER_KINDS: Final = {
    STALLED_EVENT: TimerKind.STALLED,
    DEADLINE_EVENT: TimerKind.DEADLINE,
    RETRY_EVENT: TimerKind.RETRY,
}


def operation_ids(results: Iterable[IntakeResult]) -> list[str]:
    """The operations a batch's accepted events touch, sorted (the views to load)."""
    return sorted({r.event.operation_id for r in results if isinstance(r, Accepted)})


def openings(
    results: Iterable[IntakeResult],
    stored: Mapping[str, OperationView],
    excluded: Mapping[str, Refusal] | None = None,
) -> dict[str, str | None]:
    """The operations the batch's accepted events would open (not in `stored`), each with
    the parent operation its first event names: what `Ledger.arrival_lineage` answers
    in one read, so a new operation is decided below its stored parent's lineage. An
    event that could not open its operation (`machines.scope_refusal`), or that a
    replan dead-letters (`excluded`, as `decide_batch` takes it), is passed over: the
    next event opens the operation, and its parent is the one to read. (Read for the
    excluded one, the commit's linking found another parent and refused the batch on
    every replan, so the partition never moved.)"""
    found: dict[str, str | None] = {}
    for r in results:
        if (
            isinstance(r, Accepted)
            and r.event.operation_id not in stored
            and r.event.operation_id not in found
            and scope_refusal(r.machine, r.event, opening=True) is None
            and not (excluded and r.record.coordinates in excluded)
        ):
            found[r.event.operation_id] = r.event.lineage.parent_operation
    return found


# How many times `decide_on_openers` decides a batch: the second time with the reads
# its operations' actual openers need; past the last, the commit refuses the plan (and
# the controller replans, then replays the batch).
OPENING_READS: Final = 3


def decide_on_openers(
    decide: Callable[[Mapping[str, str | None], Sequence[ClaimKey]], DecidedBatch],
    read: Mapping[str, str | None],
    keys: Sequence[ClaimKey],
) -> DecidedBatch:
    """`decide(read, keys)`: the batch decided with the arrival lineage of the openings
    in `read` (`openings`) and the stored owners of the claim keys in `keys`
    (`claim_keys`), both read for each new operation's first event; decided again with
    the parents and the keys the operations' actual openers name, when they differ.
    The fold may refuse that first event later (an event id another operation of the
    batch holds, a version nobody pinned, an opening or a role its producer lacks) and
    open the operation with the next one. Decided below the first one's parent, or
    blind to a stored owner of the next one's key, the plan was refused by the commit
    (its lineage or its claim changed) on every attempt, and the partition never
    moved."""
    planned = decide(read, keys)
    for _ in range(OPENING_READS - 1):
        parents = {op: opener.lineage.parent_operation for op, opener in planned.openers.items()}
        wanted = [k for o in planned.openers.values() if (k := claim_key_of(o)) is not None]
        if set(wanted) <= set(keys) and all(
            op in read and read[op] == parent for op, parent in parents.items()
        ):
            break
        read, keys = parents, list(dict.fromkeys([*keys, *wanted]))
        planned = decide(read, keys)
    return planned


def claim_keys(
    results: Iterable[IntakeResult], stored: Mapping[str, OperationView]
) -> list[ClaimKey]:
    """The idempotency claim keys the events that would open operations declare
    (`machines.claim_key_of`): what `Ledger.key_claims` answers in one read, so a
    second operation claiming a stored key is decided on its owner."""
    keys: dict[ClaimKey, None] = {}
    first: set[str] = set()
    for r in results:
        if not isinstance(r, Accepted) or r.event.operation_id in stored:
            continue
        if r.event.operation_id in first:
            continue
        first.add(r.event.operation_id)
        key = claim_key_of(r.event)
        if key is not None:
            keys[key] = None
    return list(keys)


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


class _Decided:
    """What deciding one batch collects besides the fold (kept inside `decide_batch`)."""

    def __init__(self, fold: BatchFold, controller: str, pins: Pins) -> None:
        self.fold = fold
        self.controller = controller
        self.pins = pins
        self.event_owner: dict[str, str] = {}
        self.entries: list[Entry] = []
        self.decisions: list[Decision] = []
        self.refused: list[tuple[RawRecord, Refusal]] = []
        # The provenance of each machine an operation of the batch may be opened under,
        # by digest: the `operation-opened` audit record names it (SPEC §10).
        self.provenance: dict[str, Mapping[str, str]] = {}

    def precheck(self, item: Accepted) -> tuple[Machine | None, Refusal | None]:
        """The machine that decides `item` (`_governing`), or why the batch refuses it."""
        event, machine = item.event, item.machine
        owner = self.event_owner.setdefault(event.event_id, event.operation_id)
        if owner != event.operation_id:
            return None, Refusal(
                RefusalCode.EVENT_ID_CONFLICT,
                f"record {item.record.coordinates}: event id {event.event_id} is already "
                f"used by operation {owner} in this batch; event ids are unique per event",
                event.event_id,
                event.operation_id,
            )
        stored = self.fold.known(event.operation_id)
        conflict = (
            None
            if stored is None
            else opening_conflict(
                stored, event, machine, item.producer, self.fold.rules.event_roles
            )
        )
        if conflict is not None:
            return None, Refusal(
                RefusalCode.OPENING_CONFLICT,
                f"record {item.record.coordinates}: {conflict.describe()}",
                event.event_id,
                event.operation_id,
                incident=conflict.to_json(),
            )
        if stored is not None and stored.machine_name != machine.name:
            return None, Refusal(
                RefusalCode.MACHINE_NOT_APPLICABLE,
                f"record {item.record.coordinates}: event {event.event_id} names machine "
                f"{machine.name}@{event.machine_version}, but operation {event.operation_id} "
                f"is governed by {stored.machine_name} ({stored.machine_digest})",
                event.event_id,
                event.operation_id,
            )
        found = self.governing(item, stored)
        if isinstance(found, Refusal):
            return None, found
        if stored is None and found.provenance is not None:
            self.provenance.setdefault(found.digest, found.provenance.to_dict())
        unmatched = scope_refusal(found, event, opening=stored is None)
        if unmatched is not None:
            code, reason = unmatched
            return None, Refusal(
                code,
                f"record {item.record.coordinates}: {reason}",
                event.event_id,
                event.operation_id,
            )
        return found, None

    def governing(self, item: Accepted, stored: OperationView | None) -> Machine | Refusal:
        """The version of `item`'s machine that decides it (docs/machine-format.md,
        "Rollout"): for an operation the ledger knows, the version its view is pinned to,
        whatever version the event names (the decision records the one named); for a new
        operation, the version the lock marks current, when the event names a pinned
        version at all (`machine-unpinned` otherwise)."""
        event = item.event
        migrates = event.event_type == MIGRATION_APPROVED
        if stored is None:
            if migrates:
                return Refusal(
                    RefusalCode.MIGRATION_UNKNOWN_OPERATION,
                    f"record {item.record.coordinates}: {event.event_type} {event.event_id} "
                    f"migrates operation {event.operation_id}, which the ledger does not know",
                    event.event_id,
                    event.operation_id,
                )
            if item.unpinned:
                return unpinned_refusal(item.record, event, self.pins)
            return self.pins.current(event.machine_name) or item.machine
        if migrates and item.unpinned:
            return unpinned_refusal(item.record, event, self.pins)  # the target version
        machine = self.pins.by_digest(stored.machine_digest)
        if machine is not None:
            return machine
        version = stored.machine_version or "?"
        return Refusal(
            RefusalCode.MACHINE_UNPINNED,
            f"record {item.record.coordinates}: event {event.event_id} is for operation "
            f"{event.operation_id}, which is governed by {stored.machine_name}@{version} "
            f"({stored.machine_digest}); the lock no longer pins that version (pinned: "
            f"{', '.join(self.pins.refs(stored.machine_name)) or 'none'}); pin it again "
            "and redrive this record (`recoveryctl dlq redrive`), and migrate the operation "
            'before retiring the version (docs/operations.md, "Upgrading a machine")',
            event.event_id,
            event.operation_id,
        )


def decide_batch(
    results: Sequence[IntakeResult],
    stored: Mapping[str, OperationView],
    rules: Rules,
    *,
    group: str,
    controller: str,
    positions: tuple[Position, ...],
    now: datetime,
    excluded: Mapping[str, Refusal] | None = None,
    observe: Observer = run_unobserved,
    topics: TopicNames | None = None,
    arrivals: Mapping[str, Arrival] | None = None,
    sign: RowSigner | None = None,
    claims: Mapping[ClaimKey, KeyClaim] | None = None,
    pins: Pins | None = None,
) -> DecidedBatch:
    """Decide a batch (see the module docstring). `stored` are the views the ledger
    holds for the batch's operations; `arrivals` the lineage it gives the operations
    the batch opens (`Ledger.arrival_lineage` of `openings`; without it a new view has
    no lineage, which is right only when the ledger knows none); `claims` the stored
    owners of the idempotency keys those operations declare (`Ledger.key_claims` of
    `claim_keys`; without it a second claimant is found only within the batch, and the
    commit refuses it); `excluded` maps record
    coordinates to a refusal the ledger reported for them on an earlier attempt;
    `topics` names the output topics the outbox rows go to (default: the standard
    names); `sign` signs every outbox row the commit writes (`consumer.signing`). The
    batch names `controller` and this code's version as the controller that decided,
    and the provenance of each machine it opens an operation under (SPEC §10); the agent
    runtime an operation names comes from its opening event's lineage. `pins` are the
    pinned machines, which say the version that decides each event (`_Decided.governing`;
    without them, the versions the accepted events name, one per machine)."""
    pins = pins if pins is not None else _named_pins(results)
    decided = _Decided(BatchFold(stored, rules, arrivals, claims), controller, pins)
    letters: list[DeadLetter] = []
    excluded = excluded or {}
    for result in results:
        record = result.record
        # Formatting the coordinates costs more than the lookup; `excluded` is empty on
        # every first attempt.
        refusal = excluded.get(record.coordinates) if excluded else None
        if refusal is None and isinstance(result, Rejected):
            refusal = result.refusal
        if refusal is None and isinstance(result, Accepted):
            refusal = _guarded(decided, result, now, observe)
        if refusal is not None:
            decided.refused.append((record, refusal))
            letters.append(dead_letter(group, controller, record, refusal, now))
    batch = Batch(
        group=group,
        positions=positions,
        views=dict(decided.fold.base),
        entries=tuple(decided.entries),
        dead_letters=tuple(letters),
        topics=topics or DEFAULT_TOPICS,
        folded=dict(decided.fold.current),
        sign=sign,
        provenance=decided.provenance,
        controller={"id": controller, "version": CONTROLLER_VERSION},
        unlinked=dict(decided.fold.unlinked),
    )
    openers = {op: opener for op, (opener, _) in decided.fold.opened.items()}
    return DecidedBatch(batch, tuple(decided.decisions), tuple(decided.refused), openers)


def _named_pins(results: Sequence[IntakeResult]) -> Pins:
    """Pins of the versions the accepted results carry, the first of each name current
    (callers that decide without the lock: tests, simulations)."""
    named: dict[str, Machine] = {}
    current: dict[str, str] = {}
    for r in results:
        if isinstance(r, Accepted):
            named.setdefault(f"{r.machine.name}@{r.machine.version}", r.machine)
            current.setdefault(r.machine.name, r.machine.version)
    return Pins(named, current)


def _guarded(decided: _Decided, item: Accepted, now: datetime, observe: Observer) -> Refusal | None:
    """Check, open, decide and fold one accepted event, in one guard: whatever raises on
    this record (a bug met by odd input) refuses it as `record-failed`, naming the stage,
    and leaves the fold and the batch as they were before it, so the batch goes on."""
    op = item.event.operation_id
    before = decided.fold.current.get(op)
    owned = item.event.event_id in decided.event_owner
    entries = len(decided.entries)
    stage = "checking"
    try:
        machine, refusal = decided.precheck(item)
        if refusal is not None or machine is None:
            return refusal
        stage = "authorizing"
        opens = decided.fold.known(op) is None
        proof = ""
        if opens:
            try:
                proof = _check_opening(decided.fold, item, now)
            except AuthenticationError as exc:
                return _refused(item, exc)
        stage = "opening"
        target = item.machine if item.event.event_type == MIGRATION_APPROVED else None
        run = decided.fold.decider(item.event, machine, now, proof, target)
        stage = "authorizing"
        view = decided.fold.current[op]
        roles = decided.fold.rules.event_roles
        refusal = _authorized(
            item, lambda: check_event_role(item.event, item.producer, view, roles)
        )
        if refusal is not None:
            if opens:
                decided.fold.restore(op, None)
            return refusal
        stage = "deciding"
        refusal = _decide_accepted(decided, item, run, observe, now)
    except Exception as exc:
        refusal = failed(item.record, stage, exc, item.event)
    if refusal is not None and refusal.code in _UNDONE:
        decided.fold.restore(op, before)
        del decided.entries[entries:]
        del decided.decisions[entries:]
        if not owned:
            decided.event_owner.pop(item.event.event_id, None)
    return refusal


def _check_opening(fold: BatchFold, item: Accepted, now: datetime) -> str:
    """How `item`'s opening proves its affected agent (`machines.check_opening`), with
    the runtime's call context its record forwards, if any (`machines.prove_lineage`,
    at the controller's clock); raises `AuthenticationError` when it may not open."""
    event = item.event
    context = header_value(item.record.headers, HEADER_CALL_CONTEXT)
    vouched = (
        None if context is None else prove_lineage(context, event, fold.rules.policy.roster, at=now)
    )
    arrival = fold.arrival_in_batch(event)
    proof = check_opening(event, item.producer, arrival.lineage_agents, vouched)
    _check_drill_lineage(event, arrival)
    return proof


def _check_drill_lineage(event: Event, arrival: Arrival) -> None:
    """A drill (CONFORMANCE L4.6) is linked only with drills: a real operation below a
    drill would take a drill's containment as its own and act on the world, and a drill
    below a real operation would be answered by workers as if nothing happened."""
    op = event.operation_id
    linked = (event.lineage.parent_operation, *arrival.ancestors)
    mixed = [o for o in linked if o is not None and is_drill_operation(o) != is_drill_operation(op)]
    if mixed:
        kind = "drill" if is_drill_operation(op) else "real operation"
        raise AuthenticationError(
            AuthRefusal.ROLE_NOT_PERMITTED,
            f"{event.event_type} {event.event_id} opens {kind} {op} linked with "
            f"{', '.join(sorted(set(mixed)))}; a drill is linked only with drills",
        )


def _authorized(item: Accepted, check: Callable[[], None]) -> Refusal | None:
    """The refusal of an event whose authenticated producer may not send it here
    (`machines.producer_roles`: `role-not-permitted`, `identity-mismatch`), or None."""
    try:
        check()
    except AuthenticationError as exc:
        return _refused(item, exc)
    return None


def _refused(item: Accepted, exc: AuthenticationError) -> Refusal:
    event = item.event
    return Refusal(
        str(exc.code),
        f"record {item.record.coordinates}: {exc.reason}",
        event.event_id,
        event.operation_id,
    )


# Refusals of an event whose decision is not recorded: the fold forgets it.
_UNDONE: Final = frozenset({RefusalCode.DECISION_FAILED, RefusalCode.RECORD_FAILED})


def _decide_accepted(
    decided: _Decided,
    item: Accepted,
    run: Callable[[], Decision],
    observe: Observer,
    now: datetime,
) -> Refusal | None:
    """Decide one accepted event; returns a refusal when it must also be dead-lettered."""
    event = item.event
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
    decided.fold.fold(event, decision)
    source = Source(record.topic, record.partition, record.offset)
    original = None
    if decision.outcome is Outcome.CONFLICT:
        # The ledger audits the conflict and dead-letters it; the dead letter must hold
        # the bytes as consumed, which only the consumer still has.
        refusal = Refusal(
            RefusalCode.EVENT_ID_CONFLICT,
            f"record {record.coordinates}: event id {event.event_id} reused with a new payload",
            event.event_id,
            event.operation_id,
        )
        original = dead_letter_record(decided.controller, record, refusal, now)
    decided.entries.append(Entry(event, decision, source, dict(trace), original))
    decided.decisions.append(decision)
    foreign = [n for n in decision.refusals if n.code == CORRELATION_MISMATCH]
    if foreign:
        # Recorded as the refused decision it is (audited on the operation) and
        # dead-lettered: it belongs to another conversation, or its producer is wrong.
        # From another producer than the opener, it is an incident too (machines.opening).
        view = decided.fold.known(event.operation_id)
        conflict = None if view is None else correlation_conflict(view, event)
        return Refusal(
            CORRELATION_MISMATCH,
            f"record {record.coordinates}: {foreign[0].message}",
            event.event_id,
            event.operation_id,
            incident=None if conflict is None else conflict.to_json(),
        )
    forged = [n for n in decision.refusals if n.code in FORGED_REFUSALS]
    if not forged:
        return None
    return Refusal(
        RefusalCode.FORGED_SIGNATURE,
        f"record {record.coordinates}: {forged[0].code}: {forged[0].message}",
        event.event_id,
        event.operation_id,
    )


def unbuildable(planned: DecidedBatch, exc: BaseException) -> tuple[str, Refusal] | None:
    """The record whose ledger rows cannot be built, when committing `planned` raised
    `exc` outside the ledger's own errors: the first entry at which `ledger.batch_rows`
    of the batch's entries so far raises (found by bisection, so only a failed commit
    pays for it), with its `record-failed` refusal (stage `row building`) for the next
    plan's `excluded`. None when every prefix builds (the failure is elsewhere)."""
    batch = planned.batch
    entries = batch.entries

    def builds(n: int) -> bool:
        try:
            batch_rows(replace(batch, entries=entries[:n]))
        except Exception:
            return False
        return True

    if builds(len(entries)):
        return None
    low, high = 0, len(entries)  # builds(low), not builds(high)
    while high - low > 1:
        mid = (low + high) // 2
        if builds(mid):
            low = mid
        else:
            high = mid
    entry = entries[high - 1]
    src = entry.source
    if src is None:  # pragma: no cover - the controller's entries all have a source
        return None
    record = RawRecord(src.topic, src.partition, src.offset, None, None)
    refusal = failed(record, "row building", exc, entry.event)
    return record.coordinates, refusal
