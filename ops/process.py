"""Small process helpers shared by the Kafka and PostgreSQL launchers."""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["child_pids", "file_lock", "log_tail", "pid_alive", "pid_cmdline", "terminate"]


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (created if missing) for the block, so
    that two processes never download into, start or stop the same thing at once."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file, or a note saying it does not exist yet."""
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            tail = deque(handle, maxlen=lines)
    except FileNotFoundError:
        return f"(no log at {path})"
    return "".join(tail).rstrip() or f"(log {path} is empty)"


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state letter follows the parenthesised command name, which may contain spaces.
    return status.rpartition(")")[2].split()[0] != "Z"


def child_pids(parent: int) -> list[int]:
    """The ids of the processes whose parent is `parent` (none when it is gone)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # ended while we looked, or not ours to read
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def pid_cmdline(pid: int) -> str:
    """The command line of a process with NULs turned into spaces ("" if it is gone);
    used to make sure a pid from a state file still names our process before we signal."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def terminate(pid: int, grace_seconds: float) -> bool:
    """Send SIGTERM, wait up to `grace_seconds` for the process to exit, then SIGKILL.
    Returns True when it exited on SIGTERM, False when it had to be killed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    if _wait_gone(pid, grace_seconds):
        return True
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    _wait_gone(pid, 10.0)
    return False


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def _reap(pid: int) -> None:
    # Our own children stay zombies until waited for; reap so pid_alive sees them go.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
