"""What `AvroSingleObjectCodec.encode` refuses, and why: the checks run on every record
the relay publishes, so they are written for speed (fastavro asked for a verdict
first, record schemas' field plans cached); these tests pin that a bad record is still
refused with the reason fastavro or the unknown-field walk gives, at any depth."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schemas import (
    CAPABILITY_COMMAND,
    DEAD_LETTER,
    AvroSingleObjectCodec,
    CapabilityCommand,
    WireCode,
    WireError,
)
from tests.unit.wire.samples import LINEAGE

NOW = datetime(2026, 11, 30, 3, 2, tzinfo=UTC)


@pytest.fixture(scope="module")
def codec() -> AvroSingleObjectCodec:
    return AvroSingleObjectCodec()


def _command() -> dict[str, Any]:
    return CapabilityCommand(
        command_id="op-17:3:0",
        capability="payment.verify-refund",
        kind="verify",
        material=False,
        params={"scope": "refund"},
        origin="transition",
        operation_id="op-17",
        correlation_id="corr-1",
        causation_event_id="evt-1",
        machine_name="payment-refund",
        machine_version="1.0.0",
        machine_digest="sha256:cc",
        sequence=3,
        lineage=LINEAGE,
        issued_at=NOW,
        deadline=NOW,
    ).to_record()


def _dead_letter() -> dict[str, Any]:
    return {
        "reason_code": "avro-corrupt",
        "reason": "bad",
        "source_topic": "recovery.events",
        "source_partition": 2,
        "source_offset": 99,
        "source_timestamp": NOW,
        "original_key": b"op-1",
        "original_value": b"\x00\xff",
        "original_headers": [{"key": "content-type", "value": b"x"}],
        "event_id": None,
        "operation_id": "op-1",
        "dead_lettered_at": NOW,
        "controller": "controller-1",
    }


def _refusal(codec: AvroSingleObjectCodec, record: dict[str, Any], schema: str) -> str:
    with pytest.raises(WireError) as info:
        codec.encode(record, schema)
    assert info.value.code is WireCode.RECORD_INVALID
    return info.value.reason


def test_a_command_with_values_in_its_nullable_fields_encodes_and_reads_back(
    codec: AvroSingleObjectCodec,
) -> None:
    record = {**_command(), "idempotency_key": "idem-1"}
    assert codec.decode(codec.encode(record, CAPABILITY_COMMAND)) == (CAPABILITY_COMMAND, record)


def test_a_wrong_type_in_a_nullable_field_is_refused_naming_the_field(
    codec: AvroSingleObjectCodec,
) -> None:
    reason = _refusal(codec, {**_command(), "idempotency_key": 42}, CAPABILITY_COMMAND)
    assert reason.startswith("record does not match recovery.CapabilityCommand v1: ")
    assert "recovery.CapabilityCommand.idempotency_key" in reason


def test_a_missing_required_field_is_refused(codec: AvroSingleObjectCodec) -> None:
    record = _command()
    del record["machine_digest"]
    reason = _refusal(codec, record, CAPABILITY_COMMAND)
    # fastavro's strict mode reports the whole record here, not the field.
    assert reason.startswith("record does not match recovery.CapabilityCommand v1: ")


def test_a_wrong_type_inside_a_nested_record_is_refused_naming_its_path(
    codec: AvroSingleObjectCodec,
) -> None:
    record = _command()
    record["lineage"]["parent_operation"] = 7
    reason = _refusal(codec, record, CAPABILITY_COMMAND)
    assert "recovery.Lineage.parent_operation" in reason


def test_an_unknown_field_in_a_nested_record_is_refused_with_its_path(
    codec: AvroSingleObjectCodec,
) -> None:
    record = _command()
    record["lineage"]["delegated_to"] = "agent-9"
    reason = _refusal(codec, record, CAPABILITY_COMMAND)
    assert reason.endswith(f"{CAPABILITY_COMMAND}.lineage: unknown field(s) delegated_to"), reason


def test_unknown_fields_at_the_top_are_all_named_in_order(codec: AvroSingleObjectCodec) -> None:
    record = {**_command(), "zeta": 1, "alpha": None}
    reason = _refusal(codec, record, CAPABILITY_COMMAND)
    assert reason.endswith(f"{CAPABILITY_COMMAND}: unknown field(s) alpha, zeta"), reason


def test_an_unknown_field_in_a_record_inside_an_array_is_refused_with_its_index(
    codec: AvroSingleObjectCodec,
) -> None:
    record = _dead_letter()
    record["original_headers"].append({"key": "k", "value": None, "extra": 1})
    reason = _refusal(codec, record, DEAD_LETTER)
    assert reason.endswith(f"{DEAD_LETTER}.original_headers[1]: unknown field(s) extra"), reason


def test_the_same_bad_record_is_refused_the_same_way_every_time(
    codec: AvroSingleObjectCodec,
) -> None:
    record = _command()
    record["lineage"]["delegated_to"] = "agent-9"
    reasons = {_refusal(codec, record, CAPABILITY_COMMAND) for _ in range(3)}
    good = codec.encode(_command(), CAPABILITY_COMMAND)
    assert len(reasons) == 1
    assert codec.encode(_command(), CAPABILITY_COMMAND) == good
