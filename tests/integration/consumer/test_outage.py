"""A database outage mid-stream: the controller backs off, replays from the stored
offsets when the ledger is back, and decides every event exactly once."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider
from psycopg import sql

from consumer import Telemetry
from ledger import PostgresLedger
from tests.integration.consumer.harness import Tool, running, settings_for, wait_for, write_policy
from tests.support.kafka import TopicFactory


def _allow_connections(admin: str, database: str, allowed: bool) -> None:
    """Open or close `database` to new connections; closing also ends the open ones."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                sql.Identifier(database), sql.SQL("true" if allowed else "false")
            )
        )
        if not allowed:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )


def _batches(reader: InMemoryMetricReader, result: str) -> int:
    data = reader.get_metrics_data()
    total = 0
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "recovery.controller.batches":
                    continue
                for point in metric.data.data_points:
                    if (point.attributes or {}).get("result") == result:
                        total += int(getattr(point, "value", 0))
    return total


def test_a_database_outage_is_ridden_out_and_nothing_is_lost_or_decided_twice(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    postgres_server: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    database = urlsplit(database_url).path.lstrip("/")
    topic = topic_factory()
    policy = write_policy(tmp_path, Ed25519PrivateKey.generate())
    group = f"g-{uuid.uuid4().hex}"
    reader = InMemoryMetricReader()
    telemetry = Telemetry(NoOpTracerProvider(), MeterProvider(metric_readers=[reader]))
    # Few, short connection retries inside the ledger so the outage surfaces quickly.
    ledger = PostgresLedger(database_url, retries=1, backoff=0.05, connect_timeout=2)
    tool = Tool(kafka_bootstrap, topic)
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    try:
        with running(settings, ledger, telemetry):
            tool.event("payment-refund", "op-o", "TOOL_TIMEOUT")
            tool.flush()
            wait_for(lambda: len(ledger.decisions("op-o")) == 1, 60, "the first decision")
            _allow_connections(postgres_server, database, allowed=False)
            try:
                tool.event("payment-refund", "op-o", "TOOL_FAILED")
                tool.event("payment-refund", "op-p", "TOOL_TIMEOUT")
                tool.flush()
                wait_for(lambda: _batches(reader, "unavailable") >= 1, 60, "a failed batch")
                time.sleep(0.5)  # a few more backoff rounds while the database is away
            finally:
                _allow_connections(postgres_server, database, allowed=True)
            wait_for(
                lambda: len(ledger.decisions("op-o")) == 2 and len(ledger.decisions("op-p")) == 1,
                60,
                "the replayed batch",
            )
        assert ledger.offsets(group, topic) == {0: 3}
        assert [d["sequence"] for d in ledger.decisions("op-o")] == [1, 2]
    finally:
        tool.close()
        ledger.close()


def test_partitions_assigned_while_the_database_is_down_are_claimed_when_it_returns(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    postgres_server: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    database = urlsplit(database_url).path.lstrip("/")
    topic = topic_factory(partitions=2)
    policy = write_policy(tmp_path, Ed25519PrivateKey.generate())
    group = f"g-{uuid.uuid4().hex}"
    ledger = PostgresLedger(database_url, retries=1, backoff=0.05, connect_timeout=2)
    tool = Tool(kafka_bootstrap, topic)
    for n in range(6):
        tool.event("email-send", f"op-d{n}", "TOOL_TIMEOUT")
    tool.close()
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    try:
        _allow_connections(postgres_server, database, allowed=False)
        try:
            with running(settings, ledger) as member:
                time.sleep(3)  # joined the group, could not claim: nothing owned yet
                assert member.controller.owned == {}
                _allow_connections(postgres_server, database, allowed=True)
                member.wait_owned(2)
                wait_for(
                    lambda: all(len(ledger.decisions(f"op-d{n}")) == 1 for n in range(6)),
                    60,
                    "every event decided",
                )
        finally:
            _allow_connections(postgres_server, database, allowed=True)
        assert sum(ledger.offsets(group, topic).values()) == 6
    finally:
        ledger.close()
