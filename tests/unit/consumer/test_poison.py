"""No record can stop the batch: whatever raises while one record is handled, from
bytes to ledger rows, refuses that record with a coded reason naming the stage, and the
rest of the batch is decided and committed as if it had not been there."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from consumer import Accepted, DecidedBatch, Intake, decide_batch
from consumer.batch import operation_ids, positions_for, unbuildable
from consumer.intake import IntakeResult, RawRecord
from ledger import MemoryLedger, batch_rows
from machines import Policy, Rules
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import CONTROLLER, GROUP, T0, TOPIC, encoded, event, pinned

FAR_FUTURE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def _intake() -> Intake:
    machines, _ = pinned()
    return Intake(machines, roster=producer_roster(), max_record_bytes=65536)


def _decide(outcomes: list[IntakeResult], rules: Rules | None = None) -> DecidedBatch:
    ledger = MemoryLedger()
    raws = [o.record for o in outcomes]
    epochs = {(c.topic, c.partition): c.epoch for c in ledger.claim(GROUP, TOPIC, [0], "me")}
    return decide_batch(
        outcomes,
        ledger.load_views(operation_ids(outcomes)),
        rules or pinned()[1],
        group=GROUP,
        controller=CONTROLLER,
        positions=positions_for(raws, epochs),
        now=T0 + timedelta(minutes=1),
    )


def _accepted(raw: RawRecord, at: datetime | None = None) -> Accepted:
    """`raw` as intake accepts it, with its event's time moved to `at` (what intake's
    window refuses; the batch must survive it anyway)."""
    result = _intake().examine(raw)
    assert isinstance(result, Accepted), result
    if at is None:
        return result
    return replace(result, event=replace(result.event, event_time=at))


def test_a_far_future_event_time_is_refused_at_intake_with_its_own_code() -> None:
    raw = encoded(replace(event("TOOL_TIMEOUT", "op-9"), event_time=FAR_FUTURE), 0)
    result = _intake().examine(raw)
    assert not isinstance(result, Accepted)
    assert result.refusal.code == "event-time-out-of-range"
    assert "9999-12-31" in result.refusal.reason
    assert "op-9" in result.refusal.reason


def test_an_intake_exception_is_the_records_refusal_not_the_controllers() -> None:
    raw = encoded(event("TOOL_TIMEOUT"), 0)
    # A key that is not bytes makes the size check raise: a bug met by one record.
    odd = replace(raw, key=12345)  # type: ignore[arg-type]
    result = _intake().examine(odd)
    assert not isinstance(result, Accepted)
    assert result.refusal.code == "record-failed"
    assert "intake failed" in result.refusal.reason
    assert "TypeError" in result.refusal.reason


def test_a_far_future_opening_past_intake_is_decided_on_the_controllers_clock() -> None:
    # The reported crash: the deadline (event time + policy deadline) overflowed while
    # the operation was opened. Time is the controller's clock now (issue #29): the
    # event's own time moves neither the deadline nor any timer.
    poison = _accepted(encoded(event("TOOL_TIMEOUT", "op-2"), 0), FAR_FUTURE)
    good = _accepted(encoded(event("TOOL_TIMEOUT", "op-3"), 1))
    planned = _decide([poison, good])
    assert [d.operation_id for d in planned.decisions] == ["op-2", "op-3"]
    assert planned.refused == ()
    opened = planned.batch.folded
    assert opened is not None
    now = T0 + timedelta(minutes=1)
    assert opened["op-2"].deadline == now + timedelta(hours=1)
    assert all(t.due_at <= now + timedelta(hours=1) for t in opened["op-2"].timers)
    batch_rows(planned.batch)


def test_a_later_event_of_an_operation_that_failed_to_open_fails_alone_too() -> None:
    # A policy deadline no event time can carry: every opening overflows.
    _, rules = pinned()
    huge = Rules(Policy(id="huge", deadline_seconds=10**15), rules.registry)
    raws = [encoded(event("TOOL_TIMEOUT", "op-4"), 0), encoded(event("TOOL_TIMEOUT", "op-5"), 1)]
    planned = _decide([_accepted(r) for r in raws], huge)
    assert planned.decisions == ()
    assert [f.code for _, f in planned.refused] == ["record-failed", "record-failed"]
    assert planned.batch.views == {}


def test_rows_that_cannot_be_built_name_their_record_and_the_replan_dead_letters_it() -> None:
    raws = [encoded(event("TOOL_TIMEOUT", f"op-{n}"), n) for n in range(6)]
    outcomes: list[IntakeResult] = [_accepted(r) for r in raws]
    planned = _decide(outcomes)
    entries = list(planned.batch.entries)
    # Entry 3 paired with another event's decision: `batch_rows` raises on it.
    entries[3] = replace(entries[3], decision=entries[2].decision)
    broken = replace(planned, batch=replace(planned.batch, entries=tuple(entries)))
    found = unbuildable(broken, ValueError("boom"))
    assert found is not None
    coordinates, refusal = found
    assert coordinates == f"{TOPIC}[0]@3"
    assert refusal.code == "record-failed"
    assert "row building failed: ValueError: boom" in refusal.reason
    assert unbuildable(planned, ValueError("elsewhere")) is None
