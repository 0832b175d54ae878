"""The exceptions of the `ops` package, and the one place that maps any failure a command
meets to the process's exit status.

Exit status: 0 done; 1 the checked or requested thing failed (a broken chain, an invalid
machine, a refused decision, a broker that refused); 2 usage or configuration (a missing
flag or setting, no database or broker known or reachable, an unreadable file, an
unknown operation). A command raises; `recoveryctl`'s `execute` prints the message once,
prefixed with the command, and exits with `exit_status(exc)`.
"""

from __future__ import annotations

from typing import ClassVar

from consumer import ControllerError, PolicyRefused
from ledger import LedgerError, MigrationError
from machines import KeyFileError, MachineError, PolicyError
from producers import KafkaReadError, ProducersError
from schemas import ConfigurationError, WireError

__all__ = [
    "CheckFailed",
    "NotConfigured",
    "OpsError",
    "Refused",
    "StackError",
    "UsageError",
    "exit_status",
]


class OpsError(Exception):
    """An operator command failed; the message says what to do."""

    exit_code: ClassVar[int] = 1

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class CheckFailed(OpsError):
    """What the command checked is not as it should be (exit 1)."""


class Refused(OpsError):
    """The request was refused; nothing was changed (exit 1)."""


class UsageError(OpsError):
    """The command cannot run as asked: fix the flag, setting or file it names (exit 2)."""

    exit_code: ClassVar[int] = 2


class NotConfigured(UsageError):
    """A service or setting the command needs is named nowhere (exit 2)."""


class StackError(OpsError):
    """A local service (Kafka or PostgreSQL) could not be prepared, started or stopped."""


# Failures of the layers below, by what they mean to an operator: the request failed
# (a migration, a publish, a broker's refusal: exit 1), or the command could not work
# with what it was given (settings, files, a database or broker it cannot use: exit 2).
# The first match wins.
_STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (OpsError, -1),  # its own exit_code
    (MigrationError, 1),
    (ConfigurationError, 2),
    (LedgerError, 2),
    (KafkaReadError, 2),
    (KeyFileError, 2),
    (PolicyError, 2),
    (MachineError, 2),
    (PolicyRefused, 2),
    (ControllerError, 2),
    (ProducersError, 1),
    (WireError, 1),
)


def exit_status(exc: BaseException) -> int | None:
    """The exit status `exc` ends a command with, or None for an exception that is a
    bug (shown with its traceback)."""
    for kind, status in _STATUS:
        if isinstance(exc, kind):
            return exc.exit_code if isinstance(exc, OpsError) else status
    return None
