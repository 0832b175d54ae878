"""The classifier boundary and the validated event value."""

from __future__ import annotations

import pytest
from core_support import T0, classified, event, machine, policy, registry, view

from machines.decision import Outcome, decide
from machines.event import EventError, parse_event


def _decide(e):  # type: ignore[no-untyped-def]
    return decide(machine(), view(), e, policy(), registry(), T0)


@pytest.mark.parametrize(
    ("probabilities", "candidate", "code"),
    [
        ({}, "TOOL_TIMEOUT", "classifier-missing-output"),
        ({"TOOL_TIMEOUT": 0.9}, None, "classifier-missing-output"),
        ({"TOOL_TIMEOUT": 0.7, "TOOL_FAILED": 0.1}, "TOOL_TIMEOUT", "classifier-low-confidence"),
        ({"TOOL_TIMEOUT": 0.5, "TOOL_FAILED": 0.45}, "TOOL_TIMEOUT", "classifier-conflicting"),
        ({"TOOL_TIMEOUT": 0.02, "TOOL_FAILED": 0.97}, "TOOL_TIMEOUT", "classifier-conflicting"),
        ({"TOOL_TIMEOUT": 1.7}, "TOOL_TIMEOUT", "classifier-malformed"),
    ],
)
def test_classifier_output_fails_closed(probabilities, candidate, code):  # type: ignore[no-untyped-def]
    d = _decide(classified("TOOL_TIMEOUT", probabilities, candidate))
    assert d.outcome is Outcome.REFUSED
    assert d.refusals[0].code == code
    assert d.state_after == "running"
    assert d.classifier is not None
    assert d.classifier.admitted is False


def test_classifier_cannot_propose_an_event_outside_its_allowed_set():
    d = _decide(classified("STEP_COMPLETED", {"STEP_COMPLETED": 0.99}, "STEP_COMPLETED"))
    assert d.refusals[0].code == "classifier-event-not-allowed"


def test_confident_classifier_candidate_is_decided_like_any_event_and_recorded():
    d = _decide(
        classified("TOOL_TIMEOUT", {"TOOL_TIMEOUT": 0.96, "TOOL_FAILED": 0.03}, "TOOL_TIMEOUT")
    )
    assert d.outcome is Outcome.TRANSITIONED
    assert d.classifier is not None
    assert d.classifier.admitted
    record = d.to_dict()["classifier"]
    assert record["identity"] == "clf"
    assert record["probabilities"] == {"TOOL_FAILED": 0.03, "TOOL_TIMEOUT": 0.96}
    assert all("clf" not in ref for g in d.guards for ref in g.evidence)


def test_parse_event_recomputes_the_digest_from_content():
    e = event("TOOL_TIMEOUT")
    data = e.to_dict()
    data["payload_digest"] = "sha256:forged"
    parsed = parse_event(data)
    assert parsed == e
    assert parsed.payload_digest == e.payload_digest
    changed = dict(data, producer="someone-else")
    assert parse_event(changed).payload_digest != e.payload_digest


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"event_type": "tool_timeout"}, "uppercase"),
        ({"event_time": "2026-01-01T00:00:00"}, "timezone"),
        ({"surprise": 1}, "surprise"),
        ({"lineage": None}, "lineage"),
    ],
)
def test_parse_event_refuses_invalid_envelopes(change, match):  # type: ignore[no-untyped-def]
    data = dict(event("TOOL_TIMEOUT").to_dict(), **change)
    with pytest.raises(EventError, match=match):
        parse_event(data)
