"""Where `audit_to_ocsf` reads each attribute from, and how it copies the audit body: the
flat name first, then the nested paths in order; a path through a non-mapping holds
nothing; the first value that is not None wins, even a falsy one; the body is copied
as plain JSON (string keys, lists, ISO-8601 times); the published JSON is exactly the
sorted compact dump of that event."""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import WireError, audit_to_ocsf, audit_to_ocsf_json


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


# -- the published JSON ------------------------------------------------------------------

_COMPACT: dict[str, Any] = {"sort_keys": True, "separators": (",", ":")}
_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    ["50% {x} %s", 'é€𝄞\n"q', "{}", "%%", "2026-11-30T03:00:00+00:00"]
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | _TEXT
)
_ODD = st.sampled_from(
    [("a", 1), datetime(2026, 11, 30, 3, 0, tzinfo=UTC), OrderedDict(b=1), {1: "int key"}]
)
_JSON = st.recursive(
    _SCALARS | _ODD,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=12,
)
_NAMES = st.sampled_from(
    [
        *("occurred_at", "actor", "producer", "machine_name", "event_id", "event_type"),
        *("outcome", "correlation_id", "state_before", "state_after", "prev_hash"),
        *("machine", "event"),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    extra=st.dictionaries(_NAMES, _JSON, max_size=5),
    body=st.dictionaries(
        st.sampled_from(["decided_at", "outcome", "event", "machine", "errors", "x"]),
        _JSON,
        max_size=5,
    ),
    outcome=st.sampled_from([None, "transitioned", "rejected", "refused", 7]),
    kind=st.sampled_from(["decision", "dead-letter", "lineage"]),
)
def test_the_published_json_is_exactly_the_sorted_compact_dump_of_the_event(
    extra: dict[str, Any], body: dict[str, Any], outcome: Any, kind: str
) -> None:
    record = {
        **_chain(kind=kind, occurred_at="2026-11-30T03:00:00+01:00"),
        **extra,
        "record": {**body, "outcome": outcome},
    }
    try:
        expected: bytes | str = json.dumps(audit_to_ocsf(record), **_COMPACT).encode("utf-8")
    except (WireError, TypeError, ValueError) as exc:
        expected = f"{type(exc).__name__}: {exc}"
    try:
        published: bytes | str = audit_to_ocsf_json(record)
    except (WireError, TypeError, ValueError) as exc:
        published = f"{type(exc).__name__}: {exc}"
    assert published == expected


def test_the_published_json_of_a_ledger_decision_is_the_sorted_compact_dump() -> None:
    record = _chain(
        prev_hash="h1",
        record={
            "decided_at": "2026-11-30T03:00:00+00:00",
            "event": {"id": "e-1", "type": "TOOL_TIMEOUT", "producer": "tool-1"},
            "machine": {"name": "email-send", "version": "1.0.0", "digest": "sha256:aa"},
            "outcome": "transitioned",
            "state_before": "failure-reported",
            "state_after": "verifying",
            "invocations": [{"params": {"b": 1, "a": [1.5, None, True]}}],
        },
    )
    published = audit_to_ocsf_json(record)
    assert published == json.dumps(audit_to_ocsf(record), **_COMPACT).encode("utf-8")
    assert json.loads(published)["unmapped"]["recovery"]["record"] == record["record"]
