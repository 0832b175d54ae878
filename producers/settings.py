"""The settings of the roles in `producers`: the outbox relay (`RECOVERY_RELAY_*`) and
the capability worker library (`RECOVERY_WORKER_*`). The client library's identity and
roster (`RECOVERY_PRODUCER_ID`, `RECOVERY_PRODUCER_KEY_FILE`, `RECOVERY_ROSTER_FILE`)
are `schemas.IdentitySettings`; where the broker is, `schemas.ServiceSettings`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from schemas import Settings

__all__ = ["RelaySettings", "WorkerSettings"]


class RelaySettings(Settings):
    """How one relay instance works: `wake` is `notify` (LISTEN/NOTIFY, with `idle_poll`
    as the fallback poll interval) or `poll` (lease every `idle_poll`)."""

    model_config = SettingsConfigDict(env_prefix="RECOVERY_RELAY_")
    section: ClassVar[str] = "Outbox relay"

    lease_keys: int = Field(
        default=200, ge=1, description="Operations (keys) one lease takes, oldest row each."
    )
    wake: Literal["notify", "poll"] = Field(
        default="notify", description="How an idle relay learns of new rows (docs/relay.md)."
    )
    idle_poll: float = Field(
        default=1.0, gt=0, description="Seconds between leases when idle (notify: fallback)."
    )
    delivery_timeout: float = Field(
        default=30.0, gt=0, description="Seconds the broker has to acknowledge a record."
    )
    backoff_initial: float = Field(
        default=0.2, gt=0, description="First pause, in seconds, after a failed pass; doubles."
    )
    backoff_max: float = Field(default=10.0, gt=0, description="The pause's ceiling.")
    backlog_every: float = Field(
        default=5.0, gt=0, description="Seconds between backlog gauge refreshes."
    )


class WorkerSettings(Settings):
    """A capability worker's own settings (`producers.CapabilityWorker`)."""

    model_config = SettingsConfigDict(env_prefix="RECOVERY_WORKER_")
    section: ClassVar[str] = "Capability worker"

    store: Path | None = Field(
        default=None,
        description="The execution store's file (SQLite); it must survive restarts. "
        "One per worker process. Required unless the code passes a store or "
        "`RECOVERY_WORKER_STORE_URL` is set.",
    )
    store_url: str | None = Field(
        default=None,
        description="The shared execution store's PostgreSQL URL, as role `recovery_worker` "
        "(`recoveryctl db worker-store`): every member of a worker group on every host "
        "uses the same one, so a command runs at most once across rebalances. Wins over "
        "`RECOVERY_WORKER_STORE`. A failover pair: list both nodes and add "
        "`target_session_attrs=read-write`.",
    )
    store_wait_s: float = Field(
        default=60.0,
        ge=0,
        description="Seconds a worker waits, with backoff doubling from 0.2 s to 5 s, for "
        "its shared execution store to answer (a failover) before its run stops.",
    )
    start: str = Field(
        default="latest",
        description="Where a new group starts: `latest`, `earliest` or an ISO 8601 time "
        "with its offset (docs/capability-worker.md).",
    )
