"""Which producer role each event must come from (SPEC §7.7; issue #16 class 7): a
machine's optional `producers` block, checked at load, and `Machine.producer_roles`, the
answer the roster's intake check asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from machines import Registry, load_catalogue, load_registry
from machines.errors import Code
from machines.loader import validate_text
from machines.model import PRODUCER_ROLES

BASE = (Path(__file__).parent / "invalid" / "26-initial-not-a-state.yaml").read_text()
VALID = BASE.replace("initial: started", "initial: failure-reported")


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry()


def test_the_roles_are_the_rosters_names() -> None:
    assert PRODUCER_ROLES == (
        "tool",
        "verifier",
        "worker",
        "validator",
        "orchestrator",
        "classifier",
        "approver",
        "controller",
    )


def test_a_catalogue_machine_answers_the_cores_defaults(registry: Registry) -> None:
    for machine in load_catalogue(registry).values():
        assert machine.producer_roles("VERIFICATION_FOUND") == ("verifier",)
        assert machine.producer_roles("HUMAN_APPROVED") == ("approver",)
        assert machine.producer_roles("RETRY_SUCCEEDED") == ("worker",)
        assert machine.producer_roles("ANCESTOR_CONTAINED") == ("controller",)
        assert machine.producer_roles("TOOL_TIMEOUT") == ()


def test_a_declared_producers_block_loads_and_overrides_the_defaults(registry: Registry) -> None:
    text = VALID + "producers:\n  TOOL_TIMEOUT: [tool]\n  VERIFICATION_FOUND: [verifier, worker]\n"
    report = validate_text(text, registry)
    assert report.valid, report.errors
    assert report.machine is not None
    assert report.machine.producer_roles("TOOL_TIMEOUT") == ("tool",)
    assert report.machine.producer_roles("VERIFICATION_FOUND") == ("verifier", "worker")
    # Absent, the digest is what it always was: the catalogue's signatures still hold.
    assert validate_text(VALID, registry).digest != report.digest


def test_a_producers_block_naming_an_event_no_state_accepts_is_refused(registry: Registry) -> None:
    report = validate_text(VALID + "producers:\n  NEVER_SENT: [tool]\n", registry)
    assert [p.code for p in report.errors] == [Code.PRODUCERS_EVENT_UNKNOWN]


def test_a_producers_block_naming_an_unknown_role_is_refused(registry: Registry) -> None:
    report = validate_text(VALID + "producers:\n  TOOL_TIMEOUT: [the-agent-itself]\n", registry)
    assert not report.valid
