"""Reading back what a test published: raw messages, with a deadline."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Message

from schemas import kafka_config


def read_messages(
    bootstrap: str, topic: str, expected: int, *, timeout: float = 30.0
) -> list[Message[Any, Any]]:
    """The first `expected` messages of `topic` (from the beginning), or fewer if the
    deadline passes first; a fresh consumer group each call."""
    consumer = Consumer(
        {
            **kafka_config(bootstrap),
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    received: list[Message[Any, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(received) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received.append(message)
    finally:
        consumer.close()
    return received


def headers_of(message: Message[Any, Any]) -> dict[str, str]:
    """The message's headers decoded as UTF-8 (last value wins)."""
    raw = message.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in pairs}
