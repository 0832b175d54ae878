"""Each catalogue machine's RECOVERY.md has a failure-to-action table (agent-failure-
recovery practice, deliverables; issue 30, class 9): every failure class of practice §1,
the event a tool reports for it, the states that accept that event and what happens.
The table is read here and held to the machine, so it cannot drift from RECOVERY.yaml:
an event is listed as accepted exactly in the states that accept it, and one no state
accepts is named as such."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from machines import CATALOGUE, Machine, load_machine, load_registry
from machines.invariants import DENIAL_EVENTS
from machines.loader import catalogue_packages

CLASSES = (
    "validation or policy denial",
    "not found",
    "version conflict",
    "rate limited",
    "transient dependency failure",
    "cancellation",
    "unknown outcome",
)
HEADING = "## Failure-to-action table"
REGISTRY = load_registry()
PACKAGES = list(catalogue_packages(CATALOGUE))


def _rows(guide: str) -> list[list[str]]:
    """The table's body rows under HEADING, as lists of stripped cells."""
    assert HEADING in guide, f"no '{HEADING}' section"
    section = guide.split(HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header, rule, *body = lines
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "failure",
        "event",
        "accepted in",
        "what happens",
    ]
    assert set(rule.replace("|", "").replace("-", "").strip()) == set()
    return [[c.strip() for c in line.strip("|").split("|")] for line in body]


def _accepting(machine: Machine, event: str) -> set[str]:
    return {s.name for s in machine.states.values() if event in s.on}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_recovery_md_has_a_failure_to_action_table_true_to_the_machine(package: Path) -> None:
    machine = load_machine(package, REGISTRY)
    rows = _rows((package / "RECOVERY.md").read_text(encoding="utf-8"))
    assert {r[0] for r in rows} == set(CLASSES), "every failure class of practice §1, no other"
    events = set()
    for failure, event, accepted, happens in rows:
        (name,) = re.fullmatch(r"`([A-Z][A-Z0-9_]*)`", event).groups()  # type: ignore[union-attr]
        events.add(name)
        listed = set(re.findall(r"`([a-z0-9-]+)`", accepted)) if accepted != "no state" else set()
        assert listed == _accepting(machine, name), f"{failure}: {name} accepted in"
        if not listed:
            assert "no state accepts it" in happens, f"{name}: say that no state accepts it"
    assert DENIAL_EVENTS <= events, "every permanent denial event is in the table"
