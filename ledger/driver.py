"""The one place psycopg's errors become the ledger's (`raise ... from exc`).

Every module of `ledger/` that talks to PostgreSQL runs its driver calls inside
`driver_errors` (or, where it retries, asks `translate` which ledger error a failure is),
so callers handle ledger outcomes and never see psycopg's classes:

- a serialization failure or deadlock: `RetryableConflict` (decide the batch again);
- a lost or unreachable server (and a pool that found no connection in time):
  `LedgerUnavailable`, the only failure worth retrying on a fresh connection;
- a unique violation on an approval nonce or an event id: `NonceReused`, `EventIdReused`;
- anything else the server refused: `LedgerError`.

A caller whose whole step means one thing (a migration that failed, a LISTEN connection
that is gone) names that class instead, as `every`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from ledger.errors import (
    EventIdReused,
    LedgerError,
    LedgerUnavailable,
    NonceReused,
    RetryableConflict,
)

__all__ = ["DRIVER_ERRORS", "driver_errors", "translate"]

# What `driver_errors` catches: every psycopg error, and the pool's wait for a connection.
DRIVER_ERRORS: Final = (psycopg.Error, PoolTimeout)

_LOST: Final = "lost the database; nothing was written: check that PostgreSQL is running"


def translate(
    what: str,
    exc: psycopg.Error | PoolTimeout,
    *,
    lost: str = _LOST,
    every: type[LedgerError] | None = None,
) -> LedgerError:
    """The ledger error for driver error `exc` raised while doing `what` (a phrase naming
    the ids involved). `lost` says what a lost connection means and what to do; `every`,
    when given, is the class of every failure, with `lost` as its advice."""
    if every is not None:
        return every(f"{what}: {exc}; {lost}")
    # Conflicts first: psycopg files them under OperationalError, like a lost connection.
    if isinstance(exc, (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)):
        return RetryableConflict(
            f"{what}: concurrent writer on the same operations ({exc.sqlstate}); "
            "reload the views and decide the batch again"
        )
    if isinstance(exc, (psycopg.OperationalError, PoolTimeout)):
        return LedgerUnavailable(f"{what}: {lost} ({exc})")
    if isinstance(exc, pg_errors.UniqueViolation):
        constraint = exc.diag.constraint_name or ""
        if "nonce" in constraint:
            return NonceReused(
                f"{what}: an approval nonce is already stored ({exc.diag.message_detail})"
            )
        if constraint.startswith("events"):
            return EventIdReused(
                f"{what}: an event id is already stored ({exc.diag.message_detail})"
            )
    return LedgerError(f"{what}: the database refused it: {exc}")


@contextmanager
def driver_errors(
    what: str, *, lost: str = _LOST, every: type[LedgerError] | None = None
) -> Iterator[None]:
    """Run the block's driver calls with their errors translated (`translate`); ledger
    errors the block raises itself pass unchanged."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise translate(what, exc, lost=lost, every=every) from exc
