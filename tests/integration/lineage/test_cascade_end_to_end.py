"""Multi-agent recovery end to end (CONFORMANCE Level 5, "descendant-task cancellation"),
through the real broker and PostgreSQL with `python -m consumer` and the outbox relay
running as child processes and a capability worker in a thread.

A research orchestrator delegates to three workers, each of which delegates to three
more (13 operations over four partitions, every hop with its own delegated credential;
the grandchildren are reported before their parents). The root is escalated and a
research lead rejects it, which contains it: the controller cascades ANCESTOR_CONTAINED
to every descendant through the outbox and is killed with SIGKILL in the middle of the
cascade, then restarted. Every operation ends contained, each credential is revoked by
exactly one command, separately from the stop commands, a descendant reported after
the containment is contained on arrival, and nobody inside the tree can resume or
approve while the root stays contained.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ledger import Ledger, PostgresLedger, UnknownOperation
from machines import Lineage, review_digest
from machines.event import CheckpointReport, EvidencePayload
from ops.commands.lineage import lineage_report
from producers import EventPublisher, RecoveryClient
from producers.worker import ActionResult, CapabilityWorker
from schemas import CapabilityCommand, TopicNames
from tests.integration.lineage.children import Child, log_tail, wait_until
from tests.support.commands import worker_roster
from tests.support.kafka import TopicFactory
from tests.support.producers import roster_document, signers
from tests.support.scopes import catalogue_scope
from tests.support.worker import fresh_store

pytestmark = pytest.mark.integration

MACHINE, VERSION = "delegated-research", "1.0.0"
ORCHESTRATOR, WORKER = "research-orchestrator", "research-worker"
LEAD, VERIFIER = "research-lead", "verifier-1"
CHILDREN = [f"c{i}" for i in range(3)]
GRANDCHILDREN = [f"c{i}g{j}" for i in range(3) for j in range(3)]
LATE = "c0g0late"


def _parent(op: str) -> str | None:
    if op == "root":
        return None
    if op == LATE:
        return "c0g0"
    return "root" if "g" not in op else op.split("g")[0]


def _lineage(op: str) -> Lineage:
    parent = _parent(op)
    return Lineage(
        agent=ORCHESTRATOR if op == "root" else WORKER,
        task=f"task-{op}",
        initiating_principal="alice@example.com",
        origin_operation=None if parent is None else "root",
        parent_operation=parent,
        delegated_credentials=(f"cred-{op}",),
    )


@dataclass
class Revocations:
    """What the credentials worker was asked to revoke, by command id."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    commands: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    stops: dict[str, str] = field(default_factory=dict)

    def stop(self, command: CapabilityCommand) -> ActionResult:
        with self.lock:
            self.stops[command.command_id] = command.operation_id
        return ActionResult(succeeded=True)

    def revoke(self, command: CapabilityCommand) -> ActionResult:
        # Reported like the stop: a containment is complete when both have answered.
        with self.lock:
            self.commands[command.command_id] = (
                command.operation_id,
                tuple(command.lineage.delegated_credentials),
            )
        return ActionResult(succeeded=True)


@dataclass
class Stack:
    bootstrap: str
    ledger: Ledger
    topics: TopicNames
    env: dict[str, str]
    logs: Path
    keys: dict[str, Ed25519PrivateKey]
    processes: list[Child] = field(default_factory=list)

    def start(self, role: str) -> Child:
        process = Child(role, self.env, self.logs / f"{role}.log")
        self.processes.append(process)
        return process

    def client(self, producer: str) -> RecoveryClient:
        return RecoveryClient(
            EventPublisher(self.bootstrap, signer=signers(), topics=self.topics), producer
        )

    def state(self, op: str) -> str:
        """The operation's state, or "unknown" before its first batch is stored."""
        try:
            return self.ledger.operation(op).state
        except UnknownOperation:
            return "unknown"

    def decisions(self, op: str) -> tuple[Any, ...]:
        return tuple(self.ledger.decisions(op))


def _policy(folder: Path, keys: dict[str, Ed25519PrivateKey]) -> Path:
    approvers = [
        {
            "id": name,
            "public_key": base64.b64encode(
                key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            ).decode("ascii"),
            "roles": ["recovery-approver"],
        }
        for name, key in keys.items()
    ]
    policy = {
        "id": "lineage-e2e",
        "trusted_verifiers": [VERIFIER],
        "approvers": approvers,
        "producers": roster_document(),
    }
    path = folder / "policy.yaml"
    path.write_text(json.dumps(policy), encoding="utf-8")
    return path


@pytest.fixture
def stack(
    kafka_bootstrap: str, topic_factory: TopicFactory, database_url: str, tmp_path: Path
) -> Iterator[Stack]:
    topics = TopicNames(
        events=topic_factory(4),
        commands=topic_factory(2),
        evidence=topic_factory(1),
        audit=topic_factory(1),
        dlq=topic_factory(1),
    )
    # The orchestrator's and the workers' agents are registered approvers too: their
    # approvals must be refused for being inside the tree, not for being unknown.
    keys = {name: Ed25519PrivateKey.generate() for name in (LEAD, ORCHESTRATOR, WORKER)}
    env = {
        "RECOVERY_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "RECOVERY_DATABASE_URL": database_url,
        "RECOVERY_CONTROLLER_GROUP_ID": f"lineage-{uuid.uuid4().hex[:8]}",
        "RECOVERY_CONTROLLER_POLICY_PATH": str(_policy(tmp_path, keys)),
        # The tests' roster speaks for any agent: a demo deployment.
        "RECOVERY_DEMO_MODE": "1",
        # One record per batch: the cascade takes many commits, so a kill lands inside it.
        "RECOVERY_CONTROLLER_BATCH_MAX_RECORDS": "1",
        "RECOVERY_CONTROLLER_BATCH_MAX_WAIT_MS": "50",
        "RECOVERY_CONTROLLER_SESSION_TIMEOUT_MS": "6000",
        "RECOVERY_CONTROLLER_BACKOFF_INITIAL_MS": "50",
        "RECOVERY_CONTROLLER_BACKOFF_MAX_MS": "500",
        **{
            f"RECOVERY_TOPIC_{s.upper()}": getattr(topics, s)
            for s in ("events", "commands", "evidence", "audit", "dlq")
        },
    }
    ledger = PostgresLedger(database_url, max_size=2)
    built = Stack(kafka_bootstrap, ledger, topics, env, tmp_path, keys)
    try:
        yield built
    finally:
        for process in built.processes:
            process.stop()
        ledger.close()


def _report(client: RecoveryClient, op: str, event_type: str, **fields: Any) -> str:
    event = client.publish_event(
        event_type,
        operation_id=op,
        correlation_id="corr-research-1",
        machine_name=MACHINE,
        machine_version=VERSION,
        lineage=_lineage(op),
        evidence_ref=f"ref-{uuid.uuid4().hex[:8]}",
        event_time=datetime.now(UTC),
        scope=fields.pop("scope", catalogue_scope(MACHINE)),
        **fields,
    )
    client.flush()
    return event.event_id


def _decide(stack: Stack, client: RecoveryClient, op: str, event_type: str, **fields: Any) -> Any:
    """Publish one event for `op` and return its decision record once committed."""
    event_id = _report(client, op, event_type, **fields)

    def found() -> Any:
        return next((d for d in stack.decisions(op) if d["event"]["id"] == event_id), None)

    wait_until(lambda: found() is not None, 60, f"the decision of {event_type} on {op}")
    return found()


def _human(stack: Stack, approver: str, op: str, verdict: str, state: str, transition: str) -> Any:
    client = stack.client(approver)
    event = client.publish_human_decision(
        private_key=stack.keys[approver],
        verdict=verdict,  # type: ignore[arg-type]
        operation_id=op,
        correlation_id="corr-research-1",
        machine_name=MACHINE,
        machine_version=VERSION,
        machine_digest=stack.ledger.operation(op).machine_digest,
        state=state,
        transition=transition,
        lineage=_lineage(op),
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        # Reviewed on the operation as the ledger holds it (what a review packet shows).
        reviewed_digest=review_digest(
            stack.ledger.load_views([op])[op], transition, datetime.now(UTC)
        ),
    )
    client.flush()
    client.publisher.close()
    wait_until(
        lambda: any(d["event"]["id"] == event.event_id for d in stack.decisions(op)),
        60,
        f"the decision of {approver}'s {verdict} on {op}",
    )
    return next(d for d in stack.decisions(op) if d["event"]["id"] == event.event_id)


def _unpublished(ledger: Ledger) -> list[str]:
    with ledger.lease_outbox(100_000) as lease:
        return [r.record_id for r in lease.records]


def test_descendant_task_cancellation_cascades_through_a_killed_controller_and_nobody_resumes(
    stack: Stack,
) -> None:
    tree = ["root", *CHILDREN, *GRANDCHILDREN]
    controller = stack.start("controller")
    relay = stack.start("relay")
    revocations = Revocations()
    worker_client = stack.client("capability-worker")
    worker = CapabilityWorker(
        stack.bootstrap,
        f"workers-{uuid.uuid4().hex[:6]}",
        worker_client,
        {"agent.stop-task": revocations.stop, "credentials.revoke-delegation": revocations.revoke},
        topics=stack.topics,
        roster=worker_roster(),
        store=fresh_store(),
        start="earliest",
    )
    stop_worker = threading.Event()
    worker_thread = threading.Thread(target=worker.run, args=(stop_worker,), daemon=True)
    worker_thread.start()
    tool = stack.client("research-tool")
    try:
        controller.wait_assigned(60)
        # Grandchildren first: they are linked when their parents arrive.
        for op in [*GRANDCHILDREN, *CHILDREN, "root"]:
            _report(tool, op, "STEP_FAILED")
        wait_until(
            lambda: all(stack.decisions(op) for op in tree),
            90,
            "every operation of the tree decided",
            detail=lambda: log_tail(controller.log_path),
        )
        linked = stack.ledger.lineage("c2g1")
        assert (linked.ancestors, linked.lineage_agents) == (("c2", "root"), (WORKER, ORCHESTRATOR))
        assert [r.operation_id for r in stack.ledger.lineage_tree("root")][:4] == [
            "root",
            *CHILDREN,
        ]

        verifier = stack.client(VERIFIER)
        unavailable = EvidencePayload(verifier=VERIFIER, outcome="unknown")
        assert (
            _decide(stack, verifier, "root", "VERIFICATION_UNAVAILABLE", evidence=unavailable)[
                "state_after"
            ]
            == "escalated"
        )
        # Kill -9 the relay first, so that the root's containment commits with its
        # cascade events held in the outbox, then the controller: the restarted pair
        # must publish and apply the whole cascade from the outbox and the stored
        # offsets. (Killing the controller once a first descendant was reached, as this
        # test did, let the whole cascade land before the kill on fast runs.)
        relay.kill()
        rejection = _human(stack, LEAD, "root", "rejected", "escalated", "containing")
        assert rejection["state_after"] == "containing"
        descendants = [op for op in tree if op != "root"]

        def reached() -> int:
            return sum(stack.state(op) in ("containing", "contained") for op in descendants)

        at_kill = reached()
        assert at_kill == 0, "no cascade event can arrive while the relay is down"
        controller.kill()
        controller = stack.start("controller")
        stack.start("relay")
        controller.wait_assigned(60)
        _report(tool, LATE, "STEP_FAILED")  # first seen below a contained ancestor
        everyone = [*tree, LATE]
        wait_until(
            lambda: all(stack.state(op) == "contained" for op in everyone),
            120,
            "every operation contained",
            detail=lambda: (
                str({op: stack.state(op) for op in everyone}) + "\n" + log_tail(controller.log_path)
            ),
        )

        # Stop and revoke are separate commands; each credential is revoked exactly once.
        with revocations.lock:
            revoked = dict(revocations.commands)
            stopped = dict(revocations.stops)
        assert sorted(stopped.values()) == sorted(everyone)
        credentials = [c for _, creds in revoked.values() for c in creds]
        assert sorted(credentials) == sorted(f"cred-{op}" for op in everyone)
        assert set(revoked).isdisjoint(stopped)

        # The causation chain: each descendant's containment names the root's decision.
        root_cause = stack.ledger.lineage("root").containment_cause
        assert root_cause == f"root#{rejection['sequence']}/{rejection['event']['id']}"
        for op in [*descendants, LATE]:
            cascade = [d for d in stack.decisions(op) if d["event"]["type"] == "ANCESTOR_CONTAINED"]
            assert len(cascade) == 1, op
            # The late one was contained through its nearest ancestor containing when it
            # arrived, whose own chain leads back to the root's decision. Which one that
            # is depends on how far the cascade (which runs on after the restart) had got
            # by then: its parent c0g0, or above it c0 or the root.
            causes = [stack.ledger.lineage(a).containment_cause for a in ("c0g0", "c0", "root")]
            nearest = causes if op == LATE else [root_cause]
            assert cascade[0]["event"]["evidence_ref"] in [f"cascade:{c}" for c in nearest], op
            assert cascade[0]["event"]["evidence_ref"].endswith(root_cause), op
            capabilities = [i["capability"] for i in cascade[0]["invocations"]]
            assert capabilities == ["agent.stop-task", "credentials.revoke-delegation"], op
        records, _ = stack.ledger.audit_chain("root")
        lineage_audit = [r.record for r in records if r.kind == "lineage"]
        assert lineage_audit[0]["descendants"] == sorted(descendants)
        late_audit, _ = stack.ledger.audit_chain(LATE)
        assert [r.record["kind"] for r in late_audit if r.kind == "lineage"] == [
            "contained-on-arrival"
        ]

        # Reconstruction for every participant (L5.4): the tree seen from a grandchild
        # holds all 14 operations, each stop answered by its worker's result.
        report = lineage_report(stack.ledger, "c1g2")
        assert report["root"] == "root"
        assert sorted(o["operation_id"] for o in report["operations"]) == sorted(everyone)
        for entry in report["operations"]:
            (stop,) = [c for c in entry["commands"] if c["capability"] == "agent.stop-task"]
            assert stop["answered_by"]["type"] == "CONTAINMENT_SUCCEEDED", entry["operation_id"]

        # No silent resumption: a child's own resume request is rejected...
        child = stack.client(WORKER)
        refused = _decide(stack, child, "c0", "RESUME_REQUESTED")
        assert (refused["outcome"], refused["state_after"]) == ("rejected", "contained")
        # ...an approval by an agent of the tree does not count...
        inside = _human(stack, ORCHESTRATOR, "c1g1", "approved", "contained", "resume-pending")
        assert inside["outcome"] == "refused"
        assert inside["refusals"][0]["code"] in (
            "affected-agent-cannot-approve",
            "approval-approver-in-lineage",
        )
        assert stack.state("c1g1") == "contained"
        # ...and even with an outside approval, verified effects and a validated
        # checkpoint, the resume gate stays shut while the root is contained.
        approved = _human(stack, LEAD, "c1", "approved", "contained", "resume-pending")
        assert approved["state_after"] == "resume-pending"
        view = stack.ledger.load_views(["c1"])["c1"]
        assert view.lineage.contained_ancestors == ("root",)
        checkpoint = CheckpointReport(
            checkpoint_id="cp-c1",
            saved_at=datetime.now(UTC) - timedelta(minutes=1),
            reference="s3://checkpoints/c1",
            validated=True,
            validator=VERIFIER,
            validated_machine_digest=view.machine_digest,
            validated_policy_digest=view.policy_digest,
        )
        found = EvidencePayload(verifier=VERIFIER, outcome="applied", checkpoint=checkpoint)
        _decide(stack, verifier, "c1", "VERIFICATION_FOUND", evidence=found)
        gate = _decide(stack, child, "c1", "RESUME_REQUESTED")
        assert (gate["outcome"], gate["state_after"]) == ("rejected", "resume-pending")
        (resume,) = [g for g in gate["guards"] if g["guard"] == "resume.permitted"]
        assert resume["value"] is False
        assert "contained:root" in resume["evidence"]
        # Nor can a worker of the tree approve the root's own resumption.
        peer = _human(stack, WORKER, "root", "approved", "contained", "resume-pending")
        assert peer["outcome"] == "refused"
        assert stack.state("root") == "contained"
        # The root itself stays contained: nothing a descendant did released it.
        assert stack.ledger.lineage("root").containing
        assert stack.ledger.verify_audit() == ()
        # The relay published everything: cascade events, commands, lineage audit records.
        wait_until(lambda: not _unpublished(stack.ledger), 60, "the outbox to drain")
        assert controller.alive()
    finally:
        stop_worker.set()
        worker_thread.join(30)
        worker_client.publisher.close()
        tool.publisher.close()
