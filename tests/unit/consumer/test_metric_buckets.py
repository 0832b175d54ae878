"""Histograms in seconds have buckets sized for seconds (`consumer.SECONDS_BUCKETS`,
applied by `METRIC_VIEWS` to every meter provider `build_telemetry` makes): a decision
of tens of microseconds and a commit of milliseconds land in buckets of their own, so
the dashboard's quantiles mean something (issue #31: with OpenTelemetry's default
millisecond bounds every batch fell in `le="5.0"` and p50 read 2.5 s)."""

from __future__ import annotations

import os

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from consumer import (
    METRIC_VIEWS,
    SECONDS_BUCKETS,
    ControllerMetrics,
    build_telemetry,
    decide_batch,
)
from tests.unit.consumer.support import CONTROLLER, GROUP, T0, pinned


def _histograms(reader: InMemoryMetricReader) -> dict[str, HistogramDataPoint]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name: point
        for r in data.resource_metrics
        for s in r.scope_metrics
        for m in s.metrics
        for point in m.data.data_points
        if isinstance(point, HistogramDataPoint)
    }


def _quantile(point: HistogramDataPoint, q: float) -> float:
    """`histogram_quantile` as Prometheus computes it: linear within the bucket."""
    rank, seen, lower = q * point.count, 0, 0.0
    for upper, count in zip(point.explicit_bounds, point.bucket_counts, strict=False):
        if seen + count >= rank and count:
            return lower + (upper - lower) * (rank - seen) / count
        seen, lower = seen + count, upper
    return lower


def test_the_bounds_span_microseconds_to_seconds_in_order() -> None:
    assert list(SECONDS_BUCKETS) == sorted(set(SECONDS_BUCKETS))
    assert SECONDS_BUCKETS[0] <= 0.0001
    assert SECONDS_BUCKETS[-1] >= 10
    # No decade from 100 µs to 10 s without at least two bounds in it.
    for low in (0.0001, 0.001, 0.01, 0.1, 1.0):
        assert sum(low <= b < low * 10 for b in SECONDS_BUCKETS) >= 2, low


def test_decision_and_batch_latency_quantiles_read_what_was_recorded() -> None:
    reader = InMemoryMetricReader()
    metrics = ControllerMetrics(MeterProvider(metric_readers=[reader], views=METRIC_VIEWS), GROUP)
    for _ in range(100):
        metrics.decision_latency(0.00004)  # 40 µs
    _machines, rules = pinned()
    empty = decide_batch([], {}, rules, group=GROUP, controller=CONTROLLER, positions=(), now=T0)
    for seconds in [0.004] * 90 + [0.3] * 10:  # commits: 4 ms, a slow tenth at 300 ms
        metrics.committed(empty, seconds)
    points = _histograms(reader)
    decision = points["recovery.controller.decision.latency"]
    batch = points["recovery.controller.batch.latency"]
    assert tuple(decision.explicit_bounds) == SECONDS_BUCKETS
    assert _quantile(decision, 0.99) <= 0.00005
    assert 0.0025 <= _quantile(batch, 0.5) <= 0.005
    assert 0.25 <= _quantile(batch, 0.99) <= 0.5


def test_build_telemetry_gives_every_seconds_histogram_these_buckets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    reader = InMemoryMetricReader()
    telemetry = build_telemetry(instance="c-1", readers=(reader,))
    try:
        meter = telemetry.meter_provider.get_meter("any")
        meter.create_histogram("some.latency", unit="s").record(0.002)
        meter.create_histogram("some.size", unit="By").record(2000)
        points = _histograms(reader)
        assert tuple(points["some.latency"].explicit_bounds) == SECONDS_BUCKETS
        # Other units keep OpenTelemetry's defaults.
        assert tuple(points["some.size"].explicit_bounds) != SECONDS_BUCKETS
    finally:
        telemetry.shutdown()
