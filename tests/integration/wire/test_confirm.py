"""A client publishes and confirms: it waits, bounded, for the controller's verdict on
its record from the audit topic, decided or dead-lettered with the reason, and believes
only what a roster controller signed; given the roster, it refuses to sign with a key
the roster does not list (issue #31: a tool signing with an unknown key printed
`published ...` and exited 0). Real broker, real PostgreSQL, the real relay."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import Ledger
from machines import Grant, Lineage, Role, Roster
from producers import (
    EventPublisher,
    OutboxRelay,
    ProducersError,
    RecoveryClient,
    VerdictTimeout,
)
from schemas import RecordSigner, TopicNames
from tests.integration.consumer.harness import (
    open_ledger,
    running,
    settings_for,
    write_policy,
)
from tests.support.commands import worker_roster
from tests.support.kafka import TopicFactory
from tests.support.producers import producer_entry, signers
from tests.support.scopes import catalogue_scope

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOOL = "tool-1"


@pytest.fixture
def topics(topic_factory: TopicFactory) -> TopicNames:
    return TopicNames(
        events=topic_factory(1),
        commands=topic_factory(1),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


@pytest.fixture
def runtime(
    kafka_bootstrap: str, database_url: str, ledger: Ledger, topics: TopicNames, tmp_path: Path
) -> Iterator[None]:
    """A controller and a relay on this test's topics, as `recoveryctl run` runs them."""
    policy = write_policy(tmp_path, Ed25519PrivateKey.generate())
    settings = settings_for(
        kafka_bootstrap, database_url, topics.events, policy, "confirm"
    ).model_copy(update={"topics": topics})
    relay = OutboxRelay(ledger, kafka_bootstrap, topics=topics)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    thread.start()
    try:
        with running(settings, ledger) as controller:
            controller.wait_owned(1)
            yield
    finally:
        stop.set()
        thread.join(timeout=30)


def _timeout(client: RecoveryClient, operation: str) -> object:
    return client.publish_event(
        "TOOL_TIMEOUT",
        operation_id=operation,
        correlation_id=f"corr-{operation}",
        machine_name="email-send",
        machine_version="1.0.0",
        lineage=Lineage(agent="agent-1", task=f"task-{operation}", initiating_principal="alice"),
        evidence_ref="smtp:call:1",
        scope=catalogue_scope("email-send"),
        event_time=datetime.now(UTC),
    )


def _tools_roster() -> Roster:
    """The controller's roster as a tool holds it (RECOVERY_ROSTER_FILE): the controller
    (role controller, the key verdicts must be signed with) and the tool (role tool)."""
    grant = Grant(role=Role.TOOL, capabilities=("*",), tools=("*",), environments=("*",))
    return worker_roster(producer_entry(TOOL, [grant]))


def _client(
    bootstrap: str, topics: TopicNames, signer: RecordSigner | None = None
) -> RecoveryClient:
    publisher = EventPublisher(
        bootstrap,
        signer=signer or signers()[TOOL],
        topics=topics,
        roster=_tools_roster(),
    )
    return RecoveryClient(publisher, TOOL)


@pytest.mark.usefixtures("runtime")
def test_a_decided_event_is_confirmed_with_its_states(
    kafka_bootstrap: str, topics: TopicNames
) -> None:
    client = _client(kafka_bootstrap, topics)
    try:
        event = _timeout(client, "op-confirmed")
        verdict = client.confirm(event, timeout=60)  # type: ignore[arg-type]
    finally:
        client.publisher.close()
    assert verdict.decided
    assert verdict.moved
    assert (verdict.state_before, verdict.state_after) == ("failure-reported", "unresolved")
    assert verdict.event_type == "TOOL_TIMEOUT"
    assert verdict.describe() == "decided: transitioned, failure-reported -> unresolved"


@pytest.mark.usefixtures("runtime")
def test_a_record_signed_with_an_unlisted_key_is_confirmed_dead_lettered_with_the_reason(
    kafka_bootstrap: str, topics: TopicNames
) -> None:
    stranger = RecordSigner(TOOL, Ed25519PrivateKey.generate())
    # Without the roster the publisher cannot know; the controller's verdict says it.
    publisher = EventPublisher(kafka_bootstrap, signer=stranger, topics=topics, roster=None)
    client = RecoveryClient(publisher, TOOL)
    try:
        event = _timeout(client, "op-stranger")
        publisher.roster = _tools_roster()  # to believe the verdict
        verdict = client.confirm(event, timeout=60)  # type: ignore[arg-type]
    finally:
        publisher.close()
    assert not verdict.decided
    assert verdict.outcome == "key-unknown"
    assert verdict.describe().startswith("dead-lettered: key-unknown: ")
    assert f"producer {TOOL} has no key" in verdict.reason


def test_given_the_roster_a_publisher_refuses_an_unlisted_key_before_signing(
    kafka_bootstrap: str, topics: TopicNames
) -> None:
    stranger = RecordSigner(TOOL, Ed25519PrivateKey.generate())
    with pytest.raises(ProducersError, match="key-unknown") as refused:
        _client(kafka_bootstrap, topics, stranger)
    assert "recoveryctl roster add" in str(refused.value)


def test_without_a_controller_confirm_gives_up_saying_what_to_check_and_believes_no_forgery(
    kafka_bootstrap: str, topics: TopicNames
) -> None:
    client = _client(kafka_bootstrap, topics)
    try:
        event = _timeout(client, "op-nobody")
        # A "verdict" on the audit topic that no controller signed: not believed.
        forged = {
            "metadata": {"event_code": "decision", "uid": "x"},
            "api": {"request": {"uid": event.event_id}},  # type: ignore[attr-defined]
            "unmapped": {
                "recovery": {
                    "chain": {"operation_id": "op-nobody"},
                    "record": {"outcome": "transitioned", "state_after": "completed"},
                }
            },
        }
        client.publisher.send(
            topics.audit,
            key="op-nobody",
            value=json.dumps(forged).encode(),
            record_id="forged:1",
            content_type="application/json",
            producer=TOOL,
        )
        client.publisher.flush(30)
        started = time.monotonic()
        with pytest.raises(VerdictTimeout) as waited:
            client.confirm(event, timeout=4)  # type: ignore[arg-type]
    finally:
        client.publisher.close()
    assert time.monotonic() - started < 15
    message = str(waited.value)
    assert "is a controller running" in message
    assert "1 of them not signed by a roster controller" in message
