"""The Action Ledger in PostgreSQL (psycopg 3 and psycopg_pool).

One transaction per consumed batch (`commit`; its statements are in
`ledger.postgres_commit`): check the partition epochs, lock the touched operations in id
order and check their versions, refuse event ids or nonces stored for something else
(one pipelined round trip), chain the audit records onto the locked heads, write the
operations and every append-only row with set-based statements over column arrays (a
second pipelined round trip, which carries COMMIT too when nothing is left to check).
`synchronous_commit` stays on: a committed batch survives a crash of the server.

Driver errors become ledger errors in one place, `ledger.driver`. A lost connection is
retried with exponential backoff; as the transaction is all-or-nothing, a retry replays
the whole batch, and a batch that did commit before the connection dropped is refused on
replay by the version check (`VersionConflict`), so the caller reloads and resumes from
the stored offsets. Nothing is ever half-applied.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from ledger.audit import AuditRecord, AuditSubject, ChainHead, DecisionRowFacts
from ledger.codec import view_from_text
from ledger.driver import DRIVER_ERRORS, driver_errors, translate
from ledger.errors import LedgerError, LedgerUnavailable, UnknownOperation
from ledger.interface import (
    AuditOutboxRow,
    CommitResult,
    HeldOutboxRow,
    Ledger,
    OperationInfo,
    OutboxLease,
    OutboxRecord,
    PartitionAttempt,
    PartitionClaim,
)
from ledger.jsonutil import loads
from ledger.postgres_arrays import ADAPTERS
from ledger.postgres_commit import read_claims, write_batch
from ledger.postgres_lineage import lineage_row
from ledger.postgres_timers import fire_due, summary
from ledger.queries import QUERIES
from ledger.records import (
    Batch,
    batch_rows,
)
from ledger.retention import PurgeCandidate, PurgeResult, purge_candidates, purge_operation
from ledger.rowsign import RowSigner
from ledger.timers import FiredTimers, TimerSummary
from machines import (
    Arrival,
    ClaimKey,
    KeyClaim,
    LineageRow,
    OperationView,
    arrival_of,
    with_lineage,
)
from schemas import DEFAULT_TOPICS, TopicNames

__all__ = ["PostgresLedger"]


T = TypeVar("T")
Conn = psycopg.Connection[TupleRow]


class _PgLease(OutboxLease):
    def __init__(self, records: tuple[OutboxRecord, ...]) -> None:
        self.records = records
        self.published: list[str] = []
        self.held: dict[str, str] = {}

    def mark_published(self, record_ids: Sequence[str]) -> None:
        self.published.extend(record_ids)

    def hold(self, record_id: str, reason: str) -> None:
        self.held.setdefault(record_id, reason)

    def published_ids(self) -> list[int]:
        """The primary keys of the rows marked published (`mark_published` by id); an id
        the lease did not read is ignored, as the update by record id ignored it."""
        positions = {r.record_id: r.position for r in self.records}
        return [positions[i] for i in self.published if i in positions]


# Every ledger session runs with JIT compilation off. The ledger's statements are short
# OLTP statements over index lookups, but the planner's row estimates for the recursive
# lineage walk run into the billions, which crosses `jit_above_cost`: each batch that
# opened an operation paid about 240 ms of LLVM compilation for a 4 ms statement.
SESSION_OPTIONS: Final = "-c jit=off"

# A pooled connection is pinged (an empty statement, one round trip) before use only when
# it has sat unused for longer than this. One that completed a call a moment ago is alive
# unless the server went away since; then its first statement fails like any lost
# connection (`_run` retries on a fresh one, `lease_outbox` reports `LedgerUnavailable`
# and the relay leases again). The ping on every checkout cost about 50 us of wall time
# per ledger call (three per consumed batch), for nothing on a busy connection.
PING_AFTER_IDLE_SECONDS: Final = 1.0


class _IdleCheck:
    """The pool's `check` callback: ping connections idle for longer than `after`
    seconds (psycopg_pool's own check); `used` records a successful call."""

    def __init__(self, after: float) -> None:
        self._after = after
        self._lock = threading.Lock()
        self._last: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()

    def used(self, conn: Conn) -> None:
        with self._lock:
            self._last[conn] = time.monotonic()

    def __call__(self, conn: Conn) -> None:
        with self._lock:
            last = self._last.get(conn)
        if last is None or time.monotonic() - last > self._after:
            ConnectionPool.check_connection(conn)


class _Reconnect(AttemptWithBackoff):
    """psycopg_pool's reconnection backoff with a ceiling: its own doubles from 1 s
    without one (1, 2, 4, 8, 16 s...), so a pool that lost its server during a failover
    found the promoted standby only at its next attempt, up to twice the outage later
    (measured: a standby writable 8.0 s after the primary's kill, the first decision at
    15.8 s). Retrying every `MAX_DELAY` seconds at most costs one refused connection
    attempt per second while the database is away."""

    INITIAL_DELAY = 0.25
    MAX_DELAY = 1.0

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, self.MAX_DELAY)


class _Pool(ConnectionPool[Conn]):
    """The ledger's pool: psycopg_pool's, reconnecting with `_Reconnect`."""

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        if attempt is None:
            attempt = _Reconnect(timeout=self.reconnect_timeout)
        super()._add_connection(attempt, growing)


class PostgresLedger(Ledger):
    """The Action Ledger on a PostgreSQL database whose schema `ledger.migrations`
    created. `retries` and `backoff` bound how long a lost connection is retried."""

    def __init__(
        self,
        conninfo: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        retries: int = 5,
        backoff: float = 0.2,
        connect_timeout: float = 10.0,
    ) -> None:
        self._retries = retries
        self._backoff = backoff
        self._check = _IdleCheck(PING_AFTER_IDLE_SECONDS)
        self._pool: ConnectionPool[Conn] = _Pool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            timeout=connect_timeout,
            kwargs={
                "connect_timeout": max(1, int(connect_timeout)),
                # A lone statement runs as its own transaction, one round trip; every
                # call that needs more opens an explicit block. Without it psycopg
                # wrapped each read in BEGIN and COMMIT (three round trips for one
                # SELECT), and sent a second BEGIN after a pipelined commit's own.
                "autocommit": True,
                "options": SESSION_OPTIONS,
                "context": ADAPTERS,  # the array dumpers the commit's statements take
            },
            check=self._check,
            open=False,
            name="ledger",
        )
        try:
            with driver_errors(
                f"cannot connect to the ledger database within {connect_timeout:.0f}s",
                lost="check that PostgreSQL is running and the URL is right",
            ):
                self._pool.open(wait=True, timeout=connect_timeout)
        except LedgerError:
            self._pool.close()
            raise

    # -- where driver errors become ledger errors (`ledger.driver`) --------------------

    def _run(self, what: str, fn: Callable[[Conn], T]) -> T:
        """Run `fn` on a pooled connection; retry a lost connection with backoff and
        raise every other driver error as `ledger.driver.translate` names it."""
        delay = self._backoff
        for attempt in range(self._retries + 1):
            try:
                with self._pool.connection() as conn:
                    result = fn(conn)
                    self._check.used(conn)
                    return result
            except DRIVER_ERRORS as exc:
                error = translate(
                    what,
                    exc,
                    lost=f"the database stayed unreachable after {attempt + 1} attempts; "
                    "nothing was written; check PostgreSQL and replay from the stored offsets",
                )
                # Only a lost connection is worth another attempt, on a fresh connection.
                if not isinstance(error, LedgerUnavailable) or attempt == self._retries:
                    raise error from exc
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    # -- fencing and offsets ----------------------------------------------------------

    def claim(
        self, group: str, topic: str, partitions: Sequence[int], owner: str
    ) -> tuple[PartitionClaim, ...]:
        """See `Ledger.claim`."""

        def work(conn: Conn) -> tuple[PartitionClaim, ...]:
            with conn.transaction():
                epochs: dict[int, int] = {}
                for partition in sorted(set(partitions)):
                    row = conn.execute(
                        QUERIES["claim_partition"],
                        {"group": group, "topic": topic, "partition": partition, "owner": owner},
                    ).fetchone()
                    assert row is not None  # INSERT ... RETURNING always returns the row
                    epochs[partition] = int(row[0])
                stored = self._offsets(conn, group, topic)
                attempts = {
                    int(p): PartitionAttempt(
                        topic, int(p), int(a), int(b), int(n), bool(s), o, int(r)
                    )
                    for p, a, b, n, s, o, r in conn.execute(
                        QUERIES["partition_attempts"], {"group": group, "topic": topic}
                    )
                }
            return tuple(
                PartitionClaim(topic, p, epoch, stored.get(p), attempts.get(p))
                for p, epoch in epochs.items()
            )

        return self._run(f"claim {group} {topic}{list(partitions)}", work)

    def record_attempts(
        self,
        group: str,
        attempts: Sequence[PartitionAttempt],
        epochs: Mapping[tuple[str, int], int],
    ) -> tuple[tuple[str, int], ...]:
        """See `Ledger.record_attempts`: one transaction, one statement per partition."""

        def work(conn: Conn) -> tuple[tuple[str, int], ...]:
            fenced: list[tuple[str, int]] = []
            with conn.transaction():
                for a in attempts:
                    row = conn.execute(
                        QUERIES["record_attempt"],
                        {
                            "group": group,
                            "topic": a.topic,
                            "partition": a.partition,
                            "first": a.first_offset,
                            "last": a.last_offset,
                            "starts": a.starts,
                            "single": a.single,
                            "record_starts": a.record_starts,
                            "epoch": epochs[(a.topic, a.partition)],
                        },
                    ).fetchone()
                    if row is None:
                        fenced.append((a.topic, a.partition))
            return tuple(fenced)

        return self._run(f"record attempts of {group}", work)

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        """See `Ledger.offsets`."""
        return self._run(f"offsets {group} {topic}", lambda c: self._offsets(c, group, topic))

    @staticmethod
    def _offsets(conn: Conn, group: str, topic: str) -> dict[int, int]:
        rows = conn.execute(QUERIES["stored_offsets"], {"group": group, "topic": topic})
        return {int(p): int(o) for p, o in rows.fetchall()}

    # -- views --------------------------------------------------------------------------

    def load_views(self, operation_ids: Sequence[str]) -> dict[str, OperationView]:
        """See `Ledger.load_views`."""
        if not operation_ids:
            return {}

        def work(conn: Conn) -> dict[str, OperationView]:
            rows = conn.execute(QUERIES["load_views"], {"ids": list(operation_ids)}).fetchall()
            return {
                op: with_lineage(view_from_text(view), ancestors, agents, contained, below)
                for op, view, ancestors, agents, contained, below in rows
            }

        return self._run("load views", work)

    def arrival_lineage(self, openings: Mapping[str, str | None]) -> dict[str, Arrival]:
        """See `Ledger.arrival_lineage`: one query for the whole batch."""
        if not openings:
            return {}
        parents = sorted({p for p in openings.values() if p is not None})
        params = {"parents": parents, "ids": sorted(openings)}

        def work(conn: Conn) -> dict[str, Arrival]:
            rows = [lineage_row(r) for r in conn.execute(QUERIES["arrival_rows"], params)]
            by_id = {r.operation_id: r for r in rows}
            return {
                op: arrival_of(
                    op,
                    by_id.get(parent) if parent else None,
                    (r for r in rows if r.parent_operation == op),
                )
                for op, parent in openings.items()
            }

        return self._run("arrival lineage", work)

    def key_claims(self, keys: Sequence[ClaimKey]) -> dict[ClaimKey, KeyClaim]:
        """See `Ledger.key_claims`: one query for the whole batch."""
        if not keys:
            return {}
        return self._run("key claims", lambda conn: read_claims(conn, keys))

    # -- the batch transaction ----------------------------------------------------------

    def commit(self, batch: Batch) -> CommitResult:
        """See `Ledger.commit`."""
        plan = batch_rows(batch)
        return self._run(
            f"commit batch of {len(batch.entries)} events for group {batch.group}",
            lambda conn: write_batch(conn, batch, plan),
        )

    # -- timers (`ledger.timers`) --------------------------------------------------------

    def fire_timers(
        self,
        group: str,
        epochs: Mapping[tuple[str, int], int],
        now: datetime,
        *,
        limit: int,
        topics: TopicNames = DEFAULT_TOPICS,
        sign: RowSigner | None = None,
    ) -> FiredTimers:
        """See `Ledger.fire_timers` (`ledger.postgres_timers.fire_due`)."""
        if not epochs or limit <= 0:
            return FiredTimers()
        return self._run(
            f"fire timers of group {group}",
            lambda conn: fire_due(conn, group, epochs, now, limit, topics, sign),
        )

    def timer_summary(
        self, partitions: Sequence[tuple[str, int]], now: datetime, overdue_after: timedelta
    ) -> TimerSummary:
        """See `Ledger.timer_summary`."""
        if not partitions:
            return TimerSummary((), 0, 0)
        return self._run(
            "timer summary", lambda conn: summary(conn, partitions, now, overdue_after)
        )

    # -- reads ----------------------------------------------------------------------------

    def operation(self, operation_id: str) -> OperationInfo:
        """See `Ledger.operation`."""

        def work(conn: Conn) -> OperationInfo:
            row = conn.execute(QUERIES["operation_info"], {"id": operation_id}).fetchone()
            if row is None:
                raise UnknownOperation(f"operation {operation_id} is not in the ledger")
            info = OperationInfo(*row[:14])
            return replace(info, delegated_credentials=tuple(row[14]))

        return self._run(f"operation {operation_id}", work)

    def descendants(self, operation_id: str) -> tuple[str, ...]:
        """See `Ledger.descendants`."""

        def work(conn: Conn) -> tuple[str, ...]:
            rows = conn.execute(QUERIES["descendants"], {"id": operation_id}).fetchall()
            return tuple(str(r[0]) for r in rows)

        return self._run(f"descendants of {operation_id}", work)

    def lineage(self, operation_id: str) -> LineageRow:
        """See `Ledger.lineage`."""

        def work(conn: Conn) -> LineageRow:
            row = conn.execute(QUERIES["lineage_of"], {"id": operation_id}).fetchone()
            if row is None:
                raise UnknownOperation(f"operation {operation_id} is not in the ledger")
            return lineage_row(row)

        return self._run(f"lineage of {operation_id}", work)

    def lineage_tree(self, operation_id: str) -> tuple[LineageRow, ...]:
        """See `Ledger.lineage_tree`."""

        def work(conn: Conn) -> tuple[LineageRow, ...]:
            rows = conn.execute(QUERIES["lineage_subtree"], {"id": operation_id}).fetchall()
            if not rows:
                raise UnknownOperation(f"operation {operation_id} is not in the ledger")
            return tuple(lineage_row(r) for r in rows)

        return self._run(f"lineage tree of {operation_id}", work)

    def decisions(self, operation_id: str) -> tuple[Mapping[str, Any], ...]:
        """See `Ledger.decisions`."""

        def work(conn: Conn) -> tuple[Mapping[str, Any], ...]:
            rows = conn.execute(QUERIES["decisions_of"], {"id": operation_id}).fetchall()
            return tuple(r[0] for r in rows)

        return self._run(f"decisions of {operation_id}", work)

    @contextmanager
    def lease_outbox(self, limit: int, *, payloads: bool = True) -> Iterator[OutboxLease]:
        """See `Ledger.lease_outbox`. The lease is one transaction: the keys' oldest rows
        stay locked while the relay publishes, and the published marks commit at the end
        (an exception rolls them back, so the rows are published again: at-least-once)."""
        lost = "lost the database; the rows stay unpublished and will be leased again"
        with driver_errors("outbox lease", lost=lost), self._pool.connection() as conn:
            with conn.transaction():
                # No bitmap scans in a lease (see `lease_settings` in queries.sql): with
                # a few keys waiting, a bitmap heap scan of the unpublished rows pays on
                # every lease for each row published since the last vacuum.
                conn.execute(QUERIES["lease_settings"])
                # Never a server-side prepared statement: after five runs PostgreSQL may
                # keep a generic plan made while the outbox was empty, which turns
                # quadratic as the backlog grows (minutes per lease at 90,000 rows).
                heads = conn.execute(QUERIES["lease_outbox_heads"], {"limit": limit}, prepare=False)
                keys = [str(r[0]) for r in heads]
                rows = (
                    conn.execute(
                        QUERIES["lease_outbox_rows"], {"keys": keys, "payloads": payloads}
                    ).fetchall()
                    if keys
                    else []
                )
                lease = _PgLease(tuple(_outbox_record(row) for row in rows))
                yield lease
                if lease.published:
                    conn.execute(QUERIES["mark_published"], {"ids": lease.published_ids()})
                for record_id, reason in lease.held.items():
                    params = {"id": record_id, "reason": reason, "keys": keys}
                    conn.execute(QUERIES["hold_outbox_row"], params)
                self._check.used(conn)

    def held_outbox(self) -> tuple[HeldOutboxRow, ...]:
        """See `Ledger.held_outbox`."""

        def work(conn: Conn) -> tuple[HeldOutboxRow, ...]:
            rows = conn.execute(QUERIES["held_outbox_rows"]).fetchall()
            return tuple(
                HeldOutboxRow(int(p), str(rid), str(t), str(k), held_at, str(why), int(n))
                for p, rid, t, k, held_at, why, n in rows
            )

        return self._run("list held outbox rows", work)

    def audit_outbox(self, operation_id: str | None = None) -> tuple[AuditOutboxRow, ...]:
        """See `Ledger.audit_outbox`."""

        def work(conn: Conn) -> tuple[AuditOutboxRow, ...]:
            rows = conn.execute(QUERIES["audit_outbox_rows"], {"id": operation_id})
            return tuple(
                AuditOutboxRow(
                    chain=str(key),
                    sequence=int(seq),
                    record=OutboxRecord(
                        int(position), str(rid), str(topic), str(key), dict(headers), {},
                        None if value is None else bytes(value),
                    ),
                    created_at=created,
                    published_at=published,
                )
                for key, seq, position, rid, topic, headers, value, created, published in rows
            )  # fmt: skip

        return self._run("read the audit outbox rows", work)

    def release_outbox(self, record_id: str) -> str | None:
        """See `Ledger.release_outbox`."""

        def work(conn: Conn) -> str | None:
            with conn.transaction():
                row = conn.execute(QUERIES["release_outbox_row"], {"id": record_id}).fetchone()
            return None if row is None else str(row[0])

        return self._run(f"release outbox row {record_id}", work)

    def purge_candidates(self, before: datetime) -> list[PurgeCandidate]:
        """Operations retention may purge: untouched since `before` (`ledger.retention`)."""
        return self._run("list purge candidates", lambda c: purge_candidates(c, before))

    def purge_operation(
        self,
        operation_id: str,
        *,
        reason: str,
        now: datetime,
        topics: TopicNames,
        sign: RowSigner | None,
    ) -> PurgeResult:
        """Purge one operation's history, leaving a signed tombstone (`ledger.retention`).
        Raises `UnknownOperation`, or `LedgerError` when the database refuses."""
        try:
            return self._run(
                f"purge operation {operation_id}",
                lambda c: purge_operation(
                    c, operation_id, reason=reason, now=now, topics=topics, sign=sign
                ),
            )
        except LookupError as exc:
            raise UnknownOperation(str(exc)) from exc

    def audit_operation_ids(self) -> tuple[str, ...]:
        """See `Ledger.audit_operation_ids`."""
        return self._run(
            "list audited operations",
            lambda c: tuple(str(r[0]) for r in c.execute(QUERIES["audit_operation_ids"])),
        )

    def audit_chain(self, operation_id: str) -> tuple[tuple[AuditRecord, ...], ChainHead | None]:
        """See `Ledger.audit_chain`."""

        def work(conn: Conn) -> tuple[tuple[AuditRecord, ...], ChainHead | None]:
            with conn.transaction():  # one snapshot for the records and the head
                rows = conn.execute(QUERIES["audit_records_of"], {"id": operation_id})
                records = tuple(AuditRecord(*row) for row in rows.fetchall())
                head = conn.execute(QUERIES["audit_head_of"], {"id": operation_id}).fetchone()
            return records, None if head is None else ChainHead(int(head[0]), str(head[1]))

        return self._run(f"audit chain of {operation_id}", work)

    def audit_subject(self, operation_id: str) -> AuditSubject:
        """See `Ledger.audit_subject`."""

        def work(conn: Conn) -> AuditSubject:
            with conn.transaction():  # one snapshot for the decisions and the row
                rows = conn.execute(QUERIES["audit_decision_rows"], {"id": operation_id})
                decided = tuple(
                    DecisionRowFacts(int(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4])
                    for r in rows.fetchall()
                )
                row = conn.execute(QUERIES["audit_operation_row"], {"id": operation_id})
                found = row.fetchone()
            if found is None:
                return AuditSubject(decided, None, {}, None)
            state, version, retries, recoveries, spent, view = found
            counters = {
                "version": int(version),
                "epoch": int(view.get("epoch", 0)),
                "retry_attempts": int(retries),
                "recovery_attempts": int(recoveries),
                "budget_spent": int(spent),
            }
            return AuditSubject(decided, str(state), counters, view)

        return self._run(f"audit subject of {operation_id}", work)

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()


def _outbox_record(row: TupleRow) -> OutboxRecord:
    position, record_id, topic, key, headers, payload, audit_record, value = row
    signed = None if value is None else bytes(value)
    if signed is not None and payload is None and audit_record is None:
        # Published as signed; a lease without payloads reads neither (lease_outbox_rows).
        return OutboxRecord(position, record_id, topic, key, headers, {}, signed)
    body = audit_record if payload is None else loads(payload)
    return OutboxRecord(position, record_id, topic, key, headers, body, signed)
