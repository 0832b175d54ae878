"""A capability worker's execution store for a test: a fresh SQLite file of its own, or
a shared PostgreSQL store in a database of the test's own."""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path

from psycopg.conninfo import make_conninfo

from ledger import WORKER_ROLE, ensure_worker_store, with_user
from producers import ExecutionStore

__all__ = ["fresh_store", "shared_store_url"]


def fresh_store() -> ExecutionStore:
    """An empty execution store in a new temporary folder (one per worker under test)."""
    return ExecutionStore(Path(tempfile.mkdtemp(prefix="worker-store-")) / "executions.sqlite")


def shared_store_url(admin_url: str) -> str:
    """Make the workers' shared store in the database `admin_url` names (an empty one of
    the test's own) and return its conninfo as role `recovery_worker`, with a fresh
    password (set on the server's role, so one test at a time per server uses it)."""
    password = secrets.token_urlsafe(18)
    ensure_worker_store(admin_url, password)
    return make_conninfo(with_user(admin_url, WORKER_ROLE), password=password)
