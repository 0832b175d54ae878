"""The shipped production policy template loads, passes the registry check, sets every
policy field explicitly, and is stricter than the built-in defaults where it matters."""

from __future__ import annotations

from pathlib import Path

import yaml

from machines import (
    DEFAULT_REGISTRY,
    Policy,
    check_policy_against_registry,
    load_policy,
    load_registry,
)

TEMPLATE = Path(__file__).resolve().parents[2] / "ops" / "policy.production.yaml"


def test_the_production_template_loads_and_names_only_registered_capabilities() -> None:
    policy = load_policy(TEMPLATE)
    check_policy_against_registry(policy, load_registry(DEFAULT_REGISTRY))
    assert policy.id == "production"
    assert policy.digest.startswith("sha256:")
    assert policy.require_approval_for_material
    assert policy.deadline_seconds is not None


def test_the_production_template_sets_every_policy_field_with_a_comment() -> None:
    data = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    assert set(data) == set(Policy.model_fields)
    lines = TEMPLATE.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        if line and not line.startswith((" ", "#")):
            assert lines[index - 1].startswith("#"), f"{line!r} has no comment above it"
