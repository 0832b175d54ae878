"""Dead letters keep the refused record's bytes: for every refusal path (the intake's,
and the event-id conflict the ledger records), the record the relay publishes on the
dead-letter topic decodes to exactly the key, value and headers that were consumed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger
from producers.relay import OutboxRelay
from schemas import (
    CONTENT_TYPE_AVRO,
    CONTENT_TYPE_JSON,
    AvroSingleObjectCodec,
    TopicNames,
    kafka_config,
)
from tests.integration.consumer.harness import (
    Tool,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory

Original = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _read(bootstrap: str, topic: str, expected: int) -> list[Any]:
    """The first `expected` records of partition 0.. of `topic`, from the beginning."""
    consumer = Consumer(
        {**kafka_config(bootstrap), "group.id": "dlq-bytes", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        seen: list[Any] = []
        deadline = time.monotonic() + 30
        while len(seen) < expected and time.monotonic() < deadline:
            seen.extend(m for m in consumer.consume(100, 0.2) if m.error() is None)
        assert len(seen) >= expected, f"{topic}: {len(seen)} of {expected} records"
        return seen
    finally:
        consumer.close()


def _original(message: Any) -> Original:
    return message.key(), message.value(), list(message.headers() or [])


def test_every_dead_letter_holds_the_original_key_value_and_headers(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=1)
    names = TopicNames(
        events=topic,
        commands=topic_factory(1),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    tool = Tool(kafka_bootstrap, topic)
    tool.raw("op-bad", b"\xc3\x01\x00\xffnot-an-avro-record", CONTENT_TYPE_AVRO)  # offset 0
    json_event = json.dumps({"event_type": "TOOL_TIMEOUT", "operation_id": "op-j"}).encode()
    tool.raw("op-j", json_event, CONTENT_TYPE_JSON)  # offset 1: a JSON event the schema refuses
    tool.event("email-send", "op-c", "TOOL_TIMEOUT", event_id="reused-id")  # offset 2
    tool.flush()
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, "dlq-bytes-group")
    with running(settings, ledger):
        wait_for(lambda: len(ledger.decisions("op-c")) == 1, 60, "op-c decided")
        # The same event id on the same operation with a new payload (a new evidence
        # reference): the ledger's event-id conflict, an Avro record.
        tool.event("email-send", "op-c", "TOOL_TIMEOUT", event_id="reused-id")  # offset 3
        tool.flush()
        wait_for(lambda: ledger.offsets(settings.group_id, topic) == {0: 4}, 60, "offset 4")
    tool.close()
    sent = {m.offset(): _original(m) for m in _read(kafka_bootstrap, topic, 4)}
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=names)
    for _ in range(100):
        if relay.relay_once().leased == 0:
            break
    codec = AvroSingleObjectCodec()
    letters: dict[int, dict[str, Any]] = {}
    for message in _read(kafka_bootstrap, names.dlq, 3):
        name, record = codec.decode(message.value())
        assert name == "recovery.DeadLetter"
        letters[record["source_offset"]] = record
    assert {n: r["reason_code"] for n, r in letters.items()} == {
        0: "avro-unknown-fingerprint",
        1: "json-schema-violation",
        3: "event-id-conflict",
    }
    for offset, record in letters.items():
        key, value, headers = sent[offset]
        assert record["original_key"] == key, offset
        assert record["original_value"] == value, offset
        assert [(h["key"], h["value"]) for h in record["original_headers"]] == headers, offset
        assert record["source_topic"] == topic
    assert "reused-id" in letters[3]["reason"]
