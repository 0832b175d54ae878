"""The runtime roles under test, as child processes whose memory can be read on its own.

`RoleProcess` starts `python -m consumer` (one controller) or `recoveryctl run --role
relay` (one outbox relay) with the benchmark's services and topic names in the
environment, copies its log lines to a file, notes when the controller first logs a
partition assignment (the moment it starts reading records) and the CPU it had used by
then (its start-up, which a phase's CPU per event leaves out), and samples
`/proc/<pid>/status` (VmRSS; VmHWM is the kernel's own peak) every `sample_every`
seconds. `stop` sends SIGTERM, as an operator would, and waits for a clean exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO

from ops.bench.cpu import process_cpu
from ops.errors import OpsError

__all__ = ["BenchError", "MemorySample", "RoleProcess", "read_memory"]

_ASSIGNED: Final = " assigned "
# What each role logs once started, before its first poll (`consumer.heap`, the relay).
_STARTED: Final = " startup objects frozen out of garbage collection"
_KIB: Final = 1024


class BenchError(OpsError):
    """The benchmark could not run: a service, a role process or a phase failed."""


@dataclass(frozen=True, slots=True)
class MemorySample:
    """Resident memory of one process at one moment, in bytes."""

    at: float
    rss: int
    hwm: int


def read_memory(pid: int) -> MemorySample | None:
    """VmRSS and VmHWM of `pid` from `/proc/<pid>/status`; None once it has exited."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) * _KIB
    if "VmRSS" not in values:
        return None
    return MemorySample(time.time(), values["VmRSS"], values.get("VmHWM", values["VmRSS"]))


@dataclass
class RoleProcess:
    """One role as a child process (see module docstring)."""

    role: str
    env: Mapping[str, str]
    log_path: Path
    sample_every: float = 0.1
    # Which one of several of the same role (`controller-2`); the role when alone.
    name: str = ""
    samples: list[MemorySample] = field(default_factory=list)
    started_at: float | None = None
    assigned_at: float | None = None
    cpu_at_assigned: float | None = None
    # The latest assignment it logged (a rebalance can assign more than once).
    last_assigned_at: float | None = None
    _proc: subprocess.Popen[str] | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.name = self.name or self.role

    def start(self) -> None:
        """Start the process and its log and memory threads."""
        command = (
            [sys.executable, "-m", "consumer"]
            if self.role == "controller"
            else [sys.executable, "-m", "ops.cli", "run", "--role", "relay"]
        )
        self._proc = subprocess.Popen(
            command,
            env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        log = self.log_path.open("a", encoding="utf-8")
        self._threads = [
            threading.Thread(target=self._copy_log, args=(log,), daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        if self._proc is None:
            raise BenchError(f"{self.role}: not started")
        return self._proc.pid

    def _copy_log(self, log: TextIO) -> None:
        assert self._proc is not None
        assert self._proc.stderr is not None
        with log:
            for line in self._proc.stderr:
                if self.started_at is None and _STARTED in line:
                    self.started_at = time.time()
                if _ASSIGNED in line:
                    self.last_assigned_at = time.time()
                if self.assigned_at is None and _ASSIGNED in line:
                    self.assigned_at = time.time()
                    self.cpu_at_assigned = process_cpu(self._proc.pid)
                log.write(line)

    def _sample(self) -> None:
        while not self._done.is_set():
            sample = read_memory(self.pid)
            if sample is None:
                return
            self.samples.append(sample)
            self._done.wait(self.sample_every)

    def exit_code(self) -> int | None:
        """The exit status once the process has ended, else None."""
        return None if self._proc is None else self._proc.poll()

    @property
    def peak_rss(self) -> int:
        """The kernel's high-water mark of resident memory (bytes) seen so far."""
        return max((s.hwm for s in self.samples), default=0)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait up to `timeout` seconds (then SIGKILL); the exit status."""
        if self._proc is None:
            return 0
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._done.set()
        for thread in self._threads:
            thread.join(5.0)
        return self._proc.returncode
