"""The ledger's pool retries a lost server at least every second: psycopg_pool's own
backoff doubles without a ceiling, and a failover's promoted standby was found only at
the pool's next attempt, seconds after it took writes."""

from __future__ import annotations

from psycopg_pool.base import AttemptWithBackoff

from ledger.postgres import _Reconnect


def _delays(attempt: AttemptWithBackoff, count: int) -> list[float]:
    delays = []
    for n in range(count):
        attempt.update_delay(float(n))
        delays.append(attempt.delay)
    return delays


def test_reconnect_attempts_come_at_least_every_second() -> None:
    delays = _delays(_Reconnect(timeout=300.0), 8)
    assert 0.2 <= delays[0] <= 0.3
    assert max(delays) == 1.0
    assert delays[-3:] == [1.0, 1.0, 1.0]
    # Without the ceiling: 1, 2, 4, 8... seconds (about; with jitter).
    assert _delays(AttemptWithBackoff(timeout=300.0), 5)[-1] > 10.0
