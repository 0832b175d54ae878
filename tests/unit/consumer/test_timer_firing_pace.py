"""The controller fires no more timers while a slice of the timer events it fired is
undecided (docs/controller.md, "Timers"): a storm of due timers waits behind live events
instead of crowding them out, and a count that never comes down (events decided by
another member, or disarmed) stops holding timers back after a while or on a rebalance."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KafkaPartition

from consumer import Controller, ControllerSettings
from ledger import FiredTimer, FiredTimers, MemoryLedger
from tests.unit.consumer.support import GROUP, pinned

TOPIC = "recovery.events"
SLICE = 3
AT = datetime(2026, 6, 1, 12, tzinfo=UTC)


class _DueLedger(MemoryLedger):
    """Always a full slice of due timers; counts the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def fire_timers(
        self, group: str, epochs: Mapping[tuple[str, int], int], now: datetime, **kw: Any
    ) -> FiredTimers:
        self.calls += 1
        fired = tuple(
            FiredTimer(f"timer:op-{self.calls}-{n}:1:stalled", f"op-{n}", "stalled", AT, AT)
            for n in range(kw["limit"])
        )
        return FiredTimers(fired, (), True)


@pytest.fixture
def controller() -> tuple[Controller, _DueLedger]:
    machines, rules = pinned()
    ledger = _DueLedger()
    settings = ControllerSettings(
        bootstrap="unused:9092", database_url="unused", group_id=GROUP, timer_slice=SLICE
    )
    built = Controller(settings, ledger, machines=machines, rules=rules)
    built._epochs[(TOPIC, 0)] = 1
    return built, ledger


def _decided(*event_ids: str) -> list[Any]:
    return [SimpleNamespace(event_id=e) for e in event_ids]


def test_no_slice_is_fired_while_the_last_one_is_undecided(
    controller: tuple[Controller, _DueLedger],
) -> None:
    member, ledger = controller
    member._fire_timers(None)  # type: ignore[arg-type]
    member._fire_timers(None)  # type: ignore[arg-type]
    assert ledger.calls == 1
    # A live event and one of the timer events are decided: below a slice in flight.
    member._timers_decided(_decided("evt-live", "timer:op-1-0:1:stalled"))
    member._fire_timers(None)  # type: ignore[arg-type]
    assert ledger.calls == 2
    member._fire_timers(None)  # type: ignore[arg-type]
    assert ledger.calls == 2


def test_a_count_that_never_comes_down_holds_timers_back_only_for_a_while(
    controller: tuple[Controller, _DueLedger],
) -> None:
    member, ledger = controller
    member._fire_timers(None)  # type: ignore[arg-type]
    member._in_flight_at -= 31.0  # nothing decided for longer than the patience
    member._fire_timers(None)  # type: ignore[arg-type]
    assert ledger.calls == 2
    # A rebalance forgets them: another member decides the events of its partitions.
    member._forget([KafkaPartition(TOPIC, 1)], "revoked")
    member._fire_timers(None)  # type: ignore[arg-type]
    assert ledger.calls == 3
