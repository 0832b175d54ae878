"""The exception base of the `ops` package and the errors of the local stack."""

from __future__ import annotations

__all__ = ["OpsError", "StackError"]


class OpsError(Exception):
    """An operator command failed; the message says what to do."""


class StackError(OpsError):
    """A local service (Kafka or PostgreSQL) could not be prepared, started or stopped."""
