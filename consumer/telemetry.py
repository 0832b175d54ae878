"""Telemetry providers for the controller: the exporter choice made concrete.

`none` uses OpenTelemetry's no-op providers (trace context still flows: a non-recording
span carries its parent's context into the commands' headers); `console` prints spans
and metrics; `otlp` exports to an OTLP endpoint and needs `opentelemetry-exporter-otlp`,
which is not a dependency of this project: without it the controller refuses to start
with a `TelemetryError` rather than silently exporting nothing.

The providers are the controller's own, not the process-global ones, so that tests can
hand in an SDK provider with an in-memory exporter and so that two controllers in one
process do not share instruments.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

from consumer.errors import TelemetryError
from consumer.settings import Exporter

__all__ = ["Telemetry", "build_telemetry"]

SERVICE_NAME = "recovery-controller"


@dataclass(frozen=True, slots=True)
class Telemetry:
    """The tracer and meter providers one controller uses."""

    tracer_provider: trace.TracerProvider
    meter_provider: metrics.MeterProvider

    def shutdown(self) -> None:
        """Flush and stop exporters (no-op providers have nothing to flush)."""
        for provider in (self.tracer_provider, self.meter_provider):
            stop = getattr(provider, "shutdown", None)
            if callable(stop):
                stop()

    @classmethod
    def disabled(cls) -> Telemetry:
        """No export at all."""
        return cls(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())


def _otlp(endpoint: str | None, resource: Resource, readers: Sequence[MetricReader]) -> Telemetry:
    try:
        spans = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        points = importlib.import_module("opentelemetry.exporter.otlp.proto.http.metric_exporter")
    except ImportError as exc:
        raise TelemetryError(
            "exporter otlp needs the package opentelemetry-exporter-otlp-proto-http, which "
            "is not installed; install it or set RECOVERY_CONTROLLER_EXPORTER to console "
            "or none"
        ) from exc
    kwargs: dict[str, Any] = {} if endpoint is None else {"endpoint": endpoint}
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(spans.OTLPSpanExporter(**kwargs)))
    reader = PeriodicExportingMetricReader(points.OTLPMetricExporter(**kwargs))
    meters = MeterProvider(resource=resource, metric_readers=[reader, *readers])
    return Telemetry(tracer_provider, meters)


def build_telemetry(
    exporter: Exporter,
    *,
    instance: str,
    endpoint: str | None = None,
    readers: Sequence[MetricReader] = (),
) -> Telemetry:
    """Providers for the configured exporter; raises `TelemetryError` when `otlp` is
    chosen but its package is missing. `readers` are added to the meter provider
    whatever the exporter (the Prometheus endpoint's, `consumer.health_server`)."""
    resource = Resource.create({"service.name": SERVICE_NAME, "service.instance.id": instance})
    if exporter == "none":
        if not readers:
            return Telemetry.disabled()
        meters = MeterProvider(resource=resource, metric_readers=list(readers))
        return Telemetry(trace.NoOpTracerProvider(), meters)
    if exporter == "otlp":
        return _otlp(endpoint, resource, readers)
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=60_000)
    meters = MeterProvider(resource=resource, metric_readers=[reader, *readers])
    return Telemetry(tracer_provider, meters)
