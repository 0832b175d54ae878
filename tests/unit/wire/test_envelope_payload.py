"""Envelope schema v5: the optional free-form `payload` (SPEC §10) round-trips through
Avro (as canonical JSON text) and JSON (as an object), enters the digest only when
present, and a payload that is not a bounded JSON object is a coded refusal."""

from __future__ import annotations

from dataclasses import replace

import pytest

from machines.event import MAX_PAYLOAD_DEPTH
from schemas import (
    EVENT_ENVELOPE,
    AvroSingleObjectCodec,
    JsonCodec,
    WireError,
    event_to_json,
    event_to_record,
    record_to_event,
)
from tests.unit.wire.samples import minimal_event

TOO_DEEP = '{"a":' * (MAX_PAYLOAD_DEPTH + 1) + "1" + "}" * (MAX_PAYLOAD_DEPTH + 1)
PAYLOAD = {"body": "héllo", "recipients": ["a@example.com", {"cc": True}], "n": 1.5}


def test_a_payload_round_trips_through_avro_and_json() -> None:
    event = replace(minimal_event(), payload=PAYLOAD, payload_digest="")
    avro = AvroSingleObjectCodec()
    _, decoded = avro.decode(avro.encode(event_to_record(event), EVENT_ENVELOPE))
    assert isinstance(decoded["payload"], str)  # JSON text inside the Avro record
    assert record_to_event(decoded) == event
    as_json = JsonCodec()
    _, decoded = as_json.decode(as_json.encode(event_to_json(event), EVENT_ENVELOPE))
    assert record_to_event(decoded) == event
    assert event.payload_digest != minimal_event().payload_digest


def test_an_event_without_payload_keeps_its_digest_and_reads_as_before() -> None:
    event = minimal_event()
    assert "payload" not in event.content()
    avro = AvroSingleObjectCodec()
    _, decoded = avro.decode(avro.encode(event_to_record(event), EVENT_ENVELOPE))
    assert decoded["payload"] is None
    assert record_to_event(decoded) == event


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("{not json", "envelope-invalid"),
        ('["a list"]', "envelope-invalid"),
        (
            '{"a":' * (MAX_PAYLOAD_DEPTH + 1) + "1" + "}" * (MAX_PAYLOAD_DEPTH + 1),
            "envelope-field-invalid",
        ),
        ('{"a":' + "[" * 5000 + "]" * 5000 + "}", "envelope-invalid"),
    ],
    ids=["not-json", "not-an-object", "too-deep", "hostile-depth"],
)
def test_a_payload_that_is_no_bounded_json_object_is_refused_with_a_code(
    text: str, code: str
) -> None:
    record = event_to_record(minimal_event())
    record["payload"] = text
    with pytest.raises(WireError) as info:
        record_to_event(record)
    assert str(info.value.code) == code


def test_the_deepest_payload_allowed_is_accepted() -> None:
    record = event_to_record(minimal_event())
    record["payload"] = '{"a":' * MAX_PAYLOAD_DEPTH + "1" + "}" * MAX_PAYLOAD_DEPTH
    assert record_to_event(record).payload is not None
