"""The example capability worker against the real broker: it consumes a command once,
ignores its redelivery, and reports the result as an event caused by the command."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
from opentelemetry.sdk.trace import TracerProvider

from machines.event import Lineage
from producers import (
    CapabilityWorker,
    EventPublisher,
    ProducersError,
    RecoveryClient,
    WorkerStats,
    demo_handlers,
    verify_outcome,
)
from schemas import (
    CapabilityCommand,
    TopicNames,
    WireDecoder,
    kafka_config,
    record_to_event,
)
from tests.integration.wire.kafka_read import headers_of, read_messages
from tests.support.commands import controller_signer, send_command, worker_roster
from tests.support.kafka import TopicFactory
from tests.support.producers import signers
from tests.support.worker import fresh_store

pytestmark = pytest.mark.integration


def _command(command_id: str, capability: str, kind: str, **params: object) -> CapabilityCommand:
    return CapabilityCommand(
        command_id=command_id,
        capability=capability,
        kind=kind,
        material=False,
        params=params,
        origin="transition",
        operation_id="op-refund-1",
        correlation_id="corr-1",
        causation_event_id="evt-1",
        machine_name="payment-refund",
        machine_version="1.0.0",
        machine_digest="sha256:m",
        sequence=1,
        lineage=Lineage(agent="agent-7", task="task-3", initiating_principal="alice"),
        issued_at=datetime(2026, 11, 30, 3, 0, tzinfo=UTC),
    )


def _send(publisher: EventPublisher, topic: str, command: CapabilityCommand) -> None:
    send_command(publisher, topic, command, controller_signer())


def test_the_worker_executes_a_command_once_and_reports_its_result_as_an_event(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topics = TopicNames(events=topic_factory(), commands=topic_factory(2))
    verify = _command("op-refund-1/1/0", "payment.verify-refund", "verify", demo_outcome="found")
    escalate = _command("op-refund-1/1/1", "human.escalate", "escalate", queue="review")
    foreign = _command("op-refund-1/1/2", "someone.elses-capability", "other")
    tracer = TracerProvider().get_tracer("test")
    with (
        EventPublisher(kafka_bootstrap, signer=signers(), topics=topics) as publisher,
        tracer.start_as_current_span("controller decision") as span,
    ):
        trace_id = format(span.get_span_context().trace_id, "032x")
        for command in (verify, verify, escalate, foreign):  # verify is redelivered
            _send(publisher, topics.commands, command)

    stop = threading.Event()
    stats: list[WorkerStats] = []
    with EventPublisher(kafka_bootstrap, signer=signers(), topics=topics) as publisher:
        worker = CapabilityWorker(
            kafka_bootstrap,
            "workers-payments",
            RecoveryClient(publisher, producer="worker-payments"),
            demo_handlers(),
            poll_timeout=0.2,
            roster=worker_roster(),
            store=fresh_store(),
            start="earliest",
        )
        thread = threading.Thread(target=lambda: stats.append(worker.run(stop)))
        thread.start()
        try:
            results = read_messages(kafka_bootstrap, topics.events, 1)
            # Give a wrongly repeated report time to show up before stopping.
            extra = read_messages(kafka_bootstrap, topics.events, 2, timeout=3)
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()

    assert len(results) == 1
    assert len(extra) == 1
    event = record_to_event(WireDecoder().decode(results[0].value(), None)[1])
    assert event.event_type == "VERIFICATION_FOUND"
    assert event.causation == verify.command_id
    assert event.event_id == f"result:{verify.command_id}"
    assert event.operation_id == verify.operation_id
    assert event.evidence is not None
    assert event.evidence.outcome == "applied"
    assert event.producer == "worker-payments"
    # The result continues the trace of the decision that emitted the command.
    assert headers_of(results[0])["traceparent"].split("-")[1] == trace_id
    [run] = stats
    assert (run.consumed, run.executed, run.duplicates, run.skipped, run.reported) == (
        4,
        2,
        1,
        1,
        1,
    )


def test_the_demo_verifier_is_deterministic_per_operation() -> None:
    first = _command("c1", "deploy.verify-steps", "verify")
    again = _command("c2", "deploy.verify-steps", "verify")
    assert verify_outcome(first) == verify_outcome(again)
    assert verify_outcome(_command("c3", "x", "verify", demo_outcome="not_found")) == "not_found"


def test_a_handler_that_raises_is_reported_as_a_failed_action(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topics = TopicNames(events=topic_factory(), commands=topic_factory())
    stop_task = _command("op-refund-1/2/0", "agent.stop-task", "stop", scope="task")
    with EventPublisher(kafka_bootstrap, signer=signers(), topics=topics) as publisher:
        _send(publisher, topics.commands, stop_task)

    def broken(_command: CapabilityCommand) -> None:
        raise RuntimeError("agent supervisor unreachable")

    stop = threading.Event()
    with EventPublisher(kafka_bootstrap, signer=signers(), topics=topics) as publisher:
        worker = CapabilityWorker(
            kafka_bootstrap,
            "workers-containment",
            RecoveryClient(publisher, producer="worker-containment"),
            {"agent.stop-task": broken},
            poll_timeout=0.2,
            roster=worker_roster(),
            store=fresh_store(),
            start="earliest",
        )
        thread = threading.Thread(target=worker.run, args=(stop,))
        thread.start()
        try:
            [message] = read_messages(kafka_bootstrap, topics.events, 1)
        finally:
            stop.set()
            thread.join(timeout=30)

    event = record_to_event(WireDecoder().decode(message.value(), None)[1])
    assert event.event_type == "CONTAINMENT_FAILED"
    assert event.causation == stop_task.command_id
    assert event.evidence_ref == "error:RuntimeError"


def test_a_result_that_cannot_be_queued_stops_the_run_uncommitted_and_is_not_lost(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topics = TopicNames(events=topic_factory(), commands=topic_factory())
    commands = [
        _command(f"op-refund-1/{n}/0", "payment.verify-refund", "verify", demo_outcome="found")
        for n in (1, 2)
    ]
    with EventPublisher(kafka_bootstrap, signer=signers(), topics=topics) as publisher:
        for command in commands:
            _send(publisher, topics.commands, command)
    group = f"workers-{uuid.uuid4().hex[:8]}"

    # The worker's producer holds one record and lingers 6 s before sending it: the
    # first result is queued, the second cannot be while the client retries (5 s),
    # though the first is delivered in the end (a slow broker, not a dead one).
    stuck = EventPublisher(
        kafka_bootstrap,
        signer=signers(),
        topics=topics,
        producer_config={"queue.buffering.max.messages": 1, "linger.ms": 6000},
    )
    failures: list[BaseException] = []
    worker = CapabilityWorker(
        kafka_bootstrap,
        group,
        RecoveryClient(stuck, producer="worker-payments"),
        demo_handlers(),
        roster=worker_roster(),
        store=fresh_store(),
        start="earliest",
        poll_timeout=0.2,
    )

    halt = threading.Event()

    def run() -> None:
        try:
            worker.run(halt)
        except ProducersError as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    kept_running = thread.is_alive()
    halt.set()  # so that a failing run still ends
    thread.join(timeout=30)
    assert not kept_running, "the worker kept running past a result it could not queue"
    stuck.close(timeout=30)  # the first result is delivered
    [failure] = failures
    assert "producer queue stayed full" in str(failure)
    admin = AdminClient(kafka_config(kafka_bootstrap))
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
    committed = [p.offset for p in listed.result(timeout=30).topic_partitions if p.offset >= 0]
    assert committed == [], f"offsets committed past an unreported result: {committed}"

    # The next worker of the group gets both commands again and reports both.
    stop = threading.Event()
    stats: list[WorkerStats] = []
    with EventPublisher(kafka_bootstrap, signer=signers(), topics=topics) as publisher:
        again = CapabilityWorker(
            kafka_bootstrap,
            group,
            RecoveryClient(publisher, producer="worker-payments"),
            demo_handlers(),
            roster=worker_roster(),
            store=fresh_store(),
            start="earliest",
            poll_timeout=0.2,
        )
        thread = threading.Thread(target=lambda: stats.append(again.run(stop)))
        thread.start()
        try:
            # The first worker's one delivered result, then this worker's two.
            results = read_messages(kafka_bootstrap, topics.events, 3)
        finally:
            stop.set()
            thread.join(timeout=30)
    causes = [record_to_event(WireDecoder().decode(m.value(), None)[1]).causation for m in results]
    first, second = (c.command_id for c in commands)
    assert sorted(str(c) for c in causes) == [first, first, second]
    assert stats[0].reported == 2
