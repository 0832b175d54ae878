"""`recoveryctl dlq list|show|redrive` through the real broker and database: a redriven
record is validated again by the controller; one that fails the same way stays a dead
letter, one whose cause was fixed is decided."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger, with_user
from machines import DEFAULT_REGISTRY
from tests.integration.consumer.harness import (
    Tool,
    open_ledger,
    outbox,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.integration.humans.test_review_and_approve import recoveryctl
from tests.support.kafka import TopicFactory

pytestmark = pytest.mark.integration

LOCK = Path(DEFAULT_REGISTRY).resolve().parent / "machines.lock"


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _letters(ledger: Ledger) -> list[dict[str, Any]]:
    return [dict(r.payload) for r in outbox(ledger) if r.topic == "recovery.dlq"]


def _group() -> str:
    return f"controller-{uuid.uuid4().hex[:8]}"


def test_redriven_garbage_fails_the_same_way_and_stays_a_dead_letter(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=1)
    reader = with_user(database_url, "recovery_reader")
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    with running(settings, ledger):
        tool = Tool(kafka_bootstrap, topic)
        tool.raw("op-bad", b"not an envelope {", "application/json")
        tool.close()
        wait_for(lambda: len(_letters(ledger)) == 1, 60, "the first dead letter")

        listed = recoveryctl("dlq", "list", "--json", "--database-url", reader)
        assert listed.returncode == 0, listed.stderr
        (letter,) = json.loads(listed.stdout)["dead_letters"]
        reason = letter["reason_code"]
        assert letter["source"] == {"topic": topic, "partition": 0, "offset": 0}

        shown = recoveryctl("dlq", "show", letter["record_id"], "--json", "--database-url", reader)
        assert shown.returncode == 0, shown.stderr
        original = json.loads(shown.stdout)["original"]
        assert original["value"] == "not an envelope {"
        assert original["key"] == "op-bad"
        assert original["headers"]["content-type"] == "application/json"
        text = recoveryctl("dlq", "show", letter["record_id"], "--database-url", reader)
        assert f"reason     {reason}:" in text.stdout

        redriven = recoveryctl(
            "dlq", "redrive", letter["record_id"], "--bootstrap", kafka_bootstrap,
            "--database-url", reader,
        )  # fmt: skip
        assert redriven.returncode == 0, redriven.stderr
        assert f"to {topic}" in redriven.stdout
        wait_for(lambda: len(_letters(ledger)) == 2, 60, "the redriven record refused again")

    letters = _letters(ledger)
    assert [d["reason_code"] for d in letters] == [reason, reason]
    assert [d["source_offset"] for d in letters] == [0, 1]
    assert letters[1]["original_value"] == letters[0]["original_value"]
    assert letters[1]["original_headers"] == letters[0]["original_headers"]
    table = recoveryctl("dlq", "list", "--database-url", reader)
    assert "2 dead letter(s)" in table.stdout
    missing = recoveryctl("dlq", "show", "dlq:no-such", "--database-url", reader)
    assert missing.returncode == 1
    assert "no dead letter dlq:no-such" in missing.stderr


def test_redriven_record_whose_machine_is_now_pinned_is_decided(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    # A deployment that forgot to pin email-send: its events are dead-lettered.
    lock = json.loads(LOCK.read_text(encoding="utf-8"))
    entry = lock["machines"]["payment-refund@1.0.0"]
    entry["path"] = str(LOCK.parent / entry["path"])
    partial = tmp_path / "partial.lock"
    partial.write_text(json.dumps({**lock, "machines": {"payment-refund@1.0.0": entry}}))
    group = _group()
    before = settings_for(kafka_bootstrap, database_url, topic, policy, group, lock_path=partial)
    with running(before, ledger):
        tool = Tool(kafka_bootstrap, topic)
        tool.event("email-send", "op-pin", "TOOL_TIMEOUT")
        tool.close()
        wait_for(lambda: len(_letters(ledger)) == 1, 60, "the unpinned event dead-lettered")
    (letter,) = _letters(ledger)
    assert letter["reason_code"] == "machine-unknown"
    record_id = next(r.record_id for r in outbox(ledger) if r.topic == "recovery.dlq")

    # The operator pins the machine, restarts the controller and redrives the record.
    after = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(after, ledger):
        redriven = recoveryctl(
            "dlq", "redrive", record_id, "--bootstrap", kafka_bootstrap, "--json",
            "--database-url", database_url,
        )  # fmt: skip
        assert redriven.returncode == 0, redriven.stderr
        assert json.loads(redriven.stdout)["redriven"]["reason_code"] == "machine-unknown"
        wait_for(lambda: len(ledger.decisions("op-pin")) == 1, 60, "the redriven event decided")
    assert ledger.operation("op-pin").state == "unresolved"
    assert len(_letters(ledger)) == 1
