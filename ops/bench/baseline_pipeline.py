"""The Kafka side of the bare pipeline the controller is compared with, and a tail that
timestamps records as they become readable.

`run_baseline` is the least work any controller with the controller's durability must
do per record: read it with a consumer (offsets not committed to Kafka), write one row
per record and the partitions' next offsets in one PostgreSQL transaction per batch
(the caller's `BatchSink`, `ops.bench.baseline_sink.BaselineSink`), and produce one
record per input record with an idempotent producer and `acks=all`. No decoding, no decision,
no audit chain, no outbox: its throughput is the ceiling the controller is measured
against, on the same broker and database, in the same run.

`TopicTail` reads topics from the start in a background thread and remembers, for each
record, when it was first readable: by command id (`recovery-command-id`, which the
relay sets) on the commands topic, and by count elsewhere. It is how the benchmark
knows when a command caused by an event became visible.

It drives confluent_kafka directly on purpose: the baseline is the driver without the
controller's code (`ops.bench` says why the harness may).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Final, Protocol

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # the typed stub lives here

from producers import ProducersError
from schemas import HEADER_COMMAND_ID, HEADER_RECORD_ID, kafka_config

__all__ = [
    "BaselineResult",
    "BatchSink",
    "SinkRow",
    "TopicTail",
    "create_topic",
    "delete_topics",
    "kafka_versions",
    "run_baseline",
]

# The same durability as the relay's producer: the broker dedupes retries and a record
# counts only once every in-sync replica has it.
_DURABLE: Final[Mapping[str, Any]] = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
    "linger.ms": 5,
}


@dataclass(frozen=True, slots=True)
class SinkRow:
    """One consumed record as the baseline stores it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class BatchSink(Protocol):
    """Where the baseline writes: rows and next offsets in one durable transaction."""

    def write(self, rows: Sequence[SinkRow], offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit `rows` and `offsets` together, or raise."""


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """One baseline drain: records processed, batches, first read and last ack times
    (`time.time()`), and the records per second between them."""

    records: int
    batches: int
    first_read: float
    last_ack: float

    @property
    def seconds(self) -> float:
        """From the first record read to the last record acknowledged."""
        return max(self.last_ack - self.first_read, 1e-9)

    @property
    def rate(self) -> float:
        """Records per second."""
        return self.records / self.seconds


def run_baseline(
    bootstrap: str,
    source: str,
    sink_topic: str,
    sink: BatchSink,
    expected: int,
    *,
    batch_max: int = 500,
    timeout: float = 600.0,
) -> BaselineResult:
    """Drain `expected` records of `source` through the bare pipeline (module
    docstring) and return how long it took. Raises `ProducersError` when the records do
    not all arrive within `timeout` seconds or the broker refuses a produced record."""
    consumer = Consumer(
        {
            **kafka_config(bootstrap),
            "group.id": f"bench-baseline-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = Producer({**kafka_config(bootstrap), **_DURABLE})
    failures: list[str] = []

    def delivered(error: KafkaError | None, _message: Message[Any, Any]) -> None:
        if error is not None:
            failures.append(str(error))

    # A new idempotent producer holds its records until the broker has given it a
    # producer id (about 0.5 s with librdkafka here, its retry timer); the consumer's
    # group join is faster than that on this broker, so the first batches would wait
    # for it inside the timed window. One acknowledged record before reading makes the
    # producer ready, as a running pipeline's is.
    producer.produce(sink_topic, key=b"warm-up", value=b"", on_delivery=delivered)
    producer.flush(30.0)

    done = batches = 0
    first_read = 0.0
    deadline = time.monotonic() + timeout
    try:
        consumer.subscribe([source])
        while done < expected:
            if time.monotonic() > deadline:
                raise ProducersError(
                    f"baseline: {done} of {expected} records of {source} read in "
                    f"{timeout:.0f}s; is the topic loaded?"
                )
            messages = [m for m in consumer.consume(batch_max, 0.2) if m.error() is None]
            if not messages:
                continue
            first_read = first_read or time.time()
            rows = [
                SinkRow(m.topic() or "", m.partition() or 0, m.offset() or 0, m.key(), m.value())
                for m in messages
            ]
            offsets = {(r.topic, r.partition): r.offset + 1 for r in rows}
            sink.write(rows, offsets)
            for m in messages:
                _produce(producer, sink_topic, m, delivered)
            producer.poll(0)
            done += len(messages)
            batches += 1
        producer.flush(60.0)
        last_ack = time.time()
    finally:
        consumer.close()
    if failures or len(producer) > 0:
        raise ProducersError(
            f"baseline: {len(failures)} record(s) refused and {len(producer)} unacknowledged "
            f"on {sink_topic}: {'; '.join(failures[:3])}"
        )
    return BaselineResult(done, batches, first_read, last_ack)


def _produce(producer: Producer, topic: str, message: Message[Any, Any], callback: Any) -> None:
    while True:
        try:
            producer.produce(
                topic,
                key=message.key(),
                value=message.value(),
                headers=message.headers(),
                on_delivery=callback,
            )
            return
        except BufferError:
            producer.poll(0.05)


@dataclass(slots=True)
class _Seen:
    commands: dict[str, float] = field(default_factory=dict)
    # Command id → the record's timestamp (the relay's produce call, CreateTime).
    produced: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)


class TopicTail:
    """Reads `topics` from their current end (or start) in a thread; `first_seen`
    maps each command id on the commands topic to when it was first readable."""

    def __init__(
        self, bootstrap: str, topics: Sequence[str], commands_topic: str, *, from_start: bool
    ) -> None:
        self._consumer = Consumer(
            {
                **kafka_config(bootstrap),
                "group.id": f"bench-tail-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                # Hand each record over as soon as it is fetched: the tail measures when
                # records become readable, so it must not wait to fill a fetch.
                "fetch.wait.max.ms": 10,
                "fetch.min.bytes": 1,
            }
        )
        self._commands_topic = commands_topic
        self._lock = threading.Lock()
        self._seen = _Seen()
        self._stop = threading.Event()
        assignment: list[TopicPartition] = []
        for topic in topics:
            meta = self._consumer.list_topics(topic, timeout=10).topics[topic]
            for partition in meta.partitions:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                assignment.append(TopicPartition(topic, partition, low if from_start else high))
        self._consumer.assign(assignment)
        self._thread = threading.Thread(target=self._run, name="bench-tail", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # The first record as soon as it is there, then whatever else has arrived:
            # `consume(1000, 0.05)` would hold records until 1,000 arrived or 50 ms
            # passed, adding up to 50 ms to every latency measured.
            messages = self._consumer.consume(1, 0.05)
            if messages:
                messages.extend(self._consumer.consume(1000, 0))
            now = time.time()
            if not messages:
                continue
            with self._lock:
                for m in messages:
                    if m.error() is not None:
                        continue
                    topic = m.topic() or ""
                    self._seen.counts[topic] = self._seen.counts.get(topic, 0) + 1
                    self._seen.last[topic] = now
                    if topic == self._commands_topic:
                        command = _header(m, HEADER_COMMAND_ID) or _header(m, HEADER_RECORD_ID)
                        if command is not None and command not in self._seen.commands:
                            self._seen.commands[command] = now
                            self._seen.produced[command] = m.timestamp()[1] / 1000

    def count(self, topic: str) -> int:
        """Records of `topic` read so far (including republished duplicates)."""
        with self._lock:
            return self._seen.counts.get(topic, 0)

    def last(self, topic: str) -> float | None:
        """When the last record of `topic` was read (`time.time()`), if any was."""
        with self._lock:
            return self._seen.last.get(topic)

    def commands(self) -> dict[str, float]:
        """A copy of command id → when first readable."""
        with self._lock:
            return dict(self._seen.commands)

    def produced(self) -> dict[str, float]:
        """A copy of command id → the record's own timestamp (when the relay produced
        it: the topic's CreateTime), for the commands read so far."""
        with self._lock:
            return dict(self._seen.produced)

    def command_count(self) -> int:
        """Distinct command ids read so far."""
        with self._lock:
            return len(self._seen.commands)

    def close(self) -> None:
        """Stop the thread and leave."""
        self._stop.set()
        self._thread.join(10.0)
        self._consumer.close()


def _header(message: Message[Any, Any], name: str) -> str | None:
    for pair in message.headers() or ():
        key, value = pair[0], pair[1]
        if key == name and value is not None:
            return value.decode("utf-8") if isinstance(value, bytes) else str(value)
    return None


def kafka_versions() -> dict[str, str]:
    """confluent-kafka and librdkafka versions, for the benchmark's machine description."""
    return {
        "confluent_kafka": metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
    }


def create_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Create the baseline's output topic (replication 1, like the local stack's)."""
    admin = AdminClient(kafka_config(bootstrap))
    for future in admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)]
    ).values():
        future.result(timeout=timeout)


def delete_topics(bootstrap: str, names: Sequence[str], timeout: float = 30.0) -> None:
    """Delete the benchmark's topics; a topic already gone is not an error."""
    admin = AdminClient(kafka_config(bootstrap))
    for future in admin.delete_topics(list(names), operation_timeout=timeout).values():
        try:
            future.result(timeout=timeout)
        except confluent_kafka.KafkaException:
            pass
