"""Strict envelopes (SPEC §6.2): every field required, non-empty, bounded, formatted; the
event time inside a sane window; the correlation id the operation's own."""

from __future__ import annotations

from dataclasses import replace

import pytest
from core_support import T0, event, machine, policy, registry, view

from machines.batch import OperationSetup, open_view
from machines.decision import Outcome, decide
from machines.event import EVENT_TIME_WINDOW, EventError, parse_event


def _lineage(**change: object) -> dict[str, object]:
    data = dict(event("TOOL_TIMEOUT").to_dict()["lineage"])
    data.update(change)
    return data


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"event_id": ""}, "envelope-field-invalid"),
        ({"operation_id": "   "}, "envelope-field-invalid"),
        ({"correlation_id": ""}, "envelope-field-invalid"),
        ({"producer": ""}, "envelope-field-invalid"),
        ({"producer": "tool integration"}, "envelope-field-invalid"),
        ({"evidence_ref": ""}, "envelope-field-invalid"),
        ({"evidence_ref": "  "}, "envelope-field-invalid"),
        ({"evidence_ref": " ev://padded"}, "envelope-field-invalid"),
        ({"evidence_ref": "ev://a\nb"}, "envelope-field-invalid"),
        ({"evidence_ref": "ev://" + "x" * 5000}, "envelope-field-invalid"),
        ({"machine_name": ""}, "envelope-field-invalid"),
        ({"machine_version": "1.0.0\n"}, "envelope-field-invalid"),
        ({"event_id": "e" * 300}, "envelope-field-invalid"),
        ({"event_id": "e\x00"}, "envelope-field-invalid"),
        ({"causation": ""}, "envelope-field-invalid"),
        ({"event_type": "TOOL-TIMEOUT"}, "envelope-invalid"),
        ({"lineage": _lineage(agent="")}, "envelope-field-invalid"),
        ({"lineage": _lineage(task="")}, "envelope-field-invalid"),
        ({"lineage": _lineage(initiating_principal=" ")}, "envelope-field-invalid"),
        ({"lineage": _lineage(parent_operation="")}, "envelope-field-invalid"),
        ({"event_time": "9999-12-31T23:59:59+00:00"}, "event-time-out-of-range"),
        ({"event_time": "1970-01-01T00:00:00+00:00"}, "event-time-out-of-range"),
    ],
)
def test_an_envelope_field_that_is_empty_unbounded_or_malformed_is_refused(change, code):  # type: ignore[no-untyped-def]
    data = dict(event("TOOL_TIMEOUT").to_dict(), **change)
    with pytest.raises(EventError) as caught:
        parse_event(data)
    assert caught.value.code == code
    assert "event" in str(caught.value)


def test_a_well_formed_envelope_parses():
    e = event("TOOL_TIMEOUT", causation="op-1:2:0")
    assert parse_event(e.to_dict()) == e
    note = replace(e, evidence_ref="coupa:request:REQ-1 (12 laptops)", payload_digest="")
    assert parse_event(note.to_dict()) == note


def test_the_window_is_wide_enough_for_every_deadline():
    low, high = EVENT_TIME_WINDOW
    assert low.year == 2000
    assert high.year == 2200


def test_an_event_with_another_correlation_id_is_refused():
    v = replace(view(), correlation_id="corr-1")
    other = replace(event("TOOL_TIMEOUT"), correlation_id="corr-2", payload_digest="")
    d = decide(machine(), v, other, policy(), registry(), T0)
    assert d.outcome is Outcome.REFUSED
    assert [n.code for n in d.refusals] == ["correlation-mismatch"]
    assert d.state_after == v.state
    same = decide(machine(), v, event("TOOL_TIMEOUT"), policy(), registry(), T0)
    assert same.outcome is Outcome.TRANSITIONED


def test_an_opened_operation_keeps_its_first_events_correlation_id():
    opened = open_view(
        machine(), policy(), OperationSetup("op-1", "agent-1", correlation_id="c-9"), T0
    )
    assert opened.correlation_id == "c-9"
