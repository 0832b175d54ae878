"""`ops/dev bench --quick --members 1,2 --profile` runs every phase end to end on
the real broker and database, in its own process as from a shell, and reports every
figure sanely: throughput by number of controllers, CPU per record by process kind, and
the profiles."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from typing import Any

import psycopg
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
            "ops.bench",
            "--quick",
            "--members",
            "1,2",
            "--profile",
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
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document: dict[str, Any] = json.loads(out.read_text())
    document["_elapsed"] = time.monotonic() - started
    document["_stdout"] = done.stdout
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        row = conn.execute("SHOW shared_preload_libraries").fetchone()
    document["_preloaded"] = row is not None and "pg_stat_statements" in str(row[0])
    return document


@pytest.mark.timeout(240)
def test_quick_bench_reports_every_figure(quick_run: dict[str, Any]) -> None:
    # 115 s for the module at load average 14-20 (and 10-20 s more for the timer
    # storm); the bound only catches a hang.
    assert quick_run["_elapsed"] < 200
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
    # The report rounds the ratio to three decimals.
    assert sat["ratio_to_baseline"] == pytest.approx(
        sat["events_per_second"] / base["events_per_second"], abs=5e-4
    )
    # Every command the workload causes was published, and so was every dead letter.
    assert sat["commands_missing"] == 0, sat["commands_missing_examples"]
    assert sat["commands_seen"] == workload["commands"]
    assert sat["dead_letters_seen"] >= workload["dead_letters_expected"]


@pytest.mark.timeout(180)
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
        # When the slowest 1% were sent: within the phase's offered seconds.
        start, end = figures["slowest_1pct_sent_s"]
        assert 0 <= start <= end <= figures["records"] / figures["offered_rate"] + 1
        assert f"the slowest 1% were sent {start:.2f}-{end:.2f} s" in quick_run["_stdout"]
        # The page cache was written back before the phase, and the report says how long
        # that took.
        synced = figures["page_cache_sync_s"]
        assert 0 <= synced < 60
        assert f"writing back the page cache took {synced:.2f} s" in quick_run["_stdout"]
        # What each process kind spent per offered record at that rate, the same figures
        # as a drain's: the roles worked, and the pipeline is the sum of its kinds.
        cpu = figures["cpu"]
        assert cpu["records"] == figures["records"]
        kinds = cpu["kinds"]
        for kind in ("controller", "relay", "broker", "postgres"):
            assert 0 < kinds[kind]["us_per_event"] < 1_000_000, (figures["offered_rate"], kind)
        pipeline = sum(
            kinds[k]["us_per_event"] for k in ("controller", "relay", "broker", "postgres")
        )
        assert cpu["pipeline_us_per_event"] == pytest.approx(pipeline, abs=1.0)
        assert f"@ {figures['offered_rate']} ev/s: pipeline" in quick_run["_stdout"]
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
    assert set(verdicts) >= {
        "throughput_ratio",
        "throughput_rate",
        "p99_at_500",
        "p99_at_1000",
        "controller_rss",
        "relay_rss",
        "controller_peak_growth",
        "relay_peak_growth",
    }
    assert verdicts["throughput_ratio"]["target"] == 0.3
    assert "controller + relay" in quick_run["_stdout"]
    assert "targets (issue #20):" in quick_run["_stdout"]


@pytest.mark.timeout(180)
def test_quick_bench_scales_over_members_with_cpu_per_record_of_each_kind(
    quick_run: dict[str, Any],
) -> None:
    rows = quick_run["scaling"]
    assert [(r["members"], r["phase"]) for r in rows] == [
        (1, "saturation"),
        (1, "scaling x1"),
        (2, "scaling x2"),
    ]
    for row in rows:
        # Every record drained and every command published, with either many members.
        assert row["commands_missing"] == 0
        assert row["records"] >= 300
        assert row["events_per_second"] == pytest.approx(row["records"] / row["seconds"], rel=0.01)
        cpu = row["cpu"]
        kinds = cpu["kinds"]
        # Broker and server run on this host in the tests: every kind is counted.
        assert set(kinds) == {"controller", "relay", "broker", "postgres", "bench", "other"}
        for kind in ("controller", "relay", "broker", "postgres"):
            assert 0 < kinds[kind]["us_per_event"] < 1_000_000, (row["phase"], kind, kinds[kind])
        assert 0 < cpu["machine"]["cores_busy"] <= (quick_run["machine"]["cores"] or 1) + 0.5
        # The roles' own backends are the bench database's, named by role. The kernel
        # charges CPU in 10 ms ticks to whichever process runs at the tick, so a backend
        # with a few tens of ms of work in a quick drain (the relay's, now that it
        # publishes stored values) can be charged none; the controller's always has more.
        assert cpu["database_backends"]["controller"]["cpu_seconds"] > 0
        assert cpu["database_backends"]["relay"]["cpu_seconds"] >= 0
        # The pipeline figure is the sum of its kinds.
        pipeline = sum(
            kinds[k]["us_per_event"] for k in ("controller", "relay", "broker", "postgres")
        )
        assert cpu["pipeline_us_per_event"] == pytest.approx(pipeline, abs=1.0)
    assert rows[0]["records"] == quick_run["workload"]["records"]
    for row in rows[1:]:
        assert 0 < row["load_seconds"] <= row["seconds"]
        assert row["join_seconds"] > 0
        assert set(row["exit_status"].values()) == {0}
    # Two controller processes, each doing part of the work (three partitions).
    members = rows[2]["cpu"]["roles"]
    assert set(members) == {"controller-1", "controller-2", "relay"}
    assert all(members[m]["cpu_seconds"] > 0 for m in ("controller-1", "controller-2"))
    assert set(rows[2]["peak_rss_mb"]) == {"controller-1", "controller-2", "relay"}
    assert all(20 < mb < 2000 for mb in rows[2]["peak_rss_mb"].values())
    assert "2 controllers" in quick_run["_stdout"]
    assert "cpu per record" in quick_run["_stdout"]


@pytest.mark.timeout(180)
def test_quick_bench_profiles_the_saturation_phase(quick_run: dict[str, Any]) -> None:
    profile = quick_run["profile"]
    # Our packages, as py-spy names their files (relative or absolute, by how the
    # process found them); a quick drain's few samples may all lie below the role's
    # own package, in the ledger or the codecs it calls.
    ours = re.compile(r"[(/](consumer|producers|ledger|machines|schemas)/")
    for role in ("controller", "relay"):
        figures = profile["py_spy"][role]
        assert "error" not in figures, figures
        assert figures["samples"] > 0
        assert figures["file"].endswith(f"{role}.speedscope.json")
        # Our code is where its running samples are.
        assert any(ours.search(f["function"]) for f in figures["inclusive"]), figures
        assert 0 < figures["self"][0]["percent"] <= 100
    if quick_run["_preloaded"]:
        statements = profile["statements"]
        assert any("INSERT INTO events" in s["query"] for s in statements), statements
        for s in statements:
            assert s["calls"] > 0
            assert s["total_ms"] >= 0
    else:
        assert profile["statements"] == []
        assert "shared_preload_libraries" in profile["statements_note"]


@pytest.mark.timeout(240)
def test_quick_bench_drains_a_timer_storm_beside_live_events(quick_run: dict[str, Any]) -> None:
    timers = quick_run["timers"]
    # Every due timer was fired through the outbox and decided, with live events flowing.
    assert timers["timers"] == 300
    assert 0 < timers["drain_seconds"] < 120
    assert timers["live_records"] >= 300
    assert timers["live_events_per_second"] > 0
    assert timers["live_ratio_to_saturation"] > 0
    assert "timer storm: 300 timers due at once" in quick_run["_stdout"]
