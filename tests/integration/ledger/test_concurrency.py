"""Two real writers (threads, each with its own connection pool) racing on the same
operations and the same partition: no decision is ever lost or applied twice."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest

from ledger import FencedError, PostgresLedger, RetryableConflict
from machines.event import Event
from tests.unit.ledger.ledger_support import GROUP, TOPIC, decide_batch, event

pytestmark = pytest.mark.integration

OPERATIONS = [f"op-{n}" for n in range(8)]
KINDS = ("TOOL_TIMEOUT", "STEP_FAILED", "RETRY_SUCCEEDED", "TOOL_FAILED")


@pytest.fixture
def writers(database_url: str) -> Iterator[tuple[PostgresLedger, PostgresLedger]]:
    first = PostgresLedger(database_url, max_size=2)
    second = PostgresLedger(database_url, max_size=2)
    yield first, second
    first.close()
    second.close()


def _events(writer: str, rounds: int) -> list[list[Event]]:
    """Per round, one event for every shared operation, with ids unique to the writer."""
    return [
        [event(op, r, KINDS[r % len(KINDS)], event_id=f"{writer}-{op}-{r}") for op in OPERATIONS]
        for r in range(rounds)
    ]


def _write(
    ledger: PostgresLedger, partition: int, batches: Sequence[list[Event]], conflicts: list[int]
) -> None:
    offset = 0
    for events in batches:
        while True:  # what the consumer does: reload, decide again, commit
            batch = decide_batch(ledger, events, epoch=1, partition=partition, first_offset=offset)
            try:
                ledger.commit(batch)
                break
            except RetryableConflict:
                conflicts.append(1)
        offset += len(events)


def _assert_each_event_decided_once(ledger: PostgresLedger, expected: set[str]) -> None:
    seen: list[str] = []
    for op in OPERATIONS:
        decisions = ledger.decisions(op)
        assert [d["sequence"] for d in decisions] == list(range(1, len(decisions) + 1))
        seen.extend(d["event"]["id"] for d in decisions)
        assert ledger.load_views([op])[op].version == len(decisions)
    assert Counter(seen) == Counter(expected)
    assert ledger.verify_audit() == ()


def test_writers_racing_on_the_same_operations_lose_and_double_nothing(
    writers: tuple[PostgresLedger, PostgresLedger],
) -> None:
    first, second = writers
    first.claim(GROUP, TOPIC, [0, 1], "controller-a")
    rounds = 12
    batches = {"w1": _events("w1", rounds), "w2": _events("w2", rounds)}
    conflicts: list[int] = []
    threads = [
        threading.Thread(target=_write, args=(first, 0, batches["w1"], conflicts)),
        threading.Thread(target=_write, args=(second, 1, batches["w2"], conflicts)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not any(t.is_alive() for t in threads)
    expected = {e.event_id for bs in batches.values() for b in bs for e in b}
    _assert_each_event_decided_once(first, expected)
    assert first.offsets(GROUP, TOPIC) == {0: rounds * 8, 1: rounds * 8}


def test_zombie_loses_the_race_to_a_new_owner_and_nothing_is_applied_twice(
    writers: tuple[PostgresLedger, PostgresLedger],
) -> None:
    zombie, owner = writers
    (claim,) = zombie.claim(GROUP, TOPIC, [0], "controller-a")
    stream = [e for batch in _events("p0", 20) for e in batch]
    committed_one = threading.Event()
    fenced: list[FencedError] = []

    def run_zombie() -> None:
        for start in range(0, len(stream), 8):
            batch = decide_batch(
                zombie, stream[start : start + 8], epoch=claim.epoch, first_offset=start
            )
            try:
                zombie.commit(batch)
            except FencedError as exc:
                fenced.append(exc)
                return
            committed_one.set()

    thread = threading.Thread(target=run_zombie)
    thread.start()
    assert committed_one.wait(timeout=30)
    (taken,) = owner.claim(GROUP, TOPIC, [0], "controller-b")  # races the zombie's commit
    resume = taken.next_offset or 0
    for start in range(resume, len(stream), 8):
        owner.commit(
            decide_batch(owner, stream[start : start + 8], epoch=taken.epoch, first_offset=start)
        )
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert taken.epoch == claim.epoch + 1
    if resume < len(stream):
        assert len(fenced) == 1  # the zombie was still running, and was refused
    _assert_each_event_decided_once(owner, {e.event_id for e in stream})
    assert owner.offsets(GROUP, TOPIC) == {0: len(stream)}
