"""Nothing waits forever, on the real broker and PostgreSQL (issue #29): with no event
from outside, an operation's timers fire through the outbox and the events topic and
are decided in order; a timer whose state was left meanwhile is recorded as stale; a
paced retry goes out when its timer fires; the gauges show what waits."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider

from consumer import ControllerSettings, Telemetry
from ledger import Ledger
from machines import DeclaredFacts, EvidencePayload
from producers.relay import OutboxRelay
from schemas import TopicNames
from tests.integration.consumer.harness import (
    VERIFIER,
    Tool,
    open_ledger,
    outbox,
    running,
    settings_for,
    wait_for,
)
from tests.support.kafka import TopicFactory
from tests.support.producers import roster_document

pytestmark = pytest.mark.integration

MACHINE = "procurement-request"
FOUND = EvidencePayload(outcome="applied", verifier=VERIFIER, reference="status-api:1")
NOT_FOUND = EvidencePayload(outcome="not_applied", verifier=VERIFIER, reference="status-api:2")
KEYED = DeclaredFacts(idempotency_key="req-9", status_api=True)


def _policy(folder: Path, **extra: Any) -> Path:
    """A policy whose verifying times out after 2 s and whose other states stall after
    3 s: the whole walk fits in a test."""
    policy = {
        "id": "timer-tests",
        "trusted_verifiers": [VERIFIER],
        "producers": roster_document(),
        "timeouts": {
            "stalled_after": "3s",
            "states": {
                MACHINE: {"verifying": {"after": "2s", "event": "VERIFICATION_UNAVAILABLE"}}
            },
        },
        **extra,
    }
    path = folder / "policy.yaml"
    path.write_text(json.dumps(policy), encoding="utf-8")
    return path


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _topics(topic_factory: TopicFactory, partitions: int) -> TopicNames:
    """Topics of the test's own for every stream: the relay publishes commands and audit
    records of the operation before its timers' events, in order."""
    streams = ("events", "commands", "evidence", "audit", "dlq")
    return TopicNames(**{s: topic_factory(partitions=partitions) for s in streams})


def _settings(
    bootstrap: str, database_url: str, topics: TopicNames, policy: Path, **extra: Any
) -> ControllerSettings:
    group = f"timers-{uuid.uuid4().hex[:8]}"
    settings = settings_for(bootstrap, database_url, topics.events, policy, group, **extra)
    return settings.model_copy(update={"topics": topics})


@contextmanager
def _relay(bootstrap: str, database_url: str, ledger: Ledger, topics: TopicNames) -> Iterator[None]:
    """The outbox relay in a thread: it publishes the timers' events back to the events
    topic, behind each operation's earlier rows."""
    stop = threading.Event()
    relay = OutboxRelay(ledger, bootstrap, database_url=database_url, topics=topics)
    thread = threading.Thread(target=lambda: relay.run(stop), name="relay", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def _events(ledger: Ledger, op: str) -> list[tuple[str, str, str]]:
    """(event type, outcome, state after) of each of `op`'s decisions."""
    return [(d["event"]["type"], d["outcome"], d["state_after"]) for d in ledger.decisions(op)]


def test_an_unanswered_verification_escalates_by_its_timeout_then_stalls_once(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, ledger: Ledger,
    tmp_path: Path,
) -> None:  # fmt: skip
    topics = _topics(topic_factory, 2)
    tool = Tool(kafka_bootstrap, topics.events)
    tool.event(MACHINE, "op-quiet", "TOOL_TIMEOUT", facts=KEYED)
    tool.close()
    reader = InMemoryMetricReader()
    telemetry = Telemetry(NoOpTracerProvider(), MeterProvider(metric_readers=[reader]))
    settings = _settings(
        kafka_bootstrap, database_url, topics, _policy(tmp_path),
        timer_poll_ms=100, timer_gauges_s=0.2,
    )  # fmt: skip
    with (
        _relay(kafka_bootstrap, database_url, ledger, topics),
        running(settings, ledger, telemetry),
    ):
        wait_for(lambda: len(ledger.decisions("op-quiet")) >= 3, 60, "the timeout and the stall")
        # The stall bound of `escalated` escalated once: nothing more while it waits on.
        time.sleep(4)
    decisions = ledger.decisions("op-quiet")
    assert _events(ledger, "op-quiet") == [
        ("TOOL_TIMEOUT", "transitioned", "verifying"),
        ("VERIFICATION_UNAVAILABLE", "transitioned", "escalated"),
        ("STATE_STALLED", "fired", "escalated"),
    ]
    timer, stalled = decisions[1], decisions[2]
    assert timer["event"]["id"] == "timer:op-quiet:1:state"
    assert timer["event"]["producer"] == settings.producer_id
    assert [i["capability"] for i in timer["invocations"]] == ["human.escalate"]
    assert [n["code"] for n in stalled["refusals"]] == ["stalled"]
    assert stalled["invocations"][0]["params"]["reason"] == "stalled"
    assert ledger.verify_audit() == ()
    metrics = _metrics(reader)
    assert metrics["recovery.controller.timers.fired"] == 2
    assert metrics["recovery.controller.timers.armed"] == 3  # the timeout, deadline, stall
    assert metrics["recovery.controller.operations.stalled"] == 1


def test_a_timer_whose_state_was_left_meanwhile_is_recorded_stale(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, ledger: Ledger,
    tmp_path: Path,
) -> None:  # fmt: skip
    topics = _topics(topic_factory, 1)
    tool = Tool(kafka_bootstrap, topics.events)
    tool.event(MACHINE, "op-race", "TOOL_TIMEOUT", facts=KEYED)
    settings = _settings(
        kafka_bootstrap, database_url, topics, _policy(tmp_path), timer_poll_ms=100
    )
    with running(settings, ledger):
        # No relay yet: the timeout fires into the outbox and waits there.
        wait_for(
            lambda: any(r.topic == topics.events and r.key == "op-race" for r in outbox(ledger)),
            30,
            "the verifying timeout fired into the outbox",
        )
        # Meanwhile the verifier answers and the operation completes.
        tool.event(MACHINE, "op-race", "VERIFICATION_FOUND", evidence=FOUND)
        tool.close()
        wait_for(lambda: ledger.operation("op-race").state == "completed", 30, "completion")
        with _relay(kafka_bootstrap, database_url, ledger, topics):
            wait_for(lambda: len(ledger.decisions("op-race")) == 3, 30, "the timer's event")
    assert _events(ledger, "op-race") == [
        ("TOOL_TIMEOUT", "transitioned", "verifying"),
        ("VERIFICATION_FOUND", "transitioned", "completed"),
        ("VERIFICATION_UNAVAILABLE", "stale", "completed"),
    ]
    stale = ledger.decisions("op-race")[2]
    assert stale["invocations"] == []
    assert [n["code"] for n in stale["refusals"]] == ["timer-stale"]
    assert ledger.load_views(["op-race"])["op-race"].timers == ()


def test_a_paced_retry_is_commanded_when_its_timer_fires(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, ledger: Ledger,
    tmp_path: Path,
) -> None:  # fmt: skip
    topics = _topics(topic_factory, 1)
    tool = Tool(kafka_bootstrap, topics.events)
    tool.event(MACHINE, "op-paced", "TOOL_TIMEOUT", facts=KEYED)
    tool.event(MACHINE, "op-paced", "VERIFICATION_NOT_FOUND", evidence=NOT_FOUND)
    tool.close()
    policy = _policy(tmp_path, retry_pacing={"base": "1s", "cap": "2s"})
    settings = _settings(kafka_bootstrap, database_url, topics, policy, timer_poll_ms=100)
    with _relay(kafka_bootstrap, database_url, ledger, topics), running(settings, ledger):
        wait_for(lambda: len(ledger.decisions("op-paced")) == 3, 60, "the retry's timer")
    verified, due = ledger.decisions("op-paced")[1:]
    assert (verified["state_after"], verified["invocations"]) == ("retrying", [])
    [armed] = [t for t in verified["timers"]["armed"] if t["kind"] == "retry"]
    assert (due["event"]["type"], due["outcome"]) == ("RETRY_DUE", "fired")
    assert [i["capability"] for i in due["invocations"]] == ["procurement.create-request"]
    assert due["invocations"][0]["params"]["idempotency_key"] == KEYED.idempotency_key
    # Commanded no earlier than its due time, by the controller's clock.
    assert due["decided_at"] >= armed["due_at"]


def test_the_gauges_count_what_waits_and_what_is_overdue(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, ledger: Ledger,
    tmp_path: Path,
) -> None:  # fmt: skip
    topics = _topics(topic_factory, 1)
    tool = Tool(kafka_bootstrap, topics.events)
    for op in ("op-w1", "op-w2"):
        # A key of its own each: one key on two operations is a duplicate (issue 30).
        facts = DeclaredFacts(idempotency_key=f"req-{op}", status_api=True)
        tool.event(MACHINE, op, "TOOL_TIMEOUT", facts=facts)
    tool.close()
    reader = InMemoryMetricReader()
    telemetry = Telemetry(NoOpTracerProvider(), MeterProvider(metric_readers=[reader]))
    settings = _settings(
        kafka_bootstrap, database_url, topics, _policy(tmp_path),
        timer_poll_ms=100, timer_gauges_s=0.2, timer_overdue_after_s=0.5,
    )  # fmt: skip
    # No relay: the timeouts fire into the outbox and are never decided, so they turn
    # overdue; the operations wait in `verifying`.
    with running(settings, ledger, telemetry):
        wait_for(lambda: len(ledger.decisions("op-w2")) == 1, 30, "both opened")
        wait_for(
            lambda: _metrics(reader).get("recovery.controller.timers.overdue", 0) >= 2,
            30,
            "two overdue timers",
        )
        points = _points(reader, "recovery.controller.operations.waiting")
        oldest = _points(reader, "recovery.controller.operations.oldest_wait")
    assert points == {(MACHINE, "verifying"): 2}
    assert oldest[(MACHINE, "verifying")] >= 2
    assert _metrics(reader)["recovery.controller.timers.pending"] == 4


def _points(reader: InMemoryMetricReader, name: str) -> dict[tuple[str, str], float]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        (str(p.attributes["machine"]), str(p.attributes["state"])): p.value  # type: ignore[index]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for p in metric.data.data_points  # type: ignore[attr-defined]
    }


def _metrics(reader: InMemoryMetricReader) -> dict[str, float]:
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, float] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points = metric.data.data_points
                found[metric.name] = sum(getattr(p, "value", 0) for p in points)
    return found
