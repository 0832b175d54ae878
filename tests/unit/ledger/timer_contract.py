"""The timers of the abstract ledger suite (issue #29), run against both ledgers: what a
commit arms and disarms, what a firing writes, and that a firing is fenced, bounded,
earliest first and once per timer."""

from __future__ import annotations

from datetime import timedelta

from ledger import Ledger
from machines import Event, parse_event
from tests.unit.ledger.ledger_support import GROUP, T0, TOPIC, event, feed

HOUR = timedelta(hours=1)


def _opened(ledger: Ledger, *ops: str, partition: int = 0) -> int:
    """Claim `partition` and open `ops` on it (one TOOL_TIMEOUT each, at T0, so each
    waits in `reconstructing` with its stall bound and deadline an hour on)."""
    (claim,) = ledger.claim(GROUP, TOPIC, [partition], "controller-a")
    events = [event(op, 0, "TOOL_TIMEOUT") for op in ops]
    feed(ledger, events, epoch=claim.epoch, partition=partition)
    return claim.epoch


def _timer_events(ledger: Ledger) -> list[Event]:
    """The timer events waiting in the outbox for the events topic, in outbox order."""
    with ledger.lease_outbox(1000) as lease:
        rows = [r for r in lease.records if r.topic == TOPIC]
    return [parse_event(r.payload) for r in rows]


class TimerContract:
    """Timers in the ledger, mixed into each ledger's test class."""

    def test_a_decision_arms_its_state_timer_and_the_deadline(self, ledger: Ledger) -> None:
        _opened(ledger, "op-1")
        summary = ledger.timer_summary([(TOPIC, 0)], T0, timedelta(seconds=60))
        [waiting] = summary.waiting
        assert (waiting.machine, waiting.state, waiting.operations) == (
            "delegated-research",
            "reconstructing",
            1,
        )
        assert (waiting.oldest_since, waiting.stalled) == (T0, 0)
        assert (summary.armed, summary.overdue) == (2, 0)
        assert ledger.timer_summary([(TOPIC, 1)], T0, timedelta(0)).armed == 0

    def test_nothing_fires_before_it_is_due(self, ledger: Ledger) -> None:
        epoch = _opened(ledger, "op-1")
        fired = ledger.fire_timers(GROUP, {(TOPIC, 0): epoch}, T0 + HOUR / 2, limit=10)
        assert (fired.fired, fired.fenced, fired.full) == ((), (), False)

    def test_due_timers_fire_once_each_as_controller_events_keyed_by_operation(
        self, ledger: Ledger
    ) -> None:
        epoch = _opened(ledger, "op-1")
        at = T0 + 2 * HOUR
        fired = ledger.fire_timers(GROUP, {(TOPIC, 0): epoch}, at, limit=10)
        assert sorted(f.kind for f in fired.fired) == ["deadline", "stalled"]
        again = ledger.fire_timers(GROUP, {(TOPIC, 0): epoch}, at, limit=10)
        assert again.fired == ()
        events = _timer_events(ledger)
        assert {e.event_id for e in events} == {f.timer_id for f in fired.fired}
        assert {e.event_type for e in events} == {"DEADLINE_PASSED", "STATE_STALLED"}
        assert {(e.operation_id, e.correlation_id, e.event_time) for e in events} == {
            ("op-1", "corr-op-1", at)
        }
        # Overdue until decided: fired, but its event not decided yet.
        summary = ledger.timer_summary([(TOPIC, 0)], at, timedelta(seconds=60))
        assert summary.overdue == 2

    def test_deciding_a_timer_event_spends_it_and_it_is_no_longer_overdue(
        self, ledger: Ledger
    ) -> None:
        epoch = _opened(ledger, "op-1")
        at = T0 + 2 * HOUR
        ledger.fire_timers(GROUP, {(TOPIC, 0): epoch}, at, limit=10)
        events = [e for e in _timer_events(ledger) if e.event_type == "STATE_STALLED"]
        feed(ledger, events, epoch=epoch, first_offset=1)
        [decided] = [d for d in ledger.decisions("op-1") if d["event"]["type"] == "STATE_STALLED"]
        assert decided["outcome"] == "fired"
        summary = ledger.timer_summary([(TOPIC, 0)], at, timedelta(seconds=60))
        assert summary.overdue == 1  # the deadline's event is still to be decided
        assert [w.stalled for w in summary.waiting] == [1]

    def test_a_zombie_fires_nothing_and_learns_it_is_fenced(self, ledger: Ledger) -> None:
        old = _opened(ledger, "op-1")
        (new,) = ledger.claim(GROUP, TOPIC, [0], "controller-b")
        fired = ledger.fire_timers(GROUP, {(TOPIC, 0): old}, T0 + 2 * HOUR, limit=10)
        assert (fired.fired, fired.fenced) == ((), ((TOPIC, 0),))
        assert _timer_events(ledger) == []
        owner = ledger.fire_timers(GROUP, {(TOPIC, 0): new.epoch}, T0 + 2 * HOUR, limit=10)
        assert len(owner.fired) == 2

    def test_only_the_partitions_owned_are_fired(self, ledger: Ledger) -> None:
        _opened(ledger, "op-1", partition=0)
        (claim,) = ledger.claim(GROUP, TOPIC, [1], "controller-a")
        fired = ledger.fire_timers(GROUP, {(TOPIC, 1): claim.epoch}, T0 + 2 * HOUR, limit=10)
        assert fired.fired == ()

    def test_a_firing_takes_a_bounded_slice_earliest_first(self, ledger: Ledger) -> None:
        (claim,) = ledger.claim(GROUP, TOPIC, [0], "controller-a")
        # op-k opens at T0 + k seconds: its timers fall due k seconds after op-0's.
        for k in range(5):
            feed(ledger, [event(f"op-{k}", k, "TOOL_TIMEOUT")], epoch=claim.epoch, first_offset=k)
        owned = {(TOPIC, 0): claim.epoch}
        first = ledger.fire_timers(GROUP, owned, T0 + 2 * HOUR, limit=3)
        assert first.full
        assert [f.operation_id for f in first.fired] == ["op-0", "op-0", "op-1"]
        rest = ledger.fire_timers(GROUP, owned, T0 + 2 * HOUR, limit=30)
        assert not rest.full
        assert len(rest.fired) == 7
        assert [f.due_at for f in first.fired + rest.fired] == sorted(
            f.due_at for f in first.fired + rest.fired
        )

    def test_leaving_a_state_disarms_its_timer_and_arms_the_next_ones(self, ledger: Ledger) -> None:
        epoch = _opened(ledger, "op-1")
        before = {t.timer_id for t in ledger.load_views(["op-1"])["op-1"].timers}
        found = event("op-1", 1, "VERIFICATION_FOUND", outcome="applied")
        feed(ledger, [found], epoch=epoch, first_offset=1)
        view = ledger.load_views(["op-1"])["op-1"]
        assert view.state == "resume-pending"
        after = {t.timer_id: t for t in view.timers}
        assert before & set(after) == {"timer:op-1:1:deadline"}
        assert after["timer:op-1:2:stalled"].state == "resume-pending"
        summary = ledger.timer_summary([(TOPIC, 0)], T0, timedelta(0))
        assert [(w.state, w.operations) for w in summary.waiting] == [("resume-pending", 1)]
        assert summary.armed == 2
        # The disarmed timer is gone from the table: it never fires.
        fired = ledger.fire_timers(GROUP, {(TOPIC, 0): epoch}, T0 + HOUR / 2 + HOUR / 4, limit=10)
        assert fired.fired == ()
