"""The relay's lineage cache: commands of an operation opened in the same lease need no
ledger query; others cost one query per operation, then none; a malformed opening is
never trusted; the least recently used operation is dropped first."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import OutboxRecord, UnknownOperation
from machines.event import Lineage
from producers.relay import LineageCache

AUDIT = "recovery.audit"
STORED = Lineage(agent="agent-db", task="task-db", initiating_principal="alice")


class _Ledger:
    """Counts the lookups it answers; knows every operation as `STORED`."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, operation_id: str) -> Lineage:
        self.asked.append(operation_id)
        if operation_id.startswith("missing"):
            raise UnknownOperation(f"operation {operation_id} is not in the ledger")
        return STORED


def _opened(operation_id: str, topic: str = AUDIT, **body: Any) -> OutboxRecord:
    record = {
        "agent": "agent-7",
        "task": "task-7",
        "initiating_principal": "bob",
        "origin_operation": "root-1",
        "parent_operation": "parent-1",
        "delegated_credentials": ["cred-a", "cred-b"],
        **body,
    }
    payload = {
        "operation_id": operation_id,
        "sequence": 1,
        "kind": "operation-opened",
        "hash": "h1",
        "prev_hash": "h0",
        "record": record,
    }
    return OutboxRecord(1, f"audit:{operation_id}:1", topic, operation_id, {}, payload)


def test_an_operation_opened_in_the_lease_is_answered_without_a_query() -> None:
    ledger = _Ledger()
    cache = LineageCache(ledger)
    cache.learn([_opened("op-1")], {AUDIT})
    assert cache("op-1") == Lineage(
        agent="agent-7",
        task="task-7",
        initiating_principal="bob",
        origin_operation="root-1",
        parent_operation="parent-1",
        delegated_credentials=("cred-a", "cred-b"),
    )
    assert ledger.asked == []


def test_an_operation_opened_earlier_costs_one_query_then_none() -> None:
    ledger = _Ledger()
    cache = LineageCache(ledger)
    assert [cache("op-2") for _ in range(3)] == [STORED] * 3
    assert ledger.asked == ["op-2"]


def test_a_failed_lookup_is_not_cached_and_is_asked_again() -> None:
    ledger = _Ledger()
    cache = LineageCache(ledger)
    for _ in range(2):
        with pytest.raises(UnknownOperation):
            cache("missing-1")
    assert ledger.asked == ["missing-1", "missing-1"]


@pytest.mark.parametrize(
    "body",
    [
        {"agent": None},
        {"task": 7},
        {"delegated_credentials": "cred-a"},
        {"delegated_credentials": ["cred-a", 3]},
        {"parent_operation": ["p"]},
    ],
)
def test_an_opening_with_a_bad_lineage_field_is_looked_up_instead(body: dict[str, Any]) -> None:
    ledger = _Ledger()
    cache = LineageCache(ledger)
    cache.learn([_opened("op-3", **body)], {AUDIT})
    assert cache("op-3") == STORED
    assert ledger.asked == ["op-3"]


def test_an_opening_missing_a_lineage_field_is_looked_up_instead() -> None:
    ledger = _Ledger()
    row = _opened("op-4")
    del row.payload["record"]["origin_operation"]
    cache = LineageCache(ledger)
    cache.learn([row], {AUDIT})
    assert cache("op-4") == STORED


def test_an_opening_on_another_topic_or_for_another_key_is_not_learnt() -> None:
    ledger = _Ledger()
    cache = LineageCache(ledger)
    stray = _opened("op-5")
    wrong_key = OutboxRecord(2, "audit:x", AUDIT, "op-6", {}, stray.payload)
    cache.learn([_opened("op-5", topic="recovery.commands"), wrong_key], {AUDIT})
    assert cache("op-5") == STORED
    assert cache("op-6") == STORED
    assert ledger.asked == ["op-5", "op-6"]


def test_the_least_recently_used_operation_is_dropped_first() -> None:
    ledger = _Ledger()
    cache = LineageCache(ledger, capacity=2)
    cache("op-a")
    cache("op-b")
    cache("op-a")  # op-b is now the least recently used
    cache("op-c")
    cache("op-a")
    cache("op-b")
    assert ledger.asked == ["op-a", "op-b", "op-c", "op-b"]
