"""Hand-built machine, registry, policy and event helpers for the decision-core tests.

The catalogue machines are exercised by their own case files; these tests pin the core's
semantics on a small machine whose every state and transition is visible here.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from machines.approvals import insecure_test_key, public_key_b64, review_digest, sign_decision
from machines.event import (
    CheckpointReport,
    ClassifierOutput,
    Event,
    EvidencePayload,
    HumanDecision,
    Lineage,
)
from machines.model import (
    ActionRef,
    AppliesTo,
    AuditSpec,
    CapabilityKind,
    CapabilitySpec,
    GuardSpec,
    Machine,
    Registry,
    State,
    Transition,
)
from machines.policy import Policy, parse_policy
from machines.view import LineageStatus, OperationView, ToolFacts, new_view

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AGENT = "agent-7"
PARENT_AGENT = "agent-parent"
VERIFIER = "verifier-1"
APPROVER = "approver-1"
OP = "op-1"

GUARD_IMPLS = {
    "evidence.not-applied": "standard.not_applied",
    "evidence.applied": "standard.applied",
    "evidence.unknown-or-conflicting": "standard.unknown_or_conflicting",
    "retry.permitted": "standard.retry_permitted",
    "attempts.remaining": "standard.attempts_remaining",
    "compensation.supported": "standard.compensation_supported",
    "approval.granted": "standard.approval_granted",
    "lineage.clear": "standard.lineage_clear",
    "resume.permitted": "standard.resume_permitted",
}

CAPS = {
    "tool.verify": (CapabilityKind.VERIFY, False),
    "tool.retry": (CapabilityKind.RETRY, True),
    "tool.compensate": (CapabilityKind.COMPENSATE, True),
    "agent.stop": (CapabilityKind.STOP, True),
    "agent.revoke": (CapabilityKind.REVOKE, True),
    "agent.resume": (CapabilityKind.RESUME, True),
    "operator.escalate": (CapabilityKind.ESCALATE, False),
    "operator.notify": (CapabilityKind.NOTIFY, False),
}


def registry() -> Registry:
    """The registry every core test uses."""
    return Registry(
        guards=MappingProxyType(
            {g: GuardSpec(id=g, implementation=i) for g, i in GUARD_IMPLS.items()}
        ),
        capabilities=MappingProxyType(
            {c: CapabilitySpec(id=c, kind=k, material=m) for c, (k, m) in CAPS.items()}
        ),
    )


def tr(
    source: str,
    event: str,
    index: int,
    target: str,
    guard: str | None = None,
    actions: tuple[str, ...] = (),
) -> Transition:
    return Transition(
        source=source,
        event=event,
        index=index,
        target=target,
        guard=guard,
        actions=tuple(ActionRef(capability=a) for a in actions),
    )


def st(
    name: str, *transitions: Transition, entry: tuple[str, ...] = (), final: bool = False
) -> State:
    on: dict[str, tuple[Transition, ...]] = {}
    for t in transitions:
        on[t.event] = (*on.get(t.event, ()), t)
    return State(
        name=name,
        final=final,
        entry=tuple(ActionRef(capability=a) for a in entry),
        on=MappingProxyType(on),
    )


def machine(digest: str = "sha256:" + "a" * 64) -> Machine:
    """A small recovery machine: verify after a timeout, retry only when permitted,
    contain, and resume only through approval and verified state."""
    states = [
        st(
            "running",
            tr("running", "TOOL_TIMEOUT", 0, "verifying"),
            tr("running", "STEP_COMPLETED", 0, "done"),
        ),
        st(
            "verifying",
            tr(
                "verifying",
                "VERIFICATION_NOT_FOUND",
                0,
                "retrying",
                "retry.permitted",
                ("tool.retry",),
            ),
            tr("verifying", "VERIFICATION_NOT_FOUND", 1, "contained"),
            tr("verifying", "VERIFICATION_FOUND", 0, "done", "evidence.applied"),
            tr("verifying", "VERIFICATION_FOUND", 1, "contained"),
            tr("verifying", "VERIFICATION_UNAVAILABLE", 0, "contained"),
            tr("verifying", "VERIFICATION_CONFLICTING", 0, "contained"),
            entry=("tool.verify",),
        ),
        st(
            "retrying",
            tr("retrying", "RETRY_SUCCEEDED", 0, "done"),
            tr("retrying", "RETRY_FAILED", 0, "verifying"),
        ),
        st(
            "contained",
            tr("contained", "RESUME_REQUESTED", 0, "resume-pending"),
            tr("contained", "CONTAINMENT_FAILED", 0, "contained", None, ("operator.escalate",)),
            entry=("agent.stop", "agent.revoke", "operator.escalate"),
        ),
        st(
            "resume-pending",
            tr(
                "resume-pending",
                "HUMAN_APPROVED",
                0,
                "resuming",
                "resume.permitted",
                ("agent.resume",),
            ),
            tr("resume-pending", "HUMAN_REJECTED", 0, "closed"),
            tr("resume-pending", "VERIFICATION_FOUND", 0, "resume-pending"),
            tr("resume-pending", "STEP_COMPLETED", 0, "resume-pending"),
        ),
        st("resuming", tr("resuming", "STEP_COMPLETED", 0, "done")),
        st("done", final=True),
        st("closed", final=True),
    ]
    return Machine(
        name="demo",
        description="demo machine for core tests",
        version="1.0.0",
        spec_version="agent-recovery/0.2",
        applies_to=AppliesTo(capabilities=("demo.write",)),
        initial="running",
        states=MappingProxyType({s.name: s for s in states}),
        audit=AuditSpec(retention_days=30),
        digest=digest,
    )


def policy(**overrides: Any) -> Policy:
    """The default test policy with one trusted verifier and one approver. Its retries
    go out at once (`retry_pacing.base` 0s): these tests are about the retry gate;
    paced retries have theirs (tests/unit/core/test_timers.py)."""
    data: dict[str, Any] = {
        "id": "test-policy",
        "retry_pacing": {"base": "0s"},
        "trusted_verifiers": [VERIFIER],
        "escalation_capability": "operator.escalate",
        "approvers": [
            {
                "id": APPROVER,
                "public_key": public_key_b64(insecure_test_key(APPROVER)),
                "roles": ["recovery-approver"],
            },
            {
                "id": AGENT,
                "public_key": public_key_b64(insecure_test_key(AGENT)),
                "roles": ["recovery-approver"],
            },
        ],
    }
    data.update(overrides)
    return parse_policy(data)


def view(
    state: str = "running",
    *,
    key: str | None = "idem-1",
    pol: Policy | None = None,
    mach: Machine | None = None,
    **changes: Any,
) -> OperationView:
    """An operation view in `state` with an idempotency key by default."""
    m = mach or machine()
    p = pol or policy()
    base = new_view(
        operation_id=OP,
        machine_name=m.name,
        machine_digest=m.digest,
        policy_digest=p.digest,
        initial_state=state,
        lineage=LineageStatus(agent=AGENT, lineage_agents=frozenset({PARENT_AGENT})),
        facts=ToolFacts(idempotency_key=key, compensation_supported=True),
        budget_limit=10,
        deadline=T0 + timedelta(hours=1),
    )
    return replace(base, **changes)


def event(
    event_type: str,
    event_id: str = "e1",
    *,
    producer: str = "tool-integration",
    at: datetime = T0,
    **fields: Any,
) -> Event:
    """An event for the demo machine's operation."""
    return Event(
        event_type=event_type,
        event_id=event_id,
        operation_id=fields.pop("operation_id", OP),
        correlation_id="corr-1",
        machine_name=fields.pop("machine_name", "demo"),
        machine_version=fields.pop("machine_version", "1.0.0"),
        event_time=at,
        evidence_ref=f"evidence://{event_id}",
        producer=producer,
        lineage=Lineage(agent=AGENT, task="task-1", initiating_principal="alice"),
        **fields,
    )


def verification(
    event_type: str, event_id: str = "v1", *, verifier: str = VERIFIER, outcome: str | None = None
) -> Event:
    """A verification event reported by `verifier`."""
    return event(
        event_type,
        event_id,
        producer=verifier,
        evidence=EvidencePayload(
            outcome=outcome,
            verifier=verifier,  # type: ignore[arg-type]
            reference=f"ref://{event_id}",
        ),
    )


def approval(
    state: str,
    transition: str,
    event_id: str = "h1",
    *,
    approver: str = APPROVER,
    key: str | None = None,
    nonce: str = "n1",
    expires: datetime | None = None,
    operation_id: str = OP,
    digest: str | None = None,
    event_type: str = "HUMAN_APPROVED",
    producer: str | None = None,
    on: OperationView | None = None,
    for_resume: bool = False,
    at: datetime = T0,
) -> Event:
    """A signed human decision for the demo operation, reviewed on the view `on`
    (default: `view(state)`, an operation with nothing decided yet)."""
    reviewed = on if on is not None else view(state)
    decision = HumanDecision(
        approver=approver,
        operation_id=operation_id,
        state=state,
        transition=transition,
        machine_digest=digest or machine().digest,
        expires_at=expires or T0 + timedelta(minutes=10),
        nonce=nonce,
        decision="approved" if event_type == "HUMAN_APPROVED" else "rejected",
        reviewed_digest=review_digest(reviewed, transition, at, for_resume=for_resume),
        for_resume=for_resume,
    )
    signed = sign_decision(decision, insecure_test_key(key or approver))
    return event(event_type, event_id, producer=producer or approver, human_decision=signed)


def checkpoint_event(
    checkpoint_id: str,
    saved_at: datetime,
    *,
    mach: Machine | None = None,
    pol: Policy | None = None,
    validated: bool = True,
    validator: str = VERIFIER,
    event_id: str = "c1",
    machine_digest: str | None = None,
) -> Event:
    """A STEP_COMPLETED event reporting a checkpoint and its validation, produced by its
    validator when validated (a validation is the validator's own report)."""
    report = CheckpointReport(
        checkpoint_id=checkpoint_id,
        saved_at=saved_at,
        reference=f"checkpoint://{checkpoint_id}",
        validated=validated,
        validator=validator,
        validated_machine_digest=machine_digest or (mach or machine()).digest,
        validated_policy_digest=(pol or policy()).digest,
    )
    producer = validator if validated else "tool-integration"
    return event(
        "STEP_COMPLETED", event_id, producer=producer, evidence=EvidencePayload(checkpoint=report)
    )


def classified(
    event_type: str, probabilities: dict[str, float], candidate: str | None, event_id: str = "k1"
) -> Event:
    """An event proposed by a classifier."""
    return event(
        event_type,
        event_id,
        classifier=ClassifierOutput(
            identity="clf",
            version="3",
            question="which event?",
            probabilities=MappingProxyType(probabilities),
            candidate_event=candidate,
        ),
    )


def custom_machine(*states: State, initial: str = "running") -> Machine:
    """A machine made of the given states (for invariant tests with unsafe machines)."""
    return replace(machine(), states=MappingProxyType({s.name: s for s in states}), initial=initial)
