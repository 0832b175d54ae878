"""Policy files: validation, refusal of loosening, and checks against the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from core_support import policy, registry

from machines.policy import PolicyError, check_policy_against_registry, load_policy, parse_policy


@pytest.mark.parametrize(
    "key", ["allow_self_approval", "allow_retry_from_unknown", "reset_budgets_on_restart"]
)
def test_policy_that_would_loosen_an_invariant_is_refused_by_name(key):  # type: ignore[no-untyped-def]
    with pytest.raises(PolicyError, match=key):
        parse_policy({"id": "p", key: True})


def test_unknown_policy_key_is_refused():
    with pytest.raises(PolicyError, match="max_retries"):
        parse_policy({"id": "p", "max_retries": 9})


def test_classifier_may_not_be_allowed_to_propose_authority_events():
    with pytest.raises(PolicyError, match="HUMAN_APPROVED"):
        parse_policy({"id": "p", "classifier": {"allowed_events": ["HUMAN_APPROVED"]}})


def test_classifier_confidence_floor_cannot_be_lowered_below_one_half():
    with pytest.raises(PolicyError, match="min_confidence"):
        parse_policy({"id": "p", "classifier": {"min_confidence": 0.3}})


def test_attempt_limits_have_a_hard_ceiling():
    with pytest.raises(PolicyError, match="max_retry_attempts"):
        parse_policy({"id": "p", "max_retry_attempts": 1000})


def test_approver_key_must_be_a_32_byte_ed25519_key():
    with pytest.raises(PolicyError, match="32 bytes"):
        parse_policy({"id": "p", "approvers": [{"id": "a", "public_key": "AAAA"}]})


def test_duplicate_approver_ids_are_refused():
    key = policy().approvers[0].public_key
    with pytest.raises(PolicyError, match="listed twice"):
        parse_policy({"id": "p", "approvers": [{"id": "a", "public_key": key}] * 2})


def test_policy_naming_unregistered_capability_is_refused():
    with pytest.raises(PolicyError, match=r"tool\.nuke"):
        check_policy_against_registry(policy(forbidden_capabilities=["tool.nuke"]), registry())


def test_escalation_capability_must_escalate_or_notify():
    with pytest.raises(PolicyError, match="needs escalate or notify"):
        check_policy_against_registry(policy(escalation_capability="tool.retry"), registry())


def test_valid_policy_passes_registry_check_and_loads_from_yaml(tmp_path: Path):
    check_policy_against_registry(policy(), registry())
    path = tmp_path / "policy.yaml"
    path.write_text("id: ops-2026\nmax_retry_attempts: 2\ntrusted_verifiers: [status-api]\n")
    loaded = load_policy(path)
    assert loaded.max_retry_attempts == 2
    assert (
        loaded.digest
        == parse_policy(
            {"id": "ops-2026", "max_retry_attempts": 2, "trusted_verifiers": ["status-api"]}
        ).digest
    )
    assert loaded.digest != policy().digest


def test_escalation_params_must_fit_the_capability_schema():
    from dataclasses import replace
    from types import MappingProxyType

    reg = registry()
    caps = dict(reg.capabilities)
    schema = {
        "type": "object",
        "required": ["queue"],
        "properties": {"queue": {"type": "string"}, "reason": {"type": "string"}},
        "additionalProperties": False,
    }
    caps["operator.escalate"] = replace(
        caps["operator.escalate"], params_schema=MappingProxyType(schema)
    )
    reg = replace(reg, capabilities=MappingProxyType(caps))
    with pytest.raises(PolicyError, match="params schema"):
        check_policy_against_registry(policy(), reg)
    check_policy_against_registry(policy(escalation_params={"queue": "ops"}), reg)


@pytest.mark.parametrize("event", ["STEP_COMPLETED", "DEPLOY_SUCCEEDED", "EFFECT_CONFIRMED"])
def test_a_classifier_may_not_be_allowed_an_event_that_reports_success(event):  # type: ignore[no-untyped-def]
    with pytest.raises(PolicyError, match=event):
        parse_policy({"id": "p", "classifier": {"allowed_events": [event]}})


def test_a_classifier_event_that_would_retry_complete_or_resume_is_refused_at_load():  # type: ignore[no-untyped-def]
    from consumer import ControllerSettings, load_rules
    from machines import check_policy_against_machines

    pinned, rules = load_rules(
        ControllerSettings(bootstrap="unused", database_url="unused", demo_mode=True)
    )
    machines = list(pinned.values())
    check_policy_against_machines(parse_policy({"id": "ok"}), machines, rules.registry)
    # Past the name check (a custom event name the validator cannot know), the machines
    # themselves say what the event would do: here it completes a deployment, and a
    # resume request would resume an agent.
    base = parse_policy({"id": "p"})
    for event, where in [
        ("STEP_COMPLETED", "rolling-out --STEP_COMPLETED--> completed completes"),
        ("RESUME_REQUESTED", "resume-pending --RESUME_REQUESTED--> resumed completes"),
    ]:
        loose = base.model_copy(
            update={"classifier": base.classifier.model_copy(update={"allowed_events": (event,)})}
        )
        with pytest.raises(PolicyError, match=where):
            check_policy_against_machines(loose, machines, rules.registry)
    done = parse_policy({"id": "p", "classifier": {"allowed_events": ["DUPLICATE_DETECTED"]}})
    check_policy_against_machines(done, machines, rules.registry)
