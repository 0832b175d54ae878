"""`recoveryctl offsets show|skip` against the real broker and database, with a real
controller running: the table and JSON of offsets and lag, a skip that dead-letters the
skipped records' bytes and audits the operator's reason on the intake chain, refusals,
and a skip racing a batch the running controller holds (fenced: the skipped records are
never decided, and the controller takes the partition back and goes on)."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger
from ops.cli import main
from tests.integration.consumer.harness import (
    Tool,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory

pytestmark = pytest.mark.integration

# The query a controller runs first for every batch (`load_views` in queries.sql).
LOAD_VIEWS = "SELECT operation_id, view%"


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _decided(ledger: Ledger, operation: str) -> int:
    try:
        return len(ledger.decisions(operation))
    except Exception:  # unknown operation: nothing decided
        return 0


def _cli(*args: str, kafka: str, db: str, topic: str, group: str) -> list[str]:
    return [
        "offsets",
        *args,
        "--bootstrap",
        kafka,
        "--database-url",
        db,
        "--topic",
        topic,
        "--group",
        group,
    ]


def _show(capsys: pytest.CaptureFixture[str], base: list[str]) -> dict[int, dict[str, int]]:
    assert main([*base, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    return {row["partition"]: row for row in body["partitions"]}


def test_show_reports_the_ledger_offset_log_end_lag_and_kafka_advice(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, group = topic_factory(partitions=1), f"offsets-{uuid.uuid4().hex[:8]}"
    tool = Tool(kafka_bootstrap, topic)
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(settings, ledger):
        for n in range(3):
            tool.event("email-send", f"op-o{n}", "TOOL_TIMEOUT")
        tool.flush()
        wait_for(lambda: ledger.offsets(group, topic) == {0: 3}, 60, "3 records committed")
        base = _cli("show", kafka=kafka_bootstrap, db=database_url, topic=topic, group=group)
        # Kafka gets the ledger's offset as advice, asynchronously after the commit.
        wait_for(lambda: _show(capsys, base)[0]["kafka_offset"] == 3, 30, "the advice")
    tool.event("email-send", "op-o3", "TOOL_TIMEOUT")
    tool.event("email-send", "op-o4", "TOOL_TIMEOUT")
    tool.close()
    row = _show(capsys, base)[0]
    assert row == {
        "partition": 0,
        "ledger_offset": 3,
        "log_start": 0,
        "log_end": 5,
        "lag": 2,
        "kafka_offset": 3,
    }
    assert main(base) == 0
    table = capsys.readouterr().out
    assert f"group {group}, topic {topic}" in table
    assert "total lag 2" in table


def test_skip_dead_letters_the_records_with_their_bytes_and_audits_the_reason(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, group = topic_factory(partitions=1), f"offsets-{uuid.uuid4().hex[:8]}"
    tool = Tool(kafka_bootstrap, topic)
    tool.raw("op-k0", b'{"stuck": "record one"}', "application/json")
    tool.raw("op-k1", b'{"stuck": "record two"}', "application/json")
    tool.event("email-send", "op-k2", "TOOL_TIMEOUT")
    tool.close()
    skip = _cli("skip", kafka=kafka_bootstrap, db=database_url, topic=topic, group=group)
    # Refusals write nothing: no reason, a blank one, backwards, past the log end, not
    # the record the partition is at.
    with pytest.raises(SystemExit) as usage:
        main([*skip, "--partition", "0", "--to", "2"])
    assert usage.value.code == 2
    assert main([*skip, "--partition", "0", "--to", "2", "--reason", "  "]) == 2
    assert "--reason must say why" in capsys.readouterr().err
    assert main([*skip, "--partition", "0", "--to", "9", "--reason", "x"]) == 1
    assert "ends at offset 3" in capsys.readouterr().err
    assert main([*skip, "--partition", "0", "--offset", "1", "--reason", "x"]) == 1
    assert "is at offset 0, not 1" in capsys.readouterr().err
    assert ledger.offsets(group, topic) == {}

    reason = "INC-42: records crash the parser; replay after the fix"
    args = [*skip, "--partition", "0", "--to", "2", "--reason", reason, "--operator", "oncall-ann"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["from_offset"], report["to_offset"]) == (0, 2)
    assert (report["dead_lettered"], report["unreadable"]) == (2, 0)
    assert ledger.offsets(group, topic) == {0: 2}
    assert main([*args]) == 1  # already past: skip never moves back
    assert "already at offset 2" in capsys.readouterr().err

    with psycopg.connect(database_url, autocommit=True) as conn:
        audit = conn.execute(
            "SELECT kind, record FROM audit_records WHERE operation_id = %s ORDER BY sequence",
            (report["chain"],),
        ).fetchall()
        letters = conn.execute(
            "SELECT payload FROM outbox WHERE topic = %s ORDER BY id", ("recovery.dlq",)
        ).fetchall()
    kinds = [kind for kind, _ in audit]
    assert kinds == ["dead-letter", "dead-letter", "offsets-skipped"]
    summary = audit[-1][1]
    assert (summary["reason"], summary["operator"]) == (reason, "oncall-ann")
    assert (summary["from_offset"], summary["to_offset"], summary["records"]) == (0, 2, 2)
    assert all(r["reason_code"] == "record-skipped" for _, r in audit[:2])
    assert all("oncall-ann" in r["reason"] and reason in r["reason"] for _, r in audit[:2])
    values = [base64.b64decode(json.loads(p)["original_value"]) for (p,) in letters]
    assert values == [b'{"stuck": "record one"}', b'{"stuck": "record two"}']
    assert ledger.verify_audit(report["chain"]) == ()

    # The controller starts at the stored offset: only the third record is decided.
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(settings, ledger):
        wait_for(lambda: ledger.offsets(group, topic) == {0: 3}, 60, "the rest decided")
    assert _decided(ledger, "op-k2") == 1


def test_a_skip_fences_the_running_controllers_batch_which_then_goes_on_after_it(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, group = topic_factory(partitions=1), f"offsets-{uuid.uuid4().hex[:8]}"
    tool = Tool(kafka_bootstrap, topic)
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    skip = _cli("skip", kafka=kafka_bootstrap, db=database_url, topic=topic, group=group)
    with (
        running(settings, ledger) as member,
        psycopg.connect(database_url, autocommit=True) as admin,
        psycopg.connect(database_url, autocommit=True) as watcher,
    ):
        member.wait_owned(1)
        tool.event("email-send", "op-f0", "TOOL_TIMEOUT")
        tool.flush()
        wait_for(lambda: ledger.offsets(group, topic) == {0: 1}, 60, "the first record")
        # Hold the controller's next batch between consuming and committing it.
        with admin.transaction():
            admin.execute("LOCK TABLE operations IN ACCESS EXCLUSIVE MODE")
            tool.event("email-send", "op-f1", "TOOL_TIMEOUT")
            tool.event("email-send", "op-f2", "TOOL_TIMEOUT")
            tool.flush()
            wait_for(lambda: _waiting_on_views(watcher), 30, "the batch to wait for its views")
            reason = "drill: skip what the controller holds"
            args = [*skip, "--partition", "0", "--to", "3", "--reason", reason]
            done: list[int] = []
            skipper = threading.Thread(target=lambda: done.append(main(args)))
            skipper.start()
            wait_for(lambda: _owner(watcher, group).startswith("recoveryctl"), 30, "the claim")
        # The lock is released: the held batch now fails its epoch check and is dropped.
        skipper.join(60)
        assert done == [0]
        assert "fenced on it" in capsys.readouterr().out
        # A session timeout later the member claims the partition back at offset 3.
        tool.event("email-send", "op-f3", "TOOL_TIMEOUT")
        tool.flush()
        wait_for(lambda: _decided(ledger, "op-f3") == 1, 60, "the record after the skip")
        time.sleep(0.5)  # anything the dropped batch could still commit would be in by now
    tool.close()
    assert ledger.offsets(group, topic) == {0: 4}
    assert (_decided(ledger, "op-f1"), _decided(ledger, "op-f2")) == (0, 0)
    assert _decided(ledger, "op-f0") == 1


def _waiting_on_views(watcher: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock' AND query LIKE %s",
        (LOAD_VIEWS,),
    ).fetchone()
    return row is not None and int(str(row[0])) > 0


def _owner(watcher: psycopg.Connection[tuple[object, ...]], group: str) -> str:
    row = watcher.execute(
        "SELECT owner FROM partition_owners WHERE consumer_group = %s", (group,)
    ).fetchone()
    return "" if row is None else str(row[0])
