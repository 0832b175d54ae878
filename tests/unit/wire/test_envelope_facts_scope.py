"""Envelope schema v3: the optional `facts` and `scope` blocks round-trip through Avro and
JSON, records written with v1 and v2 still read, JSON stays strict inside the new
blocks, and an event without them keeps the digest it had before they existed."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest

from machines.event import DeclaredFacts, Event, Scope, sha256_digest
from schemas import (
    CONTENT_TYPE_JSON,
    EVENT_ENVELOPE,
    AvroSingleObjectCodec,
    SchemaVersion,
    WireCode,
    WireDecoder,
    WireError,
    default_catalog,
    event_to_json,
    event_to_record,
    record_to_event,
)
from tests.unit.wire.samples import full_event, minimal_event

FACTS = DeclaredFacts(
    idempotency_key="pr-key-1", side_effect_confirmed=True, compensation_supported=True
)
SCOPE = Scope(capability="procurement.create-request", tool="coupa", environment="production")
DECODER = WireDecoder(max_bytes=64 * 1024)


def _declared() -> Event:
    return minimal_event(facts=FACTS, scope=SCOPE)


def _envelope(version: int) -> SchemaVersion:
    return next(
        v
        for v in default_catalog().versions().values()
        if v.name == EVENT_ENVELOPE and v.version == version
    )


def _field_names(version: int) -> list[str]:
    return [f["name"] for f in json.loads(_envelope(version).canonical_form)["fields"]]


def _written_with(version: int, event: Event) -> bytes:
    """`event` as a producer still on envelope schema `version` would write it."""
    writer = _envelope(version)
    names = set(_field_names(version))
    record = {k: v for k, v in event_to_record(event).items() if k in names}
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, writer.parsed, record)
    return b"\xc3\x01" + writer.fingerprint + buffer.getvalue()


def test_facts_and_scope_survive_an_avro_round_trip() -> None:
    codec = AvroSingleObjectCodec()
    event = _declared()
    name, record = codec.decode(codec.encode(event_to_record(event), EVENT_ENVELOPE))
    assert name == EVENT_ENVELOPE
    decoded = record_to_event(record)
    assert decoded == event
    assert decoded.facts == FACTS
    assert decoded.scope == SCOPE


def test_facts_and_scope_survive_a_json_round_trip() -> None:
    event = _declared()
    data = json.dumps(event_to_json(event)).encode()
    assert record_to_event(DECODER.decode(data, CONTENT_TYPE_JSON)[1]) == event


@pytest.mark.parametrize("version", [1, 2])
def test_a_record_written_with_an_older_envelope_schema_still_reads(version: int) -> None:
    event = full_event()
    name, record = AvroSingleObjectCodec().decode(_written_with(version, event))
    assert name == EVENT_ENVELOPE
    assert record["facts"] is None
    assert record["scope"] is None
    assert record_to_event(record) == event


def test_an_event_without_the_new_blocks_keeps_its_pre_v3_digest() -> None:
    event = full_event()
    content = event.content()
    # The digest covers exactly the v2 fields (less the digest itself), as before v3.
    v2_fields = set(_field_names(2)) - {"payload_digest"}
    assert set(content) == v2_fields
    assert event.payload_digest == sha256_digest({k: content[k] for k in v2_fields})


def test_declared_facts_and_scope_are_covered_by_the_digest() -> None:
    base = minimal_event()
    with_facts = minimal_event(facts=FACTS)
    other_facts = minimal_event(facts=DeclaredFacts(idempotency_key="pr-key-2"))
    with_scope = minimal_event(scope=SCOPE)
    digests = {e.payload_digest for e in (base, with_facts, other_facts, with_scope)}
    assert len(digests) == 4


def _json_code(mutate: Any) -> WireCode:
    data = event_to_json(_declared())
    mutate(data)
    with pytest.raises(WireError) as info:
        DECODER.decode(json.dumps(data).encode(), CONTENT_TYPE_JSON)
    return info.value.code


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["facts"].update(trusted=True),
        lambda d: d["scope"].update(agent="agent-x"),
        lambda d: d["scope"].pop("capability"),
        lambda d: d["facts"].update(side_effect_confirmed="yes"),
        lambda d: d["facts"].update(idempotency_key=7),
    ],
    ids=["unknown-fact", "unknown-scope-field", "scope-without-capability", "bad-bool", "bad-key"],
)
def test_json_input_is_strict_inside_the_facts_and_scope_blocks(mutate: Any) -> None:
    assert _json_code(mutate) is WireCode.JSON_SCHEMA_VIOLATION


def test_avro_encoding_refuses_an_unknown_field_inside_the_facts_block() -> None:
    record = event_to_record(_declared())
    record["facts"]["trusted"] = True
    with pytest.raises(WireError):
        AvroSingleObjectCodec().encode(record, EVENT_ENVELOPE)
