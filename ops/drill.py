"""Response drills (CONFORMANCE L4.6): what a drill plays and what the machine requires.

A drill plays one failure scenario against a running deployment under an operation id
with the drill prefix (`schemas.DRILL_OPERATION_PREFIX`), which every command the
controller emits for it carries, so capability workers answer those commands with
`producers.drill_answer` instead of calling their handlers: nothing in the world
changes. The scenarios are the demo's catalogue cases that need no human
(`DRILL_SCENARIOS`: a timeout after a side effect, a timeout before one, a containment).

What the deployment must do is computed here, purely: `predict` decides the drill's
opening event, the workers' drill answers and the paced retries' timers (fired when
they fall due, as the controller fires them) through the decision core
(`machines.Simulation`, under the controller's pinned machine and policy) and returns
each step (event, state before and after, capabilities commanded). `compare` sets the
steps read back from the ledger beside the prediction and the scenario's expected path
and says what differs. `ops/commands/drill.py` publishes, waits and reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from machines import (
    Event,
    EvidencePayload,
    Lineage,
    Machine,
    OperationView,
    Rules,
    Simulation,
    TimerKind,
)
from ops.demo_scenarios import SCENARIOS, Scenario
from producers import RESULT_EVENTS, drill_answer
from schemas import DRILL_OPERATION_PREFIX, CapabilityCommand

__all__ = [
    "DRILL_SCENARIOS",
    "DrillStep",
    "compare",
    "drill_lineage",
    "opening_event",
    "path_of",
    "predict",
    "recorded_steps",
]

# Drill name -> the demo scenario it plays (catalogue cases needing no human decision).
_PLAYS: Final = {
    "timeout-after-side-effect": "procurement-applied",
    "timeout-before-side-effect": "procurement-retried",
    "containment": "research-orchestrator",
}
DRILL_SCENARIOS: Final[Mapping[str, Scenario]] = {
    drill: next(s for s in SCENARIOS if s.name == name) for drill, name in _PLAYS.items()
}
_VERIFY_EVENTS: Final = {"applied": "VERIFICATION_FOUND", "not_applied": "VERIFICATION_NOT_FOUND"}
# The verifier a prediction names before any worker has answered, when the policy
# trusts none (else its first trusted verifier: any trusted one decides alike; a step
# not yet recorded is only awaited, never compared).
_ANY_VERIFIER: Final = "drill-verifier"


@dataclass(frozen=True, slots=True)
class DrillStep:
    """One decision of the drill: the event decided, its cause, the states and the
    capabilities commanded."""

    event_type: str
    causation: str | None
    state_before: str
    state_after: str
    commands: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form."""
        return {
            "event_type": self.event_type,
            "causation": self.causation,
            "state_before": self.state_before,
            "state_after": self.state_after,
            "commands": list(self.commands),
        }


def drill_lineage(run_id: str, scenario: Scenario) -> Lineage:
    """The drill operation's lineage: the scenario's agent on a task named for the run."""
    return Lineage(
        agent=scenario.agent, task=f"drill-{run_id}", initiating_principal="recoveryctl-drill"
    )


def opening_event(
    scenario: Scenario,
    machine: Machine,
    operation_id: str,
    run_id: str,
    producer: str,
    lineage: Lineage,
    at: datetime,
) -> Event:
    """The tool's failure report the drill opens with (marked `drill:` in its evidence
    reference and correlation id too)."""
    facts = scenario.facts
    if facts is not None and facts.idempotency_key is not None:
        facts = replace(facts, idempotency_key=f"drill-{run_id}")
    return Event(
        event_type=scenario.first_event,
        event_id=f"drill-evt-{run_id}",
        operation_id=operation_id,
        correlation_id=f"{DRILL_OPERATION_PREFIX}{run_id}",
        machine_name=machine.name,
        machine_version=machine.version,
        event_time=at,
        evidence_ref=f"drill:{scenario.name}:{run_id}",
        producer=producer,
        lineage=lineage,
        facts=facts,
        scope=scenario.scope,
    )


def _probe(event: Event, command_id: str, kind: str, capability: str) -> CapabilityCommand:
    return CapabilityCommand(
        command_id=command_id,
        capability=capability,
        kind=kind,
        material=False,
        params={},
        origin="transition",
        operation_id=event.operation_id,
        correlation_id=event.correlation_id,
        causation_event_id=event.event_id,
        machine_name=event.machine_name,
        machine_version=event.machine_version,
        machine_digest="",
        sequence=0,
        lineage=event.lineage,
        issued_at=event.event_time,
    )


def predict(
    machine: Machine,
    rules: Rules,
    opening: Event,
    reporters: Mapping[str, str],
) -> tuple[DrillStep, ...]:
    """The steps the machine requires: `opening` decided, then each command's drill
    answer (as a worker reports it, by `reporters[command id]`, the producer that
    answered it in the ledger, when it has) decided in turn, depth first."""
    sim = Simulation(machine, rules.registry, rules.policy, guard_table=rules.guard_table)
    steps: list[DrillStep] = []
    pending: list[Event] = [opening]
    while len(steps) < 64:
        if not pending:
            # A paced retry goes out when its timer fires (`machines.timers`); the
            # drill waits for that, never for a state's timeout.
            retry = _next_retry(sim.views.get(opening.operation_id))
            if retry is None:
                break
            decisions = sim.advance(retry)
        else:
            event = pending.pop(0)
            decisions = [sim.feed(event, event.event_time)]
        for decision in decisions:
            steps.append(
                DrillStep(
                    decision.event_type,
                    decision.causation,
                    decision.state_before,
                    decision.state_after,
                    decision.capabilities,
                )
            )
            answers = [
                _answer_event(opening, i.command_id, i.kind, i.capability, reporters, rules)
                for i in decision.invocations
            ]
            pending = [a for a in answers if a is not None] + pending
    return tuple(steps)


def _next_retry(view: OperationView | None) -> datetime | None:
    """When the operation's paced retry timer is due, if it has one armed."""
    if view is None:
        return None
    due = [t.due_at for t in view.timers if t.kind == TimerKind.RETRY and not t.spent]
    return min(due, default=None)


def _answer_event(
    opening: Event,
    command_id: str,
    kind: str,
    capability: str,
    reporters: Mapping[str, str],
    rules: Rules,
) -> Event | None:
    answer = drill_answer(_probe(opening, command_id, kind, capability))
    if answer is None:
        return None
    trusted = rules.policy.trusted_verifiers
    producer = reporters.get(command_id) or (trusted[0] if trusted else _ANY_VERIFIER)
    evidence = answer.evidence
    if kind == "verify" and evidence is not None:
        event_type = _VERIFY_EVENTS[str(evidence.outcome)]
        evidence = EvidencePayload(
            outcome=evidence.outcome, verifier=producer, reference=evidence.reference
        )
    else:
        event_type = RESULT_EVENTS[kind][0 if answer.succeeded else 1]
    return replace(
        opening,
        event_type=event_type,
        event_id=f"result:{command_id}",
        evidence_ref=answer.evidence_ref or f"command:{command_id}",
        producer=producer,
        evidence=evidence,
        causation=command_id,
        facts=None,
        scope=None,
        payload_digest="",
    )


def recorded_steps(decisions: Sequence[Mapping[str, Any]]) -> tuple[DrillStep, ...]:
    """The steps the ledger's decision rows record, in sequence order."""
    return tuple(
        DrillStep(
            str(d["event"]["type"]),
            d["event"].get("causation"),
            str(d["state_before"]),
            str(d["state_after"]),
            tuple(str(i["capability"]) for i in d.get("invocations") or ()),
        )
        for d in decisions
    )


def compare(
    scenario: Scenario,
    predicted: Sequence[DrillStep],
    recorded: Sequence[DrillStep],
    decisions: Sequence[Mapping[str, Any]],
) -> list[str]:
    """What the deployment did other than its machine requires (empty: it responded as
    required): a step that differs from the prediction, a step missing or extra, a
    path other than the scenario's, a result not answered as a drill (a handler ran)."""
    problems: list[str] = []
    for n, (want, got) in enumerate(zip(predicted, recorded, strict=False), start=1):
        if want != got:
            problems.append(
                f"step {n}: recorded {_describe(got)}, the machine requires {_describe(want)}"
            )
    for n, want in enumerate(predicted[len(recorded) :], start=len(recorded) + 1):
        cause = f" (the answer to command {want.causation})" if want.causation else ""
        problems.append(
            f"step {n}: no decision of {want.event_type}{cause}; did a worker serving "
            "that capability answer?"
        )
    for n, got in enumerate(recorded[len(predicted) :], start=len(predicted) + 1):
        problems.append(f"step {n}: {_describe(got)} recorded, not required by the machine")
    path = _path(recorded)
    if recorded and path != scenario.path:
        problems.append(
            f"path {' -> '.join(path)}, the scenario expects {' -> '.join(scenario.path)}"
        )
    for d in decisions:
        event = d["event"]
        ref = str(event.get("evidence_ref") or "")
        if event.get("causation") and not ref.startswith("drill:"):
            problems.append(
                f"the answer to command {event['causation']} ({event['type']}) has evidence "
                f"{ref!r}, not a drill answer: a worker acted on a drill's command"
            )
    return problems


def path_of(steps: Sequence[DrillStep]) -> tuple[str, ...]:
    """The states the steps pass through."""
    return _path(steps)


def _path(steps: Sequence[DrillStep]) -> tuple[str, ...]:
    if not steps:
        return ()
    states = [steps[0].state_before]
    for step in steps:
        if step.state_after != states[-1]:
            states.append(step.state_after)
    return tuple(states)


def _describe(step: DrillStep) -> str:
    commands = ", ".join(step.commands) or "no commands"
    return f"{step.event_type}: {step.state_before} -> {step.state_after} ({commands})"
