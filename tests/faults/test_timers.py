"""Timers under faults (issue #29): real controller and relay processes, the real broker
and PostgreSQL. Procurement operations are opened and nobody answers them, so each one's
three timers fall due within half a minute (`TIMERS_POLICY`: the timeout of
`verifying` after 3 s, the stall bound of `escalated` after 8 s, the deadline after
30 s), while the controller is SIGKILLed between a timer's due time and its publish,
frozen until its partitions move to another member, or the database restarts under it;
half the operations carry a far-future `event_time`. Afterwards every timer fired
exactly once or was recorded as stale, none was lost, and the outbox wrote each timer's
event once (`checker.check_timers`)."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import psycopg
import pytest

from ledger import create_database, migrate_database
from machines import Lineage
from ops.postgres import PostgresServer, start_postgres
from producers import EventPublisher, RecoveryClient
from tests.faults.checker import CheckReport, check_timers
from tests.faults.processes import wait_until
from tests.faults.stream import TIMERS_POLICY, FaultRun
from tests.faults.verify import stored_decisions
from tests.support.db import ensure_login_roles
from tests.support.kafka import TopicFactory
from tests.support.producers import signers
from tests.support.scopes import catalogue_scope
from tests.support.services import service_root

pytestmark = [pytest.mark.slow, pytest.mark.integration]

MACHINE: Final = "procurement-request"
# Every operation's timers: the timeout, the stall bound, the deadline.
TIMERS_EACH: Final = 3
# Inside intake's window, and far enough that a deadline counted from it would be
# centuries away: the timers must count from the controller's clock regardless.
FAR_FUTURE: Final = datetime(2199, 12, 31, tzinfo=UTC)


def _say(message: str) -> None:
    print(f"[timers {time.strftime('%X')}] {message}", flush=True)


def _open(run: FaultRun, count: int, prefix: str) -> list[str]:
    """Publish a TOOL_TIMEOUT for `count` new operations (every other one stamped with a
    far-future `event_time`); returns their ids."""
    ops = [f"{prefix}-{n}" for n in range(count)]
    with EventPublisher(run.bootstrap, signer=signers(), topics=run.topics) as publisher:
        tool = RecoveryClient(publisher, "tool-1")
        for n, op in enumerate(ops):
            tool.publish_event(
                "TOOL_TIMEOUT",
                operation_id=op,
                correlation_id=f"corr-{op}",
                machine_name=MACHINE,
                machine_version="1.0.0",
                lineage=Lineage(agent="agent-1", task=f"task-{op}", initiating_principal="p"),
                evidence_ref=f"ref-{op}",
                scope=catalogue_scope(MACHINE),
                **({"event_time": FAR_FUTURE} if n % 2 else {}),
            )
    return ops


def _timer_decisions(url: str) -> int:
    """Timer events decided so far, all operations."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM decisions WHERE event_id LIKE 'timer:%%' "
            "AND outcome <> 'duplicate'"
        ).fetchone()
    return 0 if row is None else int(row[0])


def _fired_rows(url: str, topic: str) -> int:
    """Timer events written to the outbox for the events topic (fired), all operations."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox WHERE topic = %s AND headers->>'kind' = 'timer'", (topic,)
        ).fetchone()
    return 0 if row is None else int(row[0])


def _all_decided(url: str, ops: list[str], timeout: float) -> None:
    want = TIMERS_EACH * len(ops)
    wait_until(
        lambda: _timer_decisions(url) >= want,
        timeout,
        f"{want} timer events decided",
        every=0.5,
        detail=lambda: f"{_timer_decisions(url)} decided",
    )


def _check(url: str, topic: str, ops: list[str]) -> CheckReport:
    """Every timer fired once or went stale, none lost, each written to the outbox once."""
    report = CheckReport()
    counts = check_timers(stored_decisions(url), datetime.now(UTC), report)
    _say(f"timers: {counts}")
    assert report.anomalies == [], "\n".join(str(a) for a in report.anomalies)
    assert counts.get("timers fired", 0) + counts.get("timers stale", 0) == TIMERS_EACH * len(ops)
    assert _fired_rows(url, topic) == TIMERS_EACH * len(ops)
    for op, decisions in stored_decisions(url).items():
        types = sorted(
            d["event"]["type"] for d in decisions if d["event"]["id"].startswith("timer:")
        )
        assert types == ["DEADLINE_PASSED", "STATE_STALLED", "VERIFICATION_UNAVAILABLE"], op
    return report


@pytest.mark.timeout(240)
def test_a_controller_killed_between_due_and_publish_fires_each_timer_once(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    run = FaultRun(kafka_bootstrap, database_url, topic_factory, tmp_path, policy=TIMERS_POLICY)
    try:
        controller = run.start("controller")
        controller.wait_assigned(60)
        ops = _open(run, 80, "op-kill")
        # No relay yet: a fired timer's event waits in the outbox, unpublished. Kill the
        # controller once some have fired: between their due time and their publish.
        wait_until(lambda: _fired_rows(database_url, run.topics.events) > 0, 60, "a firing")
        controller.kill()
        fired = _fired_rows(database_url, run.topics.events)
        _say(f"controller SIGKILLed with {fired} timer events in the outbox, unpublished")
        controller = run.start("controller")
        controller.wait_assigned(60)
        relay = run.start("relay")
        # More kills while the stall bounds and the deadlines fall due.
        for kill in range(3):
            time.sleep(4 + 2 * kill)
            run.check_alive(controller, relay)
            (controller if kill != 1 else relay).kill()
            _say(f"kill {kill + 1}: {'relay' if kill == 1 else 'controller'}")
            if kill == 1:
                relay = run.start("relay")
            else:
                controller = run.start("controller")
        _all_decided(database_url, ops, 120)
        for process in (controller, relay):
            assert process.terminate() == 0
    finally:
        run.close()
    _check(database_url, run.topics.events, ops)


@pytest.mark.timeout(240)
def test_a_partition_moved_to_another_member_mid_timer_fires_each_once(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    run = FaultRun(kafka_bootstrap, database_url, topic_factory, tmp_path, policy=TIMERS_POLICY)
    try:
        first, relay = run.start("controller"), run.start("relay")
        first.wait_assigned(60)
        second = run.start("controller")
        second.wait_assigned(60)
        ops = _open(run, 80, "op-move")
        wait_until(lambda: _fired_rows(database_url, run.topics.events) > 0, 60, "a firing")
        # Freeze one member mid-timer: its session expires, the other takes its
        # partitions and fires their timers; thawed, it is a zombie whose firing and
        # batches are fenced by the newer epochs.
        first.signal(signal.SIGSTOP)
        _say("first controller frozen (SIGSTOP)")
        time.sleep(12)
        first.signal(signal.SIGCONT)
        _say("first controller thawed (SIGCONT)")
        _all_decided(database_url, ops, 120)
        for process in (first, second, relay):
            assert process.terminate() == 0
    finally:
        run.close()
    _check(database_url, run.topics.events, ops)


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, removed afterwards."""
    root = service_root("timers-postgres")
    server = start_postgres(root / "postgres")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(240)
def test_a_database_restart_while_timers_fall_due_fires_each_once(
    kafka_bootstrap: str, topic_factory: TopicFactory, own_server: PostgresServer, tmp_path: Path
) -> None:
    create_database(own_server.url, "recovery")
    url = own_server.url_for("recovery")
    migrate_database(url)
    ensure_login_roles(own_server, url)
    run = FaultRun(kafka_bootstrap, url, topic_factory, tmp_path, policy=TIMERS_POLICY)
    try:
        controller, relay = run.start("controller"), run.start("relay")
        controller.wait_assigned(60)
        ops = _open(run, 80, "op-db")
        wait_until(lambda: _fired_rows(url, run.topics.events) > 0, 60, "a firing")
        _say("stopping PostgreSQL while timers fall due")
        own_server.stop()
        time.sleep(5)
        run.check_alive(controller, relay)
        start_postgres(own_server.root, port=own_server.port)
        _say("PostgreSQL back")
        _all_decided(url, ops, 120)
        for process in (controller, relay):
            assert process.terminate() == 0
    finally:
        run.close()
    _check(url, run.topics.events, ops)
