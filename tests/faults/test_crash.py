"""Crash test: the controller and the relay are SIGKILLed at random moments while tens of
thousands of events flow, and restarted; afterwards the ledger is a replay of the input,
nothing was applied twice, and the output topics hold every outbox record."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.faults.processes import RoleProcess
from tests.faults.stream import FaultRun, Feeder, drain, workload
from tests.faults.verify import progress, verify_run
from tests.support.kafka import TopicFactory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EVENTS = 24_000
RATE = 400.0  # records/s: the input flows for about a minute, while the kills happen
KILLS = 22
SEED_ENV = "RECOVERY_FAULT_SEED"


def _say(message: str) -> None:
    print(f"[crash {time.strftime('%X')}] {message}", flush=True)


@pytest.mark.timeout(300)
def test_sigkilled_controller_and_relay_lose_and_repeat_nothing(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(1 << 31))
    _say(f"seed {seed} (rerun with {SEED_ENV}={seed})")
    rng = random.Random(seed)
    records, stats = workload(EVENTS, seed)
    _say(
        f"workload: {stats.records:,} records, {stats.operations:,} operations, "
        f"{stats.commands:,} commands expected, {stats.dead_letters} dead letters expected"
    )
    run = FaultRun(kafka_bootstrap, database_url, topic_factory, tmp_path, partitions=4)
    kills = {"controller": 0, "relay": 0}
    try:
        roles: dict[str, RoleProcess] = {
            "controller": run.start("controller"),
            "relay": run.start("relay"),
        }
        roles["controller"].wait_assigned(60)
        feeder = Feeder(run, records, RATE, _say).start()
        while sum(kills.values()) < KILLS:
            time.sleep(rng.uniform(0.5, 2.5))
            run.check_alive(*roles.values())
            roll = rng.random()
            targets = (
                ["relay"]
                if roll < 0.5
                else ["controller"]
                if roll < 0.8
                else ["controller", "relay"]
            )
            for role in targets:
                roles[role].kill()
                kills[role] += 1
                roles[role] = run.start(role)
            _say(
                f"kill {sum(kills.values())}/{KILLS} ({'+'.join(targets)}); "
                f"{feeder.sent:,} produced; {progress(database_url, run.group, run.topics.events)}"
            )
            if "controller" in targets:
                # The next kill lands somewhere in the new member's life, not always
                # before it even joined the group.
                roles["controller"].wait_assigned(60)
        produced = feeder.join(120)
        _say(f"{produced:,} records produced; draining")
        drain(run, produced, list(roles.values()), 150, _say)
        for process in roles.values():
            process.terminate()
    finally:
        run.close()
    _say(f"kills: {kills['controller']} controller, {kills['relay']} relay; verifying")
    assert kills["controller"] >= 5, kills
    assert kills["relay"] >= 5, kills

    report = verify_run(kafka_bootstrap, database_url, run.topics)
    _say(str(report))
    assert report.outputs.rows.get("dlq", 0) == stats.dead_letters, (
        report.outputs.rows,
        stats.kinds,
    )
    assert report.outputs.rows.get("commands", 0) == stats.commands, (
        report.outputs.rows,
        stats.commands,
    )
