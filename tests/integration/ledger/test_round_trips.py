"""What the ledger sends the server for a read and for a batch, read from libpq's own
trace of the protocol: a lone read is one statement with no transaction around it, and a
batch's transaction has one BEGIN and one COMMIT, with no warning back from the server
(a second BEGIN inside the pipeline made PostgreSQL log "there is already a transaction
in progress" for every batch)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import pq

from ledger import PostgresLedger
from tests.unit.ledger.ledger_support import GROUP, TOPIC, event, feed
from tests.unit.ledger.ledger_support import decide_batch as decide


@contextmanager
def _traced(ledger: PostgresLedger, path: Path) -> Iterator[list[str]]:
    """The protocol messages of the ledger's one pooled connection while the block runs
    (filled in when it ends)."""
    messages: list[str] = []
    with path.open("w") as out:
        with ledger._pool.connection() as conn:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield messages
        finally:
            with ledger._pool.connection() as conn:
                conn.pgconn.untrace()
    messages.extend(path.read_text().splitlines())


def _sent(messages: list[str], statement: str) -> int:
    """How many times the client sent `statement` (simple or extended protocol)."""
    return sum(1 for m in messages if m.startswith("F") and f'"{statement}"' in m)


def _notices(messages: list[str]) -> list[str]:
    return [m for m in messages if m.startswith("B") and "NoticeResponse" in m]


def test_a_read_is_one_statement_and_a_batch_one_transaction_without_warnings(
    database_url: str, tmp_path: Path
) -> None:
    ledger = PostgresLedger(database_url, min_size=1, max_size=1)
    try:
        ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=1)

        with _traced(ledger, tmp_path / "read.trace") as read:
            assert set(ledger.load_views(["op-1"])) == {"op-1"}
        assert read, "libpq traced nothing"
        assert (_sent(read, "BEGIN"), _sent(read, "COMMIT")) == (0, 0)

        batch = decide(ledger, [event("op-1", 1, "TOOL_TIMEOUT")], epoch=1, first_offset=1)
        with _traced(ledger, tmp_path / "commit.trace") as commit:
            assert ledger.commit(batch).decisions == 1
        assert (_sent(commit, "BEGIN"), _sent(commit, "COMMIT")) == (1, 1)
        assert _notices(commit) == []
        with psycopg.connect(database_url) as conn:
            stored = conn.execute("SELECT version FROM operations WHERE operation_id = 'op-1'")
            assert stored.fetchone() == (2,)
    finally:
        ledger.close()
