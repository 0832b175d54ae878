"""The runtime's roles as real child processes, and bounded waits that say what they
waited for.

`RoleProcess` runs `python -m consumer` (a controller) or `python -m ops.cli run --role
relay` (an outbox relay) with an environment of its own, copies its stderr to a log file
(one per process, so a failure message can quote the right tail), and can be killed with
any signal: SIGKILL for a crash, SIGTERM for an operator's stop, SIGSTOP/SIGCONT for a
member that freezes (a long GC pause, a stalled VM) and comes back as a zombie.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, TextIO

from tests.support import roles

__all__ = ["FaultError", "RoleProcess", "log_tail", "wait_until"]

_ASSIGNED: Final = " assigned "


class FaultError(AssertionError):
    """A fault test's expectation was not met; the message names what and where to look."""


def log_tail(path: Path, lines: int = 25) -> str:
    """The last `lines` lines of a role's log, for failure messages."""
    return roles.log_tail(path, lines)


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    every: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll `condition` until it holds; raise `FaultError` naming `what` (and whatever
    `detail()` adds: progress so far, a log tail) after `timeout` seconds."""
    roles.poll_until(condition, timeout, what, every=every, detail=detail, error=FaultError)


class RoleProcess:
    """One controller or relay process (see the module docstring). A `RoleProcess` is
    started once; a restart is a new `RoleProcess` (a new pid, a new member). `argv`
    replaces the role's command line (a test build of the role, same environment)."""

    def __init__(
        self,
        role: str,
        env: Mapping[str, str],
        log_path: Path,
        *,
        argv: Sequence[str] | None = None,
    ) -> None:
        if role not in roles.ROLE_COMMANDS:
            raise ValueError(
                f"unknown role {role!r}; expected one of {sorted(roles.ROLE_COMMANDS)}"
            )
        self.role = role
        self.log_path = log_path
        self._assigned = threading.Event()
        self._proc = subprocess.Popen(
            list(argv) if argv is not None else roles.role_argv(role),
            env=roles.role_env(env, role),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        log = log_path.open("a", encoding="utf-8")
        log.write(f"---- {role} pid {self._proc.pid} started {time.strftime('%X')}\n")
        self._copier = threading.Thread(target=self._copy, args=(log,), daemon=True)
        self._copier.start()

    def __repr__(self) -> str:
        return f"{self.role}[pid {self.pid}]"

    @property
    def pid(self) -> int:
        """The process id."""
        return self._proc.pid

    def _copy(self, log: TextIO) -> None:
        assert self._proc.stderr is not None
        with log, self._proc.stderr as stderr:
            for line in stderr:
                if _ASSIGNED in line:
                    self._assigned.set()
                log.write(line)
                log.flush()

    @property
    def assigned(self) -> bool:
        """Whether the controller has logged a partition assignment yet."""
        return self._assigned.is_set()

    def alive(self) -> bool:
        """Whether the process is still running (a stopped process counts as running)."""
        return self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The exit status (negative: the signal that ended it), or None while running."""
        return self._proc.poll()

    def wait_assigned(self, timeout: float) -> None:
        """Wait until the controller logs its first partition assignment."""
        wait_until(
            lambda: self._assigned.is_set() or not self.alive(),
            timeout,
            f"{self} to be assigned partitions",
            detail=lambda: log_tail(self.log_path),
        )
        if not self._assigned.is_set():
            raise FaultError(
                f"{self} exited with status {self.exit_code()} before it was assigned "
                f"partitions:\n{log_tail(self.log_path)}"
            )

    def signal(self, signum: signal.Signals) -> None:
        """Send `signum` to the process (nothing if it already exited)."""
        if self.alive():
            self._proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, as a crash: no handler runs, nothing is flushed; reaped at once."""
        self.signal(signal.SIGKILL)
        self._proc.wait(10)
        self._copier.join(5)

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM, as an operator's stop; waits for the exit and returns its status.
        Raises `FaultError` if the process does not exit within `timeout` seconds."""
        self.signal(signal.SIGTERM)
        try:
            status = self._proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            self.kill()
            raise FaultError(
                f"{self} did not exit within {timeout:.0f}s of SIGTERM:\n{log_tail(self.log_path)}"
            ) from exc
        self._copier.join(5)
        return status

    def ensure_gone(self) -> None:
        """Kill the process if it still runs (test clean-up)."""
        if self.alive():
            self.signal(signal.SIGCONT)
            self.kill()
