"""The relay's liveness and readiness checks (served by the process's health endpoint,
`consumer.HealthServer`, which `recoveryctl run` starts).

Liveness: every relay instance's loop turned within `stall_after` seconds. One turn is
a pass (its delivery wait is bounded by `RelaySettings.delivery_timeout`), an idle wait
(`idle_poll`) or an outage backoff (`backoff_max`), so a loop quiet for longer is wedged.
Readiness: the ledger database answers a query and a broker answers a metadata request,
each within about two seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from ledger import LedgerError, ping_database
from producers.relay import OutboxRelay
from producers.topics import BrokerProbe
from schemas import KafkaSecurity

__all__ = ["relay_probes"]

Checks = Mapping[str, str | None]


def relay_probes(
    relays: Sequence[OutboxRelay],
    *,
    database_url: str,
    bootstrap: str,
    stall_after: float = 60.0,
    timeout: float = 2.0,
    security: KafkaSecurity | None = None,
) -> tuple[Callable[[], Checks], Callable[[], Checks]]:
    """The liveness and readiness probes of the relay instances `relays` of one process
    (the broker probed as `security`, else the environment's client settings)."""
    broker = BrokerProbe(bootstrap, security)
    names = ", ".join(r.instance for r in relays)

    def live() -> Checks:
        now = time.monotonic()
        stalled = [
            f"{r.instance} ({now - r.last_loop:.0f}s)"
            for r in relays
            if now - r.last_loop > stall_after
        ]
        if not stalled:
            return {"loop": None}
        return {
            "loop": f"relay loop(s) idle past {stall_after:.0f}s: {', '.join(stalled)}; "
            "restart the relay"
        }

    def ready() -> Checks:
        try:
            ping_database(database_url, connect_timeout=max(1, round(timeout)))
            ledger: str | None = None
        except LedgerError as exc:
            ledger = f"relays {names}: {exc}; rows are published once PostgreSQL is back"
        problem = broker.problem(timeout)
        kafka = (
            None
            if problem is None
            else (f"relays {names}: no Kafka broker at {bootstrap} answers: {problem}")
        )
        unchecked = [f"{r.instance}: {r.limits_problem}" for r in relays if r.limits_problem]
        limits = (
            None
            if not unchecked
            else "nothing is published until every topic admits the largest row: "
            + "; ".join(unchecked)
        )
        return {"ledger": ledger, "broker": kafka, "topic_limits": limits}

    return live, ready
