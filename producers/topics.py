"""Idempotent provisioning of the recovery topics (their names: `schemas.TopicNames`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource  # typed here, as acls.py does
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic  # the typed stub lives here

from producers.errors import ProducersError, ProvisionError
from schemas import (
    MAX_OUTBOX_RECORD_BYTES,
    MIN_TOPIC_MESSAGE_BYTES,
    TOPIC_MAX_MESSAGE_BYTES,
    ConfigurationError,
    KafkaSecurity,
    TopicNames,
    kafka_config,
    librdkafka_logger,
)

__all__ = ["BrokerProbe", "TopicLimitError", "TopicResult", "check_message_limits", "provision"]


class TopicLimitError(ProducersError, ConfigurationError):
    """A recovery topic admits smaller records than the relay may publish; raise its
    `max.message.bytes` (named in the message) before starting the relay."""


def check_message_limits(
    bootstrap: str,
    topics: Sequence[str],
    *,
    security: KafkaSecurity | None = None,
    timeout: float = 15.0,
) -> dict[str, int]:
    """Each topic's `max.message.bytes` (the broker's view), after checking that every
    one admits the relay's largest record (`schemas.MIN_TOPIC_MESSAGE_BYTES`): a
    smaller limit would make the broker refuse rows the relay must publish. Raises
    `TopicLimitError` naming each topic and the fix, `ProducersError` when the broker
    cannot be asked."""
    config: dict[str, Any] = {
        **kafka_config(bootstrap, security),
        "logger": librdkafka_logger("admin"),
    }
    admin = AdminClient(config)
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in dict.fromkeys(topics)]
    limits: dict[str, int] = {}
    try:
        for resource, future in admin.describe_configs(resources, request_timeout=timeout).items():
            entry = future.result(timeout=timeout).get("max.message.bytes")
            limits[resource.name] = int(entry.value) if entry and entry.value else 0
    except KafkaException as exc:
        if _unanswered(exc):
            raise ProducersError(_no_answer(bootstrap, timeout)) from exc
        raise ProducersError(
            f"cannot read the recovery topics' max.message.bytes on {bootstrap}: {exc}; the "
            "relay's principal needs DescribeConfigs on them (`recoveryctl topics create` "
            "grants it)"
        ) from exc
    except TimeoutError as exc:
        # The future's wait ran out before the request's own timeout failed it.
        raise ProducersError(_no_answer(bootstrap, timeout)) from exc
    small = {name: size for name, size in limits.items() if size < MIN_TOPIC_MESSAGE_BYTES}
    if small:
        raise TopicLimitError(
            "; ".join(
                f"topic {name} admits records of {size} bytes, less than the "
                f"{MIN_TOPIC_MESSAGE_BYTES} the relay needs for its largest record "
                f"({MAX_OUTBOX_RECORD_BYTES} bytes)"
                for name, size in sorted(small.items())
            )
            + f"; set max.message.bytes={TOPIC_MAX_MESSAGE_BYTES} on each (kafka-configs "
            "--alter --entity-type topics --add-config ...)"
        )
    return limits


# The admin client's own errors for a broker that never answered (down, restarting),
# which the caller retries: whichever of the request's timeout and the future's wait
# runs out first, the message says so, not that a permission is missing.
_UNANSWERED = frozenset(
    {KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
)


def _unanswered(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() in _UNANSWERED


def _no_answer(bootstrap: str, timeout: float) -> str:
    return (
        f"cannot read the recovery topics' max.message.bytes on {bootstrap}: the broker "
        f"did not answer within {timeout:g}s"
    )


@dataclass(frozen=True, slots=True)
class TopicResult:
    """What provisioning did to one topic; `partitions` is the count it has now."""

    name: str
    created: bool
    partitions: int


def provision(
    bootstrap: str,
    partitions: int = 6,
    replication: int | None = None,
    names: TopicNames | None = None,
    *,
    timeout: float = 30.0,
    security: KafkaSecurity | None = None,
) -> list[TopicResult]:
    """Create every recovery topic that does not exist yet with `partitions` partitions
    and `replication` replicas (default: the broker's `default.replication.factor`, 1 on
    the local single broker and 3 on the local cluster); leave existing ones untouched
    (a partition count is never changed here, because that would move keys between
    partitions and break per-operation order). Safe to run any number of times.
    Connects as `security` (else the environment's client settings). Raises
    `ProvisionError` naming the topic."""
    if partitions < 1 or (replication is not None and replication < 1):
        raise ProvisionError(
            f"partitions ({partitions}) and replication ({replication}) must be >= 1"
        )
    names = names or TopicNames.from_env()
    config: dict[str, Any] = {
        **kafka_config(bootstrap, security),
        "logger": librdkafka_logger("admin"),
    }
    admin = AdminClient(config)
    wanted = [
        # -1: the broker's default (KIP-464). The message size is set, not inherited: the
        # relay's largest record must fit whatever the broker's default (schemas.limits).
        NewTopic(
            t,
            num_partitions=partitions,
            replication_factor=replication or -1,
            config={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)},
        )
        for t in names.all()
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


class BrokerProbe:
    """Asks a bootstrap server whether a broker is live, quietly: librdkafka would log
    every refused connection to stderr while a broker starts; the caller reports the
    outcome instead."""

    def __init__(
        self, bootstrap: str, security: KafkaSecurity | None = None, *, brokers: int = 1
    ) -> None:
        # How many live brokers the metadata must list (a cluster: all its nodes).
        self._brokers = brokers
        config: dict[str, Any] = {
            **kafka_config(bootstrap, security),
            "log_level": 0,
            "error_cb": _ignore,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
        self._admin = AdminClient(config)

    def problem(self, timeout: float) -> str | None:
        """None when a metadata request answered within `timeout` seconds and lists as
        many live brokers as asked for (one by default); otherwise what went wrong, for
        the caller's message."""
        try:
            metadata = self._admin.list_topics(timeout=timeout)
        except KafkaException as exc:
            return str(exc)
        live = len(metadata.brokers)
        if live >= self._brokers:
            return None
        if not live:
            return "metadata lists no live broker"
        return f"metadata lists {live} of {self._brokers} brokers"


def _ignore(_error: object) -> None:
    return None
