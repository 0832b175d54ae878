"""The controller's liveness and readiness checks, served by `consumer.health_server`.

Liveness (`/healthz`): the consume loop turned recently. One turn waits at most
`batch_max_wait_ms` for records, then plans and commits, or backs off (at most
`backoff_max_ms`) during an outage; a loop that has not turned for `stall_after_s` is
wedged, and a restart is the remedy.

Readiness (`/readyz`): this member owns at least one partition of the events topic (a
member of a group larger than the topic's partition count owns none and says so), the
ledger database answers a query, and no owned partition is more than `ready_max_lag`
records behind its high watermark. A failing check names the ids involved (group,
instance, topic and partition) and its threshold's setting.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from consumer.controller import Controller
from consumer.health_server import Probe
from ledger import LedgerError, ping_database

__all__ = ["controller_probes"]


def controller_probes(controller: Controller) -> tuple[Probe, Probe]:
    """The liveness and readiness probes of `controller` (module docstring)."""
    settings = controller.settings
    who = f"controller {settings.instance_id} (group {settings.group_id})"

    def live() -> Mapping[str, str | None]:
        idle = time.monotonic() - controller.last_step
        if idle <= settings.stall_after_s:
            return {"loop": None}
        return {
            "loop": f"{who}: the consume loop last turned {idle:.0f}s ago (threshold "
            f"{settings.stall_after_s:.0f}s, RECOVERY_CONTROLLER_STALL_AFTER_S); restart it"
        }

    def ready() -> Mapping[str, str | None]:
        return {
            "partitions": _assigned(controller, who),
            "ledger": _ledger(settings.database_url, who),
            "lag": _lag(controller.metrics.lags(), settings.ready_max_lag, who),
        }

    return live, ready


def _assigned(controller: Controller, who: str) -> str | None:
    if controller.owned:
        return None
    return (
        f"{who} owns no partition of {controller.settings.topics.events} yet: it is joining "
        "the group, cannot claim them in the ledger, or the group has more members than "
        "the topic has partitions"
    )


def _ledger(database_url: str, who: str) -> str | None:
    try:
        ping_database(database_url)
    except LedgerError as exc:
        return f"{who}: {exc}; batches wait until PostgreSQL is back"
    return None


def _lag(lags: Mapping[tuple[str, int], int], threshold: int, who: str) -> str | None:
    behind = sorted((lag, f"{t}[{p}]") for (t, p), lag in lags.items() if lag > threshold)
    if not behind:
        return None
    worst, where = behind[-1]
    return (
        f"{who}: {len(behind)} partition(s) over {threshold} records behind, worst {where} "
        f"at {worst} (RECOVERY_CONTROLLER_READY_MAX_LAG)"
    )
