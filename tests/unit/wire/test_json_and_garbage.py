"""JSON input is validated as strictly as Avro, and hostile bytes only ever raise a coded
`WireError` (the consumer dead-letters by its code)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import (
    CONTENT_TYPE_AVRO,
    CONTENT_TYPE_JSON,
    EVENT_ENVELOPE,
    JsonCodec,
    WireCode,
    WireDecoder,
    WireError,
    default_catalog,
    event_to_json,
    event_to_record,
    record_to_event,
)
from tests.unit.wire.samples import full_event, minimal_event

DECODER = WireDecoder(max_bytes=64 * 1024)


def _json(event_dict: dict[str, Any]) -> bytes:
    return json.dumps(event_dict).encode()


def _code(data: bytes | None, content_type: str | None) -> WireCode:
    with pytest.raises(WireError) as info:
        DECODER.decode(data, content_type)
    return info.value.code


def test_a_json_event_decodes_to_the_same_event_as_its_avro_form() -> None:
    event = full_event()
    from_json = record_to_event(DECODER.decode(_json(event.to_dict()), CONTENT_TYPE_JSON)[1])
    avro = DECODER.avro.encode(event_to_record(event), EVENT_ENVELOPE)
    from_avro = record_to_event(DECODER.decode(avro, CONTENT_TYPE_AVRO)[1])
    assert from_json == from_avro == event


def test_content_type_parameters_are_ignored_and_no_header_means_avro() -> None:
    event = minimal_event()
    data = _json(event.to_dict())
    assert DECODER.decode(data, "application/json; charset=utf-8")[0] == EVENT_ENVELOPE
    assert _code(data, None) is WireCode.NOT_SINGLE_OBJECT


def test_an_unknown_content_type_is_refused_with_its_own_code() -> None:
    assert _code(b"{}", "text/plain") is WireCode.UNSUPPORTED_CONTENT_TYPE


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d.update(surprise=1), "surprise"),
        (lambda d: d["lineage"].update(extra="x"), "extra"),
        (lambda d: d.pop("producer"), "producer"),
        (lambda d: d.update(event_time="2026-11-30T05:00:00+02:00"), "event_time"),
        (lambda d: d.update(event_time="yesterday"), "event_time"),
        (lambda d: d.update(operation_id=17), "operation_id"),
        (lambda d: d["evidence"].update(outcome="maybe"), "outcome"),
        (lambda d: d["human_decision"].update(decision="perhaps"), "decision"),
        (lambda d: d["classifier"]["probabilities"].update(X="high"), "probabilities"),
        (lambda d: d["evidence"]["checkpoint"].update(validated="yes"), "validated"),
    ],
)
def test_json_that_avro_would_refuse_is_refused(mutate: Any, fragment: str) -> None:
    data = full_event().to_dict()
    mutate(data)
    with pytest.raises(WireError) as info:
        DECODER.decode(_json(data), CONTENT_TYPE_JSON)
    assert info.value.code is WireCode.JSON_SCHEMA_VIOLATION
    assert fragment in info.value.reason
    assert "evt-1" in info.value.reason or "no event_id" in info.value.reason


@pytest.mark.parametrize(
    "data",
    [
        b'{"event_id": "a", "event_id": "b"}',
        b'{"x": NaN}',
        b"\xff\xfe{}",
        b"{not json",
        b"[" * 5000 + b"]" * 5000,
    ],
)
def test_malformed_json_is_refused_as_malformed(data: bytes) -> None:
    assert _code(data, CONTENT_TYPE_JSON) is WireCode.JSON_MALFORMED


def test_json_that_is_not_an_object_violates_the_schema() -> None:
    assert _code(b"[1, 2]", CONTENT_TYPE_JSON) is WireCode.JSON_SCHEMA_VIOLATION


def test_json_encoding_validates_what_it_writes() -> None:
    codec = JsonCodec()
    assert json.loads(codec.encode(event_to_json(minimal_event()), EVENT_ENVELOPE))
    with pytest.raises(WireError) as info:
        codec.encode({"event_id": "x"}, EVENT_ENVELOPE)
    assert info.value.code is WireCode.JSON_SCHEMA_VIOLATION
    with pytest.raises(WireError) as info:
        codec.encode({}, "recovery.CapabilityCommand")
    assert info.value.code is WireCode.UNKNOWN_SCHEMA


def test_a_schema_valid_envelope_the_core_refuses_is_envelope_invalid() -> None:
    data = minimal_event().to_dict()
    data["event_type"] = "lowercase"
    _, record = DECODER.decode(_json(data), CONTENT_TYPE_JSON)
    with pytest.raises(WireError) as info:
        record_to_event(record)
    assert info.value.code is WireCode.ENVELOPE_INVALID


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (None, WireCode.EMPTY),
        (b"", WireCode.EMPTY),
        (b"\xc3\x01" + b"\x00" * 70_000, WireCode.OVERSIZED),
        (b"\x00\x00\x00\x00\x01hello", WireCode.NOT_SINGLE_OBJECT),  # registry framing
        (b"\xc3\x01\x01\x02\x03\x04\x05\x06\x07\x08body", WireCode.UNKNOWN_FINGERPRINT),
        (b"\xc3\x01", WireCode.NOT_SINGLE_OBJECT),
    ],
)
def test_garbage_gets_a_specific_code(data: bytes | None, code: WireCode) -> None:
    assert _code(data, None) is code


def test_a_truncated_record_is_corrupt_and_a_padded_one_has_trailing_bytes() -> None:
    good = DECODER.avro.encode(event_to_record(full_event()), EVENT_ENVELOPE)
    assert _code(good[:-7], None) is WireCode.AVRO_CORRUPT
    assert _code(good + b"\x00", None) is WireCode.AVRO_TRAILING_BYTES


_FINGERPRINTS = [v.fingerprint for v in default_catalog().versions().values()]


@settings(max_examples=400, deadline=None)
@given(fingerprint=st.sampled_from(_FINGERPRINTS), body=st.binary(max_size=512))
def test_random_bodies_behind_a_known_fingerprint_raise_only_wire_errors(
    fingerprint: bytes, body: bytes
) -> None:
    code: WireCode | None = None
    try:
        DECODER.decode(b"\xc3\x01" + fingerprint + body, None)
    except WireError as exc:
        code = exc.code
    assert code in {None, WireCode.AVRO_CORRUPT, WireCode.AVRO_TRAILING_BYTES}


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=256), content_type=st.sampled_from([None, CONTENT_TYPE_JSON]))
def test_random_bytes_raise_only_wire_errors(data: bytes, content_type: str | None) -> None:
    try:
        DECODER.decode(data, content_type)
    except WireError:
        pass
