"""The relay encodes the dead-letter rows the controller writes, including the source
record's Kafka timestamp (epoch milliseconds), which it once refused, holding back
every later row of the key."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

from ledger import OutboxRecord
from machines.event import Lineage
from producers.encoding import RecordEncoder
from schemas import DEAD_LETTER, TopicNames, WireDecoder

_STAMP_MS = 1_796_010_035_905


def _row(source_timestamp: object) -> OutboxRecord:
    return OutboxRecord(
        position=7,
        record_id="dlq:0123",
        topic="recovery.dlq",
        key="op-1",
        headers={"record_id": "dlq:0123", "reason": "machine-unknown"},
        payload={
            "controller": "controller-1",
            "dead_lettered_at": "2026-11-30T03:40:37.912652+00:00",
            "event_id": "op-1-e0",
            "operation_id": "op-1",
            "original_headers": [{"key": "content-type", "value": base64.b64encode(b"x").decode()}],
            "original_key": base64.b64encode(b"op-1").decode(),
            "original_value": base64.b64encode(b"\x00\x01").decode(),
            "reason": "record recovery.events[1]@50: machine no-such-machine is not pinned",
            "reason_code": "machine-unknown",
            "source_offset": 50,
            "source_partition": 1,
            "source_timestamp": source_timestamp,
            "source_topic": "recovery.events",
        },
    )


def _encoder() -> RecordEncoder:
    return RecordEncoder(
        TopicNames(), lambda _op: Lineage(agent="a", task="t", initiating_principal="p")
    )


def test_a_dead_letter_with_a_kafka_timestamp_in_milliseconds_is_encoded() -> None:
    encoded = _encoder().encode(_row(_STAMP_MS))
    name, record = WireDecoder().decode(encoded.value, encoded.content_type)
    assert name == DEAD_LETTER
    assert record["source_timestamp"] == datetime.fromtimestamp(_STAMP_MS / 1000, UTC)
    assert record["reason_code"] == "machine-unknown"


def test_a_dead_letter_without_a_source_timestamp_is_encoded_with_none() -> None:
    encoded = _encoder().encode(_row(None))
    _name, record = WireDecoder().decode(encoded.value, encoded.content_type)
    assert record["source_timestamp"] is None
