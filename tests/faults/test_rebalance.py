"""Rebalance at process level: a second controller process joins the group mid-stream
and leaves it (SIGTERM, or SIGKILL), and a frozen controller that comes back after the
group moved on (a zombie) has its batch refused by the ledger's fence."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg
import pytest

from tests.faults.processes import FaultError, RoleProcess, log_tail, wait_until
from tests.faults.stream import SESSION_TIMEOUT_MS, FaultRun, Feeder, drain, workload
from tests.faults.verify import verify_run
from tests.support.kafka import TopicFactory

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EVENTS = 6_000
RATE = 300.0
# What the controller logs when the ledger refuses a batch whose epoch is stale.
FENCED = "batch dropped: "
# The query a controller runs first for every batch (`load_views` in
# ledger/sql/queries.sql; its column list grows with the schema).
LOAD_VIEWS = "SELECT operation_id, view%"
# Tries at freezing the controller between consume and commit: each holds the lock for
# HOLD_S (at RATE a batch comes within milliseconds) and then lets the controller catch
# up on what queued meanwhile for SETTLE_S.
ATTEMPTS = 20
HOLD_S = 1.0
SETTLE_S = 1.0


def _say(message: str) -> None:
    print(f"[rebalance {time.strftime('%X')}] {message}", flush=True)


def _assignments(log: Path) -> int:
    return sum(1 for line in log.read_text(encoding="utf-8").splitlines() if " assigned " in line)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("leave", ["sigterm", "sigkill"])
def test_a_second_controller_joining_and_leaving_mid_stream_loses_and_repeats_no_decision(
    leave: str,
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    tmp_path: Path,
) -> None:
    records, _ = workload(EVENTS, seed=11)
    run = FaultRun(kafka_bootstrap, database_url, topic_factory, tmp_path, partitions=4)
    try:
        first, relay = run.start("controller"), run.start("relay")
        first.wait_assigned(60)
        feeder = Feeder(run, records, RATE, _say).start()
        time.sleep(3)
        second = run.start("controller")
        second.wait_assigned(60)
        _say(f"{second} joined and was assigned partitions; {feeder.sent:,} produced")
        # Both members decide for a while before the second leaves.
        time.sleep(4)
        if leave == "sigterm":
            status = second.terminate()
            assert status == 0, f"{second} exited {status}:\n{log_tail(second.log_path)}"
        else:
            second.kill()
        _say(f"{second} left ({leave}); {feeder.sent:,} produced")
        produced = feeder.join(60)
        drain(run, produced, [first, relay], 90, _say)
        first.terminate()
        relay.terminate()
    finally:
        run.close()
    # The first member gave partitions away and took them back: it logged more than
    # one assignment (cooperative-sticky assigns increments).
    assert _assignments(first.log_path) >= 2, log_tail(first.log_path)
    _say(str(verify_run(kafka_bootstrap, database_url, run.topics)))


@pytest.mark.timeout(180)
def test_a_frozen_controller_resumed_after_the_group_moved_on_has_its_batch_refused(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    records, _ = workload(EVENTS, seed=12)
    run = FaultRun(kafka_bootstrap, database_url, topic_factory, tmp_path, partitions=4)
    try:
        zombie, relay = run.start("controller"), run.start("relay")
        zombie.wait_assigned(60)
        feeder = Feeder(run, records, RATE, _say).start()
        time.sleep(3)
        tries = _freeze_between_consume_and_commit(zombie, database_url, feeder)
        _say(f"{zombie} frozen with a batch in hand (try {tries}); {feeder.sent:,} produced")
        successor = run.start("controller")
        successor.wait_assigned(60)
        # The frozen member is expelled when its session times out; the successor then
        # owns (and has claimed, with a newer epoch) every partition.
        wait_until(
            lambda: _owns_all(successor.log_path, run.topics.events, run.partitions),
            SESSION_TIMEOUT_MS / 1000 + 30,
            f"{successor} to take over every partition",
            detail=lambda: log_tail(successor.log_path),
        )
        time.sleep(1)
        zombie.signal(signal.SIGCONT)
        _say(f"{zombie} resumed")
        wait_until(
            lambda: FENCED in zombie.log_path.read_text(encoding="utf-8"),
            30,
            f"{zombie}'s stale batch to be refused",
            detail=lambda: log_tail(zombie.log_path),
        )
        refusal = next(
            line
            for line in zombie.log_path.read_text(encoding="utf-8").splitlines()
            if FENCED in line
        )
        _say(f"the zombie's commit was refused: {refusal.strip()[:240]}")
        produced = feeder.join(60)
        drain(run, produced, [zombie, successor, relay], 90, _say)
        for process in (zombie, successor, relay):
            process.terminate()
    finally:
        run.close()
    _say(str(verify_run(kafka_bootstrap, database_url, run.topics)))


def _freeze_between_consume_and_commit(
    zombie: RoleProcess, database_url: str, feeder: Feeder
) -> int:
    """SIGSTOP `zombie` while its next batch waits for its views: consumed, not planned,
    holding no row lock. The test locks the operations table so that the batch's first
    query waits; if the controller was inside a commit instead (which would then hold
    the partition fences), the lock is let go and taken again once the controller has
    caught up. Taken again at once, it met the catch-up's large batches, whose commit
    came while the lock was held again, each try failed the same way, and after the
    input ended no batch came at all (a full run on 2026-12-05: ten tries of 3.3 s, the
    input ending after the fifth). Returns the number of tries it took."""
    # Two connections: pg_stat_activity is a snapshot per transaction, so the lock
    # holder's own transaction would never see the controller start waiting.
    with (
        psycopg.connect(database_url, autocommit=True) as admin,
        psycopg.connect(database_url, autocommit=True) as watcher,
    ):
        for attempt in range(1, ATTEMPTS + 1):
            if feeder.done:
                raise FaultError(
                    f"the input ended before {zombie} was seen waiting for the views of a "
                    f"batch ({attempt - 1} tries):\n{log_tail(zombie.log_path)}"
                )
            with admin.transaction():
                admin.execute("LOCK TABLE operations IN ACCESS EXCLUSIVE MODE")
                deadline = time.monotonic() + HOLD_S
                while time.monotonic() < deadline:
                    if _waiting_on_views(watcher):
                        zombie.signal(signal.SIGSTOP)
                        return attempt
                    time.sleep(0.02)
            time.sleep(SETTLE_S)
    raise FaultError(
        f"{zombie} never waited for the views of a batch in {ATTEMPTS} attempts:\n"
        f"{log_tail(zombie.log_path)}"
    )


def _waiting_on_views(admin: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query LIKE %s",
        (LOAD_VIEWS,),
    ).fetchone()
    return row is not None and int(str(row[0])) > 0


def _owns_all(log: Path, topic: str, partitions: int) -> bool:
    assigned = " ".join(
        line for line in log.read_text(encoding="utf-8").splitlines() if " assigned " in line
    )
    return all(f"{topic}[{p}]" in assigned for p in range(partitions))
