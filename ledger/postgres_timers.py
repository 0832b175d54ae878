"""Timers in PostgreSQL: the firing transaction and the controller's timer gauges.

`fire_due` is the body of `PostgresLedger.fire_timers` (module `ledger.timers` says what
firing is): in one transaction, the partitions' epochs share-locked and compared (as a
batch commit does; a fenced partition fires nothing), a slice of the due timers read in
due order from the partial index of unfired timers and locked, their events inserted
into the outbox in that order, and the timers marked fired. `summary` reads what the
controller's gauges show (`consumer.metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

import psycopg
from psycopg.rows import TupleRow

from ledger.jsonutil import column_json
from ledger.postgres_arrays import Int8Array, TextArray, column_arrays
from ledger.queries import QUERIES
from ledger.records import RowSigner
from ledger.timers import (
    DueTimer,
    FiredTimer,
    FiredTimers,
    TimerSummary,
    WaitingState,
    firing_rows,
)
from machines import Lineage, Timer
from schemas import TopicNames

__all__ = ["fire_due", "summary"]

Conn = psycopg.Connection[TupleRow]
TopicPartition = tuple[str, int]

_EVENT_COLUMNS = ("c0", "c1", "c2", "c3", "c4", "c5")
_EVENT_TYPES = ("text", "text", "text", "text", "bytea", "bytea")


def fire_due(
    conn: Conn,
    group: str,
    epochs: Mapping[TopicPartition, int],
    now: datetime,
    limit: int,
    topics: TopicNames,
    sign: RowSigner | None,
) -> FiredTimers:
    """Fire up to `limit` timers due at `now` on the partitions `epochs` owns, in one
    transaction on `conn` (see the module docstring)."""
    owned = sorted(epochs)
    with conn.transaction():
        rows = conn.execute(
            QUERIES["check_epochs"],
            {
                "group": group,
                "topics": TextArray(t for t, _ in owned),
                "partitions": Int8Array(p for _, p in owned),
            },
        ).fetchall()
        stored = {(str(t), int(p)): int(e) for t, p, e in rows}
        fenced = tuple(tp for tp in owned if stored.get(tp) != epochs[tp])
        due: list[DueTimer] = []
        for topic, partitions in _by_topic(tp for tp in owned if tp not in fenced).items():
            if len(due) >= limit:
                break
            params = {
                "now": now,
                "topic": topic,
                "partitions": partitions,
                "limit": limit - len(due),
            }
            due.extend(_due(r) for r in conn.execute(QUERIES["due_timers"], params))
        if due:
            outbox = firing_rows(due, topics, sign, now)
            events = [
                (
                    *(o.record_id, o.topic, o.key, column_json(dict(o.headers))),
                    *(o.payload_json.encode("utf-8"), o.value),
                )
                for o in outbox
            ]
            conn.execute(
                QUERIES["insert_timer_events"],
                column_arrays(_EVENT_COLUMNS, _EVENT_TYPES, events),
            )
            ids = TextArray(d.timer.timer_id for d in due)
            conn.execute(QUERIES["mark_fired"], {"at": now, "ids": ids})
    fired = tuple(
        FiredTimer(d.timer.timer_id, d.operation_id, d.timer.kind, d.timer.due_at, now) for d in due
    )
    return FiredTimers(fired, fenced, full=len(due) >= limit)


def summary(
    conn: Conn, partitions: Sequence[TopicPartition], now: datetime, overdue_after: timedelta
) -> TimerSummary:
    """The waiting operations and timer counts of `partitions` at `now`; a timer is
    overdue when it was due before `now - overdue_after` and is not decided yet."""
    waiting: list[WaitingState] = []
    armed = overdue = 0
    for topic, parts in _by_topic(partitions).items():
        ident = {"topic": topic, "partitions": parts}
        for machine, state, count, oldest, stalled in conn.execute(
            QUERIES["waiting_operations"], ident
        ):
            waiting.append(WaitingState(machine, state, int(count), oldest, int(stalled)))
        row = conn.execute(
            QUERIES["timer_counts"], {**ident, "before": now - overdue_after}
        ).fetchone()
        if row is not None:
            armed += int(row[0])
            overdue += int(row[1])
    return TimerSummary(tuple(waiting), armed, overdue)


def _by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic, partition in partitions:
        out.setdefault(topic, []).append(partition)
    return out


def _due(row: TupleRow) -> DueTimer:
    timer_id, kind, state, armed_version, armed_at, due_at, event_type = row[:7]
    operation_id, correlation_id, machine_name, machine_version, agent, task = row[7:13]
    principal, origin, parent, credentials = row[13:]
    timer = Timer(
        str(timer_id), str(kind), str(state), int(armed_version), armed_at, due_at, str(event_type)
    )
    lineage = Lineage(
        agent=agent,
        task=task,
        initiating_principal=principal,
        origin_operation=origin,
        parent_operation=parent,
        delegated_credentials=tuple(credentials or ()),
    )
    return DueTimer(timer, operation_id, correlation_id, machine_name, machine_version, lineage)
