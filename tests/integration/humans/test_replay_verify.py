"""`recoveryctl replay --verify` against the real database: decisions a running
controller made replay as recorded, and a decision row edited on purpose (as a
superuser with the append-only trigger bypassed) is reported field by field."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger, with_user
from machines import EvidencePayload
from tests.integration.consumer.harness import (
    VERIFIER,
    Tool,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.integration.humans.test_review_and_approve import recoveryctl
from tests.support.kafka import TopicFactory

pytestmark = pytest.mark.integration


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def test_replay_finds_a_decision_row_edited_on_purpose(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=2)
    reader = with_user(database_url, "recovery_reader")
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, f"c-{uuid.uuid4().hex}")
    found = EvidencePayload(outcome="applied", verifier=VERIFIER, reference="verification-1")
    with running(settings, ledger):
        tool = Tool(kafka_bootstrap, topic)
        tool.event("email-send", "op-r1", "TOOL_TIMEOUT")
        tool.event("payment-refund", "op-r2", "TOOL_TIMEOUT")
        tool.event("payment-refund", "op-r2", "VERIFICATION_FOUND", evidence=found)
        tool.event("email-send", "op-r1", "STEP_COMPLETED")
        tool.close()
        wait_for(
            lambda: (len(ledger.decisions("op-r1")), len(ledger.decisions("op-r2"))) == (2, 2),
            60,
            "four decisions",
        )
    rules = ("--policy", str(policy), "--database-url", reader)
    clean = recoveryctl("replay", "--verify", "--json", *rules)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    report = json.loads(clean.stdout)
    assert [(o["operation_id"], o["status"], o["decisions"]) for o in report["operations"]] == [
        ("op-r1", "ok", 2),
        ("op-r2", "ok", 2),
    ]

    # Someone with superuser rights rewrites history: the first decision of op-r1 now
    # claims the operation was abandoned. The append-only trigger refuses an UPDATE
    # unless triggers are off for the session.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE decisions SET decision = jsonb_set(decision::jsonb, '{state_after}', "
            "'\"abandoned\"')::json WHERE operation_id = 'op-r1' AND sequence = 1"
        )
    edited = recoveryctl("replay", "--verify", "--json", *rules)
    assert edited.returncode == 1
    body = json.loads(edited.stdout)
    assert body["mismatched"] == 1
    by_op = {o["operation_id"]: o for o in body["operations"]}
    assert by_op["op-r2"]["status"] == "ok"
    assert by_op["op-r1"]["status"] == "mismatch"
    assert by_op["op-r1"]["fields"] == ["state_after"]
    (line,) = by_op["op-r1"]["mismatches"]
    assert "decision 1" in line
    assert "recorded 'abandoned', replayed 'unresolved'" in line
    text = recoveryctl("replay", "--verify", "op-r1", *rules)
    assert text.returncode == 1
    assert "MISMATCH" in text.stdout
    assert "0 of 1 operation(s) replay as recorded" in text.stdout
