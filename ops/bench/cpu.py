"""CPU time per process kind over a phase of the benchmark, from `/proc`.

A phase's CPU per event is the growth of each process's `utime + stime`
(`/proc/<pid>/stat`, clock ticks) from the phase's start to its end, divided by the
records the phase drained. The kinds:

- the controllers and the relay: the benchmark's own child processes;
- the broker: the process listening on the bootstrap port (one JVM; its threads are in
  its own counters);
- the PostgreSQL server: the postmaster and every child of it, the ones that exited
  during the phase included (the kernel adds a reaped child's time to its parent's
  `cutime + cstime`); and, within it, the backends connected to the bench's database,
  by the `application_name` each role's connections carry (the benchmark's own polling
  sessions are closed by the end of a drain and not among them);
- the benchmark itself (its tail and progress polling during a drain);
- the whole machine (`/proc/stat`), so that what other work took is visible: on a shared
  machine the broker and server counters include other users' traffic too.

A kind that is not on this host (a remote broker or server) reads as None and is left
out of the figures.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg

from ops.process import child_pids

__all__ = [
    "CpuSnapshot",
    "CpuWatch",
    "cpu_figures",
    "listening_pid",
    "machine_cpu",
    "postmaster_pid",
    "process_cpu",
    "tree_cpu",
]

_TICK: Final = float(os.sysconf("SC_CLK_TCK"))
_LISTEN: Final = "0A"
_FORWARDERS: Final = frozenset({"docker-proxy", "rootlessport", "slirp4netns", "pasta"})


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (which may hold spaces):
    [0] state, [1] ppid, [11] utime, [12] stime, [13] cutime, [14] cstime."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text.rpartition(")")[2].split()


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) `pid` has used; None once it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu(root: int) -> float | None:
    """CPU seconds of `root`, of its reaped children (`cutime + cstime`) and of its live
    children: what a server of one parent and its worker processes has used."""
    fields = _stat_fields(root)
    if fields is None:
        return None
    total = sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK
    return total + sum(process_cpu(child) or 0.0 for child in child_pids(root))


def machine_cpu() -> float:
    """CPU seconds every core of the machine has spent busy (not idle or waiting on
    I/O), from the first line of `/proc/stat`."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    busy = sum(values[:3]) + sum(values[5:8])
    return busy / _TICK


def _pids() -> Iterable[int]:
    with os.scandir("/proc") as entries:
        return [int(entry.name) for entry in entries if entry.name.isdigit()]


def listening_pid(port: int) -> int | None:
    """The process listening on TCP `port` on this host, found through the socket's
    inode in `/proc/net/tcp{,6}` and the processes' open descriptors; None when no
    process here listens on it (a remote broker) or it cannot be read."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if (
                len(parts) > 9
                and parts[3] == _LISTEN
                and int(parts[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(f"socket:[{parts[9]}]")
    if not inodes:
        return None
    for pid in _pids():
        try:
            with os.scandir(f"/proc/{pid}/fd") as fds:
                if any(_link(fd.path) in inodes for fd in fds):
                    # A container's port forwarder holds the port, not the broker.
                    return None if _comm(pid) in _FORWARDERS else pid
        except OSError:
            continue
    return None


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since the listing
        return ""


def postmaster_pid(url: str) -> int | None:
    """The postmaster of the server `url` reaches, if it runs on this host: the parent
    of this connection's backend. None when that backend is not a local process."""
    # Read while the session is open: its backend exits with it.
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        if row is None:
            return None
        # A server in a container reports its own namespace's pid: a local process of
        # that number, if any, is someone else, and is not a PostgreSQL backend.
        backend = int(row[0])
        fields = _stat_fields(backend)
        if fields is None or _comm(backend) != "postgres":
            return None
        parent = int(fields[1])
    return parent if _comm(parent) == "postgres" else None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _backends(url: str, database: str) -> dict[int, str]:
    """Backend pid → application_name of every session on `database`."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchall()
    return {int(pid): str(name or "") for pid, name in rows}


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """CPU seconds used so far, per kind (None: not on this host), and when."""

    at: float
    roles: Mapping[str, float]
    broker: float | None
    server: float | None
    backends: Mapping[int, tuple[str, float]]
    bench: float
    machine: float


@dataclass
class CpuWatch:
    """Takes `CpuSnapshot`s of one run's processes (module docstring). `roles` names
    each role process (`controller-1`, `relay`, ...) by pid; the kind of a name is its
    part before the first `-`. `url` / `database`: the bench's database, to find the
    server and the backends; `broker_port`: the bootstrap port."""

    url: str
    database: str
    broker_port: int | None
    _postmaster: int | None = None
    _broker: int | None = None
    _found: bool = False
    notes: list[str] = field(default_factory=list)

    def _find(self) -> None:
        if self._found:
            return
        self._found = True
        self._postmaster = postmaster_pid(self.url)
        if self._postmaster is None:
            self.notes.append("PostgreSQL server not on this host: its CPU is not counted")
        self._broker = None if self.broker_port is None else listening_pid(self.broker_port)
        if self._broker is None:
            self.notes.append("Kafka broker not on this host: its CPU is not counted")

    def snapshot(self, roles: Mapping[str, int], *, at: float) -> CpuSnapshot:
        """CPU used so far by each of `roles` (name → pid) and by the services."""
        self._find()
        backends = {
            pid: (name, cpu)
            for pid, name in _backends(self.url, self.database).items()
            if (cpu := process_cpu(pid)) is not None
        }
        return CpuSnapshot(
            at=at,
            roles={
                name: cpu for name, pid in roles.items() if (cpu := process_cpu(pid)) is not None
            },
            broker=None if self._broker is None else process_cpu(self._broker),
            server=None if self._postmaster is None else tree_cpu(self._postmaster),
            backends=backends,
            bench=sum(os.times()[:2]),
            machine=machine_cpu(),
        )


def cpu_figures(
    start: CpuSnapshot,
    end: CpuSnapshot,
    records: int,
    *,
    role_starts: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Per kind: CPU seconds over the phase, µs per record and cores busy (seconds of CPU
    per second of the phase); `role_starts` overrides a role's starting CPU (a member
    counted from its own first assignment, not from its start-up)."""
    wall = max(end.at - start.at, 1e-9)
    used: dict[str, float] = {}
    per_role: dict[str, float] = {}
    for name, cpu in end.roles.items():
        begin = (role_starts or {}).get(name, start.roles.get(name, 0.0))
        per_role[name] = cpu - begin
        kind = name.split("-", 1)[0]
        used[kind] = used.get(kind, 0.0) + cpu - begin
    if start.broker is not None and end.broker is not None:
        used["broker"] = end.broker - start.broker
    if start.server is not None and end.server is not None:
        used["postgres"] = end.server - start.server
    by_app: dict[str, float] = {}
    for pid, (name, cpu) in end.backends.items():
        before = start.backends.get(pid)
        kind = _backend_kind(name)
        by_app[kind] = by_app.get(kind, 0.0) + cpu - (before[1] if before else 0.0)
    used["bench"] = end.bench - start.bench
    machine = end.machine - start.machine
    measured = sum(used.values())
    used["other"] = max(machine - measured, 0.0)

    def line(seconds: float) -> dict[str, float]:
        return {
            "cpu_seconds": round(seconds, 3),
            "us_per_event": round(seconds * 1e6 / max(records, 1), 1),
            "cores_busy": round(seconds / wall, 3),
        }

    pipeline = sum(v for k, v in used.items() if k not in ("bench", "other"))
    return {
        "seconds": round(wall, 3),
        "records": records,
        "kinds": {kind: line(seconds) for kind, seconds in used.items()},
        "roles": {name: line(seconds) for name, seconds in sorted(per_role.items())},
        "database_backends": {kind: line(seconds) for kind, seconds in sorted(by_app.items())},
        "machine": line(machine),
        # The processes that do the work per event: roles, broker and server; what one
        # core could carry if nothing but CPU limited the pipeline.
        "pipeline_us_per_event": round(pipeline * 1e6 / max(records, 1), 1),
        "events_per_core_second": round(max(records, 1) / pipeline, 1) if pipeline > 0 else 0.0,
    }


def _backend_kind(application_name: str) -> str:
    """`bench-controller-2` → controller, `bench-relay` → relay, anything else →
    bench (the benchmark's own polling connections)."""
    if application_name.startswith("bench-controller"):
        return "controller"
    if application_name.startswith("bench-relay"):
        return "relay"
    return "bench"
