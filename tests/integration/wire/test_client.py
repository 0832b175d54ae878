"""The client library against the real broker: what it publishes decodes back to the same
event, with the wire headers, and signed decisions verify with machines.approvals."""

from __future__ import annotations

import base64
import socket
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from opentelemetry.sdk.trace import TracerProvider

from machines.approvals import insecure_test_key, public_key_b64, signing_payload
from machines.event import EvidencePayload, Lineage
from producers import DeliveryFailed, EventPublisher, RecoveryClient, event_record_id
from schemas import (
    CONTENT_TYPE_AVRO,
    CONTENT_TYPE_JSON,
    EVENT_ENVELOPE,
    TopicNames,
    WireDecoder,
    default_catalog,
    record_to_event,
)
from tests.integration.wire.kafka_read import headers_of, read_messages
from tests.support.kafka import TopicFactory
from tests.support.producers import signers

pytestmark = pytest.mark.integration

LINEAGE = Lineage(agent="agent-7", task="task-3", initiating_principal="alice@example.com")


def _topics(events: str) -> TopicNames:
    return TopicNames(events=events)


def _tool_event(client: RecoveryClient, event_id: str) -> object:
    return client.publish_event(
        "TOOL_TIMEOUT",
        event_id=event_id,
        operation_id="op-17",
        correlation_id="corr-1",
        machine_name="email-send",
        machine_version="1.0.0",
        lineage=LINEAGE,
        evidence_ref="smtp-log:42",
        evidence=EvidencePayload(outcome="unknown", verifier="smtp-relay"),
    )


def test_a_published_event_decodes_back_to_an_equal_event_with_wire_headers(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    events = topic_factory(3)
    tracer = TracerProvider().get_tracer("test")
    with EventPublisher(kafka_bootstrap, signer=signers(), topics=_topics(events)) as publisher:
        client = RecoveryClient(publisher, producer="smtp-relay")
        with tracer.start_as_current_span("tool call") as span:
            sent = _tool_event(client, "evt-1")
            trace_id = format(span.get_span_context().trace_id, "032x")

    [message] = read_messages(kafka_bootstrap, events, 1)
    headers = headers_of(message)
    name, record = WireDecoder().decode(message.value(), headers["content-type"])
    assert name == EVENT_ENVELOPE
    assert record_to_event(record) == sent
    assert message.key() == b"op-17"
    assert headers["content-type"] == CONTENT_TYPE_AVRO
    assert headers["recovery-schema"] == default_catalog().current(EVENT_ENVELOPE).fingerprint_hex
    assert headers["recovery-record-id"] == event_record_id(sent)  # type: ignore[arg-type]
    assert headers["traceparent"].split("-")[1] == trace_id


def test_republishing_an_event_repeats_its_record_id_and_json_mode_sends_json(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    events = topic_factory()
    with EventPublisher(
        kafka_bootstrap, signer=signers(), topics=_topics(events), use_json=True
    ) as publisher:
        client = RecoveryClient(publisher, producer="smtp-relay")
        event = client.build_event(
            "TOOL_FAILED",
            event_id="evt-2",
            operation_id="op-18",
            correlation_id="corr-2",
            machine_name="email-send",
            machine_version="1.0.0",
            lineage=LINEAGE,
            evidence_ref="smtp-log:43",
        )
        publisher.publish(event)
        publisher.publish(event)

    first, second = read_messages(kafka_bootstrap, events, 2)
    assert headers_of(first)["recovery-record-id"] == headers_of(second)["recovery-record-id"]
    assert headers_of(first)["content-type"] == CONTENT_TYPE_JSON
    assert "recovery-schema" not in headers_of(first)
    _, record = WireDecoder().decode(second.value(), CONTENT_TYPE_JSON)
    assert record_to_event(record) == event


def test_a_published_human_decision_carries_a_signature_that_verifies(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    events = topic_factory()
    key = insecure_test_key("approver-bob")
    expires = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=15)
    with EventPublisher(kafka_bootstrap, signer=signers(), topics=_topics(events)) as publisher:
        client = RecoveryClient(publisher, producer="bob")
        sent = client.publish_human_decision(
            private_key=key,
            verdict="approved",
            operation_id="op-17",
            correlation_id="corr-1",
            machine_name="email-send",
            machine_version="1.0.0",
            machine_digest="sha256:abc",
            state="unresolved",
            transition="resume-pending",
            lineage=LINEAGE,
            expires_at=expires,
        )

    [message] = read_messages(kafka_bootstrap, events, 1)
    event = record_to_event(WireDecoder().decode(message.value(), None)[1])
    assert event == sent
    assert event.event_type == "HUMAN_APPROVED"
    decision = event.human_decision
    assert decision is not None
    assert (decision.approver, decision.state, decision.expires_at) == (
        "bob",
        "unresolved",
        expires,
    )
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64(key)))
    public.verify(base64.b64decode(decision.signature), signing_payload(decision))
    # A single changed field breaks it: the signature binds the state.
    tampered = replace(decision, state="contained")
    with pytest.raises(InvalidSignature):
        public.verify(base64.b64decode(tampered.signature), signing_payload(tampered))


def test_undelivered_records_are_reported_by_flush_with_their_record_ids() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    publisher = EventPublisher(
        f"127.0.0.1:{port}",
        signer=signers(),
        topics=_topics("nowhere"),
        producer_config={"delivery.timeout.ms": 1500, "socket.connection.setup.timeout.ms": 1000},
    )
    client = RecoveryClient(publisher, producer="smtp-relay")
    event = _tool_event(client, "evt-lost")
    with pytest.raises(DeliveryFailed) as info:
        publisher.flush(timeout=10)
    assert [rid for rid, _ in info.value.failures] == [event_record_id(event)]  # type: ignore[arg-type]
    assert "publish them again" in str(info.value)
    assert publisher.pending == 0
