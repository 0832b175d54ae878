"""The relay publishes nothing while a topic would refuse its largest row, says why on
/readyz (`limits_problem`), and starts publishing, without a restart, once the topic
admits it (schemas.limits: `MIN_TOPIC_MESSAGE_BYTES`). A broker that cannot be asked
is an outage like any other, retried with backoff: the relay never exits on it."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from ledger import PostgresLedger
from producers.relay import OutboxRelay, RelaySettings
from schemas import MIN_TOPIC_MESSAGE_BYTES, TopicNames, kafka_config
from tests.integration.relay.outbox import command_row, insert_rows, published_ids
from tests.support.kafka import TopicFactory

pytestmark = pytest.mark.integration


def _wait(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def test_a_topic_too_small_holds_publishing_until_it_is_raised(
    kafka_bootstrap: str, database_url: str, ledger: PostgresLedger, topic_factory: TopicFactory
) -> None:
    small = topic_factory(1, config={"max.message.bytes": "100000"})
    topics = TopicNames(
        events=topic_factory(1),
        commands=small,
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    insert_rows(database_url, [command_row(topics, "op-1", 1)])
    settings = RelaySettings.load(backoff_initial=0.1, backoff_max=0.5, idle_poll=0.1)
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=topics, settings=settings)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    try:
        _wait(lambda: relay.limits_problem != "not checked yet", 30, "the limits check")
        problem = relay.limits_problem or ""
        assert small in problem
        assert "max.message.bytes" in problem
        time.sleep(1.0)
        assert published_ids(database_url)[0] == set()  # nothing went out meanwhile
        admin = AdminClient(kafka_config(kafka_bootstrap))
        entry = ConfigEntry(
            "max.message.bytes",
            str(MIN_TOPIC_MESSAGE_BYTES),
            incremental_operation=AlterConfigOpType.SET,
        )
        resource = ConfigResource("topic", small, incremental_configs=[entry])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
        _wait(lambda: relay.limits_problem is None, 30, "the raised limit to be seen")
        _wait(lambda: len(published_ids(database_url)[0]) == 1, 30, "the row published")
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(timeout=30)
