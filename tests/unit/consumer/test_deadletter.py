"""The dead-letter record: Avro DeadLetter field names, original bytes, coordinates."""

from __future__ import annotations

import base64
import json

from consumer import Refusal, dead_letter, dead_letter_id
from schemas import DEAD_LETTER, default_catalog
from tests.unit.consumer.support import CONTROLLER, GROUP, T0, TOPIC, record


def test_the_payload_carries_reason_original_bytes_headers_and_coordinates() -> None:
    raw = record(
        b"\x00\xffbytes", 12, key=b"op-9", headers=(("h", b"\x01"), ("empty", None)), producer=None
    )
    letter = dead_letter(GROUP, CONTROLLER, raw, Refusal("avro-corrupt", "bad"), T0)
    payload = letter.payload
    assert (payload["reason_code"], payload["reason"]) == ("avro-corrupt", "bad")
    assert (payload["source_topic"], payload["source_partition"], payload["source_offset"]) == (
        TOPIC,
        0,
        12,
    )
    assert base64.b64decode(payload["original_value"]) == b"\x00\xffbytes"
    assert base64.b64decode(payload["original_key"]) == b"op-9"
    assert payload["original_headers"] == [
        {"key": "h", "value": base64.b64encode(b"\x01").decode()},
        {"key": "empty", "value": None},
    ]
    assert letter.headers["coordinates"] == f"{TOPIC}[0]@12"
    assert letter.key == "op-9"
    json.dumps(payload)  # the outbox stores it as JSON


def test_the_payload_has_exactly_the_fields_of_the_dead_letter_schema() -> None:
    raw = record(b"x", 0)
    letter = dead_letter(GROUP, CONTROLLER, raw, Refusal("wire-empty", "none"), T0)
    schema = json.loads(default_catalog().current(DEAD_LETTER).path.read_text(encoding="utf-8"))
    assert set(letter.payload) == {f["name"] for f in schema["fields"]}


def test_the_audit_record_holds_a_digest_not_the_bytes() -> None:
    raw = record(b"secret-ish payload", 3)
    letter = dead_letter(GROUP, CONTROLLER, raw, Refusal("avro-corrupt", "bad"), T0)
    assert "secret-ish" not in json.dumps(letter.audit)
    assert letter.audit["value_digest"].startswith("sha256:")
    assert letter.audit["dead_letter_id"] == dead_letter_id(GROUP, raw)


def test_a_key_that_is_not_text_orders_the_letter_on_the_intake_chain() -> None:
    raw = record(b"x", 0, key=b"\xff\xfe")
    letter = dead_letter(GROUP, CONTROLLER, raw, Refusal("key-mismatch", "k"), T0)
    assert letter.key == letter.chain_id
