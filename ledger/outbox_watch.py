"""The relay's watch on the outbox: wake-ups when rows commit (LISTEN/NOTIFY), and the
backlog of unpublished rows for the metrics.

Migration 0002 adds a statement-level trigger that sends `NOTIFY recovery_outbox` for
every statement inserting outbox rows; PostgreSQL delivers it when (and only if) the
transaction commits. `OutboxWatch` holds one dedicated autocommit connection that
LISTENs on the channel; `wait(timeout)` returns as soon as a notification arrives (or
at the timeout), so a relay sleeps when idle and wakes within a millisecond or so of a
commit. Notifications are hints, not data: the relay leases whatever is unpublished,
and still polls at its timeout in case a notification was lost with a connection.
"""

from __future__ import annotations

from types import TracebackType
from typing import Final

import psycopg
from psycopg import sql

from ledger.driver import driver_errors
from ledger.errors import LedgerUnavailable

__all__ = ["OUTBOX_CHANNEL", "OutboxWatch"]

OUTBOX_CHANNEL: Final = "recovery_outbox"
# Counted through the partial index on unpublished rows, so it stays cheap.
_BACKLOG: Final = sql.SQL("SELECT count(*) FROM outbox WHERE published_at IS NULL")


class OutboxWatch:
    """A LISTEN connection on the outbox channel; not thread-safe (one per relay)."""

    def __init__(self, conninfo: str, *, connect_timeout: float = 10.0) -> None:
        with driver_errors(
            f"outbox watch: cannot LISTEN on {OUTBOX_CHANNEL}",
            lost="the relay falls back to polling until the database answers",
            every=LedgerUnavailable,
        ):
            self._conn = psycopg.connect(
                conninfo, autocommit=True, connect_timeout=max(1, int(connect_timeout))
            )
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(OUTBOX_CHANNEL)))

    def wait(self, timeout: float) -> bool:
        """Block until at least one notification arrives or `timeout` seconds pass;
        drain every pending notification; return whether any arrived. Raises
        `LedgerUnavailable` when the connection is lost (open a new listener)."""
        lost = "open a new listener"
        with driver_errors("outbox watch: lost the database", lost=lost, every=LedgerUnavailable):
            woke = False
            for _ in self._conn.notifies(timeout=timeout, stop_after=1):
                woke = True
            if woke:
                # Coalesce a burst: commits that happened meanwhile are one wake-up.
                for _ in self._conn.notifies(timeout=0.0):
                    pass
            return woke

    def backlog(self) -> int:
        """How many outbox rows are not yet published (all relays together). Raises
        `LedgerUnavailable` when the connection is lost."""
        lost = "open a new listener"
        with driver_errors("outbox backlog: lost the database", lost=lost, every=LedgerUnavailable):
            row = self._conn.execute(_BACKLOG).fetchone()
        return 0 if row is None else int(row[0])

    def close(self) -> None:
        """Close the connection; idempotent."""
        self._conn.close()

    def __enter__(self) -> OutboxWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
