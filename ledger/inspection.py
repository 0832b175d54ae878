"""Operator reads of the Action Ledger: operations, one operation's record, dead letters,
timers overdue and one operation's timers as fired.

`LedgerInspector` is a `PostgresLedger` with the reads `recoveryctl ops`, `review`,
`approve` and `dlq` need. Each read runs in one `REPEATABLE READ, READ ONLY`
transaction, so what it returns is one snapshot (a review packet is assembled from a
single moment of the ledger) and nothing can be written through it even when the URL
names a role that could write; connect as `recovery_reader` (docs/ledger.md, "Roles").
The statements are the named blocks of `sql/inspection.sql`. None of this is on the
event path: the controller and the relay never call it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from types import MappingProxyType
from typing import Any, Final, TypeVar

import psycopg
from psycopg.rows import TupleRow

from ledger.codec import view_from_text
from ledger.errors import UnknownOperation
from ledger.postgres import PostgresLedger
from ledger.queries import QUERIES, parse_queries
from machines import Lineage, OperationView, with_lineage

__all__ = [
    "DeadLetterEntry",
    "Incident",
    "LedgerInspector",
    "OperationRecord",
    "OperationSummary",
    "OutboxEntry",
    "OverdueTimer",
    "StoredEvent",
]

T = TypeVar("T")
Conn = psycopg.Connection[TupleRow]


def _load() -> MappingProxyType[str, str]:
    text = resources.files("ledger").joinpath("sql/inspection.sql").read_text(encoding="utf-8")
    return MappingProxyType(parse_queries(text))


INSPECTION: Final = _load()


@dataclass(frozen=True, slots=True)
class OperationSummary:
    """One row of `recoveryctl ops list`."""

    operation_id: str
    correlation_id: str
    machine_name: str
    machine_version: str
    machine_digest: str
    policy_digest: str
    state: str
    version: int
    initiating_principal: str
    agent: str
    task: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class MachineStateCount:
    """How many operations of one machine version (by digest) are in one state."""

    machine_name: str
    machine_version: str
    machine_digest: str
    state: str
    operations: int


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One stored event: its envelope (SPEC §6.2) and where it was consumed from."""

    event_id: str
    event_type: str
    envelope: Mapping[str, Any]
    source_topic: str | None
    source_partition: int | None
    source_offset: int | None
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One outbox row keyed by the operation: a command, evidence, an audit record or a
    cascade event, and whether the relay published it."""

    position: int
    record_id: str
    topic: str
    created_at: datetime
    published_at: datetime | None
    held_at: datetime | None
    held_reason: str | None


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """Everything the ledger holds about one operation, read in one snapshot: the
    operation row (`row`, column name to value), its view, events, decisions,
    approvals, outbox rows and the operations below it."""

    row: Mapping[str, Any]
    view: OperationView
    events: tuple[StoredEvent, ...]
    decisions: tuple[Mapping[str, Any], ...]
    approvals: tuple[Mapping[str, Any], ...]
    outbox: tuple[OutboxEntry, ...]
    descendants: tuple[str, ...]

    @property
    def lineage(self) -> Lineage:
        """The operation's lineage as an event envelope carries it (what a decision
        published for it names)."""
        row = self.row
        return Lineage(
            agent=row["agent"],
            task=row["task"],
            initiating_principal=row["initiating_principal"],
            origin_operation=row["origin_operation"],
            parent_operation=row["parent_operation"],
            delegated_credentials=tuple(row["delegated_credentials"]),
        )


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One dead letter as the controller wrote it to the outbox for the dead-letter
    topic: `payload` is the `recovery.DeadLetter` record (reason, coordinates, the
    original key, value and headers in base64)."""

    position: int
    record_id: str
    key: str
    headers: Mapping[str, str]
    payload: Mapping[str, Any]
    created_at: datetime
    published_at: datetime | None


@dataclass(frozen=True, slots=True)
class OverdueTimer:
    """A timer not decided though due before the cut-off asked for (`recoveryctl ops
    list --overdue`): unfired (no owner fired it yet) or fired with its event not
    decided (the relay or the controller is behind, or stopped)."""

    operation_id: str
    timer_id: str
    kind: str
    state: str
    event_type: str
    armed_at: datetime
    due_at: datetime
    fired_at: datetime | None
    machine_name: str
    machine_version: str


@dataclass(frozen=True, slots=True)
class Incident:
    """A security incident (`machines.OpeningConflict.to_json`, plus `at`) as its audit
    record on the intake chain `chain` holds it, at `sequence`."""

    chain: str
    sequence: int
    body: Mapping[str, Any]


_RECORD_COLUMNS: Final = (
    "operation_id",
    "correlation_id",
    "machine_name",
    "machine_version",
    "machine_digest",
    "policy_digest",
    "state",
    "version",
    "initiating_principal",
    "agent",
    "runtime",
    "task",
    "origin_operation",
    "parent_operation",
    "depth",
    "delegated_credentials",
    "ancestors",
    "containing",
    "containment_cause",
    "created_at",
    "updated_at",
)


class LedgerInspector(PostgresLedger):
    """A `PostgresLedger` with the operator's read-only, single-snapshot reads."""

    def _read(self, what: str, fn: Callable[[Conn], T]) -> T:
        def work(conn: Conn) -> T:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                return fn(conn)

        return self._run(what, work)

    def operations(
        self,
        *,
        state: str | None = None,
        machine: str | None = None,
        machine_version: str | None = None,
        updated_before: datetime | None = None,
        limit: int = 1000,
    ) -> tuple[OperationSummary, ...]:
        """Operations matching every given filter, least recently changed first."""
        params = {
            "state": state,
            "machine": machine,
            "version": machine_version,
            "before": updated_before,
            "limit": limit,
        }

        def work(conn: Conn) -> tuple[OperationSummary, ...]:
            rows = conn.execute(INSPECTION["list_operations"], params).fetchall()
            return tuple(OperationSummary(*row) for row in rows)

        return self._read("list operations", work)

    def machine_states(self) -> tuple[MachineStateCount, ...]:
        """How many operations each machine version holds in each state (which states
        are final only the machine knows: `recoveryctl machines rollout` asks it)."""

        def work(conn: Conn) -> tuple[MachineStateCount, ...]:
            rows = conn.execute(INSPECTION["machine_states"]).fetchall()
            return tuple(MachineStateCount(*row) for row in rows)

        return self._read("count operations per machine version", work)

    def search(
        self,
        *,
        agent: str | None = None,
        task: str | None = None,
        principal: str | None = None,
        correlation_id: str | None = None,
        idempotency_key: str | None = None,
        term: str | None = None,
        limit: int = 200,
    ) -> tuple[OperationSummary, ...]:
        """Operations matching every given filter (the affected agent, its task, the
        initiating principal, the correlation id, the declared idempotency key), and
        `term` in any of them or the operation id; most recently changed first."""
        params = {
            "agent": agent,
            "task": task,
            "principal": principal,
            "correlation": correlation_id,
            "key": idempotency_key,
            "term": term,
            "limit": limit,
        }

        def work(conn: Conn) -> tuple[OperationSummary, ...]:
            rows = conn.execute(INSPECTION["search_operations"], params).fetchall()
            return tuple(OperationSummary(*row) for row in rows)

        return self._read("search operations", work)

    def operation_record(self, operation_id: str) -> OperationRecord:
        """The operation's whole record in one snapshot; raises `UnknownOperation`."""
        ident = {"id": operation_id}

        def work(conn: Conn) -> OperationRecord:
            found = conn.execute(INSPECTION["operation_record"], ident).fetchone()
            if found is None:
                raise UnknownOperation(f"operation {operation_id} is not in the ledger")
            row = dict(zip(_RECORD_COLUMNS, found, strict=True))
            row["delegated_credentials"] = tuple(row["delegated_credentials"])
            row["ancestors"] = tuple(row["ancestors"])
            view_row = conn.execute(QUERIES["load_views"], {"ids": [operation_id]}).fetchone()
            assert view_row is not None  # the operation row exists in this snapshot
            _, view, ancestors, agents, contained, below = view_row
            events = tuple(
                StoredEvent(*r) for r in conn.execute(INSPECTION["events_of"], ident).fetchall()
            )
            decisions = tuple(r[0] for r in conn.execute(QUERIES["decisions_of"], ident))
            approvals = tuple(
                {
                    "event_id": r[0],
                    "approver": r[1],
                    "verdict": r[2],
                    "state": r[3],
                    "transition": r[4],
                    "expires_at": r[5].isoformat(),
                    "nonce": r[6],
                }
                for r in conn.execute(INSPECTION["approvals_of"], ident)
            )
            outbox = tuple(
                OutboxEntry(*r) for r in conn.execute(INSPECTION["outbox_of"], ident).fetchall()
            )
            descendants = tuple(str(r[0]) for r in conn.execute(QUERIES["descendants"], ident))
            return OperationRecord(
                row=MappingProxyType(row),
                view=with_lineage(view_from_text(view), ancestors, agents, contained, below),
                events=events,
                decisions=decisions,
                approvals=approvals,
                outbox=outbox,
                descendants=descendants,
            )

        return self._read(f"record of {operation_id}", work)

    def dead_letters(self, topic: str) -> tuple[DeadLetterEntry, ...]:
        """Every dead letter written for `topic` (the dead-letter topic), oldest first."""

        def work(conn: Conn) -> tuple[DeadLetterEntry, ...]:
            rows = conn.execute(INSPECTION["dead_letters"], {"topic": topic}).fetchall()
            return tuple(_dead_letter(r) for r in rows)

        return self._read(f"dead letters of {topic}", work)

    def dead_letter(self, topic: str, record_id: str) -> DeadLetterEntry | None:
        """The dead letter `record_id` written for `topic`, or None."""

        def work(conn: Conn) -> DeadLetterEntry | None:
            row = conn.execute(
                INSPECTION["dead_letter"], {"topic": topic, "record_id": record_id}
            ).fetchone()
            return None if row is None else _dead_letter(row)

        return self._read(f"dead letter {record_id}", work)

    def overdue_timers(self, before: datetime, limit: int = 1000) -> tuple[OverdueTimer, ...]:
        """Timers not decided though due before `before`, oldest due first."""

        def work(conn: Conn) -> tuple[OverdueTimer, ...]:
            params = {"before": before, "limit": limit}
            rows = conn.execute(INSPECTION["overdue_timers"], params).fetchall()
            return tuple(OverdueTimer(*row) for row in rows)

        return self._read("overdue timers", work)

    def timers_fired(self, operation_id: str) -> dict[str, datetime | None]:
        """When each of the operation's armed timers fired (None: not yet), by id."""

        def work(conn: Conn) -> dict[str, datetime | None]:
            rows = conn.execute(INSPECTION["timers_of"], {"id": operation_id}).fetchall()
            return {str(timer_id): fired for timer_id, fired, _spent in rows}

        return self._read(f"timers of {operation_id}", work)

    def incidents(self, operation_id: str | None = None) -> tuple[Incident, ...]:
        """Every security incident recorded (of one operation, or all), in chain order."""

        def work(conn: Conn) -> tuple[Incident, ...]:
            rows = conn.execute(INSPECTION["incidents"], {"id": operation_id}).fetchall()
            return tuple(_incident(r) for r in rows)

        return self._read("security incidents", work)


def _incident(row: TupleRow) -> Incident:
    chain, sequence, body = row
    data = json.loads(body) if isinstance(body, str | bytes) else body
    return Incident(str(chain), int(sequence), data)


def _dead_letter(row: TupleRow) -> DeadLetterEntry:
    position, record_id, key, headers, payload, created_at, published_at = row
    body = json.loads(bytes(payload)) if payload is not None else {}
    return DeadLetterEntry(int(position), record_id, key, headers, body, created_at, published_at)
