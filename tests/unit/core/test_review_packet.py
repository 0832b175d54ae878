"""The review packet (SPEC §9): assembled purely, both consequences decided by the core,
and a digest that moves exactly when what the reviewer sees moves."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from machines import (
    CATALOGUE,
    DEFAULT_REGISTRY,
    Event,
    Lineage,
    Machine,
    OperationSetup,
    OperationView,
    Policy,
    Registry,
    ReviewPacket,
    apply,
    awaits_human,
    decide,
    load_machine,
    load_registry,
    review_digest,
    review_packet,
)
from machines.batch import open_view
from machines.review import packet_digest

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
OP = "op-review"
LINEAGE = Lineage(agent="agent-9", task="task-9", initiating_principal="alice")


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry(DEFAULT_REGISTRY)


@pytest.fixture(scope="module")
def email(registry: Registry) -> Machine:
    return load_machine(Path(CATALOGUE) / "email-send", registry)


def _event(machine: Machine, event_type: str, event_id: str, at: datetime) -> Event:
    return Event(
        event_type=event_type,
        event_id=event_id,
        operation_id=OP,
        correlation_id="corr-review",
        machine_name=machine.name,
        machine_version=machine.version,
        event_time=at,
        evidence_ref=f"ref-{event_id}",
        producer="smtp-relay",
        lineage=LINEAGE,
    )


def _operation() -> dict[str, Any]:
    return {
        "operation_id": OP,
        "correlation_id": "corr-review",
        "initiating_principal": "alice",
        "agent": "agent-9",
        "runtime": None,
        "task": "task-9",
        "origin_operation": None,
        "parent_operation": None,
        "depth": 0,
        "delegated_credentials": [],
        "policy_digest": Policy(id="default").digest,
    }


def _escalated(
    machine: Machine, registry: Registry, policy: Policy
) -> tuple[OperationView, list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    view = open_view(machine, policy, OperationSetup(operation_id=OP, agent="agent-9"), T0)
    timeout = _event(machine, "TOOL_TIMEOUT", "evt-1", T0)
    decision = decide(machine, view, timeout, policy, registry, T0)
    return apply(view, decision), [timeout.to_dict()], [decision.to_dict()]


def _packet(
    machine: Machine, registry: Registry, now: datetime = T0, extra: int = 0
) -> ReviewPacket:
    policy = Policy(id="default")
    view, events, decisions = _escalated(machine, registry, policy)
    for n in range(extra):
        # An event the state does not accept: recorded as a rejection, state unchanged.
        late = _event(machine, "STEP_COMPLETED", f"evt-late-{n}", T0)
        decision = decide(machine, view, late, policy, registry, T0)
        view = apply(view, decision)
        events.append(late.to_dict())
        decisions.append(decision.to_dict())
    return review_packet(
        machine=machine,
        policy=policy,
        registry=registry,
        view=view,
        operation=_operation(),
        events=events,
        decisions=decisions,
        now=now,
    )


def test_escalated_email_packet_decides_both_consequences_through_the_core(
    email: Machine, registry: Registry
) -> None:
    packet = _packet(email, registry)
    content = packet.content
    assert content["current_state"]["name"] == "unresolved"
    assert content["triggering_event"]["event_id"] == "evt-1"
    assert content["initiating_request"]["audit_redact"] == [
        "payload.body",
        "payload.recipients",
        "payload.subject",
    ]
    approve, reject = content["consequences"]["approve"], content["consequences"]["reject"]
    assert (approve["outcome"], approve["state_after"]) == ("transitioned", "resume-pending")
    assert [g["guard"] for g in approve["guards"]] == ["approval.granted"]
    assert approve["commands"] == []
    assert (reject["outcome"], reject["state_after"]) == ("transitioned", "containing")
    assert [c["capability"] for c in reject["commands"]] == [
        "agent.stop-task",
        "credentials.revoke-delegation",
    ]
    view, _, _ = _escalated(email, registry, Policy(id="default"))
    assert packet.proposal("HUMAN_APPROVED") == {
        "state": "unresolved",
        "transition": "resume-pending",
        # What the approver signs; the controller recomputes it from its own view.
        "reviewed_digest": review_digest(view, "resume-pending", T0),
        "guard": "approval.granted",
        "actions": [],
    }
    assert packet.proposal("HUMAN_REJECTED")["transition"] == "containing"  # type: ignore[index]
    commands = content["downstream"]["commands"]
    assert [c["capability"] for c in commands] == ["email.quarantine-outbox", "human.escalate"]
    assert content["identities"]["agent"] == "agent-9"
    assert [h["state_after"] for h in content["history"]] == ["unresolved"]


def test_digest_ignores_when_it_was_assembled_and_follows_the_ledger(
    email: Machine, registry: Registry
) -> None:
    first = _packet(email, registry)
    later = _packet(email, registry, now=T0 + timedelta(minutes=5))
    assert first.digest == later.digest
    assert first.assembled_at != later.assembled_at
    moved = _packet(email, registry, extra=1)
    assert moved.digest != first.digest
    shown = first.to_dict()
    assert shown["digest"] == first.digest
    body = {k: v for k, v in shown.items() if k not in {"digest", "assembled_at"}}
    assert packet_digest(body) == first.digest


def test_a_state_without_human_events_has_no_consequences(
    email: Machine, registry: Registry
) -> None:
    policy = Policy(id="default")
    view = open_view(email, policy, OperationSetup(operation_id=OP, agent="agent-9"), T0)
    assert not awaits_human(email, view.state, registry)
    assert awaits_human(email, "unresolved", registry)
    assert awaits_human(email, "contained", registry)
    # Entered through human.escalate after failed containment; only a rejection leaves.
    assert awaits_human(email, "containment-escalated", registry)
    # The resume gate: a human may still reject, but it waits for RESUME_REQUESTED.
    assert not awaits_human(email, "resume-pending", registry)
    assert not awaits_human(email, "resumed", registry)
    packet = review_packet(
        machine=email,
        policy=policy,
        registry=registry,
        view=view,
        operation=_operation(),
        events=[],
        decisions=[],
        now=T0,
    )
    assert packet.content["consequences"] == {"approve": None, "reject": None}
    assert packet.content["proposed_action"] == {}
    assert packet.content["triggering_event"] is None


def test_policy_without_approval_roles_shows_the_refusal(
    email: Machine, registry: Registry
) -> None:
    policy = Policy(id="no-approvers", approval_roles=())
    view, events, decisions = _escalated(email, registry, policy)
    packet = review_packet(
        machine=email,
        policy=policy,
        registry=registry,
        view=view,
        operation=_operation(),
        events=events,
        decisions=decisions,
        now=T0,
    )
    approve = packet.content["consequences"]["approve"]
    assert approve["outcome"] == "refused"
    assert approve["state_after"] == "unresolved"
    assert [r["code"] for r in approve["refusals"]] == ["approval-role-not-permitted"]


def test_packet_shows_which_containment_actions_are_still_unanswered(
    email: Machine, registry: Registry
) -> None:
    # SPEC 7.3: a containment waits for its stop and its revocation; after the stop's
    # success the packet names the revocation as unanswered, and the stop as answered.
    policy = Policy(id="default")
    view = open_view(
        email, policy, OperationSetup(operation_id=OP, agent="agent-9", state="containing"), T0
    )
    view = replace(
        view,
        open_commands=frozenset({f"{OP}:1:0", f"{OP}:1:1"}),
        awaiting=frozenset({f"{OP}:1:0", f"{OP}:1:1"}),
        command_capabilities=(
            (f"{OP}:1:0", "agent.stop-task"),
            (f"{OP}:1:1", "credentials.revoke-delegation"),
        ),
        version=1,
    )
    stopped = replace(_event(email, "CONTAINMENT_SUCCEEDED", "evt-2", T0), causation=f"{OP}:1:0")
    decision = decide(email, view, stopped, policy, registry, T0)
    assert decision.outcome.value == "awaiting"
    view = apply(view, decision)
    issued = {
        "operation_id": OP,
        "sequence": 1,
        "outcome": "transitioned",
        "state_before": "unresolved",
        "state_after": "containing",
        "decided_at": T0.isoformat(),
        "guards": [],
        "refusals": [],
        "event": {
            "id": "evt-1",
            "type": "HUMAN_REJECTED",
            "producer": "approver-1",
            "evidence_ref": "r",
            "causation": None,
        },
        "invocations": [
            {
                "command_id": f"{OP}:1:0",
                "capability": "agent.stop-task",
                "kind": "stop",
                "params": {},
            },
            {
                "command_id": f"{OP}:1:1",
                "capability": "credentials.revoke-delegation",
                "kind": "revoke",
                "params": {},
            },
        ],
    }
    packet = review_packet(
        machine=email,
        policy=policy,
        registry=registry,
        view=view,
        operation=_operation(),
        events=[stopped.to_dict()],
        decisions=[issued, decision.to_dict()],
        now=T0,
    )
    assert packet.content["current_state"]["awaiting"] == [
        {"command_id": f"{OP}:1:1", "capability": "credentials.revoke-delegation", "kind": "revoke"}
    ]
    answered = {
        c["command_id"]: (c["answered_by"], c["result"])
        for c in packet.content["downstream"]["commands"]
    }
    assert answered == {
        f"{OP}:1:0": ("evt-2", "CONTAINMENT_SUCCEEDED"),
        f"{OP}:1:1": (None, None),
    }
