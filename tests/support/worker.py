"""A capability worker's execution store for a test: a fresh SQLite file of its own."""

from __future__ import annotations

import tempfile
from pathlib import Path

from producers import ExecutionStore

__all__ = ["fresh_store"]


def fresh_store() -> ExecutionStore:
    """An empty execution store in a new temporary folder (one per worker under test)."""
    return ExecutionStore(Path(tempfile.mkdtemp(prefix="worker-store-")) / "executions.sqlite")
