"""`consumer.heap.settle_heap`: startup objects leave the cyclic collector's reach."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from consumer.heap import settle_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("unfrozen")
def test_settle_heap_freezes_the_objects_alive_at_startup() -> None:
    loaded = {"machines": [[n] for n in range(1000)]}

    settle_heap("controller")

    assert gc.get_freeze_count() > len(loaded["machines"])
    assert all(not any(o is loaded for o in gc.get_objects(generation)) for generation in range(3))


@pytest.mark.usefixtures("unfrozen")
def test_objects_allocated_after_settling_are_still_collected() -> None:
    settle_heap("controller")

    cycle: list[object] = []
    cycle.append(cycle)
    del cycle

    assert gc.collect() >= 1
