"""Avro single-object codec: framing, fingerprints, round trips and schema resolution."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta, timezone

import fastavro
import pytest
from fastavro.schema import fingerprint as fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from schemas import (
    CAPABILITY_COMMAND,
    DEAD_LETTER,
    EVENT_ENVELOPE,
    EVIDENCE_EVENT,
    AvroSingleObjectCodec,
    CapabilityCommand,
    WireCode,
    WireError,
    default_catalog,
    event_to_record,
    rabin_fingerprint,
    record_to_event,
)
from tests.unit.wire.samples import LINEAGE, full_event, minimal_event


@pytest.fixture(scope="module")
def codec() -> AvroSingleObjectCodec:
    return AvroSingleObjectCodec()


def test_rabin_fingerprint_matches_the_avro_specification_test_vectors() -> None:
    # From the Avro reference implementation's schema-tests: "int" and "null".
    assert int.from_bytes(rabin_fingerprint('"int"'), "little") == 8247732601305521295
    assert int.from_bytes(rabin_fingerprint('"null"'), "little") == 7195948357588979594


def test_every_shipped_schema_fingerprint_agrees_with_fastavro() -> None:
    for fingerprint, version in default_catalog().versions().items():
        assert fastavro_fingerprint(version.canonical_form, "CRC-64-AVRO") == fingerprint.hex()


def test_the_catalogue_reads_the_highest_version_as_the_current_reader() -> None:
    catalog = default_catalog()
    assert catalog.names() == (CAPABILITY_COMMAND, DEAD_LETTER, EVENT_ENVELOPE, EVIDENCE_EVENT)
    assert catalog.current(EVENT_ENVELOPE).version == 6


def test_encoded_records_start_with_the_marker_and_the_writer_fingerprint(
    codec: AvroSingleObjectCodec,
) -> None:
    data = codec.encode(event_to_record(minimal_event()), EVENT_ENVELOPE)
    current = default_catalog().current(EVENT_ENVELOPE)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == current.fingerprint
    assert codec.fingerprint(EVENT_ENVELOPE) == current.fingerprint_hex


@pytest.mark.parametrize("build", [minimal_event, full_event])
def test_an_event_survives_an_avro_round_trip_unchanged(
    codec: AvroSingleObjectCodec, build: object
) -> None:
    event = build()  # type: ignore[operator]
    name, record = codec.decode(codec.encode(event_to_record(event), EVENT_ENVELOPE))
    assert name == EVENT_ENVELOPE
    decoded = record_to_event(record)
    assert decoded == event
    assert decoded.payload_digest == event.payload_digest


def test_a_record_written_with_schema_v1_is_read_with_the_current_reader(
    codec: AvroSingleObjectCodec,
) -> None:
    v1 = next(
        v
        for v in default_catalog().versions().values()
        if v.version == 1 and v.name == EVENT_ENVELOPE
    )
    record = event_to_record(full_event())
    for later in ("payload_digest", "facts", "scope"):  # v1 has no such fields
        record.pop(later)
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, v1.parsed, record)
    old_bytes = b"\xc3\x01" + v1.fingerprint + buffer.getvalue()

    name, decoded = codec.decode(old_bytes)

    assert name == EVENT_ENVELOPE
    assert decoded["payload_digest"] is None  # the v2 field took its default
    assert decoded["facts"] is None
    assert decoded["scope"] is None
    assert record_to_event(decoded) == full_event()


def test_each_envelope_version_differs_from_the_last_only_by_the_added_fields() -> None:
    versions = [v for v in default_catalog().versions().values() if v.name == EVENT_ENVELOPE]
    v1, v2, v3, v4, v5, v6 = sorted(versions, key=lambda v: v.version)
    assert len({v.fingerprint for v in (v1, v2, v3, v4, v5, v6)}) == 6
    v3_fields = [f["name"] for f in json.loads(v3.canonical_form)["fields"]]
    v2_fields = [f["name"] for f in json.loads(v2.canonical_form)["fields"]]
    v1_fields = [f["name"] for f in json.loads(v1.canonical_form)["fields"]]
    assert v2_fields == [*v1_fields, "payload_digest"]
    assert v3_fields == [*v2_fields, "facts", "scope"]
    assert to_parsing_canonical_form(v3.parsed) == v3.canonical_form
    # v4 changes no top-level field: the human decision gains reviewed_digest, for_resume.
    assert [f["name"] for f in json.loads(v4.canonical_form)["fields"]] == v3_fields

    def decision_fields(version):  # type: ignore[no-untyped-def]
        (field,) = (
            f for f in json.loads(version.canonical_form)["fields"] if f["name"] == "human_decision"
        )
        return [f["name"] for f in field["type"][1]["fields"]]

    assert decision_fields(v4) == [*decision_fields(v3), "reviewed_digest", "for_resume"]
    # v5 adds the free-form payload (JSON text) for auditors.
    v5_fields = [f["name"] for f in json.loads(v5.canonical_form)["fields"]]
    assert v5_fields == [*v3_fields, "payload"]
    # v6 changes no top-level field: the lineage gains the runtime, the facts the digest
    # of the call's arguments.
    assert [f["name"] for f in json.loads(v6.canonical_form)["fields"]] == v5_fields

    def block_fields(version, name):  # type: ignore[no-untyped-def]
        (field,) = (f for f in json.loads(version.canonical_form)["fields"] if f["name"] == name)
        record = field["type"] if isinstance(field["type"], dict) else field["type"][1]
        return [f["name"] for f in record["fields"]]

    assert block_fields(v6, "lineage") == [*block_fields(v5, "lineage"), "runtime"]
    assert block_fields(v6, "facts") == [*block_fields(v5, "facts"), "arguments_digest"]


def test_a_record_written_with_schema_v5_reads_without_runtime_or_arguments_digest(
    codec: AvroSingleObjectCodec,
) -> None:
    v5 = next(
        v
        for v in default_catalog().versions().values()
        if v.version == 5 and v.name == EVENT_ENVELOPE
    )
    event = full_event()
    record = event_to_record(event)
    record["lineage"].pop("runtime")
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, v5.parsed, record)
    name, decoded = codec.decode(b"\xc3\x01" + v5.fingerprint + buffer.getvalue())
    assert name == EVENT_ENVELOPE
    assert decoded["lineage"]["runtime"] is None
    read = record_to_event(decoded)
    assert read == event
    assert read.payload_digest == event.payload_digest  # v6 leaves old digests alone


def test_encoding_refuses_a_record_with_an_unknown_field(codec: AvroSingleObjectCodec) -> None:
    record = event_to_record(minimal_event())
    record["surprise"] = "x"
    with pytest.raises(WireError) as info:
        codec.encode(record, EVENT_ENVELOPE)
    assert info.value.code is WireCode.RECORD_INVALID


def test_encoding_refuses_an_unknown_schema_name(codec: AvroSingleObjectCodec) -> None:
    with pytest.raises(WireError) as info:
        codec.encode({}, "recovery.Nope")
    assert info.value.code is WireCode.UNKNOWN_SCHEMA
    assert "recovery.EventEnvelope" in info.value.reason


def test_an_event_with_a_non_utc_time_is_refused_rather_than_silently_shifted() -> None:
    plus_two = timezone(timedelta(hours=2))
    with pytest.raises(WireError) as info:
        event_to_record(minimal_event(event_time=datetime(2026, 1, 1, tzinfo=plus_two)))
    assert info.value.code is WireCode.NON_UTC_TIME
    assert "evt-1" in info.value.reason


def test_a_capability_command_round_trips_with_nested_params(
    codec: AvroSingleObjectCodec,
) -> None:
    command = CapabilityCommand(
        command_id="op-17/3/0",
        capability="human.escalate",
        kind="escalate",
        material=False,
        params={"queue": "review", "tags": ["a", "b"], "limits": {"n": 2}},
        origin="transition",
        operation_id="op-17",
        correlation_id="corr-1",
        causation_event_id="evt-1",
        machine_name="email-send",
        machine_version="1.0.0",
        machine_digest="sha256:cc",
        sequence=3,
        lineage=LINEAGE,
        issued_at=datetime(2026, 11, 30, 3, 1, tzinfo=UTC),
        deadline=datetime(2026, 11, 30, 4, 1, tzinfo=UTC),
        idempotency_key="idem-1",
    )
    name, record = codec.decode(codec.encode(command.to_record(), CAPABILITY_COMMAND))
    assert name == CAPABILITY_COMMAND
    assert CapabilityCommand.from_record(record) == command


def test_dead_letter_and_evidence_records_round_trip(codec: AvroSingleObjectCodec) -> None:
    now = datetime(2026, 11, 30, 3, 2, tzinfo=UTC)
    dead = {
        "reason_code": "avro-corrupt",
        "reason": "bad",
        "source_topic": "recovery.events",
        "source_partition": 2,
        "source_offset": 99,
        "source_timestamp": now,
        "original_key": b"op-1",
        "original_value": b"\x00\xff",
        "original_headers": [{"key": "content-type", "value": b"x"}],
        "excerpt": False,
        "original_size": 16,
        "original_value_sha256": "ab" * 32,
        "event_id": None,
        "operation_id": "op-1",
        "dead_lettered_at": now,
        "controller": "controller-1",
    }
    assert codec.decode(codec.encode(dead, DEAD_LETTER)) == (DEAD_LETTER, dead)
    evidence = {
        "evidence_id": "ev-1",
        "operation_id": "op-1",
        "correlation_id": "c",
        "sequence": 4,
        "source_event_id": "evt-9",
        "machine_name": "payment-refund",
        "machine_version": "1.0.0",
        "outcome": "applied",
        "verifier": "payment.verify-refund",
        "reference": "r",
        "checkpoint_id": None,
        "ancestor_operation": None,
        "recorded_at": now,
        "producer": "controller-1",
    }
    assert codec.decode(codec.encode(evidence, EVIDENCE_EVENT)) == (EVIDENCE_EVENT, evidence)


def test_encoding_refuses_an_unknown_field_inside_an_optional_block(
    codec: AvroSingleObjectCodec,
) -> None:
    record = event_to_record(full_event())
    record["evidence"]["checkpoint"]["validated_by_magic"] = True
    with pytest.raises(WireError) as info:
        codec.encode(record, EVENT_ENVELOPE)
    assert info.value.code is WireCode.RECORD_INVALID
    assert "validated_by_magic" in info.value.reason
