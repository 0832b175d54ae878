"""Workers execute only what the controller signed (issue 14, "Signed output"), against
the real broker: a hand-built Avro CapabilityCommand (unsigned, signed by a key the
roster does not know, or by a roster producer that is not a controller) is refused and
never executed; records squatting the command ids the controller uses next are refused
too, so the controller's real agent.stop-task and credentials.revoke-delegation still
run."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from machines import Grant, ProducerEntry, ProducerKey, Role, public_key_text
from machines.event import Lineage
from producers import (
    ActionResult,
    CapabilityWorker,
    EventPublisher,
    RecoveryClient,
    WorkerStats,
)
from producers.errors import ProducersError
from schemas import CapabilityCommand, RecordSigner, TopicNames
from tests.support.commands import controller_signer, send_command, worker_roster
from tests.support.kafka import TopicFactory
from tests.support.producers import signers
from tests.support.roles import poll_until
from tests.support.worker import fresh_store

pytestmark = pytest.mark.integration


def _command(command_id: str, capability: str, kind: str, op: str = "op-1") -> CapabilityCommand:
    return CapabilityCommand(
        command_id=command_id,
        capability=capability,
        kind=kind,
        material=False,
        params={"scope": "task"},
        origin="transition",
        operation_id=op,
        correlation_id="corr-1",
        causation_event_id="evt-1",
        machine_name="delegated-research",
        machine_version="1.0.0",
        machine_digest="sha256:m",
        sequence=2,
        lineage=Lineage(
            agent="agent-7",
            task="task-3",
            initiating_principal="alice",
            delegated_credentials=("cred-1",),
        ),
        issued_at=datetime(2026, 11, 30, 3, 0, tzinfo=UTC),
    )


@dataclass
class Executed:
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)

    def handler(self, capability: str) -> Callable[[CapabilityCommand], ActionResult | None]:
        def run(command: CapabilityCommand) -> ActionResult | None:
            with self.lock:
                self.calls.append(
                    (capability, command.command_id, command.lineage.delegated_credentials)
                )
            return None

        return run

    def snapshot(self) -> list[tuple[str, str, tuple[str, ...]]]:
        with self.lock:
            return list(self.calls)


@contextmanager
def _worker(
    bootstrap: str, topics: TopicNames, executed: Executed, **kw: object
) -> Iterator[list[WorkerStats]]:
    stats: list[WorkerStats] = []
    stop = threading.Event()
    with EventPublisher(bootstrap, signer=signers(), topics=topics) as publisher:
        worker = CapabilityWorker(
            bootstrap,
            f"workers-{topics.commands}",
            RecoveryClient(publisher, producer="worker-containment"),
            {
                "agent.stop-task": executed.handler("agent.stop-task"),
                "credentials.revoke-delegation": executed.handler("credentials.revoke-delegation"),
            },
            topics=topics,
            poll_timeout=0.2,
            store=fresh_store(),
            start="earliest",
            **kw,  # type: ignore[arg-type]
        )
        thread = threading.Thread(target=lambda: stats.append(worker.run(stop)))
        thread.start()
        try:
            yield stats
        finally:
            stop.set()
            thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_hand_built_command_is_refused_with_its_reason_and_never_executed(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topics = TopicNames(events=topic_factory(), commands=topic_factory())
    attacker = Ed25519PrivateKey.generate()
    tool_key = Ed25519PrivateKey.generate()
    tool = ProducerEntry(
        id="tool.research",
        keys=(ProducerKey(public_key=public_key_text(tool_key.public_key())),),
        grants=(Grant(role=Role.TOOL, capabilities=("*",), tools=("*",), agents=("*",)),),
    )
    with EventPublisher(kafka_bootstrap, signer=None, topics=topics) as publisher:
        send_command(publisher, topics.commands, _command("op-1/9/0", "agent.stop-task", "stop"))
        forged = RecordSigner("recovery-controller", attacker)
        send_command(
            publisher, topics.commands, _command("op-1/9/1", "agent.stop-task", "stop"), forged
        )
        as_tool = RecordSigner("tool.research", tool_key)
        send_command(
            publisher, topics.commands, _command("op-1/9/2", "agent.stop-task", "stop"), as_tool
        )
        # The controller's own command, last: once it ran, the forgeries were seen.
        real = _command("op-1/9/3", "agent.stop-task", "stop")
        send_command(publisher, topics.commands, real, controller_signer())
    executed = Executed()
    with _worker(kafka_bootstrap, topics, executed, roster=worker_roster(tool)) as stats:
        poll_until(lambda: len(executed.snapshot()) >= 1, 60, "the signed command executed")
    assert [c[1] for c in executed.snapshot()] == ["op-1/9/3"]
    [run] = stats
    assert run.executed == 1
    assert dict(run.refused) == {
        "signature-missing": 1,
        "key-unknown": 1,
        "role-not-permitted": 1,
    }


def test_squatted_command_ids_are_refused_and_the_real_commands_still_execute(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topics = TopicNames(events=topic_factory(), commands=topic_factory())
    attacker = RecordSigner("recovery-controller", Ed25519PrivateKey.generate())
    stop_id, revoke_id = "op-7/2/0", "op-7/2/1"
    with EventPublisher(kafka_bootstrap, signer=None, topics=topics) as publisher:
        # Pre-published under the ids the controller will use next, unsigned and forged.
        for command_id, capability in ((stop_id, "agent.stop-task"), (revoke_id, "x.noop")):
            squat = _command(command_id, capability, "stop", op="op-7")
            send_command(publisher, topics.commands, squat)
            send_command(publisher, topics.commands, squat, attacker)
        # Then the controller's own commands under those ids.
        stop = _command(stop_id, "agent.stop-task", "stop", op="op-7")
        revoke = _command(revoke_id, "credentials.revoke-delegation", "revoke", op="op-7")
        for command in (stop, revoke):
            send_command(publisher, topics.commands, command, controller_signer())
    executed = Executed()
    with _worker(kafka_bootstrap, topics, executed, roster=worker_roster()) as stats:
        poll_until(lambda: len(executed.snapshot()) >= 2, 60, "both real commands executed")
    assert executed.snapshot() == [
        ("agent.stop-task", stop_id, ("cred-1",)),
        ("credentials.revoke-delegation", revoke_id, ("cred-1",)),
    ]
    [run] = stats
    assert (run.executed, run.duplicates) == (2, 0)
    assert dict(run.refused) == {"signature-missing": 2, "key-unknown": 2}


def test_a_worker_without_a_roster_naming_a_controller_refuses_to_start(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RECOVERY_ROSTER_FILE", raising=False)
    with EventPublisher(kafka_bootstrap, signer=signers()) as publisher:
        client = RecoveryClient(publisher, producer="worker-x")
        with pytest.raises(ProducersError, match="RECOVERY_ROSTER_FILE"):
            CapabilityWorker(kafka_bootstrap, "g", client, {})
        tool_only = worker_roster().model_copy(update={"producers": ()})
        with pytest.raises(ProducersError, match="no producer with role `controller`"):
            CapabilityWorker(kafka_bootstrap, "g", client, {}, roster=tool_only)
