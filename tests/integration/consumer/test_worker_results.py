"""A capability worker that reports the same command's result twice (it crashed after
the result was acknowledged and before it committed its offsets, so the command was
redelivered to a worker that had not seen it) produces the same event twice: the
controller decides it once and counts the second as a duplicate, with no
`event-id-conflict` dead letter. Real broker, real PostgreSQL, the real relay."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider

from consumer import Telemetry
from ledger import Ledger
from machines import EvidencePayload
from producers import (
    ActionResult,
    CapabilityWorker,
    EventPublisher,
    OutboxRelay,
    RecoveryClient,
    WorkerStats,
)
from schemas import CapabilityCommand, TopicNames
from tests.integration.consumer.harness import (
    VERIFIER,
    Tool,
    open_ledger,
    outbox,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.integration.consumer.test_kafka_offsets import _metric
from tests.integration.wire.kafka_read import headers_of, read_messages
from tests.support.commands import worker_roster
from tests.support.kafka import TopicFactory
from tests.support.producers import signers
from tests.support.worker import fresh_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _verify(command: CapabilityCommand) -> ActionResult:
    # What a handler with a store answers: the same evidence for the same command.
    return ActionResult(
        succeeded=True,
        evidence=EvidencePayload(
            outcome="applied", verifier=VERIFIER, reference=f"refund-api:{command.command_id}"
        ),
    )


def _work_until(
    bootstrap: str, topics: TopicNames, group: str, done: Callable[[], bool], what: str
) -> WorkerStats:
    """One worker process's life: consume the commands topic from the start in `group`,
    execute and report what it finds until `done()`, then stop."""
    stop = threading.Event()
    stats: list[WorkerStats] = []
    with EventPublisher(bootstrap, signer=signers(), topics=topics) as publisher:
        worker = CapabilityWorker(
            bootstrap,
            group,
            RecoveryClient(publisher, producer=VERIFIER),
            {"payment.verify-refund": _verify},
            roster=worker_roster(),
            store=fresh_store(),
            start="earliest",
            poll_timeout=0.2,
        )
        thread = threading.Thread(target=lambda: stats.append(worker.run(stop)))
        thread.start()
        try:
            wait_for(done, 60, what)
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()
    (run,) = stats
    return run


def test_a_re_reported_result_is_a_duplicate_not_a_conflict(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topics = TopicNames(
        events=topic_factory(1),
        commands=topic_factory(1),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    tool = Tool(kafka_bootstrap, topics.events)
    tool.event("payment-refund", "op-dup", "TOOL_TIMEOUT")
    tool.close()
    settings = settings_for(
        kafka_bootstrap, database_url, topics.events, policy, "worker-results"
    ).model_copy(update={"topics": topics})
    reader = InMemoryMetricReader()
    telemetry = Telemetry(NoOpTracerProvider(), MeterProvider(metric_readers=[reader]))
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=topics)
    with running(settings, ledger, telemetry):
        wait_for(lambda: len(ledger.decisions("op-dup")) == 1, 60, "the timeout decided")
        for _ in range(100):  # the verify command onto the commands topic
            if relay.relay_once().leased == 0:
                break
        # The first worker reports and "crashes" before committing: the command is
        # delivered again, to a worker that has not seen it (a fresh group here).
        first = _work_until(
            kafka_bootstrap,
            topics,
            "workers-payments-1",
            lambda: len(ledger.decisions("op-dup")) == 2,
            "the first report to be decided",
        )
        again = _work_until(
            kafka_bootstrap,
            topics,
            "workers-payments-2",
            lambda: _metric(reader, "recovery.controller.events.duplicated") == 1,
            "the second report to be counted as a duplicate",
        )
    assert (first.executed, first.reported) == (1, 1)
    assert (again.executed, again.reported) == (1, 1)
    decisions = ledger.decisions("op-dup")
    assert [d["event"]["type"] for d in decisions] == ["TOOL_TIMEOUT", "VERIFICATION_FOUND"]
    assert ledger.operation("op-dup").state == "completed"
    letters = [r for r in outbox(ledger) if r.topic == "recovery.dlq"]
    assert [r.payload["reason_code"] for r in letters] == []
    assert _metric(reader, "recovery.controller.events.dead_lettered") == 0
    # On the wire: the tool's event, then the same result record twice, byte for byte.
    _timeout, *results = read_messages(kafka_bootstrap, topics.events, 3)
    assert [headers_of(m)["recovery-record-id"] for m in results] == [
        headers_of(results[0])["recovery-record-id"]
    ] * 2
    assert results[0].value() == results[1].value()
