"""SPEC §7 invariants the core enforces whatever the machine says."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from core_support import (
    AGENT,
    APPROVER,
    PARENT_AGENT,
    T0,
    approval,
    custom_machine,
    event,
    policy,
    registry,
    st,
    tr,
    verification,
    view,
)

from machines.decision import Outcome, apply, decide
from machines.model import ActionRef, Transition

# A machine that trusts too much: it retries and resumes on any event, unguarded.
RECKLESS = custom_machine(
    st(
        "running",
        tr("running", "TOOL_TIMEOUT", 0, "retrying", None, ("tool.retry",)),
        tr("running", "RESUME_REQUESTED", 0, "resumed", None, ("agent.resume",)),
        tr("running", "TOOL_FAILED", 0, "stopped", None, ("agent.stop",)),
        tr("running", "STEP_FAILED", 0, "compensating", None, ("tool.compensate",)),
    ),
    st("retrying", tr("retrying", "RETRY_FAILED", 0, "running")),
    st("resumed", final=True),
    st("stopped", final=True),
    st("compensating", final=True),
)


def _decide(v, e, pol=None, mach=RECKLESS):  # type: ignore[no-untyped-def]
    return decide(mach, v, e, pol or policy(), registry(), T0)


def test_unguarded_retry_is_refused_without_not_applied_evidence():
    d = _decide(view(mach=RECKLESS), event("TOOL_TIMEOUT"))
    assert d.outcome is Outcome.REFUSED
    assert d.state_after == "running"
    assert [n.code for n in d.refusals] == ["retry-not-permitted"]
    assert d.capabilities == ("operator.escalate",)
    assert d.transition_index is None


def test_unguarded_retry_is_refused_without_idempotency_key_even_with_evidence():
    v = view(mach=RECKLESS, key=None)
    v = apply(v, _decide(v, verification("VERIFICATION_NOT_FOUND")))
    d = _decide(v, event("TOOL_TIMEOUT", "e2"))
    assert d.refusals[-1].code == "retry-not-permitted"


def test_retry_refused_after_deadline_and_when_budget_is_spent():
    v = view(mach=RECKLESS)
    v = apply(v, _decide(v, verification("VERIFICATION_NOT_FOUND")))
    late = decide(
        RECKLESS, v, event("TOOL_TIMEOUT", "e2"), policy(), registry(), T0 + timedelta(hours=2)
    )
    assert late.refusals[-1].code == "retry-not-permitted"
    spent = replace(v, budget_spent=v.budget_limit)
    assert _decide(spent, event("TOOL_TIMEOUT", "e3")).refusals[-1].code == "retry-not-permitted"


def test_retry_refused_while_an_ancestor_is_contained_even_with_evidence_and_key():
    v = view(mach=RECKLESS)
    v = apply(v, _decide(v, verification("VERIFICATION_NOT_FOUND")))
    held = replace(v, lineage=replace(v.lineage, contained_ancestors=("op-parent",)))
    d = _decide(held, event("TOOL_TIMEOUT", "e2"))
    assert d.outcome is Outcome.REFUSED
    assert d.refusals[-1].code == "retry-not-permitted"
    assert "tool.retry" not in d.capabilities


def test_retry_allowed_when_retry_permitted_holds_now():
    v = view(mach=RECKLESS)
    v = apply(v, _decide(v, verification("VERIFICATION_NOT_FOUND")))
    d = _decide(v, event("TOOL_TIMEOUT", "e2"))
    assert d.outcome is Outcome.TRANSITIONED
    assert d.capabilities == ("tool.retry",)


def test_two_retries_in_one_transition_cannot_share_one_not_applied_result():
    m = custom_machine(
        st(
            "running",
            Transition(
                "running",
                "TOOL_TIMEOUT",
                0,
                "x",
                None,
                (ActionRef("tool.retry"), ActionRef("tool.retry")),
            ),
        ),
        st("x", final=True),
    )
    v = view(mach=m)
    v = apply(v, decide(m, v, verification("VERIFICATION_NOT_FOUND"), policy(), registry(), T0))
    d = decide(m, v, event("TOOL_TIMEOUT", "e2"), policy(), registry(), T0)
    assert d.outcome is Outcome.REFUSED
    assert "tool.retry" not in d.capabilities


def test_unguarded_resume_is_refused_without_approval():
    d = _decide(view(mach=RECKLESS), event("RESUME_REQUESTED"))
    assert d.outcome is Outcome.REFUSED
    assert d.refusals[0].code == "resume-not-permitted"


def test_stop_capability_may_not_also_revoke():
    m = custom_machine(
        st(
            "running",
            Transition(
                "running",
                "TOOL_FAILED",
                0,
                "x",
                None,
                (ActionRef("agent.stop", {"revoke_credentials": True}),),
            ),
        ),
        st("x", final=True),
    )
    d = decide(m, view(mach=m), event("TOOL_FAILED"), policy(), registry(), T0)
    assert d.refusals[0].code == "stop-revoke-combined"


def test_stop_and_revoke_are_separate_invocations():
    d = decide(
        custom_machine(*_contain_states()),
        view(mach=custom_machine(*_contain_states())),
        event("TOOL_FAILED"),
        policy(),
        registry(),
        T0,
    )
    assert d.capabilities == ("agent.stop", "agent.revoke")
    assert len({i.command_id for i in d.invocations}) == 2


def _contain_states():  # type: ignore[no-untyped-def]
    return (
        st("running", tr("running", "TOOL_FAILED", 0, "x", None, ("agent.stop", "agent.revoke"))),
        st("x", final=True),
    )


def test_forbidden_capability_is_refused():
    d = _decide(
        view(mach=RECKLESS), event("TOOL_FAILED"), pol=policy(forbidden_capabilities=["agent.stop"])
    )
    assert d.refusals[0].code == "capability-forbidden"


def _verified_applied():  # type: ignore[no-untyped-def]
    # A compensation needs authoritative evidence of the effect first (SPEC 7.5).
    v = view(mach=RECKLESS)
    return apply(v, _decide(v, verification("VERIFICATION_FOUND")))


def test_policy_listed_capability_needs_approval():
    d = _decide(
        _verified_applied(),
        event("STEP_FAILED"),
        pol=policy(approval_required_capabilities=["tool.compensate"]),
    )
    assert d.refusals[0].code == "approval-required"


def test_material_capability_needs_approval_when_policy_says_so():
    d = _decide(
        _verified_applied(), event("STEP_FAILED"), pol=policy(require_approval_for_material=True)
    )
    assert d.refusals[0].code == "approval-required"


def test_compensation_without_evidence_is_refused_whatever_the_machine_says():
    d = _decide(view(mach=RECKLESS), event("STEP_FAILED"))
    assert d.outcome is Outcome.REFUSED
    assert [n.code for n in d.refusals] == ["compensation-unverified"]
    assert d.capabilities == ("operator.escalate",)


def test_material_routes_and_completion_are_refused_on_conflicting_evidence():
    pol = policy(trusted_verifiers=["verifier-1", "verifier-2"])
    v = view(mach=RECKLESS, pol=pol)
    for e in (
        verification("VERIFICATION_FOUND"),
        verification("VERIFICATION_NOT_FOUND", "v2", verifier="verifier-2"),
    ):
        v = apply(v, _decide(v, e, pol=pol))
    assert v.current_outcomes() == {"applied", "not_applied"}
    # A compensation, a resume and a completion (TOOL_FAILED ends in a final state).
    for e in (event("STEP_FAILED"), event("RESUME_REQUESTED"), event("TOOL_FAILED")):
        d = _decide(v, e, pol=pol)
        assert d.outcome is Outcome.REFUSED, e.event_type
        assert [n.code for n in d.refusals] == ["evidence-unsettled"]
        assert d.capabilities == ("operator.escalate",)


def test_affected_agent_cannot_supply_verification_about_itself():
    for producer in (AGENT, PARENT_AGENT):
        e = verification("VERIFICATION_NOT_FOUND")
        e = replace(e, producer=producer, payload_digest="")
        d = decide(RECKLESS, view(mach=RECKLESS), e, policy(), registry(), T0)
        assert d.refusals[0].code == "affected-agent-evidence"
        assert d.evidence.verification is None


def test_affected_agent_cannot_approve_even_with_a_valid_signature():
    e = approval("running", "x", approver=AGENT, producer=AGENT)
    d = decide(RECKLESS, view(mach=RECKLESS), e, policy(), registry(), T0)
    assert d.refusals[0].code == "affected-agent-cannot-approve"


def test_lineage_approver_is_refused_even_through_a_trusted_producer():
    e = approval("running", "x", approver=AGENT, producer="approval-console")
    d = decide(RECKLESS, view(mach=RECKLESS), e, policy(), registry(), T0)
    assert d.refusals[0].code == "approval-approver-in-lineage"


def test_affected_agent_cannot_change_lineage_trust_status():
    e = event("ANCESTOR_CONTAINED", producer=PARENT_AGENT)
    d = decide(RECKLESS, view(mach=RECKLESS), e, policy(), registry(), T0)
    assert d.refusals[0].code == "affected-agent-evidence"


def test_affected_agent_may_still_report_a_failure():
    e = event("TOOL_FAILED", producer=AGENT)
    d = decide(RECKLESS, view(mach=RECKLESS), e, policy(), registry(), T0)
    assert d.outcome is Outcome.TRANSITIONED
    assert APPROVER not in d.capabilities
