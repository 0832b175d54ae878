"""A failed advisory offset commit to Kafka is counted on /metrics as
`recovery_controller_advisory_commit_failures_total`, by the Kafka error's name, and
never raised: the ledger's offsets are authoritative (docs/operations.md)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError
from confluent_kafka import TopicPartition as KafkaPartition
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.trace import NoOpTracerProvider

from consumer import Controller, ControllerSettings, HealthServer, Telemetry
from ledger import MemoryLedger
from tests.unit.consumer.support import GROUP, pinned

SERIES = "recovery_controller_advisory_commit_failures_total"


@pytest.fixture
def scraped() -> Iterator[tuple[Controller, HealthServer]]:
    health = HealthServer("127.0.0.1:0").start()
    provider = MeterProvider(metric_readers=[health.metric_reader()])
    machines, rules = pinned()
    settings = ControllerSettings(bootstrap="unused:9092", database_url="unused", group_id=GROUP)
    controller = Controller(
        settings,
        MemoryLedger(),
        machines=machines,
        rules=rules,
        telemetry=Telemetry(NoOpTracerProvider(), provider),
    )
    try:
        yield controller, health
    finally:
        provider.shutdown()
        health.close()


def _series(health: HealthServer) -> dict[str, float]:
    url = f"http://127.0.0.1:{health.port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(SERIES + "{"):
            labels, value = line.rsplit(" ", 1)
            assert f'consumer_group="{GROUP}"' in labels, line
            reason = labels.split('reason="', 1)[1].split('"', 1)[0]
            found[reason] = float(value)
    return found


def test_the_commit_callback_counts_each_failure_by_its_error_name(
    scraped: tuple[Controller, HealthServer],
) -> None:
    controller, health = scraped
    # librdkafka's on_commit: first a success, and a periodic commit that found nothing
    # newly stored (an idle controller, every interval), then two refusals and a
    # transport error.
    controller._advised(None, [KafkaPartition("recovery.events", 0, 5)])
    controller._advised(KafkaError(KafkaError._NO_OFFSET), [])
    assert _series(health) == {}
    assert controller.advisory_commit_failures == 0
    controller._advised(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [])
    controller._advised(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [])
    controller._advised(KafkaError(KafkaError._TRANSPORT), [])
    assert _series(health) == {"REBALANCE_IN_PROGRESS": 2.0, "_TRANSPORT": 1.0}
    assert controller.advisory_commit_failures == 3
