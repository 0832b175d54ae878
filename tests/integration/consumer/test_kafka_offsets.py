"""The controller's advisory offset commits, against the real broker: Kafka's admin API
sees the ledger's offsets (so standard tools show lag), and the ledger's offsets win
when Kafka's disagree."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider

from consumer import Telemetry
from ledger import Ledger
from schemas import kafka_config
from tests.integration.consumer.harness import (
    Tool,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _group() -> str:
    return f"controller-{uuid.uuid4().hex[:8]}"


def _kafka_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets as Kafka's own admin API reports them."""
    admin = AdminClient(kafka_config(bootstrap))
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    listed = future.result(timeout=30)
    return {
        p.partition: p.offset for p in listed.topic_partitions if p.topic == topic and p.offset >= 0
    }


def _metric(reader: InMemoryMetricReader, name: str) -> int:
    data = reader.get_metrics_data()
    total = 0
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    total += sum(int(getattr(p, "value", 0)) for p in metric.data.data_points)
    return total


def _set_kafka_offsets(bootstrap: str, group: str, offsets: list[KafkaPartition]) -> None:
    admin = AdminClient(kafka_config(bootstrap))
    request = ConsumerGroupTopicPartitions(group, offsets)
    admin.alter_consumer_group_offsets([request])[group].result(timeout=30)


def test_kafka_sees_the_ledgers_offsets_after_each_commit(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=3)
    group = _group()
    tool = Tool(kafka_bootstrap, topic)
    for n in range(9):
        tool.event("payment-refund", f"op-k{n}", "TOOL_TIMEOUT")
    tool.flush()
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(settings, ledger) as member:
        wait_for(lambda: sum(ledger.offsets(group, topic).values()) == 9, 60, "9 decided")
        stored = ledger.offsets(group, topic)
        wait_for(
            lambda: _kafka_offsets(kafka_bootstrap, group, topic) == stored,
            30,
            f"Kafka's committed offsets of {group} to equal the ledger's {stored}",
        )
        assert member.controller.advisory_commit_failures == 0
    tool.close()
    assert sum(stored.values()) == 9


def test_the_ledgers_offsets_win_over_kafkas_behind_and_ahead(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=2)
    group = _group()
    tool = Tool(kafka_bootstrap, topic)
    for n in range(8):
        tool.event("payment-refund", f"op-w{n}", "TOOL_TIMEOUT")
    tool.flush()
    first = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(first, ledger):
        wait_for(lambda: sum(ledger.offsets(group, topic).values()) == 8, 60, "first run")
        stored = ledger.offsets(group, topic)
        assert set(stored) == {0, 1}, stored  # both partitions hold events
        wait_for(lambda: _kafka_offsets(kafka_bootstrap, group, topic) == stored, 30, "advice")
    # Kafka's advice rewound behind the ledger on partition 0 (an operator's reset, say)
    # and pushed ahead of it on partition 1, where new events now wait.
    for n in range(8, 16):
        tool.event("payment-refund", f"op-w{n}", "TOOL_TIMEOUT")
    tool.flush()
    advice = [KafkaPartition(topic, 0, 0), KafkaPartition(topic, 1, stored[1] + 100)]
    _set_kafka_offsets(kafka_bootstrap, group, advice)
    assert _kafka_offsets(kafka_bootstrap, group, topic) == {0: 0, 1: stored[1] + 100}
    second = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    reader = InMemoryMetricReader()
    telemetry = Telemetry(NoOpTracerProvider(), MeterProvider(metric_readers=[reader]))
    with running(second, ledger, telemetry) as member:
        wait_for(lambda: sum(ledger.offsets(group, topic).values()) == 16, 60, "second run")
        # Every new event decided once (none skipped by the ahead advice), none of the
        # old ones decided again (the behind advice was not followed).
        assert all(len(ledger.decisions(f"op-w{n}")) == 1 for n in range(16))
        # It started at the ledger's offsets: it consumed exactly the 8 new records.
        assert _metric(reader, "recovery.controller.events.processed") == 8
        assert _metric(reader, "recovery.controller.events.duplicated") == 0
        final = ledger.offsets(group, topic)
        wait_for(lambda: _kafka_offsets(kafka_bootstrap, group, topic) == final, 30, "advice")
        assert member.controller.committed_batches >= 1
    tool.close()
