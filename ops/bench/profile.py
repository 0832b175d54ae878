"""`recoveryctl bench --profile`: where the saturation phase's time goes.

- **py-spy** samples the controller and the relay for the whole saturation drain (from
  the end of each one's start-up, before its first poll, to the end of the phase; 100
  samples a second, 1,000 in a `--quick` run) and writes a speedscope
  file per process (open it at https://www.speedscope.app); the table shows the
  functions with the most samples, on their own (self) and with what they call
  (inclusive). py-spy counts only samples of threads that are running, not waiting.
- **pg_stat_statements**, when the server preloads it (`shared_preload_libraries`; the
  local stack's server does, with tracking off): tracking is turned on for the bench's
  database only, and the statements of the saturation window are ranked by total
  execution time, with calls and time per event.
- With `--native`, py-spy also unwinds the native frames below the Python ones, and
  each process's samples are split by the kind of code they were in (`code_kinds`):
  Python code the interpreter runs, the interpreter's own runtime, and each native
  library (libsodium, orjson, fastavro, ...). This is where a compiled rewrite of a
  process's work could save and where it could not (docs/PERFORMANCE.md, eleventh round).
  To read native stacks py-spy pauses the process at each sample, so a run with
  `--native` is slower: its split is the figure, not its rates.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import psycopg
from psycopg import sql

from ops.bench.roles import BenchError

__all__ = ["PySpy", "StatementStats", "code_kinds", "py_spy_path", "top_functions"]

_TOP: Final = 12
# What `py-spy record` prints once it samples, and how long to wait for that.
_SAMPLING: Final = b"Sampling process"
_ATTACH_TIMEOUT: Final = 30.0
_QUERY_CHARS: Final = 90


def py_spy_path() -> Path:
    """The py-spy executable beside this Python, else on PATH; `BenchError` if none."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return beside
    found = shutil.which("py-spy")
    if found is None:
        raise BenchError(
            "--profile needs py-spy (a development dependency: `pip install -e .[dev]`)"
        )
    return Path(found)


@dataclass
class PySpy:
    """One `py-spy record` per process, speedscope output, `rate` samples a second,
    stopped with SIGINT (py-spy then writes its file); with `native`, native frames too
    and the split by kind of code."""

    out_dir: Path
    rate: int = 100
    native: bool = False
    _running: dict[str, tuple[subprocess.Popen[str], Path]] = field(default_factory=dict)
    _errors: dict[str, str] = field(default_factory=dict)

    def start(self, name: str, pid: int, timeout: float = _ATTACH_TIMEOUT) -> None:
        """Record process `pid` as `name`; return once py-spy samples it (it says so on
        its output), or after `timeout` seconds. A py-spy that ended before sampling is
        the profile's error (`stop`)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{name}.speedscope.json"
        proc = subprocess.Popen(
            [
                *(str(py_spy_path()), "record", "--pid", str(pid)),
                *("--format", "speedscope", "--output", str(path), "--rate", str(self.rate)),
                *(["--native"] if self.native else []),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        said = b""
        deadline = time.monotonic() + timeout
        while _SAMPLING not in said and time.monotonic() < deadline:
            if not select.select([proc.stdout], [], [], 0.1)[0]:
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:  # py-spy ended without sampling
                _, err = proc.communicate()
                self._errors[name] = _failure(err, proc.returncode)
                return
            said += chunk
        self._running[name] = (proc, path)

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every recording; per process the file and its top functions (or the
        error py-spy gave)."""
        out: dict[str, dict[str, Any]] = {name: {"error": e} for name, e in self._errors.items()}
        for proc, _path in self._running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for name, (proc, path) in self._running.items():
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if not path.is_file():
                out[name] = {"error": _failure(err, proc.returncode)}
                continue
            document = json.loads(path.read_text())
            out[name] = {"file": str(path), **top_functions(document)}
            if self.native:
                out[name]["kinds"] = code_kinds(document)
        self._running.clear()
        self._errors.clear()
        return out


def _failure(stderr: str | None, status: int | None) -> str:
    """What py-spy said when it failed, without its stack backtrace."""
    said = (stderr or "").split("Stack backtrace:")[0].strip()[-500:]
    return said or f"py-spy exited with status {status}"


def top_functions(document: Mapping[str, Any], top: int = _TOP) -> dict[str, Any]:
    """From a py-spy speedscope document (every thread's profile): the `top` functions
    by self samples (the sample's innermost frame) and by inclusive samples (anywhere in
    the stack, leaving out each thread's entry frames, the ones every sample of that
    thread has), a function being its name and file (its lines merged)."""
    frames = document["shared"]["frames"]
    names = [f"{f['name']} ({_short(str(f.get('file') or ''))})" for f in frames]
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for profile in document["profiles"]:
        stacks = [stack for stack in profile["samples"] if stack]
        threads[_thread(str(profile.get("name", "")))] += len(stacks)
        # Never the innermost frame of the shortest stack: a thread seen in one place.
        entry = len(min(stacks, key=len)) - 1 if stacks else 0
        for stack in stacks:
            for depth, (a, b) in enumerate(zip(stack, stacks[0], strict=False)):
                if a != b:
                    entry = min(entry, depth)
                    break
        for stack in stacks:
            total += 1
            own[names[stack[-1]]] += 1
            for function in {names[i] for i in stack[entry:]}:
                inclusive[function] += 1

    def rank(counts: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": f, "samples": n, "percent": round(100 * n / max(total, 1), 1)}
            for f, n in counts.most_common(top)
        ]

    return {
        "samples": total,
        "threads": dict(threads.most_common()),
        "self": rank(own),
        "inclusive": rank(inclusive),
    }


# A thread waiting is in one of these native functions, though py-spy counts it as
# running: for a lock (a pool's idle worker in `Condition.wait`) or the GIL, for a
# socket (psycopg waiting for the server), for librdkafka's queue (a flush).
_WAITS: Final = frozenset(
    {
        "PyThread_acquire_lock_timed",
        "take_gil",
        "poll",
        "ppoll",
        "epoll_wait",
        "select",
        "cnd_timedwait",
        "cnd_timedwait_ms",
        "cnd_timedwait_abs",
        "cnd_wait",
    }
)
# The kind of a frame the interpreter runs (a Python file's), which no wait is.
_PYTHON_CODE: Final = "Python code"
# The kind of code a native frame is in, by a part of its file's path (the library's
# file, or the source file where the library kept its debugging symbols), first match.
_NATIVE_KINDS: Final = (
    ("libpython", "the interpreter's runtime"),
    ("/include/python3", "the interpreter's runtime"),
    ("libsodium", "libsodium"),
    ("nacl/_sodium", "libsodium"),  # PyNaCl's build of it, where no symbols name the file
    ("orjson", "orjson"),
    ("fastavro", "fastavro"),
    ("pydantic_core", "pydantic-core"),
    ("psycopg", "psycopg and libpq"),
    ("libpq", "psycopg and libpq"),
    ("confluent_kafka", "librdkafka"),
    ("librdkafka", "librdkafka"),
    ("_cffi_backend", "cffi"),
    ("libssl", "OpenSSL and cryptography"),
    ("libcrypto", "OpenSSL and cryptography"),
    ("cryptography", "OpenSSL and cryptography"),
    ("libc.so", "libc (allocation, copying, system calls)"),
)


def code_kinds(document: Mapping[str, Any]) -> dict[str, Any]:
    """From a `py-spy record --native` speedscope document: each sample's innermost frame
    by kind of code, leaving out the samples of threads waiting (`_WAITS`).
    A Python frame innermost is time the interpreter spent running that Python code;
    a native frame is time in the library it belongs to (`_NATIVE_KINDS`; any other
    native file counts as "other native code")."""
    frames = document["shared"]["frames"]
    kinds = [_kind(str(f.get("file") or "")) for f in frames]
    waits = {
        i
        for i, (f, kind) in enumerate(zip(frames, kinds, strict=True))
        if f.get("name") in _WAITS and kind != _PYTHON_CODE
    }
    counts: Counter[str] = Counter()
    waiting = 0
    for profile in document["profiles"]:
        for stack in profile["samples"]:
            if not stack:
                continue
            if waits.intersection(stack):
                waiting += 1
                continue
            counts[kinds[stack[-1]]] += 1
    busy = sum(counts.values())
    return {
        "samples": busy,
        "waiting": waiting,
        "kinds": [
            {"kind": k, "samples": n, "percent": round(100 * n / max(busy, 1), 1)}
            for k, n in counts.most_common()
        ],
    }


def _kind(path: str) -> str:
    if path.endswith(".py") or path.startswith("<"):
        return _PYTHON_CODE
    for part, kind in _NATIVE_KINDS:
        if part in path:
            return kind
    return "other native code"


def _thread(name: str) -> str:
    """py-spy's `Thread 20704 "MainThread"` → `MainThread` (the quoted name, else all)."""
    return name.split('"')[1] if name.count('"') >= 2 else name


def _short(path: str) -> str:
    """A frame's file relative to the package it is in (`site-packages/x/y.py` → `x/y.py`,
    this repository's `consumer/controller.py` stays so)."""
    for marker in ("site-packages/", "/lib/python3", "/wt/", "/work/main/"):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker in ("/lib/python3", "/wt/") else tail
    return path


@dataclass
class StatementStats:
    """pg_stat_statements for one database (module docstring). `ready` is False, with
    the reason in `note`, when the server does not preload the extension or the bench's
    role may not enable it."""

    url: str
    database: str
    ready: bool = False
    note: str = ""
    _before: dict[int, tuple[int, float, int]] = field(default_factory=dict)

    def enable(self) -> None:
        """Install the extension in the bench's database and track its top-level
        statements (sessions opened from now on)."""
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                row = conn.execute("SHOW shared_preload_libraries").fetchone()
                if row is None or "pg_stat_statements" not in str(row[0]):
                    self.note = (
                        "pg_stat_statements not in the server's shared_preload_libraries "
                        "(the local stack's server preloads it): statements not profiled"
                    )
                    return
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET pg_stat_statements.track = 'top'").format(
                        sql.Identifier(self.database)
                    )
                )
        except psycopg.Error as exc:
            self.note = f"pg_stat_statements could not be enabled: {exc}".strip()
            return
        self.ready = True

    def _read(self) -> dict[int, tuple[int, float, int, str]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT s.queryid, s.calls, s.total_exec_time, s.rows, s.query"
                " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = %s AND s.queryid IS NOT NULL",
                (self.database,),
            ).fetchall()
        return {int(q): (int(c), float(t), int(r), str(text)) for q, c, t, r, text in rows}

    def mark(self) -> None:
        """Remember the counters at the start of the window."""
        if self.ready:
            self._before = {q: v[:3] for q, v in self._read().items()}

    def top(self, records: int, top: int = 10) -> list[dict[str, Any]]:
        """The window's statements by total execution time: calls and µs per event."""
        if not self.ready:
            return []
        rows: list[dict[str, Any]] = []
        for queryid, (calls, total, nrows, text) in self._read().items():
            calls0, total0, rows0 = self._before.get(queryid, (0, 0.0, 0))
            if calls - calls0 <= 0:
                continue
            rows.append(
                {
                    "query": " ".join(text.split())[:_QUERY_CHARS],
                    "calls": calls - calls0,
                    "calls_per_event": round((calls - calls0) / max(records, 1), 3),
                    "total_ms": round(total - total0, 1),
                    "us_per_event": round((total - total0) * 1000 / max(records, 1), 1),
                    "mean_ms": round((total - total0) / (calls - calls0), 3),
                    "rows_per_call": round((nrows - rows0) / (calls - calls0), 1),
                }
            )
        rows.sort(key=lambda r: -float(r["total_ms"]))
        return rows[:top]
