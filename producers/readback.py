"""Reading what the controller published, from the start of a topic: for operators'
checks and the demo, never for acting (capability workers consume in their own group).

`read_commands` reads `recovery.commands` from offset 0 with a throwaway group and no
offset commits, decodes each record, and keeps each command id once: the relay may
publish a command twice after a crash, and readers dedupe on the id.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

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

__all__ = ["read_commands"]


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
