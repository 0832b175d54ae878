"""The incident `recoveryctl demo` plays: nine failed agent operations, one per story.

Each `Scenario` says what the tool reports first, how the outside world reacts when the
operation reaches a state (a signed human decision, a tool's follow-up report), and
what must come out: the path through the machine's states and the capabilities the
controller asks for. Verification and containment results come from the example
capability worker (`producers.worker.demo_handlers`), whose fake verifier answers from
a hash of the operation id; `operation_id_for` picks ids that get the wanted answer.

Tools declare their facts (idempotency key, status API, compensation support) on the
event that opens the operation, and every tool event names its scope (capability,
tool, environment) so the controller checks the machine's `applies_to`. Where a tool
declares no idempotency key, a verified not-applied request is escalated rather than
retried: the demo shows both. One verification is never answered (the status service
of that request is down): the demo policy's timeout of `verifying` escalates it within
the run, with the timer's event in its path and audit chain. The paths below are what
the pinned catalogue decides under those facts and `ops/demo_policy.yaml`;
`tests/unit/test_demo_scenarios.py` replays them through the decision core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal

from machines import DeclaredFacts, Lineage, Scope
from producers import ActionResult, Handler, demo_handlers, verify_outcome
from schemas import CapabilityCommand

__all__ = [
    "APPROVER",
    "DEMO_HANDLERS",
    "DEMO_POLICY",
    "SCENARIOS",
    "Reaction",
    "Scenario",
    "operation_id_for",
]

DEMO_POLICY: Final = Path(__file__).resolve().parent / "demo_policy.yaml"
APPROVER: Final = "approver-dana"

ReactionKind = Literal["approve", "reject", "report"]


@dataclass(frozen=True, slots=True)
class Reaction:
    """What happens once the operation is in state `when`: a signed approval or
    rejection toward `target`, or a tool's report of `event_type`."""

    when: str
    kind: ReactionKind
    target: str = ""
    event_type: str = ""


@dataclass(frozen=True, slots=True)
class Scenario:
    """One operation of the incident and what must happen to it."""

    name: str
    story: str
    machine: str
    agent: str
    first_event: str
    path: tuple[str, ...]
    commands: tuple[str, ...]
    reactions: tuple[Reaction, ...] = ()
    verify: Literal["found", "not_found"] | None = None
    capability: str = ""
    tool: str | None = None
    facts: DeclaredFacts | None = None
    # The scenario whose operation delegated this one; its first event waits until that
    # operation reached its final state.
    parent: str | None = None

    @property
    def final_state(self) -> str:
        """The state the operation must end in."""
        return self.path[-1]

    @property
    def scope(self) -> Scope:
        """What the operation is, as its tool events say (checked against `applies_to`)."""
        return Scope(capability=self.capability, tool=self.tool, environment="production")


SCENARIOS: Final[tuple[Scenario, ...]] = (
    Scenario(
        name="procurement-applied",
        story="a purchase request timed out; the status API shows it exists: done",
        machine="procurement-request",
        agent="procurement-agent",
        capability="procurement.create-request",
        tool="coupa",
        facts=DeclaredFacts(idempotency_key="req-4711", status_api=True),
        first_event="TOOL_TIMEOUT",
        verify="found",
        path=("failure-reported", "verifying", "completed"),
        commands=("procurement.verify-request",),
    ),
    Scenario(
        name="procurement-retried",
        story=(
            "a purchase request timed out and is verified not applied; the tool declared "
            "an idempotency key, so it is retried with the same key and succeeds"
        ),
        machine="procurement-request",
        agent="procurement-agent",
        capability="procurement.create-request",
        tool="coupa",
        facts=DeclaredFacts(idempotency_key="req-4712", status_api=True),
        first_event="TOOL_TIMEOUT",
        verify="not_found",
        path=("failure-reported", "verifying", "retrying", "completed"),
        commands=("procurement.verify-request", "procurement.create-request"),
    ),
    Scenario(
        name="procurement-not-applied",
        story=(
            "a purchase request timed out and is verified not applied; no idempotency key "
            "was declared, so a retry is refused and a human approves the resumption"
        ),
        machine="procurement-request",
        agent="procurement-agent",
        capability="procurement.create-request",
        tool="sap-ariba",
        first_event="TOOL_TIMEOUT",
        verify="not_found",
        path=("failure-reported", "verifying", "escalated", "resume-pending"),
        commands=("procurement.verify-request", "human.escalate"),
        reactions=(Reaction("escalated", "approve", target="resume-pending"),),
    ),
    Scenario(
        name="procurement-unanswered",
        story=(
            "a purchase request timed out and nobody answers its verification (the "
            "status service is down): the timeout of `verifying` escalates it by itself"
        ),
        machine="procurement-request",
        agent="procurement-agent",
        capability="procurement.create-request",
        tool="coupa",
        facts=DeclaredFacts(idempotency_key="req-4713", status_api=True),
        first_event="TOOL_TIMEOUT",
        path=("failure-reported", "verifying", "escalated"),
        commands=("procurement.verify-request", "human.escalate"),
    ),
    Scenario(
        name="email-timeout",
        story=(
            "an email send timed out (at-most-once: never retried); the outbox is "
            "quarantined and a human approves with a signed decision"
        ),
        machine="email-send",
        agent="mail-agent",
        capability="email.send",
        tool="smtp-relay",
        first_event="TOOL_TIMEOUT",
        path=("failure-reported", "unresolved", "resume-pending"),
        commands=("email.quarantine-outbox", "human.escalate"),
        reactions=(Reaction("unresolved", "approve", target="resume-pending"),),
    ),
    Scenario(
        name="refund-compensation-fails",
        story=(
            "a refund was issued twice; the duplicate is confirmed, its cancellation "
            "fails, a human rejects continuing and the agent is contained"
        ),
        machine="payment-refund",
        agent="billing-agent",
        capability="payment.create-refund",
        tool="stripe",
        facts=DeclaredFacts(
            idempotency_key="rf-2207", status_api=True, compensation_supported=True
        ),
        first_event="DUPLICATE_DETECTED",
        verify="found",
        path=(
            "failure-reported",
            "duplicate-review",
            "compensating",
            "compensation-failed",
            "containing",
            "contained",
        ),
        commands=(
            "payment.verify-refund",
            "payment.cancel-refund",
            "human.escalate",
            "agent.stop-task",
            "credentials.revoke-delegation",
        ),
        reactions=(Reaction("compensation-failed", "reject", target="containing"),),
    ),
    Scenario(
        name="deployment-half-done",
        story=(
            "a rollout failed half way; verification finds the applied steps, the "
            "rollout continues and the pipeline reports the last step"
        ),
        machine="multistep-deployment",
        agent="deploy-agent",
        capability="deploy.rollout",
        tool="argo-cd",
        first_event="STEP_FAILED",
        verify="found",
        path=("failure-reported", "verifying", "rolling-out", "completed"),
        commands=("deploy.verify-steps",),
        reactions=(Reaction("rolling-out", "report", event_type="STEP_COMPLETED"),),
    ),
    Scenario(
        name="research-orchestrator",
        story="a research orchestrator exceeded its authorisation and is contained",
        machine="delegated-research",
        agent="research-orchestrator",
        capability="research.delegate-task",
        first_event="AUTHORIZATION_DENIED",
        path=("failure-reported", "containing", "contained"),
        commands=("agent.stop-task", "credentials.revoke-delegation", "human.escalate"),
    ),
    Scenario(
        name="research-subtask",
        story=(
            "the research task it delegated is contained too, once its ancestor is "
            "(the orchestration tool reports ANCESTOR_CONTAINED)"
        ),
        machine="delegated-research",
        agent="research-worker",
        capability="research.delegate-task",
        first_event="ANCESTOR_CONTAINED",
        parent="research-orchestrator",
        path=("failure-reported", "containing", "contained"),
        commands=("agent.stop-task", "credentials.revoke-delegation"),
    ),
)


def _retry(_command: CapabilityCommand) -> ActionResult:
    return ActionResult(succeeded=True, evidence_ref="demo-procurement:resubmitted")


def _failed_cancellation(_command: CapabilityCommand) -> ActionResult:
    return ActionResult(succeeded=False, evidence_ref="demo-payments:cancel-refused")


# The operations whose verification nobody answers (the `procurement-unanswered` story).
UNANSWERED: Final = "-procurement-unanswered-"
_VERIFY_REQUEST: Final = demo_handlers()["procurement.verify-request"]


def _verify_request(command: CapabilityCommand) -> ActionResult | None:
    if UNANSWERED in command.operation_id:
        return None  # the status service is down: no answer, ever
    return _VERIFY_REQUEST(command)


# The example worker's handlers plus the actions this incident needs: the procurement
# retry succeeds, one procurement verification is never answered, the refund
# cancellation fails.
DEMO_HANDLERS: Final[Mapping[str, Handler]] = MappingProxyType(
    {
        **demo_handlers(),
        "procurement.verify-request": _verify_request,
        "procurement.create-request": _retry,
        "payment.cancel-refund": _failed_cancellation,
    }
)


def operation_id_for(scenario: Scenario, run_id: str, prefix: str = "op-") -> str:
    """A fresh operation id for `scenario` in run `run_id` for which the demo verifier
    answers what the scenario needs (the first suffix that does); `recoveryctl drill`
    passes the drill prefix."""
    base = f"{prefix}{scenario.name}-{run_id}"
    if scenario.verify is None:
        return base
    for n in range(1000):
        candidate = f"{base}-{n}"
        if _verifier_answer(candidate) == scenario.verify:
            return candidate
    raise AssertionError("unreachable: half of all ids verify each way")  # pragma: no cover


def _verifier_answer(operation_id: str) -> str:
    # Ask the worker's own rule, so the demo cannot drift from it.
    probe = CapabilityCommand(
        command_id="probe",
        capability="probe.verify",
        kind="verify",
        material=False,
        params={},
        origin="transition",
        operation_id=operation_id,
        correlation_id="probe",
        causation_event_id="probe",
        machine_name="probe",
        machine_version="0",
        machine_digest="probe",
        sequence=1,
        lineage=Lineage(agent="probe", task="probe", initiating_principal="probe"),
        issued_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    return verify_outcome(probe)
