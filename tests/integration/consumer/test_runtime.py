"""The controller as operators run it: trace context end to end, and `python -m consumer`
stopping cleanly on SIGTERM without losing the batch in hand."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumer import Telemetry
from ledger import Ledger
from tests.integration.consumer.harness import (
    Tool,
    open_ledger,
    outbox,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.db import with_user
from tests.support.kafka import TopicFactory
from tests.support.producers import DEMO_ENV

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def test_trace_context_flows_from_the_tool_through_the_decision_to_the_commands(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory()
    tool = Tool(kafka_bootstrap, topic)
    with TracerProvider().get_tracer("tool").start_as_current_span("tool-call") as tool_span:
        tool.event("email-send", "op-t", "TOOL_TIMEOUT")
    tool.close()
    trace_id = f"{tool_span.get_span_context().trace_id:032x}"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(provider, MeterProvider())
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, f"g-{uuid.uuid4().hex}")
    with running(settings, ledger, telemetry):
        wait_for(lambda: len(ledger.decisions("op-t")) == 1, 60, "the decision")
    decide = [
        s for s in exporter.get_finished_spans() if "recovery.event_id" in (s.attributes or {})
    ]
    assert {s.name for s in decide} == {f"process {topic}"}
    assert [f"{s.context.trace_id:032x}" for s in decide] == [trace_id]
    commands = [r for r in outbox(ledger) if r.topic == "recovery.commands"]
    assert len(commands) == 2
    for command in commands:
        assert command.headers["traceparent"].split("-")[1] == trace_id


def test_sigterm_stops_python_m_consumer_cleanly_after_committing(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory()
    group = f"g-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RECOVERY_DATABASE_URL": with_user(database_url, "recovery_controller"),
        "RECOVERY_TOPIC_EVENTS": topic,
        "RECOVERY_CONTROLLER_GROUP_ID": group,
        "RECOVERY_CONTROLLER_BATCH_MAX_WAIT_MS": "50",
        "RECOVERY_CONTROLLER_POLICY_PATH": str(policy),
        **DEMO_ENV,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "consumer"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        tool = Tool(kafka_bootstrap, topic)
        tool.event("email-send", "op-s", "TOOL_TIMEOUT")
        tool.close()
        wait_for(lambda: len(ledger.decisions("op-s")) == 1, 60, "the decision")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = output.decode("utf-8", "replace")
    assert process.returncode == 0, text
    assert "left group" in text
    assert ledger.offsets(group, topic) == {0: 1}
