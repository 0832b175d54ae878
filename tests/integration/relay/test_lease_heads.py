"""The two statements that pick a lease's heads select the same keys: the grouped scan
(`lease_outbox_heads`, for large backlogs) and the key-by-key walk
(`lease_outbox_heads_walk`, for the small passes of a relay that keeps up), with published
rows, held heads, rows of a key after its head and keys another relay has leased."""

from __future__ import annotations

import psycopg
import pytest

from ledger import PostgresLedger
from ledger.queries import QUERIES
from schemas import TopicNames
from tests.integration.relay.outbox import Row, command_row, insert_rows

pytestmark = pytest.mark.integration

_STATEMENTS = ("lease_outbox_heads", "lease_outbox_heads_walk")


def _heads(conn: psycopg.Connection[tuple[object, ...]], statement: str, limit: int) -> list[str]:
    """The keys `statement` leases, in lease order, in a transaction rolled back after."""
    with conn.transaction(force_rollback=True):
        rows = conn.execute(QUERIES[statement], {"limit": limit}, prepare=False).fetchall()
    return [str(r[0]) for r in rows]


def _layout(topics: TopicNames) -> list[Row]:
    """Keys inserted out of key order, so that the walk's key order and the lease's id
    order differ; each key has three rows."""
    keys = [f"op-{n:02d}" for n in (7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 4, 6)]
    return [command_row(topics, key, sequence) for sequence in (1, 2, 3) for key in keys]


def test_both_heads_statements_lease_the_same_keys_in_the_same_order(
    database_url: str, relay_topics: TopicNames
) -> None:
    insert_rows(database_url, _layout(relay_topics))
    with psycopg.connect(database_url) as admin:
        # op-07 published up to its second row; op-03 fully published; op-11's head held.
        admin.execute(
            "UPDATE outbox SET published_at = now() WHERE record_id = ANY(%s)",
            (["cmd-op-07-1", "cmd-op-07-2", "cmd-op-03-1", "cmd-op-03-2", "cmd-op-03-3"],),
        )
        admin.execute(
            "UPDATE outbox SET held_at = now(), held_reason = 'poison' WHERE record_id = %s",
            ("cmd-op-11-1",),
        )
        admin.commit()
    other = psycopg.connect(database_url)
    reader = psycopg.connect(database_url)
    try:
        expected_all = ["op-00", "op-05", "op-09", "op-01", "op-10", "op-02", "op-08"]
        expected_all += ["op-04", "op-06", "op-07"]
        for statement in _STATEMENTS:
            assert _heads(reader, statement, 100) == expected_all, statement
            assert _heads(reader, statement, 3) == expected_all[:3], statement
        # Another relay leases the two oldest heads: both statements skip those keys.
        with other.transaction():
            assert _heads(other, "lease_outbox_heads", 100) == expected_all
            other.execute(QUERIES["lease_outbox_heads"], {"limit": 2}, prepare=False)
            for statement in _STATEMENTS:
                assert _heads(reader, statement, 100) == expected_all[2:], statement
                # The limit picks the heads before the locked ones are skipped.
                assert _heads(reader, statement, 3) == expected_all[2:3], statement
    finally:
        other.close()
        reader.close()


def test_leases_take_every_row_once_in_order_across_both_heads_statements(
    ledger: PostgresLedger, database_url: str, relay_topics: TopicNames
) -> None:
    rows = _layout(relay_topics)
    insert_rows(database_url, rows[:24])
    leased: list[str] = []
    # A full lease (5 of 12 keys: the grouped scan stays), one that finds fewer keys than
    # it may take (the walk next), then more rows and leases by the walk.
    for limit, more in ((5, []), (100, rows[24:30]), (100, rows[30:]), (100, []), (100, [])):
        with ledger.lease_outbox(limit) as lease:
            leased.extend(r.record_id for r in lease.records)
            lease.mark_published([r.record_id for r in lease.records])
        insert_rows(database_url, more)
    assert sorted(leased) == sorted(r.record_id for r in rows)
    for key in {r.key for r in rows}:
        of_key = [rid for rid in leased if f"-{key}-" in rid]
        assert of_key == [f"cmd-{key}-{n}" for n in (1, 2, 3)], key
