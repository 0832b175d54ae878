"""The shipped Grafana dashboard and Prometheus alert rules query only series
docs/operations.md documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import yaml

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
