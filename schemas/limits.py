"""The sizes every record on the project's topics is held to, in one place.

A record that one tool can make too large for a topic must never stop the pipeline for
everyone, so every size is bounded where it enters and again where it leaves:

- in: a record on `recovery.events` is at most `MAX_EVENT_RECORD_BYTES` (key, value and
  headers; the controller's `max_record_bytes`, at most `MAX_EVENT_RECORD_CEILING`), its
  payload at most `machines.MAX_PAYLOAD_BYTES` of canonical JSON; a larger record is
  dead-lettered as a bounded excerpt (`consumer.deadletter`);
- out: every record the relay publishes is at most `MAX_OUTBOX_RECORD_BYTES`, the
  relay's own bound, below its producer's `message.max.bytes`; each recovery topic's
  `max.message.bytes` must admit it with the batch's overhead (`MIN_TOPIC_MESSAGE_BYTES`,
  checked when the relay starts; `recoveryctl topics create` sets
  `TOPIC_MAX_MESSAGE_BYTES`). A row that is larger all the same (written by an older
  version) is held with its reason, never published and never fatal
  (`producers.OutboxRelay`).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "MAX_EVENT_RECORD_BYTES",
    "MAX_EVENT_RECORD_CEILING",
    "MAX_OUTBOX_RECORD_BYTES",
    "MIN_TOPIC_MESSAGE_BYTES",
    "TOPIC_MAX_MESSAGE_BYTES",
]

MAX_EVENT_RECORD_BYTES: Final = 256 * 1024
MAX_EVENT_RECORD_CEILING: Final = 1024 * 1024
# librdkafka's default `message.max.bytes`; the largest row the controller writes (a
# dead letter of a record of the ceiling's size, whole up to `DEAD_LETTER_WHOLE_BYTES`,
# or a command carrying a machine's parameters) stays well below it.
MAX_OUTBOX_RECORD_BYTES: Final = 1_000_000
# What a topic must admit for the relay's largest record, with the batch's overhead, and
# what `recoveryctl topics create` gives each recovery topic (Kafka's own default).
MIN_TOPIC_MESSAGE_BYTES: Final = MAX_OUTBOX_RECORD_BYTES + 16 * 1024
TOPIC_MAX_MESSAGE_BYTES: Final = 1_048_588
