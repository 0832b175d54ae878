"""`audit.redact` and `audit.record` over every catalogue machine (SPEC §10, issue #16
class 9): an accepted event's payload is redacted before anything keeps it, kept only
when its category is recorded, else referenced by a digest of the redacted payload; no
digest of a redacted value survives, not even the event's own payload digest."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machines import (
    CATALOGUE,
    AuditSpec,
    Machine,
    canonical_json,
    load_catalogue,
    load_registry,
    minimize_event,
    payload_category,
    redact,
)
from machines.event import (
    ClassifierOutput,
    Event,
    EvidencePayload,
    HumanDecision,
    Lineage,
    sha256_digest,
)

MACHINES = sorted(load_catalogue(load_registry(), CATALOGUE).values(), key=lambda m: m.name)
SECRET = "SECRET-7F3A"  # no generated text holds an upper-case letter
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

# Plain JSON values without the secret: lower-case text, numbers, nesting.
_TEXT = st.text(alphabet="abcdefghij-_ .@", max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_SECRETS = st.sampled_from(
    [SECRET, {"inner": SECRET}, [SECRET, "x"], [{"deep": SECRET}], 4242]
)  # 4242 stands for a low-entropy value (the last four digits of a card)


def _event(kind: str, machine: Machine, payload: dict[str, Any]) -> Event:
    blocks: dict[str, Any] = {}
    if kind == "approval_context":
        blocks["human_decision"] = HumanDecision(
            approver="approver-1",
            operation_id="op-1",
            state="s",
            transition="t",
            machine_digest=machine.digest,
            expires_at=T0,
            nonce="n-1",
            decision="approved",
        )
    elif kind == "evidence_payloads":
        blocks["evidence"] = EvidencePayload(outcome="applied", verifier="verifier-1")
    elif kind == "action_results":
        blocks["causation"] = "cmd:op-1:1:0"
    elif kind == "classifier_outputs":
        blocks["classifier"] = ClassifierOutput(
            identity="clf", version="1", question="q", probabilities={"yes": 0.5}
        )
    return Event(
        event_type="TOOL_TIMEOUT",
        event_id="e-1",
        operation_id="op-1",
        correlation_id="c-1",
        machine_name=machine.name,
        machine_version=machine.version,
        event_time=T0,
        evidence_ref="ref-1",
        producer="tool-1",
        lineage=Lineage(agent="agent-1", task="task-1", initiating_principal="alice"),
        payload=payload,
        **blocks,
    )


CATEGORIES = (
    "approval_context",
    "evidence_payloads",
    "action_results",
    "classifier_outputs",
    "downstream_references",
)


@settings(max_examples=300, deadline=None)
@given(
    machine=st.sampled_from(MACHINES),
    kind=st.sampled_from(CATEGORIES),
    rest=st.dictionaries(_TEXT.filter(lambda k: k != ""), _JSON, max_size=4),
    secrets=st.data(),
)
def test_no_redacted_value_survives_minimization_and_only_recorded_payloads_are_kept(
    machine: Machine, kind: str, rest: dict[str, Any], secrets: st.DataObject
) -> None:
    fields = [path.split(".", 1)[1] for path in machine.audit.redact]
    assert fields, f"{machine.name} redacts nothing; the catalogue should show redaction"
    planted = {f: secrets.draw(_SECRETS, label=f) for f in fields}
    payload = {**rest, **planted}
    raw = _event(kind, machine, payload)
    assert payload_category(raw) == kind
    kept = minimize_event(machine.audit, raw)
    text = canonical_json(kept.to_dict()).decode("utf-8")
    assert SECRET not in text
    # The event's digest is over what is kept: no digest of a redacted value remains.
    assert kept.payload_digest == sha256_digest(kept.content())
    assert kept.payload_digest != raw.payload_digest
    redacted = {**rest, **{f: {"redacted": True} for f in fields}}
    if kind in machine.audit.record:
        assert kept.payload == redacted
    else:
        assert kept.payload == {
            "omitted": True,
            "category": kind,
            "digest": sha256_digest(redacted),
        }
        # Outside the digests, whose hex may hold those four digits by chance.
        assert "4242" not in re.sub(r"sha256:[0-9a-f]{64}", "sha256:-", text)
    # Minimizing what intake kept changes nothing (replays and redrives are stable).
    assert minimize_event(machine.audit, kept) == kept
    # Everything else of the event is as it was.
    assert replace(kept, payload=raw.payload, payload_digest="") == raw


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_an_event_without_payload_keeps_its_digest(machine: Machine) -> None:
    raw = replace(_event("downstream_references", machine, {}), payload=None, payload_digest="")
    assert minimize_event(machine.audit, raw) is raw


def test_redaction_follows_a_path_through_lists_of_objects() -> None:
    audit = AuditSpec(retention_days=1, redact=("payload.recipients.email",))
    payload = {"recipients": [{"email": SECRET, "id": 1}, {"email": SECRET}, "bare"], "n": 2}
    assert redact(audit, payload) == {
        "recipients": [
            {"email": {"redacted": True}, "id": 1},
            {"email": {"redacted": True}},
            "bare",
        ],
        "n": 2,
    }
    assert payload["recipients"][0]["email"] == SECRET  # the input is not modified
