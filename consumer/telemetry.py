"""Telemetry providers for one runtime component, configured by OpenTelemetry's own
variables.

What the SDK and the OTLP/HTTP exporter read themselves is left to them:
`OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL: the exporters append `/v1/traces` and
`/v1/metrics`), `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` and `..._METRICS_ENDPOINT` (used
as they are), headers, timeouts, compression, `OTEL_TRACES_SAMPLER`,
`OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (the
SDK's resource detector) and `OTEL_SDK_DISABLED`. Chosen here, per signal:

- `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: `otlp`, `console` or `none`
  (comma-separated for several). When unset, `otlp` if an OTLP endpoint variable is set,
  else `none`. The OpenTelemetry default is `otlp` regardless; here a component that
  was told nothing about telemetry does not send to localhost:4318 and keeps the no-op
  path, on which no decision span is made at all (`consumer.tracing`).
- The service name defaults per component (`recovery-controller`, `recovery-relay`);
  `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` override it and the instance id.

The variables are declared in `consumer.settings.TelemetrySettings`.
`RECOVERY_CONTROLLER_EXPORTER` and `RECOVERY_CONTROLLER_OTLP_ENDPOINT` are deprecated
aliases, applied (with a warning) only where no `OTEL_*` variable decides: the exporter
for both signals, and an OTLP base URL to which the per-signal paths are appended.

The providers are the component's own, not the process-global ones, so that tests can
hand in an SDK provider with an in-memory exporter and so that two components in one
process report under their own service names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from consumer.errors import TelemetryError
from consumer.settings import TelemetrySettings

__all__ = [
    "CONTROLLER_SERVICE",
    "METRIC_VIEWS",
    "RELAY_SERVICE",
    "SECONDS_BUCKETS",
    "Telemetry",
    "build_telemetry",
]

_log = logging.getLogger("consumer.telemetry")

CONTROLLER_SERVICE: Final = "recovery-controller"
RELAY_SERVICE: Final = "recovery-relay"
_CHOICES: Final = ("otlp", "console", "none")
_LEGACY_EXPORTER: Final = "RECOVERY_CONTROLLER_EXPORTER"
_LEGACY_ENDPOINT: Final = "RECOVERY_CONTROLLER_OTLP_ENDPOINT"

# Bucket bounds of every histogram measured in seconds. OpenTelemetry's default bounds
# (0, 5, 10, 25, ... 10000) are sized for milliseconds: a decision (tens of
# microseconds) and a batch commit (milliseconds) would all land in `le="5"`, and any
# quantile would read 2.5 s. These span 50 µs to 30 s, at least two bounds per decade.
SECONDS_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Handed to every meter provider built here: any histogram whose unit is `s` gets them.
METRIC_VIEWS: Final = (
    View(
        instrument_type=Histogram,
        instrument_unit="s",
        aggregation=ExplicitBucketHistogramAggregation(boundaries=SECONDS_BUCKETS),
    ),
)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """The tracer and meter providers one component uses."""

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


@dataclass(frozen=True, slots=True)
class _Signal:
    name: str  # traces, metrics
    exporter: str  # the TelemetrySettings fields of its exporter and endpoint
    endpoint: str


_TRACES: Final = _Signal("traces", "traces_exporter", "otlp_traces_endpoint")
_METRICS: Final = _Signal("metrics", "metrics_exporter", "otlp_metrics_endpoint")


def _choices(signal: _Signal, settings: TelemetrySettings) -> list[str]:
    """The exporters of one signal (empty: none)."""
    text = (getattr(settings, signal.exporter) or "").strip()
    legacy = settings.legacy_exporter
    if text:
        names = [n.strip().lower() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in _CHOICES]
        if unknown:
            raise TelemetryError(
                f"telemetry-exporter-unknown: {settings.variable(signal.exporter)}={text!r} "
                f"names {', '.join(unknown)}; use otlp, console or none (comma-separated)"
            )
    elif legacy is not None:
        if legacy not in _CHOICES:
            raise TelemetryError(
                f"telemetry-exporter-unknown: {_LEGACY_EXPORTER}={legacy!r} (deprecated); "
                f"set {settings.variable(signal.exporter)} to otlp, console or none instead"
            )
        names = [legacy]
    elif settings.otlp_endpoint or getattr(settings, signal.endpoint) or settings.legacy_endpoint:
        names = ["otlp"]
    else:
        names = []
    return [n for n in dict.fromkeys(names) if n != "none"]


def _legacy_path(signal: _Signal, settings: TelemetrySettings) -> str | None:
    """The deprecated base URL with the signal's path, unless an OTEL_* endpoint decides."""
    legacy = settings.legacy_endpoint
    if legacy is None or settings.otlp_endpoint or getattr(settings, signal.endpoint):
        return None
    return f"{legacy.rstrip('/')}/v1/{signal.name}"


def _span_exporter(name: str, endpoint: str | None) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:  # pragma: no cover - a dependency of this project
        raise _missing_exporter() from exc
    return OTLPSpanExporter(endpoint=endpoint)


def _metric_exporter(name: str, endpoint: str | None) -> MetricExporter:
    if name == "console":
        return ConsoleMetricExporter()
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError as exc:  # pragma: no cover - a dependency of this project
        raise _missing_exporter() from exc
    return OTLPMetricExporter(endpoint=endpoint)


def _missing_exporter() -> TelemetryError:
    return TelemetryError(
        "telemetry-exporter-missing: exporter otlp needs the package "
        "opentelemetry-exporter-otlp-proto-http; install it (`pip install -c "
        "constraints.txt -e .`) or set OTEL_TRACES_EXPORTER and OTEL_METRICS_EXPORTER "
        "to console or none"
    )


def _warn_legacy(service: str, exporter: str | None, endpoint: str | None) -> None:
    for variable, value in ((_LEGACY_EXPORTER, exporter), (_LEGACY_ENDPOINT, endpoint)):
        if value is not None:
            _log.warning(
                "%s: %s is deprecated; it applies only where no OTEL_* variable decides. "
                "Use OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER and "
                "OTEL_EXPORTER_OTLP_ENDPOINT (docs/controller.md, Telemetry)",
                service,
                variable,
            )


def build_telemetry(
    *,
    instance: str,
    service: str = CONTROLLER_SERVICE,
    readers: Sequence[MetricReader] = (),
    settings: TelemetrySettings | None = None,
) -> Telemetry:
    """Providers for the component `service` (instance `instance`) as the telemetry
    settings configure them (module docstring; `settings`, else the environment's).
    `readers` are added to the meter provider whatever the exporters (the Prometheus
    endpoint's, `consumer.health_server`). Raises `TelemetryError` for an unknown
    exporter name."""
    settings = settings or TelemetrySettings.load()
    _warn_legacy(service, settings.legacy_exporter, settings.legacy_endpoint)
    disabled = settings.sdk_disabled
    traces = [] if disabled else _choices(_TRACES, settings)
    points = [] if disabled else _choices(_METRICS, settings)
    if not traces and not points and not readers:
        return Telemetry.disabled()
    # Defaults first, then what the environment says (OTEL_SERVICE_NAME wins).
    detected = OTELResourceDetector().detect().attributes
    resource = Resource.create(
        {"service.name": service, "service.instance.id": instance, **detected}
    )
    tracer_provider: trace.TracerProvider = trace.NoOpTracerProvider()
    if traces:
        sdk_tracer = TracerProvider(resource=resource)
        for name in traces:
            span_exporter = _span_exporter(name, _legacy_path(_TRACES, settings))
            sdk_tracer.add_span_processor(BatchSpanProcessor(span_exporter))
        tracer_provider = sdk_tracer
    meter_provider: metrics.MeterProvider = metrics.NoOpMeterProvider()
    if points or readers:
        exported: list[MetricReader] = [
            PeriodicExportingMetricReader(_metric_exporter(name, _legacy_path(_METRICS, settings)))
            for name in points
        ]
        meter_provider = MeterProvider(
            resource=resource, metric_readers=[*exported, *readers], views=METRIC_VIEWS
        )
    return Telemetry(tracer_provider, meter_provider)
