"""`recoveryctl bench --quick` runs every phase end to end on the real broker and
database, in its own process as from a shell, and reports every figure sanely."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support.roles import role_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def quick_run(
    kafka_bootstrap: str, postgres_server: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    # One run for the module: each test reads its own figures from the same JSON.
    tmp_path = tmp_path_factory.mktemp("bench")
    out = tmp_path / "bench.json"
    # No RECOVERY_* setting of ours but how to reach the session's broker (its admin).
    env = role_env({})
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ops.cli",
            "bench",
            "--quick",
            "--bootstrap",
            kafka_bootstrap,
            "--database-url",
            postgres_server,
            "--json-out",
            str(out),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document: dict[str, Any] = json.loads(out.read_text())
    document["_elapsed"] = time.monotonic() - started
    document["_stdout"] = done.stdout
    return document


@pytest.mark.timeout(90)
def test_quick_bench_reports_every_figure_within_a_minute(quick_run: dict[str, Any]) -> None:
    assert quick_run["_elapsed"] < 60
    workload, base, sat = quick_run["workload"], quick_run["baseline"], quick_run["saturation"]
    # The workload is dirty on purpose: duplicates, forged approvals, bad records.
    assert workload["records"] >= 300
    assert workload["dead_letters_expected"] > 0
    assert workload["commands"] > 0
    # The baseline stored one row per record and both drains saw every record.
    assert base["rows_stored"] == base["records"] == workload["records"]
    assert base["events_per_second"] > 0
    # Three drains, each of every record into emptied tables; the baseline is the median.
    rates = sorted(d["events_per_second"] for d in base["drains"])
    assert len(rates) == 3
    assert base["events_per_second"] == rates[1]
    for drain in base["drains"]:
        assert drain["rows_stored"] == drain["records"] == workload["records"]
    assert sat["records"] == workload["records"]
    assert 0 < sat["events_per_second"]
    assert sat["ratio_to_baseline"] == pytest.approx(
        sat["events_per_second"] / base["events_per_second"], rel=0.01
    )
    # Every command the workload causes was published, and so was every dead letter.
    assert sat["commands_missing"] == 0, sat["commands_missing_examples"]
    assert sat["commands_seen"] == workload["commands"]
    assert sat["dead_letters_seen"] >= workload["dead_letters_expected"]


@pytest.mark.timeout(90)
def test_quick_bench_measures_latency_at_each_rate_and_memory_of_both_roles(
    quick_run: dict[str, Any],
) -> None:
    rates = [x["offered_rate"] for x in quick_run["latency"]]
    assert rates == [200, 500, 1000]
    for figures in quick_run["latency"]:
        assert figures["events_measured"] > 0
        assert figures["events_with_missing_commands"] == 0
        assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["p99_ms"] <= figures["max_ms"]
        assert figures["max_ms"] < 30_000
        # The stages split each event's latency: none is negative, and none takes longer
        # than the slowest whole event (timestamps in one unit, on one clock).
        stages = figures["stages"]
        assert set(stages) == {
            "to_controller_commit",
            "commit_to_relay_produce",
            "produce_to_readable",
        }
        for name, stage in stages.items():
            assert 0 < stage["p50_ms"] <= stage["p99_ms"] <= figures["max_ms"], (name, stage)
            assert 0 < stage["slowest_1pct_mean_ms"] <= figures["max_ms"], (name, stage)
    backlogs = [m["backlog"] for m in quick_run["memory"]]
    assert backlogs == sorted(backlogs)
    assert len(backlogs) == 2
    # Each phase counts its own dead letters, not the run's so far (the tail reads the
    # topic from the start of the run).
    for phase in quick_run["memory"]:
        assert phase["dead_letters_expected"] > 0
        assert phase["dead_letters_expected"] <= phase["dead_letters_seen"]
        assert phase["dead_letters_seen"] < 2 * phase["dead_letters_expected"]
    for phase in [quick_run["saturation"], *quick_run["memory"]]:
        for role in ("controller", "relay"):
            peak = phase["roles"][role]["peak_rss_mb"]
            assert 20 < peak < 2000, (role, peak)
            assert phase["roles"][role]["exit_status"] == 0
    machine = quick_run["machine"]
    assert machine["cores"] >= 1
    assert machine["kafka_client"]["librdkafka"]
    assert machine["postgresql"]["synchronous_commit"] == "on"
    verdicts = quick_run["verdicts"]
    assert set(verdicts) >= {"throughput_ratio", "throughput_rate", "p99_at_500", "controller_rss"}
    assert "controller + relay" in quick_run["_stdout"]
