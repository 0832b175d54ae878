"""The runtime's roles as child processes for the lineage tests: `python -m consumer`
(a controller) and `python -m ops.cli run --role relay`, each logging to its own file,
killable with SIGKILL as a crash. Waits poll and say what they waited for."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from tests.support import roles

__all__ = ["Child", "log_tail", "wait_until"]

_ROOT: Final = Path(__file__).resolve().parents[3]


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file, for failure messages."""
    return roles.log_tail(path, lines)


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    every: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll `condition` until it holds; fail naming `what` (and `detail()`) otherwise."""
    roles.poll_until(condition, timeout, what, every=every, detail=detail)


class Child:
    """One role process; stderr goes to `log_path` (appended, so restarts share it)."""

    def __init__(self, role: str, env: Mapping[str, str], log_path: Path) -> None:
        self.role = role
        self.log_path = log_path
        self._offset = log_path.stat().st_size if log_path.exists() else 0
        self._log = log_path.open("ab")
        self._proc = subprocess.Popen(
            roles.role_argv(role),
            cwd=_ROOT,
            env=roles.role_env(env, role),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The process id."""
        return self._proc.pid

    def hangup(self) -> None:
        """SIGHUP: a controller reloads its rules (`consumer.reload`)."""
        self._proc.send_signal(signal.SIGHUP)

    def wait_assigned(self, timeout: float) -> None:
        """Wait until this controller logs a partition assignment (of its own run)."""

        def assigned() -> bool:
            with self.log_path.open("rb") as log:
                log.seek(self._offset)
                return b" assigned " in log.read()

        wait_until(
            lambda: assigned() or not self.alive(),
            timeout,
            f"{self.role} pid {self._proc.pid} to be assigned partitions",
            detail=lambda: log_tail(self.log_path),
        )
        assert self.alive(), f"{self.role} exited early:\n{log_tail(self.log_path)}"

    def kill(self) -> None:
        """SIGKILL, as a crash: no handler runs, nothing is flushed."""
        if self.alive():
            self._proc.send_signal(signal.SIGKILL)
        self._proc.wait(10)
        self._log.close()

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after 30 s); closes the log."""
        if self.alive():
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._log.close()
