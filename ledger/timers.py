"""Firing timers, planned without I/O (issue #29; `machines.timers` says what they are).

The batch commit keeps the `timers` table equal to the views' armed timers
(`ledger.records.TimerRows`). Firing is a transaction of its own, run by the controller
that owns the partitions (`Ledger.fire_timers`): it share-locks their epochs like a
batch commit (a zombie fires nothing), reads a bounded slice of the timers due on them,
earliest first, and for each writes the timer's event to the outbox for
`recovery.events`, keyed by the operation and signed by the controller, and sets its
`fired_at`. The event's id is the timer's id and its record id derives from it, so a
replayed or repeated firing writes nothing new (the insert keeps a stored row) and the
controller dedupes the event. Both ledgers build the rows with `firing_rows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from ledger.jsonutil import dumps
from ledger.records import OutboxRow, RowSigner, signed_row
from machines import Lineage, Timer, timer_event
from schemas import DEFAULT_CONTROLLER_ID, TopicNames, record_id

__all__ = [
    "DueTimer",
    "FiredTimer",
    "FiredTimers",
    "TimerSummary",
    "WaitingState",
    "firing_rows",
]

# The outbox header that marks a timer's event (and its kind).
TIMER_HEADER: Final = "timer_kind"


@dataclass(frozen=True, slots=True)
class DueTimer:
    """A due, unfired timer as the firing reads it, with what its event needs of its
    operation's row (the identity the operation was opened with)."""

    timer: Timer
    operation_id: str
    correlation_id: str
    machine_name: str
    machine_version: str
    lineage: Lineage


@dataclass(frozen=True, slots=True)
class FiredTimer:
    """One timer a firing wrote the event of."""

    timer_id: str
    operation_id: str
    kind: str
    due_at: datetime
    fired_at: datetime


@dataclass(frozen=True, slots=True)
class FiredTimers:
    """What one `Ledger.fire_timers` call did: the timers fired, the partitions a newer
    claim fenced (nothing of theirs fired), and whether the slice was full (more timers
    may be due now: call again)."""

    fired: tuple[FiredTimer, ...] = ()
    fenced: tuple[tuple[str, int], ...] = ()
    full: bool = False


@dataclass(frozen=True, slots=True)
class WaitingState:
    """Operations waiting in one state of one machine (they have its state timer):
    how many, since when the oldest, and how many of them are stalled (their stall
    bound fired and escalated, and nothing has moved them since)."""

    machine: str
    state: str
    operations: int
    oldest_since: datetime
    stalled: int


@dataclass(frozen=True, slots=True)
class TimerSummary:
    """The timers of some partitions at one moment: who waits where, how many timers
    are armed, and how many are overdue (due longer ago than the grace asked for and
    not yet decided: unfired, or fired with their event not decided yet)."""

    waiting: tuple[WaitingState, ...]
    armed: int
    overdue: int


def firing_rows(
    due: Sequence[DueTimer], topics: TopicNames, sign: RowSigner | None, now: datetime
) -> list[OutboxRow]:
    """The outbox rows that fire `due` at `now`: one event each on the events topic,
    keyed by its operation, named and signed by the controller `sign` holds."""
    producer = sign.producer if sign is not None else DEFAULT_CONTROLLER_ID
    rows: list[OutboxRow] = []
    for item in due:
        timer = item.timer
        event = timer_event(
            timer,
            operation_id=item.operation_id,
            correlation_id=item.correlation_id,
            machine_name=item.machine_name,
            machine_version=item.machine_version,
            lineage=item.lineage,
            producer=producer,
            at=now,
        )
        rid = record_id("event", item.operation_id, event.event_id)
        headers = {
            "record_id": rid,
            "operation_id": item.operation_id,
            "kind": "timer",
            TIMER_HEADER: timer.kind,
        }
        row = OutboxRow(rid, topics.events, item.operation_id, headers, dumps(event.content()))
        rows.append(signed_row(row, sign))
    return rows
