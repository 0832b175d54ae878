"""Declared tool facts and scope through the real broker and PostgreSQL: a procurement
request opened with an idempotency key is retried once a trusted verifier finds it was
not applied (the path that could not fire while the envelope carried no facts), the same
stream without facts escalates, and a scope outside the machine's `applies_to` is
dead-lettered as `machine-not-applicable`."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger
from machines import EvidencePayload
from machines.event import DeclaredFacts, Scope
from tests.integration.consumer.harness import (
    VERIFIER,
    Tool,
    open_ledger,
    outbox,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory

MACHINE = "procurement-request"
NOT_FOUND = EvidencePayload(outcome="not_applied", verifier=VERIFIER, reference="coupa:status:404")
FACTS = DeclaredFacts(idempotency_key="pr-2026-0042", status_api=True)
SCOPE = Scope(capability="procurement.create-request", tool="coupa", environment="production")


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _decided_twice(ledger: Ledger, operation: str) -> Callable[[], bool]:
    return lambda: len(ledger.decisions(operation)) == 2


def _commands(ledger: Ledger, operation: str) -> list[str]:
    rows = outbox(ledger)
    return [
        r.payload["capability"]
        for r in rows
        if r.topic == "recovery.commands" and r.key == operation
    ]


def test_a_request_opened_with_facts_is_retried_after_trusted_not_applied_evidence(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=1)
    tool = Tool(kafka_bootstrap, topic, producer="coupa-integration")
    verifier = Tool(kafka_bootstrap, topic, producer=VERIFIER)
    declared, bare, elsewhere = "op-pr-declared", "op-pr-bare", "op-pr-elsewhere"
    tool.event(MACHINE, declared, "TOOL_TIMEOUT", facts=FACTS, scope=SCOPE)
    tool.event(MACHINE, bare, "TOOL_TIMEOUT", scope=SCOPE)
    wrong_env = Scope(capability=SCOPE.capability, tool="coupa", environment="development")
    tool.event(MACHINE, elsewhere, "TOOL_TIMEOUT", facts=FACTS, scope=wrong_env)
    tool.close()
    verifier.event(MACHINE, declared, "VERIFICATION_NOT_FOUND", evidence=NOT_FOUND)
    verifier.event(MACHINE, bare, "VERIFICATION_NOT_FOUND", evidence=NOT_FOUND)
    verifier.close()
    settings = settings_for(
        kafka_bootstrap, database_url, topic, policy, f"controller-{uuid.uuid4().hex[:8]}"
    )
    with running(settings, ledger):
        for op in (declared, bare):
            wait_for(_decided_twice(ledger, op), 60, f"{op} decided twice")
        wait_for(
            lambda: any(r.topic == "recovery.dlq" for r in outbox(ledger)), 60, "a dead letter"
        )

    assert ledger.operation(declared).state == "retrying"
    assert _commands(ledger, declared) == [
        "procurement.verify-request",
        "procurement.create-request",
    ]
    # Every command carries the key the tool was first called with: the retry reuses it.
    keys = {
        r.payload["capability"]: r.payload["idempotency_key"]
        for r in outbox(ledger)
        if r.topic == "recovery.commands" and r.key == declared
    }
    assert keys == {
        "procurement.verify-request": FACTS.idempotency_key,
        "procurement.create-request": FACTS.idempotency_key,
    }
    first = ledger.decisions(declared)[0]
    assert first["evidence"]["facts"]["idempotency_key"] == FACTS.idempotency_key
    assert first["evidence"]["facts"]["declared_by"] == "coupa-integration"
    # The same stream without declared facts cannot retry: no idempotency key.
    assert ledger.operation(bare).state == "escalated"
    assert "procurement.create-request" not in _commands(ledger, bare)
    letters = [r for r in outbox(ledger) if r.topic == "recovery.dlq"]
    assert [r.payload["reason_code"] for r in letters] == ["machine-not-applicable"]
    assert "development" in letters[0].payload["reason"]
    assert ledger.decisions(elsewhere) == ()
    assert ledger.verify_audit() == ()
