"""The crash run's history checker finds each kind of anomaly it names, and none in a
clean history (tests/faults/checker.py). Histories are built by hand here; the crash
run checks real ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.faults.checker import CheckReport, History, Replayed, check, check_timers
from tests.faults.verify import Consumed

TOPIC = "events"


def _decision(op: str, sequence: int, event: str) -> dict[str, Any]:
    return {"operation_id": op, "sequence": sequence, "event": {"id": event}, "outcome": "x"}


def _record(
    offset: int, header: str, value: bytes, key: bytes = b"op-1", partition: int = 0
) -> Consumed:
    return Consumed(partition, offset, key, value, ((header, value),))


def _command(offset: int, cid: str, key: bytes = b"op-1", value: bytes | None = None) -> Consumed:
    return Consumed(0, offset, key, value or cid.encode(), (("recovery-record-id", cid.encode()),))


def _clean() -> tuple[History, Replayed]:
    expected = Replayed()
    expected.decisions["op-1"] = [_decision("op-1", 1, "e1"), _decision("op-1", 2, "e2")]
    expected.offsets["op-1"] = [(0, 0), (0, 1)]
    expected.commands = {"c1": "op-1", "c2": "op-1"}
    expected.refused = {f"{TOPIC}[0]@2"}
    inputs = [_record(n, "recovery-record-id", f"r{n}".encode()) for n in range(3)]
    history = History(
        events_topic=TOPIC,
        produced={"r0": 1, "r1": 1, "r2": 1},
        inputs=inputs,
        decisions={"op-1": list(expected.decisions["op-1"])},
        sources={"e1": (0, 0), "e2": (0, 1)},
        commands=[_command(0, "c1"), _command(1, "c2"), _command(2, "c1")],  # c1 twice
        dead_letters=[_record(0, "recovery-coordinates", f"{TOPIC}[0]@2".encode())],
        chains=1,
    )
    return history, expected


def _kinds(history: History, expected: Replayed) -> list[str]:
    return sorted(a.kind for a in check(history, expected).anomalies)


def _decisions(*events: str) -> dict[str, Sequence[dict[str, Any]]]:
    return {"op-1": [_decision("op-1", n, e) for n, e in enumerate(events, start=1)]}


def test_a_clean_history_has_no_anomaly_and_counts_removed_duplicates() -> None:
    report = check(*_clean())
    assert report.anomalies == []
    assert report.counts["command duplicates removed"] == 1
    assert report.counts["commands after dedupe"] == 2
    assert report.counts["decisions in the ledger"] == 2


def test_lost_and_duplicated_input_records_are_anomalies() -> None:
    history, expected = _clean()
    lost = replace(history, produced={**history.produced, "r9": 1})
    assert _kinds(lost, expected) == ["input-lost"]
    twice = replace(history, produced={**history.produced, "r0": 0})
    assert _kinds(twice, expected) == ["input-duplicated"]


def test_a_missing_repeated_or_unexpected_decision_is_an_anomaly() -> None:
    history, expected = _clean()
    assert _kinds(replace(history, decisions=_decisions("e1")), expected) == ["decision-missing"]
    twice = replace(history, decisions=_decisions("e1", "e2", "e2"))
    assert "decided-twice" in _kinds(twice, expected)
    extra = replace(history, decisions=_decisions("e1", "e2", "e3"), sources={
        **history.sources, "e3": (0, 5)
    })  # fmt: skip
    assert _kinds(extra, expected) == ["decision-unexpected"]


def test_decisions_out_of_offset_order_or_with_a_gap_are_anomalies() -> None:
    history, expected = _clean()
    swapped = replace(history, decisions=_decisions("e2", "e1"))
    assert set(_kinds(swapped, expected)) == {"decision-order"}
    gap = {"op-1": [_decision("op-1", 1, "e1"), _decision("op-1", 3, "e2")]}
    assert "sequence-gap" in _kinds(replace(history, decisions=gap), expected)


def test_a_decision_that_differs_from_the_replay_is_an_anomaly() -> None:
    history, expected = _clean()
    changed = [_decision("op-1", 1, "e1"), {**_decision("op-1", 2, "e2"), "outcome": "y"}]
    assert _kinds(replace(history, decisions={"op-1": changed}), expected) == ["decision-differs"]


def test_missing_unexpected_misrouted_or_altered_commands_are_anomalies() -> None:
    history, expected = _clean()
    assert _kinds(replace(history, commands=[_command(0, "c1")]), expected) == ["command-missing"]
    extra = [*history.commands, _command(3, "c9")]
    assert _kinds(replace(history, commands=extra), expected) == ["command-unexpected"]
    misrouted = [_command(0, "c1"), _command(1, "c2", key=b"op-2")]
    assert _kinds(replace(history, commands=misrouted), expected) == ["command-misrouted"]
    altered = [_command(0, "c1"), _command(1, "c2"), _command(2, "c1", value=b"other")]
    assert _kinds(replace(history, commands=altered), expected) == ["command-differs"]


def test_missing_or_unexpected_dead_letters_and_broken_chains_are_anomalies() -> None:
    history, expected = _clean()
    assert _kinds(replace(history, dead_letters=[]), expected) == ["dead-letter-missing"]
    other = [_record(0, "recovery-coordinates", f"{TOPIC}[0]@1".encode())]
    assert _kinds(replace(history, dead_letters=other), expected) == [
        "dead-letter-missing",
        "dead-letter-unexpected",
    ]
    broken = replace(history, chain_breaks=["op-1: record 3 does not chain"])
    assert _kinds(broken, expected) == ["chain-broken"]


# -- timers (issue #29) -------------------------------------------------------------------

T = datetime(2026, 1, 1, tzinfo=UTC)


def _timed(
    sequence: int, event: str, outcome: str = "transitioned", **timers: Any
) -> dict[str, Any]:
    return {**_decision("op-1", sequence, event), "outcome": outcome, "timers": timers}


def _armed(timer_id: str, due_minutes: int) -> dict[str, Any]:
    return {"id": timer_id, "due_at": (T + timedelta(minutes=due_minutes)).isoformat()}


STATE, STALL = "timer:op-1:1:state", "timer:op-1:2:stalled"


def _timer_kinds(*decisions: dict[str, Any], read_minutes: int = 60) -> list[str]:
    report = CheckReport()
    check_timers({"op-1": list(decisions)}, T + timedelta(minutes=read_minutes), report)
    return sorted(a.kind for a in report.anomalies)


def test_timers_fired_once_cancelled_or_not_due_are_clean() -> None:
    report = CheckReport()
    counts = check_timers(
        {
            "op-1": [
                _timed(1, "e1", armed=[_armed(STATE, 10)]),
                _timed(2, STATE, "transitioned", armed=[_armed(STALL, 20)], disarmed=[STATE]),
                _timed(3, "e3", disarmed=[STALL], armed=[_armed("timer:op-1:3:stalled", 90)]),
                _timed(4, STALL, "stale"),
            ]
        },
        T + timedelta(minutes=60),
        report,
    )
    assert report.anomalies == []
    assert counts == {
        "timers fired": 1,
        "timers stale": 1,
        "timers armed": 3,
        "timers not due yet": 1,
    }


def test_a_timer_decided_twice_is_fired_twice() -> None:
    twice = _timer_kinds(
        _timed(1, "e1", armed=[_armed(STATE, 10)]),
        _timed(2, STATE, "fired"),
        _timed(3, STATE, "fired"),
    )
    assert twice == ["timer-fired-twice"]


def test_a_due_timer_never_decided_is_lost_unless_its_state_was_left() -> None:
    assert _timer_kinds(_timed(1, "e1", armed=[_armed(STATE, 10)])) == ["timer-lost"]
    assert _timer_kinds(_timed(1, "e1", armed=[_armed(STATE, 10)]), read_minutes=10) == []
    left = _timed(2, "e2", disarmed=[STATE])
    assert _timer_kinds(_timed(1, "e1", armed=[_armed(STATE, 10)]), left) == []


def test_timer_events_out_of_turn_are_named() -> None:
    assert _timer_kinds(_timed(1, "timer:op-1:9:state", "fired")) == ["timer-forged"]
    armed = _timed(1, "e1", armed=[_armed(STATE, 10)])
    assert _timer_kinds(armed, _timed(2, STATE, "stale")) == ["timer-stale-armed"]
    left = _timed(2, "e2", disarmed=[STATE])
    assert _timer_kinds(armed, left, _timed(3, STATE, "fired")) == ["timer-after-disarm"]


def test_two_copies_of_a_timer_event_with_other_bytes_are_a_second_firing() -> None:
    history, expected = _clean()
    own = (("recovery-record-id", b"event:t"), ("recovery-producer", b"recovery-controller"))
    copies = [Consumed(0, 10, b"op-1", b"fired at 1", own), Consumed(0, 11, b"op-1", b"at 2", own)]
    kinds = _kinds(replace(history, inputs=[*history.inputs, *copies]), expected)
    assert kinds == ["timer-fired-twice"]
