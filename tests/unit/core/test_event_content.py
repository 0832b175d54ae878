"""`Event.content` is written out field by field for speed; these tests hold it to the
generic dataclass walk it replaced, so a field added to an envelope block without a line
in `content` fails here instead of silently leaving the digest."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any

import pytest

from machines.event import DeclaredFacts, Event, Scope, canonical_bytes, sha256_digest
from tests.unit.wire.samples import full_event, minimal_event


def _walk(value: Any) -> Any:
    """The generic walk `Event.content` used to make: every dataclass field, recursively,
    tuples as lists, mappings as dicts, datetimes as ISO-8601."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _walk(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {k: _walk(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _reference(event: Event) -> dict[str, Any]:
    data = _walk(event)
    del data["payload_digest"]
    for optional in ("facts", "scope", "payload"):
        if data[optional] is None:
            del data[optional]
    # Envelope v6's fields enter the content only when set, so events without them keep
    # their digests.
    if data["lineage"]["runtime"] is None:
        del data["lineage"]["runtime"]
    if data.get("facts") is not None and data["facts"]["arguments_digest"] is None:
        del data["facts"]["arguments_digest"]
    return data


FACTS = DeclaredFacts(idempotency_key="k-1", side_effect_confirmed=True, status_api=True)
SCOPE = Scope(capability="email.send", tool="smtp", environment="prod")
T = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)

SAMPLES = {
    "minimal": minimal_event(),
    "every block": full_event(),
    "every block with facts and scope": Event(
        **{f.name: getattr(full_event(), f.name) for f in fields(Event) if f.init}
        | {"facts": FACTS, "scope": SCOPE, "payload_digest": ""}
    ),
    "every block with a payload": Event(
        **{f.name: getattr(full_event(), f.name) for f in fields(Event) if f.init}
        | {"facts": FACTS, "payload": {"body": "hi", "to": ["a", {"b": 1}]}, "payload_digest": ""}
    ),
    # Not what the wire gives (JSON has none of these), but a value a caller may build:
    # the exact JSON types take a shorter way through `_plain`, these the generic one.
    "a payload of other containers": Event(
        **{f.name: getattr(full_event(), f.name) for f in fields(Event) if f.init}
        | {
            "payload": MappingProxyType(
                {"t": ("a", 1, 2.5, None), "m": MappingProxyType({"k": [True]}), "at": T}
            ),
            "payload_digest": "",
        }
    ),
    "a runtime and an arguments digest (v6)": Event(
        **{f.name: getattr(full_event(), f.name) for f in fields(Event) if f.init}
        | {
            "lineage": replace(full_event().lineage, runtime="langgraph-7"),
            "facts": replace(FACTS, arguments_digest="sha256:" + "ab" * 32),
            "payload_digest": "",
        }
    ),
    "non-utc time": minimal_event(
        event_time=datetime(2026, 11, 30, 3, 0, tzinfo=timezone(timedelta(hours=2)))
    ),
}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_content_equals_the_generic_walk_key_for_key_and_in_field_order(name: str) -> None:
    event = SAMPLES[name]
    reference = _reference(event)
    assert event.content() == reference
    assert list(event.content()) == list(reference)
    for block in ("facts", "scope", "payload"):  # the blocks written out field by field
        if block in reference:
            assert list(event.content()[block]) == list(reference[block])
    assert event.to_dict() == {**reference, "payload_digest": event.payload_digest}


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_digest_covers_the_canonical_json_of_the_generic_walk(name: str) -> None:
    event = SAMPLES[name]
    text = json.dumps(_reference(event), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_bytes(event.content()) == text.encode("utf-8")
    assert event.payload_digest == sha256_digest(_reference(event))


def test_content_is_a_fresh_value_a_caller_may_change() -> None:
    event = full_event()
    first = event.content()
    first["lineage"]["agent"] = "someone-else"
    assert event.content()["lineage"]["agent"] == "agent-7"


def test_canonical_bytes_keeps_non_ascii_text_and_encodes_times_and_tuples() -> None:
    value = {"b": ("x", "é"), "a": datetime(2026, 1, 1, tzinfo=UTC)}
    assert canonical_bytes(value) == '{"a":"2026-01-01T00:00:00+00:00","b":["x","é"]}'.encode()
