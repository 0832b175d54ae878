"""Humans in the loop through the real broker and database: an escalated operation's
review packet, a signed approval or rejection made with `recoveryctl` in a subprocess,
the operation moving on, and a packet that changed after display being refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger, with_user
from machines import DeclaredFacts
from tests.integration.consumer.harness import (
    Tool,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory
from tests.support.producers import key_of

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def approver_key() -> Ed25519PrivateKey:
    # The test roster's key of approver-1: it signs the decision and, as the roster
    # producer approver-1, the record that carries it.
    return key_of("approver-1")


@pytest.fixture
def policy(tmp_path: Path, approver_key: Ed25519PrivateKey) -> Path:
    return write_policy(tmp_path, approver_key)


@pytest.fixture
def key_file(tmp_path: Path, approver_key: Ed25519PrivateKey) -> Path:
    path = tmp_path / "approver-1.pem"
    pem = approver_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.write_bytes(pem)
    path.chmod(0o600)
    return path


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def recoveryctl(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """`python -m ops.cli ARGS` (the `recoveryctl` entry point) in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERY_CONTROLLER_")}
    return subprocess.run(
        [sys.executable, "-m", "ops.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _decided(ledger: Ledger, operation: str) -> int:
    return len(ledger.decisions(operation))


def _escalate(kafka_bootstrap: str, topic: str, ledger: Ledger, operation: str) -> Tool:
    tool = Tool(kafka_bootstrap, topic)
    tool.event("email-send", operation, "TOOL_TIMEOUT")
    tool.flush()
    wait_for(lambda: _decided(ledger, operation) == 1, 60, f"{operation} escalated")
    assert ledger.operation(operation).state == "unresolved"
    return tool


# About 30 `recoveryctl` processes, each a fresh interpreter: 4-5 s apiece (measured,
# `ops list --help`) on the shared 2-core machine at load average 14, past the default
# 120 s for the whole test.
@pytest.mark.timeout(360)
def test_escalated_operation_is_approved_with_recoveryctl_and_moves_on(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
    key_file: Path,
) -> None:
    topic = topic_factory(partitions=1)
    reader = with_user(database_url, "recovery_reader")
    rules = ("--policy", str(policy))
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    with running(settings, ledger):
        tool = _escalate(kafka_bootstrap, topic, ledger, "op-h1")
        tool.close()

        queue = recoveryctl("ops", "list", "--waiting-for-human", "--json", "--database-url",
                            reader, *rules)  # fmt: skip
        assert queue.returncode == 0, queue.stderr
        listed = json.loads(queue.stdout)["operations"]
        assert [(o["operation_id"], o["state"], o["waiting_for_human"]) for o in listed] == [
            ("op-h1", "unresolved", True)
        ]

        shown = recoveryctl("review", "op-h1", "--json", "--database-url", reader, *rules)
        assert shown.returncode == 0, shown.stderr
        packet = json.loads(shown.stdout)
        assert packet["current_state"]["name"] == "unresolved"
        assert packet["identities"]["agent"] == "agent-1"
        assert packet["consequences"]["approve"]["state_after"] == "resume-pending"
        assert [c["capability"] for c in packet["consequences"]["reject"]["commands"]] == [
            "agent.stop-task",
            "credentials.revoke-delegation",
        ]
        text = recoveryctl("review", "op-h1", "--database-url", reader, *rules)
        assert f"REVIEW PACKET {packet['digest']}" in text.stdout
        assert "approve: transitioned, unresolved -> resume-pending" in text.stdout

        approved = recoveryctl(
            "approve", "op-h1", "--key-file", str(key_file), "--packet-digest",
            packet["digest"], "--expires-in", "10m", "--bootstrap", kafka_bootstrap,
            "--events-topic", topic, "--wait", "60", "--json", "--database-url", reader,
            *rules,
        )  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        report = json.loads(approved.stdout)
        assert report["approver"] == "approver-1"
        assert (report["state"], report["transition"]) == ("unresolved", "resume-pending")
        assert report["decision"]["outcome"] == "transitioned"
        assert ledger.operation("op-h1").state == "resume-pending"

    # The resume gate accepts no second approval: refused before anything is signed.
    again = json.loads(
        recoveryctl("review", "op-h1", "--json", "--database-url", reader, *rules).stdout
    )
    assert again["consequences"]["approve"] is None
    refused = recoveryctl(
        "approve", "op-h1", "--key-file", str(key_file), "--packet-digest", again["digest"],
        "--bootstrap", kafka_bootstrap, "--events-topic", topic, "--database-url", reader,
        *rules,
    )  # fmt: skip
    assert refused.returncode == 1
    assert "in state resume-pending, which does not accept HUMAN_APPROVED" in refused.stderr

    timeline = recoveryctl("ops", "show", "op-h1", "--json", "--database-url", reader, *rules)
    assert timeline.returncode == 0, timeline.stderr
    body = json.loads(timeline.stdout)
    assert [e["event_type"] for e in body["events"]] == ["TOOL_TIMEOUT", "HUMAN_APPROVED"]
    second = body["events"][1]["decision"]
    assert second["guards"][0]["guard"] == "approval.granted"
    assert second["guards"][0]["value"] is True
    assert [a["approver"] for a in body["approvals"]] == ["approver-1"]
    assert [c["capability"] for c in body["commands"]] == [
        "email.quarantine-outbox",
        "human.escalate",
    ]
    assert body["audit"]["intact"] is True
    assert body["operation"]["waiting_for_human"] is False
    readable = recoveryctl("ops", "show", "op-h1", "--database-url", reader, *rules)
    assert "unresolved -> resume-pending" in readable.stdout
    assert "guard approval.granted: evidence approval:" in readable.stdout
    assert "audit chain: intact" in readable.stdout
    listing = recoveryctl("ops", "list", "--database-url", reader, *rules)
    assert "op-h1" in listing.stdout
    assert "resume-pending" in listing.stdout
    for filters, expected in [
        (("--state", "resume-pending"), ["op-h1"]),
        (("--state", "unresolved"), []),
        (("--machine", "email-send@1.0.0"), ["op-h1"]),
        (("--machine", "payment-refund"), []),
        (("--older-than", "1h"), []),
        (("--waiting-for-human",), []),
        # Search by who and what (issue #31): exact values, each or any.
        (("--agent", "agent-1"), ["op-h1"]),
        (("--agent", "agent-2"), []),
        (("--task", "task-op-h1"), ["op-h1"]),
        (("--principal", "alice"), ["op-h1"]),
        (("--correlation", "corr-op-h1"), ["op-h1"]),
        (("--search", "corr-op-h1"), ["op-h1"]),
        (("--search", "op-h1"), ["op-h1"]),
        (("--search", "alice", "--state", "unresolved"), []),
        (("--idempotency-key", "no-such-key"), []),
    ]:
        found = recoveryctl("ops", "list", *filters, "--json", "--database-url", reader, *rules)
        assert found.returncode == 0, found.stderr
        ids = [o["operation_id"] for o in json.loads(found.stdout)["operations"]]
        assert ids == expected, filters
    # Read-only commands never load a policy: none named, or one that is not there.
    bare = recoveryctl("ops", "list", "--database-url", reader)
    assert bare.returncode == 0, bare.stderr
    assert "op-h1" in bare.stdout
    missing = policy.with_name("no-such-policy.yaml")
    shown = recoveryctl("ops", "show", "op-h1", "--database-url", reader, "--policy", str(missing))
    assert shown.returncode == 0, shown.stderr
    # The packet shows what a decision would do, so it needs the policy, and says so.
    needs = recoveryctl("review", "op-h1", "--database-url", reader)
    assert needs.returncode == 2
    assert "needs the controller's policy: pass --policy FILE" in needs.stderr


def test_the_packet_says_what_the_state_means_why_it_came_and_what_follows(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    # Issue #31: the packet showed states and commands only; a reviewer who never saw the
    # RECOVERY.yaml could not tell what they approve.
    topic = topic_factory(partitions=1)
    reader = with_user(database_url, "recovery_reader")
    rules = ("--policy", str(policy))
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    with running(settings, ledger):
        tool = Tool(kafka_bootstrap, topic)
        tool.event(
            "email-send", "op-h4", "TOOL_TIMEOUT", facts=DeclaredFacts(idempotency_key="msg-h4")
        )
        tool.close()
        wait_for(lambda: _decided(ledger, "op-h4") == 1, 60, "op-h4 escalated")
    packet = json.loads(
        recoveryctl("review", "op-h4", "--json", "--database-url", reader, *rules).stdout
    )
    guide = packet["guidance"]
    assert guide["state"]["name"] == "unresolved"
    assert guide["state"]["description"].startswith("Manual review: the outcome is")
    assert {k: guide["escalation"][k] for k in ("queue", "severity", "reason")} == {
        "queue": "messaging-review",
        "severity": "medium",
        "reason": "send-outcome-unknown",
    }
    facts = guide["facts"]
    assert (facts["idempotency_key"], facts["side_effect_possible"]) == ("msg-h4", True)
    assert facts["side_effect_confirmed"] is False
    # No worker answers here: both commands of the escalation are still open.
    assert [c["capability"] for c in guide["unanswered_commands"]] == [
        "email.quarantine-outbox",
        "human.escalate",
    ]
    approve, reject = guide["after"]["approve"], guide["after"]["reject"]
    assert approve["state"]["name"] == "resume-pending"
    assert approve["commands"] == []  # what happens then: it waits for the resume request
    assert "RESUME_REQUESTED" in approve["state"]["waits_for"]
    assert reject["commands"] == [
        "agent.stop-task (stop)",
        "credentials.revoke-delegation (revoke)",
    ]

    text = recoveryctl("review", "op-h4", "--database-url", reader, *rules).stdout
    words = " ".join(text.split())  # wrapped for a terminal; read as one text
    for said in (
        "WHAT YOU ARE ASKED TO DECIDE",
        "now unresolved: Manual review: the outcome is indefinitely uncertain.",
        "why escalated to queue messaging-review (severity medium): send-outcome-unknown,",
        "the call idempotency key msg-h4; a side effect was possible, not confirmed",
        "open 2 command(s) not answered yet: email.quarantine-outbox",
        "approve -> resume-pending: Resumption gate:",
        "It sends no command; then it waits for ANCESTOR_CONTAINED, HUMAN_REJECTED, "
        "RESUME_REQUESTED.",
        "reject -> containing: The agent task is being stopped",
        "It sends agent.stop-task (stop), credentials.revoke-delegation (revoke);",
    ):
        assert said in words, f"{said!r} not in:\n{text}"
    found = recoveryctl("ops", "list", "--idempotency-key", "msg-h4", "--json",
                        "--database-url", reader)  # fmt: skip
    assert [o["operation_id"] for o in json.loads(found.stdout)["operations"]] == ["op-h4"]


def test_approval_of_a_packet_that_changed_after_display_is_refused(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
    key_file: Path,
) -> None:
    topic = topic_factory(partitions=1)
    reader = with_user(database_url, "recovery_reader")
    rules = ("--policy", str(policy))
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    decide = ("--key-file", str(key_file), "--bootstrap", kafka_bootstrap, "--events-topic",
              topic, "--database-url", reader, *rules)  # fmt: skip
    with running(settings, ledger):
        tool = _escalate(kafka_bootstrap, topic, ledger, "op-h2")
        shown = recoveryctl("review", "op-h2", "--json", "--database-url", reader, *rules)
        old = json.loads(shown.stdout)["digest"]
        # A new event arrives after the reviewer looked: the state does not accept it,
        # but the ledger history (and so the packet) moved.
        tool.event("email-send", "op-h2", "STEP_COMPLETED")
        tool.close()
        wait_for(lambda: _decided(ledger, "op-h2") == 2, 60, "the late event decided")

        stale = recoveryctl("approve", "op-h2", "--packet-digest", old, *decide)
        assert stale.returncode == 1
        assert "changed since it was shown" in stale.stderr
        assert old in stale.stderr
        assert "nothing was signed" in stale.stderr

        fresh = json.loads(
            recoveryctl("review", "op-h2", "--json", "--database-url", reader, *rules).stdout
        )
        assert fresh["digest"] != old
        assert [h["event_type"] for h in fresh["history"]] == ["TOOL_TIMEOUT", "STEP_COMPLETED"]
        rejected = recoveryctl(
            "reject", "op-h2", "--packet-digest", fresh["digest"], "--wait", "60", "--json",
            *decide,
        )  # fmt: skip
        assert rejected.returncode == 0, rejected.stderr
        assert json.loads(rejected.stdout)["decision"]["state_after"] == "containing"
    # Only the fresh decision was ever published: the stale one left nothing behind.
    decisions = ledger.decisions("op-h2")
    assert [d["event"]["type"] for d in decisions] == [
        "TOOL_TIMEOUT",
        "STEP_COMPLETED",
        "HUMAN_REJECTED",
    ]
    assert [i["capability"] for i in decisions[2]["invocations"]] == [
        "agent.stop-task",
        "credentials.revoke-delegation",
    ]


def test_approve_refuses_a_key_outside_the_roster(
    database_url: str, ledger: Ledger, policy: Path, tmp_path: Path, kafka_bootstrap: str,
    topic_factory: TopicFactory,
) -> None:  # fmt: skip
    topic = topic_factory(partitions=1)
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    with running(settings, ledger):
        _escalate(kafka_bootstrap, topic, ledger, "op-h3").close()
    stranger = tmp_path / "stranger.pem"
    made = recoveryctl(
        "keys", "generate", "--out", str(stranger), "--id", "stranger", "--role", "approver",
        "--roster", str(tmp_path / "stranger-roster.json"),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    digest = json.loads(
        recoveryctl("review", "op-h3", "--json", "--database-url", database_url, "--policy",
                    str(policy)).stdout
    )["digest"]  # fmt: skip
    refused = recoveryctl(
        "approve", "op-h3", "--key-file", str(stranger), "--packet-digest", digest,
        "--bootstrap", kafka_bootstrap, "--events-topic", topic, "--database-url",
        database_url, "--policy", str(policy),
    )  # fmt: skip
    assert refused.returncode == 1
    assert "not in policy controller-tests's approver roster" in refused.stderr


def _group() -> str:
    return f"controller-{uuid.uuid4().hex[:8]}"
