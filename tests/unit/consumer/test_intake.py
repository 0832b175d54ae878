"""Intake: every kind of bad record becomes a refusal with a stable code, never an error."""

from __future__ import annotations

import json

import pytest

from consumer import Accepted, Intake, Rejected
from machines.event import Scope
from schemas import CONTENT_TYPE, CONTENT_TYPE_JSON, event_to_json
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import encoded, event, pinned, record


@pytest.fixture
def intake() -> Intake:
    machines, _ = pinned()
    return Intake(machines, roster=producer_roster(), max_record_bytes=4096)


def _code(intake: Intake, raw: object) -> str:
    outcome = intake.examine(raw)  # type: ignore[arg-type]
    assert isinstance(outcome, Rejected), outcome
    return outcome.refusal.code


def test_a_valid_avro_event_for_a_pinned_machine_is_accepted(intake: Intake) -> None:
    outcome = intake.examine(encoded(event("TOOL_TIMEOUT"), 3))
    assert isinstance(outcome, Accepted)
    assert outcome.machine.name == "email-send"
    assert outcome.event.event_type == "TOOL_TIMEOUT"


def test_a_strict_json_event_is_accepted(intake: Intake) -> None:
    value = json.dumps(event_to_json(event("TOOL_TIMEOUT"))).encode("utf-8")
    headers = ((CONTENT_TYPE, CONTENT_TYPE_JSON.encode("utf-8")),)
    assert isinstance(intake.examine(record(value, 0, headers=headers)), Accepted)


@pytest.mark.parametrize(
    ("value", "content_type", "code"),
    [
        (b"garbage", None, "avro-not-single-object"),
        (b"\xc3\x01" + b"\x00" * 8 + b"body", None, "avro-unknown-fingerprint"),
        (None, None, "wire-empty"),
        (b"{", CONTENT_TYPE_JSON, "json-malformed"),
        (b'{"event_type": "X"}', CONTENT_TYPE_JSON, "json-schema-violation"),
        (b"anything", "text/plain", "wire-unsupported-content-type"),
    ],
)
def test_undecodable_records_are_refused_with_the_codec_reason(
    intake: Intake, value: bytes | None, content_type: str | None, code: str
) -> None:
    headers = () if content_type is None else ((CONTENT_TYPE, content_type.encode("utf-8")),)
    assert _code(intake, record(value, 0, headers=headers)) == code


def test_an_oversized_record_is_refused_before_decoding(intake: Intake) -> None:
    assert _code(intake, record(b"x" * 5000, 0)) == "wire-oversized"


def test_large_headers_count_towards_the_size_limit(intake: Intake) -> None:
    raw = encoded(event("TOOL_TIMEOUT"), 0)
    padded = record(raw.value, 0, headers=(*raw.headers, ("junk", b"x" * 4096)))
    assert _code(intake, padded) == "wire-oversized"


def test_an_event_keyed_by_another_operation_is_refused(intake: Intake) -> None:
    raw = encoded(event("TOOL_TIMEOUT", "op-1"), 0)
    assert _code(intake, record(raw.value, 0, key=b"op-2")) == "key-mismatch"


def test_an_unknown_machine_is_refused(intake: Intake) -> None:
    assert _code(intake, encoded(event("TOOL_TIMEOUT", machine="nope"), 0)) == "machine-unknown"


def test_an_unpinned_version_of_a_known_machine_is_left_to_the_batch(intake: Intake) -> None:
    # An operation stays on the version it opened under whatever version a later event
    # names; only the batch knows whether the event opens one (tests/unit/consumer/
    # test_rollout.py).
    outcome = intake.examine(encoded(event("TOOL_TIMEOUT", version="2.0.0"), 0))
    assert isinstance(outcome, Accepted)
    assert outcome.unpinned


def test_a_machine_whose_applies_to_excludes_the_agent_is_refused(intake: Intake) -> None:
    raw = encoded(event("TOOL_TIMEOUT", machine="delegated-research", agent="intruder"), 0)
    assert _code(intake, raw) == "machine-not-applicable"


def test_a_refusal_names_the_coordinates_and_the_ids_it_could_read(intake: Intake) -> None:
    outcome = intake.examine(encoded(event("TOOL_TIMEOUT", machine="nope"), 7))
    assert isinstance(outcome, Rejected)
    assert "recovery.events[0]@7" in outcome.refusal.reason
    assert outcome.refusal.event_id == "op-1-tool_timeout"
    assert outcome.refusal.operation_id == "op-1"


@pytest.mark.parametrize(
    "scope",
    [
        Scope(capability="payment.refund", tool="smtp-relay", environment="production"),
        Scope(capability="email.send", tool="sendgrid", environment="production"),
        Scope(capability="email.send", tool="smtp-relay", environment="development"),
        Scope(capability="email.send", tool=None, environment="production"),
    ],
    ids=["capability", "tool", "environment", "tool-unknown"],
)
def test_a_scope_outside_the_machines_applies_to_is_refused_on_every_dimension(
    intake: Intake, scope: Scope
) -> None:
    outcome = intake.examine(encoded(event("TOOL_TIMEOUT", scope=scope), 0))
    assert isinstance(outcome, Rejected)
    assert outcome.refusal.code == "machine-not-applicable"
    assert scope.capability in outcome.refusal.reason


def test_a_scope_inside_the_machines_applies_to_is_accepted(intake: Intake) -> None:
    scope = Scope(capability="email.send", tool="postfix", environment="staging")
    assert isinstance(intake.examine(encoded(event("TOOL_TIMEOUT", scope=scope), 0)), Accepted)
