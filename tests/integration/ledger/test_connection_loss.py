"""The database connection is lost under the ledger: the batch is retried on a fresh
connection and written exactly once; a server that stays away is reported, not hung on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from ledger import LedgerUnavailable, PostgresLedger
from ledger.postgres import _IdleCheck
from tests.unit.ledger.ledger_support import GROUP, TOPIC, decide_batch, sequence

pytestmark = pytest.mark.integration


@pytest.fixture
def ledger(database_url: str) -> Iterator[PostgresLedger]:
    ledger = PostgresLedger(database_url, max_size=2, backoff=0.05)
    yield ledger
    ledger.close()


def _terminate_others(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_pooled_connections_killed_between_batches_are_replaced(
    ledger: PostgresLedger, database_url: str
) -> None:
    ledger.claim(GROUP, TOPIC, [0], "controller-a")
    assert _terminate_others(database_url) >= 1
    result = ledger.commit(decide_batch(ledger, sequence("op-1"), epoch=1))
    assert result.decisions == 3
    assert ledger.offsets(GROUP, TOPIC) == {0: 3}


def test_connection_lost_inside_the_batch_transaction_is_retried_once_written(
    ledger: PostgresLedger, database_url: str
) -> None:
    ledger.claim(GROUP, TOPIC, [0], "controller-a")
    batch = decide_batch(ledger, sequence("op-1"), epoch=1)
    errors: list[BaseException] = []
    with psycopg.connect(database_url) as blocker:
        # Hold the partition row so the batch transaction blocks inside its epoch check.
        blocker.execute("SELECT 1 FROM partition_owners FOR UPDATE")

        def commit() -> None:
            try:
                ledger.commit(batch)
            except BaseException as exc:  # reported to the test thread below
                errors.append(exc)

        thread = threading.Thread(target=commit)
        thread.start()
        victim = None
        for _ in range(200):
            row = blocker.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            ).fetchone()
            if row is not None:
                victim = row[0]
                break
            time.sleep(0.02)
        assert victim is not None, "the batch transaction never reached its epoch check"
        blocker.execute("SELECT pg_terminate_backend(%s)", (victim,))
        blocker.rollback()  # release the row; the retried batch goes through
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert errors == []
    assert len(ledger.decisions("op-1")) == 3
    assert ledger.offsets(GROUP, TOPIC) == {0: 3}
    assert ledger.verify_audit() == ()


def test_an_unreachable_database_is_reported_as_unavailable() -> None:
    with pytest.raises(LedgerUnavailable, match="cannot connect"):
        PostgresLedger("postgresql://postgres@127.0.0.1:1/nowhere", connect_timeout=1.0)


def test_a_pooled_connection_is_pinged_only_after_sitting_idle(database_url: str) -> None:
    check = _IdleCheck(after=0.3)
    with psycopg.connect(database_url) as conn, psycopg.connect(database_url) as admin:
        check.used(conn)
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        check(conn)  # used a moment ago: handed out without a round trip
        time.sleep(0.35)
        with pytest.raises(psycopg.OperationalError):
            check(conn)  # idle: pinged, and the lost backend is noticed
