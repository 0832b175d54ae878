"""The capability workers' shared execution store in PostgreSQL: a record, by command
id, of what a worker group executed, so that a group spread over hosts runs each
command at most once across rebalances and crashes (the worker library's
`producers.PostgresExecutionStore` is its face; this module holds the SQL).

It lives in a schema of its own, `recovery_worker`, with one table, `executions`, and
one login role, `recovery_worker`, that may read, claim (INSERT) and record an answer
(UPDATE of the answer's columns), nothing else: no DELETE, no DDL, nothing in the
ledger's schema. `ensure_worker_store(admin, password)` makes the schema, the table
and the role idempotently over an administrative connection (`recoveryctl db
worker-store`; `sql/worker_store.sql` says what and why). It is not a ledger migration:
the store may live on the ledger's server (its failover pair included) or on another,
and the ledger's roles get nothing on it.

`WorkerExecutions` is one worker process's connection to it. Every statement commits on
its own (autocommit, the server's `synchronous_commit`), so a claim is durable (on the
synchronous standby too, on a failover pair) before the handler runs. A claim is
idempotent for the process that took it (`claimed_by`): retried after a connection was
lost mid-commit, it is recognised as this process's own instead of someone else's.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from types import MappingProxyType
from typing import Final

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from ledger.driver import driver_errors
from ledger.errors import LedgerUnavailable
from ledger.queries import parse_queries

__all__ = [
    "WORKER_ROLE",
    "WORKER_SCHEMA",
    "ExecutionRow",
    "WorkerExecutions",
    "ensure_worker_store",
]

WORKER_SCHEMA: Final = "recovery_worker"
WORKER_ROLE: Final = "recovery_worker"

_LOST: Final = (
    "lost the workers' execution store: check that its PostgreSQL is running and the URL "
    "is right (a failover pair: both nodes and target_session_attrs=read-write)"
)


def _load() -> MappingProxyType[str, str]:
    text = resources.files("ledger").joinpath("sql/worker_store.sql").read_text("utf-8")
    return MappingProxyType(parse_queries(text))


_SQL: Final = _load()


@dataclass(frozen=True, slots=True)
class ExecutionRow:
    """One command id's row: who claimed it and when, and its answer (JSON) once done."""

    command_id: str
    capability: str
    state: str
    claimed_by: str
    claimed_at: datetime
    answer: str | None


def ensure_worker_store(admin_conninfo: str, password: str | None = None) -> None:
    """Create or bring up to date the store's schema, table and role in the database
    `admin_conninfo` names (a superuser, or a role with CREATEROLE that may create in
    the database), setting the role's password when given. Raises `LedgerError` naming
    the step that failed."""
    with (
        driver_errors("connecting to set up the workers' execution store", lost=_LOST),
        psycopg.connect(admin_conninfo, autocommit=True, connect_timeout=10) as conn,
    ):
        database = str(conn.info.dbname)
        names: Mapping[str, sql.Composable] = {
            "role": sql.Identifier(WORKER_ROLE),
            "schema": sql.Identifier(WORKER_SCHEMA),
            "database": sql.Identifier(database),
        }
        with driver_errors(f"creating role {WORKER_ROLE}", lost=_LOST):
            row = conn.execute(_SQL["role_exists"], {"name": WORKER_ROLE}).fetchone()
            if row is None or not row[0]:
                _run(conn, "create_role", names)
            _run(conn, "restrict_role", names)
            if password is not None:
                _run(conn, "set_password", {**names, "password": sql.Literal(password)})
        with (
            driver_errors(f"creating schema {WORKER_SCHEMA} in {database}", lost=_LOST),
            conn.transaction(),
        ):
            for step in ("create_schema", "create_table", "grant_role"):
                _run(conn, step, names)


def _run(
    conn: psycopg.Connection[TupleRow], name: str, parts: Mapping[str, sql.Composable]
) -> None:
    conn.execute(sql.SQL(_SQL[name]).format(**parts))


class WorkerExecutions:
    """One worker process's connection to the shared store (module docstring), opened
    lazily and again after a loss. `owner` names the process in `claimed_by`.
    Thread-safe. Every method raises `LedgerUnavailable` when the server cannot be
    reached (nothing is known to be written; call again) and `LedgerError` when it
    refuses."""

    def __init__(self, conninfo: str, owner: str, *, connect_timeout: int = 10) -> None:
        self.owner = owner
        self._conninfo = conninfo
        self._timeout = connect_timeout
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[TupleRow] | None = None

    def lookup(self, command_id: str) -> ExecutionRow | None:
        """The row of `command_id`, or None when it was never claimed."""
        row = self._one(f"reading command {command_id}", "lookup", {"command_id": command_id})
        if row is None:
            return None
        capability, state, claimed_by, claimed_at, answer = row
        return ExecutionRow(command_id, capability, state, claimed_by, claimed_at, answer)

    def claim(self, command_id: str, capability: str, at: datetime) -> bool:
        """Claim `command_id` for this process, durably. True when it is this process's
        claim (taken now, or by an earlier call whose acknowledgement was lost); False
        when another process claimed it or it is done."""
        values = {"command_id": command_id, "capability": capability, "owner": self.owner}
        if self._one(f"claiming command {command_id}", "claim", {**values, "at": at}):
            return True
        found = self.lookup(command_id)
        return found is not None and found.state == "claimed" and found.claimed_by == self.owner

    def record(self, command_id: str, answer: str, at: datetime) -> bool:
        """Record the answer (JSON) of a claimed `command_id`. True when recorded (now, or
        by an earlier call whose acknowledgement was lost: the same answer is there);
        False when there is no claim to record on or another answer is recorded."""
        values = {"command_id": command_id, "answer": answer, "at": at}
        if self._one(f"recording command {command_id}'s answer", "record", values):
            return True
        found = self.lookup(command_id)
        return found is not None and found.state == "done" and found.answer == answer

    def counts(self) -> dict[str, int]:
        """How many command ids are claimed and done."""
        with self._lock:
            rows = self._execute("counting executions", "counts", {}).fetchall()
        found = {str(state): int(n) for state, n in rows}
        return {state: found.get(state, 0) for state in ("claimed", "done")}

    def close(self) -> None:
        """Close the connection (a later call opens another)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _one(self, what: str, query: str, values: Mapping[str, object]) -> TupleRow | None:
        with self._lock:
            return self._execute(what, query, values).fetchone()

    def _execute(
        self, what: str, query: str, values: Mapping[str, object]
    ) -> psycopg.Cursor[TupleRow]:
        try:
            with driver_errors(f"workers' execution store: {what}", lost=_LOST):
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(
                        self._conninfo, autocommit=True, connect_timeout=self._timeout
                    )
                return self._conn.execute(_SQL[query], values)
        except LedgerUnavailable:
            self._drop()
            raise

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
