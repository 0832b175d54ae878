"""The shipped Grafana dashboard queries only series docs/operations.md documents."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
