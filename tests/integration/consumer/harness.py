"""Running real controllers against the test's broker and database, and reading back
what they wrote (through the ledger's own interface, never by poking at tables)."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from consumer import Controller, ControllerSettings, Telemetry, load_rules
from ledger import Ledger, OutboxRecord, PostgresLedger
from machines import Lineage
from producers import EventPublisher, RecoveryClient
from schemas import TopicNames
from tests.support.producers import roster_document, signers
from tests.support.scopes import catalogue_scope

APPROVER = "approver-1"
VERIFIER = "verifier-1"


def write_policy(folder: Path, approver_key: Ed25519PrivateKey) -> Path:
    """A policy trusting `verifier-1` and the approver `approver-1` with `approver_key`.
    Its retries are commanded at once: these tests run no relay, which a paced retry's
    timer event needs to come back (tests/integration/consumer/test_timers.py does)."""
    public = approver_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    policy = {
        "id": "controller-tests",
        "retry_pacing": {"base": "0s"},
        "trusted_verifiers": [VERIFIER],
        "producers": roster_document(),
        "approvers": [
            {
                "id": APPROVER,
                "public_key": base64.b64encode(public).decode("ascii"),
                "roles": ["recovery-approver"],
            }
        ],
    }
    path = folder / "policy.yaml"
    path.write_text(json.dumps(policy), encoding="utf-8")
    return path


def settings_for(
    bootstrap: str, database_url: str, topic: str, policy: Path, group: str, **extra: Any
) -> ControllerSettings:
    """Test settings: small batch waits and timeouts so tests stay fast. Demo mode
    unless `extra` says otherwise: the tests' roster speaks for any agent
    (`tests.support.producers.all_grants`), which the controller refuses outside it."""
    extra.setdefault("demo_mode", True)
    return ControllerSettings(
        bootstrap=bootstrap,
        database_url=database_url,
        group_id=group,
        instance_id=f"controller-{uuid.uuid4().hex[:6]}",
        topics=TopicNames(events=topic),
        batch_max_records=200,
        batch_max_wait_ms=50,
        session_timeout_ms=6000,
        backoff_initial_ms=50,
        backoff_max_ms=500,
        policy_path=policy,
        **extra,
    )


@dataclass
class Running:
    """A controller running in a thread of the test process."""

    controller: Controller
    stop: threading.Event
    thread: threading.Thread
    errors: list[BaseException] = field(default_factory=list)

    def wait_owned(self, partitions: int, timeout: float = 30.0) -> None:
        """Wait until the controller owns `partitions` partitions."""
        wait_for(lambda: len(self.controller.owned) >= partitions, timeout, "assignment")

    def wait_turned(self, timeout: float = 30.0) -> None:
        """Wait until the loop begins another turn: what the current turn does after its
        poll (the timer sweep of a turn that assigned partitions, say) is done."""
        turn = self.controller.last_step
        wait_for(lambda: self.controller.last_step != turn, timeout, "the loop's next turn")

    def halt(self) -> None:
        """Stop (SIGTERM's path) and wait for the member to leave the group."""
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the controller did not stop within 30 s"
        assert not self.errors, self.errors


@contextmanager
def running(
    settings: ControllerSettings, ledger: Ledger, telemetry: Telemetry | None = None
) -> Iterator[Running]:
    """Run a controller on `ledger` until the block ends."""
    machines, rules = load_rules(settings)
    controller = Controller(settings, ledger, machines=machines, rules=rules, telemetry=telemetry)
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            controller.run(stop)
        except BaseException as exc:  # surfaced by halt()
            errors.append(exc)

    thread = threading.Thread(target=target, name=settings.instance_id, daemon=True)
    handle = Running(controller, stop, thread, errors)
    thread.start()
    try:
        yield handle
    finally:
        if thread.is_alive():
            handle.halt()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `condition` every 50 ms until it holds; fail naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def outbox(ledger: Ledger) -> list[OutboxRecord]:
    """Every unpublished outbox row, in insertion order (the lease is left unmarked, so
    nothing is published by reading)."""
    with ledger.lease_outbox(100_000) as lease:
        return sorted(lease.records, key=lambda r: r.position)


def open_ledger(database_url: str) -> PostgresLedger:
    """A ledger on the test's database."""
    return PostgresLedger(database_url, max_size=4)


class Tool:
    """Publishes events as a tool would, through the client library."""

    def __init__(self, bootstrap: str, topic: str, producer: str = "tool-1") -> None:
        self.publisher = EventPublisher(
            bootstrap, signer=signers(), topics=TopicNames(events=topic)
        )
        self.client = RecoveryClient(self.publisher, producer)
        self.topic = topic

    def event(
        self,
        machine: str,
        operation: str,
        event_type: str,
        *,
        agent: str = "agent-1",
        version: str = "1.0.0",
        **fields: Any,
    ) -> str:
        """Publish one event of `machine`@`version` for `operation`, with a scope the
        catalogue machine applies to unless `scope` is given; returns its event id. A
        verification is signed by its verifier and a decision by its approver (the
        controller refuses an identity in an event that is not its signer's)."""
        fields.setdefault("scope", catalogue_scope(machine))
        client = self.client
        evidence, decision = fields.get("evidence"), fields.get("human_decision")
        if evidence is not None and evidence.verifier is not None:
            client = RecoveryClient(self.publisher, evidence.verifier)
        elif decision is not None:
            client = RecoveryClient(self.publisher, decision.approver)
        event = client.publish_event(
            event_type,
            operation_id=operation,
            correlation_id=f"corr-{operation}",
            machine_name=machine,
            machine_version=version,
            lineage=Lineage(agent=agent, task=f"task-{operation}", initiating_principal="alice"),
            evidence_ref=f"ref-{uuid.uuid4().hex[:8]}",
            event_time=datetime.now(UTC),
            **fields,
        )
        return event.event_id

    def raw(self, key: str, value: bytes, content_type: str) -> None:
        """Publish bytes as they are (hostile input)."""
        self.publisher.send(
            self.topic,
            key=key,
            value=value,
            record_id=f"raw:{uuid.uuid4().hex}",
            content_type=content_type,
            producer=self.client.producer,
        )

    def flush(self) -> None:
        self.publisher.flush(30)

    def close(self) -> None:
        self.publisher.close(30)
