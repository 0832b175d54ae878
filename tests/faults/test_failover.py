"""Failover after a controller SIGKILL: how long decisions pause, per membership mode.

A stream flows at a steady rate over four partitions; the only controller is killed
with SIGKILL and a new one started at once, as a supervisor restarts a crashed process.
The pause is the time from the kill until every partition's stored offset moves again.
With dynamic membership the group waits for the dead member's session to expire (6 s
here, the broker's minimum) before the newcomer gets its partitions; with static
membership (`group_instance_id`, KIP-345) the newcomer carries the dead one's instance
id and takes its partitions over at once. Each run prints the pauses it measured
(docs/controller.md, "Failover", quotes them).
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from tests.faults.stream import SESSION_TIMEOUT_MS, FaultRun, Feeder, drain, workload
from tests.faults.verify import verify_run
from tests.support.kafka import TopicFactory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

KILLS = 3
RATE = 150.0


def _say(message: str) -> None:
    print(f"[failover {time.strftime('%X')}] {message}", flush=True)


def _offsets(
    conn: psycopg.Connection[tuple[object, ...]], group: str, owner: str | None = None
) -> dict[int, int]:
    """Stored next offsets per partition (of those `owner` claimed, when given)."""
    rows = conn.execute(
        "SELECT c.partition, c.next_offset FROM consumer_offsets AS c JOIN partition_owners "
        "AS o USING (consumer_group, topic, partition) WHERE c.consumer_group = %s "
        "AND (%s::text IS NULL OR o.owner = %s)",
        (group, owner, owner),
    ).fetchall()
    return {int(str(p)): int(str(o)) for p, o in rows}


def _joined_at(log: Path) -> datetime:
    """When the member logged `joining group` (local wall-clock time, as its log)."""
    for line in log.read_text(encoding="utf-8").splitlines():
        if " joining group " in line:
            return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"{log} has no `joining group` line")


def _pause(
    conn: psycopg.Connection[tuple[object, ...]], group: str, owner: str, killed_at: float
) -> float:
    """Seconds from `killed_at` until the new member `owner` has committed on every
    partition (a commit of the dead member's that reached the server is not counted)."""
    before = _offsets(conn, group)
    deadline = killed_at + 60
    while time.monotonic() < deadline:
        now = _offsets(conn, group, owner)
        if before and all(now.get(p, -1) > o for p, o in before.items()):
            return time.monotonic() - killed_at
        time.sleep(0.02)
    raise AssertionError(f"{owner} did not commit on every partition within 60 s")


@pytest.mark.parametrize("membership", ["dynamic", "static"])
@pytest.mark.timeout(300)
def test_decisions_resume_after_a_controller_sigkill(
    membership: str,
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    tmp_path: Path,
) -> None:
    run = FaultRun(kafka_bootstrap, database_url, topic_factory, tmp_path, partitions=4)
    static = {"RECOVERY_CONTROLLER_GROUP_INSTANCE_ID": f"{run.group}-static"}
    env = static if membership == "static" else {}
    records, _ = workload(int(RATE * (12 + KILLS * 12)), seed=5, bad_rate=0.0)
    pauses: list[float] = []
    joins: list[float] = []  # from the new member's joining the group to resumed
    try:
        relay = run.start("relay")
        controller = run.start("controller", env=env)
        controller.wait_assigned(60)
        feeder = Feeder(run, records, RATE, _say).start()
        with psycopg.connect(database_url, autocommit=True) as conn:
            time.sleep(4)
            for _ in range(KILLS):
                controller.kill()
                killed_at, killed_wall = time.monotonic(), datetime.now()
                controller = run.start("controller", env=env)
                owner = f"{run.group}-c{len(run.processes)}"  # FaultRun's instance ids
                pauses.append(_pause(conn, run.group, owner, killed_at))
                started = (_joined_at(controller.log_path) - killed_wall).total_seconds()
                joins.append(pauses[-1] - started)
                _say(
                    f"{membership}: decisions resumed on every partition {pauses[-1]:.2f} s "
                    f"after the kill: {started:.2f} s for the new process to start and "
                    f"{joins[-1]:.2f} s from its joining the group"
                )
                time.sleep(3)
        produced = feeder.join(120)
        drain(run, produced, [controller, relay], 120, _say)
        controller.terminate()
        relay.terminate()
    finally:
        run.close()
    _say(
        f"{membership} membership, session timeout {SESSION_TIMEOUT_MS} ms: pauses "
        f"{', '.join(f'{p:.2f}' for p in pauses)} s (median {statistics.median(pauses):.2f}); "
        f"from joining: {', '.join(f'{j:.2f}' for j in joins)} s"
    )
    verify_run(kafka_bootstrap, database_url, run.topics)
    if membership == "static":
        # The newcomer takes the dead member's partitions over at once, without waiting
        # for its session to expire: past its own start-up, decisions resume in well under
        # the session timeout.
        assert statistics.median(joins) < SESSION_TIMEOUT_MS / 2000, joins
