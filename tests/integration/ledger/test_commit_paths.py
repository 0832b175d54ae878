"""A batch's append-only rows are written with INSERTs in the write pipeline when the
batch is small and with COPY when it is large (`ledger.postgres_commit`): both paths
must store the same bytes, row for row, in the same order."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from ledger import PostgresLedger, postgres_commit
from ledger.errors import EventIdReused
from tests.integration.ledger.test_parity import _drive
from tests.support.db import clone_database, drop_database, with_database
from tests.unit.ledger.ledger_support import GROUP, TOPIC, event, feed
from tests.unit.ledger.ledger_support import decide_batch as decide

pytestmark = pytest.mark.integration

# Every column but the times the server stamps (now() differs between the two runs).
_TABLES = {
    "events": "event_id, payload_digest, operation_id, event_type, envelope::text, "
    "source_topic, source_partition, source_offset",
    "decisions": "operation_id, sequence, event_id, outcome, state_before, state_after, "
    "decided_at, decision::text",
    "evidence": "operation_id, event_id, kind, source, trusted, reference, record::text",
    "approvals": "event_id, operation_id, approver, verdict, state, transition, "
    "machine_digest, expires_at, nonce, record::text",
    "audit_records": "operation_id, sequence, kind, prev_hash, hash, record::text",
    "outbox": "id, record_id, topic, key, headers::text, payload, audit_sequence",
    "operations": "operation_id, version, state, view::text, audit_sequence, audit_head",
}


def _rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(f"SELECT {columns} FROM {table} ORDER BY {columns}").fetchall()
            for table, columns in _TABLES.items()
        }


def _written(url: str) -> dict[str, list[tuple[object, ...]]]:
    ledger = PostgresLedger(url)
    try:
        _drive(ledger)
    finally:
        ledger.close()
    return _rows(url)


def test_small_batches_inserted_store_the_bytes_copy_stores(
    postgres_server: str, database_template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [clone_database(postgres_server, database_template, f"paths_{i}") for i in (0, 1)]
    try:
        inserted = _written(with_database(postgres_server, names[0]))
        monkeypatch.setattr(postgres_commit, "SMALL_TABLE_ROWS", 0)  # every table by COPY
        copied = _written(with_database(postgres_server, names[1]))
    finally:
        for name in names:
            drop_database(postgres_server, name)
    for table in ("events", "decisions", "evidence", "approvals", "audit_records", "outbox"):
        assert inserted[table], f"the scenario writes no {table} row"
    assert inserted == copied


def test_a_refused_row_in_the_round_trip_that_commits_leaves_nothing_and_a_usable_ledger(
    database_url: str,
) -> None:
    # A small batch that opens nothing sends COMMIT with its writes. Another writer
    # stores one of its event ids between the batch's check and its insert: the insert
    # waits for that writer, then is refused, the COMMIT never applies, and the pooled
    # connection must be rolled back and usable for the next batch.
    ledger = PostgresLedger(database_url, min_size=1, max_size=1)
    try:
        ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, [event("op-1", 0, "TOOL_TIMEOUT")], epoch=1)
        batch = decide(ledger, [event("op-1", 1, "TOOL_TIMEOUT")], epoch=1, first_offset=1)
        refused: list[BaseException] = []

        def commit() -> None:
            try:
                ledger.commit(batch)
            except EventIdReused as exc:
                refused.append(exc)

        with psycopg.connect(database_url) as other:
            other.execute(
                "INSERT INTO events (event_id, payload_digest, operation_id, event_type, "
                "envelope) VALUES ('op-1-e1', 'sha256:other', 'op-1', 'TOOL_TIMEOUT', '{}')"
            )
            writer = threading.Thread(target=commit)
            writer.start()
            time.sleep(0.5)  # the batch's insert is waiting on the uncommitted row
            other.commit()
            writer.join(timeout=10)
        assert len(refused) == 1
        assert ledger.offsets(GROUP, TOPIC) == {0: 1}
        again = decide(
            ledger,
            [event("op-1", 1, "TOOL_TIMEOUT", event_id="op-1-e1b")],
            epoch=1,
            first_offset=1,
        )
        assert ledger.commit(again).events == 1
        assert ledger.offsets(GROUP, TOPIC) == {0: 2}
    finally:
        ledger.close()
