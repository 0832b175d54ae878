"""Several versions of a machine pinned at once (docs/machine-format.md, "Rollout"): a new
operation opens on the version the lock marks current; an operation stays on the
version it opened under whatever version a later event names, and the decision records
the version named."""

from __future__ import annotations

from datetime import timedelta

import pytest

from consumer import Accepted, DecidedBatch, Intake
from ledger import MemoryLedger
from machines import Machine, Outcome, Pins
from tests.support.producers import roster as producer_roster
from tests.support.rollout import versioned
from tests.unit.consumer.support import (
    FOUND,
    T0,
    decide,
    encoded,
    event,
    pinned,
)

V1 = "email-send@1.0.0"


def _v2() -> Machine:
    def described(data: dict) -> None:  # type: ignore[type-arg]
        data["description"] = data["description"] + " Version 2."

    return versioned("email-send", "2.0.0", described)


def _pins(current: str) -> Pins:
    machines, _ = pinned()
    both = {**machines, "email-send@2.0.0": _v2()}
    return Pins(both, {"email-send": current})


def _plan(raws: list, ledger: MemoryLedger, pins: Pins) -> DecidedBatch:  # type: ignore[type-arg]
    intake = Intake(pins, roster=producer_roster(), max_record_bytes=65536)
    return decide(ledger, raws, now=T0 + timedelta(minutes=1), intake=intake, pins=pins)


def test_a_name_pinned_at_two_versions_needs_a_current_one() -> None:
    machines, _ = pinned()
    with pytest.raises(ValueError, match="none is marked current"):
        Pins({**machines, "email-send@2.0.0": _v2()})
    with pytest.raises(ValueError, match="not pinned"):
        Pins(machines, {"email-send": "3.0.0"})


def test_intake_accepts_an_unpinned_version_of_a_pinned_machine_for_the_batch_to_judge() -> None:
    pins = _pins("1.0.0")
    intake = Intake(pins, roster=producer_roster(), max_record_bytes=65536)
    outcome = intake.examine(encoded(event("TOOL_TIMEOUT", version="9.9.9"), 0))
    assert isinstance(outcome, Accepted)
    assert outcome.unpinned
    assert outcome.machine.version == "1.0.0"


def test_an_event_naming_an_unpinned_version_cannot_open_an_operation() -> None:
    planned = _plan(
        [encoded(event("TOOL_TIMEOUT", version="9.9.9"), 0)], MemoryLedger(), _pins("1.0.0")
    )
    assert [r.code for _, r in planned.refused] == ["machine-unpinned"]
    assert "9.9.9" in planned.refused[0][1].reason
    assert not planned.decisions


def test_a_new_operation_opens_on_the_current_version_whatever_version_it_names() -> None:
    ledger = MemoryLedger()
    planned = _plan([encoded(event("TOOL_TIMEOUT", version="1.0.0"), 0)], ledger, _pins("2.0.0"))
    (decision,) = planned.decisions
    assert (decision.machine_version, decision.machine_digest) == ("2.0.0", _v2().digest)
    assert decision.named_version == "1.0.0"
    assert decision.to_dict()["machine"]["named_version"] == "1.0.0"
    ledger.commit(planned.batch)
    info = ledger.operation("op-1")
    assert (info.machine_version, info.machine_digest) == ("2.0.0", _v2().digest)


def test_an_operation_stays_on_its_version_when_events_name_another() -> None:
    ledger = MemoryLedger()
    v1 = pinned()[0][V1]
    ledger.commit(_plan([encoded(event("TOOL_TIMEOUT"), 0)], ledger, _pins("1.0.0")).batch)
    # The lock now makes 2.0.0 current; tools already name it, or a version not pinned.
    raws = [
        encoded(event("TOOL_FAILED", version="9.9.9", event_id="e2"), 1),
        encoded(event("VERIFICATION_FOUND", version="2.0.0", event_id="e3", evidence=FOUND), 2),
    ]  # fmt: skip
    planned = _plan(raws, ledger, _pins("2.0.0"))
    assert not planned.refused, planned.refused
    assert [d.machine_digest for d in planned.decisions] == [v1.digest, v1.digest]
    assert [d.named_version for d in planned.decisions] == ["9.9.9", "2.0.0"]
    assert not [n for d in planned.decisions for n in d.refusals if n.code == "machine-mismatch"]
    assert all(d.outcome is not Outcome.REFUSED for d in planned.decisions)
    ledger.commit(planned.batch)
    assert ledger.operation("op-1").machine_version == "1.0.0"


def test_an_operation_whose_version_is_no_longer_pinned_is_dead_lettered_naming_it() -> None:
    ledger = MemoryLedger()
    ledger.commit(_plan([encoded(event("TOOL_TIMEOUT"), 0)], ledger, _pins("1.0.0")).batch)
    only_v2 = Pins({**{k: m for k, m in pinned()[0].items() if k != V1}, "email-send@2.0.0": _v2()})
    planned = _plan([encoded(event("TOOL_FAILED", event_id="e2"), 1)], ledger, only_v2)
    ((_, refusal),) = planned.refused
    assert refusal.code == "machine-unpinned"
    assert "email-send@1.0.0" in refusal.reason
    assert "redrive" in refusal.reason
