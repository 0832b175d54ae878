"""Failover after a controller SIGKILL: how long decisions pause, per deployment mode.

A stream flows at a steady rate over four partitions while controllers are killed with
SIGKILL. The pause is the time from the kill until every partition has been committed
again by the member that now owns it (docs/controller.md, "Failover", quotes the table
each run prints). Modes:

- `standby-classic`: two members share the partitions (the classic protocol,
  cooperative-sticky, session 1.5 s, heartbeat 0.5 s). One is killed; the survivor gets
  its partitions when the dead member's session expires, and a supervisor starts a new
  standby meanwhile.
- `standby-static`: the same with a static `group.instance.id` per member (KIP-345), the
  replacement started under the dead member's id: it takes the partitions back without
  a rebalance if it is up before the session expires, else the survivor takes them. The
  deployment default.
- `standby-consumer`: the same under KIP-848's protocol, the session timeout (1.5 s) and
  heartbeat interval (0.5 s) being the broker's (`ops/kafka/server.properties`).
- `restart-static`: one member with a static `group.instance.id` (KIP-345), restarted at
  once under the same id: it takes its partitions back without a rebalance, but only
  once the new process has started.

The broker is this module's own, started from the checkout's server properties: a stock
broker refuses sessions under 6 s (classic) or 45 s (KIP-848). A session that short must
not expire on a live member during a long batch on a loaded machine (librdkafka
heartbeats from its own thread): every run also counts the partitions a live member
lost, and there must be none.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

import psycopg
import pytest

from tests.faults.processes import RoleProcess
from tests.faults.stream import FaultRun, Feeder, drain, workload
from tests.faults.verify import verify_run
from tests.support.kafka import TopicFactory
from tests.support.services import own_kafka

pytestmark = [pytest.mark.slow, pytest.mark.integration]

KILLS: Final = 3
RATE: Final = 150.0
# The mode's median pause must stay under this (issue #17: 3 s of decisions).
TARGET_S: Final = 3.0
SESSION: Final = {
    "RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS": "1500",
    "RECOVERY_CONTROLLER_HEARTBEAT_INTERVAL_MS": "500",
}


@dataclass(frozen=True)
class Mode:
    """How a mode runs its members (module docstring)."""

    env: Mapping[str, str]
    standby: bool
    static: bool = False
    # Held to TARGET_S (the comparison modes with a 6 s session cannot be).
    fast: bool = True


SIX_S: Final = {"RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS": "6000"}
MODES: Final = {
    "standby-classic": Mode(SESSION, standby=True),
    "standby-consumer": Mode({"RECOVERY_CONTROLLER_GROUP_PROTOCOL": "consumer"}, standby=True),
    "restart-static": Mode(SESSION, standby=False, static=True),
    "standby-static": Mode(SESSION, standby=True, static=True),
    # For comparison (FAILOVER_MODES=all): the stock broker's shortest session, 6 s.
    "standby-classic-6s": Mode(SIX_S, standby=True, fast=False),
    "restart-static-6s": Mode(SIX_S, standby=False, static=True, fast=False),
    "restart-dynamic-6s": Mode(SIX_S, standby=False, fast=False),
}
# The suite runs the deployment default (standby-static) and KIP-848; FAILOVER_MODES=all
# (or a comma list) measures the others too.
SUITE: Final = ("standby-static", "standby-consumer")
_chosen = os.environ.get("FAILOVER_MODES", "")
RUN: Final = list(MODES) if _chosen == "all" else [m for m in _chosen.split(",") if m] or SUITE


def _say(message: str) -> None:
    print(f"[failover {time.strftime('%X')}] {message}", flush=True)


@pytest.fixture(scope="module")
def failover_kafka() -> Iterator[str]:
    """Bootstrap servers of this module's own broker (module docstring)."""
    with own_kafka("kafka-failover") as broker:
        yield broker.bootstrap


def _offsets(
    conn: psycopg.Connection[tuple[object, ...]], group: str, dead: str | None = None
) -> dict[int, int]:
    """Stored next offsets per partition (of those claimed since by a member other than
    `dead`, when given)."""
    rows = conn.execute(
        "SELECT c.partition, c.next_offset FROM consumer_offsets AS c JOIN partition_owners "
        "AS o USING (consumer_group, topic, partition) WHERE c.consumer_group = %s "
        "AND o.owner IS DISTINCT FROM %s",
        (group, dead),
    ).fetchall()
    return {int(str(p)): int(str(o)) for p, o in rows}


def _pause(
    conn: psycopg.Connection[tuple[object, ...]], group: str, dead: str, killed_at: float
) -> float:
    """Seconds from `killed_at` until a live member has committed on every partition:
    the survivor, or the replacement if it joined first; a commit of the dead member's
    that reached the server is not counted."""
    before = _offsets(conn, group)
    deadline = killed_at + 60
    while time.monotonic() < deadline:
        now = _offsets(conn, group, dead)
        if before and all(now.get(p, -1) > o for p, o in before.items()):
            return time.monotonic() - killed_at
        time.sleep(0.02)
    raise AssertionError(f"partitions of {dead} not decided again within 60 s of its kill")


def _reassigned(processes: list[RoleProcess], since: datetime) -> float:
    """Seconds from `since` until one of `processes` logged an assignment of partitions
    (local wall-clock time, as the logs): the group's share of the pause."""
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for p in processes
        for line in p.log_path.read_text(encoding="utf-8").splitlines()
        if " INFO consumer: assigned " in line and line.rstrip()[-1] == "]"
    ]
    after = [s for s in stamps if s > since]
    return (min(after) - since).total_seconds() if after else float("nan")


def _lost(process: RoleProcess) -> int:
    """How often a member logged losing partitions (its session expired while it ran)."""
    text = process.log_path.read_text(encoding="utf-8")
    return sum(1 for line in text.splitlines() if " lost " in line or "SESSTMOUT" in line)


def _member(run: FaultRun, mode: Mode, slot: int) -> tuple[RoleProcess, str, int]:
    """A new controller of the run in `slot` (its static id, kept by its replacement),
    its ledger owner name (FaultRun's instance id) and the slot."""
    env = dict(mode.env)
    if mode.static:
        env["RECOVERY_CONTROLLER_GROUP_INSTANCE_ID"] = f"{run.group}-static-{slot}"
    process = run.start("controller", env=env)
    return process, f"{run.group}-c{len(run.processes)}", slot


@pytest.mark.parametrize("name", RUN)
@pytest.mark.timeout(240)
def test_decisions_resume_within_3_s_after_a_controller_sigkill(
    name: str,
    failover_kafka: str,
    database_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    mode = MODES[name]
    topics = TopicFactory(failover_kafka, request.node.name)
    run = FaultRun(failover_kafka, database_url, topics, tmp_path, partitions=4)
    del topics  # its admin client must not outlive the module's broker
    records, _ = workload(int(RATE * (10 + KILLS * 9)), seed=5, bad_rate=0.0)
    pauses: list[float] = []
    try:
        relay = run.start("relay")
        members = [_member(run, mode, slot) for slot in range(2 if mode.standby else 1)]
        for process, _, _ in members:
            process.wait_assigned(60)
        feeder = Feeder(run, records, RATE, _say).start()
        with psycopg.connect(database_url, autocommit=True) as conn:
            time.sleep(3)
            for _ in range(KILLS):
                victim, dead, slot = members.pop(0)
                victim.kill()
                killed_at, killed_wall = time.monotonic(), datetime.now()
                replacement = _member(run, mode, slot)  # as a supervisor restarts it
                members.append(replacement)
                pauses.append(_pause(conn, run.group, dead, killed_at))
                group_s = _reassigned([p for p, _, _ in members], killed_wall)
                _say(
                    f"{name}: every partition decided again {pauses[-1]:.2f} s after the "
                    f"kill; first reassignment after {group_s:.2f} s"
                )
                replacement[0].wait_assigned(60)
                time.sleep(3)
        feeder.stop()  # the workload outlasts the kills; the rest would only drain
        produced = feeder.join(120)
        drain(run, produced, [p for p, _, _ in members] + [relay], 120, _say)
        for process, _, _ in members:
            process.terminate()
        relay.terminate()
    finally:
        run.close()  # the topics go with the module's broker
    lost = sum(_lost(p) for p in run.processes if p.role == "controller")
    _say(
        f"| {name} | {', '.join(f'{p:.2f}' for p in pauses)} | "
        f"{statistics.median(pauses):.2f} | {lost} | load {os.getloadavg()[0]:.1f} |"
    )
    verify_run(failover_kafka, database_url, run.topics)
    assert lost == 0, f"{lost} partition losses by live members (false rebalances)"
    if mode.fast:
        assert statistics.median(pauses) < TARGET_S, pauses
