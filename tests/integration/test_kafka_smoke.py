"""The local Kafka broker is a real one: keyed records through a consumer group keep
their per-key order, and a broker restarted on the same data folder still has them."""

from __future__ import annotations

import shutil
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from ops.kafka import KafkaBroker, KafkaServiceError, start_kafka
from ops.ports import LOOPBACK
from schemas import KafkaSecurity, kafka_config
from tests.support.kafka import TopicFactory
from tests.support.services import service_root

pytestmark = pytest.mark.integration


def _produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[str, str]],
    security: KafkaSecurity | None = None,
) -> None:
    producer = Producer(
        {**kafka_config(bootstrap, security), "enable.idempotence": True, "acks": "all"}
    )
    failures: list[str] = []

    def on_delivery(error: object, _message: Message) -> None:
        if error is not None:
            failures.append(str(error))

    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not delivered within 30 s"
    assert failures == []


def _consume(
    bootstrap: str, topic: str, expected: int, group: str, security: KafkaSecurity | None = None
) -> list[Message]:
    consumer = Consumer(
        {
            **kafka_config(bootstrap, security),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    received: list[Message] = []
    deadline = time.monotonic() + 45
    try:
        while len(received) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            received.append(message)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return received


def _by_key(messages: list[Message]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for message in messages:
        key, value = message.key(), message.value()
        assert key is not None
        assert value is not None
        grouped[key.decode()].append(value.decode())
    return dict(grouped)


def test_keyed_records_keep_per_key_order_through_a_consumer_group(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(partitions=3)
    keys = [f"op-{n}" for n in range(6)]
    records = [(key, f"{key}:{seq}") for seq in range(25) for key in keys]
    _produce(kafka_bootstrap, topic, records)

    group = f"smoke-{uuid.uuid4().hex[:8]}"
    received = _consume(kafka_bootstrap, topic, len(records), group)

    assert len(received) == len(records)
    assert _by_key(received) == {key: [f"{key}:{seq}" for seq in range(25)] for key in keys}
    partitions_of_key: dict[str, set[int]] = defaultdict(set)
    for message in received:
        key = message.key()
        assert key is not None
        partitions_of_key[key.decode()].add(message.partition())
    assert all(len(parts) == 1 for parts in partitions_of_key.values())
    # The group committed exactly up to the end of every partition.
    checker = Consumer({**kafka_config(kafka_bootstrap), "group.id": group})
    try:
        committed = checker.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
        ends = [checker.get_watermark_offsets(tp, timeout=10)[1] for tp in committed]
    finally:
        checker.close()
    assert [tp.offset for tp in committed] == ends
    assert sum(ends) == len(records)


@pytest.fixture
def own_broker() -> Iterator[tuple[KafkaBroker, list[KafkaBroker]]]:
    """A broker of this test's own (so restarting it disturbs no other test); every
    broker started on its folder is stopped at the end."""
    root = service_root("kafka-restart")
    started = [start_kafka(root / "broker")]
    yield started[0], started
    for broker in started:
        broker.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_records_survive_a_broker_restart_on_the_same_data_dir(
    own_broker: tuple[KafkaBroker, list[KafkaBroker]],
) -> None:
    first, started = own_broker
    meta = (first.data_dir / "logs" / "meta.properties").read_text()
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka_config(first.bootstrap, first.admin))
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    records = [(f"op-{n % 4}", f"value-{n}") for n in range(40)]
    _produce(first.bootstrap, topic, records, first.admin)

    first.stop()
    assert not first.is_running()
    second = start_kafka(first.data_dir)
    started.append(second)

    assert second.bootstrap == first.bootstrap  # same ports again: clients reconnect
    assert (second.data_dir / "logs" / "meta.properties").read_text() == meta  # not reformatted
    received = _consume(
        second.bootstrap, topic, len(records), f"after-restart-{topic}", second.admin
    )
    expected: dict[str, list[str]] = defaultdict(list)
    for key, value in records:
        expected[key].append(value)
    assert _by_key(received) == dict(expected)


def test_broker_that_cannot_bind_its_port_fails_with_its_log_tail() -> None:
    root = service_root("kafka-busy")
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind((LOOPBACK, 0))
        squatter.listen()
        busy = int(squatter.getsockname()[1])
        with pytest.raises(KafkaServiceError, match="failed to start") as failure:
            start_kafka(root / "broker", bootstrap_port=busy, ready_timeout=60)
    assert "server.log (tail)" in str(failure.value)
    assert str(busy) in str(failure.value)
    # start_kafka retries on fresh ports when it chose them itself; this is its trigger.
    assert "Address already in use" in str(failure.value)
    shutil.rmtree(root, ignore_errors=True)
