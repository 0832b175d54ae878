"""A batch's append-only rows are written with one INSERT per table over column arrays
(`ledger.postgres_commit`), in the pipeline of the operations' writes: each row must be
stored exactly as sent, and a row refused in the round trip that commits must leave
nothing behind."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from ledger import PostgresLedger, postgres_commit
from ledger.errors import EventIdReused
from tests.integration.ledger.test_parity import _drive
from tests.unit.ledger.ledger_support import GROUP, TOPIC, event, feed
from tests.unit.ledger.ledger_support import decide_batch as decide

pytestmark = pytest.mark.integration


def _written(url: str) -> None:
    ledger = PostgresLedger(url)
    try:
        _drive(ledger)
    finally:
        ledger.close()


# The columns `postgres_commit` sends for each table, in its order (`_TABLE_TYPES`).
_SENT_COLUMNS = {
    "events": "event_id, payload_digest, operation_id, event_type, envelope::text, "
    "source_topic, source_partition, source_offset",
    "decisions": "operation_id, sequence, event_id, outcome, state_before, state_after, "
    "decided_at, decision::text",
    "evidence": "operation_id, event_id, kind, source, trusted, reference, record::text",
    "approvals": "event_id, operation_id, approver, verdict, state, transition, "
    "machine_digest, expires_at, nonce, record::text",
    "audit_records": "operation_id, sequence, kind, prev_hash, hash, record::text",
    "outbox": "record_id, topic, key, headers::text, payload, audit_sequence, value",
}


def test_every_append_only_row_is_stored_as_sent(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: dict[str, Counter[tuple[object, ...]]] = {}
    insert = postgres_commit._insert_tables

    def recording(conn: psycopg.Connection[Any], tables: Sequence[Any]) -> None:
        for table, rows in tables:
            sent.setdefault(table, Counter()).update(rows)
        insert(conn, tables)

    monkeypatch.setattr(postgres_commit, "_insert_tables", recording)
    _written(database_url)
    with psycopg.connect(database_url) as conn:
        stored = {
            table: Counter(conn.execute(f"SELECT {columns} FROM {table}").fetchall())
            for table, columns in _SENT_COLUMNS.items()
        }
    for table in _SENT_COLUMNS:
        assert sent.get(table), f"the scenario writes no {table} row"
        # The cascade events go in by their own statement: stored holds them too.
        assert sent[table] <= stored[table], table
        if table != "outbox":
            assert sent[table] == stored[table], table


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
        _commits_again(ledger, offset=1)
    finally:
        ledger.close()


def test_a_row_refused_while_the_outbox_is_signed_leaves_nothing_and_a_usable_ledger(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The batch's writes leave for the server before its outbox rows are signed. Another
    # writer has committed one of its event ids after the batch's checks: the refusal
    # comes back while the rows are signed, before COMMIT is queued, and must surface as
    # the reuse it is, with nothing written and the pooled connection usable.
    ledger = PostgresLedger(database_url, min_size=1, max_size=1)
    try:
        ledger.claim(GROUP, TOPIC, [0], "controller-a")
        feed(ledger, [event("op-1", 0, "TOOL_TIMEOUT"), event("op-2", 0, "TOOL_TIMEOUT")], epoch=1)
        batch = decide(ledger, [event("op-1", 1, "TOOL_TIMEOUT")], epoch=1, first_offset=2)
        sign = postgres_commit.finish_outbox

        def signing_late(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.3)  # the server has refused the event by now
            return sign(*args, **kwargs)

        def stored_meanwhile(*args: Any, **kwargs: Any) -> Any:
            with psycopg.connect(database_url, autocommit=True) as other:
                other.execute(
                    "INSERT INTO events (event_id, payload_digest, operation_id, event_type, "
                    "envelope) VALUES ('op-1-e1', 'sha256:other', 'op-2', 'TOOL_TIMEOUT', '{}')"
                )  # for another operation: op-1's row is locked by the batch
            return checks(*args, **kwargs)

        checks = postgres_commit._check_ids
        monkeypatch.setattr(postgres_commit, "finish_outbox", signing_late)
        monkeypatch.setattr(postgres_commit, "_check_ids", stored_meanwhile)
        with pytest.raises(EventIdReused):
            ledger.commit(batch)
        monkeypatch.undo()
        assert len(ledger.decisions("op-1")) == 1
        _commits_again(ledger, offset=2)
    finally:
        ledger.close()


def _commits_again(ledger: PostgresLedger, *, offset: int) -> None:
    """After a refused batch of op-1's event 1 at `offset`: nothing of it was stored (the
    offset has not moved), and the pooled connection commits the next batch, the same
    event under another id."""
    assert ledger.offsets(GROUP, TOPIC) == {0: offset}
    again = decide(
        ledger,
        [event("op-1", 1, "TOOL_TIMEOUT", event_id="op-1-e1b")],
        epoch=1,
        first_offset=offset,
    )
    assert ledger.commit(again).events == 1
    assert ledger.offsets(GROUP, TOPIC) == {0: offset + 1}
