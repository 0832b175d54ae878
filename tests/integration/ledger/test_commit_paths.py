"""A batch's append-only rows are written with INSERTs in the write pipeline when the
batch is small and with COPY when it is large (`ledger.postgres_commit`): both paths
must store the same bytes, row for row, in the same order."""

from __future__ import annotations

import psycopg
import pytest

from ledger import PostgresLedger, postgres_commit
from tests.integration.ledger.test_parity import _drive
from tests.support.db import clone_database, drop_database, with_database

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
