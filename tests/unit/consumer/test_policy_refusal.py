"""The controller runs only under an explicit policy without public-name keys, unless in
demo mode, which says so loudly (issues 19 and 14 item 4; docs/controller.md, "Policy
and demo mode"). The process-level refusals (`recoveryctl run` exits 2) are in
tests/integration/consumer/test_policy_guard.py."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import ControllerSettings, PolicyRefused, controller_policy, load_rules
from machines import insecure_test_key, public_key_b64
from ops.cli import build_parser

OPS = Path(__file__).resolve().parents[3] / "ops"
DEMO_POLICY = OPS / "demo_policy.yaml"
TEMPLATE = OPS / "policy.production.yaml"


def _settings(**fields: object) -> ControllerSettings:
    return ControllerSettings(
        bootstrap="unused:9092",
        database_url="postgresql:///unused",
        instance_id="controller-t",
        **fields,  # type: ignore[arg-type]
    )


def _demo_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_without_a_policy_file_the_controller_refuses_and_says_how_to_give_one() -> None:
    with pytest.raises(PolicyRefused) as caught:
        load_rules(_settings())
    message = str(caught.value)
    assert message.startswith("controller-policy-missing: controller controller-t ")
    for hint in (
        "RECOVERY_CONTROLLER_POLICY_PATH",
        "--policy FILE",
        "ops/policy.production.yaml",
        "RECOVERY_DEMO_MODE=1",
        "--demo",
    ):
        assert hint in message


def test_a_public_name_key_is_refused_naming_the_holder_and_the_name() -> None:
    with pytest.raises(PolicyRefused) as caught:
        load_rules(_settings(policy_path=DEMO_POLICY))
    message = str(caught.value)
    assert message.startswith("controller-public-name-key-refused: policy demo ")
    assert "approvers[approver-dana]" in message
    assert "insecure_test_key('approver-dana')" in message
    assert "RECOVERY_DEMO_MODE=1" in message


def test_any_key_derived_from_a_name_in_the_policy_is_refused(tmp_path: Path) -> None:
    policy = {
        "id": "prod",
        "trusted_verifiers": ["payment.verify-refund"],
        "approvers": [
            {
                "id": "approver-jane",
                "public_key": public_key_b64(insecure_test_key("payment.verify-refund")),
            }
        ],
    }
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(policy), encoding="utf-8")
    with pytest.raises(PolicyRefused, match=r"insecure_test_key\('payment.verify-refund'\)"):
        controller_policy(_settings(policy_path=path))


def test_an_explicit_policy_with_real_keys_runs_without_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    jane = {"id": "approver-jane", "public_key": base64.b64encode(raw).decode()}
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"id": "prod", "approvers": [jane]}), encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="consumer")
    assert controller_policy(_settings(policy_path=path)).id == "prod"
    _, rules = load_rules(_settings(policy_path=TEMPLATE))
    assert rules.policy.id == "production"
    assert _demo_messages(caplog) == []


def test_demo_mode_runs_the_built_in_policy_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="consumer")
    _, rules = load_rules(_settings(demo_mode=True))
    assert rules.policy.id == "default"
    (warning,) = _demo_messages(caplog)
    assert "controller controller-t RUNS IN DEMO MODE (RECOVERY_DEMO_MODE)" in warning
    assert "no trusted verifier, no approver" in warning


def test_demo_mode_warns_about_each_public_name_key(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="consumer")
    _, rules = load_rules(_settings(policy_path=DEMO_POLICY, demo_mode=True))
    assert rules.policy.id == "demo"
    banner, key = _demo_messages(caplog)
    assert "RUNS IN DEMO MODE" in banner
    assert f"policy demo from {DEMO_POLICY}" in banner
    assert "PUBLIC-NAME KEY" in key
    assert "approvers[approver-dana]" in key
    assert "insecure_test_key('approver-dana')" in key


def test_the_pre_check_refuses_as_the_controller_does_but_stays_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="consumer")
    controller_policy(_settings(policy_path=DEMO_POLICY, demo_mode=True), warn=False)
    assert _demo_messages(caplog) == []
    with pytest.raises(PolicyRefused):
        controller_policy(_settings(policy_path=DEMO_POLICY), warn=False)


@pytest.mark.parametrize(
    ("env", "demo"),
    [
        ({"RECOVERY_DEMO_MODE": "1"}, True),
        ({"RECOVERY_DEMO_MODE": "0"}, False),
        ({"RECOVERY_CONTROLLER_DEMO_MODE": "true"}, True),
        ({}, False),
    ],
)
def test_demo_mode_comes_from_the_environment(env: dict[str, str], demo: bool) -> None:
    base = {"RECOVERY_KAFKA_BOOTSTRAP": "k:9092", "RECOVERY_DATABASE_URL": "postgresql://db/x"}
    assert ControllerSettings.from_env({**base, **env}).demo_mode is demo


def test_recoveryctl_run_takes_the_policy_and_demo_mode_as_flags() -> None:
    args = build_parser().parse_args(["run", "--policy", "/etc/recovery/policy.yaml", "--demo"])
    assert (args.policy, args.demo) == ("/etc/recovery/policy.yaml", True)
    defaults = build_parser().parse_args(["run"])
    assert (defaults.policy, defaults.demo) == (None, False)


def test_recoveryctl_run_help_says_how_to_give_the_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for hint in ("--policy FILE", "RECOVERY_CONTROLLER_POLICY_PATH", "ops/policy.production.yaml"):
        assert hint in text
    assert "--demo" in text
    assert "RECOVERY_DEMO_MODE=1" in text
