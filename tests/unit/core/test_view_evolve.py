"""`machines.view.evolve` is `dataclasses.replace` for operation views, made faster for
the fold; these tests hold it to `replace`."""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest

from machines.view import KeyClaim, LineageStatus, OperationView, Timer, ToolFacts, evolve

BASE = OperationView(
    operation_id="op-1",
    machine_name="email-send",
    machine_digest="sha256:aa",
    policy_digest="sha256:bb",
    state="failure-reported",
    lineage=LineageStatus(agent="agent-1", lineage_agents=frozenset({"agent-0"})),
    facts=ToolFacts(idempotency_key="k-1"),
    version=3,
    epoch=1,
    budget_limit=5,
    deadline=datetime(2026, 1, 1, tzinfo=UTC),
    open_commands=frozenset({"op-1:3:0"}),
    seen_events=MappingProxyType({"e-1": "sha256:cc"}),
    capability="email.send",
    tool="smtp",
    environment="prod",
    command_capabilities=(("op-1:3:0", "agent.stop-task"),),
    opened_by="tool-1",
    agent_proof="grant",
)

# A new value for every field, so each one is checked to land where it belongs.
NEW: dict[str, Any] = {
    "operation_id": "op-2",
    "machine_name": "payment-refund",
    "machine_digest": "sha256:dd",
    "policy_digest": "sha256:ee",
    "state": "unresolved",
    "lineage": LineageStatus(agent="agent-2"),
    "facts": ToolFacts(status_api=True),
    "version": 4,
    "epoch": 2,
    "verifications": (),
    "retry_attempts": 1,
    "recovery_attempts": 2,
    "budget_limit": 6,
    "budget_spent": 1,
    "deadline": None,
    "approvals": (),
    "used_nonces": frozenset({"n-1"}),
    "checkpoints": (),
    "entry_approval": "e-9",
    "open_commands": frozenset(),
    "seen_events": MappingProxyType({}),
    "correlation_id": "corr-2",
    "command_epochs": (("op-2:1:0", 1),),
    "escalations": (("no-transition", 2),),
    "capability": "payment.refund",
    "tool": "stripe",
    "environment": "staging",
    "command_capabilities": (),
    "denials": ("e-5",),
    "awaiting": frozenset({"op-2:1:0"}),
    "principal": "bob",
    "task": "task-2",
    "runtime": "runtime-2",
    "key_owner": KeyClaim("op-9", "sha256:ff"),
    "credentials": ("cred-9",),
    "revoked": True,
    "stopped": True,
    "opened_by": "tool-9",
    "agent_proof": "call-context:runtime-1",
    "machine_version": "2.0.0",
    "timers": (
        Timer(
            "timer:op-2:4:stalled",
            "stalled",
            "unresolved",
            4,
            datetime(2026, 1, 1, tzinfo=UTC),
            datetime(2026, 1, 1, 1, tzinfo=UTC),
            "STATE_STALLED",
        ),
    ),
    "retry_not_before": datetime(2026, 1, 1, 0, 5, tzinfo=UTC),
}


def test_every_field_of_the_view_has_a_new_value_in_this_test() -> None:
    assert set(NEW) == {f.name for f in fields(OperationView)}


@pytest.mark.parametrize("name", sorted(NEW))
def test_evolve_changes_one_field_exactly_as_replace_does(name: str) -> None:
    changed = evolve(BASE, {name: NEW[name]})
    assert changed == replace(BASE, **{name: NEW[name]})
    assert getattr(changed, name) is NEW[name]


def test_evolve_changes_every_field_at_once_and_leaves_the_original_alone() -> None:
    assert evolve(BASE, NEW) == OperationView(**NEW)
    assert BASE.state == "failure-reported"


def test_evolve_without_changes_is_an_equal_copy() -> None:
    assert evolve(BASE, {}) == BASE


def test_evolve_refuses_a_name_that_is_not_a_field() -> None:
    with pytest.raises(TypeError, match="no field"):
        evolve(BASE, {"stat": "unresolved"})
