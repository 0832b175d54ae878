"""`ledger.DatabaseWait`: a component waits out a missing read-write database with
bounded backoff, says so while it waits, and gives up after its timeout."""

from __future__ import annotations

import threading

import pytest

from ledger import DatabaseWait, LedgerError, LedgerUnavailable


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Stop(threading.Event):
    """A stop event whose waits advance the fake clock instead of sleeping."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.clock.now += timeout
        return self.is_set()


def test_a_start_waits_with_doubling_bounded_backoff_until_the_database_answers() -> None:
    clock = _Clock()
    stop = _Stop(clock)
    waiting = DatabaseWait("controller c-1", timeout=60, initial=0.2, maximum=1.0, clock=clock)
    seen: list[str | None] = []
    failures = iter(range(6))

    def step() -> str:
        seen.append(waiting.problem())
        if next(failures, None) is not None:
            raise LedgerUnavailable("connection to server at 127.0.0.1 failed:\nread-only")
        return "opened"

    assert waiting.run("start the controller", step, stop) == "opened"
    assert stop.waits == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert seen[0] is None
    problem = seen[-1]
    assert problem is not None
    assert "controller c-1 waits for a read-write ledger database" in problem
    assert "to start the controller: connection to server at 127.0.0.1 failed: read-only" in (
        problem
    )
    assert "6 attempt(s)" in problem
    assert "RECOVERY_DATABASE_WAIT_S" in problem
    assert waiting.problem() is None  # answered: nothing to wait for any more


def test_the_wait_gives_up_after_its_timeout_with_the_last_error() -> None:
    clock = _Clock()
    waiting = DatabaseWait("relay r-1", timeout=3, clock=clock)

    def step() -> None:
        raise LedgerUnavailable("the server does not answer")

    with pytest.raises(LedgerUnavailable, match=r"relay r-1: gave up waiting .* after 3s"):
        waiting.run("start the relay", step, _Stop(clock))
    assert waiting.problem() is None


def test_a_refusal_that_is_not_an_outage_is_raised_at_once() -> None:
    clock = _Clock()
    stop = _Stop(clock)
    waiting = DatabaseWait("controller c-1", timeout=60, clock=clock)

    def step() -> None:
        raise LedgerError("the ledger schema is 3 migrations behind")

    with pytest.raises(LedgerError, match="migrations behind"):
        waiting.run("start", step, stop)
    assert stop.waits == []


def test_a_stop_request_ends_the_wait() -> None:
    clock = _Clock()
    stop = _Stop(clock)
    stop.set()
    waiting = DatabaseWait("controller c-1", timeout=600, clock=clock)

    def step() -> None:
        raise LedgerUnavailable("down")

    with pytest.raises(LedgerUnavailable, match="gave up"):
        waiting.run("start", step, stop)
    assert stop.waits == []
