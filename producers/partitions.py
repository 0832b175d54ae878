"""What Kafka holds for a consumed topic's partitions, for `recoveryctl offsets`.

`partition_extents` reads each partition's log start and end (low and high watermarks)
and the offset the group last committed to Kafka (advice only: the controller's
authoritative offsets are the ledger's, docs/controller.md). `read_range` reads the
records of one partition between two offsets with a throwaway group and no offset
commits, so an operator can keep the bytes of records they are about to skip. Neither
joins the group nor commits anything: a running controller is not disturbed.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from producers.errors import KafkaReadError
from schemas import KafkaSecurity, kafka_config, librdkafka_logger

__all__ = ["PartitionExtent", "StoredRecord", "partition_extents", "read_range"]


@dataclass(frozen=True, slots=True)
class PartitionExtent:
    """One partition's log start and end, and the group's advisory offset (None: the
    group committed none to Kafka)."""

    partition: int
    log_start: int
    log_end: int
    advisory: int | None


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record read back from a partition, as plain values."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int | None


def _consumer(bootstrap: str, group: str, security: KafkaSecurity | None) -> Consumer:
    return Consumer(
        {
            **kafka_config(bootstrap, security),  # else the environment's settings
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",  # what the controller reads
            "logger": librdkafka_logger("offsets"),
        }
    )


def partition_extents(
    bootstrap: str,
    topic: str,
    group: str,
    timeout: float = 10.0,
    *,
    security: KafkaSecurity | None = None,
) -> tuple[PartitionExtent, ...]:
    """Each partition of `topic` in order, with its log start and end and the offset
    `group` last committed to Kafka. Raises `KafkaReadError` when the broker does not
    answer within `timeout` seconds or has no such topic."""
    consumer = _consumer(bootstrap, group, security)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            why = metadata.error if metadata is not None else "unknown topic"
            raise KafkaReadError(f"topic {topic}: {why}; check the topic name and the broker")
        partitions = sorted(metadata.partitions)
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in partitions], timeout=timeout
        )
        advice = {c.partition: c.offset for c in committed if c.error is None and c.offset >= 0}
        out = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            out.append(PartitionExtent(p, int(low), int(high), advice.get(p)))
        return tuple(out)
    except KafkaException as exc:
        raise KafkaReadError(
            f"cannot read the offsets of {topic} from {bootstrap} within {timeout:.0f}s: "
            f"{exc}; check that the broker is running"
        ) from exc
    finally:
        consumer.close()


def read_range(
    bootstrap: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    timeout: float = 30.0,
    *,
    security: KafkaSecurity | None = None,
) -> dict[int, StoredRecord]:
    """The records of `topic[partition]` with offsets in `start`..`end - 1` that the log
    still holds, by offset (retention, compaction and transaction markers leave gaps).
    Raises `KafkaReadError` when they cannot be read within `timeout` seconds."""
    consumer = _consumer(bootstrap, f"offsets-read-{uuid.uuid4().hex[:8]}", security)
    found: dict[int, StoredRecord] = {}
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout
        position = start
        while position < end:
            if time.monotonic() > deadline:
                raise KafkaReadError(
                    f"reading {topic}[{partition}] from offset {start} to {end} took over "
                    f"{timeout:.0f}s (stopped at {position}); check the broker, or skip "
                    "fewer records at a time"
                )
            for message in consumer.consume(500, 0.5):
                if message.error() is not None:
                    continue
                offset = message.offset()
                assert offset is not None
                if start <= offset < end:
                    found[offset] = _stored(message, partition, offset)
            position = _position(consumer, topic, partition, position)
    except KafkaException as exc:
        raise KafkaReadError(f"cannot read {topic}[{partition}]: {exc}") from exc
    finally:
        consumer.close()
    return found


def _position(consumer: Consumer, topic: str, partition: int, last: int) -> int:
    (where,) = consumer.position([TopicPartition(topic, partition)])
    return max(last, int(where.offset)) if where.offset >= 0 else last


def _stored(message: Any, partition: int, offset: int) -> StoredRecord:
    headers = tuple(
        (str(k), v.encode("utf-8") if isinstance(v, str) else v) for k, v in message.headers() or []
    )
    kind, stamp = message.timestamp()
    key, value = message.key(), message.value()
    return StoredRecord(
        partition,
        offset,
        key if isinstance(key, bytes) else None,
        value if isinstance(value, bytes) else None,
        headers,
        stamp if kind != 0 else None,
    )
