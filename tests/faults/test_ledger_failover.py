"""Losing the ledger's primary: a PostgreSQL failover pair of the tests' own
(`ops.postgres_ha`, pg_auto_failover with a synchronous standby) loses its primary to
kill -9, the standby is promoted, and

- a commit acknowledged before the kill is on the new primary, and one the standby has
  not confirmed is never acknowledged (synchronous commit, docs/ledger.md "Failover");
- the partition epochs fence a stale owner on the new primary as on the old;
- under load, decisions go on and the history checker finds nothing lost, duplicated
  or reordered, every audit chain intact (`tests.faults.ledger_failover`, one kill; the
  timed run with more kills is `python -m tests.faults.ledger_failover`);
- no server of the pair trusts a connection: every role, the replication and monitor
  roles included, needs its password.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ledger import (
    LedgerError,
    PartitionAttempt,
    PostgresLedger,
    create_database,
    migrate_database,
)
from ops.postgres_ha import MONITOR, NODES, HaPostgres
from ops.process import pid_alive
from tests.faults.ledger_failover import failover_run
from tests.faults.processes import wait_until
from tests.support.kafka import TopicFactory
from tests.support.services import own_postgres_ha

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _say(message: str) -> None:
    print(f"[ledger-failover {time.strftime('%X')}] {message}", flush=True)


@pytest.fixture(scope="module")
def pair() -> Iterator[HaPostgres]:
    """One failover pair for the module (about 30 s to make); each test leaves it
    synchronous again."""
    with own_postgres_ha("ledger-failover") as cluster:
        yield cluster


def _fresh_database(pair: HaPostgres) -> str:
    name = f"failover_{uuid.uuid4().hex[:10]}"
    create_database(pair.url, name)
    migrate_database(pair.url_for(name))
    return name


def _walreceiver_pid(pair: HaPostgres, standby: str) -> int:
    with psycopg.connect(pair.node_url(standby), autocommit=True) as conn:
        row = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
    assert row is not None, f"{standby} streams from no primary"
    return int(row[0])


def _backend_pids(pair: HaPostgres, node: str) -> tuple[list[int], int]:
    """The pids of every backend of `node` (the blocked claim's among them) and of its
    WAL sender."""
    with psycopg.connect(pair.node_url(node), autocommit=True) as conn:
        rows = conn.execute("SELECT pid, backend_type FROM pg_stat_activity").fetchall()
    (sender,) = [int(pid) for pid, kind in rows if kind == "walsender"]
    return [int(pid) for pid, _ in rows], sender


def _rejoin(pair: HaPostgres, node: str) -> None:
    pair.start(node)
    pair.wait_synchronous(180)


@pytest.mark.timeout(300)
def test_an_acknowledged_claim_survives_the_primary_and_epochs_still_fence(
    pair: HaPostgres,
) -> None:
    name = _fresh_database(pair)
    url = pair.url_for(name)
    primary = pair.primary()
    assert primary is not None
    standby = next(n for n in NODES if n != primary)
    ledger = PostgresLedger(url, retries=8, backoff=0.5)
    direct = PostgresLedger(pair.node_url(primary, name), retries=0)
    try:
        stale = ledger.claim("g", "events", [0], "owner-a")[0].epoch
        current = ledger.claim("g", "events", [0], "owner-b")[0].epoch
        assert current == stale + 1
        # The standby stops confirming: a commit on the primary is not acknowledged.
        receiver = _walreceiver_pid(pair, standby)
        os.kill(receiver, signal.SIGSTOP)
        outcome: list[object] = []

        def unconfirmed() -> None:
            try:
                outcome.append(direct.claim("g", "events", [0], "owner-c")[0].epoch)
            except LedgerError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=unconfirmed, daemon=True)
        thread.start()
        thread.join(3.0)
        assert outcome == [], f"a commit was acknowledged without the standby: {outcome}"
        _say(f"killing {primary}; the standby {standby} holds epoch {current} as acknowledged")
        backends, sender = _backend_pids(pair, primary)
        # The WAL sender is not running when the server dies (as one the scheduler has
        # not run yet): left alive, it would pass the standby's confirmation on as soon
        # as it ran, and the claim would be acknowledged by a dead server's backend.
        os.kill(sender, signal.SIGSTOP)
        pair.kill(primary)
        assert [pid for pid in backends if pid_alive(pid)] == []
        os.kill(receiver, signal.SIGCONT)
        thread.join(30)
        assert len(outcome) == 1, outcome
        assert isinstance(outcome[0], LedgerError), outcome
        wait_until(lambda: pair.primary() == standby, 60, f"{standby} to be promoted")
        # Every acknowledged claim is on the new primary; the unacknowledged one may be
        # or not (whether its WAL reached the standby before the kill is not known).
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT epoch, owner FROM partition_owners WHERE consumer_group = 'g'"
            ).fetchone()
        assert row is not None
        assert (int(row[0]), str(row[1])) in {(current, "owner-b"), (current + 1, "owner-c")}
        now = int(row[0])
        # A stale owner is fenced on the new primary; the current one is not.
        attempt = PartitionAttempt("events", 0, 0, 10, 1, False, "x", 0)
        assert ledger.record_attempts("g", [attempt], {("events", 0): stale}) == (("events", 0),)
        assert ledger.record_attempts("g", [attempt], {("events", 0): now}) == ()
    finally:
        ledger.close()
        direct.close()
    _rejoin(pair, primary)


@pytest.mark.timeout(600)
def test_losing_the_primary_under_load_loses_and_repeats_nothing(
    kafka_bootstrap: str, topic_factory: TopicFactory, pair: HaPostgres, tmp_path: Path
) -> None:
    result = failover_run(
        kafka_bootstrap, pair, topic_factory, tmp_path, events=3_000, kills=1, rate=150.0,
        say=_say,
    )  # fmt: skip
    _say(result.summary())
    assert result.report.anomalies == []
    assert len(result.timings) == 1
    # A bound on waiting, not a speed target: the numbers are the command's (module
    # docstring of tests.faults.ledger_failover).
    assert result.timings[0].first_decision_s < 120
    counts = result.report.counts
    assert counts["decisions in the ledger"] == counts["decisions expected"] > 2_000
    assert counts["audit chains verified"] >= counts["operations"]


@pytest.mark.timeout(120)
def test_no_server_of_the_pair_trusts_a_connection(pair: HaPostgres) -> None:
    servers = {
        MONITOR: pair.monitor_port,
        **{n: p for n, p in zip(NODES, pair.node_ports, strict=True)},
    }
    for name in (MONITOR, *NODES):
        hba = (pair.folder(name) / "data" / "pg_hba.conf").read_text()
        rules = [line.split() for line in hba.splitlines() if line and not line.startswith("#")]
        assert rules, name
        assert {rule[-1] for rule in rules} == {"scram-sha-256"}, f"{name}: {rules}"
    users = {
        MONITOR: ("postgres", "autoctl_node"),
        NODES[0]: ("postgres", "pgautofailover_replicator", "pgautofailover_monitor"),
    }
    for name, roles in users.items():
        for role in roles:
            with pytest.raises(psycopg.OperationalError, match="password"):
                psycopg.connect(
                    host="127.0.0.1", port=servers[name], user=role, dbname="postgres",
                    password="wrong", passfile=os.devnull, connect_timeout=5,
                )  # fmt: skip
    for node in NODES:
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(
                host="127.0.0.1", port=servers[node], user="pgautofailover_replicator",
                dbname="replication", replication="true", password="wrong",
                passfile=os.devnull, connect_timeout=5,
            )  # fmt: skip
