"""The ledger's exceptions: one base, the docstring is the default message.

Driver errors never leave `ledger/` untranslated: `ledger.driver` turns them into these
in one place (`raise ... from exc`), so callers handle ledger outcomes, not psycopg's.
"""

from __future__ import annotations

__all__ = [
    "EventIdReused",
    "FencedError",
    "LedgerError",
    "LedgerUnavailable",
    "MigrationError",
    "NonceReused",
    "RetryableConflict",
    "UnknownOperation",
    "VersionConflict",
    "fenced_message",
    "reuse_message",
    "version_message",
]


class LedgerError(Exception):
    """The Action Ledger refused or failed the request; nothing of it was written."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class FencedError(LedgerError):
    """This consumer no longer owns the partition (a newer epoch claimed it): drop the
    batch, do not retry it, and wait for the next assignment."""


class RetryableConflict(LedgerError):
    """Another writer changed the same operations concurrently; nothing of this batch was
    written: reload the views and decide the batch again from the stored offsets."""


class VersionConflict(RetryableConflict):
    """An operation's stored version is not the one the batch was decided on: reload the
    views and decide the batch again from the stored offsets."""


class EventIdReused(LedgerError):
    """An event id the batch treats as new is already stored for another operation:
    dead-letter that event as a conflicting reuse and commit the batch without it."""

    def __init__(self, message: str | None = None, *, event_id: str | None = None) -> None:
        super().__init__(message)
        # Which event to dead-letter; None when the database reported the clash without
        # naming it (a concurrent writer): decide the batch again and it will be named.
        self.event_id = event_id


class NonceReused(LedgerError):
    """An approval nonce is already stored: a replayed human decision; dead-letter it."""

    def __init__(self, message: str | None = None, *, nonce: str | None = None) -> None:
        super().__init__(message)
        self.nonce = nonce  # the replayed nonce, when known


class UnknownOperation(LedgerError):
    """The ledger holds no operation with that id."""


class LedgerUnavailable(LedgerError):
    """The database could not be reached after retrying with backoff; nothing of the
    request was written. Check that PostgreSQL is running and reachable."""


class MigrationError(LedgerError):
    """A migration could not be applied; the database is left at the last applied one."""


def fenced_message(group: str, topic: str, partition: int, epoch: int, stored: int | None) -> str:
    return (
        f"group {group}: {topic}[{partition}] was claimed at epoch {stored}, this batch holds "
        f"epoch {epoch}: the partition was reassigned; drop the batch and rejoin"
    )


def version_message(operation_id: str, expected: int, found: int) -> str:
    return (
        f"operation {operation_id}: batch decided on version {expected}, ledger holds version "
        f"{found}: reload the view and decide again from the stored offsets"
    )


def opened_message(operation_id: str) -> str:
    return (
        f"operation {operation_id}: this batch opens it, but it is stored already (another "
        "writer, or this batch's own earlier commit): reload the view and decide again "
        "from the stored offsets"
    )


def reuse_message(event_id: str, operation_id: str, stored_op: str) -> str:
    return (
        f"event {event_id} (operation {operation_id}) is already stored for operation "
        f"{stored_op}: dead-letter it as a conflicting reuse and commit the batch without it"
    )
