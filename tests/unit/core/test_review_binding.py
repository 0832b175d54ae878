"""An approval authorises what the approver saw (SPEC §9; issue #16 class 3): the signed
review digest, new evidence voiding it, a later rejection withdrawing it, and the route
approval into resume-pending not authorising the resume by itself."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from core_support import (
    T0,
    approval,
    checkpoint_event,
    machine,
    policy,
    registry,
    verification,
    view,
)

from machines.approvals import SIGNATURE_DOMAIN, ApprovalRejection, check_decision, review_digest
from machines.decision import apply, decide
from machines.evidence import EvidenceDelta, evidence_changes
from machines.guards import GuardContext, valid_approval
from machines.model import Transition
from machines.view import Approval, evolve


def _ready():  # type: ignore[no-untyped-def]
    v = view("resume-pending")
    for e in (verification("VERIFICATION_FOUND"), checkpoint_event("cp-1", T0)):
        v = apply(v, decide(machine(), v, e, policy(), registry(), T0))
    return v


def test_the_signature_domain_is_versioned():
    assert SIGNATURE_DOMAIN == "agent-recovery/human-decision/v2"


def test_an_approval_signed_over_another_review_is_refused():
    v = _ready()
    reviewed_elsewhere = approval("resume-pending", "resuming", on=view("resume-pending"))
    decision = reviewed_elsewhere.human_decision
    assert (
        check_decision(decision, event_type="HUMAN_APPROVED", view=v, policy=policy(), now=T0)
        is ApprovalRejection.REVIEW_MISMATCH
    )
    fresh = approval("resume-pending", "resuming", on=v).human_decision
    assert (
        check_decision(fresh, event_type="HUMAN_APPROVED", view=v, policy=policy(), now=T0) is None
    )


def test_the_review_digest_changes_with_position_evidence_transition_and_checkpoint():
    v = _ready()
    base = review_digest(v, "resuming", T0, for_resume=True)
    assert review_digest(replace(v, version=v.version + 1), "resuming", T0, for_resume=True) != base
    assert review_digest(v, "closed", T0, for_resume=True) != base
    assert review_digest(v, "resuming", T0, for_resume=False) != base
    newer = apply(
        v,
        decide(
            machine(),
            v,
            checkpoint_event("cp-2", T0 + timedelta(seconds=5), event_id="c2"),
            policy(),
            registry(),
            T0,
        ),
    )
    assert review_digest(replace(newer, version=v.version), "resuming", T0, for_resume=True) != base


def _approved(v, *, for_resume: bool, basis: str = "") -> Approval:  # type: ignore[no-untyped-def]
    return Approval(
        approver="approver-1",
        state="resume-pending",
        transition="resuming",
        machine_digest=v.machine_digest,
        expires_at=T0 + timedelta(minutes=10),
        nonce="n-a",
        decision="approved",
        event_id="h-a",
        for_resume=for_resume,
        basis=basis,
    )


def _ctx(v):  # type: ignore[no-untyped-def]
    return GuardContext(
        v, policy(), T0, Transition("resume-pending", "RESUME_REQUESTED", 0, "resuming")
    )


def test_a_later_rejection_withdraws_earlier_approvals():
    v = _ready()
    v = evolve(v, {"approvals": (_approved(v, for_resume=True),)})
    assert valid_approval(_ctx(v)) is not None
    rejection = replace(
        _approved(v, for_resume=False), decision="rejected", nonce="n-r", event_id="h-r"
    )
    after = evolve(v, evidence_changes(v, EvidenceDelta(approval=rejection)))
    assert [a.withdrawn for a in after.approvals] == [True, False]
    assert valid_approval(_ctx(after)) is None


def test_the_route_approval_authorises_the_resume_only_when_given_for_it():
    v = _ready()
    route = replace(_approved(v, for_resume=False), state="contained", transition="resume-pending")
    assert valid_approval(_ctx(evolve(v, {"approvals": (route,), "entry_approval": "h-a"}))) is None
    given = replace(route, for_resume=True)
    assert (
        valid_approval(_ctx(evolve(v, {"approvals": (given,), "entry_approval": "h-a"})))
        is not None
    )


def test_evidence_after_signing_voids_the_approval():
    from machines.approvals import basis_digest

    v = _ready()
    signed = _approved(v, for_resume=True, basis=basis_digest(v, T0, for_resume=True))
    v = evolve(v, {"approvals": (signed,)})
    assert valid_approval(_ctx(v)) is not None
    later = apply(
        v, decide(machine(), v, verification("VERIFICATION_FOUND", "v9"), policy(), registry(), T0)
    )
    assert valid_approval(_ctx(later)) is None
