"""The demo's incident replayed through the decision core, without services: each
scenario's first event, the example worker's answers, the approver's signed decisions
and the timers due as a minute passes drive the pinned catalogue machine under the demo
policy along exactly the path and commands `recoveryctl demo` expects."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from machines import DEFAULT_REGISTRY, load_policy, load_registry
from machines.approvals import insecure_test_key, public_key_b64, review_digest, sign_decision
from machines.decision import Decision
from machines.event import Event, EvidencePayload, HumanDecision, Lineage
from machines.model import Machine
from machines.provenance import load_locked_machines, load_trusted_publishers
from machines.simulation import Simulation
from ops.demo_scenarios import (
    APPROVER,
    DEMO_HANDLERS,
    DEMO_POLICY,
    SCENARIOS,
    Scenario,
    operation_id_for,
)
from producers import RESULT_EVENTS
from schemas import CapabilityCommand

_NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
_VERIFY = {"applied": "VERIFICATION_FOUND", "not_applied": "VERIFICATION_NOT_FOUND"}


def _machines() -> dict[str, Machine]:
    folder = Path(DEFAULT_REGISTRY).parent
    registry = load_registry(DEFAULT_REGISTRY)
    trust = load_trusted_publishers(folder / "trusted-publishers.yaml")
    pinned = load_locked_machines(folder / "machines.lock", registry, trust)
    return {m.name: m for m in pinned.values()}


class _Incident:
    """One scenario's operation in a simulation, fed like the live demo feeds it."""

    def __init__(self, scenario: Scenario) -> None:
        machine = _machines()[scenario.machine]
        self.machine = machine
        self.scenario = scenario
        registry = load_registry(DEFAULT_REGISTRY)
        self.sim = Simulation(machine, registry, load_policy(DEMO_POLICY))
        self.op = operation_id_for(scenario, "unit")
        parent = "op-parent" if scenario.parent else None
        self.lineage = Lineage(
            agent=scenario.agent,
            task="t",
            initiating_principal="oncall-sam",
            origin_operation=parent,
            parent_operation=parent,
        )
        self.decisions: list[Decision] = []
        self.commands: list[str] = []
        self._n = 0
        self.now = _NOW

    def feed(self, event_type: str, producer: str = "demo", **extra: object) -> Decision:
        self._n += 1
        event = Event(
            event_type=event_type,
            event_id=f"e{self._n}",
            operation_id=self.op,
            correlation_id="c",
            machine_name=self.machine.name,
            machine_version=self.machine.version,
            event_time=self.now,
            evidence_ref="r",
            producer=producer,
            lineage=self.lineage,
            **extra,  # type: ignore[arg-type]
        )
        decision = self.sim.feed(event, self.now)
        self._took(decision)
        return decision

    def wait(self, seconds: int) -> None:
        """Let `seconds` pass: the timers due by then fire, as the controller's would."""
        self.now += timedelta(seconds=seconds)
        for decision in self.sim.advance(self.now):
            self._took(decision)

    def _took(self, decision: Decision) -> None:
        self.decisions.append(decision)
        pending = list(decision.invocations)
        self.commands.extend(i.capability for i in pending)
        for invocation in pending:
            self._work(invocation.command_id, invocation.capability, invocation.kind)

    def _work(self, command_id: str, capability: str, kind: str) -> None:
        """What the example worker reports for one command."""
        handler = DEMO_HANDLERS.get(capability)
        if handler is None:
            return
        command = CapabilityCommand(
            command_id=command_id,
            capability=capability,
            kind=kind,
            material=False,
            params={},
            origin="transition",
            operation_id=self.op,
            correlation_id="c",
            causation_event_id="e",
            machine_name="m",
            machine_version="1",
            machine_digest="d",
            sequence=1,
            lineage=self.lineage,
            issued_at=_NOW,
        )
        result = handler(command)
        if result is None:
            return
        if kind == "verify":
            assert result.evidence is not None
            self.feed(
                _VERIFY[str(result.evidence.outcome)],
                # The client library names the reporting worker as the verifier.
                "demo-worker",
                evidence=replace(result.evidence, verifier="demo-worker"),
                causation=command_id,
            )
        else:
            success, failure = RESULT_EVENTS[kind]
            self.feed(success if result.succeeded else failure, "demo-worker", causation=command_id)

    def decide_as_human(self, verdict: str, target: str) -> None:
        decision = sign_decision(
            HumanDecision(
                approver=APPROVER,
                operation_id=self.op,
                state=self.state,
                transition=target,
                machine_digest=self.machine.digest,
                expires_at=self.now + timedelta(minutes=30),
                nonce=f"n-{self._n}",
                decision="approved" if verdict == "approve" else "rejected",
                reviewed_digest=review_digest(self.sim.views[self.op], target, self.now),
            ),
            insecure_test_key(APPROVER),
        )
        self.feed(
            "HUMAN_APPROVED" if verdict == "approve" else "HUMAN_REJECTED", human_decision=decision
        )

    @property
    def state(self) -> str:
        return self.sim.views[self.op].state

    @property
    def path(self) -> tuple[str, ...]:
        moved = [d.state_after for d in self.decisions if d.state_after != d.state_before]
        return (self.decisions[0].state_before, *moved)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_the_core_takes_each_demo_operation_along_its_expected_path(scenario: Scenario) -> None:
    incident = _Incident(scenario)
    first: dict[str, object] = {"scope": scenario.scope, "facts": scenario.facts}
    if scenario.parent:
        first["evidence"] = EvidencePayload(ancestor_operation="op-parent")
    incident.feed(scenario.first_event, **first)
    for _ in range(len(scenario.reactions) + 1):
        incident.wait(60)  # paced retries and the demo's short timeouts fall due
        for reaction in scenario.reactions:
            if reaction.when == incident.state:
                if reaction.kind == "report":
                    incident.feed(reaction.event_type)
                else:
                    incident.decide_as_human(reaction.kind, reaction.target)

    assert incident.path == scenario.path
    assert Counter(incident.commands) == Counter(scenario.commands)


def test_the_demo_policy_names_the_approver_with_its_test_key() -> None:
    entry = load_policy(DEMO_POLICY).approver(APPROVER)
    assert entry is not None
    assert entry.public_key == public_key_b64(insecure_test_key(APPROVER))
