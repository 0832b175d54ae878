"""Signed human decisions: canonical binding, each distinct rejection, spending, expiry."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from core_support import APPROVER, T0, approval, machine, policy, registry, view

from machines.approvals import (
    ApprovalRejection,
    check_decision,
    insecure_test_key,
    sign_decision,
    signing_payload,
)
from machines.decision import Outcome, apply, decide


def _check(e, v=None, now=T0):  # type: ignore[no-untyped-def]
    return check_decision(
        e.human_decision,
        event_type=e.event_type,
        view=v or view("resume-pending"),
        policy=policy(),
        now=now,
    )


def test_valid_signed_approval_is_accepted():
    assert _check(approval("resume-pending", "resuming")) is None


def test_signature_covers_every_bound_field():
    e = approval("resume-pending", "resuming")
    signed = e.human_decision
    assert signed is not None
    for field, value in [
        ("transition", "closed"),
        ("state", "contained"),
        ("nonce", "n2"),
        ("expires_at", T0 + timedelta(days=9)),
    ]:
        forged = replace(signed, **{field: value})
        assert signing_payload(forged) != signing_payload(signed)
        assert _check(replace(e, human_decision=forged)) is not None


@pytest.mark.parametrize(
    ("kwargs", "state", "expected"),
    [
        ({"approver": "mallory"}, "resume-pending", ApprovalRejection.UNKNOWN_APPROVER),
        ({"key": "mallory"}, "resume-pending", ApprovalRejection.BAD_SIGNATURE),
        ({"operation_id": "op-2"}, "resume-pending", ApprovalRejection.WRONG_OPERATION),
        ({}, "contained", ApprovalRejection.STALE_STATE),
        ({"digest": "sha256:" + "b" * 64}, "resume-pending", ApprovalRejection.OTHER_MACHINE),
        ({"expires": T0}, "resume-pending", ApprovalRejection.EXPIRED),
        ({"approver": "agent-7"}, "resume-pending", ApprovalRejection.APPROVER_IN_LINEAGE),
        ({"approver": "agent-parent"}, "resume-pending", ApprovalRejection.APPROVER_IN_LINEAGE),
    ],
)
def test_each_binding_failure_has_its_own_reason(kwargs, state, expected):  # type: ignore[no-untyped-def]
    e = approval(state, "resuming", **kwargs)
    assert _check(e) is expected


def test_replayed_nonce_is_refused():
    v = view("resume-pending", used_nonces=frozenset({"n1"}))
    assert _check(approval("resume-pending", "resuming"), v) is ApprovalRejection.REPLAYED_NONCE


def test_approver_without_an_approval_role_is_refused():
    p = policy()
    roster = tuple(
        a.model_copy(update={"roles": ("viewer",)}) if a.id == APPROVER else a for a in p.approvers
    )
    p = p.model_copy(update={"approvers": roster})
    e = approval("resume-pending", "resuming")
    assert (
        check_decision(
            e.human_decision, event_type=e.event_type, view=view("resume-pending"), policy=p, now=T0
        )
        is ApprovalRejection.ROLE_NOT_PERMITTED
    )


def test_rejection_block_on_an_approved_event_is_refused():
    e = approval("resume-pending", "closed", event_type="HUMAN_REJECTED")
    flipped = replace(e, event_type="HUMAN_APPROVED")
    assert _check(flipped) is ApprovalRejection.DECISION_MISMATCH


def test_missing_decision_block_is_refused():
    e = replace(approval("resume-pending", "resuming"), human_decision=None)
    assert _check(e) is ApprovalRejection.MISSING


def _resume_ready():  # type: ignore[no-untyped-def]
    from core_support import checkpoint_event, verification

    v = view("resume-pending")
    for e in (verification("VERIFICATION_FOUND"), checkpoint_event("cp-1", T0)):
        v = apply(v, decide(machine(), v, e, policy(), registry(), T0))
    return v


def test_resume_spends_the_approval_and_it_cannot_be_used_twice():
    v = _resume_ready()
    d = decide(machine(), v, approval("resume-pending", "resuming", on=v), policy(), registry(), T0)
    assert d.outcome is Outcome.TRANSITIONED
    assert d.capabilities == ("agent.resume",)
    assert d.approval_consumed
    after = apply(v, d)
    assert all(a.consumed for a in after.approvals)


def test_restart_does_not_revive_an_expired_approval():
    v = _resume_ready()
    e = approval("resume-pending", "resuming", expires=T0 + timedelta(minutes=1))
    # The approval arrived in time but the decision happens after expiry (a restart
    # reloads the same view; time has moved on).
    d = decide(machine(), v, e, policy(), registry(), T0 + timedelta(minutes=5))
    assert d.outcome is Outcome.REFUSED
    assert d.refusals[0].code == ApprovalRejection.EXPIRED


def test_sign_decision_is_deterministic_for_ed25519():
    e = approval("resume-pending", "resuming")
    assert e.human_decision is not None
    again = sign_decision(replace(e.human_decision, signature=""), insecure_test_key(APPROVER))
    assert again.signature == e.human_decision.signature
