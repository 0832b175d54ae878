"""Unpublishable rows are held, not re-leased forever: with more poison heads than one
lease takes (`lease_keys`), every other key is still published, in order, while the
poison keys stay blocked with their reason until an operator releases them
(docs/faults.md, the relay starvation item)."""

from __future__ import annotations

import json

import psycopg
import pytest

from ledger import PostgresLedger
from producers.relay import OutboxRelay, RelaySettings
from schemas import TopicNames
from tests.integration.relay.outbox import (
    Row,
    command_row,
    insert_rows,
    published_ids,
    read_all,
)

pytestmark = pytest.mark.integration

_LEASE_KEYS = 200  # the default: the starvation was seen with it
_POISON_KEYS = _LEASE_KEYS + 10
_GOOD_KEYS = 20


def _poison(topics: TopicNames, key: str, sequence: int) -> Row:
    """A command row missing everything but its id: the encoder refuses it."""
    record_id = f"cmd-bad-{key}-{sequence}"
    return Row(record_id, topics.commands, key, {}, {"command_id": record_id})


def _drain(relay: OutboxRelay, passes: int = 50) -> int:
    """Relay until a pass leases nothing; fails when that never happens (starvation)."""
    published = 0
    for _ in range(passes):
        result = relay.relay_once()
        published += result.published
        if result.leased == 0:
            return published
    raise AssertionError(f"the relay still leased rows after {passes} passes")


def _layout(topics: TopicNames) -> tuple[list[Row], list[Row], list[Row], list[Row]]:
    """(all rows in insertion order, poison heads, rows behind them, rows that must go
    out). The poison heads come first, so before the fix every lease took only them."""
    poison = [_poison(topics, f"bad-{k}", 1) for k in range(_POISON_KEYS)]
    behind = [command_row(topics, f"bad-{k}", 2) for k in range(_POISON_KEYS)]
    good = [command_row(topics, f"good-{k}", s) for s in (1, 2) for k in range(_GOOD_KEYS)]
    # One key that publishes its first row, then stops at a poison row.
    mixed_first = command_row(topics, "mixed", 1)
    mixed_poison = _poison(topics, "mixed", 2)
    mixed_after = command_row(topics, "mixed", 3)
    rows = [*poison, mixed_first, mixed_poison, *behind, *good, mixed_after]
    return rows, [*poison, mixed_poison], [*behind, mixed_after], [*good, mixed_first]


def test_more_poison_heads_than_a_lease_takes_no_longer_starve_the_other_keys(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    rows, poison, behind, good = _layout(relay_topics)
    insert_rows(database_url, rows)
    relay = OutboxRelay(
        ledger, kafka_bootstrap, topics=relay_topics, settings=RelaySettings(lease_keys=_LEASE_KEYS)
    )

    assert _drain(relay) == len(good)

    published, unpublished = published_ids(database_url)
    assert published == {r.record_id for r in good}
    assert unpublished == {r.record_id for r in poison} | {r.record_id for r in behind}
    seen = read_all(kafka_bootstrap, [relay_topics.commands], len(good))
    assert sorted(s.record_id or "" for s in seen) == sorted(r.record_id for r in good)
    for key in {r.key for r in good}:
        ids = [s.record_id for s in sorted(seen, key=lambda s: s.offset) if s.key == key]
        assert ids == [r.record_id for r in rows if r.key == key and r in good]

    held = ledger.held_outbox()
    assert [h.record_id for h in held] == [r.record_id for r in rows if r in poison]
    assert all(h.waiting == 1 for h in held)
    assert all(h.record_id in h.reason for h in held), held[0].reason


def test_a_released_row_whose_cause_was_fixed_goes_out_before_the_rows_behind_it(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    poison = _poison(relay_topics, "op-1", 1)
    behind = command_row(relay_topics, "op-1", 2)
    insert_rows(database_url, [poison, behind])
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)
    assert _drain(relay) == 0
    assert [h.record_id for h in ledger.held_outbox()] == [poison.record_id]

    # The operator repairs the row (here: rewrites its payload), then releases it.
    fixed = command_row(relay_topics, "op-1", 1)
    payload = {**fixed.payload, "command_id": poison.record_id}
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE outbox SET payload = %s WHERE record_id = %s",
            (json.dumps(payload).encode(), poison.record_id),
        )
    assert ledger.release_outbox(poison.record_id) == "op-1"
    assert _drain(relay) == 2

    assert ledger.held_outbox() == ()
    seen = read_all(kafka_bootstrap, [relay_topics.commands], 2)
    assert [s.record_id for s in sorted(seen, key=lambda s: s.offset)] == [
        poison.record_id,
        behind.record_id,
    ]
