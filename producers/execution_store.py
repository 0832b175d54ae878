"""The capability worker's own record of what it executed, by command id.

A worker that crashes after its handler acted and before the result was acknowledged
gets the command again. Without a record it would act again; with this one it never
does: before the handler runs, the worker *claims* the command id in a durable store,
and after the handler returns it records the answer with the claim. On a redelivery:

- a command recorded as **done** is not executed: the recorded answer is reported
  again, which builds the same result event (event id `result:<command id>`, the same
  event time and evidence), so the controller counts it as a duplicate;
- a command still **claimed** was in flight when the worker died: whether its effect
  happened is unknown, so it is not executed either and is reported as an *unknown
  outcome* (the worker's `ActionResult.unknown`): SPEC §7, a possible side effect of
  unknown outcome is never retried directly; the machine goes to verification or a
  human.

Two stores keep these semantics (`ExecutionRecords`):

- `ExecutionStore`, SQLite (the standard library's `sqlite3`) in WAL mode with
  `synchronous=FULL`, so a claim is on disk (fsync) before the handler runs and a
  recorded answer before its result is published. It belongs to one worker process on
  one host: a command redelivered to another host's member after a rebalance is
  unknown to that member's store, and would run again.
- `PostgresExecutionStore`, shared by every member of a group on every host (its own
  schema and role, `ledger.WorkerExecutions`): a command moved to another member with
  its partition is found there, done or in flight, so the group runs each command at
  most once across rebalances and crashes. A lost connection is waited out with
  bounded backoff (`RECOVERY_WORKER_STORE_WAIT_S`), a claim or record retried after it
  is recognised as this process's own; a store that stays away stops the run
  uncommitted (docs/capability-worker.md, "A shared execution store").

`open_execution_store` picks the one the environment names: `RECOVERY_WORKER_STORE_URL`,
else the file at `RECOVERY_WORKER_STORE`.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from pydantic import TypeAdapter

from ledger import DatabaseWait, LedgerError, WorkerExecutions
from machines import EvidencePayload
from producers.errors import ProducersError
from producers.settings import WorkerSettings

__all__ = [
    "ENV_WORKER_STORE",
    "ENV_WORKER_STORE_URL",
    "Execution",
    "ExecutionRecords",
    "ExecutionState",
    "ExecutionStore",
    "PostgresExecutionStore",
    "StoredAnswer",
    "open_execution_store",
]

ENV_WORKER_STORE: Final = WorkerSettings.variable("store")
ENV_WORKER_STORE_URL: Final = WorkerSettings.variable("store_url")

_EVIDENCE: Final = TypeAdapter(EvidencePayload)

T = TypeVar("T")

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS executions (
    command_id  TEXT PRIMARY KEY,
    capability  TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('claimed', 'done')),
    claimed_at  TEXT NOT NULL,
    done_at     TEXT,
    answer      TEXT
)
"""


class ExecutionState(StrEnum):
    """Where a command id stands in the store."""

    CLAIMED = "claimed"  # the handler was (or may have been) running
    DONE = "done"  # the handler returned; its answer is recorded


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """A handler's answer as recorded: the fields of `ActionResult` (`reported` False
    when the handler answered None: nothing to report)."""

    reported: bool
    succeeded: bool = False
    evidence: EvidencePayload | None = None
    event_type: str | None = None
    evidence_ref: str | None = None
    completed_at: datetime | None = None
    retry_after_seconds: int | None = None

    def to_json(self) -> str:
        """The answer as the JSON text the store keeps."""
        return json.dumps(
            {
                "reported": self.reported,
                "succeeded": self.succeeded,
                "evidence": None
                if self.evidence is None
                else _EVIDENCE.dump_python(self.evidence, mode="json"),
                "event_type": self.event_type,
                "evidence_ref": self.evidence_ref,
                "completed_at": None
                if self.completed_at is None
                else self.completed_at.isoformat(),
                "retry_after_seconds": self.retry_after_seconds,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> StoredAnswer:
        """The answer from the store's JSON text."""
        data: Mapping[str, Any] = json.loads(text)
        evidence = data.get("evidence")
        completed = data.get("completed_at")
        return cls(
            reported=bool(data["reported"]),
            succeeded=bool(data["succeeded"]),
            evidence=None if evidence is None else _EVIDENCE.validate_python(evidence),
            event_type=data.get("event_type"),
            evidence_ref=data.get("evidence_ref"),
            completed_at=None if completed is None else datetime.fromisoformat(completed),
            # Absent from an answer stored before it was kept.
            retry_after_seconds=data.get("retry_after_seconds"),
        )


@dataclass(frozen=True, slots=True)
class Execution:
    """One command id's record."""

    command_id: str
    capability: str
    state: ExecutionState
    claimed_at: datetime
    answer: StoredAnswer | None = None


class ExecutionRecords(Protocol):
    """What a worker needs of its execution store (module docstring)."""

    def lookup(self, command_id: str) -> Execution | None:
        """The record of `command_id`, or None when it was never claimed."""
        ...

    def claim(self, command_id: str, capability: str, at: datetime | None = None) -> bool:
        """Claim `command_id` durably; True when this worker may execute it."""
        ...

    def record(self, command_id: str, answer: StoredAnswer, at: datetime | None = None) -> None:
        """Record the answer of a command this worker claimed, durably."""
        ...

    def counts(self) -> dict[str, int]:
        """How many command ids are claimed and done."""
        ...

    def close(self) -> None:
        """Release the store."""
        ...


def open_execution_store(environ: Mapping[str, str] | None = None) -> ExecutionRecords:
    """The store the environment names: the shared one at `RECOVERY_WORKER_STORE_URL`,
    else the SQLite file at `RECOVERY_WORKER_STORE`. Raises `ProducersError` naming both
    variables when neither is set (a worker without a store could execute twice)."""
    settings = WorkerSettings.load(environ)
    if settings.store_url is not None:
        return PostgresExecutionStore(settings.store_url, wait_s=settings.store_wait_s)
    return ExecutionStore.from_env(environ)


class ExecutionStore:
    """A durable record of executions by command id (SQLite, WAL, fsync on commit).
    Thread-safe; use one per worker process, and `close` it when done."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            # FULL: every commit is fsynced, so a claim survives a power cut before the
            # handler acts (WAL's default, NORMAL, may lose the last commits).
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(_SCHEMA)
        except sqlite3.Error as exc:
            raise ProducersError(f"worker execution store {self.path}: {exc}") from exc
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExecutionStore:
        """The store at `RECOVERY_WORKER_STORE`; raises `ProducersError` naming the
        variable when it is unset (a worker without a store could execute twice)."""
        path = WorkerSettings.load(environ).store
        if path is None:
            raise ProducersError(
                "the worker records every execution by command id before running it and "
                f"has no store: set {ENV_WORKER_STORE} to a file path the worker owns "
                f"(SQLite; it must survive restarts), or {ENV_WORKER_STORE_URL} to the "
                "group's shared store (PostgreSQL), or pass `store=`"
            )
        return cls(path)

    def lookup(self, command_id: str) -> Execution | None:
        """The record of `command_id`, or None when it was never claimed."""
        with self._lock:
            row = self._db.execute(
                "SELECT capability, state, claimed_at, answer FROM executions WHERE command_id = ?",
                (command_id,),
            ).fetchone()
        if row is None:
            return None
        capability, state, claimed_at, answer = row
        return Execution(
            command_id=command_id,
            capability=capability,
            state=ExecutionState(state),
            claimed_at=datetime.fromisoformat(claimed_at),
            answer=None if answer is None else StoredAnswer.from_json(answer),
        )

    def claim(self, command_id: str, capability: str, at: datetime | None = None) -> bool:
        """Claim `command_id` durably before executing it. True when this call claimed
        it; False when it was already claimed or done (then do not execute)."""
        when = (at or datetime.now(UTC)).isoformat()
        with self._lock:
            cursor = self._db.execute(
                "INSERT INTO executions (command_id, capability, state, claimed_at)"
                " VALUES (?, ?, 'claimed', ?) ON CONFLICT (command_id) DO NOTHING",
                (command_id, capability, when),
            )
        return cursor.rowcount == 1

    def record(self, command_id: str, answer: StoredAnswer, at: datetime | None = None) -> None:
        """Record the handler's answer for a claimed `command_id` (durably, before the
        result is published)."""
        when = (at or datetime.now(UTC)).isoformat()
        with self._lock:
            cursor = self._db.execute(
                "UPDATE executions SET state = 'done', done_at = ?, answer = ?"
                " WHERE command_id = ? AND state = 'claimed'",
                (when, answer.to_json(), command_id),
            )
        if cursor.rowcount != 1:
            raise ProducersError(f"command {command_id}: no claim to record an answer on")

    def counts(self) -> dict[str, int]:
        """How many command ids are claimed and done."""
        with self._lock:
            rows = self._db.execute(
                "SELECT state, count(*) FROM executions GROUP BY state"
            ).fetchall()
        found = {str(state): int(n) for state, n in rows}
        return {state.value: found.get(state.value, 0) for state in ExecutionState}

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def __enter__(self) -> ExecutionStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class PostgresExecutionStore:
    """The execution store a worker group shares across hosts (module docstring), at
    `url` as role `recovery_worker`. Thread-safe; one per worker process (its claims
    carry this process's name), `close` it when done."""

    def __init__(self, url: str, *, wait_s: float = 60.0, owner: str | None = None) -> None:
        owner = owner or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._rows = WorkerExecutions(url, owner)
        self._wait = DatabaseWait(f"worker {owner}", timeout=wait_s)

    @property
    def owner(self) -> str:
        """The name this process's claims carry (host, pid, a token)."""
        return self._rows.owner

    def problem(self) -> str | None:
        """None unless the worker waits for its store; then what for and since when."""
        return self._wait.problem()

    def lookup(self, command_id: str) -> Execution | None:
        """The record of `command_id`, or None when no member ever claimed it."""
        row = self._run(f"read command {command_id}", lambda: self._rows.lookup(command_id))
        if row is None:
            return None
        return Execution(
            command_id=command_id,
            capability=row.capability,
            state=ExecutionState(row.state),
            claimed_at=row.claimed_at,
            answer=None if row.answer is None else StoredAnswer.from_json(row.answer),
        )

    def claim(self, command_id: str, capability: str, at: datetime | None = None) -> bool:
        """Claim `command_id` for this process before executing it. True when it is this
        process's claim; False when another member claimed it or it is done."""
        when = at or datetime.now(UTC)
        return self._run(
            f"claim command {command_id}", lambda: self._rows.claim(command_id, capability, when)
        )

    def record(self, command_id: str, answer: StoredAnswer, at: datetime | None = None) -> None:
        """Record the handler's answer for `command_id` (durably, before the result is
        published). Raises `ProducersError` when there is no claim to record it on."""
        when = at or datetime.now(UTC)
        text = answer.to_json()
        done = self._run(
            f"record command {command_id}'s answer",
            lambda: self._rows.record(command_id, text, when),
        )
        if not done:
            raise ProducersError(f"command {command_id}: no claim to record an answer on")

    def counts(self) -> dict[str, int]:
        """How many command ids are claimed and done, over the whole group."""
        return self._run("count executions", self._rows.counts)

    def close(self) -> None:
        """Close the connection."""
        self._rows.close()

    def __enter__(self) -> PostgresExecutionStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _run(self, what: str, step: Callable[[], T]) -> T:
        try:
            return self._wait.run(what, step)
        except LedgerError as exc:
            raise ProducersError(f"worker execution store: {exc}") from exc
