"""`recovery.evidence`: the verification results the controller accepted, published
through the outbox by the real relay, keyed by operation (DESIGN: "the outbox emits
capability-invocation commands, evidence events and an audit stream")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger
from machines import EvidencePayload
from producers.relay import OutboxRelay
from schemas import AvroSingleObjectCodec, TopicNames
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
from tests.integration.consumer.test_dead_letter_bytes import _read
from tests.support.kafka import TopicFactory


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    return write_policy(tmp_path, Ed25519PrivateKey.generate())


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def test_accepted_verification_is_published_as_an_evidence_event(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=1)
    names = TopicNames(
        events=topic,
        commands=topic_factory(1),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    tool = Tool(kafka_bootstrap, topic)
    tool.event("payment-refund", "op-e", "TOOL_TIMEOUT")
    found = EvidencePayload(outcome="applied", verifier=VERIFIER, reference="verification-7")
    event_id = tool.event("payment-refund", "op-e", "VERIFICATION_FOUND", evidence=found)
    # From a producer not granted verifier: refused at intake, never republished.
    untrusted = EvidencePayload(outcome="applied", verifier="nobody", reference="v-x")
    tool.event("payment-refund", "op-u", "TOOL_TIMEOUT")
    tool.event("payment-refund", "op-u", "VERIFICATION_FOUND", evidence=untrusted)
    tool.close()
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, "evidence-group")
    with running(settings, ledger):
        wait_for(lambda: ledger.offsets(settings.group_id, topic) == {0: 4}, 60, "4 decided")
    assert ledger.operation("op-e").state == "completed"
    rows = [r for r in outbox(ledger) if r.topic == "recovery.evidence"]
    assert [r.key for r in rows] == ["op-e"]
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=names)
    for _ in range(100):
        if relay.relay_once().leased == 0:
            break
    (message,) = _read(kafka_bootstrap, names.evidence, 1)
    assert message.key() == b"op-e"
    name, record = AvroSingleObjectCodec().decode(message.value())
    assert name == "recovery.EvidenceEvent"
    decision = ledger.decisions("op-e")[1]
    assert record["evidence_id"] == f"evidence:op-e:{decision['sequence']}:verification"
    assert (record["operation_id"], record["source_event_id"]) == ("op-e", event_id)
    assert (record["outcome"], record["verifier"], record["reference"]) == (
        "applied",
        VERIFIER,
        "verification-7",
    )
    assert (record["machine_name"], record["machine_version"]) == ("payment-refund", "1.0.0")
    assert record["producer"] == VERIFIER  # the authenticated signer
    assert record["correlation_id"] == "corr-op-e"
