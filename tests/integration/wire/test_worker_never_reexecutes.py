"""A capability worker never executes history, through the real broker: killed with
SIGKILL mid-stream and restarted on its store it executes no command twice; a command
past its deadline is refused and reported, never executed; a new group starts at the
end of the topic (or at the time its operator names), not at its beginning."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from machines import Event
from machines.event import Lineage
from producers import (
    ActionResult,
    CapabilityWorker,
    EventPublisher,
    RecoveryClient,
    StartPosition,
    WorkerStats,
)
from schemas import (
    ENV_KAFKA_BOOTSTRAP,
    CapabilityCommand,
    TopicNames,
    WireDecoder,
    record_to_event,
)
from tests.integration.wire.kafka_read import read_messages
from tests.support.commands import controller_signer, send_command, worker_roster
from tests.support.kafka import TopicFactory
from tests.support.producers import signers
from tests.support.worker import fresh_store

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CREATE = "procurement.create-request"


def _command(operation_id: str, n: int, *, deadline: datetime | None = None) -> CapabilityCommand:
    return CapabilityCommand(
        command_id=f"{operation_id}:{n}:0",
        capability=CREATE,
        kind="retry",
        material=True,
        params={},
        origin="transition",
        operation_id=operation_id,
        correlation_id=f"corr-{operation_id}",
        causation_event_id=f"evt-{operation_id}-{n}",
        machine_name="procurement-request",
        machine_version="1.0.0",
        machine_digest="sha256:m",
        sequence=n,
        lineage=Lineage(agent="agent-7", task="task-3", initiating_principal="alice"),
        issued_at=datetime(2026, 11, 30, 3, 0, tzinfo=UTC),
        deadline=deadline,
        idempotency_key=f"req-{operation_id}",
    )


def _publish(bootstrap: str, topics: TopicNames, commands: list[CapabilityCommand]) -> None:
    with EventPublisher(bootstrap, signer=signers(), topics=topics) as publisher:
        for command in commands:
            send_command(publisher, topics.commands, command, controller_signer())


def _results(bootstrap: str, topic: str, wanted: set[str], timeout: float) -> list[Any]:
    """Every result record on `topic` once each of `wanted` (command ids) has one."""
    deadline = time.monotonic() + timeout
    while True:
        messages = read_messages(bootstrap, topic, 10_000, timeout=3)
        causes = {_event(m).causation for m in messages}
        if wanted <= causes or time.monotonic() > deadline:
            return messages


def _event(message: Any) -> Event:
    return record_to_event(WireDecoder().decode(message.value(), None)[1])


def _worker_process(
    bootstrap: str, topics: TopicNames, group: str, store: Path, effects: Path
) -> Any:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.worker_process",
            *("--group", group, "--commands", topics.commands, "--events", topics.events),
            *("--store", str(store), "--effects", str(effects), "--pause", "0.1"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), ENV_KAFKA_BOOTSTRAP: bootstrap},
        stdout=subprocess.DEVNULL,
    )
    return process


def _effects(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split() if path.exists() else []


def _answered_once(
    executed: Counter[str], messages: list[Any], wanted: set[str]
) -> tuple[dict[str, Event], set[str]]:
    """Check that no command ran twice, that a result reported again is the same event
    byte for byte (the controller counts it as a duplicate), that every wanted command
    was answered, and that at most one (the command in a handler when a kill landed) is
    of unknown outcome. Returns the results by command and the unknown commands."""
    twice = {command_id: n for command_id, n in executed.items() if n > 1}
    assert twice == {}, f"executed more than once: {twice}"
    by_id: dict[str, bytes] = {}
    for message in messages:
        event_id = _event(message).event_id
        assert by_id.setdefault(event_id, message.value()) == message.value()
    events = {e.causation: e for e in map(_event, messages)}
    assert set(events) == wanted, f"unanswered: {sorted(wanted - set(events))}"
    unknown = {c for c, e in events.items() if e.evidence_ref == f"outcome-unknown:{c}"}
    assert len(unknown) <= 1
    return events, unknown


def test_a_worker_killed_mid_stream_and_restarted_executes_nothing_twice(
    kafka_bootstrap: str, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    topics = TopicNames(events=topic_factory(), commands=topic_factory(2))
    commands = [_command(f"op-kill-{i}", 2) for i in range(30)]
    _publish(kafka_bootstrap, topics, commands)
    store, effects = tmp_path / "executions.sqlite", tmp_path / "effects.txt"
    group = f"workers-{uuid.uuid4().hex[:8]}"

    first = _worker_process(kafka_bootstrap, topics, group, store, effects)
    deadline = time.monotonic() + 60
    while len(_effects(effects)) < 8 and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    at_kill = len(_effects(effects))
    assert 8 <= at_kill < len(commands), f"the kill did not land mid-stream ({at_kill})"

    second = _worker_process(kafka_bootstrap, topics, group, store, effects)
    try:
        wanted = {c.command_id for c in commands}
        messages = _results(kafka_bootstrap, topics.events, wanted, timeout=90)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)

    executed = Counter(_effects(effects))
    # A result reported again: killed after the flush, before the commit.
    events, unknown = _answered_once(executed, messages, wanted)
    assert all(events[c].event_type == "RETRY_FAILED" for c in unknown)
    succeeded = {c for c, e in events.items() if e.event_type == "RETRY_SUCCEEDED"}
    assert succeeded | unknown == wanted
    assert succeeded <= set(executed)  # a reported success was executed, once


@contextmanager
def _in_process_worker(
    bootstrap: str, topics: TopicNames, calls: list[str], **kw: Any
) -> Iterator[tuple[CapabilityWorker, list[WorkerStats]]]:
    def create(command: CapabilityCommand) -> ActionResult:
        calls.append(command.command_id)
        return ActionResult(succeeded=True)

    stats: list[WorkerStats] = []
    stop = threading.Event()
    with EventPublisher(bootstrap, signer=signers(), topics=topics) as publisher:
        worker = CapabilityWorker(
            bootstrap,
            f"workers-{uuid.uuid4().hex[:8]}",
            RecoveryClient(publisher, producer="capability-worker"),
            {CREATE: create},
            topics=topics,
            poll_timeout=0.2,
            roster=worker_roster(),
            store=fresh_store(),
            **kw,
        )
        thread = threading.Thread(target=lambda: stats.append(worker.run(stop)))
        thread.start()
        try:
            assert worker.assigned.wait(timeout=60), "the worker got no partitions"
            yield worker, stats
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_command_past_its_deadline_is_refused_reported_and_never_executed(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topics = TopicNames(events=topic_factory(), commands=topic_factory())
    now = datetime.now(UTC)
    expired = _command("op-late", 2, deadline=now - timedelta(seconds=1))
    timely = _command("op-timely", 2, deadline=now + timedelta(hours=1))
    calls: list[str] = []
    with _in_process_worker(kafka_bootstrap, topics, calls) as (_worker, stats):
        _publish(kafka_bootstrap, topics, [expired, timely])
        messages = read_messages(kafka_bootstrap, topics.events, 2)
    events = {e.causation: e for e in map(_event, messages)}
    assert calls == [timely.command_id]
    refused = events[expired.command_id]
    assert refused.event_type == "RETRY_FAILED"
    assert refused.evidence_ref == f"deadline-expired:{expired.command_id}"
    assert events[timely.command_id].event_type == "RETRY_SUCCEEDED"
    assert (stats[0].expired, stats[0].executed, stats[0].reported) == (1, 1, 2)


def test_a_new_group_starts_at_the_end_by_default_or_where_its_operator_says(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topics = TopicNames(events=topic_factory(), commands=topic_factory(2))
    history = [_command(f"op-old-{i}", 2) for i in range(4)]
    _publish(kafka_bootstrap, topics, history)
    time.sleep(1.5)  # broker timestamps: history is before `since`, the rest after
    since = datetime.now(UTC)
    time.sleep(0.5)
    recent = _command("op-recent", 2)
    _publish(kafka_bootstrap, topics, [recent])

    calls: list[str] = []
    fresh = _command("op-new", 2)
    with _in_process_worker(kafka_bootstrap, topics, calls):  # no start: `latest`
        _publish(kafka_bootstrap, topics, [fresh])
        [message] = read_messages(kafka_bootstrap, topics.events, 1)
        # Time for a wrongly executed historical command to be reported too.
        assert len(read_messages(kafka_bootstrap, topics.events, 2, timeout=4)) == 1
    assert _event(message).causation == fresh.command_id
    assert calls == [fresh.command_id], "a new group executed history"

    from_time: list[str] = []
    start = StartPosition("timestamp", since)
    with _in_process_worker(kafka_bootstrap, topics, from_time, start=start):
        deadline = time.monotonic() + 30
        while len(from_time) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # time for a command before `since` to be executed too
    assert sorted(from_time) == sorted([recent.command_id, fresh.command_id])
