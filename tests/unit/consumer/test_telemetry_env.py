"""Telemetry configured by OpenTelemetry's own variables: exporter choice per signal, the
service name per component, OTEL_SDK_DISABLED, and the deprecated aliases."""

from __future__ import annotations

import logging
import os

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from consumer import Telemetry, TelemetryError, TelemetrySettings, build_telemetry
from consumer.telemetry import CONTROLLER_SERVICE, RELAY_SERVICE


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def _legacy(exporter: str) -> TelemetrySettings:
    """The settings with the deprecated RECOVERY_CONTROLLER_EXPORTER set, over the
    process's OTEL_* variables."""
    return TelemetrySettings.load(dict(os.environ, RECOVERY_CONTROLLER_EXPORTER=exporter))


def _service(telemetry: Telemetry) -> object:
    provider = telemetry.tracer_provider
    assert isinstance(provider, TracerProvider)
    return provider.resource.attributes["service.name"]


def test_nothing_configured_means_the_no_op_providers() -> None:
    telemetry = build_telemetry(instance="c-1")
    assert isinstance(telemetry.tracer_provider, trace.NoOpTracerProvider)
    assert isinstance(telemetry.meter_provider, metrics.NoOpMeterProvider)


def test_an_otlp_endpoint_alone_turns_on_otlp_for_both_signals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    telemetry = build_telemetry(instance="r-1", service=RELAY_SERVICE)
    assert isinstance(telemetry.meter_provider, MeterProvider)
    assert _service(telemetry) == RELAY_SERVICE
    provider = telemetry.tracer_provider
    assert isinstance(provider, TracerProvider)
    assert provider.resource.attributes["service.instance.id"] == "r-1"


def test_otel_service_name_and_resource_attributes_override_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-recovery")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=prod")
    telemetry = build_telemetry(instance="c-1", service=CONTROLLER_SERVICE)
    provider = telemetry.tracer_provider
    assert isinstance(provider, TracerProvider)
    assert provider.resource.attributes["service.name"] == "billing-recovery"
    assert provider.resource.attributes["deployment.environment.name"] == "prod"
    # OTEL_METRICS_EXPORTER unset and no endpoint: no metrics export.
    assert isinstance(telemetry.meter_provider, metrics.NoOpMeterProvider)


def test_each_signal_has_its_own_exporter_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    telemetry = build_telemetry(instance="c-1")
    assert isinstance(telemetry.tracer_provider, trace.NoOpTracerProvider)
    assert isinstance(telemetry.meter_provider, MeterProvider)
    telemetry.shutdown()


def test_otel_sdk_disabled_wins_over_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    telemetry = build_telemetry(instance="c-1", settings=_legacy("console"))
    assert isinstance(telemetry.tracer_provider, trace.NoOpTracerProvider)
    assert isinstance(telemetry.meter_provider, metrics.NoOpMeterProvider)


def test_an_unknown_exporter_is_refused_with_its_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp,prometheus")
    with pytest.raises(TelemetryError, match=r"telemetry-exporter-unknown: OTEL_METRICS_EXPORTER"):
        build_telemetry(instance="c-1")
    monkeypatch.delenv("OTEL_METRICS_EXPORTER")
    with pytest.raises(TelemetryError, match="RECOVERY_CONTROLLER_EXPORTER='zipkin'"):
        build_telemetry(instance="c-1", settings=_legacy("zipkin"))


def test_the_deprecated_exporter_applies_where_no_otel_variable_decides_and_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    with caplog.at_level(logging.WARNING, logger="consumer.telemetry"):
        telemetry = build_telemetry(instance="c-1", settings=_legacy("console"))
    assert isinstance(telemetry.tracer_provider, TracerProvider)
    assert isinstance(telemetry.meter_provider, metrics.NoOpMeterProvider)
    assert any(
        "RECOVERY_CONTROLLER_EXPORTER is deprecated" in r.getMessage() for r in caplog.records
    )
    telemetry.shutdown()
