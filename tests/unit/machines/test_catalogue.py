"""Every machine of the shipped catalogue validates against the shipped registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from machines import CATALOGUE, Registry, load_catalogue, load_machine, load_registry, validate_path
from machines.loader import catalogue_packages
from machines.model import CapabilityKind

PACKAGES = list(catalogue_packages())
REQUIRED = {
    "procurement-request",
    "email-send",
    "payment-refund",
    "multistep-deployment",
    "delegated-research",
}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry()


def test_catalogue_holds_the_five_required_machines() -> None:
    assert {p.name for p in PACKAGES} >= REQUIRED


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_catalogue_machine_validates_without_errors_or_warnings(
    package: Path, registry: Registry
) -> None:
    report = validate_path(package, registry)
    assert report.errors == ()
    assert report.warnings == ()
    assert report.valid
    assert report.digest is not None
    assert report.digest.startswith("sha256:")


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_catalogue_package_has_guide_and_tests_folder(package: Path) -> None:
    assert (package / "RECOVERY.md").is_file()
    assert (package / "tests").is_dir()


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_catalogue_machine_has_resume_gate_escalation_containment_and_finals(
    package: Path, registry: Registry
) -> None:
    machine = load_machine(package, registry)
    assert "resume-pending" in machine.states
    gate = machine.transitions_for("resume-pending", "RESUME_REQUESTED")
    assert [t.guard for t in gate] == ["resume.permitted"]
    assert "containing" in machine.states
    assert any(s.final for s in machine.states.values())
    kinds = {
        registry.capabilities[a.capability].kind
        for s in machine.states.values()
        for ts in s.on.values()
        for t in ts
        for a in t.actions
    }
    assert {CapabilityKind.STOP, CapabilityKind.REVOKE, CapabilityKind.ESCALATE} <= kinds


def test_email_send_never_retries(registry: Registry) -> None:
    machine = load_machine(CATALOGUE / "email-send", registry)
    kinds = {
        registry.capabilities[a.capability].kind
        for s in machine.states.values()
        for ts in s.on.values()
        for t in ts
        for a in t.actions
    }
    assert CapabilityKind.RETRY not in kinds


def test_delegated_research_stops_and_revokes_as_separate_actions_on_ancestor_containment(
    registry: Registry,
) -> None:
    machine = load_machine(CATALOGUE / "delegated-research", registry)
    (transition,) = machine.transitions_for("failure-reported", "ANCESTOR_CONTAINED")
    assert [a.capability for a in transition.actions] == [
        "agent.stop-task",
        "credentials.revoke-delegation",
    ]
    assert transition.target == "containing"


def test_load_catalogue_returns_every_machine_by_name(registry: Registry) -> None:
    machines = load_catalogue(registry)
    assert set(machines) >= REQUIRED
    assert all(m.name == name for name, m in machines.items())
