"""A controller whose roster admits nobody, or nobody who may open an operation, says so
loudly at start (an ERROR naming the fix) instead of dead-lettering every event in
silence (issue #31: the template policy under compose)."""

from __future__ import annotations

import logging

import pytest

from consumer import Controller, ControllerSettings
from consumer.controller import roster_gap
from ledger import MemoryLedger
from machines import Grant, Policy, ProducerEntry, ProducerKey, Role, Roster, Rules
from tests.support.producers import with_roster
from tests.unit.consumer.support import GROUP, pinned

_KEY = ProducerKey(public_key="A" * 43 + "=")


def _entry(producer: str, role: Role) -> ProducerEntry:
    return ProducerEntry(id=producer, keys=(_KEY,), grants=(Grant(role=role),))


def test_a_roster_of_the_controller_alone_admits_nobody() -> None:
    roster = Roster(producers=(_entry("recovery-controller", Role.CONTROLLER),))
    assert "ADMITS NOBODY" in str(roster_gap(roster, "recovery-controller"))
    assert "ADMITS NOBODY" in str(roster_gap(Roster(), "recovery-controller"))


def test_a_roster_without_a_tool_opens_nothing() -> None:
    roster = Roster(producers=(_entry("w-1", Role.WORKER), _entry("a-1", Role.APPROVER)))
    gap = roster_gap(roster, "recovery-controller")
    assert gap is not None
    assert "NO PRODUCER MAY OPEN" in gap
    assert "a-1, w-1" in gap


def test_a_roster_with_a_tool_is_fine() -> None:
    roster = Roster(producers=(_entry("t-1", Role.TOOL),))
    assert roster_gap(roster, "recovery-controller") is None


@pytest.mark.parametrize(
    ("policy", "logged"),
    [(Policy(id="template"), "ADMITS NOBODY"), (with_roster(Policy(id="unit")), None)],
)
def test_the_controller_logs_an_error_at_start(
    caplog: pytest.LogCaptureFixture, policy: Policy, logged: str | None
) -> None:
    machines, rules = pinned()
    settings = ControllerSettings(bootstrap="unused:9092", database_url="unused", group_id=GROUP)
    with caplog.at_level(logging.INFO, logger="consumer"):
        Controller(
            settings,
            MemoryLedger(),
            machines=machines,
            rules=Rules(policy=policy, registry=rules.registry),
        )
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    if logged is None:
        assert errors == []
    else:
        (message,) = errors
        assert logged in message
        assert "recoveryctl roster add" in message
