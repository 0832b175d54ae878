"""Declared tool facts (CONFORMANCE Level 2, SPEC §7.7): who may declare them, when, and
that they never change once declared; and that a declaration is what lets a retry fire.

Driven through `Simulation.feed`, the same `decide`/`apply` the controller runs, on the
catalogue's procurement-request machine (its retry needs an idempotency key).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from machines.casefile import (
    DEFAULT_PRODUCER,
    CaseSpec,
    FactsSpec,
    OperationSpec,
    StepSpec,
    _Runner,
    run_case,
)
from machines.decision import Decision, Outcome
from machines.event import DeclaredFacts, Event, EvidencePayload, Lineage
from machines.facts import FACTS_IMMUTABLE, FACTS_UNTRUSTED, admit_facts, declare
from machines.loader import load_catalogue
from machines.model import Machine, Registry
from machines.policy import Policy, RetryPacing
from machines.registry import load_registry
from machines.simulation import OperationSetup, Simulation
from machines.view import ToolFacts

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
AGENT = "agent-buyer"
TOOL = "coupa-integration"
VERIFIER = "verifier-1"
OP = "op-pr-1"
KEYED = DeclaredFacts(idempotency_key="pr-key-1", status_api=True)
# Retries go out at once: these tests are about the declared key, not pacing.
POLICY = Policy(id="facts-unit", trusted_verifiers=(VERIFIER,), retry_pacing=RetryPacing(base=0))


@cache
def _procurement() -> tuple[Machine, Registry]:
    registry = load_registry()
    machine = next(m for m in load_catalogue(registry).values() if m.name == "procurement-request")
    return machine, registry


def _sim() -> Simulation:
    machine, registry = _procurement()
    return Simulation(machine, registry, POLICY)


def _event(event_type: str, n: int, *, producer: str = TOOL, **fields: Any) -> Event:
    machine, _ = _procurement()
    return Event(
        event_type=event_type,
        event_id=f"e{n}",
        operation_id=OP,
        correlation_id="corr-1",
        machine_name=machine.name,
        machine_version=machine.version,
        event_time=T0 + timedelta(seconds=n),
        evidence_ref=f"ref-{n}",
        producer=producer,
        lineage=Lineage(agent=AGENT, task="task-1", initiating_principal="alice"),
        **fields,
    )


def _not_found(n: int, **fields: Any) -> Event:
    evidence = EvidencePayload(outcome="not_applied", verifier=VERIFIER, reference=f"v-{n}")
    return _event("VERIFICATION_NOT_FOUND", n, producer=VERIFIER, evidence=evidence, **fields)


def _feed(sim: Simulation, event: Event) -> Decision:
    return sim.feed(event, event.event_time)


def _codes(decision: Decision) -> list[str]:
    return [n.code for n in decision.refusals]


def test_facts_on_the_opening_event_are_declared_and_let_the_retry_fire() -> None:
    sim = _sim()
    opened = _feed(sim, _event("TOOL_TIMEOUT", 1, facts=KEYED))
    assert opened.outcome is Outcome.TRANSITIONED
    assert sim.views[OP].facts == declare(KEYED, TOOL)
    assert opened.evidence.to_dict()["facts"]["idempotency_key"] == "pr-key-1"

    retry = _feed(sim, _not_found(2))

    assert retry.state_after == "retrying"
    assert retry.capabilities == ("procurement.create-request",)


def test_without_declared_facts_the_same_stream_escalates_instead_of_retrying() -> None:
    sim = _sim()
    _feed(sim, _event("TOOL_TIMEOUT", 1))
    decision = _feed(sim, _not_found(2))
    assert decision.state_after == "escalated"
    assert sim.views[OP].facts == ToolFacts()


def test_the_affected_agent_cannot_declare_facts_even_on_the_opening_event() -> None:
    sim = _sim()
    decision = _feed(sim, _event("TOOL_TIMEOUT", 1, producer=AGENT, facts=KEYED))
    assert decision.outcome is Outcome.REFUSED
    assert _codes(decision) == [FACTS_UNTRUSTED]
    assert sim.views[OP].facts == ToolFacts()


def test_an_untrusted_producer_cannot_declare_facts_after_the_operation_opened() -> None:
    sim = _sim()
    _feed(sim, _event("TOOL_TIMEOUT", 1))
    decision = _feed(sim, _event("TOOL_FAILED", 2, facts=KEYED))
    assert decision.outcome is Outcome.REFUSED
    assert _codes(decision) == [FACTS_UNTRUSTED]
    assert sim.views[OP].facts.declared_by is None


def test_a_trusted_verifier_may_declare_facts_later_but_its_key_never_authorises_a_retry() -> None:
    sim = _sim()
    _feed(sim, _event("TOOL_TIMEOUT", 1))
    decision = _feed(sim, _not_found(2, facts=KEYED))
    # Its facts count for the very decision that carries them, but a key declared after
    # the failure report is not the original call's (issue #16 class 2).
    assert decision.state_after != "retrying"
    assert sim.views[OP].facts == replace(declare(KEYED, VERIFIER), key_declared_late=True)
    assert decision.evidence.to_dict()["facts"]["key_declared_late"] is True
    retry = [g for g in decision.guards if g.guard == "retry.permitted"]
    assert retry
    assert retry[0].value is False
    assert "idempotency-key:declared-late" in retry[0].evidence


def test_the_retry_command_carries_exactly_the_declared_key() -> None:
    sim = _sim()
    _feed(sim, _event("TOOL_TIMEOUT", 1, facts=KEYED))
    decision = _feed(sim, _not_found(2))
    retries = [i for i in decision.invocations if i.kind == "retry"]
    assert [i.params["idempotency_key"] for i in retries] == [KEYED.idempotency_key]


def test_declared_facts_never_change_and_a_differing_declaration_is_refused() -> None:
    sim = _sim()
    _feed(sim, _event("TOOL_TIMEOUT", 1, facts=KEYED))
    other = DeclaredFacts(idempotency_key="another-key", side_effect_confirmed=True)
    decision = _feed(sim, _not_found(2, facts=other))
    assert decision.outcome is Outcome.REFUSED
    assert _codes(decision) == [FACTS_IMMUTABLE]
    assert sim.views[OP].facts == declare(KEYED, TOOL)


def test_repeating_the_declared_facts_is_accepted_and_changes_nothing() -> None:
    sim = _sim()
    _feed(sim, _event("TOOL_TIMEOUT", 1, facts=KEYED))
    decision = _feed(sim, _not_found(2, facts=KEYED))
    assert decision.state_after == "retrying"
    assert "facts" not in decision.evidence.to_dict()
    assert sim.views[OP].facts.declared_by == TOOL


def test_admit_facts_ignores_an_event_without_a_facts_block() -> None:
    sim = _sim()
    event = _event("TOOL_TIMEOUT", 1)
    view = sim.open(OperationSetup(operation_id=OP, agent=AGENT), T0)
    assert admit_facts(event, view, POLICY) == (None, None)


def test_case_file_facts_and_envelope_facts_declare_the_same_tool_facts() -> None:
    machine, registry = _procurement()
    spec = FactsSpec(idempotency_key="pr-key-1", status_api=True)
    runner = _Runner(_case(OperationSpec(id=OP, agent=AGENT, facts=spec)), machine, registry)
    assert runner.sim.views[OP].facts == declare(KEYED, DEFAULT_PRODUCER)


def test_a_case_file_without_facts_opens_with_nothing_declared() -> None:
    machine, registry = _procurement()
    runner = _Runner(_case(OperationSpec(id=OP, agent=AGENT)), machine, registry)
    assert runner.sim.views[OP].facts == ToolFacts()


def _case(operation: OperationSpec) -> CaseSpec:
    return CaseSpec(
        name="facts",
        scenario=("timeout before a side effect",),
        operation=operation,
        steps=(StepSpec(event="TOOL_TIMEOUT"),),
    )


def test_a_case_step_can_declare_facts_on_its_envelope_and_the_retry_fires() -> None:
    machine, registry = _procurement()
    case = CaseSpec.model_validate(
        {
            "name": "step facts",
            "scenario": "timeout before a side effect",
            "policy": {"trusted_verifiers": [VERIFIER], "retry_pacing": {"base": "0s"}},
            "steps": [
                {"event": "TOOL_TIMEOUT", "facts": {"idempotency_key": "k-1"}},
                {
                    "event": "VERIFICATION_NOT_FOUND",
                    "verification": {"verifier": VERIFIER, "outcome": "not_applied"},
                    "expect": {"state": "retrying"},
                },
                {
                    "event": "TOOL_TIMEOUT",
                    "producer": "agent-1",
                    "facts": {"idempotency_key": "k-2"},
                    "expect": {"outcome": "refused", "refusals": ["facts-untrusted"]},
                },
            ],
        }
    )
    result = run_case(Path("inline.yaml"), case, machine, registry)
    assert result.mismatches == ()
    assert result.decisions[1].capabilities == ("procurement.create-request",)
