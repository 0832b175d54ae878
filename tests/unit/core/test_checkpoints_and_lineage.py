"""Resumption: the newest eligible checkpoint, not the newest saved; lineage and bounds."""

from __future__ import annotations

from datetime import timedelta

from core_support import (
    T0,
    approval,
    checkpoint_event,
    event,
    machine,
    policy,
    registry,
    verification,
    view,
)

from machines.decision import Outcome, apply, decide
from machines.view import checkpoint_digest


def _feed(v, *events):  # type: ignore[no-untyped-def]
    for e in events:
        v = apply(v, decide(machine(), v, e, policy(), registry(), T0))
    return v


def test_newest_eligible_checkpoint_may_be_older_than_newest_saved():
    v = _feed(
        view("resume-pending"),
        checkpoint_event("cp-a", T0, event_id="c1"),
        checkpoint_event(
            "cp-b", T0 + timedelta(minutes=5), event_id="c2", machine_digest="sha256:" + "f" * 64
        ),
        checkpoint_event("cp-c", T0 + timedelta(minutes=9), event_id="c3", validated=False),
    )
    assert [c.checkpoint_id for c in v.checkpoints] == ["cp-a", "cp-b", "cp-c"]
    chosen = v.newest_eligible_checkpoint(T0)
    assert chosen is not None
    assert chosen.checkpoint_id == "cp-a"


def test_checkpoint_validated_by_an_untrusted_validator_is_not_eligible():
    v = _feed(view("resume-pending"), checkpoint_event("cp-a", T0, validator="agent-7"))
    assert v.checkpoints[0].validated is False
    assert v.newest_eligible_checkpoint(T0) is None


def test_resume_is_withheld_and_escalated_when_no_checkpoint_is_eligible():
    v = _feed(view("resume-pending"), verification("VERIFICATION_FOUND"))
    d = decide(machine(), v, approval("resume-pending", "resuming", on=v), policy(), registry(), T0)
    assert d.outcome is Outcome.REJECTED
    assert d.state_after == "resume-pending"
    assert "checkpoint:none-eligible" in d.guards[0].evidence
    assert d.capabilities == ("operator.escalate",)


def test_resume_needs_verified_state():
    v = _feed(view("resume-pending"), checkpoint_event("cp-a", T0))
    d = decide(machine(), v, approval("resume-pending", "resuming", on=v), policy(), registry(), T0)
    assert d.outcome is Outcome.REJECTED


def test_contained_ancestor_blocks_resume_even_with_approval_and_checkpoint():
    v = _feed(
        view("resume-pending"),
        verification("VERIFICATION_FOUND"),
        checkpoint_event("cp-a", T0),
        event("ANCESTOR_CONTAINED", "a1", producer="recovery-controller"),
    )
    assert v.lineage.contained_ancestors == ("op-1",)
    d = decide(machine(), v, approval("resume-pending", "resuming", on=v), policy(), registry(), T0)
    assert d.outcome is Outcome.REJECTED
    assert "contained:op-1" in d.guards[0].evidence


def test_recovery_attempts_are_bounded_by_policy():
    v = _feed(
        view("resume-pending", recovery_attempts=3),
        verification("VERIFICATION_FOUND"),
        checkpoint_event("cp-a", T0),
    )
    d = decide(machine(), v, approval("resume-pending", "resuming", on=v), policy(), registry(), T0)
    assert d.outcome is Outcome.REJECTED
    assert "recovery-attempts:3/3" in d.guards[0].evidence


def test_resume_with_everything_in_place_counts_a_recovery_attempt():
    v = _feed(
        view("resume-pending"), verification("VERIFICATION_FOUND"), checkpoint_event("cp-a", T0)
    )
    d = decide(machine(), v, approval("resume-pending", "resuming", on=v), policy(), registry(), T0)
    assert d.outcome is Outcome.TRANSITIONED
    assert apply(v, d).recovery_attempts == 1


def test_checkpoint_validation_relayed_by_the_affected_agent_is_refused():
    # A validation is the validator's own signed report: relayed by anyone else (here the
    # affected agent) the event is refused as intake refuses it, and nothing is stored.
    from dataclasses import replace

    from core_support import AGENT

    e = replace(checkpoint_event("cp-a", T0), producer=AGENT, payload_digest="")
    d = decide(machine(), view("resume-pending"), e, policy(), registry(), T0)
    assert d.outcome is Outcome.REFUSED
    assert [n.code for n in d.refusals] == ["identity-mismatch"]
    assert apply(view("resume-pending"), d).checkpoints == ()


def test_checkpoint_the_affected_agent_validates_itself_is_not_trusted():
    from core_support import AGENT

    v = _feed(view("resume-pending"), checkpoint_event("cp-a", T0, validator=AGENT))
    assert v.checkpoints[0].validated is False


def test_view_survives_a_json_round_trip_with_every_part_filled():
    import json

    from core_support import approval

    from machines.view import view_from_json, view_to_json

    v = _feed(
        view("resume-pending"),
        verification("VERIFICATION_FOUND"),
        checkpoint_event("cp-a", T0),
        event("ANCESTOR_CONTAINED", "a1", producer="recovery-controller"),
    )
    v = _feed(v, approval("resume-pending", "resuming", "h9", on=v))
    data = json.loads(json.dumps(view_to_json(v)))
    assert view_from_json(data) == v
    assert v.approvals
    assert v.used_nonces


def test_the_resume_command_names_the_newest_eligible_checkpoint_by_id_and_digest():
    v = _feed(
        view("resume-pending"),
        verification("VERIFICATION_FOUND"),
        checkpoint_event("cp-a", T0, event_id="c1"),
        # Newer, but not eligible: the resume must not name it.
        checkpoint_event("cp-b", T0 + timedelta(minutes=9), event_id="c3", validated=False),
    )
    d = decide(machine(), v, approval("resume-pending", "resuming", on=v), policy(), registry(), T0)
    resumes = [i for i in d.invocations if i.kind == "resume"]
    assert len(resumes) == 1
    chosen = v.newest_eligible_checkpoint(T0)
    assert chosen is not None
    assert resumes[0].params["checkpoint_id"] == "cp-a"
    assert resumes[0].params["checkpoint_digest"] == checkpoint_digest(chosen)
    assert "last-verified-checkpoint" not in resumes[0].params.values()
