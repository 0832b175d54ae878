"""Where `audit_to_ocsf` reads each attribute from, and how it copies the audit body: the
flat name first, then the nested paths in order; a path through a non-mapping holds
nothing; the first value that is not None wins, even a falsy one; the body is copied
as plain JSON (string keys, lists, ISO-8601 times)."""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from schemas import audit_to_ocsf


def _chain(**fields: Any) -> dict[str, Any]:
    return {"operation_id": "op-1", "sequence": 2, "hash": "h2", "kind": "decision", **fields}


def test_a_flat_field_wins_over_the_same_field_in_the_body() -> None:
    event = audit_to_ocsf(
        _chain(
            occurred_at="2026-11-30T03:00:00+00:00",
            actor="tool-1",
            record={"event": {"producer": "tool-2", "type": "TOOL_TIMEOUT"}},
        )
    )
    assert event["actor"]["user"]["uid"] == "tool-1"
    assert event["api"]["operation"] == "TOOL_TIMEOUT"


def test_the_body_wins_over_the_top_level_decision_block() -> None:
    event = audit_to_ocsf(
        _chain(
            record={"decided_at": "2026-11-30T03:00:00+00:00", "outcome": "rejected"},
            decision={"outcome": "transitioned", "state_before": "a", "state_after": "b"},
        )
    )
    assert event["status_code"] == "rejected"
    assert event["resources"][0]["data"] == {"state_before": "a", "state_after": "b"}
    assert event["message"] == "operation op-1: decision rejected (a -> b)"


def test_a_path_through_something_that_is_not_a_mapping_holds_nothing() -> None:
    event = audit_to_ocsf(
        _chain(
            occurred_at="2026-11-30T03:00:00+00:00",
            record={"event": "not-a-mapping", "machine": ["x"]},
            event={"id": "evt-7"},
            machine={"name": "email-send", "version": "1.0.0"},
        )
    )
    assert event["api"]["request"]["uid"] == "evt-7"
    assert event["resources"][0]["name"] == "email-send@1.0.0"
    assert event["unmapped"]["recovery"]["machine"]["digest"] is None


def test_a_falsy_value_that_is_not_none_is_taken_rather_than_a_later_path() -> None:
    event = audit_to_ocsf(
        _chain(
            occurred_at="2026-11-30T03:00:00+00:00",
            correlation_id="",
            record={"event": {"correlation_id": "corr-9"}},
        )
    )
    assert event["metadata"]["correlation_uid"] == ""


def test_the_body_is_copied_as_plain_json() -> None:
    body = {
        "decided_at": datetime(2026, 11, 30, 3, 0, tzinfo=UTC),
        "params": ("a", {"n": (1, 2)}),
        "ordered": OrderedDict(b=1, a=2),
        7: "int key",
    }
    event = audit_to_ocsf(_chain(record=body))
    copied = event["unmapped"]["recovery"]["record"]
    assert copied == {
        "decided_at": "2026-11-30T03:00:00+00:00",
        "params": ["a", {"n": [1, 2]}],
        "ordered": {"b": 1, "a": 2},
        "7": "int key",
    }
    assert copied is not body
    assert json.loads(json.dumps(event)) == event


def test_a_json_body_is_copied_not_shared() -> None:
    body = {"decided_at": "2026-11-30T03:00:00+00:00", "errors": [], "event": {"id": "e"}}
    event = audit_to_ocsf(_chain(record=body))
    copied = event["unmapped"]["recovery"]["record"]
    assert copied == body
    assert copied is not body
    assert copied["event"] is not body["event"]
