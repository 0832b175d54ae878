"""A worker group shares one execution store in PostgreSQL (`PostgresExecutionStore`,
schema and role `recovery_worker`): a command claimed by one member is never run by
another, an answer recorded by one is reported again by the next, the role may claim
and record and nothing else, and two workers on the real broker, one killed with
SIGKILL mid-stream, run each command at most once while every command is answered."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from ledger import with_user
from machines import EvidencePayload
from ops.cli import main
from producers import (
    ENV_WORKER_STORE,
    ENV_WORKER_STORE_URL,
    ExecutionState,
    PostgresExecutionStore,
    ProducersError,
    StoredAnswer,
)
from schemas import ENV_KAFKA_BOOTSTRAP, TopicNames
from tests.integration.wire.test_worker_never_reexecutes import (
    _answered_once,
    _command,
    _effects,
    _publish,
    _results,
)
from tests.support.kafka import TopicFactory
from tests.support.worker import shared_store_url

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_members_share_claims_and_answers(database_url: str) -> None:
    url = shared_store_url(database_url)
    answer = StoredAnswer(
        reported=True,
        succeeded=True,
        evidence=EvidencePayload(outcome="applied", reference="coupa-status:REQ-1"),
        completed_at=datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
    )
    with PostgresExecutionStore(url) as a, PostgresExecutionStore(url) as b:
        assert a.owner != b.owner
        assert a.lookup("op-1:2:0") is None
        assert a.claim("op-1:2:0", "procurement.create-request")
        # Its own claim again (a retry after a lost acknowledgement) is still its own;
        # another member's is refused.
        assert a.claim("op-1:2:0", "procurement.create-request")
        assert not b.claim("op-1:2:0", "procurement.create-request")
        seen = b.lookup("op-1:2:0")
        assert seen is not None
        assert (seen.state, seen.answer) == (ExecutionState.CLAIMED, None)
        a.record("op-1:2:0", answer)
        a.record("op-1:2:0", answer)  # the same answer again: a retried record
        done = b.lookup("op-1:2:0")
        assert done is not None
        assert (done.state, done.answer) == (ExecutionState.DONE, answer)
        with pytest.raises(ProducersError, match="no claim"):
            b.record("op-1:2:0", StoredAnswer(reported=False))  # never overwritten
        with pytest.raises(ProducersError, match="no claim"):
            b.record("op-9:2:0", answer)  # never claimed
        assert not a.claim("op-1:2:0", "procurement.create-request")  # done
        assert b.counts() == {"claimed": 0, "done": 1}


def test_the_worker_role_may_claim_and_record_and_nothing_else(database_url: str) -> None:
    url = shared_store_url(database_url)
    with PostgresExecutionStore(url) as store:
        assert store.claim("op-1:2:0", "procurement.create-request")
    refused = [
        "DELETE FROM recovery_worker.executions",
        "TRUNCATE recovery_worker.executions",
        "UPDATE recovery_worker.executions SET claimed_by = 'someone-else'",
        "CREATE TABLE recovery_worker.extra (x int)",
        "CREATE TABLE public.extra (x int)",
        "SELECT count(*) FROM events",  # the ledger's tables, in the same database
        "SELECT count(*) FROM outbox",
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("recovery_worker",)
        for statement in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
        row = conn.execute("SELECT count(*) FROM recovery_worker.executions").fetchone()
    assert row == (1,)


def test_db_worker_store_makes_the_store_and_keeps_every_password(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    passwords = tmp_path / "db-roles.json"
    passwords.write_text(json.dumps({"recovery_relay": "kept"}))
    args = ["db", "worker-store", "--database-url", database_url]
    assert main([*args, "--password-file", str(passwords), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["schema"], report["role"]) == ("recovery_worker", "recovery_worker")
    stored = json.loads(passwords.read_text())
    assert stored["recovery_relay"] == "kept"
    assert passwords.stat().st_mode & 0o777 == 0o600
    # Again: idempotent, and the same password.
    assert main([*args, "--password-file", str(passwords)]) == 0
    assert json.loads(passwords.read_text()) == stored
    url = make_conninfo(
        with_user(database_url, "recovery_worker"), password=stored["recovery_worker"]
    )
    with PostgresExecutionStore(url) as store:
        assert store.claim("op-1:2:0", "procurement.create-request")
        assert store.counts() == {"claimed": 1, "done": 0}


def _worker(
    bootstrap: str, topics: TopicNames, group: str, store_url: str, effects: Path
) -> subprocess.Popen[bytes]:
    environ = {k: v for k, v in os.environ.items() if k != ENV_WORKER_STORE}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.worker_process",
            *("--group", group, "--commands", topics.commands, "--events", topics.events),
            *("--effects", str(effects), "--pause", "0.15"),
        ],
        cwd=ROOT,
        env={
            **environ,
            "PYTHONPATH": str(ROOT),
            ENV_KAFKA_BOOTSTRAP: bootstrap,
            ENV_WORKER_STORE_URL: store_url,
        },
        stdout=subprocess.DEVNULL,
    )


def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_two_workers_one_killed_mid_stream_run_each_command_at_most_once(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> None:
    url = shared_store_url(database_url)
    topics = TopicNames(events=topic_factory(), commands=topic_factory(4))
    commands = [_command(f"op-pair-{i}", 2) for i in range(80)]
    _publish(kafka_bootstrap, topics, commands)
    group = f"workers-{uuid.uuid4().hex[:8]}"
    effects_a, effects_b = tmp_path / "effects-a.txt", tmp_path / "effects-b.txt"

    first = _worker(kafka_bootstrap, topics, group, url, effects_a)
    second = _worker(kafka_bootstrap, topics, group, url, effects_b)
    try:
        # Both members run commands (the group split the partitions), then one dies.
        _wait(lambda: len(_effects(effects_a)) >= 6 and _effects(effects_b), 90, "both")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        ran_first = _effects(effects_a)
        done_at_kill = len(ran_first) + len(_effects(effects_b))
        assert done_at_kill < len(commands) - 10, f"the kill landed late ({done_at_kill})"
        wanted = {c.command_id for c in commands}
        messages = _results(kafka_bootstrap, topics.events, wanted, timeout=120)
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)

    ran = Counter(ran_first + _effects(effects_b))
    # Across the group; a result reported again is the second member answering from the
    # store what the first recorded but never committed. Only what the killed member
    # had claimed and not answered (the one command in its handler) is unknown.
    events, unknown = _answered_once(ran, messages, wanted)
    killed = f"{socket.gethostname()}:{first.pid}:"
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT command_id, claimed_by, state FROM recovery_worker.executions"
        ).fetchall()
    claims = {str(c): (str(by), str(state)) for c, by, state in rows}
    assert set(claims) == wanted
    assert all(state == "done" for _, state in claims.values())
    assert all(claims[c][0].startswith(killed) for c in unknown)
    succeeded = {c for c, e in events.items() if e.event_type == "RETRY_SUCCEEDED"}
    assert succeeded | unknown == wanted
    assert succeeded <= set(ran)  # a reported success was executed, once
    # The killed member's partitions moved: the survivor answered commands it claimed.
    assert {c for c, (by, _) in claims.items() if by.startswith(killed)} < wanted
