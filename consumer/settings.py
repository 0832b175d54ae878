"""Controller settings: pydantic at the edge, read from the environment by `from_env`.

Every setting has an environment variable `RECOVERY_CONTROLLER_<NAME>` except the two
the whole stack shares (`RECOVERY_KAFKA_BOOTSTRAP`, `RECOVERY_DATABASE_URL`, see
`schemas.deployment`) and the topic names (`RECOVERY_TOPIC_*`, see `schemas.TopicNames`).
Demo mode is also read from `RECOVERY_DEMO_MODE` (`ENV_DEMO_MODE`), the name the README
and compose use; `RECOVERY_CONTROLLER_DEMO_MODE` works as well.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from consumer.errors import SettingsError
from machines import DEFAULT_REGISTRY
from schemas import (
    DEFAULT_CONTROLLER_ID,
    ENV_CONTROLLER_ID,
    ENV_CONTROLLER_SIGNING_KEY_FILE,
    ENV_DATABASE_URL,
    ENV_KAFKA_BOOTSTRAP,
    KafkaConfigError,
    KafkaSecurity,
    TopicNames,
)

__all__ = ["ENV_DEMO_MODE", "ENV_PREFIX", "ControllerSettings", "Exporter"]

ENV_PREFIX: Final = "RECOVERY_CONTROLLER_"
ENV_DEMO_MODE: Final = "RECOVERY_DEMO_MODE"
_MACHINES = Path(DEFAULT_REGISTRY).resolve().parent

Exporter = Literal["none", "console", "otlp"]


def _signing_key_file() -> Path | None:
    value = os.environ.get(ENV_CONTROLLER_SIGNING_KEY_FILE)
    return Path(value) if value else None


def _instance() -> str:
    return f"controller-{socket.gethostname()}-{os.getpid()}"


class ControllerSettings(BaseModel):
    """What one controller process needs. Defaults suit the local stack and the tests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(min_length=1, description="Kafka bootstrap servers")
    database_url: str = Field(min_length=1, description="ledger PostgreSQL URL")
    group_id: str = Field(default="recovery-controller", min_length=1)
    instance_id: str = Field(default_factory=_instance, min_length=1)
    topics: TopicNames = Field(default_factory=TopicNames.from_env)
    # How it authenticates to Kafka: RECOVERY_KAFKA_SECURITY_PROTOCOL, ..._SASL_*,
    # ..._SSL_CA_LOCATION, ..._CONFIG_FILE (schemas.KafkaSecurity).
    kafka_security: KafkaSecurity = Field(default_factory=KafkaSecurity.from_env)
    # One batch: at most this many records, waiting at most this long for them. The
    # batch is also the bound on in-flight work: nothing is fetched for processing
    # until the previous batch is committed or abandoned.
    batch_max_records: int = Field(default=500, ge=1, le=100_000)
    batch_max_wait_ms: int = Field(default=200, ge=1, le=60_000)
    # librdkafka's prefetch buffer (the consumer's one queue), in KiB: bounds memory held
    # by records fetched but not yet handed to a batch. 4 MiB is ten full batches of
    # typical records; a larger buffer only raised the controller's peak memory once a
    # backlog was deep enough to fill it, and bought no throughput (docs/PERFORMANCE.md).
    max_queued_kbytes: int = Field(default=4_096, ge=64)
    # Larger records are dead-lettered as oversized before they are parsed.
    max_record_bytes: int = Field(default=1024 * 1024, ge=1024)
    # Crash quarantine (docs/controller.md): after this many starts in a row died
    # without committing past the same offset, decide from there one record at a time,
    # and dead-letter as `record-quarantined` a record as many starts died on alone.
    quarantine_after_starts: int = Field(default=3, ge=1, le=1_000)
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    # Classic protocol: how long the broker waits for a dead member's heartbeats before
    # its partitions move, and how often librdkafka's background thread heartbeats (unset:
    # a third of the session). Fast failover runs a standby member with 1500 and 500
    # (docs/controller.md, "Failover"); the broker's group.min.session.timeout.ms (6 s
    # by default) must allow it.
    session_timeout_ms: int = Field(default=10_000, ge=1_000)
    heartbeat_interval_ms: int | None = Field(default=None, ge=100)
    # Static membership (KIP-345): a member restarted with the same id takes its
    # partitions back at once, without waiting for the session timeout or a rebalance
    # (docs/controller.md, "Failover"). Unique per member; unset: dynamic membership.
    group_instance_id: str | None = Field(default=None, min_length=1)
    # `consumer` is KIP-848's group protocol (broker-side assignment, heartbeats and
    # session timeout, `group.consumer.session.timeout.ms` on the broker).
    group_protocol: Literal["classic", "consumer"] = "classic"
    max_poll_interval_ms: int = Field(default=300_000, ge=10_000)
    # Backoff after a broker or database failure: doubles from `backoff_initial_ms` up
    # to `backoff_max_ms`, with full jitter.
    backoff_initial_ms: int = Field(default=100, ge=1)
    backoff_max_ms: int = Field(default=10_000, ge=1)
    registry_path: Path = Field(default=Path(DEFAULT_REGISTRY))
    lock_path: Path = Field(default=_MACHINES / "machines.lock")
    trusted_publishers_path: Path = Field(default=_MACHINES / "trusted-publishers.yaml")
    # The operator policy (RECOVERY_CONTROLLER_POLICY_PATH, `recoveryctl run --policy`).
    # Required: without one, or with a key derived from a public name in it, the
    # controller refuses to start unless `demo_mode` is set (docs/controller.md,
    # "Policy and demo mode"); start from ops/policy.production.yaml.
    policy_path: Path | None = None
    # Demo mode (RECOVERY_DEMO_MODE=1, `recoveryctl run --demo`): run without a policy
    # file (the built-in policy trusts no verifier and has no approver) or with
    # public-name keys, logging a WARNING for each. Never in production.
    demo_mode: bool = False
    # A producer roster beside the policy (a `producers:`-only file or another policy):
    # its producers are added to the policy's (docs/operations.md, "Producer roster").
    roster_path: Path | None = None
    # Health (docs/operations.md): the loop is wedged when it has not turned for this
    # long; the member is not ready while a partition is more records behind than this.
    stall_after_s: float = Field(default=60.0, gt=0)
    ready_max_lag: int = Field(default=10_000, ge=0)
    # Deprecated aliases (RECOVERY_CONTROLLER_EXPORTER, _OTLP_ENDPOINT): telemetry is
    # configured by the OTEL_* variables (consumer.telemetry); these apply only where
    # none of those decides.
    exporter: Exporter | None = None
    otlp_endpoint: str | None = None
    consumer_config: dict[str, str] = Field(default_factory=dict)
    # The controller's identity in the roster (RECOVERY_CONTROLLER_ID) and its Ed25519
    # key file (RECOVERY_CONTROLLER_SIGNING_KEY_FILE, PEM PKCS#8 or the base64 raw seed,
    # never in the database): every record the controller emits is signed with it, and
    # the controller refuses to start without it (docs/operations.md, "Keys").
    producer_id: str = Field(default=DEFAULT_CONTROLLER_ID, min_length=1)
    signing_key_file: Path | None = Field(default_factory=_signing_key_file)
    # Run even when `database_url` connects as a PostgreSQL superuser, which bypasses
    # every grant and can skip the append-only trigger (docs/ledger.md, "Roles").
    allow_superuser: bool = False

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
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> ControllerSettings:
        """Settings from the environment, with `overrides` on top. Raises
        `SettingsError` naming each invalid setting and its variable."""
        env = os.environ if environ is None else environ
        data: dict[str, Any] = {}
        if env.get(ENV_KAFKA_BOOTSTRAP):
            data["bootstrap"] = env[ENV_KAFKA_BOOTSTRAP]
        if env.get(ENV_DATABASE_URL):
            data["database_url"] = env[ENV_DATABASE_URL]
        data["topics"] = TopicNames.from_env(env)
        if env.get(ENV_DEMO_MODE):
            data["demo_mode"] = env[ENV_DEMO_MODE]
        try:
            data["kafka_security"] = KafkaSecurity.from_env(env)
        except KafkaConfigError as exc:
            raise SettingsError(f"invalid controller settings: {exc}") from exc
        if env.get(ENV_CONTROLLER_ID):
            data["producer_id"] = env[ENV_CONTROLLER_ID]
        if environ is not None and not env.get(ENV_CONTROLLER_SIGNING_KEY_FILE):
            data["signing_key_file"] = None  # the given environment, not the process's
        for name in cls.model_fields:
            value = env.get(ENV_PREFIX + name.upper())
            if value and name not in {"topics", "consumer_config", "kafka_security"}:
                data[name] = value
        data.update(overrides)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])} ({_variable(err['loc'])}): {err['msg']}"
                for err in exc.errors()
            )
            raise SettingsError(f"invalid controller settings: {problems}") from exc


def _variable(loc: tuple[int | str, ...]) -> str:
    name = str(loc[0]) if loc else ""
    if name == "bootstrap":
        return ENV_KAFKA_BOOTSTRAP
    if name == "database_url":
        return ENV_DATABASE_URL
    if name == "demo_mode":
        return f"{ENV_DEMO_MODE} or {ENV_PREFIX}DEMO_MODE"
    if name == "producer_id":
        return ENV_CONTROLLER_ID
    return ENV_PREFIX + name.upper()
