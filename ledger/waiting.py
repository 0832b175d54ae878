"""Waiting for the ledger database instead of exiting: at start, and while a failover
promotes a new primary.

A component that finds no read-write server (the server is down, or a failover pair is
between primaries and libpq's `target_session_attrs=read-write` skips the standby)
retries what it was doing with exponential backoff, doubling from `initial` to at most
`maximum` seconds, for at most `timeout` seconds in all; then it gives up with the last
`LedgerUnavailable`, so that nothing waits forever and a supervisor sees the outage.
Only `LedgerUnavailable` is waited out; every other error is raised at once. While it
waits, `problem()` says what for, since when, how often it tried and the last error:
that is the component's readiness check (`/readyz`) and its log line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ledger.errors import LedgerUnavailable

__all__ = ["DatabaseWait"]

T = TypeVar("T")

log = logging.getLogger("ledger.waiting")


class DatabaseWait:
    """Bounded waiting for the ledger database (module docstring). `who` names the
    component in messages ("controller c-1", "relay relay-7-0", "recoveryctl")."""

    def __init__(
        self,
        who: str,
        *,
        timeout: float,
        initial: float = 0.2,
        maximum: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.who = who
        self.timeout = timeout
        self.initial = initial
        self.maximum = maximum
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None
        self._attempts = 0
        self._last: str | None = None

    def run(self, what: str, step: Callable[[], T], stop: threading.Event | None = None) -> T:
        """`step()`, retried while it raises `LedgerUnavailable` (module docstring).
        Raises the last `LedgerUnavailable` once `timeout` seconds have passed, or when
        `stop` is set."""
        stop = stop or threading.Event()
        started = self._clock()
        delay = self.initial
        while True:
            try:
                result = step()
            except LedgerUnavailable as exc:
                waited = self._clock() - started
                if waited + delay > self.timeout or stop.is_set():
                    self._done()
                    raise LedgerUnavailable(
                        f"{self.who}: gave up waiting for the ledger database to {what} "
                        f"after {waited:.0f}s (RECOVERY_DATABASE_WAIT_S={self.timeout:g}): "
                        f"{exc}"
                    ) from exc
                self._note(what, exc, started, delay)
                stop.wait(delay)
                delay = min(delay * 2, self.maximum)
                continue
            if self._since is not None:
                log.info(
                    "%s: the ledger database answers again after %.1fs (%d attempts)",
                    self.who,
                    self._clock() - self._since,
                    self._attempts,
                )
            self._done()
            return result

    def problem(self) -> str | None:
        """None unless waiting; then what for, since when and the last error."""
        with self._lock:
            if self._since is None:
                return None
            return (
                f"{self.who} waits for a read-write ledger database ({self._last}); "
                f"{self._clock() - self._since:.0f}s so far, {self._attempts} attempt(s), "
                f"gives up after {self.timeout:g}s (RECOVERY_DATABASE_WAIT_S)"
            )

    def _note(self, what: str, exc: LedgerUnavailable, started: float, delay: float) -> None:
        with self._lock:
            if self._since is None:
                self._since = started
            self._attempts += 1
            self._last = f"to {what}: {_brief(exc)}"
            attempts = self._attempts
        log.warning(
            "%s: no read-write ledger database yet to %s (attempt %d, next in %.1fs, gives "
            "up after %gs): %s",
            self.who,
            what,
            attempts,
            delay,
            self.timeout,
            _brief(exc),
        )

    def _done(self) -> None:
        with self._lock:
            self._since = None
            self._attempts = 0
            self._last = None


def _brief(exc: BaseException) -> str:
    """The error on one line, at most 600 characters (libpq's message for a multi-host
    URL names every host it tried, one per line)."""
    text = " ".join(str(exc).split())
    return (text[:597] + "...") if len(text) > 600 else text or type(exc).__name__
