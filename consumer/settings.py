"""The controller's settings (`RECOVERY_CONTROLLER_*`) and the telemetry settings every
runtime component reads (OpenTelemetry's own `OTEL_*` variables).

Declared once on the project's settings base (`schemas.Settings`, pydantic-settings):
each field names its variable, default and help, and docs/configuration.md is generated
from them. What the controller shares with every component (where the services are,
its roster id and key, Kafka authentication, topic names) is declared in `schemas` and
filled in by `ControllerSettings.from_env`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, Self

from pydantic import AliasChoices, Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from consumer.errors import SettingsError
from machines import DEFAULT_REGISTRY
from schemas import (
    DEFAULT_CONTROLLER_GROUP,
    MAX_EVENT_RECORD_BYTES,
    MAX_EVENT_RECORD_CEILING,
    ConfigurationError,
    IdentitySettings,
    KafkaSecurity,
    ServiceSettings,
    Settings,
    TopicNames,
    given,
)

__all__ = [
    "ENV_DEMO_MODE",
    "ENV_METRICS_ADDRESS",
    "ControllerSettings",
    "ProcessSettings",
    "RulesSettings",
    "TelemetrySettings",
]

ENV_DEMO_MODE: Final = "RECOVERY_DEMO_MODE"
ENV_METRICS_ADDRESS: Final = "RECOVERY_METRICS_ADDRESS"
_MACHINES = Path(DEFAULT_REGISTRY).resolve().parent


def _instance() -> str:
    """`controller-<host>-<pid>`"""
    return f"controller-{socket.gethostname()}-{os.getpid()}"


class RulesSettings(Settings):
    """What decisions are made under: the pinned machines, the guard and action
    registry, the operator policy and the producer roster. The controller loads all of
    them; `recoveryctl` commands load the same files (read-only ones never the policy)."""

    model_config = SettingsConfigDict(env_prefix="RECOVERY_CONTROLLER_")
    section: ClassVar[str] = "Rules (controller and recoveryctl)"

    registry_path: Path = Field(
        default=Path(DEFAULT_REGISTRY), description="The guard and action registry."
    )
    lock_path: Path = Field(
        default=_MACHINES / "machines.lock", description="The machines lock file (pins)."
    )
    trusted_publishers_path: Path = Field(
        default=_MACHINES / "trusted-publishers.yaml",
        description="Who may publish machines (provenance).",
    )
    policy_path: Path | None = Field(
        default=None,
        description="The operator policy (`recoveryctl run --policy`). Required outside demo "
        "mode; start from ops/policy.production.yaml (docs/controller.md).",
    )
    roster_path: Path | None = Field(
        default=None,
        description="A producer roster beside the policy (a `producers:`-only file or "
        "another policy); its producers are added to the policy's.",
    )
    demo_mode: bool = Field(
        default=False,
        validation_alias=AliasChoices(ENV_DEMO_MODE, "RECOVERY_CONTROLLER_DEMO_MODE"),
        description="Run without a policy or with public-name keys, logging a WARNING for "
        "each. Never in production.",
    )


class ControllerSettings(RulesSettings):
    """What one controller process needs. Defaults suit the local stack and the tests."""

    section: ClassVar[str] = "Controller"

    bootstrap: str = given(ServiceSettings, "kafka_bootstrap", min_length=1)
    database_url: str = given(ServiceSettings, "database_url", min_length=1)
    database_wait_s: float = given(ServiceSettings, "database_wait_s", default=300.0, ge=0)
    producer_id: str = given(IdentitySettings, "controller_id", min_length=1)
    signing_key_file: Path | None = given(IdentitySettings, "controller_key_file", default=None)
    topics: TopicNames = given(default_factory=TopicNames.from_env)
    kafka_security: KafkaSecurity = given(default_factory=KafkaSecurity.from_env)
    group_id: str = Field(
        default=DEFAULT_CONTROLLER_GROUP,
        min_length=1,
        description="The controllers' consumer group; members of one group share the "
        "partitions of `recovery.events`.",
    )
    instance_id: str = Field(
        default_factory=_instance,
        min_length=1,
        description="This member's name in logs, traces and the ledger's claims.",
    )
    batch_max_records: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="At most this many records per batch. The batch is also the bound on "
        "in-flight work: nothing is fetched for processing until the previous batch is "
        "committed or abandoned.",
    )
    rules_watch_seconds: float = Field(
        default=5.0,
        ge=0,
        description="How often the controller looks for a change in its lock, trusted "
        "publishers, registry, policy and roster files and reloads them (0: only on "
        'SIGHUP); docs/operations.md, "Changing the rules without a restart".',
    )
    batch_max_wait_ms: int = Field(
        default=200, ge=1, le=60_000, description="How long a batch waits for records."
    )
    max_queued_kbytes: int = Field(
        default=4_096,
        ge=64,
        description="librdkafka's prefetch buffer in KiB: bounds the memory held by "
        "records fetched but not yet batched (docs/PERFORMANCE.md).",
    )
    max_record_bytes: int = Field(
        default=MAX_EVENT_RECORD_BYTES,
        ge=1024,
        le=MAX_EVENT_RECORD_CEILING,
        description="Larger records (key, value and headers) are dead-lettered as "
        "oversized, as a bounded excerpt, before they are parsed.",
    )
    quarantine_after_starts: int = Field(
        default=3,
        ge=1,
        le=1_000,
        description="Crash quarantine: after this many starts in a row died without "
        "committing past the same offset, decide from there one record at a time "
        "(docs/controller.md).",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        default="earliest",
        description="Where a partition with no stored offset starts (the ledger's offsets "
        "are authoritative otherwise).",
    )
    session_timeout_ms: int = Field(
        default=10_000,
        ge=1_000,
        description="Classic protocol: how long the broker waits for a dead member's "
        "heartbeats before its partitions move (docs/controller.md, Failover).",
    )
    heartbeat_interval_ms: int | None = Field(
        default=None,
        ge=100,
        description="Classic protocol heartbeat interval (unset: a third of the session).",
    )
    group_instance_id: str | None = Field(
        default=None,
        min_length=1,
        description="Static membership (KIP-345): a member restarted with the same id takes "
        "its partitions back at once. Unique per member.",
    )
    group_protocol: Literal["classic", "consumer"] = Field(
        default="classic",
        description="`consumer` is KIP-848's protocol (broker-side assignment).",
    )
    max_poll_interval_ms: int = Field(
        default=300_000, ge=10_000, description="librdkafka's max.poll.interval.ms."
    )
    backoff_initial_ms: int = Field(
        default=100,
        ge=1,
        description="Backoff after a broker or database failure starts here and doubles, "
        "with full jitter.",
    )
    backoff_max_ms: int = Field(default=10_000, ge=1, description="The backoff's ceiling.")
    timer_poll_ms: int = Field(
        default=1_000,
        ge=10,
        le=60_000,
        description="How often the controller looks for timers due on its partitions "
        "(sooner while a slice came back full): a timer fires this late at most, plus the "
        "round trip of its event (docs/controller.md, Timers).",
    )
    timer_slice: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description="At most this many due timers fired per look, between two batches; "
        "no more while this many fired timer events wait undecided: a backlog of due "
        "timers drains slice by slice and never crowds out live events.",
    )
    timer_overdue_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A timer not decided this long after its due time counts as overdue "
        "(metric recovery_timers_overdue, `recoveryctl ops list --overdue`).",
    )
    timer_gauges_s: float = Field(
        default=15.0,
        gt=0,
        description="How often the waiting and overdue gauges are read from the ledger.",
    )
    stall_after_s: float = Field(
        default=60.0,
        gt=0,
        description="Health: the loop is wedged when it has not turned for this long.",
    )
    ready_max_lag: int = Field(
        default=10_000,
        ge=0,
        description="Health: not ready while a partition is more records behind than this.",
    )
    consumer_config: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka consumer settings, as a JSON object.",
    )
    allow_superuser: bool = Field(
        default=False,
        description="Run even when the database URL connects as a PostgreSQL superuser, "
        "which bypasses every grant and the append-only trigger (docs/ledger.md, Roles).",
    )

    @field_validator("heartbeat_interval_ms")
    @classmethod
    def _heartbeat_within_session(cls, value: int | None, info: ValidationInfo) -> int | None:
        session = info.data.get("session_timeout_ms")
        if value is not None and session is not None and value >= session:
            raise ValueError(f"must be below session_timeout_ms ({session}), a third of it or less")
        return value

    @property
    def heartbeat_ms(self) -> int:
        """The classic protocol's heartbeat interval: the one set, else a third of the
        session timeout (librdkafka's advice; its own 3 s default would exceed a short
        session)."""
        return self.heartbeat_interval_ms or self.session_timeout_ms // 3

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Self:
        """Settings from the environment (`environ`, else the process's), with
        `overrides` on top. Raises `SettingsError` naming each invalid setting and its
        variable."""
        try:
            return cls.load(environ, **overrides)
        except ConfigurationError as exc:
            raise SettingsError(str(exc)) from exc


class TelemetrySettings(Settings):
    """Telemetry of every runtime component, by OpenTelemetry's own variables
    (`consumer.telemetry`). What the SDK and the OTLP exporter read themselves (headers,
    timeouts, samplers, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`) is left to them."""

    section: ClassVar[str] = "Telemetry"

    sdk_disabled: bool = Field(
        default=False, validation_alias="OTEL_SDK_DISABLED", description="No telemetry at all."
    )
    traces_exporter: str | None = Field(
        default=None,
        validation_alias="OTEL_TRACES_EXPORTER",
        description="`otlp`, `console` or `none` (comma-separated). Unset: `otlp` when an "
        "OTLP endpoint is set, else `none`.",
    )
    metrics_exporter: str | None = Field(
        default=None,
        validation_alias="OTEL_METRICS_EXPORTER",
        description="As `OTEL_TRACES_EXPORTER`, for metrics.",
    )
    otlp_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT",
        description="OTLP/HTTP base URL; the exporters append `/v1/traces` and `/v1/metrics`.",
    )
    otlp_traces_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        description="The traces endpoint, used as it is.",
    )
    otlp_metrics_endpoint: str | None = Field(
        default=None,
        validation_alias="OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        description="The metrics endpoint, used as it is.",
    )
    legacy_exporter: str | None = Field(
        default=None,
        validation_alias="RECOVERY_CONTROLLER_EXPORTER",
        description="Deprecated: the exporter of both signals, where no `OTEL_*` variable decides.",
    )
    legacy_endpoint: str | None = Field(
        default=None,
        validation_alias="RECOVERY_CONTROLLER_OTLP_ENDPOINT",
        description="Deprecated: an OTLP base URL, where no `OTEL_*` variable decides.",
    )


class ProcessSettings(Settings):
    """What a runtime process (`recoveryctl run`, `python -m consumer`) serves and logs,
    for every role it runs."""

    section: ClassVar[str] = "Runtime process"

    metrics_address: str | None = Field(
        default=None,
        validation_alias=ENV_METRICS_ADDRESS,
        description="`host:port` to serve /metrics, /healthz and /readyz on (unset: off).",
    )
    log_level: str = Field(
        default="INFO",
        validation_alias="RECOVERY_LOG_LEVEL",
        description="Python logging level of the process.",
    )
