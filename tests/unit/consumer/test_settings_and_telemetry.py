"""Settings from the environment, exporter choice, metrics and trace context helpers."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumer import (
    ADVISORY_COMMIT_INTERVAL_MS,
    BatchTracer,
    ControllerMetrics,
    ControllerSettings,
    Intake,
    SettingsError,
    TelemetrySettings,
    build_telemetry,
    consumer_config,
    decide_batch,
    extract_context,
    trace_headers,
)
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import CONTROLLER, GROUP, T0, encoded, event, pinned, record

ENV = {"RECOVERY_KAFKA_BOOTSTRAP": "k:9092", "RECOVERY_DATABASE_URL": "postgresql://db/x"}


def test_settings_come_from_the_shared_and_controller_variables() -> None:
    env = {
        **ENV,
        "RECOVERY_CONTROLLER_GROUP_ID": "g-7",
        "RECOVERY_CONTROLLER_BATCH_MAX_RECORDS": "50",
        "RECOVERY_TOPIC_EVENTS": "ev.t",
    }
    settings = ControllerSettings.from_env(env)
    assert (settings.bootstrap, settings.group_id, settings.batch_max_records) == (
        "k:9092",
        "g-7",
        50,
    )
    assert settings.topics.events == "ev.t"


def test_invalid_settings_name_the_variable_to_fix() -> None:
    with pytest.raises(SettingsError, match="RECOVERY_CONTROLLER_BATCH_MAX_RECORDS"):
        ControllerSettings.from_env({**ENV, "RECOVERY_CONTROLLER_BATCH_MAX_RECORDS": "0"})
    with pytest.raises(SettingsError, match="RECOVERY_KAFKA_BOOTSTRAP"):
        ControllerSettings.from_env({"RECOVERY_DATABASE_URL": "postgresql://db/x"})


def test_caller_consumer_config_cannot_turn_kafka_offset_storage_back_on() -> None:
    # librdkafka commits only the offsets the controller stored after its ledger commit
    # (`Controller._advise`): it never stores a consumed record's offset by itself, and
    # its periodic commit stays on, at an interval the caller may change.
    settings = ControllerSettings.from_env(
        ENV,
        consumer_config={
            "enable.auto.commit": "false",
            "enable.auto.offset.store": "true",
            "fetch.min.bytes": "10",
        },
    )
    config = consumer_config(settings)
    assert config["enable.auto.commit"] is True
    assert config["enable.auto.offset.store"] is False
    assert config["auto.commit.interval.ms"] == ADVISORY_COMMIT_INTERVAL_MS
    slower = ControllerSettings.from_env(ENV, consumer_config={"auto.commit.interval.ms": "5000"})
    assert consumer_config(slower)["auto.commit.interval.ms"] == "5000"
    assert config["partition.assignment.strategy"] == "cooperative-sticky"
    assert config["fetch.min.bytes"] == "10"


def test_static_membership_and_kip_848_protocol_reach_librdkafka() -> None:
    dynamic = consumer_config(ControllerSettings.from_env(ENV))
    assert "group.instance.id" not in dynamic
    assert "group.protocol" not in dynamic
    static = ControllerSettings.from_env(
        {**ENV, "RECOVERY_CONTROLLER_GROUP_INSTANCE_ID": "controller-a"}
    )
    assert consumer_config(static)["group.instance.id"] == "controller-a"
    assert consumer_config(static)["session.timeout.ms"] == static.session_timeout_ms
    kip848 = consumer_config(
        ControllerSettings.from_env({**ENV, "RECOVERY_CONTROLLER_GROUP_PROTOCOL": "consumer"})
    )
    # The broker holds the session timeout and the assignor; librdkafka refuses both.
    assert kip848["group.protocol"] == "consumer"
    assert "session.timeout.ms" not in kip848
    assert "partition.assignment.strategy" not in kip848


def test_heartbeats_a_third_of_the_session_unless_set() -> None:
    short = {**ENV, "RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS": "1500"}
    assert consumer_config(ControllerSettings.from_env(short))["heartbeat.interval.ms"] == 500
    chosen = {**short, "RECOVERY_CONTROLLER_HEARTBEAT_INTERVAL_MS": "300"}
    assert consumer_config(ControllerSettings.from_env(chosen))["heartbeat.interval.ms"] == 300
    with pytest.raises(SettingsError, match="RECOVERY_CONTROLLER_HEARTBEAT_INTERVAL_MS"):
        ControllerSettings.from_env({**short, "RECOVERY_CONTROLLER_HEARTBEAT_INTERVAL_MS": "1500"})


def test_console_and_none_exporters_build() -> None:
    for exporter in ("console", "none"):
        chosen = TelemetrySettings.load({"RECOVERY_CONTROLLER_EXPORTER": exporter})
        build_telemetry(instance="c-1", settings=chosen).shutdown()


def test_trace_context_is_read_from_headers_and_written_for_commands() -> None:
    provider = TracerProvider()
    with provider.get_tracer("test").start_as_current_span("tool") as span:
        headers = trace_headers(span)
    raw = record(b"x", 0, headers=tuple((k, v.encode()) for k, v in headers.items()))
    context = extract_context(raw)
    assert trace.get_current_span(context).get_span_context().trace_id == (
        span.get_span_context().trace_id
    )


def test_malformed_trace_headers_are_ignored() -> None:
    raw = record(b"x", 0, headers=(("traceparent", b"\xff\xfe"), ("tracestate", b"bad")))
    assert not trace.get_current_span(extract_context(raw)).get_span_context().is_valid


def test_each_decision_gets_a_span_parented_by_the_producer_with_states() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("tool").start_as_current_span("tool-publish") as tool_span:
        carrier = trace_headers(tool_span)
    raw = encoded(event("TOOL_TIMEOUT"), 0)
    raw = record(
        raw.value, 0, headers=(*raw.headers, *((k, v.encode()) for k, v in carrier.items()))
    )
    machines, rules = pinned()
    outcomes = [Intake(machines, roster=producer_roster(), max_record_bytes=65536).examine(raw)]
    reader = InMemoryMetricReader()
    metrics = ControllerMetrics(MeterProvider(metric_readers=[reader]), GROUP)
    tracer = BatchTracer(provider, group=GROUP, client=CONTROLLER)
    with tracer.batch(1, [("recovery.events", 0)]) as batch_span:
        planned = decide_batch(
            outcomes,
            {},
            rules,
            group=GROUP,
            controller=CONTROLLER,
            positions=(),
            now=T0,
            observe=tracer.observer(batch_span, metrics.decision_latency),
        )
    finished = exporter.get_finished_spans()
    (batch,) = [s for s in finished if "messaging.batch.message_count" in (s.attributes or {})]
    (decide,) = [s for s in finished if "recovery.event_id" in (s.attributes or {})]
    assert decide.name == f"process {raw.topic}"
    assert batch.name == "process recovery.events"
    assert decide.kind == batch.kind == trace.SpanKind.CONSUMER
    assert decide.context.trace_id == tool_span.get_span_context().trace_id
    assert decide.attributes is not None
    assert decide.attributes["recovery.state_before"] == "failure-reported"
    assert decide.attributes["recovery.state_after"] == "unresolved"
    assert decide.attributes["recovery.operation_id"] == "op-1"
    # OpenTelemetry's messaging conventions for Kafka, on the decision's span.
    assert {k: decide.attributes[k] for k in _SEMCONV} == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": raw.topic,
        "messaging.destination.partition.id": str(raw.partition),
        "messaging.kafka.offset": raw.offset,
        "messaging.kafka.message.key": "op-1",
        "messaging.consumer.group.name": GROUP,
        "messaging.client.id": CONTROLLER,
    }
    assert batch.attributes is not None
    assert batch.attributes["messaging.batch.message_count"] == 1
    assert batch.attributes["messaging.consumer.group.name"] == GROUP
    assert decide.links[0].context.span_id == batch.context.span_id
    # The commands the decision emits carry the decision span's context.
    trace_of_entry = planned.batch.entries[0].trace
    assert f"{decide.context.span_id:016x}" in trace_of_entry["traceparent"]


_SEMCONV = (
    "messaging.system",
    "messaging.operation.type",
    "messaging.destination.name",
    "messaging.destination.partition.id",
    "messaging.kafka.offset",
    "messaging.kafka.message.key",
    "messaging.consumer.group.name",
    "messaging.client.id",
)


def test_committed_batches_are_counted_by_outcome_and_reason() -> None:
    machines, rules = pinned()
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    outcomes = [intake.examine(r) for r in (encoded(event("TOOL_TIMEOUT"), 0), record(b"j", 1))]
    planned = decide_batch(
        outcomes, {}, rules, group=GROUP, controller=CONTROLLER, positions=(), now=T0
    )
    reader = InMemoryMetricReader()
    metrics = ControllerMetrics(MeterProvider(metric_readers=[reader]), GROUP)
    metrics.committed(planned, 0.01)
    metrics.set_lag({("recovery.events", 0): 5})
    data = reader.get_metrics_data()
    assert data is not None
    values = {
        m.name: [(dict(p.attributes or {}), getattr(p, "value", None)) for p in m.data.data_points]
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
    }
    assert values["recovery.controller.events.processed"][0][1] == 1
    dead = values["recovery.controller.events.dead_lettered"]
    assert [(a["reason"], v) for a, v in dead] == [("avro-not-single-object", 1)]
    assert values["recovery.controller.consumer.lag"][0][1] == 5


def _noop_span_headers(raw_headers: tuple[tuple[str, bytes | None], ...]) -> dict[str, str]:
    """What a decision span of the no-op tracer would hand the commands: the reference
    the untraced observer must match."""
    raw = record(b"x", 0, headers=raw_headers)
    tracer = trace.NoOpTracerProvider().get_tracer("reference")
    with tracer.start_as_current_span("recovery.decide", context=extract_context(raw)) as span:
        return trace_headers(span)


@pytest.mark.parametrize(
    "trace_context",
    [
        {},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        {
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
            "tracestate": "vendor=abc,other=1",
        },
        {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
        {"traceparent": "garbage", "tracestate": "vendor=abc"},
        {"tracestate": "vendor=abc"},
    ],
    ids=["none", "sampled", "with-state", "invalid-trace-id", "malformed", "state-only"],
)
def test_without_an_exporter_commands_carry_what_a_no_op_decision_span_would_give(
    trace_context: dict[str, str],
) -> None:
    raw = encoded(event("TOOL_TIMEOUT"), 0)
    headers = (*raw.headers, *((k, v.encode()) for k, v in trace_context.items()))
    raw = record(raw.value, 0, headers=headers)
    machines, rules = pinned()
    outcomes = [Intake(machines, roster=producer_roster(), max_record_bytes=65536).examine(raw)]
    latencies: list[float] = []
    tracer = BatchTracer(trace.NoOpTracerProvider())
    with tracer.batch(1, [("recovery.events", 0)]) as batch_span:
        planned = decide_batch(
            outcomes,
            {},
            rules,
            group=GROUP,
            controller=CONTROLLER,
            positions=(),
            now=T0,
            observe=tracer.observer(batch_span, latencies.append),
        )
    assert planned.batch.entries[0].trace == _noop_span_headers(headers)
    assert len(latencies) == 1
    assert latencies[0] >= 0
    if trace_context.get("traceparent", "").startswith("00-0af7"):
        assert planned.batch.entries[0].trace["traceparent"] == trace_context["traceparent"]
