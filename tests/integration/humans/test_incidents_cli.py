"""A conflicting opening through the real broker and database (issue 28): a producer
opens another tool's operation id under another machine first; the real tool's report
is not decided and not silently dead-lettered, but recorded as an incident with both
openings, which `recoveryctl incidents` shows an operator."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger, with_user
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
from tests.support.keys import ensure_controller_key

pytestmark = pytest.mark.integration


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _letters(ledger: Ledger) -> list[dict[str, Any]]:
    return [dict(r.payload) for r in outbox(ledger) if r.topic == "recovery.dlq"]


def test_a_squatted_operation_id_is_an_incident_shown_with_both_openings(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    topic = topic_factory(partitions=1)
    policy = write_policy(tmp_path, Ed25519PrivateKey.generate())
    group = f"controller-{uuid.uuid4().hex[:8]}"
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(settings, ledger):
        squatter = Tool(kafka_bootstrap, topic, producer="tool-2")
        squatter.event("email-send", "op-refund-7", "TOOL_TIMEOUT", agent="mail-agent")
        squatter.close()
        wait_for(lambda: bool(ledger.load_views(["op-refund-7"])), 60, "the squatted opening")
        tool = Tool(kafka_bootstrap, topic, producer="tool-1")
        real = tool.event("payment-refund", "op-refund-7", "TOOL_TIMEOUT", agent="billing-agent")
        tool.close()
        wait_for(lambda: len(_letters(ledger)) == 1, 60, "the real report's dead letter")

    [letter] = _letters(ledger)
    assert (letter["reason_code"], letter["event_id"]) == ("opening-conflict", real)
    assert ledger.operation("op-refund-7").machine_name == "email-send"

    reader = with_user(database_url, "recovery_reader")
    listed = recoveryctl("incidents", "--json", "--database-url", reader)
    assert listed.returncode == 0, listed.stderr
    [incident] = json.loads(listed.stdout)["incidents"]
    assert incident["kind"] == "opening-conflict"
    assert incident["operation_id"] == "op-refund-7"
    assert incident["differs"] == ["machine", "scope", "agent"]
    assert (incident["opened"]["producer"], incident["opened"]["machine"]) == (
        "tool-2",
        "email-send",
    )
    assert incident["claimed"]["producer"] == "tool-1"
    assert incident["claimed"]["event_id"] == real
    assert incident["chain"].startswith(f"intake:{group}:")

    text = recoveryctl("incidents", "--operation", "op-refund-7", "--database-url", reader)
    assert text.returncode == 0, text.stderr
    assert "INCIDENT opening-conflict on operation op-refund-7" in text.stdout
    rows = [line.split() for line in text.stdout.splitlines()]
    assert ["machine", "email-send", "payment-refund", "<-", "differs"] in rows
    assert ["producer", "tool-2", "tool-1"] in rows
    none = recoveryctl("incidents", "--operation", "op-other", "--database-url", reader)
    assert "no security incidents recorded" in none.stdout

    # The incident is on the audit chain, which stays intact.
    key = str(ensure_controller_key())
    verified = recoveryctl(
        "audit", "verify", "--key-file", key, "--json", "--database-url", database_url
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["intact"] is True
