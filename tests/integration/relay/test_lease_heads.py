"""The statement that picks a lease's heads (`lease_outbox_heads`, run with the lease's
planner settings) selects each key's oldest unpublished row in id order, with published
rows, held heads, rows of a key after its head and keys another relay has leased left
out, the limit counting only keys the lease can take; and leases, full or not, take
every row once and in order."""

from __future__ import annotations

import psycopg
import pytest

from ledger import PostgresLedger
from ledger.queries import QUERIES
from schemas import TopicNames
from tests.integration.relay.outbox import Row, command_row, insert_rows

pytestmark = pytest.mark.integration


def _heads(conn: psycopg.Connection[tuple[object, ...]], limit: int) -> list[str]:
    """The keys a lease of `limit` takes, in lease order, in a transaction rolled back
    after (the settings and statement `PostgresLedger.lease_outbox` runs)."""
    with conn.transaction(force_rollback=True):
        conn.execute(QUERIES["lease_settings"])
        rows = conn.execute(QUERIES["lease_outbox_heads"], {"limit": limit}, prepare=False)
        return [str(r[0]) for r in rows.fetchall()]


def _layout(topics: TopicNames) -> list[Row]:
    """Keys inserted out of key order, so that the walk's key order and the lease's id
    order differ; each key has three rows."""
    keys = [f"op-{n:02d}" for n in (7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 4, 6)]
    return [command_row(topics, key, sequence) for sequence in (1, 2, 3) for key in keys]


def test_heads_are_the_oldest_rows_of_unheld_unleased_keys_in_id_order(
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
    third = psycopg.connect(database_url)
    reader = psycopg.connect(database_url)
    try:
        expected_all = ["op-00", "op-05", "op-09", "op-01", "op-10", "op-02", "op-08"]
        expected_all += ["op-04", "op-06", "op-07"]
        assert _heads(reader, 100) == expected_all
        assert _heads(reader, 3) == expected_all[:3]
        # Another relay leases the two oldest heads: the statement skips those keys.
        with other.transaction():
            assert _heads(other, 100) == expected_all
            other.execute(QUERIES["lease_outbox_heads"], {"limit": 2}, prepare=False)
            assert _heads(reader, 100) == expected_all[2:]
            # The limit counts the keys this lease can take: a second relay leases the
            # next three keys while the first publishes.
            assert _heads(reader, 3) == expected_all[2:5]
            # A third relay takes the next two. Heads are looked for among the oldest
            # four leases' worth (4 * limit): with a limit of 1, the four oldest, all
            # locked now.
            with third.transaction():
                assert _heads(third, 2) == expected_all[2:4]
                third.execute(QUERIES["lease_outbox_heads"], {"limit": 2}, prepare=False)
                assert _heads(reader, 1) == []
                assert _heads(reader, 2) == expected_all[4:6]
    finally:
        for conn in (other, third, reader):
            conn.close()


def test_leases_full_and_partial_take_every_row_once_in_order(
    ledger: PostgresLedger, database_url: str, relay_topics: TopicNames
) -> None:
    rows = _layout(relay_topics)
    insert_rows(database_url, rows[:24])
    leased: list[str] = []
    # A full lease (5 of 12 keys), one that finds fewer keys than it may take, then more
    # rows and further leases.
    for limit, more in ((5, []), (100, rows[24:30]), (100, rows[30:]), (100, []), (100, [])):
        with ledger.lease_outbox(limit) as lease:
            leased.extend(r.record_id for r in lease.records)
            lease.mark_published([r.record_id for r in lease.records])
        insert_rows(database_url, more)
    assert sorted(leased) == sorted(r.record_id for r in rows)
    for key in {r.key for r in rows}:
        of_key = [rid for rid in leased if f"-{key}-" in rid]
        assert of_key == [f"cmd-{key}-{n}" for n in (1, 2, 3)], key
