"""The shipped production policy template loads, passes the registry check, sets every
policy field explicitly, and is stricter than the built-in defaults where it matters."""

from __future__ import annotations

from pathlib import Path

import yaml

from machines import (
    DEFAULT_REGISTRY,
    Policy,
    check_policy_against_machines,
    check_policy_against_registry,
    load_catalogue,
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


def test_the_production_template_bounds_every_wait_of_the_catalogue() -> None:
    # Time is never unbounded (issue #29): the stall bound is on, the timeouts fit the
    # catalogue machines (states, accepted events, only escalating or re-verifying), and
    # retries are paced.
    policy = load_policy(TEMPLATE)
    registry = load_registry(DEFAULT_REGISTRY)
    check_policy_against_machines(policy, load_catalogue(registry).values(), registry, every=True)
    assert 0 < policy.timeouts.stalled_after <= 24 * 3600
    assert policy.timeouts.states
    assert policy.retry_pacing.base > 0


def test_the_production_template_sets_every_policy_field_with_a_comment() -> None:
    data = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    assert set(data) == set(Policy.model_fields)
    lines = TEMPLATE.read_text(encoding="utf-8").splitlines()
    for index, line in enumerate(lines):
        if line and not line.startswith((" ", "#")):
            assert lines[index - 1].startswith("#"), f"{line!r} has no comment above it"
