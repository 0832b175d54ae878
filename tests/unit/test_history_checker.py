"""The crash run's history checker finds each kind of anomaly it names, and none in a
clean history (tests/faults/checker.py). Histories are built by hand here; the crash
run checks real ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tests.faults.checker import History, Replayed, check
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
