"""The runtime's roles as child processes for the lineage tests: `python -m consumer`
(a controller) and `python -m ops.cli run --role relay`, each logging to its own file,
killable with SIGKILL as a crash. Waits poll and say what they waited for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

__all__ = ["Child", "log_tail", "wait_until"]

_COMMANDS: Final[Mapping[str, tuple[str, ...]]] = {
    "controller": ("-m", "consumer"),
    "relay": ("-m", "ops.cli", "run", "--role", "relay"),
}
_ROOT: Final = Path(__file__).resolve().parents[3]


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file, for failure messages."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    *,
    every: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> None:
    """Poll `condition` until it holds; fail naming `what` (and `detail()`) otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    extra = f"\n{detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")


class Child:
    """One role process; stderr goes to `log_path` (appended, so restarts share it)."""

    def __init__(self, role: str, env: Mapping[str, str], log_path: Path) -> None:
        self.role = role
        self.log_path = log_path
        # RECOVERY_* settings of the test process must not leak into the child.
        base = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERY_")}
        self._offset = log_path.stat().st_size if log_path.exists() else 0
        self._log = log_path.open("ab")
        self._proc = subprocess.Popen(
            [sys.executable, *_COMMANDS[role]],
            cwd=_ROOT,
            env={**base, **env, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self._proc.poll() is None

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
