"""A never-seen child of a contained parent, through the real broker and PostgreSQL: its
first batch is decided with the lineage the ledger links it into (CONFORMANCE L5.5, "a
descendant that first appears after its ancestor was contained is contained on
arrival"), so no event of that batch can set it going again before the arrival event
reaches it.

The parent (a delegated research task) is contained first. Then, with no controller
running, the child, a procurement request opened with an idempotency key, reports a
timeout and a trusted verifier reports the request not applied: the stream that retries
for an operation with no lineage (`tests/integration/consumer/test_declared_facts.py`).
Both events wait on the partition, so the next controller takes them in one batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from consumer import ControllerSettings
from ledger import Ledger, PostgresLedger
from machines import EvidencePayload, Lineage
from machines.event import DeclaredFacts, Scope
from producers import EventPublisher, RecoveryClient
from producers.relay import OutboxRelay
from schemas import TopicNames
from tests.integration.consumer.harness import (
    VERIFIER,
    open_ledger,
    running,
    settings_for,
    wait_for,
    write_policy,
)
from tests.support.kafka import TopicFactory
from tests.support.producers import signers
from tests.support.scopes import catalogue_scope

pytestmark = pytest.mark.integration

PARENT, CHILD = "research-parent", "procurement-child"
FACTS = DeclaredFacts(idempotency_key="pr-child-0001", status_api=True)
SCOPE = Scope(capability="procurement.create-request", tool="coupa", environment="production")
NOT_FOUND = EvidencePayload(outcome="not_applied", verifier=VERIFIER, reference="coupa:404")


@pytest.fixture
def ledger(database_url: str) -> Iterator[PostgresLedger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _publish(bootstrap: str, topics: TopicNames, producer: str, **fields: Any) -> None:
    publisher = EventPublisher(bootstrap, signer=signers(), topics=topics)
    try:
        RecoveryClient(publisher, producer).publish_event(
            evidence_ref=f"ref-{uuid.uuid4().hex[:8]}",
            event_time=datetime.now(UTC),
            **fields,
        )
    finally:
        publisher.close(30)


def _parent_event(bootstrap: str, topics: TopicNames) -> None:
    _publish(
        bootstrap,
        topics,
        "idp-integration",
        event_type="AUTHORIZATION_DENIED",
        operation_id=PARENT,
        correlation_id="corr-tree",
        machine_name="delegated-research",
        machine_version="1.0.0",
        lineage=Lineage(
            agent="research-orchestrator",
            task="task-parent",
            initiating_principal="alice",
            delegated_credentials=("cred-parent",),
        ),
        scope=catalogue_scope("delegated-research"),
    )


def _child_event(bootstrap: str, topics: TopicNames, producer: str, **fields: Any) -> None:
    _publish(
        bootstrap,
        topics,
        producer,
        operation_id=CHILD,
        correlation_id="corr-tree",
        machine_name="procurement-request",
        machine_version="1.0.0",
        lineage=Lineage(
            agent="procurement-agent",
            task="task-child",
            initiating_principal="alice",
            origin_operation=PARENT,
            parent_operation=PARENT,
            delegated_credentials=("cred-child",),
        ),
        **fields,
    )


def _settings(
    bootstrap: str, database_url: str, topics: TopicNames, policy: Path, group: str
) -> ControllerSettings:
    base = settings_for(bootstrap, database_url, topics.events, policy, group)
    return base.model_copy(update={"topics": topics})


def _retry_commands(ledger: Ledger, operation: str) -> list[str]:
    return [
        i["capability"]
        for d in ledger.decisions(operation)
        for i in d["invocations"]
        if i["kind"] == "retry"
    ]


def test_a_new_child_of_a_contained_parent_never_retries_in_its_first_batch(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    tmp_path: Path,
) -> None:
    topics = TopicNames(
        events=topic_factory(1),
        commands=topic_factory(1),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    policy = write_policy(tmp_path, Ed25519PrivateKey.generate())
    group = f"controller-{uuid.uuid4().hex[:8]}"
    settings = _settings(kafka_bootstrap, database_url, topics, policy, group)

    _parent_event(kafka_bootstrap, topics)
    with running(settings, ledger):
        wait_for(lambda: _containing(ledger, PARENT), 60, "the parent contained")

    # The child's two events wait on the partition while no controller runs: the next
    # one consumes them together.
    _child_event(
        kafka_bootstrap,
        topics,
        "coupa-integration",
        event_type="TOOL_TIMEOUT",
        facts=FACTS,
        scope=SCOPE,
    )
    _child_event(
        kafka_bootstrap, topics, VERIFIER, event_type="VERIFICATION_NOT_FOUND", evidence=NOT_FOUND
    )
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=topics)
    with running(settings.model_copy(update={"instance_id": f"{group}-b"}), ledger):
        wait_for(lambda: len(ledger.decisions(CHILD)) >= 2, 60, "the child's first batch")
        first = ledger.decisions(CHILD)[:2]

        # The arrival event (ANCESTOR_CONTAINED) reaches the child through the relay.
        def arrived() -> bool:
            relay.relay_once()
            return len(ledger.decisions(CHILD)) >= 3

        wait_for(arrived, 60, "the child's ANCESTOR_CONTAINED decided")

    assert [d["event"]["type"] for d in first] == ["TOOL_TIMEOUT", "VERIFICATION_NOT_FOUND"]
    # One batch: the controller stamps every decision of a batch with the same time.
    assert first[0]["decided_at"] == first[1]["decided_at"]
    # Decided with the parent contained: the retry gate saw it and the request escalated.
    not_found = first[1]
    gate = [g for g in not_found["guards"] if g["guard"] == "retry.permitted"]
    assert gate, not_found["guards"]
    assert not gate[0]["value"], not_found["guards"]
    assert f"contained:{PARENT}" in gate[0]["evidence"]
    assert not_found["state_after"] == "escalated"
    assert _retry_commands(ledger, CHILD) == []
    arrival = ledger.decisions(CHILD)[2]
    assert arrival["event"]["type"] == "ANCESTOR_CONTAINED"
    assert _retry_commands(ledger, CHILD) == []
    child = ledger.lineage(CHILD)
    assert child.ancestors == (PARENT,)
    assert child.contained_ancestors == (PARENT,)
    assert ledger.load_views([CHILD])[CHILD].lineage.contained_ancestors == (PARENT,)
    assert ledger.verify_audit() == ()


def _containing(ledger: Ledger, operation: str) -> bool:
    return operation in ledger.audit_operation_ids() and ledger.lineage(operation).containing
