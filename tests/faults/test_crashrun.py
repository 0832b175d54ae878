"""The crash run at CI size: every fault kind once (the ledger's primary kill -9 on a
failover pair included), a handful of SIGKILLs, the history checker finds no anomaly.
The full run is `python -m tests.faults.crashrun` (100,000 events, 50 kills;
docs/faults.md)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.faults.crashrun import CrashPlan, crash_run

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SEED_ENV = "RECOVERY_FAULT_SEED"


def _say(message: str) -> None:
    print(f"[crashrun {time.strftime('%X')}] {message}", flush=True)


@pytest.mark.timeout(600)
def test_every_fault_at_once_leaves_a_history_without_anomaly(tmp_path: Path) -> None:
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1 << 31))
    _say(f"seed {seed} (rerun with {SEED_ENV}={seed})")
    plan = CrashPlan(
        events=3_000,
        kills=6,
        seed=seed,
        rate=100.0,
        broker_down=2.0,
        database_down=3.0,
        delay=0.05,
        delay_period=5.0,
        blackhole_period=4.0,
        refuse_period=3.0,
        drain_timeout=180.0,
    )
    result = crash_run(plan, tmp_path, _say)
    _say(result.summary())
    faults, counts = result.faults, result.report.counts
    assert result.report.anomalies == []
    assert faults.exited_by_themselves == []
    assert sum(faults.kills.values()) >= plan.kills
    assert faults.broker_kills == faults.broker_restarts == 1
    assert faults.database_restarts == 1
    assert faults.primary_kills == faults.rejoins == 1
    assert faults.proxy_resets >= 1  # the refusal cut the controller's connections
    # The checker saw the whole stream and every command the core expects.
    assert counts["records on the events topic"] == counts["records produced"] > 3_000
    assert counts["decisions in the ledger"] == counts["decisions expected"] > 2_500
    assert counts["commands after dedupe"] == counts["commands expected"] > 1_000
    assert counts["audit chains verified"] >= counts["operations"]
    # Timers fell due throughout and each was decided once (none lost, none twice).
    assert counts["timers fired"] > 30
