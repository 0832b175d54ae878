"""The recovery topics: their names (configurable) and idempotent provisioning.

Names default to `recovery.events`, `recovery.commands`, `recovery.evidence`,
`recovery.audit` and `recovery.dlq`; each can be overridden by an environment variable
(`RECOVERY_TOPIC_EVENTS`, ...) so that several deployments, or tests, share a broker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # the typed stub lives here
from pydantic import BaseModel, ConfigDict, Field

from producers.errors import ProvisionError

__all__ = ["ENV_TOPIC_PREFIX", "TopicNames", "TopicResult", "provision"]

ENV_TOPIC_PREFIX: Final = "RECOVERY_TOPIC_"

_NAME = r"^[A-Za-z0-9._-]{1,249}$"


class TopicNames(BaseModel):
    """Where each stream lives. Keys of every topic are operation ids."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    events: str = Field(default="recovery.events", pattern=_NAME)
    commands: str = Field(default="recovery.commands", pattern=_NAME)
    evidence: str = Field(default="recovery.evidence", pattern=_NAME)
    audit: str = Field(default="recovery.audit", pattern=_NAME)
    dlq: str = Field(default="recovery.dlq", pattern=_NAME)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TopicNames:
        """Defaults overridden by `RECOVERY_TOPIC_EVENTS`, `..._COMMANDS`, `..._EVIDENCE`,
        `..._AUDIT` and `..._DLQ` when set and not empty."""
        env = os.environ if environ is None else environ
        overrides = {
            name: env[ENV_TOPIC_PREFIX + name.upper()]
            for name in cls.model_fields
            if env.get(ENV_TOPIC_PREFIX + name.upper())
        }
        return cls(**overrides)

    def all(self) -> tuple[str, ...]:
        """Every topic name, in a fixed order."""
        return (self.events, self.commands, self.evidence, self.audit, self.dlq)


@dataclass(frozen=True, slots=True)
class TopicResult:
    """What provisioning did to one topic; `partitions` is the count it has now."""

    name: str
    created: bool
    partitions: int


def provision(
    bootstrap: str,
    partitions: int = 6,
    replication: int = 1,
    names: TopicNames | None = None,
    *,
    timeout: float = 30.0,
) -> list[TopicResult]:
    """Create every recovery topic that does not exist yet with `partitions` partitions
    and `replication` replicas; leave existing ones untouched (a partition count is never
    changed here, because that would move keys between partitions and break per-operation
    order). Safe to run any number of times. Raises `ProvisionError` naming the topic."""
    if partitions < 1 or replication < 1:
        raise ProvisionError(
            f"partitions ({partitions}) and replication ({replication}) must be >= 1"
        )
    names = names or TopicNames.from_env()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [
        NewTopic(t, num_partitions=partitions, replication_factor=replication) for t in names.all()
    ]
    created: set[str] = set()
    for name, future in admin.create_topics(wanted, operation_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
            created.add(name)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise ProvisionError(f"topic {name} on {bootstrap}: creation failed: {exc}") from exc
    counts = _partition_counts(admin, names.all(), timeout)
    return [TopicResult(name, name in created, counts.get(name, 0)) for name in names.all()]


def _partition_counts(
    admin: AdminClient, topics: tuple[str, ...], timeout: float
) -> dict[str, int]:
    # A topic just created may take a moment to appear in every broker's metadata;
    # wait (bounded) so that the counts reported are the real ones, not zero.
    deadline = time.monotonic() + timeout
    while True:
        try:
            metadata = admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise ProvisionError(f"listing topics failed after provisioning: {exc}") from exc
        counts = {
            name: len(metadata.topics[name].partitions)
            for name in topics
            if name in metadata.topics and metadata.topics[name].error is None
        }
        if all(counts.get(name, 0) > 0 for name in topics):
            return counts
        if time.monotonic() >= deadline:
            missing = [name for name in topics if counts.get(name, 0) == 0]
            raise ProvisionError(
                f"topics {', '.join(missing)} do not show in the broker's metadata "
                f"{timeout:.0f} s after creation; check the broker's logs"
            )
        time.sleep(0.2)
