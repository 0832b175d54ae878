"""Reading what the controller published, from the start of a topic: for operators'
checks and the demo, never for acting (capability workers consume in their own group).

`read_commands` reads `recovery.commands` from offset 0 with a throwaway group and no
offset commits, decodes each record, and keeps each command id once: the relay may
publish a command twice after a crash, and readers dedupe on the id.

`read_topic` reads every record of a topic, each partition from its first offset to the
high watermark it had when the read began, as plain `TopicRecord` values (for
`recoveryctl audit verify --against-topic`), reporting progress as it goes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from producers.errors import ProducersError
from schemas import (
    CAPABILITY_COMMAND,
    CONTENT_TYPE,
    CapabilityCommand,
    KafkaSecurity,
    WireDecoder,
    WireError,
    kafka_config,
    librdkafka_logger,
)

__all__ = ["TopicRecord", "read_commands", "read_topic"]


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One record as read: coordinates, key, value and headers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    progress: Callable[[int, int], None] | None = None,
    consumer_config: Mapping[str, Any] | None = None,
    timeout: float = 120.0,
    security: KafkaSecurity | None = None,
) -> Iterator[TopicRecord]:
    """Every record of `topic` up to the end it had when the read began, partition by
    partition. `progress(read, total)` is called every 1,000 records and at the end.
    Raises `ProducersError` when the topic does not exist or the read stalls for
    `timeout` seconds. It connects with `security`, else the environment's settings."""
    consumer = Consumer(
        {
            **kafka_config(bootstrap, security),  # else the environment's settings
            "group.id": f"readback-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "logger": librdkafka_logger("readback"),
            **(consumer_config or {}),
        }
    )
    report = progress or (lambda _read, _total: None)
    try:
        left = _extents(consumer, bootstrap, topic)
        total = sum(high - low for low, high in left.values())
        read = 0
        if left:
            consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in left.items()])
        last = time.monotonic()
        while left:
            messages = consumer.consume(500, 0.5)
            if messages:
                last = time.monotonic()
            elif time.monotonic() - last > timeout:
                raise ProducersError(
                    f"reading {topic}: no record for {timeout:.0f} s with {total - read} "
                    "left to read; is the broker reachable?"
                )
            for message in messages:
                record = _take(message, left)
                if record is None:
                    continue
                read += 1
                if read % 1000 == 0:
                    report(read, total)
                yield record
        report(read, total)
    finally:
        consumer.close()


def _extents(consumer: Consumer, bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """Each non-empty partition's (first offset, end offset) now."""
    metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None or not metadata.partitions:
        raise ProducersError(f"topic {topic} does not exist on {bootstrap}")
    ends: dict[int, tuple[int, int]] = {}
    for p in sorted(metadata.partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if high > low:
            ends[p] = (low, high)
    return ends


def _take(message: Any, left: dict[int, tuple[int, int]]) -> TopicRecord | None:
    """The record `message` holds if its partition is still being read (and drop the
    partition from `left` once at its end); None for notices and records past the end."""
    partition = message.partition() or 0
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            left.pop(partition, None)  # at the end (a gap may hide the last offset)
        return None
    offset = message.offset() or 0
    if partition not in left or offset >= left[partition][1]:
        return None
    if offset + 1 >= left[partition][1]:
        del left[partition]
    return TopicRecord(
        message.topic() or "",
        partition,
        offset,
        message.key(),
        message.value(),
        tuple((k, v.encode() if isinstance(v, str) else v) for k, v in (message.headers() or [])),
    )


def read_commands(
    bootstrap: str,
    topic: str,
    *,
    keep: Callable[[CapabilityCommand], bool],
    expected: int,
    timeout: float = 15.0,
    security: KafkaSecurity | None = None,
) -> list[CapabilityCommand]:
    """Every command on `topic` for which `keep` is true, each command id once, in the
    order first read. Reads until `expected` are found and three polls came back empty,
    or `timeout` seconds passed; records that are not commands are passed over."""
    consumer = Consumer(
        {
            **kafka_config(bootstrap, security),
            "group.id": f"readback-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "logger": librdkafka_logger("readback"),
        }
    )
    decoder = WireDecoder()
    seen: dict[str, CapabilityCommand] = {}
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        end = time.monotonic() + timeout
        quiet = 0
        while time.monotonic() < end and (len(seen) < expected or quiet < 3):
            messages = consumer.consume(500, 0.5)
            quiet = 0 if messages else quiet + 1
            for message in messages:
                if message.error() is not None:
                    continue
                command = _command(decoder, message.value(), message.headers())
                if command is not None and keep(command):
                    seen.setdefault(command.command_id, command)
    finally:
        consumer.close()
    return list(seen.values())


def _command(decoder: WireDecoder, value: bytes | None, headers: Any) -> CapabilityCommand | None:
    content_type = None
    for key, raw in headers or []:
        if key == CONTENT_TYPE and raw is not None:
            content_type = raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        name, record = decoder.decode(value or b"", content_type)
        return CapabilityCommand.from_record(record) if name == CAPABILITY_COMMAND else None
    except WireError:
        return None
