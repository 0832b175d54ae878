"""The outbox relay through a real broker and a real PostgreSQL: rows committed to the
outbox come out on their topics in per-key order, with record-id headers, and are
marked published; two relays never reorder a key; a crashed relay's successor
republishes only what was not marked."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ledger import PostgresLedger
from producers.relay import OutboxRelay, RelaySettings, RelayStats
from schemas import (
    CAPABILITY_COMMAND,
    CONTENT_TYPE,
    CONTENT_TYPE_JSON,
    HEADER_COMMAND_ID,
    TRACEPARENT,
    AvroSingleObjectCodec,
    CapabilityCommand,
    TopicNames,
)
from tests.integration.relay.outbox import (
    Row,
    Seen,
    audit_row,
    command_row,
    insert_rows,
    published_ids,
    read_all,
)

pytestmark = pytest.mark.integration

_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _rows(topics: TopicNames, keys: int, per_key: int) -> list[Row]:
    """Rows interleaved across keys, commands and audit alternating within a key."""
    rows: list[Row] = []
    for seq in range(1, per_key + 1):
        for k in range(keys):
            make = command_row if seq % 2 else audit_row
            rows.append(make(topics, f"op-{k}", seq))
    return rows


def _per_key(seen: list[Seen]) -> dict[str, list[str | None]]:
    """Record ids per key in the order they were written (within one partition a key's
    records are totally ordered by offset; a key's topics are merged by sequence)."""
    out: dict[str, list[tuple[int, str | None]]] = defaultdict(list)
    for s in sorted(seen, key=lambda s: (s.topic, s.partition, s.offset)):
        out[s.key].append((s.offset, s.record_id))
    return {k: [rid for _, rid in v] for k, v in out.items()}


def _expected_per_key(rows: list[Row], topic: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r.topic == topic:
            out[r.key].append(r.record_id)
    return dict(out)


def _drain(relay: OutboxRelay) -> int:
    published = 0
    for _ in range(100):
        result = relay.relay_once()
        published += result.published
        if result.leased == 0:
            return published
    raise AssertionError("the relay never emptied the outbox")


def test_committed_rows_come_out_in_key_order_with_record_ids_and_are_marked_published(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    rows = _rows(relay_topics, keys=5, per_key=8)
    first = rows[0]
    rows[0] = Row(
        first.record_id,
        first.topic,
        first.key,
        {**first.headers, TRACEPARENT: _TRACEPARENT},
        first.payload,
    )
    insert_rows(database_url, rows)
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)

    assert _drain(relay) == len(rows)

    published, unpublished = published_ids(database_url)
    assert unpublished == set()
    assert published == {r.record_id for r in rows}
    commands = read_all(kafka_bootstrap, [relay_topics.commands], 20)
    audit = read_all(kafka_bootstrap, [relay_topics.audit], 20)
    assert _per_key(commands) == _expected_per_key(rows, relay_topics.commands)
    assert _per_key(audit) == _expected_per_key(rows, relay_topics.audit)

    codec = AvroSingleObjectCodec()
    for seen in commands:
        name, record = codec.decode(seen.value)
        command = CapabilityCommand.from_record(record)
        assert name == CAPABILITY_COMMAND
        assert seen.headers[HEADER_COMMAND_ID] == command.command_id == seen.record_id
        assert command.lineage.initiating_principal == "alice"
    traced = [s for s in commands if s.record_id == rows[0].record_id]
    assert traced[0].headers[TRACEPARENT].split("-")[1] == _TRACEPARENT.split("-")[1]
    for seen in audit:
        assert seen.headers[CONTENT_TYPE] == CONTENT_TYPE_JSON
        event = json.loads(seen.value)
        assert event["class_uid"] == 6003
        assert event["unmapped"]["recovery"]["chain"]["hash"] == event["metadata"]["uid"]


def test_a_second_pass_publishes_nothing_already_marked(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    insert_rows(database_url, _rows(relay_topics, keys=2, per_key=3))
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)
    assert _drain(relay) == 6

    again = relay.relay_once()

    assert (again.leased, again.published) == (0, 0)
    seen = read_all(kafka_bootstrap, [relay_topics.commands, relay_topics.audit], 6)
    assert len(seen) == 6


def test_two_relays_on_one_outbox_never_reorder_a_key_and_publish_every_row(
    kafka_bootstrap: str, database_url: str, relay_topics: TopicNames
) -> None:
    keys, per_key = 40, 12
    rows = _rows(relay_topics, keys=keys, per_key=per_key)
    stop = threading.Event()
    ledgers = [PostgresLedger(database_url, max_size=3) for _ in range(2)]
    relays = [
        OutboxRelay(
            led,
            kafka_bootstrap,
            database_url=database_url,
            topics=relay_topics,
            settings=RelaySettings(lease_keys=7, idle_poll=0.2),
            instance=f"relay-{i}",
        )
        for i, led in enumerate(ledgers)
    ]
    stats: list[object] = []
    threads = [threading.Thread(target=lambda r=r: stats.append(r.run(stop))) for r in relays]
    for t in threads:
        t.start()
    try:
        # Commit in many small transactions while both relays run.
        for start in range(0, len(rows), 16):
            insert_rows(database_url, rows[start : start + 16])
            time.sleep(0.01)
        deadline = time.monotonic() + 60
        while published_ids(database_url)[1] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for led in ledgers:
            led.close()

    published, unpublished = published_ids(database_url)
    assert unpublished == set()
    assert len(published) == len(rows)
    seen = read_all(kafka_bootstrap, [relay_topics.commands, relay_topics.audit], len(rows))
    assert len(seen) == len(rows)  # no failures, so no duplicates either
    for topic in (relay_topics.commands, relay_topics.audit):
        assert _per_key([s for s in seen if s.topic == topic]) == _expected_per_key(rows, topic)
    assert len(stats) == 2
    assert all(getattr(s, "published", 0) > 0 for s in stats), "both relays took part"


class _CrashAfterDelivery(OutboxRelay):
    """A relay that dies after the broker acknowledged its records but before the lease
    committed the marks: the worst moment for a crash."""

    def _await_delivery(self) -> tuple[set[str], dict[str, str]]:
        failed, refused = super()._await_delivery()
        assert (failed, refused) == (set(), {})
        raise RuntimeError("simulated crash after delivery, before marking")


def test_a_restarted_relay_republishes_exactly_what_was_not_marked(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    rows = _rows(relay_topics, keys=4, per_key=4)
    insert_rows(database_url, rows[:8])
    first = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)
    assert _drain(first) == 8
    insert_rows(database_url, rows[8:])
    crashing = _CrashAfterDelivery(ledger, kafka_bootstrap, topics=relay_topics)
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashing.relay_once()
    assert published_ids(database_url)[1] == {r.record_id for r in rows[8:]}

    successor = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)
    assert _drain(successor) == 8

    assert published_ids(database_url)[1] == set()
    seen = read_all(kafka_bootstrap, [relay_topics.commands, relay_topics.audit], 24)
    counts: dict[str | None, int] = defaultdict(int)
    for s in seen:
        counts[s.record_id] += 1
    assert {rid: n for rid, n in counts.items() if n != 1} == {r.record_id: 2 for r in rows[8:]}
    assert set(counts) == {r.record_id for r in rows}
    # Per key, the records deduplicated by id keep the insertion order.
    for topic in (relay_topics.commands, relay_topics.audit):
        dedup: dict[str, list[str | None]] = {}
        for key, ids in _per_key([s for s in seen if s.topic == topic]).items():
            dedup[key] = list(dict.fromkeys(ids))
        assert dedup == _expected_per_key(rows, topic)


def test_a_row_that_cannot_be_encoded_holds_back_its_key_only(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    good = _rows(relay_topics, keys=2, per_key=2)
    bad = Row("cmd-bad", relay_topics.commands, "op-0", {}, {"command_id": "cmd-bad"})
    after = command_row(relay_topics, "op-0", 9)
    insert_rows(database_url, [*good, bad, after])
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)

    result = relay.relay_once()

    assert result.unpublishable == 1
    published, unpublished = published_ids(database_url)
    assert unpublished == {"cmd-bad", after.record_id}
    assert published == {r.record_id for r in good}


def test_rows_naming_the_default_stream_names_go_to_the_configured_topics(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    # The ledger writes the default names as logical stream names.
    defaults = TopicNames()
    rows = [command_row(defaults, "op-x", 1), audit_row(defaults, "op-x", 2)]
    insert_rows(database_url, rows)
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)

    assert _drain(relay) == 2

    seen = read_all(kafka_bootstrap, [relay_topics.commands, relay_topics.audit], 2)
    assert {(s.topic, s.record_id) for s in seen} == {
        (relay_topics.commands, rows[0].record_id),
        (relay_topics.audit, rows[1].record_id),
    }


def test_an_audit_record_without_its_own_time_is_published_with_the_publish_time(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    opened = audit_row(relay_topics, "op-o", 1)
    body = {"operation_id": "op-o", "initial_state": "failure-reported"}
    row = Row(
        opened.record_id,
        opened.topic,
        opened.key,
        opened.headers,
        {**opened.payload, "kind": "operation-opened", "record": body},
    )
    insert_rows(database_url, [row])
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)

    assert _drain(relay) == 1

    (seen,) = read_all(kafka_bootstrap, [relay_topics.audit], 1)
    event = json.loads(seen.value)
    assert event["unmapped"]["recovery"]["time_source"] == "relay-publish-time"
    assert event["metadata"]["uid"] == row.payload["hash"]
    assert abs(event["time"] / 1000 - time.time()) < 60


def test_the_publish_span_continues_the_rows_trace_and_the_record_names_it(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    row = command_row(relay_topics, "op-t", 1)
    traced = Row(
        row.record_id, row.topic, row.key, {**row.headers, TRACEPARENT: _TRACEPARENT}, row.payload
    )
    insert_rows(database_url, [traced])
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics, tracer_provider=provider)

    assert _drain(relay) == 1

    (publish,) = [s for s in exporter.get_finished_spans() if s.name.startswith("send ")]
    assert publish.name == f"send {relay_topics.commands}"
    assert publish.attributes is not None
    assert publish.attributes["messaging.operation.type"] == "send"
    assert publish.attributes["messaging.destination.name"] == relay_topics.commands
    assert publish.attributes["messaging.kafka.message.key"] == "op-t"
    assert publish.parent is not None
    assert format(publish.context.trace_id, "032x") == _TRACEPARENT.split("-")[1]
    assert format(publish.parent.span_id, "016x") == _TRACEPARENT.split("-")[2]
    (seen,) = read_all(kafka_bootstrap, [relay_topics.commands], 1)
    assert seen.headers[TRACEPARENT].split("-")[2] == format(publish.context.span_id, "016x")


def test_nothing_is_marked_when_the_broker_does_not_acknowledge(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, relay_topics: TopicNames
) -> None:
    rows = _rows(relay_topics, keys=2, per_key=2)
    insert_rows(database_url, rows)
    # Nothing listens on port 9 (discard) of loopback: every delivery times out.
    unreachable = OutboxRelay(
        ledger,
        "127.0.0.1:9",
        topics=relay_topics,
        settings=RelaySettings(delivery_timeout=2.0),
    )

    result = unreachable.relay_once()

    assert (result.leased, result.published, result.failed) == (4, 0, 4)
    assert published_ids(database_url)[1] == {r.record_id for r in rows}
    assert _drain(OutboxRelay(ledger, kafka_bootstrap, topics=relay_topics)) == 4


def test_the_relay_rides_out_lost_database_connections(
    kafka_bootstrap: str, database_url: str, relay_topics: TopicNames
) -> None:
    rows = _rows(relay_topics, keys=10, per_key=6)
    led = PostgresLedger(database_url, max_size=2, retries=0)
    relay = OutboxRelay(
        led,
        kafka_bootstrap,
        database_url=database_url,
        topics=relay_topics,
        settings=RelaySettings(lease_keys=3, idle_poll=0.2, backoff_initial=0.05),
    )
    stop = threading.Event()
    stats: list[RelayStats] = []
    thread = threading.Thread(target=lambda: stats.append(relay.run(stop)))
    thread.start()
    try:
        for start in range(0, len(rows), 10):
            insert_rows(database_url, rows[start : start + 10])
            _terminate_other_sessions(database_url)
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        while published_ids(database_url)[1] and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(30)
        led.close()

    assert published_ids(database_url)[1] == set()
    seen = read_all(kafka_bootstrap, [relay_topics.commands, relay_topics.audit], len(rows))
    for topic in (relay_topics.commands, relay_topics.audit):
        dedup = {
            k: list(dict.fromkeys(v))
            for k, v in _per_key([s for s in seen if s.topic == topic]).items()
        }
        assert dedup == _expected_per_key(rows, topic)
    assert stats[0].outages >= 1


def _terminate_other_sessions(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
