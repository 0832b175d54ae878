"""What an event must carry about its operation. applies_to, always (SPEC §8 step 2):
the event that opens an operation carries the scope its machine is matched on; without
one, or with one the machine does not admit, it is dead-lettered and opens nothing;
later events may leave the scope out. And every event carries its operation's
correlation id (SPEC §6.2)."""

from __future__ import annotations

from datetime import timedelta

from consumer import DecidedBatch, Intake
from consumer.batch import openings
from ledger import MemoryLedger
from machines import Scope
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import FOUND, T0, decide, encoded, event
from tests.unit.consumer.support import pinned as _pinned


def _plan(raws: list, ledger: MemoryLedger) -> DecidedBatch:  # type: ignore[type-arg]
    return decide(ledger, raws, now=T0 + timedelta(minutes=1), partitions=(0, 1))


def test_an_operation_opened_without_a_scope_is_dead_lettered_and_not_opened() -> None:
    ledger = MemoryLedger()
    planned = _plan(
        [encoded(event("TOOL_TIMEOUT", machine="payment-refund", scope=None), 0)], ledger
    )
    assert planned.decisions == ()
    assert [d.reason_code for d in planned.batch.dead_letters] == ["scope-missing"]
    ledger.commit(planned.batch)
    assert ledger.load_views(["op-1"]) == {}


def test_a_scope_the_machine_does_not_admit_is_refused_on_the_opening_event() -> None:
    staging = Scope(capability="payment.create-refund", tool="stripe", environment="staging")
    planned = _plan(
        [encoded(event("TOOL_TIMEOUT", machine="payment-refund", scope=staging), 0)],
        MemoryLedger(),
    )
    assert [d.reason_code for d in planned.batch.dead_letters] == ["machine-not-applicable"]


def test_later_events_of_a_matched_operation_may_leave_the_scope_out() -> None:
    ledger = MemoryLedger()
    raws = [
        encoded(event("TOOL_TIMEOUT", machine="payment-refund"), 0),
        encoded(
            event("VERIFICATION_FOUND", machine="payment-refund", evidence=FOUND, scope=None), 1
        ),
    ]
    planned = _plan(raws, ledger)
    assert [d.state_after for d in planned.decisions] == ["verifying", "completed"]
    assert planned.batch.dead_letters == ()


def test_an_event_that_cannot_open_its_operation_is_not_an_opening() -> None:
    machines, _ = _pinned()
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    bare = event("TOOL_TIMEOUT", machine="payment-refund", scope=None)
    outcomes = [intake.examine(encoded(bare, 0))]
    assert openings(outcomes, {}) == {}


def test_an_event_under_another_correlation_id_is_recorded_refused_and_dead_lettered() -> None:
    ledger = MemoryLedger()
    raws = [
        encoded(event("TOOL_TIMEOUT", machine="payment-refund"), 0),
        encoded(
            event(
                "VERIFICATION_FOUND",
                machine="payment-refund",
                evidence=FOUND,
                correlation_id="corr-someone-else",
            ),
            1,
        ),
    ]
    planned = _plan(raws, ledger)
    assert [d.outcome.value for d in planned.decisions] == ["transitioned", "refused"]
    assert [n.code for n in planned.decisions[1].refusals] == ["correlation-mismatch"]
    assert [d.reason_code for d in planned.batch.dead_letters] == ["correlation-mismatch"]
