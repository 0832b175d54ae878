"""The controller against the real broker and PostgreSQL: catalogue paths, bad input,
restarts and fencing. Events are published with the client library, as tools do."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import NoOpTracerProvider

from consumer import Telemetry
from ledger import Ledger, intake_chain_id
from machines import EvidencePayload
from producers import RecoveryClient
from schemas import CONTENT_TYPE_AVRO, CONTENT_TYPE_JSON
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

FOUND = EvidencePayload(outcome="applied", verifier=VERIFIER, reference="verification-1")

# (machine, agent, event types, expected final state, expected capabilities in order)
PATHS = [
    ("delegated-research", "research-orchestrator", ["TOOL_TIMEOUT", "VERIFICATION_FOUND"],
     "resume-pending", ["research.reconstruct-effects"]),
    ("delegated-research", "research-worker", ["AUTHORIZATION_DENIED"], "containing",
     ["agent.stop-task", "credentials.revoke-delegation", "human.escalate"]),
    ("email-send", "agent-1", ["TOOL_TIMEOUT"], "unresolved",
     ["email.quarantine-outbox", "human.escalate"]),
    ("email-send", "agent-1", ["RETRY_SUCCEEDED"], "failure-reported", ["human.escalate"]),
    ("multistep-deployment", "agent-1", ["TOOL_TIMEOUT", "VERIFICATION_FOUND"], "rolling-out",
     ["deploy.verify-steps"]),
    ("multistep-deployment", "agent-1", ["AUTHORIZATION_DENIED"], "escalated",
     ["deploy.freeze-pipeline", "human.escalate"]),
    ("payment-refund", "agent-1", ["TOOL_TIMEOUT", "VERIFICATION_FOUND"], "completed",
     ["payment.verify-refund"]),
    ("payment-refund", "agent-1", ["AUTHORIZATION_DENIED"], "escalated", ["human.escalate"]),
    ("procurement-request", "agent-1", ["TOOL_TIMEOUT", "VERIFICATION_FOUND"], "completed",
     ["procurement.verify-request"]),
    ("procurement-request", "agent-1", ["RETRY_SUCCEEDED"], "failure-reported",
     ["human.escalate"]),
]  # fmt: skip


@pytest.fixture
def approver_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def policy(tmp_path: Path, approver_key: Ed25519PrivateKey) -> Path:
    return write_policy(tmp_path, approver_key)


@pytest.fixture
def ledger(database_url: str) -> Any:
    opened = open_ledger(database_url)
    yield opened
    opened.close()


def _group() -> str:
    return f"controller-{uuid.uuid4().hex[:8]}"


def _decided(ledger: Ledger, operation: str) -> int:
    return len(ledger.decisions(operation))


def test_catalogue_paths_leave_the_expected_states_commands_and_audit(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=3)
    tool = Tool(kafka_bootstrap, topic)
    operations: list[tuple[str, list[str], str, list[str]]] = []
    for n, (machine, agent, types, _state, _caps) in enumerate(PATHS):
        op = f"op-{n}-{machine}"
        operations.append((op, types, _state, _caps))
        for event_type in types:
            extra = {"evidence": FOUND} if event_type == "VERIFICATION_FOUND" else {}
            tool.event(machine, op, event_type, agent=agent, **extra)
    tool.close()
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    with running(settings, ledger):
        for op, types, _state, _caps in operations:
            count = len(types)
            wait_for(lambda op=op, n=count: _decided(ledger, op) == n, 60, f"{op} decided")
    rows = outbox(ledger)
    for op, _types, state, capabilities in operations:
        assert ledger.operation(op).state == state, op
        commands = [r for r in rows if r.topic == "recovery.commands" and r.key == op]
        assert [r.payload["capability"] for r in commands] == capabilities, op
        # Command ids are deterministic: operation, decision sequence, action index.
        decisions = ledger.decisions(op)
        expected_ids = [i["command_id"] for d in decisions for i in d["invocations"]]
        assert [r.record_id for r in commands] == expected_ids
        audit = [r for r in rows if r.topic == "recovery.audit" and r.key == op]
        # Each batch's signed chain-heads record rides on the audit topic too.
        kinds = [r.headers["kind"] for r in audit if r.headers["kind"] != "chain-heads"]
        assert kinds == ["operation-opened"] + ["decision"] * len(decisions), op
    assert ledger.verify_audit() == ()


def test_bad_records_are_dead_lettered_with_reason_and_coordinates_and_good_ones_decided(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=1)
    tool = Tool(kafka_bootstrap, topic)
    garbage = b"\xc3\x01not-an-avro-record"
    tool.raw("op-bad", garbage, CONTENT_TYPE_AVRO)  # offset 0
    tool.raw("op-bad", b"{not json", CONTENT_TYPE_JSON)  # offset 1
    tool.event("no-such-machine", "op-x", "TOOL_TIMEOUT")  # offset 2
    tool.client.publish_event(  # offset 3: a pinned name at a version that is not pinned
        "TOOL_TIMEOUT",
        operation_id="op-y",
        correlation_id="c",
        machine_name="email-send",
        machine_version="9.9.9",
        lineage=tool_lineage(),
        evidence_ref="r",
    )
    tool.event("delegated-research", "op-z", "TOOL_TIMEOUT", agent="intruder")  # offset 4
    tool.raw("op-big", b"x" * 70_000, CONTENT_TYPE_JSON)  # offset 5: over the 64 KiB limit
    good = tool.event("email-send", "op-good", "TOOL_TIMEOUT")  # offset 6
    tool.close()
    settings = settings_for(
        kafka_bootstrap, database_url, topic, policy, _group(), max_record_bytes=65_536
    )
    with running(settings, ledger):
        wait_for(lambda: _decided(ledger, "op-good") == 1, 60, "the good event decided")
    assert ledger.decisions("op-good")[0]["event"]["id"] == good
    rows = outbox(ledger)
    letters = [r for r in rows if r.topic == "recovery.dlq"]
    codes = {r.payload["source_offset"]: r.payload["reason_code"] for r in letters}
    assert codes == {
        0: "avro-unknown-fingerprint",
        1: "json-malformed",
        2: "machine-unknown",
        3: "machine-unpinned",
        4: "machine-not-applicable",
        5: "wire-oversized",
    }
    first = next(r for r in letters if r.payload["source_offset"] == 0)
    assert first.headers["coordinates"] == f"{topic}[0]@0"
    assert base64.b64decode(first.payload["original_value"]) == garbage
    assert {h["key"] for h in first.payload["original_headers"]} >= {"content-type"}
    assert first.payload["reason"]
    chain = intake_chain_id(settings.group_id, topic, 0)
    audit = [
        r for r in rows if r.topic == "recovery.audit" and r.payload.get("operation_id") == chain
    ]
    assert [r.payload["record"]["reason_code"] for r in audit] == [codes[n] for n in range(6)]
    assert ledger.offsets(settings.group_id, topic) == {0: 7}
    assert ledger.verify_audit() == ()


def tool_lineage() -> Any:
    from machines import Lineage

    return Lineage(agent="agent-1", task="task", initiating_principal="alice")


def test_forged_approval_is_recorded_as_refused_and_dead_lettered(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    from datetime import UTC, datetime, timedelta

    topic = topic_factory(partitions=1)
    tool = Tool(kafka_bootstrap, topic)
    tool.event("email-send", "op-f", "TOOL_TIMEOUT")
    tool.flush()
    approver = Tool(kafka_bootstrap, topic, producer="approver-1")
    forger_key = Ed25519PrivateKey.generate()  # not the key the policy registers
    machine_digest = _digest("email-send")
    approver.client.publish_human_decision(
        private_key=forger_key,
        verdict="rejected",
        operation_id="op-f",
        correlation_id="corr-op-f",
        machine_name="email-send",
        machine_version="1.0.0",
        machine_digest=machine_digest,
        state="unresolved",
        transition="containing",
        lineage=tool_lineage(),
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    )
    approver.close()
    tool.close()
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, _group())
    with running(settings, ledger):
        wait_for(lambda: _decided(ledger, "op-f") == 2, 60, "both events decided")
    decision = ledger.decisions("op-f")[1]
    assert decision["outcome"] == "refused"
    assert [r["code"] for r in decision["refusals"]] == ["approval-bad-signature"]
    assert ledger.operation("op-f").state == "unresolved"
    letters = [r for r in outbox(ledger) if r.topic == "recovery.dlq"]
    assert [r.payload["reason_code"] for r in letters] == ["forged-signature"]
    assert letters[0].payload["operation_id"] == "op-f"


def _digest(name: str) -> str:
    from consumer import ControllerSettings, load_rules

    machines, _ = load_rules(
        ControllerSettings(bootstrap="unused", database_url="unused", demo_mode=True)
    )
    return machines[f"{name}@1.0.0"].digest


def _metric(reader: InMemoryMetricReader, name: str) -> int:
    data = reader.get_metrics_data()
    total = 0
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    total += sum(int(getattr(p, "value", 0)) for p in metric.data.data_points)
    return total


def test_a_restarted_controller_resumes_from_stored_offsets_without_deciding_again(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=2)
    group = _group()
    tool = Tool(kafka_bootstrap, topic)
    for n in range(6):
        tool.event("payment-refund", f"op-r{n}", "TOOL_TIMEOUT")
    tool.flush()
    first = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(first, ledger):
        wait_for(lambda: all(_decided(ledger, f"op-r{n}") == 1 for n in range(6)), 60, "first run")
    stored = ledger.offsets(group, topic)
    assert sum(stored.values()) == 6
    for n in range(6):
        tool.event("payment-refund", f"op-r{n}", "VERIFICATION_FOUND", evidence=FOUND)
    tool.close()
    reader = InMemoryMetricReader()
    telemetry = Telemetry(NoOpTracerProvider(), MeterProvider(metric_readers=[reader]))
    second = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(second, ledger, telemetry):
        wait_for(lambda: all(_decided(ledger, f"op-r{n}") == 2 for n in range(6)), 60, "second run")
    # The new member started at the stored offsets: it saw only the six new events.
    assert _metric(reader, "recovery.controller.events.processed") == 6
    assert _metric(reader, "recovery.controller.events.duplicated") == 0
    assert sum(ledger.offsets(group, topic).values()) == 12
    assert all(ledger.operation(f"op-r{n}").state == "completed" for n in range(6))


def test_a_fenced_member_cannot_commit_and_the_new_owner_decides_its_records(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=1)
    group = _group()
    tool = Tool(kafka_bootstrap, topic)
    reader = InMemoryMetricReader()
    telemetry = Telemetry(NoOpTracerProvider(), MeterProvider(metric_readers=[reader]))
    # The timer sweep reads the partition epochs too: had it run between the claim and
    # the batch, it would have fenced the partition before its record was read, claimed
    # it back a session timeout later (Kafka still assigned it) and decided the record
    # itself. A sweep runs on the first turn (before or after the assignment, inside its
    # poll) and then once a minute, so the claim waits for the assigning turn to end.
    zombie_settings = settings_for(
        kafka_bootstrap, database_url, topic, policy, group, timer_poll_ms=60_000
    )
    with running(zombie_settings, ledger, telemetry) as zombie:
        zombie.wait_owned(1)
        zombie.wait_turned()
        # Another member takes the partition in the ledger (as a rebalance the zombie
        # missed would): the zombie's epoch is now stale.
        ledger.claim(group, topic, [0], "new-owner")
        tool.event("email-send", "op-z1", "TOOL_TIMEOUT")
        tool.flush()
        wait_for(
            lambda: _metric(reader, "recovery.controller.batches") >= 1, 30, "the fenced batch"
        )
        assert zombie.controller.owned == {}
    assert _decided(ledger, "op-z1") == 0
    assert ledger.offsets(group, topic) == {}
    tool.close()
    successor = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(successor, ledger):
        wait_for(lambda: _decided(ledger, "op-z1") == 1, 60, "the successor's decision")
    assert ledger.offsets(group, topic) == {0: 1}


def test_a_member_fenced_on_one_partition_commits_the_others_then_takes_it_back(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
) -> None:
    topic = topic_factory(partitions=2)
    group = _group()
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    operations = [f"op-s{n}" for n in range(20)]
    with running(settings, ledger) as member:
        member.wait_owned(2)
        ledger.claim(group, topic, [0], "rogue")  # partition 0 now belongs to someone else
        tool = Tool(kafka_bootstrap, topic)
        for op in operations:
            tool.event("email-send", op, "TOOL_TIMEOUT")
        tool.close()
        wait_for(lambda: 1 in ledger.offsets(group, topic), 60, "partition 1 committed")
        wait_for(lambda: member.controller.owned.keys() == {(topic, 1)}, 30, "p0 given up")
        wait_for(
            lambda: (
                sum(_decided(ledger, op) for op in operations) == ledger.offsets(group, topic)[1]
            ),
            30,
            "every partition-1 event decided",
        )
        decided = {op for op in operations if _decided(ledger, op) == 1}
        assert 0 < len(decided) < len(operations)  # murmur2 spreads 20 keys over both
        assert 0 not in ledger.offsets(group, topic)
        # No rebalance moved partition 0: a session timeout later Kafka still assigns
        # it here, so the member claims it back and decides its records, once.
        wait_for(lambda: len(member.controller.owned) == 2, 30, "p0 claimed back")
        wait_for(
            lambda: all(_decided(ledger, op) == 1 for op in operations), 30, "every event decided"
        )
    assert sum(ledger.offsets(group, topic).values()) == len(operations)


def _human_rejection(
    key: Ed25519PrivateKey, operation: str, nonce: str, event_id: str, tool: Tool
) -> None:
    from datetime import UTC, datetime, timedelta

    from machines import HumanDecision, sign_decision

    decision = sign_decision(
        HumanDecision(
            approver="approver-1",
            operation_id=operation,
            state="unresolved",
            transition="containing",
            machine_digest=_digest("email-send"),
            expires_at=datetime.now(UTC) + timedelta(hours=1),
            nonce=nonce,
            decision="rejected",
        ),
        key,
    )
    approver = RecoveryClient(tool.publisher, "approver-1")
    approver.publish_event(
        "HUMAN_REJECTED",
        event_id=event_id,
        operation_id=operation,
        correlation_id=f"corr-{operation}",
        machine_name="email-send",
        machine_version="1.0.0",
        lineage=tool_lineage(),
        evidence_ref=f"approval:{nonce}",
        human_decision=decision,
    )


def test_ids_reused_across_operations_are_dead_lettered_and_the_batch_still_commits(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    database_url: str,
    ledger: Ledger,
    policy: Path,
    approver_key: Ed25519PrivateKey,
) -> None:
    topic = topic_factory(partitions=1)
    group = _group()
    tool = Tool(kafka_bootstrap, topic)
    tool.event("email-send", "op-a", "TOOL_TIMEOUT", event_id="shared-id")  # offset 0
    _human_rejection(approver_key, "op-a", "nonce-1", "decision-a", tool)  # offset 1
    tool.flush()
    settings = settings_for(kafka_bootstrap, database_url, topic, policy, group)
    with running(settings, ledger):
        wait_for(lambda: _decided(ledger, "op-a") == 2, 60, "op-a decided")
        assert ledger.operation("op-a").state == "containing"
        tool.event("email-send", "op-b", "TOOL_TIMEOUT", event_id="shared-id")  # offset 2
        tool.event("email-send", "op-b", "TOOL_TIMEOUT", event_id="b-first")  # offset 3
        _human_rejection(approver_key, "op-b", "nonce-1", "decision-b", tool)  # offset 4
        tool.event("email-send", "op-c", "TOOL_TIMEOUT")  # offset 5
        tool.flush()
        wait_for(lambda: ledger.offsets(group, topic) == {0: 6}, 60, "the batch committed")
    tool.close()
    assert [d["event"]["id"] for d in ledger.decisions("op-b")] == ["b-first"]
    assert ledger.operation("op-b").state == "unresolved"
    assert _decided(ledger, "op-c") == 1
    letters = [r for r in outbox(ledger) if r.topic == "recovery.dlq"]
    assert [(r.payload["source_offset"], r.payload["reason_code"]) for r in letters] == [
        (2, "event-id-conflict"),
        (4, "approval-nonce-replayed"),
    ]
