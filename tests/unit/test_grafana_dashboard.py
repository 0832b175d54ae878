"""The shipped Grafana dashboard and Prometheus alert rules query only series
docs/operations.md documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import yaml
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest

from consumer import METRIC_VIEWS, SECONDS_BUCKETS, ControllerMetrics, Intake, decide_batch
from ledger import OutboxRecord, TimerSummary, WaitingState
from producers.relay_metrics import RelayMetrics
from tests.support.producers import roster as producer_roster
from tests.unit.consumer.support import CONTROLLER, GROUP, T0, encoded, event, pinned, record

ROOT = Path(__file__).resolve().parents[2]


def _documented() -> set[str]:
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `(recovery_[a-z_]+)` \|", text, re.MULTILINE))


def test_every_dashboard_query_names_a_documented_series() -> None:
    dashboard = json.loads((ROOT / "ops" / "grafana" / "recovery.json").read_text())
    documented = _documented()
    assert len(documented) >= 12
    used: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"recovery_[a-z_]+", target["expr"]):
                base = re.sub(r"_(bucket|count|sum)$", "", name)
                assert base in documented, f"panel {panel['title']!r} uses {name}"
                used.add(base)
    assert {"recovery_controller_consumer_lag", "recovery_relay_published_total"} <= used
    # Nothing waits forever unseen (issue #29): what waits, and the timers.
    assert {
        "recovery_controller_operations_waiting",
        "recovery_controller_operations_stalled",
        "recovery_controller_operations_oldest_wait_seconds",
        "recovery_controller_timers_overdue",
    } <= used


def _series_in(expr: str) -> set[str]:
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in re.findall(r"recovery_[a-z_]+", expr)}


def test_every_alert_rule_parses_and_names_a_documented_series() -> None:
    rules = yaml.safe_load((ROOT / "ops" / "prometheus" / "alerts.yaml").read_text())
    documented = _documented()
    alerts = {}
    for group in rules["groups"]:
        for rule in group["rules"]:
            promql_parser.parse(rule["expr"])  # raises on a PromQL syntax error
            assert _series_in(rule["expr"]) <= documented, rule["alert"]
            assert rule["labels"]["severity"] in ("page", "ticket"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
            assert rule["annotations"]["description"], rule["alert"]
            alerts[rule["alert"]] = rule["expr"]
    # The held row (one record must never stop the outbox unnoticed) and the incident
    # (a conflicting opening) page someone.
    assert "recovery_outbox_held" in alerts["RecoveryOutboxRowHeld"]
    assert "recovery_controller_security_incidents_total" in alerts["RecoverySecurityIncident"]
    # A stalled operation is someone's ticket; timers nobody decides page.
    assert "recovery_controller_operations_stalled" in alerts["RecoveryOperationsStalled"]
    assert "recovery_controller_timers_overdue" in alerts["RecoveryTimersOverdue"]


def _exported_series() -> dict[str, set[str]]:
    """Series name -> its label names, as `/metrics` exposes them when the controller's
    and the relay's instruments have recorded one of everything (their own code, through
    OpenTelemetry's Prometheus exporter and the views the runtime installs)."""
    registry = CollectorRegistry(auto_describe=False)
    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader(registry=registry)], views=METRIC_VIEWS
    )
    machines, rules = pinned()
    intake = Intake(machines, roster=producer_roster(), max_record_bytes=65536)
    outcomes = [intake.examine(r) for r in (encoded(event("TOOL_TIMEOUT"), 0), record(b"j", 1))]
    planned = decide_batch(
        outcomes, {}, rules, group=GROUP, controller=CONTROLLER, positions=(), now=T0
    )
    controller = ControllerMetrics(provider, GROUP)
    controller.committed(planned, 0.004)
    controller.decision_latency(0.00004)
    controller.batch("fenced")
    controller.advisory_commit_failed("REBALANCE_IN_PROGRESS")
    controller.set_lag({("recovery.events", 0): 3})
    controller.timers_committed(
        {(what, "stalled"): 1 for what in ("armed", "cancelled", "stale", "fired")}
    )
    waiting = WaitingState("procurement-request", "verifying", 2, T0, 1)
    controller.set_timer_summary(TimerSummary((waiting,), armed=2, overdue=1), T0)
    relay = RelayMetrics("relay-1", provider)
    relay.published([OutboxRecord(1, "r-1", "recovery.commands", "op-1", {}, {})])
    relay.unpublishable(1)
    relay.backlog(2)
    relay.held(0)
    text = generate_latest(registry).decode()
    provider.shutdown()
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+)(?:\{(.*)\})? ", line)
        if match and match[1].startswith("recovery_"):
            labels = set(re.findall(r'([a-z_]+)="', match[2] or ""))
            series.setdefault(match[1], set()).update(labels)
    return series


def test_every_dashboard_query_names_series_and_labels_the_code_exports() -> None:
    exported = _exported_series()
    dashboard = json.loads((ROOT / "ops" / "grafana" / "recovery.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            selectors = re.findall(r"(recovery_[a-z_]+)(\{[^}]*\})?", expr)
            assert selectors, f"panel {panel['title']!r}: no series in {expr}"
            labels: set[str] = set()
            for name, matchers in selectors:
                assert name in exported, (
                    f"panel {panel['title']!r} queries {name}, which nothing exports; "
                    f"exported: {sorted(exported)}"
                )
                labels |= exported[name]
                for label in re.findall(r"([a-z_]+)\s*[=!]~?", matchers):
                    assert label in exported[name], f"{panel['title']!r}: {name} has no {label}"
            for group in re.findall(r"\bby \(([^)]*)\)", expr):
                for label in (g.strip() for g in group.split(",")):
                    assert label in labels, f"panel {panel['title']!r} groups by {label}: {expr}"


def test_latency_panels_read_histograms_with_second_buckets() -> None:
    exported = _exported_series()
    assert "le" in exported["recovery_controller_batch_latency_seconds_bucket"]
    dashboard = json.loads((ROOT / "ops" / "grafana" / "recovery.json").read_text())
    latency = [
        t["expr"] for p in dashboard["panels"] for t in p["targets"] if "latency" in t["expr"]
    ]
    assert latency
    assert all(e.startswith("histogram_quantile(") and "_bucket" in e for e in latency)
    assert SECONDS_BUCKETS[0] < 0.001  # a sub-millisecond decision has a bucket of its own
