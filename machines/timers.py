"""Time as a recorded fact: the timers a decision arms and disarms, and their events.

Nothing in a machine waits forever (SPEC §8 step 10, §7.5; agent-failure-recovery
practice §2, §6). Every decision says which timers it arms and disarms
(`TimerChange`, in `Decision.timers`), and `machines.decision.apply` folds that into
`OperationView.timers`; the ledger keeps a row per armed timer, indexed by due time,
written in the same transaction as the decision. The rules, all pure:

- **State timers.** The decision that opens an operation, and every decision that takes
  a transition into a state that is not final, arms one timer for the state entered:
  the policy's timeout for that machine and state (`timeouts.states`, kind `state`),
  which delivers the event the policy names, decided like any other event of that
  state; else `timeouts.stalled_after` (kind `stalled`), whose firing escalates once
  with reason `stalled`. Leaving the state disarms its timers.
- **The deadline.** The opening decision arms the operation's deadline (kind
  `deadline`) at `OperationView.deadline`, which counts from the controller's clock
  when the operation opened; its firing in a state that is not final escalates once
  with reason `deadline-passed`. A final state disarms every timer.
- **Paced retries.** A transition that would command a retry holds its commands back
  (`HeldAction`) on a timer of kind `retry`, due after a delay drawn with full jitter
  from 0 .. min(cap, base * 2**attempts), not before a `retry_after_seconds` a failure
  report asked for (bounded by the policy) and never past the deadline; its firing
  commands them, if the retry is still permitted then.

Firing a timer emits an event onto `recovery.events` whose id is the timer's id
(`timer_id`: operation, view version at arming, kind) and whose producer is the
controller (`timer_event`); deciding it spends the timer. An event for a timer no longer
armed (its state was left meanwhile) is recorded as `stale` and changes nothing. Time is
the controller's clock (`now` of the decision and of the firing), never an event's
`event_time`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from machines.event import MAX_ID_LENGTH, Event, Lineage
from machines.model import Machine
from machines.policy import Policy
from machines.view import HeldAction, OperationView, Timer

__all__ = [
    "DEADLINE_EVENT",
    "RETRY_EVENT",
    "STALLED_EVENT",
    "TIMER_EVENTS",
    "TIMER_EVENT_PREFIX",
    "TimerChange",
    "TimerKind",
    "due_timers",
    "is_timer_event",
    "plan_timers",
    "retry_after_seconds",
    "timer_event",
    "timer_id",
    "timer_to_dict",
    "waiting_on",
]

TIMER_EVENT_PREFIX: Final = "timer:"
# The controller's own event types: only the controller may send them (intake,
# `machines.producer_roles`), and no machine decides them.
STALLED_EVENT: Final = "STATE_STALLED"
DEADLINE_EVENT: Final = "DEADLINE_PASSED"
RETRY_EVENT: Final = "RETRY_DUE"
TIMER_EVENTS: Final = frozenset({STALLED_EVENT, DEADLINE_EVENT, RETRY_EVENT})
# The payload field a failure report may carry to ask that the retry wait (the one
# payload field the core reads: it can only delay a retry, never allow one).
RETRY_AFTER_FIELD: Final = "retry_after_seconds"


class TimerKind(StrEnum):
    """What a timer is for."""

    STATE = "state"  # the policy's timeout of the state: delivers its event
    STALLED = "stalled"  # a state without its own timeout: escalates once
    DEADLINE = "deadline"  # the operation's deadline: escalates once
    RETRY = "retry"  # a paced retry: commands what its transition held back


def timer_id(operation_id: str, version: int, kind: str) -> str:
    """The id of the timer armed at view `version` of `operation_id`, which is also the
    event id of its firing: the same inputs, the same id, whoever fires it and however
    often. Bounded like every event id (a digest stands in for a very long one)."""
    plain = f"{TIMER_EVENT_PREFIX}{operation_id}:{version}:{kind}"
    if len(plain) <= MAX_ID_LENGTH:
        return plain
    return f"{TIMER_EVENT_PREFIX}sha256-{hashlib.sha256(plain.encode('utf-8')).hexdigest()}"


def is_timer_event(event_id: str) -> bool:
    """Whether `event_id` is a timer's firing (only the controller may send one)."""
    return event_id.startswith(TIMER_EVENT_PREFIX)


@dataclass(frozen=True, slots=True)
class TimerChange:
    """What one decision does to the operation's timers: those it arms, the ids it
    disarms, the timer whose event it decided (`spent`), and the earliest time of the
    next retry a failure report asked for (`retry_not_before`, bounded by policy)."""

    armed: tuple[Timer, ...] = ()
    disarmed: tuple[str, ...] = ()
    spent: str | None = None
    retry_not_before: datetime | None = None

    def __bool__(self) -> bool:
        return bool(self.armed or self.disarmed or self.spent or self.retry_not_before)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form; empty when the decision changes no timer."""
        if not self:
            return {}
        return {
            "armed": [timer_to_dict(t) for t in self.armed],
            "disarmed": list(self.disarmed),
            "spent": self.spent,
            "retry_not_before": None
            if self.retry_not_before is None
            else self.retry_not_before.isoformat(),
        }

    def applied_to(self, view: OperationView) -> dict[str, Any]:
        """The view fields this change sets, for `machines.decision.apply`."""
        if not self:
            return {}
        gone = set(self.disarmed)
        timers = tuple(
            t if t.timer_id != self.spent or t.spent else _spent(t)
            for t in view.timers
            if t.timer_id not in gone
        )
        changes: dict[str, Any] = {"timers": timers + self.armed}
        if any(t.kind == TimerKind.RETRY for t in self.armed):
            changes["retry_not_before"] = None  # the retry armed now honours it
        elif self.retry_not_before is not None:
            changes["retry_not_before"] = self.retry_not_before
        return changes


NO_TIMER_CHANGE: Final = TimerChange()


def _spent(timer: Timer) -> Timer:
    return Timer(
        timer.timer_id,
        timer.kind,
        timer.state,
        timer.armed_version,
        timer.armed_at,
        timer.due_at,
        timer.event_type,
        timer.held,
        spent=True,
    )


def timer_to_dict(timer: Timer) -> dict[str, Any]:
    """A timer as JSON-ready data (decision records, `recoveryctl ops show`)."""
    return {
        "id": timer.timer_id,
        "kind": timer.kind,
        "state": timer.state,
        "armed_version": timer.armed_version,
        "armed_at": timer.armed_at.isoformat(),
        "due_at": timer.due_at.isoformat(),
        "event_type": timer.event_type,
        "held": [
            {"capability": h.capability, "params": dict(h.params), "origin": h.origin}
            for h in timer.held
        ],
        "spent": timer.spent,
    }


def plan_timers(
    machine: Machine,
    policy: Policy,
    view: OperationView,
    *,
    sequence: int,
    state_after: str,
    entered: bool,
    now: datetime,
    held: Sequence[HeldAction] = (),
    spent: str | None = None,
    retry_after: int | None = None,
) -> TimerChange:
    """The timers a decision at view version `sequence` changes (module docstring):
    `entered` when it took a transition, `held` the commands a paced retry holds back,
    `spent` the timer whose event it decided, `retry_after` the seconds a failure
    report asked the next retry to wait."""
    target = machine.states.get(state_after)
    if target is not None and target.final:
        return TimerChange(disarmed=tuple(t.timer_id for t in view.timers), spent=spent)
    armed: list[Timer] = []
    disarmed: tuple[str, ...] = ()
    opening = view.version == 0
    if entered or opening:
        disarmed = tuple(t.timer_id for t in view.timers if t.kind != TimerKind.DEADLINE)
        armed.append(_state_timer(machine, policy, view, sequence, state_after, now))
    if opening and view.deadline is not None:
        kind = str(TimerKind.DEADLINE)
        tid = timer_id(view.operation_id, sequence, kind)
        due = max(view.deadline, now)  # a deadline already past fires at once
        armed.append(Timer(tid, kind, state_after, sequence, now, due, DEADLINE_EVENT))
    not_before = _retry_not_before(policy, view, now, retry_after)
    if held:
        due = retry_due(policy, view, now, sequence, not_before)
        kind = str(TimerKind.RETRY)
        tid = timer_id(view.operation_id, sequence, kind)
        armed.append(Timer(tid, kind, state_after, sequence, now, due, RETRY_EVENT, tuple(held)))
    return TimerChange(tuple(armed), disarmed, spent, not_before)


def _state_timer(
    machine: Machine,
    policy: Policy,
    view: OperationView,
    sequence: int,
    state: str,
    now: datetime,
) -> Timer:
    timeout = policy.timeouts.of(machine.name, state)
    if timeout is not None:
        kind, after, event = str(TimerKind.STATE), timeout.after, timeout.event
    else:
        kind, after, event = str(TimerKind.STALLED), policy.timeouts.stalled_after, STALLED_EVENT
    tid = timer_id(view.operation_id, sequence, kind)
    return Timer(tid, kind, state, sequence, now, now + timedelta(seconds=after), event)


def retry_after_seconds(payload: Mapping[str, Any] | None) -> int | None:
    """The `retry_after_seconds` a report's payload asks for (a whole number of seconds,
    0 or more), else None. Read only to delay a retry, never to permit one."""
    if payload is None:
        return None
    value = payload.get(RETRY_AFTER_FIELD)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _retry_not_before(
    policy: Policy, view: OperationView, now: datetime, seconds: int | None
) -> datetime | None:
    """The view's `retry_not_before` after a report asking the next retry to wait
    `seconds` (bounded by `retry_pacing.max_retry_after`): the later of the two."""
    if seconds is None:
        return None
    asked = now + timedelta(seconds=min(seconds, policy.retry_pacing.max_retry_after))
    earlier = view.retry_not_before
    return asked if earlier is None or asked > earlier else None


def holds_retry(policy: Policy, view: OperationView, now: datetime) -> bool:
    """Whether a retry permitted now is held back on a timer rather than commanded at
    once: pacing is on (`retry_pacing.base` above 0s), or a failure report asked the
    retry to wait past `now`."""
    waits = view.retry_not_before is not None and view.retry_not_before > now
    return policy.retry_pacing.base > 0 or waits


def retry_due(
    policy: Policy,
    view: OperationView,
    now: datetime,
    sequence: int,
    not_before: datetime | None = None,
) -> datetime:
    """When the retry armed at view version `sequence` is commanded: `now` plus a delay
    drawn with full jitter from 0 .. min(cap, base * 2**attempts so far), deterministic
    per operation and version (a replay draws the same); not before the later of
    `not_before` and the view's `retry_not_before`; and a second before the deadline at
    the latest (never past it), but never before `now`."""
    pacing = policy.retry_pacing
    window = min(pacing.cap, pacing.base * 2 ** min(view.retry_attempts, 32))
    due = now + timedelta(seconds=window * _jitter(view.operation_id, sequence))
    for wait in (view.retry_not_before, not_before):
        if wait is not None and wait > due:
            due = wait
    if view.deadline is not None:
        due = min(due, view.deadline - timedelta(seconds=1))
    return max(due, now)


def _jitter(operation_id: str, sequence: int) -> float:
    """A fraction in [0, 1) drawn from the operation and version: independent across
    operations (so an outage's retries spread out), the same on every replay."""
    digest = hashlib.sha256(f"{operation_id}:{sequence}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def due_timers(view: OperationView, now: datetime) -> list[Timer]:
    """The operation's armed, unspent timers due at `now`, earliest first (ties by id)."""
    due = [t for t in view.timers if not t.spent and t.due_at <= now]
    return sorted(due, key=lambda t: (t.due_at, t.timer_id))


def timer_event(
    timer: Timer,
    *,
    operation_id: str,
    correlation_id: str,
    machine_name: str,
    machine_version: str,
    lineage: Lineage,
    producer: str,
    at: datetime,
) -> Event:
    """The event that fires `timer` at `at` (the controller's clock), signed and sent
    by the controller `producer`: its id is the timer's, its type the timer's event, its
    evidence reference names the timer; no evidence, no causation."""
    return Event(
        event_type=timer.event_type,
        event_id=timer.timer_id,
        operation_id=operation_id,
        correlation_id=correlation_id,
        machine_name=machine_name,
        machine_version=machine_version,
        event_time=at,
        evidence_ref=f"timer:{timer.kind}:{timer.state}:due {timer.due_at.isoformat()}",
        producer=producer,
        lineage=lineage,
    )


def waiting_on(view: OperationView) -> dict[str, Any]:
    """What the operation waits for, as JSON-ready data with absolute times (the review
    packet digests it, so nothing here depends on when it is read): each armed timer,
    earliest first, with what its firing does, and whether the operation is stalled
    (its stall bound fired and escalated, and nothing has moved it since)."""
    timers = sorted(view.timers, key=lambda t: (t.due_at, t.timer_id))
    return {
        "stalled": view.escalated(str(TimerKind.STALLED)) > 0,
        "deadline": None if view.deadline is None else view.deadline.isoformat(),
        "timers": [{**timer_to_dict(t), "does": _does(t)} for t in timers],
    }


def _does(timer: Timer) -> str:
    """What `timer`'s firing does, in a few words for people."""
    if timer.kind == TimerKind.RETRY:
        held = ", ".join(h.capability for h in timer.held)
        return f"commands the paced retry ({held})"
    if timer.kind == TimerKind.STATE:
        return f"delivers {timer.event_type} (the timeout of {timer.state})"
    if timer.kind == TimerKind.DEADLINE:
        return "escalates: the deadline passed in a state that is not final"
    return f"escalates once as stalled in {timer.state}"
