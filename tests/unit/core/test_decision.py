"""The pure decision: selection order, duplicates, final states, guard failures, records."""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType

from core_support import (
    GUARD_IMPLS,
    T0,
    custom_machine,
    event,
    machine,
    policy,
    registry,
    st,
    tr,
    verification,
    view,
)

from machines.decision import Outcome, apply, decide
from machines.guards import STANDARD_GUARDS, GuardContext, GuardResult
from machines.model import GuardSpec


def _decide(v, e, **kw):  # type: ignore[no-untyped-def]
    return decide(kw.pop("mach", machine()), v, e, kw.pop("pol", policy()), registry(), T0, **kw)


def test_transition_records_states_and_invokes_target_entry_actions():
    d = _decide(view(), event("TOOL_TIMEOUT"))
    assert d.outcome is Outcome.TRANSITIONED
    assert (d.state_before, d.state_after) == ("running", "verifying")
    assert d.capabilities == ("tool.verify",)
    assert d.invocations[0].origin == "entry"
    assert d.invocations[0].command_id == "op-1:1:0"


def test_transition_actions_come_before_entry_actions():
    m = custom_machine(
        st("running", tr("running", "TOOL_FAILED", 0, "held", None, ("operator.notify",))),
        st("held", entry=("operator.escalate",)),
    )
    d = _decide(view(mach=m), event("TOOL_FAILED"), mach=m)
    assert [(i.capability, i.origin) for i in d.invocations] == [
        ("operator.notify", "transition"),
        ("operator.escalate", "entry"),
    ]


def test_first_true_guard_wins_and_later_candidates_are_not_evaluated():
    d = _decide(view("verifying"), verification("VERIFICATION_NOT_FOUND"))
    assert d.state_after == "retrying"
    assert [(g.guard, g.value) for g in d.guards] == [("retry.permitted", True)]


def test_unguarded_default_is_taken_when_every_guard_is_false():
    d = _decide(view("verifying", key=None), verification("VERIFICATION_NOT_FOUND"))
    assert d.state_after == "contained"
    assert [(g.guard, g.value) for g in d.guards] == [("retry.permitted", False)]
    assert "tool.retry" not in d.capabilities


def test_event_not_accepted_leaves_state_and_records_escalated_rejection():
    d = _decide(view(), event("RETRY_SUCCEEDED"))
    assert d.outcome is Outcome.REJECTED
    assert d.state_after == "running"
    assert [n.code for n in d.refusals] == ["no-transition"]
    assert d.capabilities == ("operator.escalate",)
    assert d.invocations[0].params["reason"] == "no-transition"


def test_rejection_is_only_recorded_when_policy_does_not_escalate():
    p = policy(escalate_rejected_events=False)
    d = _decide(view(pol=p), event("RETRY_SUCCEEDED"), pol=p)
    assert d.outcome is Outcome.REJECTED
    assert d.invocations == ()


def test_final_state_accepts_nothing():
    for event_type in ("STEP_COMPLETED", "TOOL_TIMEOUT", "HUMAN_APPROVED"):
        d = _decide(view("done"), event(event_type))
        assert d.outcome is Outcome.FINAL
        assert d.state_after == "done"
        assert d.invocations == ()


def test_duplicate_event_changes_nothing():
    v0 = view()
    e = event("TOOL_TIMEOUT")
    v1 = apply(v0, _decide(v0, e))
    d = _decide(v1, e)
    assert d.outcome is Outcome.DUPLICATE
    assert d.invocations == ()
    assert apply(v1, d) == v1


def test_same_event_id_with_different_payload_is_a_conflict_that_keeps_the_first():
    v0 = view()
    first = event("TOOL_TIMEOUT", "e1")
    v1 = apply(v0, _decide(v0, first))
    d = _decide(v1, event("STEP_COMPLETED", "e1"))
    assert d.outcome is Outcome.CONFLICT
    assert apply(v1, d).seen_events["e1"] == first.payload_digest


def test_event_for_another_operation_is_refused():
    d = _decide(view(), event("TOOL_TIMEOUT", operation_id="op-2"))
    assert d.outcome is Outcome.REFUSED
    assert d.refusals[0].code == "wrong-operation"


def test_event_naming_another_machine_version_is_decided_by_the_pinned_one():
    d = _decide(view(), event("TOOL_TIMEOUT", machine_version="2.0.0"))
    assert d.outcome is not Outcome.REFUSED
    assert d.named_version == "2.0.0"
    assert d.to_dict()["machine"]["named_version"] == "2.0.0"
    assert "named_version" not in _decide(view(), event("TOOL_TIMEOUT")).to_dict()["machine"]


def test_event_naming_another_machine_is_refused():
    d = _decide(view(), event("TOOL_TIMEOUT", machine_name="other-machine"))
    assert d.outcome is Outcome.REFUSED
    assert d.refusals[0].code == "machine-mismatch"
    assert d.state_after == "running"


def test_raising_guard_is_false_with_controller_error_and_never_retries():
    def boom(ctx: GuardContext) -> GuardResult:
        raise RuntimeError("ledger view corrupt")

    table = dict(STANDARD_GUARDS, **{"standard.retry_permitted": boom})
    d = _decide(view("verifying"), verification("VERIFICATION_NOT_FOUND"), guard_table=table)
    assert d.guards[0].value is False
    assert d.errors[0].code == "guard-failed"
    assert "ledger view corrupt" in d.errors[0].message
    assert "tool.retry" not in d.capabilities


def test_guard_returning_a_non_boolean_is_false_with_error():
    def sloppy(ctx: GuardContext) -> GuardResult:
        return GuardResult(1)  # type: ignore[arg-type]

    table = dict(STANDARD_GUARDS, **{"standard.retry_permitted": sloppy})
    d = _decide(view("verifying"), verification("VERIFICATION_NOT_FOUND"), guard_table=table)
    assert d.errors[0].code == "guard-failed"
    assert d.state_after == "contained"


def test_guard_missing_from_registry_is_false_with_guard_unknown_error():
    reg = registry()
    guards = {g: s for g, s in reg.guards.items() if g != "retry.permitted"}
    reg = replace(reg, guards=MappingProxyType(guards))
    d = decide(
        machine(), view("verifying"), verification("VERIFICATION_NOT_FOUND"), policy(), reg, T0
    )
    assert d.guards[0].value is False
    assert d.errors[0].code == "guard-unknown"


def test_guard_with_unprovided_implementation_is_false_with_guard_unavailable_error():
    reg = registry()
    guards = dict(reg.guards)
    guards["retry.permitted"] = GuardSpec(id="retry.permitted", implementation="custom.retry")
    reg = replace(reg, guards=MappingProxyType(guards))
    d = decide(
        machine(), view("verifying"), verification("VERIFICATION_NOT_FOUND"), policy(), reg, T0
    )
    assert d.errors[0].code == "guard-unavailable"
    assert "tool.retry" not in d.capabilities


def test_decision_is_equal_when_replayed_and_serialises_to_stable_json():
    v, e = view("verifying"), verification("VERIFICATION_NOT_FOUND")
    a, b = _decide(v, e), _decide(v, e)
    assert a == b
    text = json.dumps(a.to_dict(), sort_keys=True)
    assert text == json.dumps(b.to_dict(), sort_keys=True)
    data = json.loads(text)
    assert data["guards"][0]["guard"] == "retry.permitted"
    assert data["transition"] == {"index": 0, "target": "retrying"}


def test_apply_counts_retries_and_starts_a_new_evidence_epoch():
    v = view("verifying")
    d = _decide(v, verification("VERIFICATION_NOT_FOUND"))
    after = apply(v, d)
    assert (after.retry_attempts, after.budget_spent, after.epoch) == (1, 1, 1)
    assert after.version == 1
    assert after.current_outcomes() == frozenset()


def test_old_not_applied_evidence_cannot_authorise_a_second_retry():
    v = view("verifying")
    v = apply(v, _decide(v, verification("VERIFICATION_NOT_FOUND", "v1")))
    v = apply(v, _decide(v, event("RETRY_FAILED", "e2")))
    assert v.state == "verifying"
    d = _decide(v, verification("VERIFICATION_FOUND", "v2"))
    assert d.state_after == "done"


def test_registry_guard_table_covers_every_standard_implementation():
    assert set(GUARD_IMPLS.values()) == set(STANDARD_GUARDS)


def test_action_result_must_answer_an_open_command_of_this_operation():
    v0 = view("verifying")
    d = _decide(v0, verification("VERIFICATION_NOT_FOUND"))
    retry_command = d.invocations[0].command_id
    v1 = apply(v0, d)
    assert retry_command in v1.open_commands
    forged = _decide(v1, event("RETRY_SUCCEEDED", "r0", causation="op-1:99:0"))
    assert forged.outcome is Outcome.REFUSED
    assert forged.refusals[0].code == "unknown-command"
    answer = _decide(v1, event("RETRY_SUCCEEDED", "r1", causation=retry_command))
    assert answer.state_after == "done"
    assert retry_command not in apply(v1, answer).open_commands


def test_view_in_a_state_the_machine_does_not_define_is_refused():
    d = _decide(view("nowhere"), event("TOOL_TIMEOUT"))
    assert d.outcome is Outcome.REFUSED
    assert d.refusals[0].code == "unknown-state"
    assert d.invocations == ()
